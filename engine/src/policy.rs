//! Delivery policy: how often, how fast and how long an attempt is redelivered.
//!
//! A plan carries a [`RetrySpec`] (its `[retry]` table) and each step may carry its
//! own; a step's [`RetryPolicy`] takes each value from the step's spec, else the
//! plan's, else the default. The policy rules the give-back (a step that fails
//! transiently past its tries hands its command back with a delay instead of
//! holding the lease) and exhaustion (an attempt that reached its delivery cap or
//! its deadline ends FAILED with an `exhausted:` reason).
//!
//! Values are checked at registration: zero and negative values are refused with a
//! message naming the field; values above a bound are clamped to it, and the plan
//! stores (and fingerprints) the clamped spec, so what is applied is what is shown.

use crate::ids::Timestamp;
use crate::model::{Attempt, AttemptStatus};
use serde::{Deserialize, Serialize};

/// Default cap on an attempt's deliveries.
pub const MAX_DELIVERIES_DEFAULT: u32 = 25;
/// Largest delivery cap.
pub const MAX_DELIVERIES_MAX: u32 = 10_000;
/// Default first backoff (1 s).
pub const BACKOFF_BASE_MS_DEFAULT: u64 = 1_000;
/// Default longest backoff (1 h).
pub const BACKOFF_MAX_MS_DEFAULT: u64 = 3_600_000;
/// Largest backoff a policy may ask for (7 days).
pub const BACKOFF_MS_MAX: u64 = 7 * 86_400_000;
/// Default calls of one step within one delivery.
pub const STEP_MAX_TRIES_DEFAULT: u32 = 3;
/// Most calls of one step within one delivery.
pub const STEP_MAX_TRIES_MAX: u32 = 100;
/// Longest deadline (366 days).
pub const DEADLINE_SECS_MAX: u64 = 366 * 86_400;

/// A retry policy as written in a plan file: every key optional.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrySpec {
    /// Cap on the command's `delivery_count`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_deliveries: Option<i64>,
    /// The first backoff between deliveries, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_base_ms: Option<i64>,
    /// The longest backoff between deliveries, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_max_ms: Option<i64>,
    /// Calls of one step within one delivery before the command is given back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_max_tries: Option<i64>,
    /// The attempt must end within this many seconds of its enqueue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_secs: Option<i64>,
}

/// The policy that applies to one step, every value resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryPolicy {
    /// Cap on the command's `delivery_count`.
    pub max_deliveries: u32,
    /// The first backoff, in milliseconds.
    pub backoff_base_ms: u64,
    /// The longest backoff, in milliseconds.
    pub backoff_max_ms: u64,
    /// Calls of one step within one delivery.
    pub step_max_tries: u32,
    /// The attempt must end within this many seconds of its enqueue, if set.
    pub deadline_secs: Option<u64>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_deliveries: MAX_DELIVERIES_DEFAULT,
            backoff_base_ms: BACKOFF_BASE_MS_DEFAULT,
            backoff_max_ms: BACKOFF_MAX_MS_DEFAULT,
            step_max_tries: STEP_MAX_TRIES_DEFAULT,
            deadline_secs: None,
        }
    }
}

/// A policy value that may not be stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct PolicyError {
    /// The field, e.g. `retry.max_deliveries` or `steps[1].retry.backoff_base_ms`.
    pub field: String,
    /// Why.
    pub reason: String,
}

impl RetrySpec {
    /// The spec with every value checked and clamped; `at` names the table
    /// (`retry`, `steps[2].retry`) in errors.
    pub fn checked(&self, at: &str) -> Result<RetrySpec, PolicyError> {
        let field = |name: &str| format!("{at}.{name}");
        let bounded = |name: &str, value: Option<i64>, max: u64| -> Result<Option<i64>, PolicyError> {
            match value {
                None => Ok(None),
                Some(v) if v <= 0 => Err(PolicyError {
                    field: field(name),
                    reason: format!("must be at least 1 (got {v})"),
                }),
                Some(v) => Ok(Some(v.min(max as i64))),
            }
        };
        let spec = RetrySpec {
            max_deliveries: bounded("max_deliveries", self.max_deliveries, MAX_DELIVERIES_MAX.into())?,
            backoff_base_ms: bounded("backoff_base_ms", self.backoff_base_ms, BACKOFF_MS_MAX)?,
            backoff_max_ms: bounded("backoff_max_ms", self.backoff_max_ms, BACKOFF_MS_MAX)?,
            step_max_tries: bounded("step_max_tries", self.step_max_tries, STEP_MAX_TRIES_MAX.into())?,
            deadline_secs: bounded("deadline_secs", self.deadline_secs, DEADLINE_SECS_MAX)?,
        };
        if let (Some(base), Some(max)) = (spec.backoff_base_ms, spec.backoff_max_ms) {
            if base > max {
                return Err(PolicyError {
                    field: field("backoff_base_ms"),
                    reason: format!("{base} is more than backoff_max_ms ({max})"),
                });
            }
        }
        Ok(spec)
    }

