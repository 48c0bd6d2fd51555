//! The keys of a configuration file: what each holds, how it is checked, and which
//! flag of which command it sets.

use super::super::{bounds, check_name, when};
use leasehold::executor::http::{is_secret_name, AllowedHost, SecretBinding};
use leasehold::ledger::prune::MAX_BATCH;
use leasehold::ledger::DbUrl;
use leasehold_engine::lease;
use leasehold_engine::AttemptStatus;
use toml::Value;

/// What a key holds, and how it is checked.
#[derive(Clone, Copy, Debug)]
pub(super) enum Kind {
    /// An integer in a range: the range its flag clamps to.
    Int(i64, i64),
    /// A string, checked further by its flag's parser.
    Text,
    /// A name: a worker id.
    Name,
    /// A list of names: queues.
    Names,
    /// A list of `HOST[:PORT]`: the `http:v1` allowlist.
    Hosts,
    /// A list of origins, `http(s)://HOST[:PORT]`.
    Origins,
    /// A duration longer than zero, such as `30d` or `1h`.
    Duration,
    /// A list of the states a finished attempt has.
    States,
    /// The database URL, or a reference to where it is.
    Db,
    /// `LEASEHOLD_SECRET_NAME = "HOST[:PORT]"` (or a list of hosts).
    Bindings,
    /// `LEASEHOLD_SECRET_NAME = { env = "VAR" }` or `{ file = "/path" }`.
    Sources,
}

/// A count of seconds within `(min, max)`.
const fn secs((min, max): (u64, u64)) -> Kind {
    Kind::Int(min as i64, max as i64)
}

/// A worker's batch, within the engine's clamp.
const BATCH: Kind = Kind::Int(lease::BATCH_SIZE_MIN as i64, lease::BATCH_SIZE_MAX as i64);

/// A step's evidence bytes, within the engine's clamp.
const EVIDENCE_BYTES: Kind = Kind::Int(lease::EVIDENCE_BYTES_MIN as i64, lease::EVIDENCE_BYTES_MAX as i64);

/// Every key a file may hold.
pub(super) const KEYS: &[(&str, Kind)] = &[
    ("db", Kind::Db),
    ("serve.listen", Kind::Text),
    ("serve.metrics_listen", Kind::Text),
    ("serve.workers", Kind::Int(0, u32::MAX as i64)),
    ("serve.log_format", Kind::Text),
    ("serve.lease_secs", secs(bounds::LEASE_SECS)),
    ("serve.poll_secs", secs(bounds::POLL_SECS)),
    ("serve.batch", BATCH),
    ("serve.grace_secs", secs(bounds::GRACE_SECS)),
    ("serve.step_timeout_secs", secs(bounds::STEP_TIMEOUT_SECS)),
    ("serve.max_evidence_bytes", EVIDENCE_BYTES),
    ("serve.public_origins", Kind::Origins),
    (
        "serve.max_connections",
        Kind::Int(bounds::MAX_CONNECTIONS.0 as i64, bounds::MAX_CONNECTIONS.1 as i64),
    ),
    ("worker.id", Kind::Name),
    ("worker.lease_secs", secs(bounds::LEASE_SECS)),
    ("worker.poll_secs", secs(bounds::POLL_SECS)),
    ("worker.batch", BATCH),
    ("worker.grace_secs", secs(bounds::GRACE_SECS)),
    ("worker.step_timeout_secs", secs(bounds::STEP_TIMEOUT_SECS)),
    ("worker.max_evidence_bytes", EVIDENCE_BYTES),
    ("worker.queues", Kind::Names),
    ("http.allow", Kind::Hosts),
    ("http.secrets", Kind::Bindings),
    ("http.secret_sources", Kind::Sources),
    ("retention.finished_before", Kind::Duration),
    ("retention.states", Kind::States),
    ("retention.every", Kind::Duration),
    ("retention.archive_dir", Kind::Text),
    ("retention.batch", Kind::Int(1, MAX_BATCH as i64)),
    ("traces.otlp_endpoint", Kind::Text),
];

