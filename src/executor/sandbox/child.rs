//! The isolated mode's process boundary: a sandbox child process and the worker's
//! handle on it.
//!
//! The child is a program started with [`CHILD_ARG`] as its first argument (the
//! `leasehold` binary itself, or an embedder's program that calls
//! [`child_main_if_requested`] first thing in `main`). It opens one sandbox with
//! SQLite's process-wide hard heap limit set to [`MEMORY_BUDGET_BYTES`], says so on
//! stdout, then answers each step request line on stdin with one answer line on
//! stdout, running the step with the same code as the in-process mode. When its
//! stdin closes (the worker released the sandbox, or died) the running SQL is
//! interrupted and the child exits. Its environment is empty: it needs nothing from
//! the worker's.
//!
//! The worker side kills and reaps the child whenever its handle is dropped: on
//! release, when a step's future is dropped mid-step, or when the child misbehaves.

use super::database::{Sandbox, StepRequest};
use super::MEMORY_BUDGET_BYTES;
use crate::executor::ExecutorResult;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, OnceLock};

/// The first argument that makes a program run as a sandbox child
/// ([`child_main_if_requested`]).
pub const CHILD_ARG: &str = "__sqlite-sandbox-child";

/// The longest answer line read from a child: evidence is capped far below this, so
/// a longer line means the child misbehaves.
const MAX_ANSWER_BYTES: u64 = 8 * 1024 * 1024;

/// The child's first line: whether its sandbox opened.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Hello {
    Ready,
    Failed(String),
}

/// A step's answer on the wire.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Answer {
    Done { evidence: Value, target_receipt: Value },
    Permanent(String),
    Transient(String),
    Throttled { error: String, retry_after_ms: u64 },
}

impl From<ExecutorResult> for Answer {
    fn from(result: ExecutorResult) -> Self {
        match result {
            ExecutorResult::Done {
                evidence,
                target_receipt,
            } => Self::Done {
                evidence,
                target_receipt,
            },
            ExecutorResult::Permanent(message) => Self::Permanent(message),
            ExecutorResult::Transient(message) => Self::Transient(message),
            ExecutorResult::Throttled { error, retry_after_ms } => Self::Throttled { error, retry_after_ms },
        }
    }
}

impl From<Answer> for ExecutorResult {
    fn from(answer: Answer) -> Self {
        match answer {
            Answer::Done {
                evidence,
                target_receipt,
            } => Self::Done {
                evidence,
                target_receipt,
            },
            Answer::Permanent(message) => Self::Permanent(message),
            Answer::Transient(message) => Self::Transient(message),
            Answer::Throttled { error, retry_after_ms } => Self::Throttled { error, retry_after_ms },
        }
    }
}

/// Runs this process as a sandbox child if its first argument is [`CHILD_ARG`],
/// answering its exit code; otherwise `None`. A program passed to
/// [`super::SqliteSandbox::isolated`] calls this first thing in `main`:
/// `if let Some(code) = child_main_if_requested() { return code; }`.
pub fn child_main_if_requested() -> Option<ExitCode> {
    (std::env::args_os().nth(1)? == CHILD_ARG).then(child_main)
}

/// Runs this process as a sandbox child until its stdin closes (see the module
/// docs). SQLite's heap in this whole process is limited to [`MEMORY_BUDGET_BYTES`],
/// so the process must hold nothing but this one sandbox.
pub fn child_main() -> ExitCode {
    let gone = Arc::new(AtomicBool::new(false));
    let requests = read_requests(Arc::clone(&gone));
    let mut out = io::stdout().lock();
    let mut sandbox = match Sandbox::open(Some(MEMORY_BUDGET_BYTES)) {
        Ok(sandbox) => sandbox,
        Err(message) => {
            let _ = write_line(&mut out, &Hello::Failed(message));
            return ExitCode::FAILURE;
        }
    };
    if write_line(&mut out, &Hello::Ready).is_err() {
        return ExitCode::FAILURE;
    }
    for line in requests {
        let answer = match serde_json::from_str::<StepRequest>(&line) {
            Ok(request) => sandbox.step(&request, &gone),
            Err(e) => ExecutorResult::Permanent(format!("the sandbox could not read a step request: {e}")),
        };
        if write_line(&mut out, &Answer::from(answer)).is_err() {
            break;
        }
    }
    ExitCode::SUCCESS
}

