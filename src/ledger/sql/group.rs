//! Group writes: the requests of a ledger's lease holders, several callers' in one
//! transaction, as SQLite's writer groups its calls.
//!
//! A caller's request ([`Ledger::worker`], or [`Ledger::worker_then_claim`] with the
//! claim fused with it) joins a queue shared by the ledger and its clones. While
//! fewer than [`RUNNERS`] groups are being written, the caller starts a runner, a
//! task that takes up to [`GROUP_MAX`] queued requests at a time and writes them
//! until the queue is empty; otherwise the request waits for a runner to take it.
//! So an idle ledger writes each request at once, alone, and a busy one writes
//! groups that grow with the load.
//!
//! A group is one transaction: the requests' records are locked together, in
//! attempt order (so that two groups lock their records in one order), and each
//! request is decided and writes as it would alone ([`SqlLedger::worker_on`]); then
//! one claim for all the fused claims
//! that share their capabilities ([`SqlBackend::claim_many_in`]); then one commit.
//! Every request is still fenced on its own: its record is locked and decided with
//! its own token. A request that gets a final answer of its own (a refusal, not
//! found) undoes the group: it is written alone, for its own answer, and the others
//! are grouped again; nothing of one request rides on another's. A refused claim
//! (damaged rows) undoes the group too, and its requests are written one by one. A
//! conflict tries the whole group again; a commit whose outcome is unknown is
//! ambiguous for every request in it.

use super::ledger::{end, SqlBackend, SqlLedger, TxKind};
use super::session;
use super::TxError;
use crate::ledger::{Claimed, LedgerError};
use leasehold_engine::{AttemptId, Capabilities, ClaimRequest, Lease, Reply, WorkerRequest};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use tokio::sync::oneshot;

/// The most groups of one ledger (and its clones) written at once.
pub(crate) const RUNNERS: usize = 2;
/// The most requests in one group.
pub(crate) const GROUP_MAX: usize = 32;

/// What a request gets: its reply and what the claim fused with it claimed.
type Answer = Result<(Reply, Vec<Claimed>), LedgerError>;

/// A queued request.
struct Job {
    lease: Lease,
    request: WorkerRequest,
    claim: Option<ClaimRequest>,
    answer: oneshot::Sender<Answer>,
}

/// The queue of a ledger's group writes, and its counters.
#[derive(Default)]
pub(crate) struct Groups {
    queue: Mutex<Queue>,
    /// Groups of more than one request committed.
    pub(crate) grouped: AtomicU64,
    /// Requests in those groups.
    pub(crate) grouped_requests: AtomicU64,
    /// Groups undone: for a request with an answer of its own (that request then
    /// written alone, the rest grouped again), or for a refused claim (every
    /// request then written alone).
    pub(crate) split: AtomicU64,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    runners: usize,
}

impl Groups {
    /// Queues `job`; answers whether the caller starts a runner.
    fn push(&self, job: Job) -> bool {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        q.jobs.push_back(job);
        let start = q.runners < RUNNERS;
        if start {
            q.runners += 1;
        }
        start
    }

    /// Up to [`GROUP_MAX`] queued jobs; `None` (and one runner fewer) when none is
    /// left.
    fn take(&self) -> Option<Vec<Job>> {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.jobs.is_empty() {
            q.runners -= 1;
            return None;
        }
        let n = q.jobs.len().min(GROUP_MAX);
        Some(q.jobs.drain(..n).collect())
    }
}

/// A runner's place among [`RUNNERS`], given back if it ends without emptying the
/// queue (a panic), so that the next request starts another.
struct Running<'a>(&'a Groups, bool);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if !self.1 {
            let mut q = self.0.queue.lock().unwrap_or_else(|e| e.into_inner());
            q.runners -= 1;
        }
    }
}

