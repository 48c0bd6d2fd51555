//! `leasehold bench`: a quick end-to-end measurement against the user's own database.
//!
//! It writes to that database: `attempts` plans named `bench-<millis>-<i>` and one
//! attempt of each, all delivered by in-process workers (see [`leasehold::bench`]).
//! A progress line goes to stderr; the figures to stdout (as JSON with `--json`).
//! With `--baseline` the raw baseline ([`leasehold::bench::raw`]) runs before and
//! after the bench, in this process, on a scratch queue of the same database kind
//! (SQLite: a file in the temporary directory; MySQL: a table in the same database,
//! dropped after), and the deliveries/s are reported as a ratio to it.
//! On MySQL or MariaDB the server's own counters are read around the deliveries and
//! printed per delivery ([`leasehold::bench::server`]); on SQLite, the writer
//! thread's commits and the calls each held ([`leasehold::bench::WriterFigures`]).
//! A run that did not deliver every attempt exactly once fails with exit code 1.

use super::{Failure, Outcome};
use leasehold::bench::raw::RawKind;
use leasehold::bench::{self, Baseline, BenchOptions, BenchReport, Progress};
use leasehold::ledger::Ledger;
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The `bench` arguments.
#[derive(clap::Args, Debug)]
pub(super) struct BenchArgs {
    /// Attempts to enqueue and deliver (one plan each).
    #[arg(long, default_value_t = 2_000)]
    attempts: u64,
    /// In-process workers.
    #[arg(long, default_value_t = 4)]
    workers: u32,
    /// Dry-run steps per attempt.
    #[arg(long, default_value_t = 1)]
    steps: u32,
    /// Commands each worker claims per poll (and delivers at once; clamped to 1..=256).
    #[arg(long, default_value_t = 5)]
    batch: u32,
    /// Also run the raw baseline, before and after the bench, in this process on the
    /// same database kind: as many plain-SQL workers claiming and then completing
    /// (token-checked) as many jobs, two transactions per job. Reports the
    /// deliveries/s as a ratio to it.
    #[arg(long)]
    baseline: bool,
    /// PostgreSQL only: first write this many ended attempts, finished 30 days ago, in
    /// bulk; then run the bench twice, the second time while `prune
    /// --finished-before 1d` deletes that history, and report both rates.
    #[arg(long, value_name = "N", conflicts_with = "baseline")]
    prune_history: Option<u64>,
    /// The plans the --prune-history attempts are spread over.
    #[arg(long, value_name = "N", default_value_t = 100, requires = "prune_history")]
    prune_plans: u32,
}

/// Runs the bench and prints its figures.
pub(super) async fn run<L: Ledger>(ledger: Arc<L>, args: BenchArgs, json: bool) -> Outcome {
    if args.attempts == 0 {
        return Err(Failure::bad_input("--attempts: must be at least 1"));
    }
    if args.workers == 0 || args.steps == 0 {
        return Err(Failure::bad_input("--workers and --steps: must be at least 1"));
    }
    let backend = std::any::type_name::<L>()
        .rsplit("::")
        .next()
        .unwrap_or("ledger")
        .to_owned();
    let options = BenchOptions {
        attempts: args.attempts,
        workers: args.workers,
        steps: args.steps,
        batch: args.batch,
        tag: bench::fresh_tag(),
    };
    if let Some(history) = args.prune_history {
        return super::prune::bench_while_pruning(ledger, options, history, args.prune_plans, json).await;
    }
    let raw = if args.baseline {
        let any: &dyn std::any::Any = ledger.as_ref();
        let Some(raw) = bench::raw::for_ledger(any) else {
            return Err(Failure::bad_input(format!(
                "--baseline: there is no raw baseline on {backend}"
            )));
        };
        Some(raw)
    } else {
        None
    };
    let (workers, jobs) = (args.workers, args.attempts);
    let before = match &raw {
        Some(raw) => Some(raw.run(RawKind::ClaimThenComplete, workers, jobs).await?),
        None => None,
    };
    let progress = Arc::new(Progress::default());
    let ticker = tokio::spawn(show_progress(Arc::clone(&progress), args.attempts));
    let result = bench::run(ledger, &options, progress).await;
    ticker.abort();
    let _ = ticker.await;
    let mut report = result?;
    if let (Some(raw), Some(before)) = (&raw, before) {
        let after = raw.run(RawKind::ClaimThenComplete, workers, jobs).await?;
        report.baseline = Some(Baseline::new(raw.backend(), before, after, &report));
    }
    if json {
        super::render::print_json(&report);
    } else {
        out!("{}", render(&report, &backend));
    }
    if report.exactly_once() {
        Ok(())
    } else {
        Err(Failure {
            code: 1,
            message: format!("exactly-once check failed: {}", failure_summary(&report)),
        })
    }
}

fn failure_summary(report: &BenchReport) -> String {
    let r = &report.measured.report;
    let mut parts = vec![format!(
        "{} of {} attempts delivered exactly once",
        report.verified.exactly_once, report.attempts
    )];
    if r.failed + r.refused + r.abandoned > 0 {
        parts.push(format!(
            "workers report {} failed, {} refused, {} abandoned",
            r.failed, r.refused, r.abandoned
        ));
    }
    parts.extend(report.verified.problems.iter().cloned());
    parts.join("; ")
}

