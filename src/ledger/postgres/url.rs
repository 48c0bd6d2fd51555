//! `postgres://` URLs: where the PostgreSQL ledger connects and how its pool behaves.
//!
//! Contract: `postgres://[USER[:PASSWORD]@]HOST[:PORT][,HOST[:PORT]…]/DATABASE[?NAME=VALUE&…]`
//! (`postgresql://` too), with a percent-encoded user and password, an IPv6 host in
//! brackets, port 5432 by default. Several hosts are tried in their order on every new
//! connection, as libpq does, and only a server that accepts writes is kept
//! (`target_session_attrs=read-write`, the default): after a standby is promoted, new
//! connections reach it. The scheme, credentials, hosts and database are read
//! by tokio-postgres's own parser ([`tokio_postgres::Config`]); the query parameters are
//! leasehold's (see [`PostgresOptions`]) plus `sslmode` (`disable`, `prefer`, `require`,
//! `verify-full`) and `target_session_attrs` (`read-write`, `any`).
//! An unknown parameter or a value that is not a whole number is refused naming the
//! parameter; a value out of range is clamped, never refused. No error, `Debug` or
//! `Display` output ever contains the password: they show `***` in its place.

use crate::ledger::percent::{percent_decode, percent_encode};
use crate::ledger::LedgerError;
use std::fmt;
use std::time::Duration;
use tokio_postgres::config::{Host, SslMode, TargetSessionAttrs};

/// What a `postgres://` URL looks like, for error messages.
const SHAPE: &str = "expected postgres://USER[:PASSWORD]@HOST[:PORT][,HOST[:PORT]…]/DATABASE";

/// Pool, timeout and retry settings of a PostgreSQL ledger, from the URL's query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PostgresOptions {
    /// `pool_max`: most connections one ledger opens (default 8, 1..=256).
    pub pool_max: usize,
    /// `connect_timeout_ms`: how long to wait for a connection, new or pooled, before
    /// answering unavailable (default 5000, 100..=600000).
    pub connect_timeout_ms: u64,
    /// `statement_timeout_ms`: the session's `statement_timeout`, so that no statement
    /// of the ledger runs unbounded (default 30000, 100..=3600000).
    pub statement_timeout_ms: u64,
    /// `lock_timeout_ms`: the session's `lock_timeout`, how long a transition waits
    /// for a row lock before it is retried (default 5000, 1..=3600000).
    pub lock_timeout_ms: u64,
    /// `idle_timeout_s`: the session's `idle_in_transaction_session_timeout`. The
    /// server ends a session idle this long inside a transaction, rolling it back — so
    /// a worker frozen in the middle of a transaction (SIGSTOP, a hung VM) releases its
    /// row locks and its lease expires normally (default 60, 1..=28800).
    pub idle_timeout_s: u64,
    /// `retry_max`: tries of one transaction that hits a serialization failure, a
    /// deadlock, a lock timeout or a connection lost before `COMMIT` (default 10,
    /// 1..=1000).
    pub retry_max: u32,
    /// `sslmode`: `disable`, `prefer` (the default, as libpq's), `require` or
    /// `verify-full`; only `verify-full` checks the server's certificate (libpq's
    /// meaning of each).
    pub ssl: Ssl,
    /// `notify`: `1` (the default) lets idle workers wait for the `NOTIFY` an enqueue
    /// sends on a session of their own (`LISTEN`) besides polling; `0` makes them
    /// only poll. Enqueues notify either way.
    pub notify: bool,
    /// `target_session_attrs`: `read-write` (the default) keeps a new connection only
    /// if its server accepts writes (a primary, not a standby), trying the URL's hosts
    /// in order; `any` keeps the first server that answers.
    pub read_write: bool,
    /// `group_writes`: `1` (the default) writes the requests of this process's lease
    /// holders in groups, several in one transaction with one claim for all of them;
    /// `0` writes each in a transaction of its own.
    pub group_writes: bool,
}

