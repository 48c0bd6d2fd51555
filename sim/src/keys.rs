//! Invariant 24: an enqueue key enqueues once.
//!
//! The enqueuer keys most of its enqueues, sends a keyed request again after an
//! unknown outcome (its reply lost) and now and then after an acknowledged one. Every
//! enqueue that created an attempt is logged by the db host with the key its request
//! carried as received. A key created at most one attempt; every answer to a key named
//! that attempt; and a request sent again after an acknowledgement was never refused.

use crate::checker::Violation;
use crate::clients::ClientLog;
use leasehold_engine::AttemptId;
use std::collections::BTreeMap;

/// The violations of invariant 24, from the attempts enqueues created with the key
/// each request carried (`keyed`) and the clients' log.
pub fn once(keyed: &BTreeMap<AttemptId, String>, clients: &ClientLog) -> Vec<Violation> {
    let mut v = Vec::new();
    let mut push = |message: String| v.push(Violation { invariant: 24, message });
    let mut created: BTreeMap<&str, Vec<&AttemptId>> = BTreeMap::new();
    for (attempt, key) in keyed {
        created.entry(key).or_default().push(attempt);
    }
    for (key, attempts) in created.iter().filter(|(_, a)| a.len() > 1) {
        push(format!(
            "enqueue key {key} created {} attempts: {attempts:?}",
            attempts.len()
        ));
    }
    for (key, answers) in &clients.keys {
        if answers.iter().any(|a| a != &answers[0]) {
            push(format!(
                "enqueue key {key} was answered with different attempts: {answers:?}"
            ));
        }
        if let Some(first) = created.get(key.as_str()).and_then(|a| a.first()) {
            if answers.iter().any(|a| a != *first) {
                push(format!(
                    "enqueue key {key} was answered with {answers:?}, but created {first}"
                ));
            }
        }
    }
    for (key, refusal) in &clients.key_refusals {
        push(format!(
            "a request sent again with enqueue key {key} was refused: {refusal}"
        ));
    }
    v
}
