//! `--config FILE` (also `LEASEHOLD_CONFIG`): a deployment's settings in one TOML
//! file, and `leasehold config check|show` (see docs/configuration.md).
//!
//! Precedence: flags, then `LEASEHOLD_*` environment variables, then the file, then
//! the defaults. Clap stays the one definition of every setting: after the command
//! line is parsed, each file key whose flag was neither given nor set by its
//! variable ([`ValueSource`]) is added to the command line as that flag ([`FLAGS`]),
//! and the line is parsed again, so a file value passes the flag's own parser.
//! Before that, [`ConfigFile::load`] checks every key: known (the nearest known
//! name is suggested), of its type, in the range the flag clamps to, and parsed as
//! the flag parses it. Secrets are read by reference only (`{ env = "VAR" }`,
//! `{ file = "/path" }`); a database URL with its password in the file is allowed
//! but warned about.

mod keys;
mod show;

use super::{read_capped, Cli, Failure, Outcome};
use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches};
pub(super) use keys::db_password;
use keys::{FLAGS, KEYS};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use toml::Value;

/// The largest configuration file read.
const MAX_FILE_BYTES: u64 = 1 << 20;
/// The largest file a reference (`{ file = "/path" }`) may name.
const MAX_SECRET_FILE_BYTES: u64 = 64 * 1024;

/// `leasehold config check|show`.
#[derive(clap::Subcommand, Debug)]
pub(super) enum ConfigCommand {
    /// Check a configuration file: every key known, of its type and in range,
    /// secrets given by reference. One line per problem, naming the key; exit 2 on
    /// any error, 0 when the file is valid.
    Check {
        /// The file (default: --config, or LEASEHOLD_CONFIG).
        file: Option<PathBuf>,
    },
    /// Print the effective settings (flags, then LEASEHOLD_* variables, then the
    /// --config file, then defaults) as TOML, or JSON with --json, each with where
    /// it came from. Secrets are masked.
    Show {
        /// The command line whose settings to show, after `--`, e.g.
        /// `-- worker --lease-secs 30` (default: `serve`'s and `worker`'s).
        #[arg(last = true, value_name = "COMMAND")]
        args: Vec<String>,
    },
}

/// A configuration file, read and checked.
pub(super) struct ConfigFile {
    path: PathBuf,
    /// The value of each known key the file holds (those that passed their check).
    values: BTreeMap<&'static str, Value>,
    errors: Vec<String>,
    warnings: Vec<String>,
}

impl ConfigFile {
    /// Reads and checks `path`. An unreadable file, or one that is not TOML, is an
    /// error; each wrong key is a line of [`Self::errors`].
    fn load(path: &Path) -> Result<Self, Failure> {
        let name = path.display();
        let text = read_capped(path, MAX_FILE_BYTES)
            .map_err(|e| Failure::bad_input(format!("config file {name}: cannot read it: {e}")))?;
        let table: toml::Table = toml::from_str(&text)
            .map_err(|e| Failure::bad_input(format!("config file {name}: {}", super::toml_error(&text, &e))))?;
        let mut file = Self {
            path: path.to_owned(),
            values: BTreeMap::new(),
            errors: Vec::new(),
            warnings: Vec::new(),
        };
        for (key, value) in &table {
            match value {
                Value::Table(section) if keys::is_section(key) => {
                    for (inner, value) in section {
                        file.take(&format!("{key}.{inner}"), value);
                    }
                }
                _ => file.take(key, value),
            }
        }
        Ok(file)
    }

    /// Checks one key's value and keeps it, or records why not.
    fn take(&mut self, path: &str, value: &Value) {
        let Some((known, kind)) = KEYS.iter().find(|(k, _)| *k == path) else {
            self.errors.push(keys::unknown(path, value));
            return;
        };
        match kind.check(known, value).and_then(|warning| {
            keys::check_flag_parsers(known, value)?;
            Ok(warning)
        }) {
            Ok(warning) => {
                self.warnings.extend(warning);
                self.values.insert(known, value.clone());
            }
            Err(error) => self.errors.push(error),
        }
    }

    /// The file's errors as one failure (exit 2), if it has any.
    fn failure(&self) -> Result<(), Failure> {
        if self.errors.is_empty() {
            return Ok(());
        }
        Err(Failure::bad_input(format!(
            "config file {}: {}",
            self.path.display(),
            self.errors.join("; ")
        )))
    }

    /// The command-line arguments the file adds to `matches`: for each key of
    /// [`FLAGS`] whose flag `matches` left unset or at its default, that flag with
    /// the file's value. Answers them, global flags first, and the keys used.
    fn flag_args(&self, matches: &ArgMatches) -> Result<Added, Failure> {
        let mut added = Added::default();
        let sub = matches.subcommand();
        for (key, command, id) in FLAGS {
            let Some(value) = self.values.get(key) else { continue };
            let target = match (*command, sub) {
                ("", _) => matches,
                (c, Some((name, m))) if c == name => m,
                _ => continue,
            };
            if matches!(
                target.value_source(id),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            ) {
                continue;
            }
            let long = keys::long_flag(command, id);
            let args = if command.is_empty() {
                &mut added.global
            } else {
                &mut added.command
            };
            for text in keys::arg_texts(key, value)? {
                args.push(format!("--{long}={text}").into());
            }
            added.keys.insert(key);
        }
        Ok(added)
    }

