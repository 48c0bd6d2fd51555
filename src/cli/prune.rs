//! `leasehold prune` (retention, [`leasehold::ledger::prune`]), `leasehold archive
//! verify` ([`leasehold::archive`]) and the periodic prune of `serve` and `worker`.
//! Every flag is checked before anything is read or written; a refusal names it.

use super::when::{millis, parse_duration};
use super::{emit, Failure, Outcome};
use leasehold::archive::{self, ArchiveWriter};
use leasehold::clock::{Clock, SystemClock};
use leasehold::ledger::prune::{prune, BatchSink, PruneOptions, DEFAULT_BATCH, DEFAULT_REST_PERCENT, MAX_BATCH};

/// The longest rest `--rest-percent` asks for: a hundred times the batch's time.
const MAX_REST_PERCENT: u32 = 10_000;
use leasehold::ledger::{Ledger, LedgerError};
use leasehold_engine::{AttemptRecord, AttemptStatus, Plan, Timestamp};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// `leasehold prune`'s flags.
#[derive(clap::Args, Debug)]
#[command(after_help = "Never pruned: open attempts, each plan's latest forward attempt and \
every attempt above it, the release gate's baseline, and each plan's latest successful attempts; \
plans are never pruned. Each batch is one short transaction; with --archive its lines are written \
and synced before it is deleted. See docs/retention.md.")]
pub(super) struct PruneArgs {
    /// Prune attempts that ended at least this long ago (30d, 12h, 90m).
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    finished_before: String,
    /// Prune only attempts in this ended state (repeatable): SUCCEEDED, FAILED,
    /// ABORTED. Default: all three.
    #[arg(long = "state", value_name = "STATE")]
    states: Vec<String>,
    /// Count what would be pruned; read only, write nothing.
    #[arg(long, conflicts_with = "archive")]
    dry_run: bool,
    /// Write every pruned attempt to this new JSON Lines file first (`archive verify`
    /// checks it); an existing file is refused.
    #[arg(long, value_name = "FILE")]
    archive: Option<PathBuf>,
    /// Attempts per batch, one transaction each (1..=10000).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_BATCH)]
    batch: u32,
    /// After each batch, rest this percent of the time the batch took (0..=10000; 100:
    /// as long again), leaving the database to the workers in between; 0: no rest.
    #[arg(long, value_name = "P", default_value_t = DEFAULT_REST_PERCENT)]
    rest_percent: u32,
}

/// `leasehold archive …`.
#[derive(clap::Subcommand, Debug)]
pub(super) enum ArchiveCommand {
    /// Check an archive written by `prune --archive`: every evidence hash, every
    /// fingerprint, every line's number, the line count and the manifest (exit 0
    /// intact, 4 tampered, naming each line at fault).
    Verify {
        /// The archive file.
        file: PathBuf,
    },
}

/// A duration flag that must be longer than zero, in milliseconds.
fn positive_ms(flag: &str, text: &str) -> Result<u64, Failure> {
    let ms = millis(parse_duration(flag, text)?);
    if ms == 0 {
        return Err(Failure::bad_input(format!("{flag} {text:?}: must be longer than zero")));
    }
    Ok(ms)
}

/// `now` less `ms`: the cutoff of attempts finished before that long ago.
fn before(now: Timestamp, ms: u64) -> Timestamp {
    Timestamp::from_millis(now.as_millis().saturating_sub(i64::try_from(ms).unwrap_or(i64::MAX)))
}

/// The values of `flag` (`--state`), each an ended state.
fn states(flag: &str, given: &[String]) -> Result<Vec<AttemptStatus>, Failure> {
    given
        .iter()
        .map(|text| {
            let status: AttemptStatus = text
                .to_ascii_uppercase()
                .parse()
                .map_err(|e| Failure::bad_input(format!("{flag}: {e}")))?;
            if !status.is_terminal() {
                return Err(Failure::bad_input(format!(
                    "{flag} {status}: an open attempt is never pruned (SUCCEEDED, FAILED or ABORTED)"
                )));
            }
            Ok(status)
        })
        .collect()
}

/// The options the flags ask for, checked.
fn options(args: &PruneArgs, now: Timestamp) -> Result<PruneOptions, Failure> {
    check_batch("--batch", args.batch)?;
    if args.rest_percent > MAX_REST_PERCENT {
        return Err(Failure::bad_input(format!(
            "--rest-percent {}: must be 0 to {MAX_REST_PERCENT}",
            args.rest_percent
        )));
    }
    Ok(PruneOptions {
        cutoff: before(now, positive_ms("--finished-before", &args.finished_before)?),
        states: states("--state", &args.states)?,
        batch: args.batch,
        dry_run: args.dry_run,
        rest_percent: args.rest_percent,
    })
}

