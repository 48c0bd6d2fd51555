//! The secrets of `http:v1`: the hosts each may be sent to, their values (read once
//! from the environment), and the redaction that keeps every value, and its common
//! encodings, out of whatever the executor answers.
//!
//! A secret is an environment variable `LEASEHOLD_SECRET_*` bound to one or more
//! hosts ([`SecretBinding`], `--http-secret NAME=HOST[:PORT]`); a secret bound to no
//! host is sent nowhere. The values of every bound secret are read once, on the
//! executor's first use ([`Vault::load`]); a value shorter than
//! [`MIN_SECRET_BYTES`], not UTF-8, or whose credential (after an auth scheme such
//! as `Bearer `) or `whsec_` key is that short is refused, naming the variable: a
//! short value cannot be told apart from ordinary text, so it could not be kept out
//! of output.
//!
//! [`Redactor`] replaces, in a text or in every string and object key of a JSON
//! value, each of these forms of each value with `[redacted NAME]`: the value; its
//! credential after an auth scheme (and for `Basic` the decoded `user:pass` and
//! password); `Bearer <value>` for a value without a scheme; a `whsec_` secret's
//! decoded key; and of each of those the text, its JSON and Rust string escapes, its
//! percent-encodings (every non-alphanumeric escaped, or all but RFC 3986's
//! unreserved, or all but `encodeURIComponent`'s; upper- and lowercase escapes, `+`
//! for a space), standard and URL-safe base64 with and without padding, and lower-
//! and uppercase hex.

use super::{AllowedHost, ExecutorResult, SECRET_ENV_PREFIX};
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use base64::Engine as _;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde_json::Value;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

/// The shortest secret (and credential, and `whsec_` key) the executor accepts.
pub const MIN_SECRET_BYTES: usize = 8;

/// The sets of characters that percent-encoders commonly escape: every
/// non-alphanumeric; all but RFC 3986's unreserved; all but JavaScript's
/// `encodeURIComponent`'s.
const PERCENT_SETS: [&AsciiSet; 3] = [
    NON_ALPHANUMERIC,
    &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~'),
    &NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~')
        .remove(b'!')
        .remove(b'\'')
        .remove(b'(')
        .remove(b')')
        .remove(b'*'),
];

/// Whether `name` may name a secret: `LEASEHOLD_SECRET_[A-Z0-9_]*`.
pub fn is_secret_name(name: &str) -> bool {
    name.starts_with(SECRET_ENV_PREFIX)
        && name
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

/// A secret and a host it may be sent to: `--http-secret NAME=HOST[:PORT]`. `HOST`
/// alone means the default port of the URL's scheme, as for `--http-allow`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretBinding {
    name: String,
    host: AllowedHost,
}

impl SecretBinding {
    /// Parses `LEASEHOLD_SECRET_NAME=HOST[:PORT]` (`[v6]:PORT` for an IPv6 address).
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = |why: &str| {
            format!("--http-secret {text:?}: {why} (expected {SECRET_ENV_PREFIX}NAME=HOST or {SECRET_ENV_PREFIX}NAME=HOST:PORT)")
        };
        let (name, host) = text
            .trim()
            .split_once('=')
            .ok_or_else(|| bad("no = between the name and the host"))?;
        if !is_secret_name(name) {
            return Err(bad(&format!("the name must be {SECRET_ENV_PREFIX}[A-Z0-9_]*")));
        }
        let host = AllowedHost::from_text(host).map_err(bad)?;
        Ok(Self {
            name: name.to_owned(),
            host,
        })
    }

    /// The secret's variable.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The host (and port) it may be sent to.
    pub fn host(&self) -> &AllowedHost {
        &self.host
    }
}

impl fmt::Display for SecretBinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.name, self.host)
    }
}

/// The values of the bound secrets, read once, and the redactor for them.
pub(super) struct Vault {
    /// Each bound variable's value, or why it cannot be used (never the value).
    values: BTreeMap<String, Result<Vec<u8>, String>>,
    redactor: Redactor,
}

impl Vault {
    /// Reads every bound variable from the environment.
    pub(super) fn load(bindings: &[SecretBinding]) -> Self {
        let mut values = BTreeMap::new();
        let mut needles = Vec::new();
        for name in bindings.iter().map(|b| b.name.as_str()) {
            if values.contains_key(name) {
                continue;
            }
            let loaded = read(name).and_then(|value| {
                let marker = format!("[redacted {name}]");
                let forms = forms(&value).map_err(|why| format!("environment variable {name}: {why}"))?;
                needles.extend(forms.into_iter().map(|form| (form, marker.clone())));
                Ok(value.into_bytes())
            });
            values.insert(name.to_owned(), loaded);
        }
        Self {
            values,
            redactor: Redactor::new(needles),
        }
    }

    /// The value of a bound variable (`None`: not bound), or why it is unusable.
    pub(super) fn get(&self, name: &str) -> Option<&Result<Vec<u8>, String>> {
        self.values.get(name)
    }

    /// The first bound variable that cannot be used, and why.
    pub(super) fn first_error(&self) -> Option<&str> {
        self.values.values().find_map(|v| v.as_ref().err()).map(String::as_str)
    }

    /// Redacts the values of every bound secret.
    pub(super) fn redactor(&self) -> &Redactor {
        &self.redactor
    }
}

/// Reads a variable; refuses it unset, empty, not UTF-8 or short.
fn read(name: &str) -> Result<String, String> {
    let value = match std::env::var_os(name) {
        Some(value) if !value.is_empty() => value,
        _ => return Err(format!("environment variable {name} is not set")),
    };
    let value = value
        .into_string()
        .map_err(|_| format!("environment variable {name} is not UTF-8 text"))?;
    if value.len() < MIN_SECRET_BYTES {
        return Err(format!(
            "environment variable {name} is shorter than {MIN_SECRET_BYTES} bytes, too short to be kept out of output"
        ));
    }
    Ok(value)
}

