//! Executors: what runs a step, selected by the step's `executor` string.
//!
//! An executor is called by the worker outside every transaction, with the step's
//! idempotency key. It answers an [`ExecutorResult`]: evidence and a target receipt,
//! a permanent failure (the attempt fails), or a transient one (retried with the
//! same key, and after a takeover redelivered with the same key).
//!
//! Contract shared by every executor here:
//! - the same idempotency key always gets the same target receipt;
//! - evidence is derived only from the step, its payload and the target's state, so
//!   two deliveries that do the same work record the same semantic evidence;
//! - waiting uses `tokio::time` only, so an executor runs under a simulated clock;
//!   CPU-bound work (the sandbox's SQL) runs on tokio's blocking pool, never on an
//!   async thread, and stops soon after its future is dropped, so heartbeats, other
//!   deliveries and shutdown never wait for it (the simulator uses only executors
//!   that do not block);
//! - an executor does not time itself: the worker gives every step a time budget
//!   (`step_timeout`) and drops the call when it runs out;
//! - a malformed payload is a permanent failure whose message names the field.
//!
//! [`Executors`] is the registry that the worker uses: it dispatches on
//! `request.step.executor` to a built-in — [`DryRun`] (`dry-run:v1`),
//! [`SqliteSandbox`] (`sqlite-sandbox:v1`), [`Http`] (`http:v1`) — or to an executor
//! the program registered by name ([`Executors::builder`]); [`Executors::names`] is
//! what plan validation accepts.

pub mod dry_run;
pub mod http;
pub mod sandbox;

pub use dry_run::DryRun;
pub use http::{Http, HttpConfig};
pub use sandbox::SqliteSandbox;

use leasehold_engine::{Action, AttemptId, CommandId, PlanId, Reach, Step};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

pub use leasehold_engine::driver::ExecutorResult;

/// One call of an executor for one step of one delivery.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecRequest {
    /// The plan.
    pub plan_id: PlanId,
    /// The attempt.
    pub attempt_id: AttemptId,
    /// The command.
    pub command_id: CommandId,
    /// The command's delivery count for this claim (1 on the first claim).
    pub delivery: u32,
    /// execute, retry or compensate.
    pub action: Action,
    /// The receipt's ordinal.
    pub ordinal: u32,
    /// The plan step.
    pub step: Step,
    /// Stable for (attempt, step) across deliveries.
    pub idempotency_key: String,
    /// The trace context of this call's span ([`crate::trace`]): `http:v1` sends it
    /// as the request's `traceparent`.
    pub traceparent: Option<leasehold_engine::TraceContext>,
}

/// Runs steps.
pub trait Executor: Send + Sync + 'static {
    /// Runs one step.
    fn execute(&self, request: ExecRequest) -> impl Future<Output = ExecutorResult> + Send;

    /// A delivery of `attempt` ended (any outcome): free what it held.
    fn release(&self, attempt: &AttemptId, delivery: u32) {
        let _ = (attempt, delivery);
    }

    /// What it runs: each executor name with the targets it reaches
    /// ([`leasehold_engine::route`]), so that a worker claims only steps it can run.
    /// `None` (the default): it does not say, and its worker claims anything.
    fn reach(&self) -> Option<BTreeMap<String, Reach>> {
        None
    }
}

/// A boxed executor future.
pub type BoxedResult<'a> = Pin<Box<dyn Future<Output = ExecutorResult> + Send + 'a>>;

/// The object-safe form of [`Executor`], implemented for every executor, so that
/// executors of different types can sit in one [`Executors`] registry.
pub trait DynExecutor: Send + Sync + 'static {
    /// Runs one step (see [`Executor::execute`]).
    fn execute_boxed(&self, request: ExecRequest) -> BoxedResult<'_>;

    /// See [`Executor::release`].
    fn release_dyn(&self, attempt: &AttemptId, delivery: u32);
}

impl<E: Executor> DynExecutor for E {
    fn execute_boxed(&self, request: ExecRequest) -> BoxedResult<'_> {
        Box::pin(self.execute(request))
    }

    fn release_dyn(&self, attempt: &AttemptId, delivery: u32) {
        self.release(attempt, delivery);
    }
}

/// Why an [`ExecutorsBuilder`] refused a registration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// The name is empty, too long, or has whitespace or a character no name may
    /// hold ([`leasehold_engine::names`]: control, invisible, separator).
    #[error("executor name {0:?} is invalid (1 to 64 printable characters, no spaces)")]
    InvalidName(String),
    /// The name is already taken (by a built-in or an earlier registration).
    #[error("executor name {0:?} is already registered")]
    Duplicate(String),
}