/// The `sslmode` of a URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ssl {
    /// Plain TCP only.
    Disable,
    /// TLS if the server offers it, plain TCP otherwise.
    Prefer,
    /// TLS or no connection, the certificate not checked.
    Require,
    /// TLS with the certificate checked against the webpki roots and the host name.
    VerifyFull,
}

impl Ssl {
    fn name(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyFull => "verify-full",
        }
    }

    /// tokio-postgres's spelling.
    pub fn mode(self) -> SslMode {
        match self {
            Self::Disable => SslMode::Disable,
            Self::Prefer => SslMode::Prefer,
            Self::Require | Self::VerifyFull => SslMode::Require,
        }
    }
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            pool_max: 8,
            connect_timeout_ms: 5_000,
            statement_timeout_ms: 30_000,
            lock_timeout_ms: 5_000,
            idle_timeout_s: 60,
            retry_max: 10,
            ssl: Ssl::Prefer,
            notify: true,
            read_write: true,
            group_writes: true,
        }
    }
}

impl PostgresOptions {
    /// How long to wait for a connection.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }

    fn set(&mut self, name: &str, value: &str) -> Result<(), LedgerError> {
        const KNOWN: &[&str] = &[
            "pool_max",
            "connect_timeout_ms",
            "statement_timeout_ms",
            "lock_timeout_ms",
            "idle_timeout_s",
            "retry_max",
            "sslmode",
            "notify",
            "target_session_attrs",
            "group_writes",
        ];
        crate::ledger::url::known_parameter("postgres", name, KNOWN)?;
        if name == "sslmode" {
            self.ssl = match value {
                "disable" => Ssl::Disable,
                "prefer" => Ssl::Prefer,
                "require" => Ssl::Require,
                "verify-full" => Ssl::VerifyFull,
                _ => {
                    return Err(LedgerError::BadInput(
                        "--db: postgres URL parameter \"sslmode\" must be disable, prefer, require or verify-full"
                            .into(),
                    ))
                }
            };
            return Ok(());
        }
        if name == "target_session_attrs" {
            self.read_write = match value {
                "read-write" => true,
                "any" => false,
                _ => {
                    return Err(LedgerError::BadInput(
                        "--db: postgres URL parameter \"target_session_attrs\" must be read-write or any".into(),
                    ))
                }
            };
            return Ok(());
        }
        if name == "notify" || name == "group_writes" {
            let on = match value {
                "1" => true,
                "0" => false,
                _ => {
                    return Err(LedgerError::BadInput(format!(
                        "--db: postgres URL parameter \"{name}\" must be 0 or 1"
                    )))
                }
            };
            match name {
                "notify" => self.notify = on,
                _ => self.group_writes = on,
            }
            return Ok(());
        }
        let number = crate::ledger::url::whole_number("postgres", name, value)?;
        let clamp = |lo: u64, hi: u64| number.clamp(lo, hi);
        match name {
            "pool_max" => self.pool_max = clamp(1, 256) as usize,
            "connect_timeout_ms" => self.connect_timeout_ms = clamp(100, 600_000),
            "statement_timeout_ms" => self.statement_timeout_ms = clamp(100, 3_600_000),
            "lock_timeout_ms" => self.lock_timeout_ms = clamp(1, 3_600_000),
            "idle_timeout_s" => self.idle_timeout_s = clamp(1, 28_800),
            _ => self.retry_max = clamp(1, 1_000) as u32,
        }
        Ok(())
    }

    /// The session settings every pooled connection starts with.
    pub fn session_settings(&self) -> String {
        format!(
            "SET statement_timeout = {}; SET lock_timeout = {}; SET idle_in_transaction_session_timeout = {}",
            self.statement_timeout_ms,
            self.lock_timeout_ms,
            self.idle_timeout_s * 1_000
        )
    }
}

/// A parsed `postgres://` URL. Its password never prints.
#[derive(Clone)]
pub struct PostgresUrl {
    config: tokio_postgres::Config,
    /// Pool, timeout, retry and TLS settings.
    pub options: PostgresOptions,
}

