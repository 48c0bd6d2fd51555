//! The wire protocols of the simulated network: the db host's ledger protocol and
//! the target host's effect protocol.
//!
//! Contract: one frame is a 4-byte big-endian length followed by that many bytes of
//! JSON (serde_json). A client opens a connection, writes one request frame and reads
//! one reply frame. Every ledger request carries its sender's host name and its
//! sender's clock reading (`sent_at`), which only the planted bug
//! `lease-on-worker-clock` ever uses. Lease tokens travel as text inside
//! [`WireLease`] (the db host must check them) but its `Debug` never shows the text,
//! and nothing here prints a frame.

use leasehold::ledger::{Claimed, LedgerError};
use leasehold_engine::transition::ReconcileOutcome;
use leasehold_engine::{
    Action, AttemptId, AttemptRecord, AttemptStatus, CommandId, Lease, LeaseToken, Plan, PlanId, PlanSpec, Refusal,
    Timestamp,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;
use std::io;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The largest frame either side accepts.
pub const FRAME_BYTES_MAX: usize = 4 << 20;

/// Writes one frame holding `value` as JSON.
pub async fn write_frame<W: AsyncWrite + Unpin, T: Serialize>(w: &mut W, value: &T) -> io::Result<()> {
    let body = serde_json::to_vec(value).map_err(io::Error::other)?;
    let len = u32::try_from(body.len()).map_err(|_| io::Error::other("frame too large"))?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&body);
    w.write_all(&frame).await?;
    w.flush().await
}

/// Reads one frame; `Ok(None)` when the peer closed the connection before a frame
/// began.
pub async fn read_frame<R: AsyncRead + Unpin, T: DeserializeOwned>(r: &mut R) -> io::Result<Option<T>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > FRAME_BYTES_MAX {
        return Err(io::Error::other(format!(
            "frame of {len} bytes exceeds {FRAME_BYTES_MAX}"
        )));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    serde_json::from_slice(&body).map(Some).map_err(io::Error::other)
}

/// Idle connections a [`Pool`] keeps for reuse.
pub const POOL_IDLE_MAX: usize = 4;

/// Why a pooled request did not get its reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// No connection could be made in time: nothing was sent.
    NotSent(String),
    /// The request was sent (or may have been) but no reply came: the peer may
    /// have acted on it.
    NoReply(String),
}

/// A small pool of connections to one host, used one request at a time each.
///
/// A connection goes back to the pool only after a complete exchange; one that
/// timed out or broke is dropped, so a late reply can never be read as the answer
/// to a later request. A request written on a connection that is then partitioned
/// or held stays in flight and may be delivered late — exactly how stale requests
/// reach a real server.
#[derive(Debug)]
pub struct Pool {
    host: &'static str,
    port: u16,
    idle: std::sync::Mutex<Vec<turmoil::net::TcpStream>>,
}

impl Pool {
    /// A pool of connections to `host:port`.
    pub fn new(host: &'static str, port: u16) -> Self {
        Self {
            host,
            port,
            idle: std::sync::Mutex::new(Vec::new()),
        }
    }

