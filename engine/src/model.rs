//! The durable model: plans, attempts, receipts and commands, and their statuses.
//!
//! These are plain rows. Every change to them is computed by [`crate::transition`].

use crate::ids::{AttemptId, CommandId, LeaseToken, PlanId, Timestamp};
use crate::policy::{RetryPolicy, RetrySpec};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;
use std::str::FromStr;

macro_rules! text_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
        pub enum $name {
            $($(#[$vdoc])* #[serde(rename = $text)] $variant),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            /// The stored and printed text of this value.
            pub const fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = UnknownValue;
            fn from_str(s: &str) -> Result<Self, UnknownValue> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err(UnknownValue {
                        kind: stringify!($name),
                        value: s.to_owned(),
                        expected: &[$($text),+],
                    }),
                }
            }
        }
    };
}

/// A text that names no value of an enumeration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a valid {kind} (expected one of: {})", expected.join(", "))]
pub struct UnknownValue {
    /// The enumeration's name.
    pub kind: &'static str,
    /// The text that was given.
    pub value: String,
    /// The accepted texts.
    pub expected: &'static [&'static str],
}

text_enum!(
    /// Whether a plan accepts new attempts.
    PlanStatus { /** Accepts attempts. */ Ready => "READY", /** Accepts none. */ Retired => "RETIRED" }
);
text_enum!(
    /// How a takeover continues an attempt.
    Recovery {
        /// Skip succeeded steps and redeliver only the ambiguous one (durable targets).
        Resume => "resume",
        /// Start a fresh sandbox and replay every step (ephemeral targets).
        Replay => "replay",
    }
);
text_enum!(
    /// What an attempt does.
    Action {
        /// Run the plan's steps for the first time.
        Execute => "execute",
        /// Run them again after a failed or aborted attempt.
        Retry => "retry",
        /// Undo the succeeded steps of a forward attempt, in reverse order.
        Compensate => "compensate",
    }
);
text_enum!(
    /// Lifecycle of an attempt.
    AttemptStatus {
        /// Waiting for a worker.
        Queued => "QUEUED",
        /// Held by a worker.
        Running => "RUNNING",
        /// Every step succeeded.
        Succeeded => "SUCCEEDED",
        /// A step failed.
        Failed => "FAILED",
        /// An operator aborted it.
        Aborted => "ABORTED",
    }
);
text_enum!(
    /// Lifecycle of a receipt (one step of an attempt).
    ReceiptStatus {
        /// Not begun (or reset by a takeover).
        Pending => "PENDING",
        /// Begun; its outcome is ambiguous until completed.
        Running => "RUNNING",
        /// Completed with evidence.
        Succeeded => "SUCCEEDED",
        /// The executor answered a permanent failure.
        Failed => "FAILED",
        /// Never to run: an earlier step failed or the attempt was aborted.
        Aborted => "ABORTED",
    }
);
text_enum!(
    /// Lifecycle of an outbox command.
    CommandStatus {
        /// Claimable once `available_at` has passed.
        Pending => "PENDING",
        /// Held under a lease.
        Processing => "PROCESSING",
        /// The attempt succeeded.
        Delivered => "DELIVERED",
        /// The attempt failed.
        Failed => "FAILED",
        /// The attempt was aborted.
        Aborted => "ABORTED",
        /// Behind an open attempt with the same order key ([`crate::order`]): not
        /// claimable until the one ahead ends.
        Waiting => "WAITING",
    }
);
text_enum!(
    /// What an ordered key does when the attempt ahead ends without succeeding
    /// ([`crate::order`]).
    OnFailure {
        /// The attempts behind it do not run: they are aborted, naming it.
        Block => "block",
        /// The next one runs.
        Continue => "continue",
    }
);

impl AttemptStatus {
    /// SUCCEEDED, FAILED or ABORTED: never changes again.
    pub const fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Aborted)
    }
}

impl ReceiptStatus {
    /// SUCCEEDED, FAILED or ABORTED.
    pub const fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Aborted)
    }
}

impl CommandStatus {
    /// DELIVERED, FAILED or ABORTED.
    pub const fn is_terminal(self) -> bool {
        matches!(self, Self::Delivered | Self::Failed | Self::Aborted)
    }
}

impl Action {
    /// `execute` and `retry` run the plan forward; `compensate` undoes.
    pub const fn is_forward(self) -> bool {
        !matches!(self, Self::Compensate)
    }
}