/// Every form of `value` that is redacted, at least [`MIN_SECRET_BYTES`] long; or
/// why the value is refused.
fn forms(value: &str) -> Result<Vec<String>, String> {
    let mut parts: Vec<Vec<u8>> = vec![value.as_bytes().to_vec()];
    match value.split_once(' ') {
        Some((scheme, credential)) => {
            let credential = credential.trim();
            if credential.len() < MIN_SECRET_BYTES {
                return Err(format!(
                    "the credential after its first space is shorter than {MIN_SECRET_BYTES} bytes, too short to be \
                     kept out of output"
                ));
            }
            parts.push(credential.as_bytes().to_vec());
            if scheme.eq_ignore_ascii_case("basic") {
                parts.extend(basic_parts(credential));
            }
        }
        None => parts.push(format!("Bearer {value}").into_bytes()),
    }
    if let Some(key) = value.strip_prefix("whsec_").and_then(|k| STANDARD.decode(k).ok()) {
        if key.len() < MIN_SECRET_BYTES {
            return Err(format!(
                "its whsec_ key is shorter than {MIN_SECRET_BYTES} bytes, too short to be kept out of output"
            ));
        }
        parts.push(key);
    }
    let mut forms: Vec<String> = parts.iter().flat_map(|part| encodings(part)).collect();
    forms.retain(|form| form.len() >= MIN_SECRET_BYTES);
    forms.sort_unstable();
    forms.dedup();
    Ok(forms)
}

/// A `Basic` credential's decoded `user:pass`, and its password.
fn basic_parts(credential: &str) -> Vec<Vec<u8>> {
    let Ok(decoded) = STANDARD.decode(credential) else {
        return Vec::new();
    };
    let password = decoded
        .iter()
        .position(|b| *b == b':')
        .map(|colon| decoded[colon + 1..].to_vec());
    std::iter::once(decoded).chain(password).collect()
}

/// The encodings of `bytes` a receiver or an error message commonly shows.
fn encodings(bytes: &[u8]) -> Vec<String> {
    let mut out: Vec<String> = [STANDARD, URL_SAFE]
        .iter()
        .map(|engine| engine.encode(bytes))
        .chain(
            [STANDARD_NO_PAD, URL_SAFE_NO_PAD]
                .iter()
                .map(|engine| engine.encode(bytes)),
        )
        .collect();
    out.push(hex::encode(bytes));
    out.push(hex::encode_upper(bytes));
    if let Ok(text) = std::str::from_utf8(bytes) {
        let quoted = |s: String| s[1..s.len() - 1].to_owned();
        out.push(text.to_owned());
        out.push(quoted(serde_json::to_string(text).unwrap_or_default()));
        out.push(quoted(format!("{text:?}")));
        for set in PERCENT_SETS {
            let percent = utf8_percent_encode(text, set).to_string();
            out.push(lowercase_escapes(&percent));
            out.push(percent.replace("%20", "+"));
            out.push(percent);
        }
    }
    out
}

/// `%2F` → `%2f`: the same percent-encoding with lowercase hex digits.
fn lowercase_escapes(percent: &str) -> String {
    let mut out = String::with_capacity(percent.len());
    let mut hex_left = 0;
    for c in percent.chars() {
        if c == '%' {
            hex_left = 2;
            out.push(c);
        } else if hex_left > 0 {
            hex_left -= 1;
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// Replaces every form of every secret with a marker naming its variable.
pub(super) struct Redactor {
    /// (form, marker), longest form first, so that a form that contains another is
    /// replaced whole.
    needles: Vec<(String, String)>,
}

impl Redactor {
    fn new(mut needles: Vec<(String, String)>) -> Self {
        needles.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        needles.dedup_by(|a, b| a.0 == b.0);
        Self { needles }
    }

    /// `text` with every form of every secret replaced.
    pub(super) fn text<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        for (needle, marker) in &self.needles {
            if out.contains(needle.as_str()) {
                out = Cow::Owned(out.replace(needle.as_str(), marker));
            }
        }
        out
    }

    fn owned(&self, text: String) -> String {
        match self.text(&text) {
            Cow::Borrowed(_) => text,
            Cow::Owned(redacted) => redacted,
        }
    }

    /// `value` with every string and object key redacted.
    pub(super) fn value(&self, value: Value) -> Value {
        match value {
            Value::String(s) => Value::String(self.owned(s)),
            Value::Array(items) => Value::Array(items.into_iter().map(|v| self.value(v)).collect()),
            Value::Object(map) => Value::Object(map.into_iter().map(|(k, v)| (self.owned(k), self.value(v))).collect()),
            other => other,
        }
    }

    /// An executor's answer with its evidence, target receipt or error redacted.
    pub(super) fn result(&self, result: ExecutorResult) -> ExecutorResult {
        if self.needles.is_empty() {
            return result;
        }
        match result {
            ExecutorResult::Done {
                evidence,
                target_receipt,
            } => ExecutorResult::Done {
                evidence: self.value(evidence),
                target_receipt: self.value(target_receipt),
            },
            ExecutorResult::Permanent(message) => ExecutorResult::Permanent(self.owned(message)),
            ExecutorResult::Transient(message) => ExecutorResult::Transient(self.owned(message)),
            ExecutorResult::Throttled { error, retry_after_ms } => ExecutorResult::Throttled {
                error: self.owned(error),
                retry_after_ms,
            },
        }
    }
}