    fn take(&self) -> Option<turmoil::net::TcpStream> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }

    fn give_back(&self, stream: turmoil::net::TcpStream) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < POOL_IDLE_MAX {
            idle.push(stream);
        }
    }

    /// Sends `request` and reads its reply, all within `timeout`.
    pub async fn call<Req: Serialize, Rep: DeserializeOwned>(
        &self,
        request: &Req,
        timeout: std::time::Duration,
    ) -> Result<Rep, CallError> {
        use tokio::time::{timeout_at, Instant};
        let deadline = Instant::now() + timeout;
        let host = self.host;
        let mut stream = match self.take() {
            Some(s) => s,
            None => match timeout_at(deadline, turmoil::net::TcpStream::connect((host, self.port))).await {
                Err(_) => {
                    return Err(CallError::NotSent(format!(
                        "no connection to {host} within the deadline"
                    )))
                }
                Ok(Err(e)) => return Err(CallError::NotSent(format!("cannot connect to {host}: {e}"))),
                Ok(Ok(s)) => s,
            },
        };
        match timeout_at(deadline, write_frame(&mut stream, request)).await {
            Ok(Ok(())) => {}
            Err(_) => return Err(CallError::NoReply(format!("sending to {host} timed out"))),
            Ok(Err(e)) => return Err(CallError::NoReply(format!("sending to {host} failed: {e}"))),
        }
        match timeout_at(deadline, read_frame::<_, Rep>(&mut stream)).await {
            Err(_) => Err(CallError::NoReply(format!("no reply from {host} within the deadline"))),
            Ok(Err(e)) => Err(CallError::NoReply(format!("the connection to {host} broke: {e}"))),
            Ok(Ok(None)) => Err(CallError::NoReply(format!(
                "{host} closed the connection without a reply"
            ))),
            Ok(Ok(Some(reply))) => {
                self.give_back(stream);
                Ok(reply)
            }
        }
    }
}

/// A lease on the wire. `Debug` hides the token.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireLease {
    /// The command held.
    pub command: CommandId,
    /// Its attempt.
    pub attempt: AttemptId,
    /// The token's text.
    pub token: String,
}

impl fmt::Debug for WireLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WireLease({}, {}, ***)", self.command, self.attempt)
    }
}

impl WireLease {
    /// The wire form of a lease.
    pub fn of(lease: &Lease) -> Self {
        Self {
            command: lease.command_id.clone(),
            attempt: lease.attempt_id.clone(),
            token: lease.token.expose().to_owned(),
        }
    }

    /// The lease again.
    pub fn to_lease(&self) -> Lease {
        Lease {
            command_id: self.command.clone(),
            attempt_id: self.attempt.clone(),
            token: LeaseToken::new(self.token.clone()),
        }
    }
}

/// One operation of the ledger, as the db host serves it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum DbRequest {
    /// `Ledger::migrate`.
    Migrate,
    /// `Ledger::register_plan`.
    RegisterPlan {
        /// The plan file.
        spec: PlanSpec,
        /// Executors plan validation accepts.
        known: Vec<String>,
    },
    /// `Ledger::plan`.
    Plan {
        /// The plan.
        id: PlanId,
    },
    /// `Ledger::list_plans`.
    ListPlans,
    /// `Ledger::retire_plan`.
    RetirePlan {
        /// The plan.
        id: PlanId,
    },
    /// `Ledger::enqueue`.
    Enqueue {
        /// The plan.
        plan: PlanId,
        /// What the attempt does.
        action: Action,
    },
    /// `Ledger::claim`.
    Claim {
        /// Lease owner.
        owner: String,
        /// Most commands to claim.
        batch: u32,
        /// Lease length.
        lease_ms: u64,
    },
    /// `Ledger::claim_and_begin` (one transaction in the db host).
    ClaimAndBegin {
        /// Lease owner.
        owner: String,
        /// Most commands to claim.
        batch: u32,
        /// Lease length.
        lease_ms: u64,
    },
    /// `Ledger::complete_and_continue` (one transaction in the db host).
    CompleteAndContinue {
        /// The lease.
        lease: WireLease,
        /// The receipt.
        ordinal: u32,
        /// Executor evidence.
        evidence: Value,
        /// Target receipt.
        target_receipt: Value,
        /// Lease length.
        lease_ms: u64,
    },
    /// `Ledger::heartbeat`.
    Heartbeat {
        /// The lease.
        lease: WireLease,
        /// Lease length.
        lease_ms: u64,
    },
    /// `Ledger::begin_step`.
    BeginStep {
        /// The lease.
        lease: WireLease,
        /// The receipt.
        ordinal: u32,
        /// Lease length.
        lease_ms: u64,
    },
    /// `Ledger::complete_step`.
    CompleteStep {
        /// The lease.
        lease: WireLease,
        /// The receipt.
        ordinal: u32,
        /// Executor evidence.
        evidence: Value,
        /// Target receipt.
        target_receipt: Value,
        /// Lease length.
        lease_ms: u64,
    },
    /// `Ledger::fail`.
    Fail {
        /// The lease.
        lease: WireLease,
        /// The failing step.
        ordinal: Option<u32>,
        /// Why.
        error: String,
    },
    /// `Ledger::finish`.
    Finish {
        /// The lease.
        lease: WireLease,
    },
    /// `Ledger::reconcile`.
    Reconcile {
        /// The attempt.
        attempt: AttemptId,
    },
    /// `Ledger::abort`.
    Abort {
        /// The attempt.
        attempt: AttemptId,
        /// Why.
        reason: String,
    },
    /// `Ledger::attempt`.
    Attempt {
        /// The attempt.
        attempt: AttemptId,
    },
    /// `Ledger::history`.
    History {
        /// The plan.
        plan: PlanId,
    },
    /// `Ledger::open_attempts`.
    OpenAttempts,
}