/// A batch size `flag` gives: 1 to [`MAX_BATCH`].
fn check_batch(flag: &str, batch: u32) -> Result<(), Failure> {
    if !(1..=MAX_BATCH).contains(&batch) {
        return Err(Failure::bad_input(format!("{flag} {batch}: must be 1 to {MAX_BATCH}")));
    }
    Ok(())
}

/// Prunes into `archive` (if any) and closes it, also when the prune stops early
/// (its manifest then counts the lines written). Answers the count and the lines.
async fn prune_into<L: Ledger>(
    ledger: &L,
    options: &PruneOptions,
    archive: Option<ArchiveWriter>,
) -> Result<(u64, Option<u64>), LedgerError> {
    let Some(mut writer) = archive else {
        return Ok((prune(ledger, options, None).await?, None));
    };
    let pruned = prune(ledger, options, Some(&mut writer)).await;
    let lines = writer.lines();
    writer.finish(SystemClock.now())?;
    Ok((pruned?, Some(lines)))
}

/// `leasehold prune`.
pub(super) async fn run<L: Ledger>(ledger: &L, args: &PruneArgs, json: bool) -> Outcome {
    let options = options(args, SystemClock.now())?;
    let archive = args.archive.as_deref().map(ArchiveWriter::create).transpose()?;
    let (n, lines) = prune_into(ledger, &options, archive).await?;
    let key = if options.dry_run { "would_prune" } else { "pruned" };
    emit(json, &serde_json::json!({ key: n }), || {
        let verb = if options.dry_run { "would prune" } else { "pruned" };
        let archived = match (&args.archive, lines) {
            (Some(path), Some(lines)) => format!(" (archived {lines} to {})", path.display()),
            _ => String::new(),
        };
        format!("{verb} {n} attempt{}{archived}\n", if n == 1 { "" } else { "s" })
    });
    Ok(())
}

/// `leasehold archive verify FILE`: exit 0 intact, 4 tampered.
pub(super) fn verify(file: &Path, json: bool) -> Outcome {
    let input = std::fs::File::open(file)
        .map_err(|e| Failure::bad_input(format!("{}: cannot read it: {e}", file.display())))?;
    let found = archive::verify(std::io::BufReader::new(input))
        .map_err(|e| Failure::bad_input(format!("{}: cannot read it: {e}", file.display())))?;
    let problems: Vec<String> = found.problems.iter().map(ToString::to_string).collect();
    let value = serde_json::json!({
        "intact": found.intact(),
        "attempts": found.attempts,
        "receipts": found.receipts,
        "problems": problems,
    });
    emit(json, &value, || {
        if found.intact() {
            format!(
                "intact: {} attempts, {} receipts, manifest matches\n",
                found.attempts, found.receipts
            )
        } else {
            let mut text = format!("TAMPERED: {} problems\n", problems.len());
            problems
                .iter()
                .for_each(|p| text.push_str(&format!("{}\n", leasehold::text::clean(p))));
            text
        }
    });
    if found.intact() {
        Ok(())
    } else {
        Err(Failure::silent(4))
    }
}

/// The periodic prune's flags, on `serve` and `worker` (off unless
/// `--prune-finished-before` is given).
#[derive(clap::Args, Debug, Clone, Default)]
pub(super) struct PeriodicArgs {
    /// Prune, periodically, attempts that ended at least this long ago (30d, 12h),
    /// as `leasehold prune --finished-before` does.
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    prune_finished_before: Option<String>,
    /// How often to prune (default 1h).
    #[arg(long, value_name = "DURATION")]
    prune_every: Option<String>,
    /// Write each run's pruned attempts to a new timestamped archive in this
    /// directory first (`leasehold-archive-MILLIS.jsonl`; none when nothing is pruned).
    #[arg(long, value_name = "DIR")]
    prune_archive_dir: Option<PathBuf>,
    /// Prune only attempts in this ended state (repeatable), as `prune --state`.
    #[arg(long = "prune-state", value_name = "STATE", value_delimiter = ',')]
    prune_states: Vec<String>,
    /// Attempts per batch, as `prune --batch` (1..=10000).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_BATCH)]
    prune_batch: u32,
}

/// A checked periodic prune: how old, how often, where archives go.
#[derive(Debug, Clone)]
pub(super) struct Periodic {
    finished_before_ms: u64,
    every: Duration,
    archive_dir: Option<PathBuf>,
    states: Vec<AttemptStatus>,
    batch: u32,
}

