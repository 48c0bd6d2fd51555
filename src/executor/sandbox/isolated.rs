//! The isolated mode's bookkeeping in the worker: which child holds which delivery's
//! sandbox, starting one on a delivery's first step, and losing it for good when a
//! step is stopped mid-way or the child dies.

use super::child::{ChildProcess, ChildSandbox, Pipes};
use super::database::StepRequest;
use super::{Held, Key, SqliteSandbox};
use crate::executor::ExecutorResult;
use std::path::Path;

/// Why a delivery's sandbox is gone when one of its steps was stopped mid-way.
const STOPPED: &str = "an earlier step was stopped before it finished (its time budget ran out or the worker \
                       shut down), and its sandbox process with it";

impl SqliteSandbox {
    /// Runs a step in its delivery's sandbox child. Dropping the returned future
    /// kills the child: the delivery's sandbox is then lost.
    pub(super) async fn run_isolated(&self, program: &Path, key: Key, request: StepRequest) -> ExecutorResult {
        let code = request.code.clone();
        let mut claim = Claim {
            sandbox: self,
            key,
            process: None,
            settled: false,
        };
        let mut pipes = match claim.check_out(program, &code).await {
            Ok(pipes) => pipes,
            Err(refused) => return refused,
        };
        let exchanged = tokio::task::spawn_blocking(move || {
            let answer = pipes.exchange(&request);
            (pipes, answer)
        })
        .await;
        match exchanged {
            Ok((pipes, Ok(answer))) => {
                claim.check_in(pipes);
                answer
            }
            Ok((_, Err(why))) => claim.lose(&code, why).await,
            Err(e) => claim.lose(&code, format!("waiting for it failed ({e})")).await,
        }
    }
}

/// A step's hold on its delivery's child. Dropped unsettled — the step's future was
/// dropped — it kills the child and marks the sandbox lost (or, while the child was
/// still starting, forgets the delivery so that a retry starts one).
struct Claim<'a> {
    sandbox: &'a SqliteSandbox,
    key: Key,
    process: Option<ChildProcess>,
    settled: bool,
}

impl Claim<'_> {
    /// Takes the delivery's idle child, or starts one for its first step. A lost or
    /// busy sandbox, or a child that cannot start, refuses the step.
    async fn check_out(&mut self, program: &Path, code: &str) -> Result<Pipes, ExecutorResult> {
        let idle = {
            let mut children = self.sandbox.lock_children();
            match children.remove(&self.key) {
                Some(Held::Idle(child)) => {
                    children.insert(self.key.clone(), Held::Busy(Some(child.process.pid())));
                    Some(child)
                }
                Some(other) => {
                    let refused = refusal(&other, code);
                    children.insert(self.key.clone(), other);
                    self.settled = true;
                    return Err(refused);
                }
                None => {
                    children.insert(self.key.clone(), Held::Busy(None));
                    None
                }
            }
        };
        let child = match idle {
            Some(child) => child,
            None => {
                let program = program.to_owned();
                let child = match tokio::task::spawn_blocking(move || ChildSandbox::start(&program)).await {
                    Ok(Ok(child)) => child,
                    Ok(Err(why)) => return Err(not_started(code, why)),
                    Err(e) => return Err(not_started(code, e.to_string())),
                };
                self.set(Held::Busy(Some(child.process.pid())));
                child
            }
        };
        let ChildSandbox { process, pipes } = child;
        self.process = Some(process);
        Ok(pipes)
    }

    /// The step answered: the child waits for the delivery's next step.
    fn check_in(mut self, pipes: Pipes) {
        if let Some(process) = self.process.take() {
            self.set(Held::Idle(ChildSandbox { process, pipes }));
        }
        self.settled = true;
    }

    /// The child failed to answer: it is ended, and the sandbox lost.
    async fn lose(mut self, code: &str, why: String) -> ExecutorResult {
        let ended = match self.process.take() {
            Some(process) => tokio::task::spawn_blocking(move || process.end())
                .await
                .unwrap_or_else(|e| format!("its end could not be awaited: {e}")),
            None => String::new(),
        };
        self.set(Held::Lost(format!(
            "its sandbox process failed during an earlier step: {why}; {ended}"
        )));
        self.settled = true;
        ExecutorResult::Permanent(format!(
            "step {code}: the sandbox process failed: {why}; {ended}; this delivery's sandbox is lost"
        ))
    }

    /// Records where the sandbox is, unless the delivery was released meanwhile
    /// (a child given back then is dropped: killed and reaped).
    fn set(&self, held: Held) {
        let mut children = self.sandbox.lock_children();
        if let Some(slot) = children.get_mut(&self.key) {
            *slot = held;
        }
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        match self.process.take() {
            Some(process) => {
                self.set(Held::Lost(STOPPED.to_owned()));
                drop(process);
            }
            None => {
                self.sandbox.lock_children().remove(&self.key);
            }
        }
    }
}

/// Why a step cannot run in a sandbox that is not idle.
fn refusal(held: &Held, code: &str) -> ExecutorResult {
    match held {
        Held::Lost(reason) => ExecutorResult::Permanent(format!(
            "step {code}: this delivery's sandbox is gone: {reason}; a delivery never continues on a new, empty \
             sandbox"
        )),
        _ => ExecutorResult::Transient(format!(
            "step {code}: another step of this delivery is still running in its sandbox"
        )),
    }
}

/// A sandbox child could not start: transient, and the next try starts another.
fn not_started(code: &str, why: String) -> ExecutorResult {
    ExecutorResult::Transient(format!("step {code}: could not open a sandbox: {why}"))
}