impl DbRequest {
    /// The operation's short name, for traces.
    pub fn op(&self) -> &'static str {
        match self {
            DbRequest::Migrate => "migrate",
            DbRequest::RegisterPlan { .. } => "register-plan",
            DbRequest::Plan { .. } => "plan",
            DbRequest::ListPlans => "list-plans",
            DbRequest::RetirePlan { .. } => "retire-plan",
            DbRequest::Enqueue { .. } => "enqueue",
            DbRequest::Claim { .. } => "claim",
            DbRequest::ClaimAndBegin { .. } => "claim-and-begin",
            DbRequest::CompleteAndContinue { .. } => "complete-and-continue",
            DbRequest::Heartbeat { .. } => "heartbeat",
            DbRequest::BeginStep { .. } => "begin-step",
            DbRequest::CompleteStep { .. } => "complete-step",
            DbRequest::Fail { .. } => "fail",
            DbRequest::Finish { .. } => "finish",
            DbRequest::Reconcile { .. } => "reconcile",
            DbRequest::Abort { .. } => "abort",
            DbRequest::Attempt { .. } => "attempt",
            DbRequest::History { .. } => "history",
            DbRequest::OpenAttempts => "open-attempts",
        }
    }
}

/// A ledger request with who sent it and when (by the sender's clock).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DbEnvelope {
    /// The sender's host name.
    pub from: String,
    /// The sender's clock when it sent the request.
    pub sent_at: Timestamp,
    /// The operation.
    pub request: DbRequest,
}

/// A claimed command on the wire.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireClaimed {
    /// The lease.
    pub lease: WireLease,
    /// The plan.
    pub plan: Plan,
    /// The attempt's rows after the claim.
    pub record: AttemptRecord,
}

impl WireClaimed {
    /// The wire form of a claim.
    pub fn of(c: &Claimed) -> Self {
        Self {
            lease: WireLease::of(&c.lease),
            plan: c.plan.clone(),
            record: c.record.clone(),
        }
    }

    /// The claim again.
    pub fn into_claimed(self) -> Claimed {
        let lease = self.lease.to_lease();
        let mut record = self.record;
        record.command.lease_token = Some(lease.token.clone());
        Claimed {
            lease,
            plan: self.plan,
            record,
        }
    }
}

/// A successful ledger reply.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum DbReply {
    /// Nothing to answer.
    Done,
    /// Migration versions applied.
    Versions(Vec<u32>),
    /// One plan.
    Plan(Plan),
    /// Plans.
    Plans(Vec<Plan>),
    /// Claimed commands.
    Claimed(Vec<WireClaimed>),
    /// A renewed lease's deadline.
    Until(Timestamp),
    /// One attempt's rows.
    Record(AttemptRecord),
    /// Reconcile's outcome.
    Reconciled {
        /// Whether the command went back to PENDING.
        requeued: bool,
        /// The attempt's rows after it.
        record: AttemptRecord,
    },
    /// Several attempts' rows.
    Records(Vec<AttemptRecord>),
    /// A count.
    Count(u64),
    /// What complete-and-continue did: began this step, or finished (`None`).
    Continued(Option<u32>),
}

