//! Many seeds on every core, and their summary.
//!
//! Contract: [`run_batch`] runs every (seed, backend) job of a [`Batch`] on up to
//! `threads` threads; each job builds its own simulation on its thread (a `Sim` is
//! `!Send`) and plants the batch's bugs in each of its runs. Results are ordered by
//! seed and backend whatever thread ran them, so a [`Summary`] prints the same for
//! the same batch, wall-clock figures aside. Wall time is read here, outside every
//! simulation, only to report simulations per second.

use crate::bugs::Bug;
use crate::db::BackendKind;
use crate::profile::Profile;
use crate::world::{self, RunConfig, RunReport, Stats};
use std::fmt::Write as _;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// The highest invariant number the checker proves.
pub const INVARIANTS: usize = 26;

/// A set of runs.
#[derive(Debug, Clone)]
pub struct Batch {
    /// The fault profile.
    pub profile: Profile,
    /// Backends to run each seed on.
    pub backends: Vec<BackendKind>,
    /// Seeds.
    pub seeds: Range<u64>,
    /// Bugs to plant.
    pub bugs: Vec<Bug>,
    /// Worker threads.
    pub threads: usize,
}

/// The outcome of a batch.
#[derive(Debug, Clone)]
pub struct Summary {
    /// The profile's name.
    pub profile: String,
    /// Backends run.
    pub backends: Vec<BackendKind>,
    /// Seeds run.
    pub seeds: Range<u64>,
    /// Bugs planted.
    pub bugs: Vec<Bug>,
    /// Every run, by seed then backend.
    pub reports: Vec<RunReport>,
    /// Wall time.
    pub wall: Duration,
    /// Threads used.
    pub threads: usize,
}

impl Summary {
    /// Runs that broke an invariant.
    pub fn failures(&self) -> impl Iterator<Item = &RunReport> {
        self.reports.iter().filter(|r| !r.violations.is_empty())
    }

    /// Summed counts.
    pub fn stats(&self) -> Stats {
        let mut s = Stats::default();
        for r in &self.reports {
            s.add(&r.stats);
        }
        s
    }

    /// Simulations per second of wall time.
    pub fn sims_per_second(&self) -> f64 {
        self.reports.len() as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    /// The command that reproduces one run.
    pub fn reproduce(&self, r: &RunReport) -> String {
        let mut cmd = format!(
            "cargo run -p leasehold-sim --release -- --seed {} --profile {} --backend {}",
            r.seed,
            self.profile,
            r.backend.name()
        );
        for b in &self.bugs {
            let _ = write!(cmd, " --bug {}", b.name());
        }
        cmd.push_str(" --trace");
        cmd
    }

    /// The printed summary, one failing run per line at the end.
    pub fn render(&self) -> String {
        let s = self.stats();
        let failures: Vec<&RunReport> = self.failures().collect();
        let violations: usize = self.reports.iter().map(|r| r.violations.len()).sum();
        let mut per_invariant = [0usize; INVARIANTS + 1];
        for r in &self.reports {
            for v in &r.violations {
                per_invariant[usize::from(v.invariant).min(INVARIANTS)] += 1;
            }
        }
        let backends: Vec<&str> = self.backends.iter().map(|b| b.name()).collect();
        let mut out = String::new();
        let _ = writeln!(
            out,
            "profile {} · backend {} · seeds {}..{} · {} runs{}",
            self.profile,
            backends.join("+"),
            self.seeds.start,
            self.seeds.end,
            self.reports.len(),
            if self.bugs.is_empty() {
                String::new()
            } else {
                format!(
                    " · planted: {}",
                    self.bugs.iter().map(|b| b.name()).collect::<Vec<_>>().join(", ")
                )
            }
        );
        let _ = writeln!(
            out,
            "runs passed: {}   failed: {}",
            self.reports.len() - failures.len(),
            failures.len()
        );
        let _ = writeln!(
            out,
            "faults injected: {}   takeovers: {}   given back: {}   stale writes refused: {}   duplicates deduplicated: {}{}",
            s.faults,
            s.takeovers,
            s.gave_back,
            s.stale_refused,
            s.duplicates,
            if s.failovers > 0 {
                format!("   failovers: {} (commits lost: {})", s.failovers, s.commits_lost)
            } else {
                String::new()
            }
        );
        let _ = writeln!(
            out,
            "attempts: {} (succeeded {}, failed {} of which exhausted {}, aborted {})   simulated: {:.0} s",
            s.attempts,
            s.succeeded,
            s.failed,
            s.exhausted,
            s.aborted,
            s.sim_ms as f64 / 1000.0
        );
        let by_invariant: Vec<String> = per_invariant
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(i, n)| format!("#{i}: {n}"))
            .collect();
        let _ = writeln!(
            out,
            "violations: {violations}{}",
            if by_invariant.is_empty() {
                String::new()
            } else {
                format!(" ({})", by_invariant.join(", "))
            }
        );
        let _ = writeln!(
            out,
            "wall: {:.1} s   sims/s: {:.1}   threads: {}",
            self.wall.as_secs_f64(),
            self.sims_per_second(),
            self.threads
        );
        for r in failures {
            let first = r.violations.first().map(|v| v.to_string()).unwrap_or_default();
            let _ = writeln!(
                out,
                "FAIL seed {} ({}): {} violation(s), first {first} — reproduce: {}",
                r.seed,
                r.backend.name(),
                r.violations.len(),
                self.reproduce(r)
            );
        }
        out
    }
}

/// The default thread count: the machine's cores.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Runs a batch; `progress(done, total, failed)` is called after every run.
pub fn run_batch(batch: &Batch, progress: impl Fn(usize, usize, usize) + Sync) -> Summary {
    let jobs: Vec<(u64, BackendKind)> = batch
        .seeds
        .clone()
        .flat_map(|s| batch.backends.iter().map(move |b| (s, *b)))
        .collect();
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let failed = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<RunReport>>> = Mutex::new(vec![None; jobs.len()]);
    let threads = batch.threads.clamp(1, jobs.len().max(1));
    let started = wall_clock();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(&(seed, backend)) = jobs.get(i) else {
                    break;
                };
                let config = RunConfig {
                    seed,
                    profile: batch.profile.clone(),
                    backend,
                    bugs: batch.bugs.clone(),
                    keep_trace: false,
                };
                let report = world::run(&config);
                if !report.violations.is_empty() {
                    failed.fetch_add(1, Ordering::SeqCst);
                }
                results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(report);
                let n = done.fetch_add(1, Ordering::SeqCst) + 1;
                progress(n, jobs.len(), failed.load(Ordering::SeqCst));
            });
        }
    });
    let wall = started.elapsed();
    let reports = results
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .flatten()
        .collect();
    Summary {
        profile: batch.profile.name.clone(),
        backends: batch.backends.clone(),
        seeds: batch.seeds.clone(),
        bugs: batch.bugs.clone(),
        reports,
        wall,
        threads,
    }
}

/// Wall-clock time, for sims/s only: never inside a simulation.
#[allow(clippy::disallowed_methods)]
pub fn wall_clock() -> std::time::Instant {
    std::time::Instant::now()
}