/// The flag each key sets, `(key, command, clap argument id)`; command `""` is a
/// global flag. A key sets its flag when the command line and the environment
/// leave it unset. A key not listed (`http.secret_sources`) is read
/// from the file alone.
pub(super) const FLAGS: &[(&str, &str, &str)] = &[
    ("db", "", "db"),
    ("serve.listen", "serve", "listen"),
    ("serve.metrics_listen", "serve", "metrics_listen"),
    ("serve.workers", "serve", "workers"),
    ("serve.log_format", "serve", "log_format"),
    ("serve.lease_secs", "serve", "lease_secs"),
    ("serve.poll_secs", "serve", "poll_secs"),
    ("serve.batch", "serve", "batch"),
    ("serve.grace_secs", "serve", "grace_secs"),
    ("serve.step_timeout_secs", "serve", "step_timeout_secs"),
    ("serve.max_evidence_bytes", "serve", "max_evidence_bytes"),
    ("serve.public_origins", "serve", "public_origins"),
    ("serve.max_connections", "serve", "max_connections"),
    ("worker.id", "worker", "id"),
    ("worker.lease_secs", "worker", "lease_secs"),
    ("worker.poll_secs", "worker", "poll_secs"),
    ("worker.batch", "worker", "batch"),
    ("worker.grace_secs", "worker", "grace_secs"),
    ("worker.step_timeout_secs", "worker", "step_timeout_secs"),
    ("worker.max_evidence_bytes", "worker", "max_evidence_bytes"),
    ("worker.queues", "worker", "queues"),
    ("http.allow", "serve", "allow"),
    ("http.allow", "worker", "allow"),
    ("http.secrets", "serve", "secrets"),
    ("http.secrets", "worker", "secrets"),
    // One process prunes: `serve` (a fleet of workers shares the file).
    ("retention.finished_before", "serve", "prune_finished_before"),
    ("retention.every", "serve", "prune_every"),
    ("retention.archive_dir", "serve", "prune_archive_dir"),
    ("retention.states", "serve", "prune_states"),
    ("retention.batch", "serve", "prune_batch"),
    ("traces.otlp_endpoint", "serve", "otlp_endpoint"),
    ("traces.otlp_endpoint", "worker", "otlp_endpoint"),
];

/// The sections of a file: `[serve]`, `[worker]`, `[http]`, `[retention]`.
pub(super) fn is_section(name: &str) -> bool {
    KEYS.iter()
        .any(|(k, _)| k.split_once('.').is_some_and(|(s, _)| s == name))
}

/// The kind of a known key.
fn kind_of(key: &str) -> Option<Kind> {
    KEYS.iter().find(|(k, _)| *k == key).map(|(_, kind)| *kind)
}

/// The message for a key no file may hold, with the nearest known name.
pub(super) fn unknown(path: &str, value: &Value) -> String {
    if is_section(path) {
        return format!("{path}: expected a table ([{path}]), found {}", value.type_str());
    }
    let (what, candidates): (&str, Vec<String>) = match (path.contains('.'), value) {
        (false, Value::Table(_)) => (
            "unknown section",
            KEYS.iter()
                .filter_map(|(k, _)| Some(k.split_once('.')?.0.to_owned()))
                .collect(),
        ),
        _ => ("unknown key", KEYS.iter().map(|(k, _)| (*k).to_owned()).collect()),
    };
    let nearest = candidates
        .iter()
        .map(|c| (strsim::levenshtein(path, c), c))
        .min()
        .filter(|(distance, _)| *distance <= 3.max(path.len() / 4));
    match nearest {
        Some((_, name)) => format!("{path}: {what}; did you mean {name}?"),
        None => format!("{path}: {what}"),
    }
}

/// Where a secret is read from.
pub(super) enum Reference<'a> {
    Env(&'a str),
    File(&'a str),
}

/// `{ env = "VAR" }` or `{ file = "/path" }`, with a value that is not empty.
pub(super) fn reference(value: &Value) -> Option<Reference<'_>> {
    let Value::Table(table) = value else { return None };
    let mut entries = table.iter();
    let (key, value) = entries.next().filter(|_| table.len() == 1)?;
    let text = value.as_str().filter(|t| !t.trim().is_empty())?;
    match key.as_str() {
        "env" => Some(Reference::Env(text)),
        "file" => Some(Reference::File(text)),
        _ => None,
    }
}