/// A refusal on the wire, variant for variant.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum WireRefusal {
    /// [`Refusal::StaleToken`].
    StaleToken {
        /// The command.
        command: CommandId,
    },
    /// [`Refusal::LiveLease`].
    LiveLease {
        /// The command.
        command: CommandId,
        /// Its holder.
        owner: String,
        /// Its deadline.
        until: Timestamp,
    },
    /// [`Refusal::NotClaimable`].
    NotClaimable {
        /// The command.
        command: CommandId,
        /// Why.
        reason: String,
    },
    /// [`Refusal::Terminal`].
    Terminal {
        /// The attempt.
        attempt: AttemptId,
        /// Its status.
        status: AttemptStatus,
    },
    /// [`Refusal::OutOfOrder`].
    OutOfOrder {
        /// The attempt.
        attempt: AttemptId,
        /// The receipt.
        ordinal: u32,
        /// Why.
        reason: String,
    },
    /// [`Refusal::Guard`].
    Guard {
        /// The action.
        action: Action,
        /// Why.
        reason: String,
    },
    /// A refusal this protocol does not know yet, by its message.
    Other(String),
}

impl WireRefusal {
    /// The wire form of a refusal.
    pub fn of(r: &Refusal) -> Self {
        match r.clone() {
            Refusal::StaleToken { command } => WireRefusal::StaleToken { command },
            Refusal::LiveLease { command, owner, until } => WireRefusal::LiveLease { command, owner, until },
            Refusal::NotClaimable { command, reason } => WireRefusal::NotClaimable { command, reason },
            Refusal::Terminal { attempt, status } => WireRefusal::Terminal { attempt, status },
            Refusal::OutOfOrder {
                attempt,
                ordinal,
                reason,
            } => WireRefusal::OutOfOrder {
                attempt,
                ordinal,
                reason,
            },
            Refusal::Guard { action, reason } => WireRefusal::Guard { action, reason },
            other => WireRefusal::Other(other.to_string()),
        }
    }

    /// The refusal again (`Other` becomes an internal ledger error).
    pub fn into_error(self) -> LedgerError {
        LedgerError::Refused(match self {
            WireRefusal::StaleToken { command } => Refusal::StaleToken { command },
            WireRefusal::LiveLease { command, owner, until } => Refusal::LiveLease { command, owner, until },
            WireRefusal::NotClaimable { command, reason } => Refusal::NotClaimable { command, reason },
            WireRefusal::Terminal { attempt, status } => Refusal::Terminal { attempt, status },
            WireRefusal::OutOfOrder {
                attempt,
                ordinal,
                reason,
            } => Refusal::OutOfOrder {
                attempt,
                ordinal,
                reason,
            },
            WireRefusal::Guard { action, reason } => Refusal::Guard { action, reason },
            WireRefusal::Other(message) => return LedgerError::Internal(format!("unknown refusal: {message}")),
        })
    }
}

/// A ledger error on the wire.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum WireError {
    /// [`LedgerError::Refused`].
    Refused(WireRefusal),
    /// [`LedgerError::NotFound`].
    NotFound {
        /// `plan`, `attempt` or `command`.
        kind: String,
        /// What was looked up.
        id: String,
    },
    /// [`LedgerError::InvalidPlan`] and [`LedgerError::BadInput`], by message.
    BadInput(String),
    /// [`LedgerError::Unavailable`].
    Unavailable(String),
    /// [`LedgerError::Ambiguous`].
    Ambiguous(String),
    /// [`LedgerError::Integrity`].
    Integrity(String),
    /// [`LedgerError::Internal`] and anything newer.
    Internal(String),
}

