//! The wire protocols of the simulated network: the db host's ledger protocol and
//! the target host's effect protocol.
//!
//! Contract: one frame is a 4-byte big-endian length followed by that many bytes of
//! JSON (serde_json). A client opens a connection, writes one request frame and reads
//! one reply frame. Every ledger request carries its sender's host name and its
//! sender's clock reading (`sent_at`), which only the planted bug
//! `lease-on-worker-clock` ever uses. Transitions travel as the engine's own
//! requests ([`leasehold_engine::request`]), their replies as its [`Reply`] and
//! refusals as its [`Refusal`]. Lease tokens travel as text inside [`WireLease`],
//! beside a worker request (the db host must check them), but its `Debug` never
//! shows the text, and nothing here prints a frame.

use leasehold::ledger::{Claimed, LedgerError};
use leasehold_engine::transition::Start;
use leasehold_engine::{
    Action, AttemptId, AttemptRecord, ClaimRequest, CommandId, Lease, LeaseToken, Op, OperatorRequest, Plan, PlanId,
    PlanSpec, Refusal, Reply, Timestamp, TraceContext, WorkerRequest,
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

/// One operation of the ledger, as the db host serves it: the reads and plan
/// operations by name, and every transition as the engine's own request.
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
    /// `Ledger::enqueue_at`.
    Enqueue {
        /// The plan.
        plan: PlanId,
        /// What the attempt does.
        action: Action,
        /// When its command becomes claimable.
        start: Start,
        /// The trace it joins.
        parent: Option<TraceContext>,
        /// Its enqueue key.
        key: Option<String>,
        /// A template's input.
        input: Option<serde_json::Value>,
        /// A template's order key.
        order_key: Option<String>,
    },
    /// `Ledger::claim_batch` (one transaction in the db host).
    Claim(ClaimRequest),
    /// `Ledger::worker`: a request of the worker holding `lease`.
    Worker {
        /// The lease.
        lease: WireLease,
        /// The request.
        request: WorkerRequest,
    },
    /// `Ledger::operator`: an operator request on an attempt.
    Operator {
        /// The attempt.
        attempt: AttemptId,
        /// The request.
        request: OperatorRequest,
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
    /// The transition the request is, if it is one (the engine's operation).
    pub fn op(&self) -> Option<Op> {
        match self {
            DbRequest::Enqueue { .. } => Some(Op::Enqueue),
            DbRequest::Claim(c) => Some(c.op()),
            DbRequest::Worker { request, .. } => Some(request.op()),
            DbRequest::Operator { request, .. } => Some(request.op()),
            DbRequest::Migrate
            | DbRequest::RegisterPlan { .. }
            | DbRequest::Plan { .. }
            | DbRequest::ListPlans
            | DbRequest::RetirePlan { .. }
            | DbRequest::Attempt { .. }
            | DbRequest::History { .. }
            | DbRequest::OpenAttempts => None,
        }
    }

    /// The request's short name, for traces: a transition's is its operation's.
    pub fn name(&self) -> &'static str {
        match self {
            DbRequest::Migrate => "migrate",
            DbRequest::RegisterPlan { .. } => "register-plan",
            DbRequest::Plan { .. } => "plan",
            DbRequest::ListPlans => "list-plans",
            DbRequest::RetirePlan { .. } => "retire-plan",
            DbRequest::Attempt { .. } => "attempt",
            DbRequest::History { .. } => "history",
            DbRequest::OpenAttempts => "open-attempts",
            DbRequest::Enqueue { .. } | DbRequest::Claim(_) | DbRequest::Worker { .. } | DbRequest::Operator { .. } => {
                self.op().map_or("transition", Op::as_str)
            }
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
    /// Migration versions applied.
    Versions(Vec<u32>),
    /// One plan.
    Plan(Plan),
    /// Plans.
    Plans(Vec<Plan>),
    /// Claimed commands.
    Claimed(Vec<WireClaimed>),
    /// One attempt's rows.
    Record(AttemptRecord),
    /// An enqueue's attempt, and whether the enqueue created it.
    Enqueued {
        /// The attempt's rows.
        record: AttemptRecord,
        /// Created by this enqueue (not answered for its key).
        created: bool,
    },
    /// A worker request's reply.
    Worker(Reply),
    /// An operator request's reply, with the attempt's rows after it.
    Operator {
        /// The reply.
        reply: Reply,
        /// The attempt's rows after it.
        record: AttemptRecord,
    },
    /// Several attempts' rows.
    Records(Vec<AttemptRecord>),
    /// A count.
    Count(u64),
}

/// A ledger error on the wire.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum WireError {
    /// [`LedgerError::Refused`]: the engine's refusal as it is.
    Refused(Refusal),
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
            LedgerError::Refused(r) => WireError::Refused(r.clone()),
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
            WireError::Refused(r) => LedgerError::Refused(r),
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

/// How the target treats the calls of one step: what the step's payload asks for
/// ([`TargetMode::of`]). Counts are per idempotency key, whatever the sandbox: a
/// flaky service is flaky for a request, not for a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum TargetMode {
    /// Every call is served.
    #[default]
    Healthy,
    /// The first `calls` calls of each key are answered 503 (no effect), then it is
    /// served: a target that is down for a while and then recovers.
    Flaky {
        /// Calls answered 503 before the key is served.
        calls: u32,
    },
    /// Every call is answered 503, never with an effect.
    Down,
    /// The first `calls` calls of each key are answered 429 with a `Retry-After`
    /// of `retry_after_ms` (no effect), then it is served.
    Throttled {
        /// Calls answered 429 before the key is served.
        calls: u32,
        /// The `Retry-After` the target asks for.
        retry_after_ms: u64,
    },
}

impl TargetMode {
    /// The mode a step's payload asks for: `"down": true`, `"flaky_calls": N`, or
    /// `"throttle_calls": N` with `"retry_after_ms": M`; healthy otherwise.
    pub fn of(payload: &Value) -> Self {
        let count = |k: &str| {
            payload
                .get(k)
                .and_then(Value::as_u64)
                .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
        };
        if payload.get("down").and_then(Value::as_bool) == Some(true) {
            TargetMode::Down
        } else if let Some(calls) = count("flaky_calls") {
            TargetMode::Flaky { calls }
        } else if let Some(calls) = count("throttle_calls") {
            let retry_after_ms = payload.get("retry_after_ms").and_then(Value::as_u64).unwrap_or(0);
            TargetMode::Throttled { calls, retry_after_ms }
        } else {
            TargetMode::Healthy
        }
    }
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
    /// How the target treats the step's calls.
    pub mode: TargetMode,
    /// Simulated time when the executor sent it.
    pub sent_ms: u64,
    /// The step's trace context, as an `http:v1` request's `traceparent` carries it.
    pub traceparent: Option<TraceContext>,
}

/// What the target answered an applied (or recognised) key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetReply {
    /// The target receipt: the same for every delivery of a key.
    pub target_receipt: Value,
    /// Step codes applied, in order, in the sandbox (replay) or for the attempt
    /// (durable), as of the key's first application.
    pub applied: Vec<String>,
}

/// The target's answer to one call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum TargetAnswer {
    /// The key was applied (now or before): its reply.
    Served(TargetReply),
    /// 503: not applied; call again later.
    Unavailable,
    /// 429: not applied; call again no sooner than `retry_after_ms`.
    Throttled {
        /// The `Retry-After` asked for.
        retry_after_ms: u64,
    },
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
        let text = serde_json::to_string(&WireError::of(&LedgerError::Refused(r.clone()))).unwrap();
        let back = serde_json::from_str::<WireError>(&text).unwrap().into_error();
        assert_eq!(back, LedgerError::Refused(r));
    }
}