/// The message for a value that should be a reference and is not.
fn not_a_reference(key: &str, value: &Value) -> String {
    let what = match value {
        Value::String(_) => "given inline".to_owned(),
        other => format!("a {}", other.type_str()),
    };
    format!("{key}: {what}; a secret is given by reference only, {{ env = \"VAR\" }} or {{ file = \"/path\" }}")
}

/// The strings of a list.
fn strings<'a>(key: &str, value: &'a Value) -> Result<Vec<&'a str>, String> {
    let wrong = || format!("{key}: expected a list of strings, found {}", value.type_str());
    let items = value.as_array().ok_or_else(wrong)?;
    items.iter().map(|v| v.as_str().ok_or_else(wrong)).collect()
}

/// The password of a database URL, if it has one.
pub(in crate::cli) fn db_password(url: &str) -> Option<String> {
    match DbUrl::parse(url).ok()? {
        DbUrl::Mysql(url) => url.expose_password().map(str::to_owned),
        DbUrl::Postgres(url) => url
            .config()
            .get_password()
            .map(|p| String::from_utf8_lossy(p).into_owned()),
        DbUrl::Sqlite(_) => None,
    }
}

impl Kind {
    /// Checks `value` as the value of `key`: the error, or a warning, is a line that
    /// names the key (never a secret's value).
    pub(super) fn check(self, key: &str, value: &Value) -> Result<Option<String>, String> {
        let wrong = |expected: &str| format!("{key}: expected {expected}, found {}", value.type_str());
        match self {
            Kind::Int(min, max) => {
                let n = value.as_integer().ok_or_else(|| wrong("an integer"))?;
                if !(min..=max).contains(&n) {
                    return Err(format!("{key}: {n} is out of range {min}..={max}"));
                }
            }
            Kind::Text => {
                let text = value.as_str().ok_or_else(|| wrong("a string"))?;
                if text.trim().is_empty() {
                    return Err(format!("{key}: must not be empty"));
                }
            }
            Kind::Name => check_name(key, value.as_str().ok_or_else(|| wrong("a string"))?).map_err(|f| f.message)?,
            Kind::Names => {
                for name in strings(key, value)? {
                    check_name(key, name).map_err(|f| f.message)?;
                }
            }
            Kind::Hosts => {
                for host in strings(key, value)? {
                    AllowedHost::parse(host)
                        .map_err(|e| format!("{key}: {}", e.trim_start_matches("--http-allow ")))?;
                }
            }
            Kind::Origins => {
                leasehold::listener::AllowedHosts::from_origins(key, strings(key, value)?)?;
            }
            Kind::Duration => check_duration(key, value.as_str().ok_or_else(|| wrong("a duration such as \"30d\""))?)?,
            Kind::States => check_states(key, value)?,
            Kind::Db => return check_db(key, value),
            Kind::Bindings => check_bindings(key, value)?,
            Kind::Sources => check_sources(key, value)?,
        }
        Ok(None)
    }
}

/// A duration longer than zero.
fn check_duration(key: &str, text: &str) -> Result<(), String> {
    let duration = when::parse_duration(key, text).map_err(|f| f.message)?;
    if duration.is_zero() {
        return Err(format!("{key}: must be longer than zero"));
    }
    Ok(())
}

/// A list of finished states, not empty.
fn check_states(key: &str, value: &Value) -> Result<(), String> {
    let states = strings(key, value)?;
    if states.is_empty() {
        return Err(format!("{key}: must name at least one state"));
    }
    for state in states {
        if !state.parse::<AttemptStatus>().is_ok_and(AttemptStatus::is_terminal) {
            return Err(format!(
                "{key}: {state:?} is not the state of a finished attempt (SUCCEEDED, FAILED or ABORTED)"
            ));
        }
    }
    Ok(())
}

/// A database URL (warned about when it holds a password) or a reference.
fn check_db(key: &str, value: &Value) -> Result<Option<String>, String> {
    let Some(url) = value.as_str() else {
        return match reference(value) {
            Some(_) => Ok(None),
            None => Err(format!(
                "{key}: expected a database URL, {{ env = \"VAR\" }} or {{ file = \"/path\" }}, found {}",
                value.type_str()
            )),
        };
    };
    DbUrl::parse(url).map_err(|e| format!("{key}: {}", e.to_string().trim_start_matches("--db: ")))?;
    Ok(db_password(url).map(|_| {
        format!(
            "{key}: the URL holds a password in this file; prefer db = {{ env = \"LEASEHOLD_DB\" }} or \
             db = {{ file = \"/etc/leasehold/db.url\" }} (a file only the service reads)"
        )
    }))
}

