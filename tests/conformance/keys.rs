//! Enqueue keys on every ledger: the same key with the same request answers the
//! attempt the first enqueue created, whatever became of it, and writes nothing; the
//! same key with another request (another action, start or plan) is refused, naming
//! the attempt; a key that is not one is bad input.

use super::{assert_nothing_claimable, deliver, register, Harness};
use leasehold::engine::transition::Start;
use leasehold::engine::{Action, Refusal};
use leasehold::ledger::{EnqueueRequest, Ledger, LedgerError};

fn keyed(action: Action, key: &str) -> EnqueueRequest {
    EnqueueRequest::new(action).keyed(Some(key.to_owned()))
}

pub async fn an_enqueue_key_answers_the_first_attempt_and_refuses_another_request<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let id = register(l, "keyed", "resume", 1).await;
    let first = l
        .enqueue_with(&id, keyed(Action::Execute, "order-7"))
        .await
        .expect("enqueue");
    assert!(first.created);
    assert_eq!(first.record.attempt.enqueue_key.as_deref(), Some("order-7"));
    let again = l
        .enqueue_with(&id, keyed(Action::Execute, "order-7"))
        .await
        .expect("again");
    assert!(!again.created, "answered, not created");
    assert_eq!(again.record.attempt.id, first.record.attempt.id);
    assert_eq!(l.history(&id).await.unwrap().len(), 1, "nothing new written");
    deliver(l, "w1").await;
    assert_nothing_claimable(l).await;
    let after = l
        .enqueue_with(&id, keyed(Action::Execute, "order-7"))
        .await
        .expect("after delivery");
    assert_eq!(
        (after.created, &after.record.attempt.id),
        (false, &first.record.attempt.id)
    );
    assert_nothing_claimable(l).await;
    let other = register(l, "keyed-other", "resume", 1).await;
    for (plan, request) in [
        (&id, keyed(Action::Compensate, "order-7")),
        (&id, keyed(Action::Execute, "order-7").at(Start::After(1_000))),
        (&other, keyed(Action::Execute, "order-7")),
    ] {
        let refused = l.enqueue_with(plan, request).await.expect_err("another request");
        assert_eq!(
            refused,
            LedgerError::Refused(Refusal::KeyReused {
                key: "order-7".into(),
                attempt: first.record.attempt.id.clone()
            })
        );
    }
    assert!(
        l.history(&other).await.unwrap().is_empty(),
        "a refused enqueue writes nothing"
    );
    let compensate = l
        .enqueue_with(&id, keyed(Action::Compensate, "order-7-undo"))
        .await
        .expect("a new key");
    assert!(compensate.created);
}

pub async fn a_key_that_is_not_one_is_refused_as_bad_input<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let id = register(l, "bad-keys", "resume", 1).await;
    for bad in [String::new(), "k".repeat(256), "tab\tbed".to_owned()] {
        let e = l
            .enqueue_with(&id, keyed(Action::Execute, &bad))
            .await
            .expect_err("bad key");
        assert!(
            matches!(&e, LedgerError::BadInput(m) if m.starts_with("enqueue key")),
            "{bad:?}: {e}"
        );
    }
    assert!(l.history(&id).await.unwrap().is_empty());
}
