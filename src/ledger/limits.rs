//! Per-target limits on a ledger ([`leasehold_engine::limits`]): one row per limited
//! target with its limits and its stored [`Load`], what each write of a lease onto a
//! target must pass, and what a write tells the target's breaker.
//!
//! Every ledger applies the same rules at the same points:
//! - a claim, and a worker write that moves a live lease onto another target
//!   ([`entered`]), is admitted by the target's [`TargetLimit::admit`] on its load,
//!   read under the target's lock in the write's own transaction; a claim passes a
//!   refused command over, a worker write hands its command back instead
//!   ([`yielded`]);
//! - a step that SUCCEEDED, or a give-back, is recorded with the target's breaker
//!   ([`outcomes`]);
//! - a claim's candidates leave out the targets that refuse every entry now (breaker
//!   open, rate spent, probe out, or as many live leases as `max_in_flight`), so that
//!   a blocked target's backlog does not hide other targets' work.

use leasehold_engine::limits::{Blocked, BreakerState, Load, Outcome, TargetLimit};
use leasehold_engine::transition::{self, Continued};
use leasehold_engine::{
    AttemptRecord, CommandId, CommandStatus, LeaseToken, ReceiptStatus, Refusal, Reply, Timestamp, WorkerRequest,
    Writes,
};
use serde::Serialize;
use std::collections::BTreeMap;

/// A limited target as listed: its limits, its live leases, its breaker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TargetRow {
    /// Its limits.
    #[serde(flatten)]
    pub limit: TargetLimit,
    /// Live leases whose next step targets it.
    pub in_flight: u32,
    /// Its breaker's state.
    pub breaker_state: BreakerState,
    /// Consecutive give-backs since its last success.
    pub failures: u32,
    /// Open until (while open).
    pub open_until: Option<Timestamp>,
    /// Entries in the rate's current window.
    pub recent: u32,
}

impl TargetRow {
    /// The row of `limit` with `load`, at `now`.
    pub fn of(limit: TargetLimit, load: &Load, now: Timestamp) -> Self {
        let breaker_state = limit.breaker_state(load, now);
        let recent = match limit.rate {
            Some(r) => load.recent.iter().filter(|t| t.plus_ms(r.per_ms) > now).count() as u32,
            None => 0,
        };
        TargetRow {
            in_flight: load.in_flight,
            breaker_state,
            failures: load.failures,
            open_until: load.open_until.filter(|_| breaker_state == BreakerState::Open),
            recent,
            limit,
        }
    }
}

/// The target that `writes`, decided at `now`, make a live lease enter: a claim's;
/// a worker write's that moves its lease onto a step of another target; or one that
/// renews its lease after it expired (nobody took it over, but its slot was free
/// meanwhile). `None` for every other write (and for a command without a route,
/// written before routing).
pub fn entered<'w>(before: &AttemptRecord, writes: &'w Writes, now: Timestamp) -> Option<&'w str> {
    let after = writes.command.as_ref()?;
    if after.status != CommandStatus::Processing || after.target.is_empty() {
        return None;
    }
    let c = &before.command;
    let same_lease = c.status == CommandStatus::Processing && c.lease_token == after.lease_token;
    let expired = c.lease_until.is_some_and(|until| until < now);
    (!same_lease || c.target != after.target || expired).then_some(after.target.as_str())
}

/// What a worker write whose lease `target` refused (`blocked`) becomes: a lease
/// moved onto the target is handed back ([`yielded`]); a renewal of an expired
/// lease on the same target is refused ([`Refusal::Limited`]), writing nothing.
pub fn refused_entry(
    before: &AttemptRecord,
    (writes, token): (Writes, &LeaseToken),
    target: &str,
    blocked: &Blocked,
    now: Timestamp,
) -> Result<(Writes, Reply), Refusal> {
    if before.command.target == target {
        return Err(Refusal::Limited {
            command: before.command.id.clone(),
            reason: blocked.to_string(),
        });
    }
    let until = blocked.until().unwrap_or(now.plus_ms(YIELD_PAUSE_MS));
    yielded(before, writes, token, &blocked.to_string(), until)
}

/// What a worker's `request`, decided into `writes` on `before`, tells the breakers:
/// each step it completes is a success of that step's target; a give-back is a
/// failure of the target it gives back.
pub fn outcomes(request: &WorkerRequest, before: &AttemptRecord, writes: &Writes) -> Vec<(String, Outcome)> {
    if let WorkerRequest::GiveBack { .. } = request {
        return vec![(before.command.target.clone(), Outcome::Failed)];
    }
    writes
        .receipts
        .iter()
        .filter(|r| r.status == ReceiptStatus::Succeeded && !r.target.is_empty())
        .filter(|r| {
            before
                .receipt(r.ordinal)
                .is_some_and(|b| b.status != ReceiptStatus::Succeeded)
        })
        .map(|r| (r.target.clone(), Outcome::Succeeded))
        .collect()
}