/// The entries of a table keyed by secret variables, each with its path; refuses
/// a key that is not a secret variable's name.
fn secret_entries<'a>(key: &str, value: &'a Value) -> Result<Vec<(String, &'a str, &'a Value)>, String> {
    let table = value
        .as_table()
        .ok_or_else(|| format!("{key}: expected a table, found {}", value.type_str()))?;
    table
        .iter()
        .map(|(name, entry)| {
            let at = format!("{key}.{name}");
            if !is_secret_name(name) {
                return Err(format!(
                    "{at}: not the name of a secret variable (LEASEHOLD_SECRET_[A-Z0-9_]*)"
                ));
            }
            Ok((at, name.as_str(), entry))
        })
        .collect()
}

/// `LEASEHOLD_SECRET_NAME = "HOST[:PORT]"` or a list of hosts.
fn check_bindings(key: &str, value: &Value) -> Result<(), String> {
    for (at, name, hosts) in secret_entries(key, value)? {
        let hosts = match hosts {
            Value::String(host) => vec![host.as_str()],
            _ => strings(&at, hosts)?,
        };
        if hosts
            .iter()
            .any(|h| SecretBinding::parse(&format!("{name}={h}")).is_err())
        {
            return Err(format!(
                "{at}: expected HOST or HOST:PORT, or a list of them (the hosts the secret may be sent to; \
                 its value is given in http.secret_sources, by reference)"
            ));
        }
    }
    Ok(())
}

/// `LEASEHOLD_SECRET_NAME = { env = "VAR" }` or `{ file = "/path" }`.
fn check_sources(key: &str, value: &Value) -> Result<(), String> {
    for (at, _, source) in secret_entries(key, value)? {
        if reference(source).is_none() {
            return Err(not_a_reference(&at, source));
        }
    }
    Ok(())
}

/// A key's value as its flag's values on a command line (a database reference
/// read).
pub(super) fn arg_texts(key: &str, value: &Value) -> Result<Vec<String>, super::Failure> {
    let texts = match (kind_of(key), value) {
        (Some(Kind::Db), Value::Table(_)) => {
            vec![super::read_reference(key, value).map_err(super::Failure::bad_input)?]
        }
        (Some(Kind::Bindings), Value::Table(table)) => table
            .iter()
            .flat_map(|(name, hosts)| {
                let hosts: Vec<&str> = match hosts {
                    Value::String(h) => vec![h.as_str()],
                    other => strings(key, other).unwrap_or_default(),
                };
                hosts.into_iter().map(move |h| format!("{name}={h}"))
            })
            .collect(),
        (_, Value::Array(items)) => items.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
        (_, Value::String(text)) => vec![text.clone()],
        (_, other) => vec![other.to_string()],
    };
    Ok(texts)
}

/// The clap command of a `FLAGS` command (`""`: the root), built once.
fn command_of(command: &str) -> &'static clap::Command {
    static ROOT: std::sync::OnceLock<clap::Command> = std::sync::OnceLock::new();
    let root = ROOT.get_or_init(|| {
        let mut root = super::cli_command();
        root.build();
        root
    });
    match command {
        "" => root,
        name => root.find_subcommand(name).unwrap_or(root),
    }
}

/// The long name of a clap argument.
pub(super) fn long_flag(command: &str, id: &str) -> String {
    let cmd = command_of(command);
    let arg = cmd.get_arguments().find(|a| a.get_id() == id);
    arg.and_then(clap::Arg::get_long).unwrap_or(id).to_owned()
}