// The bound names the crate's own backends: this block is the crate's, not the
// embedder's.
#[allow(private_bounds)]
impl<B: SqlBackend> SqlLedger<B> {
    /// Writes a lease holder's request, and the claim fused with it, in a group.
    pub(crate) async fn grouped(&self, lease: &Lease, request: WorkerRequest, claim: Option<ClaimRequest>) -> Answer {
        let (answer, answered) = oneshot::channel();
        let job = Job {
            lease: lease.clone(),
            request,
            claim,
            answer,
        };
        if self.ctx.groups.push(job) {
            let runner = self.clone();
            tokio::spawn(async move { runner.run_groups().await });
        }
        answered.await.unwrap_or_else(|_| {
            Err(LedgerError::Ambiguous(
                "the group writing this request ended without an answer".into(),
            ))
        })
    }

    /// A runner: writes groups until the queue is empty.
    async fn run_groups(self) {
        let groups = &self.ctx.groups;
        let mut running = Running(groups, false);
        loop {
            let Some(mut jobs) = groups.take() else {
                running.1 = true;
                return;
            };
            jobs.sort_by(|a, b| a.lease.attempt_id.cmp(&b.lease.attempt_id));
            let answers = self.write_group(&jobs).await;
            for (job, answer) in jobs.into_iter().zip(answers) {
                // A caller that stopped waiting has nobody to tell.
                let _ = job.answer.send(answer);
            }
        }
    }

