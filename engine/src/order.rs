//! Ordered keys: a template's attempts that share an order key run one at a time,
//! in enqueue order.
//!
//! An enqueue with an order key while another attempt of the plan with that key is
//! open ([`enqueue_template`](crate::transition::enqueue_template)) leaves its
//! attempt QUEUED with a WAITING command, which no claim takes. When the attempt
//! at the head of the key ends, the same transaction decides the ones behind it
//! ([`after_end`]): the next is released (its command PENDING, claimable in enqueue
//! order), or, when the head did not succeed and the plan says `on_failure =
//! "block"`, every one still waiting is aborted, naming the head. An attempt
//! aborted while it waits leaves the head and the rest as they were.

use crate::ids::Timestamp;
use crate::model::{AttemptRecord, AttemptStatus, CommandStatus, OnFailure, Plan};
use crate::transition::{abort, Guard, Writes};

/// Whether the writes that took `before` to `after` ended the head of an order
/// key: the attempt was open and not waiting, has an order key, and is terminal
/// now. Only then are the attempts behind it decided.
pub fn ends_head(before: &AttemptRecord, after: &AttemptRecord) -> bool {
    after.attempt.order_key.is_some()
        && after.attempt.status.is_terminal()
        && !before.attempt.status.is_terminal()
        && before.command.status != CommandStatus::Waiting
}

/// The writes for the attempts waiting behind `ended` (the head that just ended,
/// as its writes left it), given `waiting`: every attempt of its plan with its
/// order key whose command is WAITING, any order. Released: the earliest one,
/// claimable from its own start or `now`, whichever is later. Blocked (the head
/// did not succeed, `on_failure = "block"`): each of them aborted.
pub fn after_end(plan: &Plan, ended: &AttemptRecord, waiting: &[AttemptRecord], now: Timestamp) -> Vec<Writes> {
    let mut queue: Vec<&AttemptRecord> = waiting
        .iter()
        .filter(|r| r.command.status == CommandStatus::Waiting && r.attempt.order_key == ended.attempt.order_key)
        .collect();
    queue.sort_by_key(|r| r.attempt.number);
    let blocked = ended.attempt.status != AttemptStatus::Succeeded && plan.on_failure() == OnFailure::Block;
    if !blocked {
        return queue.first().map(|next| vec![release(next, now)]).unwrap_or_default();
    }
    let reason = format!(
        "blocked: attempt {} ahead on order key {:?} ended {} (on_failure = \"block\")",
        ended.attempt.id,
        ended.attempt.order_key.as_deref().unwrap_or_default(),
        ended.attempt.status
    );
    queue.into_iter().filter_map(|r| abort(r, &reason, now).ok()).collect()
}

/// A WAITING command made PENDING, claimable from its start or `now`.
fn release(record: &AttemptRecord, now: Timestamp) -> Writes {
    let c = &record.command;
    let mut command = c.clone();
    command.status = CommandStatus::Pending;
    command.available_at = c.available_at.max(now);
    Writes {
        guard: Guard::Unchanged {
            status: CommandStatus::Waiting,
            lease_token: None,
        },
        attempt: None,
        command: Some(command),
        receipts: Vec::new(),
    }
}
