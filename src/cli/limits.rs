//! `leasehold limits set|list|clear|apply`: the operator's hand on per-target limits
//! ([`leasehold_engine::limits`]). Every value is checked before anything is
//! written, and a refusal names the flag (or, in a file, the target and the field)
//! and the reason. `apply` reads a TOML file of targets and checks every entry
//! before it sets any.

use super::{emit, read_capped, Failure, Outcome};
use leasehold::ledger::limits::TargetRow;
use leasehold::ledger::Ledger;
use leasehold::serve::when::parse_duration_ms;
use leasehold::text::clean;
use leasehold_engine::limits::{
    Breaker, BreakerState, Rate, TargetLimit, BREAKER_FAILURES_MAX, COOLDOWN_MS_MAX, MAX_IN_FLIGHT_MAX,
};
use leasehold_engine::Timestamp;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// A breaker's cool-down when only its threshold is given (the API's).
const COOLDOWN_DEFAULT_MS: u64 = leasehold::serve::api::LIMIT_COOLDOWN_DEFAULT_MS;

/// The largest limits file `apply` reads.
const LIMITS_FILE_MAX_BYTES: u64 = 1 << 20;

/// `leasehold limits …`.
#[derive(clap::Subcommand, Debug)]
pub(super) enum LimitsCommand {
    /// Set a target's limits, replacing any it had (a limit not given is removed).
    Set(SetArgs),
    /// List every limited target: its limits, its leases in flight and its breaker
    /// (with --json: `{"limits": [...], "now": ms}`).
    List,
    /// Remove a target's limits (says whether it had any).
    Clear {
        /// The target: `http://HOST:PORT` for an http:v1 step, else the step's
        /// target or its executor's name.
        target: String,
    },
    /// Set the limits of every target a TOML file lists; every entry is checked
    /// before any is written. Targets the file does not list are left as they are.
    Apply {
        /// The file: `[targets."http://crm.example:80"]` tables with
        /// `max_in_flight`, `rate`, `breaker_failures` and `breaker_cooldown`.
        file: PathBuf,
    },
}

/// `leasehold limits set`'s arguments.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Setting REPLACES the target's limits: a limit whose flag is not given is removed \
(`limits set T --rate 10/s` on a target that had --max-in-flight 2 leaves it with the rate only). \
At least one limit flag is required. An unknown target is created on first use. A limit applies to \
entries that begin after it is set. See docs/limits.md."
)]
pub(super) struct SetArgs {
    /// The target: `http://HOST:PORT` for an http:v1 step, else the step's target
    /// or its executor's name.
    target: String,
    /// Most leases running the target's steps at once (at least 1).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    max_in_flight: Option<i64>,
    /// Most entries onto the target in any window: N/s, N/m or N/h.
    #[arg(long, value_name = "N/s|N/m|N/h", allow_hyphen_values = true)]
    rate: Option<String>,
    /// Consecutive transient failures (give-backs) that open the target's breaker.
    #[arg(long, value_name = "K", allow_negative_numbers = true)]
    breaker_failures: Option<i64>,
    /// How long an open breaker refuses entries before it lets one probe through:
    /// 500ms, 30s, 5m, 1h (default 30s; needs --breaker-failures).
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    breaker_cooldown: Option<String>,
}

/// One target's limits as given, before they are checked; `name` spells a field
/// as its source does (a flag, or a file's key).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Given {
    max_in_flight: Option<i64>,
    rate: Option<String>,
    breaker_failures: Option<i64>,
    breaker_cooldown: Option<String>,
}

/// How a source spells the fields of [`Given`].
struct Names {
    max_in_flight: &'static str,
    rate: &'static str,
    breaker_failures: &'static str,
    breaker_cooldown: &'static str,
}

const FLAGS: Names = Names {
    max_in_flight: "--max-in-flight",
    rate: "--rate",
    breaker_failures: "--breaker-failures",
    breaker_cooldown: "--breaker-cooldown",
};