/// The registry the worker uses: dispatches on `request.step.executor` to a
/// built-in — [`DryRun`] (`dry-run:v1`), [`SqliteSandbox`] (`sqlite-sandbox:v1`),
/// [`Http`] (`http:v1`, calling only the hosts its allowlist names) — or to an
/// executor the program registered with [`Executors::builder`]. Plan validation
/// accepts exactly [`Executors::names`].
pub struct Executors {
    dry_run: DryRun,
    sandbox: SqliteSandbox,
    http: Http,
    /// Registered by the program, by name (ordered: nothing iterates a hash map).
    custom: BTreeMap<String, Arc<dyn DynExecutor>>,
}

impl fmt::Debug for Executors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Executors")
            .field("names", &self.names())
            .finish_non_exhaustive()
    }
}

impl Default for Executors {
    fn default() -> Self {
        Self::new()
    }
}

impl Executors {
    /// The built-in executors only; `http:v1` with an empty allowlist (every call
    /// refused until hosts are allowed through [`ExecutorsBuilder::http`]), and
    /// `sqlite-sandbox:v1` in-process, without a memory bound per sandbox (the
    /// `leasehold` binary sets [`SqliteSandbox::isolated`] through
    /// [`ExecutorsBuilder::sandbox`]).
    pub fn new() -> Self {
        Self {
            dry_run: DryRun,
            sandbox: SqliteSandbox::default(),
            http: Http::new(HttpConfig::default()),
            custom: BTreeMap::new(),
        }
    }

    /// A builder: the built-ins plus executors the program registers by name.
    pub fn builder() -> ExecutorsBuilder {
        ExecutorsBuilder {
            sandbox: None,
            http: HttpConfig::default(),
            custom: BTreeMap::new(),
            error: None,
        }
    }

    /// Every executor name this registry runs (the built-ins, then the registered
    /// ones in name order): what plan validation accepts.
    pub fn names(&self) -> Vec<&str> {
        let mut names = vec![dry_run::NAME, sandbox::NAME, http::NAME];
        names.extend(self.custom.keys().map(String::as_str));
        names
    }

    /// The `dry-run:v1` executor.
    pub fn dry_run(&self) -> &DryRun {
        &self.dry_run
    }

    /// The `sqlite-sandbox:v1` executor.
    pub fn sandbox(&self) -> &SqliteSandbox {
        &self.sandbox
    }

    /// The `http:v1` executor.
    pub fn http(&self) -> &Http {
        &self.http
    }
}

/// Builds an [`Executors`] registry: `Executors::builder().register("acme-crm:v1",
/// MyExecutor).build()?`.
pub struct ExecutorsBuilder {
    /// The `sqlite-sandbox:v1` executor, if not the in-process default.
    sandbox: Option<SqliteSandbox>,
    http: HttpConfig,
    custom: BTreeMap<String, Arc<dyn DynExecutor>>,
    /// The first refused registration, reported by [`ExecutorsBuilder::build`].
    error: Option<RegistryError>,
}

