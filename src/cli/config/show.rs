//! `leasehold config show`: the effective settings, each with where it came from.

use super::keys::{self, Kind, FLAGS, KEYS};
use super::{resolve, Resolved};
use crate::cli::{render, Failure, Outcome};
use clap::parser::ValueSource;
use std::ffi::OsString;
use toml::Value;

/// One setting as shown: its key, its value (`None`: unset) and its source.
struct Shown {
    key: &'static str,
    value: Option<Value>,
    source: String,
}

/// `leasehold config show [-- COMMAND ARGS…]`.
pub(super) fn show(args: &[String], json: bool) -> Outcome {
    let commands: Vec<Vec<String>> = match args.first().map(String::as_str) {
        None => vec![vec!["serve".into()], vec!["worker".into()]],
        Some("serve" | "worker") => vec![args.to_vec()],
        Some(other) => {
            return Err(Failure::bad_input(format!(
                "config show -- {other}: the settings shown are those of serve or worker"
            )))
        }
    };
    let outer = super::cli_command()
        .try_get_matches_from(std::env::args_os())
        .unwrap_or_else(|e| e.exit());
    let mut shown: Vec<Shown> = Vec::new();
    for command in &commands {
        let resolved = resolve(inner_line(&outer, command))?;
        for setting in settings(&resolved, &command[0]) {
            if !shown.iter().any(|s| s.key == setting.key) {
                shown.push(setting);
            }
        }
    }
    shown.sort_by_key(|s| KEYS.iter().position(|(k, _)| *k == s.key));
    if json {
        render::print_json(&as_json(&shown));
    } else {
        out!("{}", as_toml(&shown));
    }
    Ok(())
}

/// The command line of `command`, with the global flags this one was given.
fn inner_line(outer: &clap::ArgMatches, command: &[String]) -> Vec<OsString> {
    let mut line: Vec<OsString> = std::env::args_os().take(1).collect();
    for id in ["db", "config"] {
        if outer.value_source(id) == Some(ValueSource::CommandLine) {
            if let Some(value) = outer.get_raw(id).and_then(|mut v| v.next()) {
                line.push(format!("--{id}").into());
                line.push(value.to_owned());
            }
        }
    }
    line.extend(command.iter().map(OsString::from));
    line
}

/// Every key's effective value for `command`.
fn settings(resolved: &Resolved, command: &str) -> Vec<Shown> {
    let file = resolved.file.as_ref();
    let file_name = file.map(|f| format!("file {}", f.path.display()));
    let mut shown = Vec::new();
    for (key, kind) in KEYS {
        let flag = FLAGS
            .iter()
            .find(|(k, c, _)| k == key && (c.is_empty() || *c == command));
        let applies = FLAGS.iter().any(|(k, _, _)| k == key);
        let (value, source) = match flag {
            Some((_, c, id)) => {
                let Some(matches) = (if c.is_empty() {
                    Some(&resolved.matches)
                } else {
                    resolved.matches.subcommand_matches(c)
                }) else {
                    continue;
                };
                let raw: Option<Vec<String>> = matches
                    .get_raw(id)
                    .map(|v| v.map(|s| s.to_string_lossy().into_owned()).collect());
                let source = if resolved.from_file.contains(key) {
                    let reference = file
                        .and_then(|f| f.values.get(key))
                        .filter(|v| *key == "db" && v.is_table());
                    let via = reference.map_or_else(String::new, |r| format!(", {key} = {r}"));
                    format!("{}{via}", file_name.clone().unwrap_or_default())
                } else {
                    flag_source(matches, c, id)
                };
                (typed(*kind, raw), source)
            }
            None if applies => continue,
            None => {
                let value = file.and_then(|f| f.values.get(key)).cloned();
                let source = file_only_source(key, value.as_ref(), file_name.as_deref());
                (value, source)
            }
        };
        let value = match (key, value) {
            (&"db", Some(Value::String(url))) => Some(Value::String(keys::mask_db_url(&url))),
            (_, value) => value,
        };
        shown.push(Shown { key, value, source });
    }
    shown
}

/// Where a flag's value came from: `flag --NAME`, `env VAR`, `default` or `unset`.
fn flag_source(matches: &clap::ArgMatches, command: &str, id: &str) -> String {
    match matches.value_source(id) {
        Some(ValueSource::CommandLine) => format!("flag --{}", keys::long_flag(command, id)),
        Some(ValueSource::EnvVariable) => format!("env {}", keys::env_of(command, id)),
        Some(ValueSource::DefaultValue) => "default".to_owned(),
        _ => "unset".to_owned(),
    }
}

/// Where a key read from the file alone came from; for secret sources, which of
/// them the environment sets instead.
fn file_only_source(key: &str, value: Option<&Value>, file: Option<&str>) -> String {
    let (Some(value), Some(file)) = (value, file) else {
        return "unset".to_owned();
    };
    let overridden: Vec<&str> = match (key, value) {
        ("http.secret_sources", Value::Table(t)) => t
            .keys()
            .filter(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()))
            .map(String::as_str)
            .collect(),
        _ => Vec::new(),
    };
    if overridden.is_empty() {
        file.to_owned()
    } else {
        format!("{file}; the environment sets {} itself", overridden.join(", "))
    }
}

/// A flag's raw values as the key's TOML value.
fn typed(kind: Kind, raw: Option<Vec<String>>) -> Option<Value> {
    let strings = |raw: Vec<String>| Value::Array(raw.into_iter().map(Value::String).collect());
    match kind {
        Kind::Names | Kind::Hosts | Kind::Origins | Kind::States => Some(strings(raw.unwrap_or_default())),
        Kind::Bindings => {
            let mut table = toml::Table::new();
            for binding in raw.unwrap_or_default() {
                let (name, host) = binding.split_once('=').unwrap_or((&binding, ""));
                let hosts = table.entry(name).or_insert_with(|| Value::Array(Vec::new()));
                if let Value::Array(hosts) = hosts {
                    hosts.push(Value::String(host.to_owned()));
                }
            }
            Some(Value::Table(table))
        }
        Kind::Int(..) => {
            let text = raw?.into_iter().next()?;
            Some(text.parse().map_or(Value::String(text), Value::Integer))
        }
        _ => raw?.into_iter().next().map(Value::String),
    }
}

/// The settings as TOML, each line's source in a comment.
fn as_toml(shown: &[Shown]) -> String {
    let mut text = String::from(
        "# Effective settings: flags, then LEASEHOLD_* variables, then the --config file, then defaults.\n",
    );
    let mut section = "";
    for s in shown {
        let (this, name) = s.key.split_once('.').unwrap_or(("", s.key));
        if this != section {
            section = this;
            text.push_str(&format!("\n[{section}]\n"));
        }
        match &s.value {
            Some(value) => text.push_str(&format!("{name} = {value}  # {}\n", s.source)),
            None => text.push_str(&format!("# {name}: unset\n")),
        }
    }
    text
}

/// The settings as JSON: `{"db": {"value", "source"}, "serve": {KEY: {…}}, …}`.
fn as_json(shown: &[Shown]) -> serde_json::Value {
    let mut root = serde_json::Map::new();
    for s in shown {
        let entry = serde_json::json!({ "value": s.value, "source": s.source });
        match s.key.split_once('.') {
            Some((section, name)) => {
                let table = root.entry(section).or_insert_with(|| serde_json::json!({}));
                table[name] = entry;
            }
            None => {
                root.insert(s.key.to_owned(), entry);
            }
        }
    }
    serde_json::Value::Object(root)
}