impl PeriodicArgs {
    /// The periodic prune these flags ask for, checked; `None` when off.
    pub(super) fn checked(&self) -> Result<Option<Periodic>, Failure> {
        let Some(text) = &self.prune_finished_before else {
            return self.unused().map(|()| None);
        };
        let finished_before_ms = positive_ms("--prune-finished-before", text)?;
        let every = match &self.prune_every {
            Some(text) => parse_duration("--prune-every", text)?,
            None => Duration::from_secs(3_600),
        };
        if every < Duration::from_secs(1) {
            return Err(Failure::bad_input("--prune-every: must be at least 1s"));
        }
        if let Some(dir) = &self.prune_archive_dir {
            if !dir.is_dir() {
                return Err(Failure::bad_input(format!(
                    "--prune-archive-dir {}: not a directory",
                    dir.display()
                )));
            }
        }
        check_batch("--prune-batch", self.prune_batch)?;
        Ok(Some(Periodic {
            finished_before_ms,
            every,
            archive_dir: self.prune_archive_dir.clone(),
            states: states("--prune-state", &self.prune_states)?,
            batch: self.prune_batch,
        }))
    }

    /// Refuses a periodic prune's setting given without `--prune-finished-before`
    /// (checked here rather than by clap, so that a configuration file's key can be
    /// checked on its own).
    fn unused(&self) -> Result<(), Failure> {
        let given = [
            ("--prune-every", self.prune_every.is_some()),
            ("--prune-archive-dir", self.prune_archive_dir.is_some()),
            ("--prune-state", !self.prune_states.is_empty()),
            ("--prune-batch", self.prune_batch != DEFAULT_BATCH),
        ];
        match given.iter().find(|(_, set)| *set) {
            Some((flag, _)) => Err(Failure::bad_input(format!(
                "{flag}: needs --prune-finished-before (the periodic prune is off without it)"
            ))),
            None => Ok(()),
        }
    }
}

/// An archive in a directory, created at the first batch (a run that prunes
/// nothing leaves no file).
struct LazyArchive {
    dir: PathBuf,
    writer: Option<ArchiveWriter>,
}

impl BatchSink for LazyArchive {
    fn record(&mut self, plan: &Plan, batch: &[AttemptRecord]) -> Result<(), LedgerError> {
        if self.writer.is_none() {
            let at = SystemClock.now().as_millis();
            let path = self.dir.join(format!("leasehold-archive-{at}.jsonl"));
            self.writer = Some(ArchiveWriter::create(&path)?);
        }
        match &mut self.writer {
            Some(writer) => writer.record(plan, batch),
            None => Ok(()),
        }
    }
}

impl Periodic {
    /// One run: prunes, closes its archive (if it wrote one) and logs the outcome.
    async fn once<L: Ledger>(&self, ledger: &L) {
        let options = PruneOptions {
            cutoff: before(SystemClock.now(), self.finished_before_ms),
            states: self.states.clone(),
            batch: self.batch,
            dry_run: false,
            rest_percent: DEFAULT_REST_PERCENT,
        };
        let mut lazy = self.archive_dir.clone().map(|dir| LazyArchive { dir, writer: None });
        let pruned = prune(ledger, &options, lazy.as_mut().map(|l| l as &mut dyn BatchSink)).await;
        let closed = lazy
            .and_then(|l| l.writer)
            .map(|w| w.finish(SystemClock.now()))
            .transpose();
        let said = match (pruned, closed) {
            (Ok(n), Ok(archive)) => {
                let archive = archive.map(|p| p.display().to_string());
                tracing::info!(pruned = n, archive = archive.as_deref(), "periodic prune");
                let into = archive.map_or_else(String::new, |a| format!(" into {a}"));
                format!("periodic prune: pruned {n} attempts{into}")
            }
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(error = %e, "periodic prune failed");
                format!("periodic prune failed: {e}")
            }
        };
        // A worker sets up no log subscriber: it says so on stderr instead.
        if !tracing::dispatcher::has_been_set() {
            errln!("{}", leasehold::text::clean(&said));
        }
    }

    /// Runs a prune now and then every interval, until [`Running::stop`] (which lets
    /// a run under way end).
    pub(super) fn spawn<L: Ledger>(self, ledger: Arc<L>) -> Running {
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(self.every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    biased;
                    _ = ticks.tick() => self.once(ledger.as_ref()).await,
                    _ = stopped.changed() => return,
                }
            }
        });
        Running { stop, task }
    }
}