/// Runs `value` through the parser of each flag `key` sets (parsing the flag on
/// its own command): the flags' own check.
pub(super) fn check_flag_parsers(key: &str, value: &Value) -> Result<(), String> {
    if value.is_table() && matches!(kind_of(key), Some(Kind::Db)) {
        return Ok(());
    }
    for (_, command, id) in FLAGS.iter().filter(|(k, _, _)| *k == key) {
        let long = long_flag(command, id);
        for text in arg_texts(key, value).map_err(|f| f.message)? {
            command_of(command)
                .clone()
                .subcommand_required(false)
                .no_binary_name(true)
                .try_get_matches_from([format!("--{long}={text}")])
                .map_err(|e| format!("{key}: {}", clap_reason(&e)))?;
        }
    }
    Ok(())
}

/// A clap error as one line, without its usage and help hints.
pub(super) fn clap_reason(e: &clap::Error) -> String {
    let rendered = e.render().to_string();
    let lines: Vec<&str> = rendered
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .map(|l| l.strip_prefix("error: ").unwrap_or(l))
        .collect();
    lines.join(" ")
}

/// A database URL with its password masked.
pub(in crate::cli) fn mask_db_url(url: &str) -> String {
    let mut masked = url.to_owned();
    if let Some((scheme, rest)) = url.split_once("://") {
        let authority = rest.split(['/', '?']).next().unwrap_or(rest);
        if let Some((user, _)) = authority.rsplit_once('@').and_then(|(info, _)| info.split_once(':')) {
            let host = &authority[authority.rfind('@').unwrap_or(0)..];
            masked = format!("{scheme}://{user}:***{host}{}", &rest[authority.len()..]);
        }
    }
    match db_password(url).filter(|p| !p.is_empty()) {
        Some(password) => masked.replace(&password, "***"),
        None => masked,
    }
}

/// The environment variable of a clap argument.
pub(super) fn env_of(command: &str, id: &str) -> String {
    let cmd = command_of(command);
    let arg = cmd.get_arguments().find(|a| a.get_id() == id);
    arg.and_then(clap::Arg::get_env)
        .map_or_else(|| "?".to_owned(), |v| v.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_url_s_password_is_masked_however_it_is_written() {
        let cases = [
            (
                "postgres://app:s3cret-pw@db:5432/x",
                "postgres://app:***@db:5432/x",
                "s3cret-pw",
            ),
            (
                "mysql://app:p%40ss-w0rd@db/x?pool_max=4",
                "mysql://app:***@db/x?pool_max=4",
                "p%40ss-w0rd",
            ),
            (
                "postgresql://app:pw-pw-pw@db/x",
                "postgresql://app:***@db/x",
                "pw-pw-pw",
            ),
        ];
        for (url, masked, password) in cases {
            assert_eq!(mask_db_url(url), masked, "{url}");
            assert!(db_password(url).is_some(), "{url}");
            assert!(!mask_db_url(url).contains(password));
        }
        for plain in [
            "sqlite://leasehold.db",
            "sqlite::memory:",
            "postgres://app@db/x",
            "mysql://db/x",
        ] {
            assert_eq!(mask_db_url(plain), plain);
            assert_eq!(db_password(plain), None, "{plain}");
        }
    }

    #[test]
    fn an_unknown_key_is_answered_with_the_nearest_known_one_only_when_near() {
        let int = Value::Integer(1);
        let table = Value::Table(toml::Table::new());
        assert_eq!(
            unknown("worker.lease_sec", &int),
            "worker.lease_sec: unknown key; did you mean worker.lease_secs?"
        );
        assert_eq!(
            unknown("http.alow", &int),
            "http.alow: unknown key; did you mean http.allow?"
        );
        assert_eq!(
            unknown("retension", &table),
            "retension: unknown section; did you mean retention?"
        );
        assert_eq!(
            unknown("serve", &int),
            "serve: expected a table ([serve]), found integer"
        );
        assert_eq!(unknown("colour", &int), "colour: unknown key");
        assert_eq!(unknown("database", &table), "database: unknown section");
    }

    #[test]
    fn every_key_setting_a_flag_names_a_flag_that_exists() {
        for (key, command, id) in FLAGS {
            assert!(kind_of(key).is_some(), "{key} is not a key");
            let cmd = command_of(command);
            assert!(
                cmd.get_arguments().any(|a| a.get_id() == *id),
                "{command} has no {id} ({key})"
            );
            assert!(command.is_empty() || cmd.get_name() == *command, "{command}");
        }
    }
}