impl fmt::Debug for ExecutorsBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecutorsBuilder")
            .field("custom", &self.custom.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl ExecutorsBuilder {
    /// Registers `executor` under `name` (for example `acme-crm:v1`). A name that is
    /// malformed or already taken makes [`ExecutorsBuilder::build`] fail.
    pub fn register(mut self, name: impl Into<String>, executor: impl Executor) -> Self {
        let name = name.into();
        let valid = !name.is_empty()
            && name.chars().count() <= 64
            && !name.chars().any(char::is_whitespace)
            && leasehold_engine::names::first_forbidden(&name).is_none();
        let taken =
            [dry_run::NAME, sandbox::NAME, http::NAME].contains(&name.as_str()) || self.custom.contains_key(&name);
        if self.error.is_none() {
            if !valid {
                self.error = Some(RegistryError::InvalidName(name));
                return self;
            }
            if taken {
                self.error = Some(RegistryError::Duplicate(name));
                return self;
            }
        }
        self.custom.insert(name, Arc::new(executor));
        self
    }

    /// Sets the built-in `sqlite-sandbox:v1` executor, for example
    /// [`SqliteSandbox::isolated`] (the default is [`SqliteSandbox::new`], in-process).
    pub fn sandbox(mut self, sandbox: SqliteSandbox) -> Self {
        self.sandbox = Some(sandbox);
        self
    }

    /// Configures the built-in `http:v1` executor (its egress allowlist and limits).
    pub fn http(mut self, config: HttpConfig) -> Self {
        self.http = config;
        self
    }

    /// The registry, or the first registration that was refused.
    pub fn build(self) -> Result<Executors, RegistryError> {
        if let Some(error) = self.error {
            return Err(error);
        }
        Ok(Executors {
            sandbox: self.sandbox.unwrap_or_default(),
            http: Http::new(self.http),
            custom: self.custom,
            ..Executors::new()
        })
    }
}

impl Executor for Executors {
    async fn execute(&self, request: ExecRequest) -> ExecutorResult {
        match request.step.executor.as_str() {
            dry_run::NAME => self.dry_run.execute(request).await,
            // Boxed: the sandbox's future is large, and inline it would make every
            // dry-run call's future as large (an allocation glibc serves slowly).
            sandbox::NAME => Box::pin(self.sandbox.execute(request)).await,
            http::NAME => Box::pin(self.http.execute(request)).await,
            other => match self.custom.get(other) {
                Some(executor) => executor.execute_boxed(request).await,
                None => ExecutorResult::Permanent(format!(
                    "step {}: unknown executor {other:?} (known: {})",
                    request.step.code,
                    self.names().join(", ")
                )),
            },
        }
    }

    /// The built-ins and the registered executors, each for any target but
    /// `http:v1`, which reaches only the hosts its allowlist names.
    fn reach(&self) -> Option<BTreeMap<String, Reach>> {
        let mut reach: BTreeMap<String, Reach> = self.names().into_iter().map(|n| (n.to_owned(), Reach::Any)).collect();
        reach.insert(http::NAME.to_owned(), Reach::Only(self.http.config().targets()));
        Some(reach)
    }

    fn release(&self, attempt: &AttemptId, delivery: u32) {
        self.dry_run.release(attempt, delivery);
        self.sandbox.release(attempt, delivery);
        self.http.release(attempt, delivery);
        for executor in self.custom.values() {
            executor.release_dyn(attempt, delivery);
        }
    }
}

/// Reads the optional `delay_ms` payload field: a non-negative whole number of
/// milliseconds. A float with no fractional part is accepted because canonical JSON
/// (and so the plan fingerprint) treats `300.0` and `300` as the same value.
pub(crate) fn payload_delay_ms(step: &Step) -> Result<Option<u64>, String> {
    let Some(value) = step.payload.get("delay_ms") else {
        return Ok(None);
    };
    let whole = value.as_u64().or_else(|| {
        value
            .as_f64()
            .filter(|f| f.is_finite() && *f >= 0.0 && f.fract() == 0.0 && *f <= u64::MAX as f64)
            .map(|f| f as u64)
    });
    match whole {
        Some(ms) => Ok(Some(ms)),
        None => Err(format!(
            "step {}: payload field delay_ms must be a non-negative whole number of milliseconds, not {}",
            step.code,
            describe(value)
        )),
    }
}

/// Sleeps for the step's `delay_ms`, on the tokio clock so that a paused or
/// simulated clock governs it.
pub(crate) async fn pace(delay_ms: Option<u64>) {
    if let Some(ms) = delay_ms.filter(|ms| *ms > 0) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

/// A short description of a JSON value for error messages: its type and its text.
pub(crate) fn describe(value: &Value) -> String {
    let kind = match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    };
    let text = value.to_string();
    if text.chars().count() > 60 {
        format!("{kind} ({}…)", text.chars().take(60).collect::<String>())
    } else {
        format!("{kind} ({text})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn request(executor: &str, code: &str, payload: Value) -> ExecRequest {
        ExecRequest {
            plan_id: PlanId::new("plan-1"),
            attempt_id: AttemptId::new("att-1"),
            command_id: CommandId::new("cmd-1"),
            delivery: 1,
            action: Action::Execute,
            ordinal: 1,
            step: Step {
                code: code.into(),
                executor: executor.into(),
                target: None,
                payload,
                retry: None,
            },
            traceparent: None,
            idempotency_key: format!("ik-{code}"),
        }
    }

    #[tokio::test]
    async fn registry_dispatches_on_the_step_executor() {
        let executors = Executors::new();
        let dry = executors.execute(request("dry-run:v1", "a", json!({}))).await;
        assert!(matches!(dry, ExecutorResult::Done { ref evidence, .. } if evidence["executor"] == "dry-run:v1"));
        let sbx = executors
            .execute(request("sqlite-sandbox:v1", "b", json!({"sql": [], "checks": []})))
            .await;
        assert!(
            matches!(sbx, ExecutorResult::Done { ref evidence, .. } if evidence["sandbox_id"] == "sbx-att-1-d1"),
            "{sbx:?}"
        );
        assert_eq!(executors.sandbox().open_sandboxes().len(), 1);
        executors.release(&AttemptId::new("att-1"), 1);
        assert!(executors.sandbox().open_sandboxes().is_empty());
    }

    #[tokio::test]
    async fn registry_refuses_an_unknown_executor_permanently() {
        let result = Executors::new().execute(request("nope:v9", "a", json!({}))).await;
        assert_eq!(
            result,
            ExecutorResult::Permanent(
                "step a: unknown executor \"nope:v9\" (known: dry-run:v1, sqlite-sandbox:v1, http:v1)".into()
            )
        );
    }

    #[test]
    fn names_are_the_built_ins_then_the_registered_ones() {
        assert_eq!(Executors::new().names(), ["dry-run:v1", "sqlite-sandbox:v1", "http:v1"]);
        let executors = Executors::builder()
            .register("zeta:v1", DryRun)
            .register("acme-crm:v1", DryRun)
            .build()
            .unwrap();
        assert_eq!(
            executors.names(),
            ["dry-run:v1", "sqlite-sandbox:v1", "http:v1", "acme-crm:v1", "zeta:v1"]
        );
    }

    /// A program's own executor: answers with the key it was given.
    struct Echo;

    impl Executor for Echo {
        async fn execute(&self, request: ExecRequest) -> ExecutorResult {
            ExecutorResult::Done {
                evidence: json!({"echo": request.step.payload}),
                target_receipt: json!({"key": request.idempotency_key}),
            }
        }
    }

    #[tokio::test]
    async fn a_registered_executor_runs_under_its_name() {
        let executors = Executors::builder().register("acme-crm:v1", Echo).build().unwrap();
        let result = executors.execute(request("acme-crm:v1", "push", json!({"n": 1}))).await;
        assert_eq!(
            result,
            ExecutorResult::Done {
                evidence: json!({"echo": {"n": 1}}),
                target_receipt: json!({"key": "ik-push"}),
            }
        );
        // The built-ins stay available next to it.
        let dry = executors.execute(request("dry-run:v1", "a", json!({}))).await;
        assert!(matches!(dry, ExecutorResult::Done { .. }));
    }

    #[test]
    fn a_taken_or_malformed_name_is_refused() {
        let err = Executors::builder().register("dry-run:v1", Echo).build().unwrap_err();
        assert_eq!(err, RegistryError::Duplicate("dry-run:v1".into()));
        let err = Executors::builder()
            .register("a:v1", Echo)
            .register("a:v1", DryRun)
            .build()
            .unwrap_err();
        assert_eq!(err, RegistryError::Duplicate("a:v1".into()));
        for bad in [
            "",
            "has space",
            "ctl\u{7}",
            "acme\u{200b}-crm:v1",
            "nb\u{a0}sp:v1",
            "bom\u{feff}:v1",
        ] {
            let err = Executors::builder().register(bad, Echo).build().unwrap_err();
            assert_eq!(err, RegistryError::InvalidName(bad.into()));
        }
    }

    #[test]
    fn plan_validation_accepts_registered_names_only() {
        let spec = |executor: &str| leasehold_engine::PlanSpec {
            input: None,
            on_failure: None,
            name: "p".into(),
            queue: None,
            recovery: "resume".into(),
            volatile_fields: Vec::new(),
            steps: vec![Step {
                code: "s".into(),
                executor: executor.into(),
                target: None,
                payload: json!({}),
                retry: None,
            }],
            retry: None,
        };
        let now = leasehold_engine::Timestamp::from_millis(0);
        let executors = Executors::builder().register("acme-crm:v1", Echo).build().unwrap();
        assert!(spec("acme-crm:v1")
            .into_plan(&executors.names(), PlanId::new("p"), now)
            .is_ok());
        assert!(spec("acme-crm:v1")
            .into_plan(&Executors::new().names(), PlanId::new("p"), now)
            .is_err());
    }

    #[test]
    fn delay_accepts_whole_numbers_and_names_the_field_otherwise() {
        let step = |payload| request("dry-run:v1", "s", payload).step;
        assert_eq!(payload_delay_ms(&step(json!({}))), Ok(None));
        assert_eq!(payload_delay_ms(&step(json!({"delay_ms": 5}))), Ok(Some(5)));
        assert_eq!(payload_delay_ms(&step(json!({"delay_ms": 5.0}))), Ok(Some(5)));
        for bad in [json!("5"), json!(-1), json!(1.5), json!(null)] {
            let err = payload_delay_ms(&step(json!({"delay_ms": bad}))).unwrap_err();
            assert!(err.starts_with("step s: payload field delay_ms must be"), "{err}");
        }
    }
}
