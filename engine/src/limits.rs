//! Per-target limits: how many leases may run a target's steps at once, how often a
//! lease may enter it, and its circuit breaker.
//!
//! A lease **enters** a target when a claim hands it a command whose next step
//! targets it, or when a worker write moves its lease onto a step of another target
//! (complete-and-continue, complete-step). Every entry is admitted or refused by
//! [`TargetLimit::admit`] on the target's [`Load`], which a ledger reads under the
//! target's lock in the entry's own transaction and writes back with it:
//!
//! - `max_in_flight`: the live leases whose next step targets it (a lease is live
//!   until it ends, is given back, moves on, or expires) number at most this many.
//! - `rate`: at most `count` entries in any window of `per_ms` milliseconds. The
//!   load keeps the instants of the last `count` entries ([`Load::recent`]), so the
//!   bound holds over every window, not only over aligned ones.
//! - `breaker`: after `failures` consecutive deliveries to the target ended in a
//!   transient failure (a give-back), it opens for `cooldown_ms`: no entry is
//!   admitted, and queued commands wait without spending deliveries. Then it is
//!   half-open: one entry (the probe) is admitted; the probe's success closes it, its
//!   failure opens it again, and its expired lease lets another probe in.
//!
//! A target without a limit row admits everything; a limit applies to entries that
//! begin after it is set.

use crate::ids::{CommandId, Timestamp};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::fmt;

/// Largest `max_in_flight` (a ledger keeps one slot row per lease it admits).
pub const MAX_IN_FLIGHT_MAX: u32 = 10_000;
/// Largest rate count per window (the load keeps one instant per entry in a window).
pub const RATE_COUNT_MAX: u32 = 10_000;
/// Largest breaker threshold.
pub const BREAKER_FAILURES_MAX: u32 = 10_000;
/// Longest breaker cool-down (1 day).
pub const COOLDOWN_MS_MAX: u64 = 86_400_000;
/// Longest name of a target.
pub const TARGET_MAX_LEN: usize = 300;

/// A rate: at most `count` entries in any window of `per_ms` milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rate {
    /// Entries per window.
    pub count: u32,
    /// The window, in milliseconds.
    pub per_ms: u64,
}

impl Rate {
    /// Parses `N/s`, `N/m` or `N/h` (also `N/second`, `N/minute`, `N/hour`); the
    /// error says what was wrong.
    pub fn parse(text: &str) -> Result<Rate, String> {
        let (count, unit) = text
            .trim()
            .split_once('/')
            .ok_or_else(|| format!("{text:?} is not a rate: write N/s, N/m or N/h"))?;
        let per_ms = match unit.trim() {
            "s" | "sec" | "second" => 1_000,
            "m" | "min" | "minute" => 60_000,
            "h" | "hour" => 3_600_000,
            other => return Err(format!("unknown unit {other:?}: write N/s, N/m or N/h")),
        };
        let count: i64 = count
            .trim()
            .parse()
            .map_err(|_| format!("{:?} is not a whole number", count.trim()))?;
        let count = positive(count, RATE_COUNT_MAX as i64)?;
        Ok(Rate {
            count: count as u32,
            per_ms,
        })
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.per_ms {
            1_000 => write!(f, "{}/s", self.count),
            60_000 => write!(f, "{}/m", self.count),
            3_600_000 => write!(f, "{}/h", self.count),
            ms => write!(f, "{} per {ms} ms", self.count),
        }
    }
}

/// A circuit breaker: opens after `failures` consecutive transient failures, for
/// `cooldown_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Breaker {
    /// Consecutive give-backs that open it.
    pub failures: u32,
    /// How long it stays open before it lets a probe through, in milliseconds.
    pub cooldown_ms: u64,
}

/// The limits of one target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetLimit {
    /// The target ([`crate::route::step_target`]).
    pub target: String,
    /// Most live leases on it at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
    /// Most entries per window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<Rate>,
    /// Its circuit breaker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breaker: Option<Breaker>,
}

fn positive(value: i64, max: i64) -> Result<i64, String> {
    if value <= 0 {
        return Err(format!("must be at least 1, not {value}"));
    }
    if value > max {
        return Err(format!("must be at most {max}, not {value}"));
    }
    Ok(value)
}