/// One step of a plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// Unique within the plan.
    pub code: String,
    /// Names the executor that runs it, e.g. `dry-run:v1`.
    pub executor: String,
    /// Executor input, any JSON.
    #[serde(default = "empty_object")]
    pub payload: Value,
    /// This step's delivery policy, over the plan's ([`crate::policy`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetrySpec>,
    /// What it calls, for routing and limits ([`crate::route`]): default its
    /// executor's name; an `http:v1` step's comes from its `url` and may not be set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}

/// A registered, immutable plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Its id.
    pub id: PlanId,
    /// Human name; several plans may share one.
    pub name: String,
    /// READY or RETIRED.
    pub status: PlanStatus,
    /// How takeovers continue.
    pub recovery: Recovery,
    /// Ordered steps.
    pub steps: Vec<Step>,
    /// Extra keys the semantic fingerprint strips.
    pub volatile_fields: Vec<String>,
    /// The plan's delivery policy, for every step that does not set its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetrySpec>,
    /// The queue its attempts go to (none: [`crate::route::DEFAULT_QUEUE`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Its `[input]` table: set, the plan is a template ([`crate::input`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<crate::input::InputSchema>,
    /// What an ordered key does when an attempt fails (a template's; none: block).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<OnFailure>,
    /// SHA-256 of the canonical JSON of everything but `id` and `status`.
    pub fingerprint: String,
    /// When it was registered (ledger clock).
    pub created_at: Timestamp,
}

impl Plan {
    /// Whether it declares `[input]`: each attempt brings its own.
    pub fn is_template(&self) -> bool {
        self.input.is_some()
    }

    /// What an ordered key does when an attempt ahead fails.
    pub fn on_failure(&self) -> OnFailure {
        self.on_failure.unwrap_or(OnFailure::Block)
    }

    /// The queue its attempts go to.
    pub fn queue(&self) -> &str {
        self.queue.as_deref().unwrap_or(crate::route::DEFAULT_QUEUE)
    }

    /// The step with this code.
    pub fn step(&self, code: &str) -> Option<&Step> {
        self.steps.iter().find(|s| s.code == code)
    }

    /// The delivery policy of the step with this code (the plan's for an unknown
    /// code).
    pub fn policy(&self, code: &str) -> RetryPolicy {
        let step = self.step(code).and_then(|s| s.retry.as_ref());
        crate::policy::resolve(self.retry.as_ref(), step)
    }

    /// The delivery policy that rules `record` now: its next unfinished step's, or
    /// its last step's once every step SUCCEEDED.
    pub fn policy_of(&self, record: &AttemptRecord) -> RetryPolicy {
        let next = crate::transition::next_step(record)
            .and_then(|o| record.receipt(o))
            .or_else(|| record.receipts.last());
        self.policy(next.map_or("", |r| r.step_code.as_str()))
    }
}

/// One execution of a plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    /// Its id.
    pub id: AttemptId,
    /// The plan it executes.
    pub plan_id: PlanId,
    /// 1, 2, … per plan.
    pub number: u32,
    /// execute, retry or compensate.
    pub action: Action,
    /// Lifecycle.
    pub status: AttemptStatus,
    /// Enqueued at (ledger clock).
    pub created_at: Timestamp,
    /// First claimed at.
    pub started_at: Option<Timestamp>,
    /// Reached a terminal status at.
    pub finished_at: Option<Timestamp>,
    /// Why it failed or was aborted.
    pub error: Option<String>,
    /// Its trace context ([`crate::trace`]): the trace it was enqueued under and the
    /// enqueue's span (none on rows written before traces).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<crate::trace::TraceContext>,
    /// The enqueue key its caller gave ([`crate::transition::keyed`]): another enqueue
    /// with this key answers this attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enqueue_key: Option<String>,
    /// With an enqueue key: the SHA-256 of the request that enqueued it
    /// ([`crate::transition::enqueue_request_sha256`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_sha256: Option<String>,
    /// A template's attempt: its input, as canonical JSON ([`crate::input`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    /// The SHA-256 of `input`: attempts with equal ones ran the same change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_sha256: Option<String>,
    /// Its order key ([`crate::order`]): one attempt per (plan, key) is open and
    /// claimable at a time, in enqueue order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order_key: Option<String>,
}