const KEYS: Names = Names {
    max_in_flight: "max_in_flight",
    rate: "rate",
    breaker_failures: "breaker_failures",
    breaker_cooldown: "breaker_cooldown",
};

/// A whole number from 1 to `max`; the error names `field`.
fn count(field: &str, n: i64, max: u32) -> Result<u32, String> {
    if n < 1 {
        return Err(format!("{field}: must be at least 1, not {n}"));
    }
    u32::try_from(n)
        .ok()
        .filter(|n| *n <= max)
        .ok_or_else(|| format!("{field}: must be at most {max}, not {n}"))
}

impl Given {
    /// The limit of `target` these values make, or the first bad one, named as
    /// `names` spells it.
    fn limit(&self, target: &str, names: &Names) -> Result<TargetLimit, String> {
        if self.max_in_flight.is_none()
            && self.rate.is_none()
            && self.breaker_failures.is_none()
            && self.breaker_cooldown.is_none()
        {
            return Err(format!(
                "give at least one of {}, {}, {} (with {})",
                names.max_in_flight, names.rate, names.breaker_failures, names.breaker_cooldown
            ));
        }
        let max_in_flight = self
            .max_in_flight
            .map(|n| count(names.max_in_flight, n, MAX_IN_FLIGHT_MAX))
            .transpose()?;
        let rate = self
            .rate
            .as_deref()
            .map(|r| Rate::parse(r).map_err(|e| format!("{}: {e}", names.rate)))
            .transpose()?;
        let breaker = self.breaker(names)?;
        let limit = TargetLimit {
            target: target.to_owned(),
            max_in_flight,
            rate,
            breaker,
        };
        limit.validate()?;
        Ok(limit)
    }

    /// The breaker: a threshold, and a cool-down (default [`COOLDOWN_DEFAULT_MS`]).
    fn breaker(&self, names: &Names) -> Result<Option<Breaker>, String> {
        let Some(failures) = self.breaker_failures else {
            return match self.breaker_cooldown {
                Some(_) => Err(format!("{}: needs {}", names.breaker_cooldown, names.breaker_failures)),
                None => Ok(None),
            };
        };
        let failures = count(names.breaker_failures, failures, BREAKER_FAILURES_MAX)?;
        let cooldown_ms = match self.breaker_cooldown.as_deref() {
            Some(text) => parse_duration_ms(text).map_err(|e| format!("{}: {e}", names.breaker_cooldown))?,
            None => COOLDOWN_DEFAULT_MS,
        };
        if cooldown_ms == 0 || cooldown_ms > COOLDOWN_MS_MAX {
            return Err(format!(
                "{}: must be 1 ms to {} h, not {cooldown_ms} ms",
                names.breaker_cooldown,
                COOLDOWN_MS_MAX / 3_600_000
            ));
        }
        Ok(Some(Breaker { failures, cooldown_ms }))
    }
}

/// Runs a `limits` command.
pub(super) async fn run<L: Ledger>(ledger: &L, command: LimitsCommand, json: bool) -> Outcome {
    match command {
        LimitsCommand::Set(args) => set(ledger, args, json).await,
        LimitsCommand::List => list(ledger, json).await,
        LimitsCommand::Clear { target } => {
            let cleared = ledger.clear_limit(&target).await?;
            let value = serde_json::json!({ "target": target, "cleared": cleared });
            emit(json, &value, || {
                let target = clean(&target);
                if cleared {
                    format!("cleared the limits of {target}\n")
                } else {
                    format!("{target} had no limits\n")
                }
            });
            Ok(())
        }
        LimitsCommand::Apply { file } => apply(ledger, &file, json).await,
    }
}

/// `leasehold limits set TARGET …`.
async fn set<L: Ledger>(ledger: &L, args: SetArgs, json: bool) -> Outcome {
    let given = Given {
        max_in_flight: args.max_in_flight,
        rate: args.rate,
        breaker_failures: args.breaker_failures,
        breaker_cooldown: args.breaker_cooldown,
    };
    let limit = given.limit(&args.target, &FLAGS).map_err(Failure::bad_input)?;
    ledger.set_limit(limit.clone()).await?;
    emit(json, &limit, || format!("set the limits of {}\n", summary(&limit)));
    Ok(())
}

