//! `leasehold-sim`: run seeds of a fault profile and print a summary, or run one
//! seed and print its whole event trace.

use clap::Parser;
use leasehold_sim::bugs::Bug;
use leasehold_sim::db::BackendKind;
use leasehold_sim::profile::{Profile, BUILTIN};
use leasehold_sim::runner::{self, Batch};
use leasehold_sim::world::{self, RunConfig, RunReport};
use std::io::{IsTerminal, Write};
use std::ops::Range;
use std::process::ExitCode;

/// Deterministic simulations of leasehold's worker under crashes, partitions, clock
/// skew, lost replies and stale tokens.
#[derive(Debug, Parser)]
#[command(name = "leasehold-sim")]
struct Args {
    /// Seeds to run, `A..B` (B excluded).
    #[arg(long, default_value = "0..100", value_parser = parse_range)]
    seeds: Range<u64>,
    /// Run this one seed (overrides --seeds).
    #[arg(long)]
    seed: Option<u64>,
    /// A profile from scenarios/faults (or a path to a profile file); `all` runs every one.
    #[arg(long, default_value = "mixed")]
    profile: String,
    /// The db host's ledger: memory, sqlite or both.
    #[arg(long, default_value = "both")]
    backend: String,
    /// Print the whole event trace of each run (use with --seed).
    #[arg(long)]
    trace: bool,
    /// Worker threads (default: every core).
    #[arg(long)]
    threads: Option<usize>,
    /// Plant a bug (repeatable) to watch the checker catch it.
    #[arg(long = "bug")]
    bugs: Vec<String>,
}

fn parse_range(s: &str) -> Result<Range<u64>, String> {
    let (a, b) = s
        .split_once("..")
        .ok_or_else(|| format!("{s:?} is not a range like 0..1000"))?;
    let a: u64 = a.trim().parse().map_err(|e| format!("{a:?}: {e}"))?;
    let b: u64 = b.trim().parse().map_err(|e| format!("{b:?}: {e}"))?;
    if b <= a {
        return Err(format!("{s:?} is empty"));
    }
    Ok(a..b)
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("leasehold-sim: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Args) -> Result<bool, String> {
    let backends = backends_of(&args.backend)?;
    let bugs = bugs_of(&args.bugs)?;
    let profiles = profiles_of(&args.profile)?;
    if let Some(seed) = args.seed {
        let mut ok = true;
        for profile in &profiles {
            for backend in &backends {
                let config = RunConfig {
                    seed,
                    profile: profile.clone(),
                    backend: *backend,
                    bugs: bugs.clone(),
                    keep_trace: args.trace,
                };
                ok &= print_run(&config, &world::run(&config));
            }
        }
        return Ok(ok);
    }
    let threads = args.threads.unwrap_or_else(runner::default_threads);
    let mut ok = true;
    for profile in profiles {
        let batch = Batch {
            profile,
            backends: backends.clone(),
            seeds: args.seeds.clone(),
            bugs: bugs.clone(),
            threads,
        };
        ok &= run_batch(&batch);
    }
    Ok(ok)
}

fn backends_of(name: &str) -> Result<Vec<BackendKind>, String> {
    match name {
        "memory" => Ok(vec![BackendKind::Memory]),
        "sqlite" => Ok(vec![BackendKind::Sqlite]),
        "both" => Ok(BackendKind::ALL.to_vec()),
        other => Err(format!("unknown backend {other:?} (expected memory, sqlite or both)")),
    }
}

fn bugs_of(names: &[String]) -> Result<Vec<Bug>, String> {
    names
        .iter()
        .map(|b| {
            Bug::from_name(b).ok_or_else(|| {
                let known: Vec<&str> = Bug::ALL.iter().map(|b| b.name()).collect();
                format!("unknown bug {b:?} (known: {})", known.join(", "))
            })
        })
        .collect()
}

fn profiles_of(name: &str) -> Result<Vec<Profile>, String> {
    if name == "all" {
        BUILTIN.iter().map(|(n, _)| Profile::load(n)).collect()
    } else {
        Ok(vec![Profile::load(name)?])
    }
}

/// Prints one run: its trace (if kept), its summary line and its violations; answers
/// whether it passed.
fn print_run(config: &RunConfig, report: &RunReport) -> bool {
    let mut out = std::io::stdout().lock();
    for line in &report.trace {
        let _ = writeln!(out, "{line}");
    }
    let s = report.stats;
    let _ = writeln!(
        out,
        "seed {} profile {} backend {}: {} · trace {} · faults {} takeovers {} given back {} stale refused {} duplicates {}{} · attempts {} (succeeded {}, failed {} of which exhausted {}, aborted {}) · {:.1} s simulated",
        config.seed,
        config.profile.name,
        config.backend.name(),
        if report.violations.is_empty() { "PASS" } else { "FAIL" },
        report.trace_hash,
        s.faults,
        s.takeovers,
        s.gave_back,
        s.stale_refused,
        s.duplicates,
        if s.failovers > 0 {
            format!(" failovers {} commits lost {}", s.failovers, s.commits_lost)
        } else {
            String::new()
        },
        s.attempts,
        s.succeeded,
        s.failed,
        s.exhausted,
        s.aborted,
        s.sim_ms as f64 / 1000.0
    );
    for v in &report.violations {
        let _ = writeln!(out, "violation {v}");
    }
    report.violations.is_empty()
}

/// Runs a batch with a progress line on stderr, prints its summary and answers
/// whether every run passed.
fn run_batch(batch: &Batch) -> bool {
    let tty = std::io::stderr().is_terminal();
    let started = runner::wall_clock();
    let summary = runner::run_batch(batch, |done, total, failed| {
        if tty || done == total || done % 50 == 0 {
            let rate = done as f64 / started.elapsed().as_secs_f64().max(1e-9);
            let end = if done == total {
                "\n"
            } else if tty {
                "\r"
            } else {
                "\n"
            };
            eprint!(
                "[{done:>6}/{total}] {:>3}%  {rate:.1} sims/s  failed {failed}{end}",
                done * 100 / total.max(1)
            );
        }
    });
    print!("{}", summary.render());
    let passed = summary.failures().next().is_none();
    passed
}