/// Reads request lines from stdin on a thread of their own, so that stdin closing
/// sets `gone` (which interrupts a running step) even while a step runs.
fn read_requests(gone: Arc<AtomicBool>) -> Receiver<String> {
    let (sender, receiver) = mpsc::channel();
    // Should the thread not start, the sender is dropped with it: no requests.
    let _ = std::thread::Builder::new()
        .name("sandbox-requests".into())
        .spawn(move || {
            for line in io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
            gone.store(true, Ordering::Relaxed);
        });
    receiver
}

fn write_line(out: &mut impl Write, value: &impl Serialize) -> io::Result<()> {
    let mut line = serde_json::to_vec(value).map_err(io::Error::other)?;
    line.push(b'\n');
    out.write_all(&line)?;
    out.flush()
}

/// A started sandbox child: its process and its pipes.
pub(super) struct ChildSandbox {
    pub(super) process: ChildProcess,
    pub(super) pipes: Pipes,
}

impl ChildSandbox {
    /// Starts `program` as a sandbox child and waits until its sandbox is open.
    /// Blocking: called on the blocking pool.
    pub(super) fn start(program: &Path) -> Result<Self, String> {
        let mut child = Command::new(program)
            .arg(CHILD_ARG)
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("could not start {}: {e}", program.display()))?;
        let (stdin, stdout) = (child.stdin.take(), child.stdout.take());
        let process = ChildProcess {
            pid: child.id(),
            child: Some(child),
        };
        let (Some(stdin), Some(stdout)) = (stdin, stdout) else {
            return Err(format!("{} was started without its pipes", program.display()));
        };
        let mut pipes = Pipes {
            stdin,
            stdout: BufReader::new(stdout),
        };
        match pipes.read::<Hello>() {
            Ok(Hello::Ready) => Ok(Self { process, pipes }),
            Ok(Hello::Failed(message)) => Err(message),
            Err(e) => Err(format!("{} did not open a sandbox: {e}", program.display())),
        }
    }
}

/// The child's stdin and stdout.
pub(super) struct Pipes {
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Pipes {
    /// Sends a step and reads its answer. Blocking: called on the blocking pool. An
    /// error means the child is of no further use.
    pub(super) fn exchange(&mut self, request: &StepRequest) -> Result<ExecutorResult, String> {
        write_line(&mut self.stdin, request).map_err(|e| format!("it could not be sent the step ({e})"))?;
        self.read::<Answer>().map(ExecutorResult::from)
    }

    fn read<T: DeserializeOwned>(&mut self) -> Result<T, String> {
        let mut line = String::new();
        let read = (&mut self.stdout)
            .take(MAX_ANSWER_BYTES)
            .read_line(&mut line)
            .map_err(|e| format!("its answer could not be read ({e})"))?;
        if read == 0 {
            return Err("it ended without answering".into());
        }
        if !line.ends_with('\n') {
            return Err(format!("its answer exceeds {MAX_ANSWER_BYTES} bytes"));
        }
        serde_json::from_str(&line).map_err(|e| format!("its answer is unreadable ({e})"))
    }
}

/// A child's process, killed and reaped when dropped.
pub(super) struct ChildProcess {
    pid: u32,
    child: Option<Child>,
}

impl ChildProcess {
    /// The child's process id.
    pub(super) fn pid(&self) -> u32 {
        self.pid
    }

    /// Kills the child if it still runs and waits for it: how it ended, in words.
    /// Blocking: called on the blocking pool.
    pub(super) fn end(mut self) -> String {
        let Some(mut child) = self.child.take() else {
            return "it had already ended".into();
        };
        let _ = child.kill();
        match child.wait() {
            Ok(status) => format!("it ended with {status}"),
            Err(e) => format!("its end could not be awaited: {e}"),
        }
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            reap(child);
        }
    }
}

/// Kills `child` and has it waited for on the reaper thread, so that no ended child
/// stays a zombie and nobody async blocks on it.
fn reap(mut child: Child) {
    static REAPER: OnceLock<Sender<Child>> = OnceLock::new();
    let _ = child.kill();
    let reaper = REAPER.get_or_init(|| {
        let (sender, receiver) = mpsc::channel::<Child>();
        // Should the thread not start, the receiver is dropped with it and sending
        // fails: the child is then waited for here.
        let _ = std::thread::Builder::new()
            .name("sandbox-reaper".into())
            .spawn(move || {
                for mut child in receiver {
                    let _ = child.wait();
                }
            });
        sender
    });
    if let Err(mpsc::SendError(mut child)) = reaper.send(child) {
        let _ = child.wait();
    }
}