/// A limit on one line: `http://crm.example:80: max in flight 2, rate 50/s, …`.
fn summary(limit: &TargetLimit) -> String {
    let mut parts = Vec::new();
    if let Some(n) = limit.max_in_flight {
        parts.push(format!("max in flight {n}"));
    }
    if let Some(r) = limit.rate {
        parts.push(format!("rate {r}"));
    }
    if let Some(b) = limit.breaker {
        parts.push(format!("breaker {}", breaker(&b)));
    }
    format!("{}: {}", clean(&limit.target), parts.join(", "))
}

/// `5 failures, 30 s`.
fn breaker(b: &Breaker) -> String {
    format!("{} failures, {}", b.failures, super::when::span(b.cooldown_ms))
}

/// `leasehold limits list`.
async fn list<L: Ledger>(ledger: &L, json: bool) -> Outcome {
    let (rows, now) = ledger.limits().await?;
    let value = serde_json::json!({ "limits": rows, "now": now });
    emit(json, &value, || table(&rows, now));
    Ok(())
}

/// The rows as a table (TARGET, MAX IN FLIGHT, IN FLIGHT, RATE, BREAKER, STATE).
fn table(rows: &[TargetRow], now: Timestamp) -> String {
    if rows.is_empty() {
        return "no target has limits\n".to_owned();
    }
    let head = ["TARGET", "MAX IN FLIGHT", "IN FLIGHT", "RATE", "BREAKER", "STATE"];
    let cells: Vec<[String; 6]> = rows.iter().map(|r| cells(r, now)).collect();
    let mut widths = head.map(str::len);
    for row in &cells {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |values: &[&str]| {
        let padded: Vec<String> = values.iter().zip(widths).map(|(v, w)| format!("{v:<w$}")).collect();
        let _ = writeln!(out, "{}", padded.join("  ").trim_end());
    };
    line(&head);
    for row in &cells {
        line(&row.each_ref().map(String::as_str));
    }
    out
}

/// One row's cells, terminal-safe.
fn cells(r: &TargetRow, now: Timestamp) -> [String; 6] {
    let dash = || "-".to_owned();
    let rate = r
        .limit
        .rate
        .map_or_else(dash, |rate| format!("{rate} ({} in window)", r.recent));
    let state = match (r.limit.breaker, r.breaker_state, r.open_until) {
        (None, ..) => dash(),
        (Some(_), BreakerState::Open, Some(until)) => format!(
            "open until {} (in {})",
            until.to_rfc3339(),
            super::when::span(until.millis_since(now))
        ),
        (Some(_), state, _) => format!("{} ({} failures)", state.as_str(), r.failures),
    };
    [
        clean(&r.limit.target).into_owned(),
        r.limit.max_in_flight.map_or_else(dash, |n| n.to_string()),
        r.in_flight.to_string(),
        rate,
        r.limit.breaker.as_ref().map_or_else(dash, breaker),
        state,
    ]
}

/// A limits file: `[targets."TARGET"]` tables.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsFile {
    #[serde(default)]
    targets: BTreeMap<String, Given>,
}

/// Every limit `text` sets, checked; the error names the file's target and field.
fn parse_file(text: &str) -> Result<Vec<TargetLimit>, String> {
    let file: LimitsFile = toml::from_str(text).map_err(|e| super::toml_error(text, &e))?;
    if file.targets.is_empty() {
        return Err("no [targets.\"TARGET\"] table: nothing to apply".into());
    }
    file.targets
        .iter()
        .map(|(target, given)| {
            given
                .limit(target, &KEYS)
                .map_err(|e| format!("target {:?}: {e}", clean(target)))
        })
        .collect()
}