impl PartialEq for PostgresUrl {
    fn eq(&self, other: &Self) -> bool {
        self.user() == other.user()
            && self.config.get_password() == other.config.get_password()
            && self.hosts() == other.hosts()
            && self.database() == other.database()
            && self.options == other.options
    }
}

impl Eq for PostgresUrl {}

impl fmt::Debug for PostgresUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresUrl")
            .field("user", &self.user())
            .field("password", &self.config.get_password().map(|_| "***"))
            .field("hosts", &self.hosts())
            .field("database", &self.database())
            .field("options", &self.options)
            .finish()
    }
}

impl fmt::Display for PostgresUrl {
    /// The URL without its query, the password shown as `***`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("postgres://")?;
        if let Some(user) = self.user() {
            f.write_str(user)?;
            if self.config.get_password().is_some() {
                f.write_str(":***")?;
            }
            f.write_str("@")?;
        }
        write!(f, "{}/{}", self.authority(), self.database())
    }
}

fn bad(what: &str) -> LedgerError {
    LedgerError::BadInput(format!("--db: postgres URL {what} ({SHAPE})"))
}

/// Refuses one `HOST[:PORT]` of the URL's host list that has no host or a bad port.
fn check_host(hostport: &str) -> Result<(), LedgerError> {
    if hostport.is_empty() || hostport.starts_with(':') {
        return Err(bad("has no host"));
    }
    if let Some(port) = hostport
        .rsplit_once(']')
        .map_or(hostport, |(_, p)| p)
        .rsplit_once(':')
        .map(|(_, p)| p)
    {
        if port.parse::<u16>().ok().filter(|p| *p != 0).is_none() {
            return Err(bad("has a port that is not a number from 1 to 65535"));
        }
    }
    Ok(())
}