/// One step of one attempt, with its evidence.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    /// The attempt it belongs to.
    pub attempt_id: AttemptId,
    /// 1-based position in the attempt.
    pub ordinal: u32,
    /// The plan step it runs.
    pub step_code: String,
    /// Stable for (attempt, step): every delivery sends the same one.
    pub idempotency_key: String,
    /// The step's executor, as enqueued (empty on rows written before routing).
    #[serde(default)]
    pub executor: String,
    /// The step's target ([`crate::route::step_target`]), as enqueued (empty on rows
    /// written before routing).
    #[serde(default)]
    pub target: String,
    /// A template's step: its payload resolved from the attempt's input, as
    /// canonical JSON, frozen at enqueue (none: the plan step's own payload).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
    /// Lifecycle.
    pub status: ReceiptStatus,
    /// Canonical JSON of the executor's evidence.
    pub evidence: Option<String>,
    /// SHA-256 of `evidence`.
    pub evidence_sha256: Option<String>,
    /// What the target answered (canonical JSON).
    pub target_receipt: Option<String>,
    /// Why it failed.
    pub error: Option<String>,
    /// Begun at.
    pub started_at: Option<Timestamp>,
    /// Reached a terminal status at.
    pub finished_at: Option<Timestamp>,
}

/// The outbox row of an attempt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Command {
    /// Its id.
    pub id: CommandId,
    /// The attempt it delivers (unique).
    pub attempt_id: AttemptId,
    /// Lifecycle.
    pub status: CommandStatus,
    /// Not claimable before this instant.
    pub available_at: Timestamp,
    /// The worker holding the lease.
    pub lease_owner: Option<String>,
    /// The fencing token; never serialized.
    #[serde(skip)]
    pub lease_token: Option<LeaseToken>,
    /// The lease is live until this instant (ledger clock).
    pub lease_until: Option<Timestamp>,
    /// The last renewal.
    pub last_heartbeat_at: Option<Timestamp>,
    /// How many times it was claimed.
    pub delivery_count: u32,
    /// The last failure or takeover reason.
    pub last_error: Option<String>,
    /// Reached a terminal status at.
    pub finished_at: Option<Timestamp>,
    /// The plan's queue (empty on rows written before routing).
    #[serde(default)]
    pub queue: String,
    /// The executor of the step it runs next ([`crate::route::Route::of_next`]).
    #[serde(default)]
    pub executor: String,
    /// The target of the step it runs next.
    #[serde(default)]
    pub target: String,
}

/// An attempt with its command and receipts (in ordinal order): the rows every
/// transition on an attempt reads, in lock order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// The attempt.
    pub attempt: Attempt,
    /// Its command.
    pub command: Command,
    /// Its receipts, by ordinal.
    pub receipts: Vec<Receipt>,
}

impl AttemptRecord {
    /// The receipt at this ordinal.
    pub fn receipt(&self, ordinal: u32) -> Option<&Receipt> {
        self.receipts.iter().find(|r| r.ordinal == ordinal)
    }

    /// The step a receipt runs, as its executor sees it: the plan's step, with the
    /// receipt's frozen payload where it has one. `None` for a step code the plan
    /// lacks or a frozen payload that is not JSON (a damaged row).
    pub fn step_of(plan: &Plan, receipt: &Receipt) -> Option<Step> {
        let mut step = plan.step(&receipt.step_code)?.clone();
        if let Some(text) = &receipt.payload {
            step.payload = serde_json::from_str(text).ok()?;
        }
        Some(step)
    }
}

/// A lease as a worker holds it: the command, its attempt and the token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The command held.
    pub command_id: CommandId,
    /// Its attempt.
    pub attempt_id: AttemptId,
    /// The fencing token.
    pub token: LeaseToken,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_round_trip_through_text() {
        for s in CommandStatus::ALL {
            assert_eq!(s.as_str().parse::<CommandStatus>().unwrap(), *s);
        }
        let err = "bogus".parse::<Recovery>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "\"bogus\" is not a valid Recovery (expected one of: resume, replay)"
        );
    }

    #[test]
    fn command_json_never_contains_the_token() {
        let c = Command {
            id: CommandId::new("c1"),
            attempt_id: AttemptId::new("a1"),
            status: CommandStatus::Processing,
            available_at: Timestamp::from_millis(0),
            lease_owner: Some("w".into()),
            lease_token: Some(LeaseToken::new("tok-secret")),
            lease_until: None,
            last_heartbeat_at: None,
            delivery_count: 1,
            last_error: None,
            finished_at: None,
            queue: String::new(),
            executor: String::new(),
            target: String::new(),
        };
        let json = serde_json::to_string(&c).unwrap();
        assert!(!json.contains("tok-secret") && !json.contains("lease_token"));
    }
}