/// `leasehold limits apply FILE`: every entry checked, then each set.
async fn apply<L: Ledger>(ledger: &L, file: &Path, json: bool) -> Outcome {
    let name = file.display();
    let text =
        read_capped(file, LIMITS_FILE_MAX_BYTES).map_err(|e| Failure::bad_input(format!("limits file {name}: {e}")))?;
    let limits = parse_file(&text).map_err(|e| Failure::bad_input(format!("limits file {name}: {e}")))?;
    for limit in &limits {
        ledger.set_limit(limit.clone()).await?;
    }
    emit(json, &serde_json::json!({ "applied": limits }), || {
        let mut out = String::new();
        for limit in &limits {
            let _ = writeln!(out, "set the limits of {}", summary(limit));
        }
        out
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn given(max: Option<i64>, rate: Option<&str>, failures: Option<i64>, cooldown: Option<&str>) -> Given {
        Given {
            max_in_flight: max,
            rate: rate.map(str::to_owned),
            breaker_failures: failures,
            breaker_cooldown: cooldown.map(str::to_owned),
        }
    }

    #[test]
    fn flags_make_a_limit_and_a_breaker_defaults_its_cooldown() {
        let limit = given(Some(2), Some("50/s"), Some(5), None)
            .limit("http://crm.example:80", &FLAGS)
            .unwrap();
        assert_eq!(limit.max_in_flight, Some(2));
        assert_eq!(
            limit.rate,
            Some(Rate {
                count: 50,
                per_ms: 1_000
            })
        );
        assert_eq!(
            limit.breaker,
            Some(Breaker {
                failures: 5,
                cooldown_ms: COOLDOWN_DEFAULT_MS
            })
        );
        let limit = given(None, None, Some(1), Some("500ms")).limit("t", &FLAGS).unwrap();
        assert_eq!(limit.breaker.map(|b| b.cooldown_ms), Some(500));
    }

    #[test]
    fn bad_values_are_refused_naming_the_flag() {
        for (g, expected) in [
            (
                given(Some(0), None, None, None),
                "--max-in-flight: must be at least 1, not 0",
            ),
            (
                given(Some(-3), None, None, None),
                "--max-in-flight: must be at least 1, not -3",
            ),
            (given(None, Some("fast"), None, None), "--rate: "),
            (
                given(None, None, Some(0), None),
                "--breaker-failures: must be at least 1, not 0",
            ),
            (given(None, None, Some(2), Some("soon")), "--breaker-cooldown: "),
            (
                given(None, None, Some(2), Some("2d")),
                "--breaker-cooldown: must be 1 ms to 24 h",
            ),
            (
                given(None, None, None, Some("30s")),
                "--breaker-cooldown: needs --breaker-failures",
            ),
            (given(None, None, None, None), "give at least one of --max-in-flight"),
        ] {
            let e = g.limit("t", &FLAGS).unwrap_err();
            assert!(e.starts_with(expected), "{e}");
        }
        let e = given(Some(1), None, None, None).limit(" t", &FLAGS).unwrap_err();
        assert!(e.starts_with("target: "), "{e}");
    }

    #[test]
    fn a_file_is_read_whole_and_its_errors_name_the_target_and_field() {
        let limits = parse_file(
            "[targets.\"http://crm.example:80\"]\nmax_in_flight = 2\nrate = \"50/s\"\n\
             breaker_failures = 5\nbreaker_cooldown = \"30s\"\n[targets.mail]\nrate = \"10/m\"\n",
        )
        .unwrap();
        assert_eq!(limits.len(), 2);
        assert_eq!(limits[0].target, "http://crm.example:80");
        assert_eq!(
            limits[1].rate,
            Some(Rate {
                count: 10,
                per_ms: 60_000
            })
        );
        let e = parse_file("[targets.a]\nmax_in_flight = 1\n[targets.b]\nmax_in_flight = 0\n").unwrap_err();
        assert_eq!(e, "target \"b\": max_in_flight: must be at least 1, not 0");
        let e = parse_file("[targets.a]\nmax_in_flight = 1\nburst = 3\n").unwrap_err();
        assert!(e.starts_with("line 3: unknown field `burst`"), "{e}");
        assert!(parse_file("").unwrap_err().contains("nothing to apply"));
    }
}
