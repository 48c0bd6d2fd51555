//! `leasehold-model`: exhaustive model checking of the lease protocol.
//!
//! ```sh
//! cargo run --release -p leasehold-sim --bin leasehold-model -- --config large
//! cargo run --release -p leasehold-sim --bin leasehold-model -- --config large --recovery replay
//! cargo run --release -p leasehold-sim --bin leasehold-model -- --config small --bug late-heartbeat
//! ```
//!
//! Prints, for each configuration (one per recovery mode), the states explored, the
//! time, and the shortest counterexample if an invariant breaks; exits 1 if one does.

use leasehold_sim::bugs::Bug;
use leasehold_sim::model::{self, Config};
use std::process::ExitCode;

fn parse(args: &[String]) -> Result<(Vec<Config>, Vec<Bug>), String> {
    let mut configs = Config::named("small").unwrap_or_default();
    let mut bugs = Vec::new();
    let mut it = args.iter();
    let mut progress = false;
    while let Some(arg) = it.next() {
        if arg == "--progress" {
            progress = true;
            continue;
        }
        let value = it.next().ok_or_else(|| format!("{arg}: a value is missing"))?;
        match arg.as_str() {
            "--config" => {
                configs = Config::named(value)
                    .ok_or_else(|| format!("--config: {value:?} is not one of {}", Config::NAMES.join(", ")))?;
            }
            "--max-states" => {
                let n = value
                    .parse()
                    .map_err(|_| format!("--max-states: {value:?} is not a count"))?;
                configs.iter_mut().for_each(|c| c.max_states = n);
            }
            "--horizon" => {
                let n = value
                    .parse()
                    .map_err(|_| format!("--horizon: {value:?} is not a tick"))?;
                configs.iter_mut().for_each(|c| c.horizon = n);
            }
            "--recovery" => {
                let mode: leasehold_engine::Recovery = value
                    .parse()
                    .map_err(|_| format!("--recovery: {value:?} is not resume or replay"))?;
                configs.retain(|c| c.recovery == mode);
            }
            "--bug" => bugs.push(Bug::from_name(value).ok_or_else(|| format!("--bug: no planted bug {value:?}"))?),
            other => {
                return Err(format!(
                    "{other}: unknown option (use --config, --recovery, --bug, --max-states, --horizon, --progress)"
                ))
            }
        }
    }
    configs.iter_mut().for_each(|c| c.progress = progress);
    Ok((configs, bugs))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (configs, bugs) = match parse(&args) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let mut broken = false;
    for config in configs {
        let report = model::check(&config.with_bugs(&bugs));
        print!("{report}");
        broken |= report.counterexample.is_some();
    }
    if broken {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