    /// Whether no key is set.
    pub fn is_empty(&self) -> bool {
        *self == RetrySpec::default()
    }
}

/// The policy of a step whose spec is `step` in a plan whose spec is `plan`: each
/// value from the step, else the plan, else the default. A backoff base above the
/// resolved maximum is lowered to it.
pub fn resolve(plan: Option<&RetrySpec>, step: Option<&RetrySpec>) -> RetryPolicy {
    let pick = |f: fn(&RetrySpec) -> Option<i64>| step.and_then(f).or_else(|| plan.and_then(f));
    let d = RetryPolicy::default();
    let as_u64 = |v: i64| u64::try_from(v).unwrap_or(1).max(1);
    let as_u32 = |v: i64| u32::try_from(v).unwrap_or(u32::MAX).max(1);
    let backoff_max_ms = pick(|s| s.backoff_max_ms).map_or(d.backoff_max_ms, as_u64);
    RetryPolicy {
        max_deliveries: pick(|s| s.max_deliveries).map_or(d.max_deliveries, as_u32),
        backoff_base_ms: pick(|s| s.backoff_base_ms)
            .map_or(d.backoff_base_ms, as_u64)
            .min(backoff_max_ms),
        backoff_max_ms,
        step_max_tries: pick(|s| s.step_max_tries).map_or(d.step_max_tries, as_u32),
        deadline_secs: pick(|s| s.deadline_secs).map(as_u64),
    }
}

impl RetryPolicy {
    /// The delay before the next delivery after delivery number `delivery` (1 for
    /// the first) gave its command back: full jitter over an exponential window,
    /// `jitter` (any `u64`, from the caller's entropy) picking a point in
    /// `0..=min(max, base * 2^(delivery-1))`. A `retry_after_ms` the target asked
    /// for is honoured up to the policy's maximum: the delay is at least that.
    pub fn backoff_ms(&self, delivery: u32, jitter: u64, retry_after_ms: Option<u64>) -> u64 {
        let doublings = delivery.saturating_sub(1).min(63);
        let window = self
            .backoff_base_ms
            .saturating_mul(1u64 << doublings)
            .min(self.backoff_max_ms);
        let jittered = jitter % window.saturating_add(1);
        let asked = retry_after_ms.unwrap_or(0).min(self.backoff_max_ms);
        jittered.max(asked)
    }

    /// When an attempt enqueued at `created_at` must have ended, if the policy has a
    /// deadline.
    pub fn deadline(&self, created_at: Timestamp) -> Option<Timestamp> {
        self.deadline_secs.map(|s| created_at.plus_ms(s.saturating_mul(1_000)))
    }
}

/// Why an attempt is exhausted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Exhaustion {
    /// Its command was delivered `max_deliveries` times.
    Deliveries,
    /// Its deadline passed.
    Deadline,
}

impl Exhaustion {
    /// Both reasons.
    pub const ALL: [Exhaustion; 2] = [Exhaustion::Deliveries, Exhaustion::Deadline];
    /// What every exhausted attempt's error starts with.
    pub const PREFIX: &'static str = "exhausted:";

    /// Why `attempt` ended exhausted, if it did: FAILED, its error starting with a
    /// reason's head.
    pub fn of(attempt: &Attempt) -> Option<Exhaustion> {
        let error = attempt
            .error
            .as_deref()
            .filter(|_| attempt.status == AttemptStatus::Failed)?;
        Self::ALL.into_iter().find(|why| error.starts_with(why.as_str()))
    }