impl WireError {
    /// The wire form of a ledger error.
    pub fn of(e: &LedgerError) -> Self {
        match e {
            LedgerError::Refused(r) => WireError::Refused(WireRefusal::of(r)),
            LedgerError::NotFound { kind, id } => WireError::NotFound {
                kind: (*kind).to_owned(),
                id: id.clone(),
            },
            LedgerError::InvalidPlan(p) => WireError::BadInput(format!("invalid plan: {p}")),
            LedgerError::BadInput(m) => WireError::BadInput(m.clone()),
            LedgerError::Unavailable(m) => WireError::Unavailable(m.clone()),
            LedgerError::Ambiguous(m) => WireError::Ambiguous(m.clone()),
            LedgerError::Integrity(m) => WireError::Integrity(m.clone()),
            other => WireError::Internal(other.to_string()),
        }
    }

    /// The ledger error again.
    pub fn into_error(self) -> LedgerError {
        match self {
            WireError::Refused(r) => r.into_error(),
            WireError::NotFound { kind, id } => LedgerError::NotFound {
                kind: match kind.as_str() {
                    "plan" => "plan",
                    "attempt" => "attempt",
                    "command" => "command",
                    _ => "record",
                },
                id,
            },
            WireError::BadInput(m) => LedgerError::BadInput(m),
            WireError::Unavailable(m) => LedgerError::Unavailable(m),
            WireError::Ambiguous(m) => LedgerError::Ambiguous(m),
            WireError::Integrity(m) => LedgerError::Integrity(m),
            WireError::Internal(m) => LedgerError::Internal(m),
        }
    }
}

/// What the db host answers to one request.
pub type DbResponse = Result<DbReply, WireError>;

/// Reconcile's outcome as a flag.
pub fn requeued(outcome: ReconcileOutcome) -> bool {
    matches!(outcome, ReconcileOutcome::Requeued)
}

/// One effect the target host is asked to apply.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TargetRequest {
    /// The idempotency key: the target applies each key at most once (per sandbox).
    pub key: String,
    /// The ephemeral sandbox the effect lands in, for `replay` plans.
    pub sandbox: Option<String>,
    /// The attempt (for the checker's per-step bookkeeping).
    pub attempt: AttemptId,
    /// The receipt's ordinal.
    pub ordinal: u32,
    /// The step code.
    pub step: String,
    /// Who sent it.
    pub worker: String,
    /// The delivery (the command's `delivery_count` under the claim) it belongs to.
    pub delivery: u32,
    /// How long the target takes before it answers.
    pub delay_ms: u64,
}

/// What the target answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetReply {
    /// The target receipt: the same for every delivery of a key.
    pub target_receipt: Value,
    /// Step codes applied, in order, in the sandbox (replay) or for the attempt
    /// (durable), as of the key's first application.
    pub applied: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip_and_eof_is_none() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        write_frame(&mut a, &DbReply::Count(7)).await.unwrap();
        drop(a);
        let got: Option<DbReply> = read_frame(&mut b).await.unwrap();
        assert!(matches!(got, Some(DbReply::Count(7))));
        let eof: Option<DbReply> = read_frame(&mut b).await.unwrap();
        assert!(eof.is_none());
    }

    #[test]
    fn wire_lease_debug_hides_the_token() {
        let l = WireLease {
            command: CommandId::new("c"),
            attempt: AttemptId::new("a"),
            token: "s3cret".into(),
        };
        assert!(!format!("{l:?}").contains("s3cret"));
    }

    #[test]
    fn refusals_survive_the_wire() {
        let r = Refusal::StaleToken {
            command: CommandId::new("c1"),
        };
        let back = WireRefusal::of(&r).into_error();
        assert_eq!(back, LedgerError::Refused(r));
    }
}