impl TargetLimit {
    /// Checks every value; the error names the field and the reason.
    pub fn validate(&self) -> Result<(), String> {
        let t = self.target.trim();
        if t.is_empty() {
            return Err("target: must not be empty".into());
        }
        if t != self.target || self.target.len() > TARGET_MAX_LEN || self.target.chars().any(char::is_control) {
            return Err(format!(
                "target: must be at most {TARGET_MAX_LEN} bytes without surrounding spaces or control characters"
            ));
        }
        if let Some(n) = self.max_in_flight {
            positive(n.into(), MAX_IN_FLIGHT_MAX.into()).map_err(|e| format!("max_in_flight: {e}"))?;
        }
        if let Some(r) = self.rate {
            positive(r.count.into(), RATE_COUNT_MAX.into()).map_err(|e| format!("rate: {e}"))?;
            if r.per_ms == 0 || r.per_ms > COOLDOWN_MS_MAX {
                return Err(format!("rate: the window must be 1 ms to {COOLDOWN_MS_MAX} ms"));
            }
        }
        if let Some(b) = self.breaker {
            positive(b.failures.into(), BREAKER_FAILURES_MAX.into()).map_err(|e| format!("breaker_failures: {e}"))?;
            if b.cooldown_ms == 0 || b.cooldown_ms > COOLDOWN_MS_MAX {
                return Err(format!("breaker_cooldown: must be 1 ms to {COOLDOWN_MS_MAX} ms"));
            }
        }
        if self.max_in_flight.is_none() && self.rate.is_none() && self.breaker.is_none() {
            return Err("a limit needs max_in_flight, rate or breaker".into());
        }
        Ok(())
    }
}

/// What a ledger knows of a target when it admits an entry, read under the
/// target's lock; [`TargetLimit::admit`] updates it and the ledger writes back its
/// stored part (`recent`, `failures`, `open_until`, `probe`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Load {
    /// Live leases whose next step targets it (counted, not stored).
    pub in_flight: u32,
    /// The instants of its latest entries, oldest first (at most the rate's count).
    pub recent: VecDeque<Timestamp>,
    /// Consecutive give-backs since its last success.
    pub failures: u32,
    /// Open until this instant (the breaker tripped).
    pub open_until: Option<Timestamp>,
    /// The command that holds the half-open breaker's probe.
    pub probe: Option<CommandId>,
    /// Whether that probe still holds a live lease on it (read, not stored).
    pub probing: bool,
}

/// Why an entry was refused, and until when (if known) the target refuses entries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(rename_all = "kebab-case")]
pub enum Blocked {
    /// `max_in_flight` live leases already run it.
    #[error("target {target} is at its limit of {max} in flight")]
    InFlight {
        /// The target.
        target: String,
        /// Its limit.
        max: u32,
    },
    /// The rate's count was reached in the current window.
    #[error("target {target} reached its rate of {rate}; next entry at {until}")]
    Rate {
        /// The target.
        target: String,
        /// Its rate.
        rate: Rate,
        /// When the oldest entry leaves the window.
        until: Timestamp,
    },
    /// Its breaker is open.
    #[error("target {target}'s circuit breaker is open until {until}")]
    Open {
        /// The target.
        target: String,
        /// The end of the cool-down.
        until: Timestamp,
    },
    /// Its breaker is half-open and its probe is out.
    #[error("target {target}'s circuit breaker is half-open and its probe is out")]
    Probing {
        /// The target.
        target: String,
    },
}

impl Blocked {
    /// Until when the target surely refuses entries, when that is known (`None`:
    /// until a lease on it ends).
    pub fn until(&self) -> Option<Timestamp> {
        match self {
            Blocked::Rate { until, .. } | Blocked::Open { until, .. } => Some(*until),
            Blocked::InFlight { .. } | Blocked::Probing { .. } => None,
        }
    }
}

/// A breaker's state, as shown and exported (`leasehold_target_breaker_state`:
/// 0 closed, 1 open, 2 half-open).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BreakerState {
    /// Admitting.
    Closed,
    /// Refusing until its cool-down ends.
    Open,
    /// Admitting one probe.
    HalfOpen,
}