    /// The reason's machine-readable head: `exhausted: deliveries`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Exhaustion::Deliveries => "exhausted: deliveries",
            Exhaustion::Deadline => "exhausted: deadline",
        }
    }
}

/// Whether an attempt with `delivery_count` deliveries, enqueued at `created_at`,
/// may not be delivered again at `next` under `policy`.
pub fn exhausted(
    policy: &RetryPolicy,
    delivery_count: u32,
    created_at: Timestamp,
    next: Timestamp,
) -> Option<Exhaustion> {
    if delivery_count >= policy.max_deliveries {
        return Some(Exhaustion::Deliveries);
    }
    match policy.deadline(created_at) {
        Some(deadline) if next >= deadline => Some(Exhaustion::Deadline),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(max_deliveries: i64) -> RetrySpec {
        RetrySpec {
            max_deliveries: Some(max_deliveries),
            ..RetrySpec::default()
        }
    }

    #[test]
    fn zero_and_negative_values_are_refused_by_field() {
        let e = spec(0).checked("retry").unwrap_err();
        assert_eq!(e.to_string(), "retry.max_deliveries: must be at least 1 (got 0)");
        let bad = RetrySpec {
            backoff_base_ms: Some(-5),
            ..RetrySpec::default()
        };
        let e = bad.checked("steps[1].retry").unwrap_err();
        assert_eq!(
            e.to_string(),
            "steps[1].retry.backoff_base_ms: must be at least 1 (got -5)"
        );
    }

    #[test]
    fn absurd_values_are_clamped_and_a_base_above_the_max_is_refused() {
        let huge = RetrySpec {
            max_deliveries: Some(i64::MAX),
            deadline_secs: Some(i64::MAX),
            ..RetrySpec::default()
        };
        let c = huge.checked("retry").unwrap();
        assert_eq!(c.max_deliveries, Some(MAX_DELIVERIES_MAX.into()));
        assert_eq!(c.deadline_secs, Some(DEADLINE_SECS_MAX as i64));
        let inverted = RetrySpec {
            backoff_base_ms: Some(10_000),
            backoff_max_ms: Some(1_000),
            ..RetrySpec::default()
        };
        assert_eq!(
            inverted.checked("retry").unwrap_err().to_string(),
            "retry.backoff_base_ms: 10000 is more than backoff_max_ms (1000)"
        );
    }

    #[test]
    fn a_step_value_wins_over_the_plan_value_which_wins_over_the_default() {
        let plan = RetrySpec {
            max_deliveries: Some(5),
            step_max_tries: Some(2),
            ..RetrySpec::default()
        };
        let step = spec(9);
        let p = resolve(Some(&plan), Some(&step));
        assert_eq!((p.max_deliveries, p.step_max_tries), (9, 2));
        assert_eq!(p.backoff_max_ms, BACKOFF_MAX_MS_DEFAULT);
        assert_eq!(resolve(None, None), RetryPolicy::default());
    }

    #[test]
    fn backoff_grows_within_its_window_and_honours_retry_after_up_to_the_max() {
        let p = RetryPolicy {
            backoff_base_ms: 100,
            backoff_max_ms: 1_000,
            ..RetryPolicy::default()
        };
        assert_eq!(p.backoff_ms(1, 100, None), 100);
        assert_eq!(p.backoff_ms(1, 101, None), 0);
        assert_eq!(p.backoff_ms(3, 400, None), 400);
        assert_eq!(p.backoff_ms(3, 401, None), 0);
        assert_eq!(p.backoff_ms(40, u64::MAX, None), u64::MAX % 1_001);
        assert_eq!(p.backoff_ms(1, 0, Some(700)), 700);
        assert_eq!(p.backoff_ms(1, 0, Some(60_000)), 1_000);
    }

    #[test]
    fn exhaustion_is_the_cap_or_the_deadline() {
        let p = RetryPolicy {
            max_deliveries: 3,
            deadline_secs: Some(10),
            ..RetryPolicy::default()
        };
        let at = Timestamp::from_millis(1_000);
        assert_eq!(exhausted(&p, 2, at, at.plus_ms(9_999)), None);
        assert_eq!(exhausted(&p, 3, at, at), Some(Exhaustion::Deliveries));
        assert_eq!(exhausted(&p, 0, at, at.plus_ms(10_000)), Some(Exhaustion::Deadline));
    }
}