    /// Sets each `http.secret_sources` variable the environment does not set from
    /// its reference, for the `http:v1` executor to read.
    fn export_secrets(&self) -> Outcome {
        let Some(Value::Table(sources)) = self.values.get("http.secret_sources") else {
            return Ok(());
        };
        for (name, reference) in sources {
            if std::env::var_os(name).is_some_and(|v| !v.is_empty()) {
                continue;
            }
            let value =
                read_reference(&format!("http.secret_sources.{name}"), reference).map_err(Failure::bad_input)?;
            // Before the runtime starts: this process has one thread.
            std::env::set_var(name, value);
        }
        Ok(())
    }
}

/// What a file adds to a command line.
#[derive(Default)]
struct Added {
    global: Vec<OsString>,
    command: Vec<OsString>,
    keys: BTreeSet<&'static str>,
}

/// A parsed command line and what the configuration file gave it.
pub(super) struct Resolved {
    pub(super) cli: Cli,
    matches: ArgMatches,
    file: Option<ConfigFile>,
    /// The file's keys that set a flag.
    from_file: BTreeSet<&'static str>,
}

/// Parses this process's command line, applying `--config` (clap prints help and
/// its own errors and exits).
pub(super) fn parse() -> Result<Cli, Failure> {
    let resolved = resolve(std::env::args_os().collect())?;
    if let Some(file) = &resolved.file {
        for warning in &file.warnings {
            errln!("warning: config file {}: {warning}", file.path.display());
        }
        if matches!(resolved.matches.subcommand_name(), Some("serve" | "worker")) {
            file.export_secrets()?;
        }
    }
    Ok(resolved.cli)
}

/// The clap command of the whole command line, with an environment variable for
/// each [`FLAGS`] flag that has none of its own: `LEASEHOLD_` and its key, upper
/// case, `.` as `_` (`serve.lease_secs`: `LEASEHOLD_SERVE_LEASE_SECS`).
pub(super) fn cli_command() -> clap::Command {
    let mut root = Cli::command();
    for (key, command, id) in FLAGS {
        let name = format!("LEASEHOLD_{}", key.replace('.', "_").to_uppercase());
        let with_env = |arg: clap::Arg| {
            if arg.get_env().is_some() {
                arg
            } else {
                arg.env(name.clone())
            }
        };
        root = match *command {
            "" => root.mut_arg(*id, with_env),
            sub => root.mut_subcommand(sub, |c| c.mut_arg(*id, with_env)),
        };
    }
    root
}

/// Parses `argv`, then parses it again with the flags the `--config` file adds
/// (none for `leasehold config …`, which reads the file itself).
fn resolve(argv: Vec<OsString>) -> Result<Resolved, Failure> {
    let matches = cli_command().try_get_matches_from(&argv).unwrap_or_else(|e| e.exit());
    let path = matches.get_one::<PathBuf>("config").cloned();
    let Some(path) = path.filter(|_| matches.subcommand_name() != Some("config")) else {
        return finish(matches, None, BTreeSet::new());
    };
    let file = ConfigFile::load(&path)?;
    file.failure()?;
    let added = file.flag_args(&matches)?;
    if added.keys.is_empty() {
        return finish(matches, Some(file), added.keys);
    }
    let mut argv = argv.into_iter();
    let line: Vec<OsString> = argv
        .next()
        .into_iter()
        .chain(added.global)
        .chain(argv)
        .chain(added.command)
        .collect();
    let matches = cli_command()
        .try_get_matches_from(line)
        .map_err(|e| Failure::bad_input(format!("config file {}: {}", path.display(), keys::clap_reason(&e))))?;
    finish(matches, Some(file), added.keys)
}

fn finish(
    matches: ArgMatches,
    file: Option<ConfigFile>,
    from_file: BTreeSet<&'static str>,
) -> Result<Resolved, Failure> {
    let cli = Cli::from_arg_matches(&matches).map_err(|e| Failure::bad_input(keys::clap_reason(&e)))?;
    Ok(Resolved {
        cli,
        matches,
        file,
        from_file,
    })
}

/// The text a reference names: `{ env = "VAR" }` or `{ file = "/path" }` (trimmed).
fn read_reference(key: &str, reference: &Value) -> Result<String, String> {
    let text = match keys::reference(reference) {
        Some(keys::Reference::Env(var)) => std::env::var(var)
            .ok()
            .filter(|v| !v.is_empty())
            .ok_or_else(|| format!("{key}: environment variable {var} is not set"))?,
        Some(keys::Reference::File(path)) => {
            read_capped(Path::new(path), MAX_SECRET_FILE_BYTES).map_err(|e| format!("{key}: file {path}: {e}"))?
        }
        None => return Err(format!("{key}: not a reference")),
    };
    Ok(text.trim().to_owned())
}

/// `leasehold config check|show`.
pub(super) fn run(command: &ConfigCommand, cli: &Cli) -> Outcome {
    match command {
        ConfigCommand::Check { file } => check(file.as_ref().or(cli.config.as_ref())),
        ConfigCommand::Show { args } => show::show(args, cli.json),
    }
}

/// `leasehold config check [FILE]`: every problem on a line of its own.
fn check(path: Option<&PathBuf>) -> Outcome {
    let path = path.ok_or_else(|| {
        Failure::bad_input("config check: no file given (name one, or use --config or LEASEHOLD_CONFIG)")
    })?;
    let file = ConfigFile::load(path)?;
    for warning in &file.warnings {
        errln!("warning: {warning}");
    }
    for error in &file.errors {
        errln!("error: {error}");
    }
    if !file.errors.is_empty() {
        errln!(
            "config file {}: {} error{}",
            path.display(),
            file.errors.len(),
            if file.errors.len() == 1 { "" } else { "s" }
        );
        return Err(Failure::silent(2));
    }
    outln!(
        "ok: {} ({} settings, {} warnings)",
        path.display(),
        file.values.len(),
        file.warnings.len()
    );
    Ok(())
}