/// A periodic prune under way.
pub(super) struct Running {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stops it once its run under way (if any) has ended.
    pub(super) async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// The PostgreSQL ledger under `ledger`, or the refusal of `--prune-history`.
fn postgres_of<L: Ledger>(ledger: &L) -> Result<&leasehold::ledger::postgres::PostgresLedger, Failure> {
    let any: &dyn std::any::Any = ledger;
    any.downcast_ref()
        .ok_or_else(|| Failure::bad_input("--prune-history: only on a PostgreSQL ledger"))
}

/// Writes `history` ended attempts, finished 30 days ago, over `plans` plans of
/// `tag` in bulk (PostgreSQL only); answers how many and the seconds it took.
async fn fill_history<L: Ledger>(ledger: &L, tag: &str, history: u64, plans: u32) -> Result<(u64, f64), Failure> {
    let postgres = postgres_of(ledger)?;
    ledger.migrate().await?;
    let started = std::time::Instant::now();
    let at = before(SystemClock.now(), 30 * 86_400_000);
    let written = leasehold::bench::history::fill_postgres(postgres, tag, plans, history, at).await?;
    Ok((written, started.elapsed().as_secs_f64()))
}

/// What a bench measured while a prune ran: the bench, and how many attempts the
/// prune deleted while the workers delivered.
struct WhilePruning {
    bench: leasehold::bench::BenchReport,
    pruned: u64,
    finished: bool,
}

/// Runs the bench `options` describes while a prune of everything ended a day ago
/// runs (at its default rest); the prune is stopped when the deliveries end.
async fn bench_during_prune<L: Ledger>(
    ledger: Arc<L>,
    options: &leasehold::bench::BenchOptions,
) -> Result<WhilePruning, Failure> {
    use leasehold::bench::{self, history::count_attempts, Progress};
    let progress = Arc::new(Progress::default());
    let (counting, prepared) = bench::setup(Arc::clone(&ledger), options, Arc::clone(&progress)).await?;
    let held = count_attempts(postgres_of(ledger.as_ref())?).await?;
    let prune_options = PruneOptions {
        cutoff: before(SystemClock.now(), 86_400_000),
        states: Vec::new(),
        batch: DEFAULT_BATCH,
        dry_run: false,
        rest_percent: DEFAULT_REST_PERCENT,
    };
    let pruner = Arc::clone(&ledger);
    let pruning = tokio::spawn(async move { prune(pruner.as_ref(), &prune_options, None).await });
    let bench = bench::measure(counting, &prepared, options, progress).await?;
    let finished = pruning.is_finished();
    pruning.abort();
    let _ = pruning.await;
    let left = count_attempts(postgres_of(ledger.as_ref())?).await?;
    Ok(WhilePruning {
        bench,
        pruned: held.saturating_sub(left),
        finished,
    })
}

/// `leasehold bench --prune-history N`: writes an ended history in bulk, runs the
/// bench once alone and once while a prune deletes that history, and prints both
/// delivery rates and the prune's own.
pub(super) async fn bench_while_pruning<L: Ledger>(
    ledger: Arc<L>,
    options: leasehold::bench::BenchOptions,
    history: u64,
    plans: u32,
    json: bool,
) -> Outcome {
    use leasehold::bench::{self, Progress};
    let (written, fill_s) = fill_history(ledger.as_ref(), &options.tag, history, plans).await?;
    errln!("wrote {written} ended attempts over {plans} plans in {fill_s:.1} s");
    let alone = bench::run(Arc::clone(&ledger), &options, Arc::new(Progress::default())).await?;
    let second = bench::BenchOptions {
        tag: format!("{}-pruning", options.tag),
        ..options
    };
    let w = bench_during_prune(ledger, &second).await?;
    let ratio = w.bench.deliveries_per_s / alone.deliveries_per_s.max(f64::MIN_POSITIVE);
    let value = serde_json::json!({
        "history": written, "plans": plans, "fill_s": fill_s,
        "alone": alone, "while_pruning": w.bench,
        "pruned_while_delivering": w.pruned, "prune_finished_first": w.finished, "ratio": ratio,
    });
    let window = w.bench.measured.elapsed.as_secs_f64();
    emit(json, &value, || {
        format!(
            "history: {written} ended attempts over {plans} plans, written in {fill_s:.1} s\n\
             deliveries/s alone          {:.0} ({} attempts, {} workers)\n\
             deliveries/s while pruning  {:.0} ({:.0} % of alone)\n\
             pruned meanwhile            {} attempts in {window:.1} s ({:.0}/s, batches of {DEFAULT_BATCH}){}\n",
            alone.deliveries_per_s,
            alone.attempts,
            alone.measured.workers,
            w.bench.deliveries_per_s,
            100.0 * ratio,
            w.pruned,
            w.pruned as f64 / window.max(1e-9),
            if w.finished {
                "; the prune ended before the deliveries"
            } else {
                ""
            },
        )
    });
    Ok(())
}