/// A worker write whose lease a target refused: the same write, then the command
/// handed back ([`transition::yield_lease`]) until `until`, answered as
/// [`Continued::Yielded`].
pub fn yielded(
    before: &AttemptRecord,
    writes: Writes,
    token: &LeaseToken,
    reason: &str,
    until: Timestamp,
) -> Result<(Writes, Reply), Refusal> {
    let chained = writes.then(before, |after| Ok(transition::yield_lease(after, token, reason, until)))?;
    Ok((chained, Reply::Continued(Continued::Yielded(until))))
}

/// How long a refused worker write's command waits before it is claimable again
/// when its target did not say (a lease must end first): a short pause, so that
/// its next claim finds the slot a finished lease freed.
pub const YIELD_PAUSE_MS: u64 = 100;

/// What a limit table asks of its ledger's commands: the live leases on a target
/// at `now`, and the end of a command's live lease on a target.
pub trait Leases {
    /// Live leases on `target` at `now`.
    fn live(&self, target: &str, now: Timestamp) -> u32;
    /// The end of `command`'s live lease on `target`, if it holds one.
    fn lease_of(&self, command: &CommandId, target: &str, now: Timestamp) -> Option<Timestamp>;
}

/// One limited target of a [`LimitTable`].
#[derive(Debug, Clone)]
struct LimitRow {
    limit: TargetLimit,
    load: Load,
    blocked_until: Option<Timestamp>,
}

/// The memory ledger's `target_limit` rows: the same rules as the SQL ledgers'
/// gates ([`super::sql`]'s `limits`), on rows in memory. The simulator's model
/// checker keeps one in each of its states, so that its ledger applies these rules
/// with this code.
#[derive(Debug, Default, Clone)]
pub struct LimitTable {
    rows: BTreeMap<String, LimitRow>,
}

impl LimitTable {
    /// Whether no target is limited.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Sets `limit` (its row created on first use; its load kept, its block lifted).
    pub fn set(&mut self, limit: TargetLimit) {
        let row = self.rows.entry(limit.target.clone()).or_insert_with(|| LimitRow {
            limit: limit.clone(),
            load: Load::default(),
            blocked_until: None,
        });
        row.limit = limit;
        row.blocked_until = None;
    }

    /// Removes a target's limits; whether it had any.
    pub fn clear(&mut self, target: &str) -> bool {
        self.rows.remove(target).is_some()
    }

    /// Every limited target, by target.
    pub fn list(&self, leases: &impl Leases, now: Timestamp) -> Vec<TargetRow> {
        self.rows
            .values()
            .map(|r| {
                let mut load = r.load.clone();
                load.in_flight = leases.live(&r.limit.target, now);
                TargetRow::of(r.limit.clone(), &load, now)
            })
            .collect()
    }

    /// Whether a claim leaves `target`'s commands out at `now` (the candidate filter).
    pub fn blocks(&self, target: &str, leases: &impl Leases, now: Timestamp) -> bool {
        self.rows.get(target).is_some_and(|r| {
            r.blocked_until.is_some_and(|t| t > now)
                || r.limit.max_in_flight.is_some_and(|m| leases.live(target, now) >= m)
                || r.load
                    .probe
                    .as_ref()
                    .is_some_and(|p| leases.lease_of(p, target, now).is_some())
        })
    }

    /// Admits one lease of `command` onto `target` at `now`.
    pub fn admit(
        &mut self,
        target: &str,
        command: &CommandId,
        leases: &impl Leases,
        now: Timestamp,
    ) -> Result<(), Blocked> {
        let Some(row) = self.rows.get_mut(target) else {
            return Ok(());
        };
        row.load.in_flight = leases.live(target, now);
        row.load.probing = row
            .load
            .probe
            .as_ref()
            .is_some_and(|p| leases.lease_of(p, target, now).is_some());
        let verdict = row.limit.admit(&mut row.load, command, now);
        if let Some(until) = verdict.as_ref().err().and_then(Blocked::until) {
            row.blocked_until = Some(until);
        }
        verdict
    }

    /// Records how a delivery to `target` ended with its breaker.
    pub fn record(&mut self, target: &str, outcome: Outcome, now: Timestamp) {
        if let Some(row) = self.rows.get_mut(target).filter(|r| r.limit.breaker.is_some()) {
            row.limit.record(&mut row.load, outcome, now);
            row.blocked_until = row.load.open_until;
        }
    }

    /// A worker's decision on `before` under these limits: its outcomes recorded
    /// with the targets' breakers ([`outcomes`]), and a lease it makes enter a
    /// target ([`entered`]) admitted there, or handed back or refused
    /// ([`refused_entry`]).
    pub fn worker_write(
        &mut self,
        leases: &impl Leases,
        (request, token): (&WorkerRequest, &LeaseToken),
        before: &AttemptRecord,
        (writes, reply): (Writes, Reply),
        now: Timestamp,
    ) -> Result<(Writes, Reply), Refusal> {
        for (target, outcome) in outcomes(request, before, &writes) {
            self.record(&target, outcome, now);
        }
        let Some(target) = entered(before, &writes, now).map(str::to_owned) else {
            return Ok((writes, reply));
        };
        match self.admit(&target, &before.command.id, leases, now) {
            Ok(()) => Ok((writes, reply)),
            Err(blocked) => refused_entry(before, (writes, token), &target, &blocked, now),
        }
    }
}