impl PostgresUrl {
    /// Parses a `postgres://` or `postgresql://` URL. Errors name the part at fault,
    /// never the password.
    pub fn parse(url: &str) -> Result<Self, LedgerError> {
        let rest = url
            .strip_prefix("postgres://")
            .or_else(|| url.strip_prefix("postgresql://"))
            .ok_or_else(|| bad("must start with postgres:// or postgresql://"))?;
        let (base, query) = match rest.split_once('?') {
            Some((b, q)) => (b, Some(q)),
            None => (rest, None),
        };
        let Some((authority, database)) = base.split_once('/') else {
            return Err(bad("has no database"));
        };
        if database.contains('@') {
            // A '/' in the password, not percent-encoded: nothing of the URL is
            // echoed, since any part of it may be the password.
            return Err(bad(
                "has an '@' after its first '/': percent-encode a '/' in the user or password as %2F",
            ));
        }
        if database.is_empty() {
            return Err(bad("has no database"));
        }
        if percent_decode(authority).is_none() || percent_decode(database).is_none() {
            return Err(bad("has a malformed %-escape in its user, password or database"));
        }
        let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        if hostport.is_empty() || hostport.starts_with(':') {
            return Err(bad("has no host"));
        }
        for one in hostport.split(',') {
            check_host(one)?;
        }
        // tokio-postgres reads the credentials, host, port and database; its errors
        // are not shown, since they may quote the input.
        let config: tokio_postgres::Config = format!("postgres://{base}")
            .parse()
            .map_err(|_| bad("does not parse (percent-encode special characters in the user and password)"))?;
        if config.get_dbname().is_none_or(str::is_empty) {
            return Err(bad("has no database"));
        }
        if config.get_hosts().is_empty()
            || !config
                .get_hosts()
                .iter()
                .all(|h| matches!(h, Host::Tcp(host) if !host.is_empty()))
        {
            return Err(bad("has no host"));
        }
        let mut options = PostgresOptions::default();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            options.set(name, value)?;
        }
        let mut url = Self { config, options };
        url.configure();
        Ok(url)
    }

    /// Applies the options that live in the driver's configuration. TCP keepalives
    /// and a user timeout make a connection to a server that vanished (a failed
    /// primary, a network partition) fail within about a minute instead of the
    /// kernel's quarter of an hour, so the pool replaces it.
    fn configure(&mut self) {
        let attrs = if self.options.read_write {
            TargetSessionAttrs::ReadWrite
        } else {
            TargetSessionAttrs::Any
        };
        self.config
            .connect_timeout(self.options.connect_timeout())
            .ssl_mode(self.options.ssl.mode())
            .target_session_attrs(attrs)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(30))
            .keepalives_interval(Duration::from_secs(10))
            .keepalives_retries(3)
            .tcp_user_timeout(Duration::from_secs(60))
            .application_name("leasehold");
    }

    /// The user name, if any.
    pub fn user(&self) -> Option<&str> {
        self.config.get_user()
    }

    /// The first host's name or IP address (without brackets).
    pub fn host(&self) -> &str {
        self.hosts().first().map_or("", |(host, _)| host)
    }

    /// The first host's TCP port.
    pub fn port(&self) -> u16 {
        self.hosts().first().map_or(5432, |(_, port)| *port)
    }

    /// Every host (without brackets) with its port, in the order they are tried.
    pub fn hosts(&self) -> Vec<(&str, u16)> {
        let ports = self.config.get_ports();
        self.config
            .get_hosts()
            .iter()
            .enumerate()
            .map(|(i, host)| {
                let name = match host {
                    Host::Tcp(host) => host.as_str(),
                    #[cfg(unix)]
                    Host::Unix(_) => "",
                };
                (name, ports.get(i).or(ports.first()).copied().unwrap_or(5432))
            })
            .collect()
    }

    /// `HOST:PORT[,HOST:PORT…]`, IPv6 hosts in brackets.
    fn authority(&self) -> String {
        let one = |(host, port): (&str, u16)| {
            if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            }
        };
        self.hosts().into_iter().map(one).collect::<Vec<_>>().join(",")
    }

    /// The database name.
    pub fn database(&self) -> &str {
        self.config.get_dbname().unwrap_or("")
    }

    /// The driver's configuration, password included: for connecting; never log it.
    pub fn config(&self) -> &tokio_postgres::Config {
        &self.config
    }

    /// The whole URL, password and options included (percent-encoded), for handing to
    /// another process of ours (a test starting workers); never log or print it.
    pub fn expose(&self) -> String {
        let mut out = String::from("postgres://");
        if let Some(user) = self.user() {
            out.push_str(&percent_encode(user.as_bytes()));
            if let Some(password) = self.config.get_password() {
                out.push(':');
                out.push_str(&percent_encode(password));
            }
            out.push('@');
        }
        let o = &self.options;
        out.push_str(&format!(
            "{}/{}?pool_max={}&connect_timeout_ms={}&statement_timeout_ms={}&lock_timeout_ms={}\
             &idle_timeout_s={}&retry_max={}&sslmode={}&notify={}&target_session_attrs={}&group_writes={}",
            self.authority(),
            percent_encode(self.database().as_bytes()),
            o.pool_max,
            o.connect_timeout_ms,
            o.statement_timeout_ms,
            o.lock_timeout_ms,
            o.idle_timeout_s,
            o.retry_max,
            o.ssl.name(),
            u8::from(o.notify),
            if o.read_write { "read-write" } else { "any" },
            u8::from(o.group_writes)
        ));
        out
    }

    /// The same server and credentials with another database (tests create one
    /// database per test).
    pub fn with_database(&self, database: &str) -> Self {
        let mut url = self.clone();
        url.config.dbname(database);
        url
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_url_parses_with_defaults() {
        for scheme in ["postgres", "postgresql"] {
            let u = PostgresUrl::parse(&format!("{scheme}://postgres@127.0.0.1:5432/test")).unwrap();
            assert_eq!(u.user(), Some("postgres"));
            assert_eq!(u.config().get_password(), None);
            assert_eq!((u.host(), u.port(), u.database()), ("127.0.0.1", 5432, "test"));
            assert_eq!(u.options, PostgresOptions::default());
            assert_eq!(u.to_string(), "postgres://postgres@127.0.0.1:5432/test");
        }
        let u = PostgresUrl::parse("postgres://db.example/outbox").unwrap();
        assert_eq!((u.user(), u.port()), (None, 5432));
    }

    #[test]
    fn passwords_are_decoded_and_never_printed() {
        let u = PostgresUrl::parse("postgres://app:s%40cr%3At@db.example:5433/outbox").unwrap();
        assert_eq!(u.config().get_password(), Some(&b"s@cr:t"[..]));
        assert_eq!(u.port(), 5433);
        for shown in [u.to_string(), format!("{u:?}")] {
            assert!(!shown.contains("s@cr") && !shown.contains("cr%3A"), "{shown}");
            assert!(shown.contains("***"), "{shown}");
        }
    }

    #[test]
    fn exposing_round_trips_everything() {
        let u = PostgresUrl::parse(
            "postgres://a%20b:p%40ss%3Aw%2Frd@[::1]:5440/db?pool_max=3&idle_timeout_s=9&sslmode=disable",
        )
        .unwrap();
        assert_eq!(u.host(), "::1");
        assert_eq!(PostgresUrl::parse(&u.expose()).unwrap(), u);
        assert_eq!(u.config().get_password(), Some(&b"p@ss:w/rd"[..]));
        assert_eq!(u.user(), Some("a b"));
        assert_eq!(u.options.ssl, Ssl::Disable);
    }

    #[test]
    fn options_are_parsed_and_clamped() {
        let u = PostgresUrl::parse(
            "postgres://u:pw@h/d?pool_max=1000&connect_timeout_ms=1&statement_timeout_ms=99999999\
             &lock_timeout_ms=0&retry_max=0&idle_timeout_s=100000&sslmode=require&notify=0",
        )
        .unwrap();
        let o = u.options;
        assert!(!o.notify);
        assert!(PostgresUrl::parse("postgres://u@h/d").unwrap().options.notify);
        let e = PostgresUrl::parse("postgres://u:pw@h/d?notify=yes")
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"notify\" must be 0 or 1") && !e.contains("pw"), "{e}");
        assert!(o.group_writes);
        let quiet = PostgresUrl::parse("postgres://u@h/d?group_writes=0").unwrap();
        assert!(!quiet.options.group_writes);
        let e = PostgresUrl::parse("postgres://u:pw@h/d?group_writes=2")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"group_writes\" must be 0 or 1") && !e.contains("pw"),
            "{e}"
        );
        assert_eq!(o.pool_max, 256);
        assert_eq!(
            (o.connect_timeout_ms, o.statement_timeout_ms, o.lock_timeout_ms),
            (100, 3_600_000, 1)
        );
        assert_eq!((o.retry_max, o.idle_timeout_s, o.ssl), (1, 28_800, Ssl::Require));
        assert_eq!(u.config().get_ssl_mode(), SslMode::Require);
        assert_eq!(u.config().get_connect_timeout(), Some(&Duration::from_millis(100)));
        assert_eq!(
            o.session_settings(),
            "SET statement_timeout = 3600000; SET lock_timeout = 1; \
             SET idle_in_transaction_session_timeout = 28800000"
        );
    }

    #[test]
    fn errors_name_the_part_and_never_the_password() {
        let cases = [
            ("postgres://u:secret@h", "has no database"),
            ("postgres://u:secret@h/", "has no database"),
            ("postgres://u:secret@/d", "has no host"),
            ("postgres://u:secret@:5432/d", "has no host"),
            ("postgres://u:secret@h:99999/d", "port"),
            ("postgres://u:secret@h:x/d", "port"),
            ("postgres://u:secret@h1,/d", "has no host"),
            ("postgres://u:secret@h1:5432,:5433/d", "has no host"),
            ("postgres://u:secret@h1,h2:0/d", "port"),
            (
                "postgres://u:secret@h1,h2/d?target_session_attrs=primary",
                "must be read-write or any",
            ),
            (
                "postgres://u:secret@h/d?pool_max=many",
                "\"pool_max\" must be a whole number",
            ),
            (
                "postgres://u:secret@h/d?password=secret",
                "unknown postgres URL parameter \"password\"",
            ),
            (
                "postgres://u:secret@h/d?sslmode=secret",
                "must be disable, prefer, require or verify-full",
            ),
            ("postgres://u:secret%zz@h/d", "malformed %-escape"),
            ("mysql://u:secret@h/d", "must start with postgres://"),
        ];
        for (url, expected) in cases {
            let e = PostgresUrl::parse(url).unwrap_err();
            assert!(matches!(e, LedgerError::BadInput(_)), "{url}: {e:?}");
            let text = e.to_string();
            assert!(text.contains(expected), "{url}: {text}");
            assert!(!text.contains("secret"), "{url}: {text}");
        }
    }

    #[test]
    fn an_unencoded_slash_in_the_password_is_named_without_echoing_it() {
        for url in [
            "postgres://root:se/cret@127.0.0.1:5432/test",
            "postgresql://root:secret/@db.example/test",
        ] {
            let e = PostgresUrl::parse(url).unwrap_err().to_string();
            assert!(e.contains("percent-encode a '/'"), "{e}");
            for part in ["cret", "secret", "root", "127.0.0.1", "db.example"] {
                assert!(!e.contains(part), "{part:?} shown in {e}");
            }
        }
    }

    #[test]
    fn several_hosts_are_tried_in_order_and_only_a_writable_server_is_kept() {
        let u = PostgresUrl::parse("postgres://u:pw@10.0.0.1,[::1]:5433,db.example:5434/d").unwrap();
        assert_eq!(u.hosts(), [("10.0.0.1", 5432), ("::1", 5433), ("db.example", 5434)]);
        assert_eq!((u.host(), u.port()), ("10.0.0.1", 5432));
        assert_eq!(
            u.to_string(),
            "postgres://u:***@10.0.0.1:5432,[::1]:5433,db.example:5434/d"
        );
        assert_eq!(u.config().get_target_session_attrs(), TargetSessionAttrs::ReadWrite);
        assert_eq!(PostgresUrl::parse(&u.expose()).unwrap(), u);
        let any = PostgresUrl::parse("postgres://u@h1:5441,h2:5442/d?target_session_attrs=any").unwrap();
        assert!(!any.options.read_write);
        assert_eq!(any.config().get_target_session_attrs(), TargetSessionAttrs::Any);
        assert_eq!(PostgresUrl::parse(&any.expose()).unwrap(), any);
        assert_ne!(
            any,
            PostgresUrl::parse("postgres://u@h1:5441/d?target_session_attrs=any").unwrap()
        );
    }

    #[test]
    fn a_vanished_server_is_noticed_by_keepalives_and_a_user_timeout() {
        let u = PostgresUrl::parse("postgres://u@h/d").unwrap();
        assert!(u.config().get_keepalives());
        assert_eq!(u.config().get_keepalives_idle(), Duration::from_secs(30));
        assert_eq!(u.config().get_tcp_user_timeout(), Some(&Duration::from_secs(60)));
    }

    #[test]
    fn another_database_keeps_the_server_and_credentials() {
        let u = PostgresUrl::parse("postgres://app:pw@h:5433/one?pool_max=2").unwrap();
        let v = u.with_database("two");
        assert_eq!(
            (v.host(), v.port(), v.database(), v.user()),
            ("h", 5433, "two", Some("app"))
        );
        assert_eq!(v.config().get_password(), Some(&b"pw"[..]));
        assert_eq!(v.options, u.options);
    }
}