impl BreakerState {
    /// `closed`, `open`, `half-open`.
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half-open",
        }
    }

    /// The metric's value.
    pub fn gauge(self) -> i64 {
        match self {
            BreakerState::Closed => 0,
            BreakerState::Open => 1,
            BreakerState::HalfOpen => 2,
        }
    }
}

/// How a delivery to a target ended, for its breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A step on it SUCCEEDED.
    Succeeded,
    /// A delivery on it was given back after a transient failure.
    Failed,
}

impl TargetLimit {
    /// The breaker's state at `now`.
    pub fn breaker_state(&self, load: &Load, now: Timestamp) -> BreakerState {
        match (self.breaker, load.open_until) {
            (Some(b), Some(until)) if load.failures >= b.failures => {
                if now < until {
                    BreakerState::Open
                } else {
                    BreakerState::HalfOpen
                }
            }
            _ => BreakerState::Closed,
        }
    }

    /// Admits one entry of `command` at `now`, or says why not. Admitted, `load`
    /// counts it (in flight, in the rate's window, as the probe if the breaker is
    /// half-open).
    pub fn admit(&self, load: &mut Load, command: &CommandId, now: Timestamp) -> Result<(), Blocked> {
        let target = || self.target.clone();
        let state = self.breaker_state(load, now);
        match state {
            BreakerState::Open => {
                return Err(Blocked::Open {
                    target: target(),
                    until: load.open_until.unwrap_or(now),
                })
            }
            BreakerState::HalfOpen if load.probing => return Err(Blocked::Probing { target: target() }),
            _ => {}
        }
        if let Some(max) = self.max_in_flight.filter(|m| load.in_flight >= *m) {
            return Err(Blocked::InFlight { target: target(), max });
        }
        if let Some(rate) = self.rate {
            load.recent.retain(|t| t.plus_ms(rate.per_ms) > now);
            if let Some(oldest) = load.recent.front().filter(|_| load.recent.len() >= rate.count as usize) {
                return Err(Blocked::Rate {
                    target: target(),
                    rate,
                    until: oldest.plus_ms(rate.per_ms),
                });
            }
            load.recent.push_back(now);
        }
        load.in_flight += 1;
        if state == BreakerState::HalfOpen {
            load.probe = Some(command.clone());
            load.probing = true;
        }
        Ok(())
    }

    /// Records how a delivery to the target ended: a success closes the breaker, a
    /// failure counts towards opening it (and reopens a half-open one).
    pub fn record(&self, load: &mut Load, outcome: Outcome, now: Timestamp) {
        match outcome {
            Outcome::Succeeded => {
                load.failures = 0;
                load.open_until = None;
                load.probe = None;
                load.probing = false;
            }
            Outcome::Failed => {
                load.failures = load.failures.saturating_add(1);
                if let Some(b) = self.breaker.filter(|b| load.failures >= b.failures) {
                    load.open_until = Some(now.plus_ms(b.cooldown_ms));
                    load.probe = None;
                    load.probing = false;
                }
            }
        }
    }
}

/// The stored form of [`Load::recent`]: the first instant in milliseconds, then
/// each later one as its distance from the one before, comma-separated.
pub fn encode_recent(recent: &VecDeque<Timestamp>) -> String {
    let mut last = 0i64;
    let parts: Vec<String> = recent
        .iter()
        .map(|t| {
            let ms = t.as_millis();
            let delta = ms.saturating_sub(last);
            last = ms;
            delta.to_string()
        })
        .collect();
    parts.join(",")
}

/// Reads [`encode_recent`]'s form back; `None` for text it never wrote.
pub fn decode_recent(text: &str) -> Option<VecDeque<Timestamp>> {
    let mut out = VecDeque::new();
    let mut at = 0i64;
    for part in text.split(',').filter(|p| !p.is_empty()) {
        at = at.checked_add(part.parse().ok()?)?;
        out.push_back(Timestamp::from_millis(at));
    }
    Some(out)
}

#[cfg(test)]
mod tests;