    /// The answers of `jobs`, in order: one transaction for all of them where it
    /// can. A request with an answer of its own is taken out and written alone, and
    /// the others are grouped again; after a refused claim, each is written alone.
    async fn write_group(&self, jobs: &[Job]) -> Vec<Answer> {
        let mut answers: Vec<Option<Answer>> = jobs.iter().map(|_| None).collect();
        let mut pending: Vec<usize> = (0..jobs.len()).collect();
        while pending.len() > 1 {
            let group: Vec<&Job> = pending.iter().map(|&i| &jobs[i]).collect();
            match self.retry(|| self.group_once(&group)).await {
                Ok(Outcome::Committed(committed)) => {
                    let g = &self.ctx.groups;
                    g.grouped.fetch_add(1, Ordering::Relaxed);
                    g.grouped_requests.fetch_add(group.len() as u64, Ordering::Relaxed);
                    for (i, answer) in pending.drain(..).zip(committed) {
                        answers[i] = Some(Ok(answer));
                    }
                }
                Ok(Outcome::Own(k)) => {
                    self.ctx.groups.split.fetch_add(1, Ordering::Relaxed);
                    let i = pending.remove(k);
                    answers[i] = Some(self.alone(&jobs[i]).await);
                }
                Ok(Outcome::ClaimRefused) => {
                    self.ctx.groups.split.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                Err(e) => {
                    for i in pending.drain(..) {
                        answers[i] = Some(Err(e.clone()));
                    }
                }
            }
        }
        for i in pending {
            answers[i] = Some(self.alone(&jobs[i]).await);
        }
        let lost = || {
            Err(LedgerError::Internal(
                "a grouped request was left without an answer".into(),
            ))
        };
        answers.into_iter().map(|a| a.unwrap_or_else(lost)).collect()
    }

    /// A job written as it would be without groups.
    async fn alone(&self, job: &Job) -> Answer {
        match &job.claim {
            Some(claim) => {
                self.retry(|| self.worker_then_claim_or_alone(&job.lease, &job.request, claim))
                    .await
            }
            None => self
                .retry(|| self.worker_once(&job.lease, &job.request))
                .await
                .map(|reply| (reply, Vec::new())),
        }
    }

    /// Every job's request inside `tx`, in order; `Err(k)` when the `k`-th has an
    /// answer of its own. Jobs on distinct attempts lock their records together
    /// ([`session::lock_records`]) and decide at one now, read once all are held;
    /// otherwise each locks its own, one after the other.
    async fn requests_in(&self, tx: &mut B::Tx<'_>, jobs: &[&Job]) -> Result<Result<Vec<Reply>, usize>, TxError> {
        let ids: Vec<&AttemptId> = jobs.iter().map(|j| &j.lease.attempt_id).collect();
        let distinct = ids.windows(2).all(|w| w[0] != w[1]);
        let mut records = match distinct {
            true => Some(session::lock_records(tx, &ids).await?),
            false => None,
        };
        let db_now = match (&records, &self.ctx.clock) {
            (Some(_), None) => Some(session::db_now(tx).await?),
            _ => None,
        };
        let mut replies = Vec::with_capacity(jobs.len());
        for (k, job) in jobs.iter().enumerate() {
            let done = match records.as_mut() {
                Some(records) => match records.remove(&job.lease.attempt_id) {
                    Some(record) => self.worker_on(tx, &job.lease, &job.request, record, db_now).await,
                    None => return Ok(Err(k)),
                },
                None => self.worker_in(tx, &job.lease, &job.request).await,
            };
            match done {
                Ok(reply) => replies.push(reply),
                Err(TxError::Ledger(_)) => return Ok(Err(k)),
                Err(e) => return Err(e),
            }
        }
        Ok(Ok(replies))
    }

    /// One try of a group: every request, then the claims, then one commit.
    async fn group_once(&self, jobs: &[&Job]) -> Result<Outcome, TxError> {
        let backend = &*self.backend;
        let mut conn = backend.connect().await?;
        let mut tx = backend.begin(&mut conn, TxKind::Claim).await?;
        let replies = match self.requests_in(&mut tx, jobs).await {
            Ok(Ok(replies)) => replies,
            Ok(Err(k)) => {
                backend.rollback(tx).await;
                return Ok(Outcome::Own(k));
            }
            Err(e) => return end(backend, tx, Err(e), TxKind::Claim).await,
        };
        let mut claimed: Vec<Vec<Claimed>> = jobs.iter().map(|_| Vec::new()).collect();
        for members in claim_sets(jobs) {
            let requests: Vec<&ClaimRequest> = members.iter().filter_map(|&i| jobs[i].claim.as_ref()).collect();
            match backend.claim_many_in(&self.ctx, &mut tx, &requests).await {
                Ok(each) => {
                    for (i, c) in members.into_iter().zip(each) {
                        claimed[i] = c;
                    }
                }
                Err(TxError::Ledger(_)) => {
                    backend.rollback(tx).await;
                    return Ok(Outcome::ClaimRefused);
                }
                Err(e) => return end(backend, tx, Err(e), TxKind::Claim).await,
            }
        }
        end(backend, tx, Ok(()), TxKind::Claim).await?;
        let leases = claimed.into_iter().map(Claimed::leases);
        Ok(Outcome::Committed(replies.into_iter().zip(leases).collect()))
    }
}

/// How one try of a group ended.
enum Outcome {
    /// Committed: each request's reply and claims, in order.
    Committed(Vec<(Reply, Vec<Claimed>)>),
    /// Undone: the request at this place has an answer of its own (a refusal, not
    /// found).
    Own(usize),
    /// Undone: a claim was refused (damaged rows), and it is not known for which
    /// request.
    ClaimRefused,
}

/// The jobs with a claim to make, by the capabilities they claim with (one claim
/// for each set), in job order.
fn claim_sets(jobs: &[&Job]) -> Vec<Vec<usize>> {
    let mut sets: Vec<(Option<&Capabilities>, Vec<usize>)> = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        let Some(claim) = job.claim.as_ref().filter(|c| c.batch > 0) else {
            continue;
        };
        let caps = claim.capabilities.as_ref();
        match sets.iter_mut().find(|(c, _)| *c == caps) {
            Some((_, members)) => members.push(i),
            None => sets.push((caps, vec![i])),
        }
    }
    sets.into_iter().map(|(_, members)| members).collect()
}