/// The report as text, one figure a line.
fn render(report: &BenchReport, backend: &str) -> String {
    let m = &report.measured;
    let c = &m.counts;
    let ms = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
    let mut out = String::new();
    out.push_str(&format!(
        "bench: {} attempts of a {}-step dry-run plan, {} workers, batch {}, on {backend}\n",
        report.attempts, report.steps, m.workers, m.batch
    ));
    out.push_str(&format!(
        "delivered {} in {:.2} s\n",
        m.report.delivered,
        m.elapsed.as_secs_f64()
    ));
    out.push_str(&format!("deliveries/s              {:.0}\n", report.deliveries_per_s));
    out.push_str(&format!("claims/s                  {:.0}\n", report.claims_per_s));
    out.push_str(&format!("steps/s                   {:.0}\n", report.steps_per_s));
    out.push_str(&format!(
        "transactions per attempt  {:.2} (its claim + {:.2} step writes; {} heartbeats)\n",
        report.transactions_per_attempt,
        report.transactions_per_attempt - 1.0,
        c.heartbeats
    ));
    out.push_str(&format!(
        "write transactions        {:.2} per attempt over the run ({} claim transactions, {} of them empty polls)\n",
        report.write_transactions_per_attempt, c.claims, c.empty_claims
    ));
    out.push_str(&format!(
        "latency p50 / p99         {} / {} ms (enqueue to delivered; all enqueued before the workers started)\n",
        ms(report.latency_p50_ms),
        ms(report.latency_p99_ms)
    ));
    if let Some(b) = &report.baseline {
        out.push_str(&format!(
            "raw baseline              {:.0} / {:.0} jobs/s before / after ({} plain-SQL workers on {}: claim, then \
             token-checked complete)\n",
            b.before.per_s(),
            b.after.per_s(),
            b.before.workers,
            b.backend
        ));
        out.push_str(&format!(
            "deliveries / raw          {:.2} (deliveries/s over the mean of the two baseline runs)\n",
            b.ratio
        ));
    }
    if let Some(w) = &report.writer {
        out.push_str(&format!(
            "sqlite writer             {} commits over the deliveries, {:.2} per delivery, {:.2} calls per commit\n",
            w.commits,
            w.commits as f64 / (m.report.delivered.max(1) as f64),
            w.calls_per_commit()
        ));
        if let Some(cpu_us) = w.cpu_us {
            let wall_us = (m.elapsed.as_secs_f64() * 1e6).max(1.0);
            out.push_str(&format!(
                "sqlite writer CPU         {:.1} µs per delivery, busy {:.0} % of the run\n",
                cpu_us as f64 / (m.report.delivered.max(1) as f64),
                100.0 * cpu_us as f64 / wall_us
            ));
        }
    }
    if let Some(s) = &report.server {
        let per = |n: u64| n as f64 / (m.report.delivered.max(1) as f64);
        out.push_str(&format!(
            "server                    {}, per delivery: {:.1} statements, {:.2} commits, {:.2} fsyncs, {:.1} rows \
             read, {:.1} updated, {:.1} temporary-table rows; {} row-lock waits in all\n",
            s.version,
            per(s.statements),
            per(s.commits),
            per(s.fsyncs),
            per(s.rows_read),
            per(s.rows_updated),
            per(s.temp_table_rows),
            s.row_lock_waits
        ));
        if let Some(cpu) = s.cpu_percent_of_one_core() {
            out.push_str(&format!(
                "server CPU                {cpu:.0} % of one core over the deliveries (this machine has {})\n",
                s.machine_cores
            ));
        }
    }
    if report.exactly_once() {
        out.push_str(&format!(
            "exactly once              ok: {} attempts SUCCEEDED, commands DELIVERED, delivery_count 1\n",
            report.verified.exactly_once
        ));
    } else {
        out.push_str(&format!(
            "exactly once              FAILED: {}\n",
            failure_summary(report)
        ));
    }
    out
}

/// Redraws a progress line on stderr (a terminal: ten times a second; otherwise one
/// line a second) until aborted.
async fn show_progress(progress: Arc<Progress>, total: u64) {
    let terminal = std::io::stderr().is_terminal();
    let period = Duration::from_millis(if terminal { 100 } else { 1_000 });
    let started = Instant::now();
    let mut stderr = std::io::stderr();
    let _guard = ClearLine(terminal);
    loop {
        tokio::time::sleep(period).await;
        let (enqueued, delivered) = (progress.enqueued(), progress.delivered());
        let (phase, done) = if enqueued < total {
            ("enqueued", enqueued)
        } else {
            ("delivered", delivered)
        };
        let width = 30usize;
        let filled = (done.saturating_mul(width as u64) / total.max(1)) as usize;
        let line = format!(
            "[{}{}] {done}/{total} {phase} ({:.1} s)",
            "#".repeat(filled.min(width)),
            "-".repeat(width - filled.min(width)),
            started.elapsed().as_secs_f64()
        );
        let _ = if terminal {
            write!(stderr, "\r{line}\x1b[K")
        } else {
            writeln!(stderr, "{line}")
        };
        let _ = stderr.flush();
    }
}

/// Clears the progress line when the progress task ends.
struct ClearLine(bool);

impl Drop for ClearLine {
    fn drop(&mut self) {
        if self.0 {
            let _ = write!(std::io::stderr(), "\r\x1b[K");
        }
    }
}
