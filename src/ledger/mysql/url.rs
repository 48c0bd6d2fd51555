//! `mysql://` URLs: where the MySQL ledger connects and how its pool behaves.
//!
//! Contract: `mysql://[USER[:PASSWORD]@]HOST[:PORT]/DATABASE[?NAME=VALUE&…]`, with
//! percent-encoded user and password, an IPv6 host in brackets, port 3306 by default.
//! The query parameters are leasehold's own (see [`MysqlOptions`]); an unknown one or
//! a value that is not a whole number is refused naming the parameter, and a value
//! out of range is clamped, never refused. No error, `Debug` or `Display` output ever
//! contains the password: they show `***` in its place.

use crate::ledger::percent::{percent_decode, percent_encode};
use crate::ledger::LedgerError;
use std::fmt;
use std::time::Duration;

/// What a `mysql://` URL says the usage is, for error messages.
const SHAPE: &str = "expected mysql://USER[:PASSWORD]@HOST[:PORT]/DATABASE";

/// Pool, timeout and retry settings of a MySQL ledger, from the URL's query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MysqlOptions {
    /// `pool_max`: most connections one ledger opens (default 8, 1..=256).
    pub pool_max: usize,
    /// `pool_min`: idle connections kept open (default 1, 0..=`pool_max`).
    pub pool_min: usize,
    /// `connect_timeout_ms`: how long to wait for a connection, new or pooled, before
    /// answering unavailable (default 5000, 100..=600000).
    pub connect_timeout_ms: u64,
    /// `lock_wait_timeout_s`: the session's `innodb_lock_wait_timeout` (default 5,
    /// 1..=3600).
    pub lock_wait_timeout_s: u64,
    /// `retry_max`: tries of one transaction that hits deadlocks, lock-wait timeouts
    /// or a connection lost before `COMMIT` (default 10, 1..=1000).
    pub retry_max: u32,
    /// `idle_timeout_s`: the session's `wait_timeout`. The server closes a connection
    /// idle this long, rolling back any transaction it left open — so a worker frozen
    /// in the middle of a transaction (SIGSTOP, a hung VM) releases its row locks and
    /// its lease expires normally instead of blocking takeovers (default 60, 1..=28800).
    pub idle_timeout_s: u64,
    /// `claim_spread`: a claim lists `batch × claim_spread` candidates, oldest first,
    /// and starts at a random one of them, so that concurrent claimers take different
    /// rows instead of queueing on the same ones; 1 is strictly oldest first
    /// (default 16, 1..=64). Only the portable claim path (without `SKIP LOCKED`)
    /// spreads; with `SKIP LOCKED`, the window a claim looks through is
    /// `batch × claim_spread` candidates.
    pub claim_spread: u32,
    /// `skip_locked`: `1` (the default) claims with `SELECT … FOR UPDATE SKIP LOCKED`
    /// where the server supports it (MariaDB 10.6+, MySQL 8.0.1+; probed once per
    /// ledger), so that concurrent claimers take disjoint rows without waiting on each
    /// other; `0` always uses the portable path that MySQL 5.7 needs (a plain read of
    /// candidates, then a locking re-check of each).
    pub skip_locked: bool,
}

impl Default for MysqlOptions {
    fn default() -> Self {
        Self {
            pool_max: 8,
            pool_min: 1,
            connect_timeout_ms: 5_000,
            lock_wait_timeout_s: 5,
            retry_max: 10,
            idle_timeout_s: 60,
            claim_spread: 16,
            skip_locked: true,
        }
    }
}

impl MysqlOptions {
    /// How long to wait for a connection.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }

    fn set(&mut self, name: &str, value: &str) -> Result<(), LedgerError> {
        const KNOWN: &[&str] = &[
            "pool_max",
            "pool_min",
            "connect_timeout_ms",
            "lock_wait_timeout_s",
            "retry_max",
            "idle_timeout_s",
            "claim_spread",
            "skip_locked",
        ];
        crate::ledger::url::known_parameter("mysql", name, KNOWN)?;
        let number = crate::ledger::url::whole_number("mysql", name, value)?;
        let clamp = |lo: u64, hi: u64| number.clamp(lo, hi);
        match name {
            "pool_max" => self.pool_max = clamp(1, 256) as usize,
            "pool_min" => self.pool_min = clamp(0, 256) as usize,
            "connect_timeout_ms" => self.connect_timeout_ms = clamp(100, 600_000),
            "lock_wait_timeout_s" => self.lock_wait_timeout_s = clamp(1, 3_600),
            "retry_max" => self.retry_max = clamp(1, 1_000) as u32,
            "idle_timeout_s" => self.idle_timeout_s = clamp(1, 28_800),
            "skip_locked" => self.skip_locked = number != 0,
            _ => self.claim_spread = clamp(1, 64) as u32,
        }
        Ok(())
    }
}

/// A parsed `mysql://` URL. Its password never prints.
#[derive(Clone, PartialEq, Eq)]
pub struct MysqlUrl {
    /// The user name, if any.
    pub user: Option<String>,
    password: Option<String>,
    /// Host name or IP address (without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// The database (schema) name.
    pub database: String,
    /// Pool, timeout and retry settings.
    pub options: MysqlOptions,
}

impl fmt::Debug for MysqlUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlUrl")
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("host", &self.host)
            .field("port", &self.port)
            .field("database", &self.database)
            .field("options", &self.options)
            .finish()
    }
}

impl fmt::Display for MysqlUrl {
    /// The URL without its query, the password shown as `***`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("mysql://")?;
        if let Some(user) = &self.user {
            f.write_str(user)?;
            if self.password.is_some() {
                f.write_str(":***")?;
            }
            f.write_str("@")?;
        }
        if self.host.contains(':') {
            write!(f, "[{}]", self.host)?;
        } else {
            f.write_str(&self.host)?;
        }
        write!(f, ":{}/{}", self.port, self.database)
    }
}

fn bad(what: &str) -> LedgerError {
    LedgerError::BadInput(format!("--db: mysql URL {what} ({SHAPE})"))
}

impl MysqlUrl {
    /// The driver's options for this URL's server, user and database (the pool's
    /// settings come on top).
    pub(super) fn connection_opts(&self) -> mysql_async::OptsBuilder {
        mysql_async::OptsBuilder::default()
            .ip_or_hostname(self.host.clone())
            .tcp_port(self.port)
            .user(self.user.clone())
            .pass(self.expose_password().map(str::to_owned))
            .db_name(Some(self.database.clone()))
    }

    /// Parses a `mysql://` URL. Errors name the part at fault, never the password.
    pub fn parse(url: &str) -> Result<Self, LedgerError> {
        let rest = url
            .strip_prefix("mysql://")
            .ok_or_else(|| bad("must start with mysql://"))?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, database) = rest.split_once('/').ok_or_else(|| bad("has no database"))?;
        if database.contains('@') {
            // A '/' in the password, not percent-encoded: nothing of the URL is
            // echoed, since any part of it may be the password.
            return Err(bad(
                "has an '@' after its first '/': percent-encode a '/' in the user or password as %2F",
            ));
        }
        // The password may contain '@' when percent-encoding was forgotten: split at
        // the last one, which always ends the credentials.
        let (credentials, hostport) = match authority.rsplit_once('@') {
            Some((c, h)) => (Some(c), h),
            None => (None, authority),
        };
        let (user, password) = match credentials {
            None => (None, None),
            Some(c) => {
                let (u, p) = match c.split_once(':') {
                    Some((u, p)) => (u, Some(p)),
                    None => (c, None),
                };
                let user = percent_decode(u).ok_or_else(|| bad("has a malformed user name"))?;
                let password = match p {
                    Some(p) => Some(percent_decode(p).ok_or_else(|| bad("has a malformed password"))?),
                    None => None,
                };
                ((!user.is_empty()).then_some(user), password)
            }
        };
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (host, after) = v6.split_once(']').ok_or_else(|| bad("has an unclosed [ in its host"))?;
            match after {
                "" => (host, None),
                p => (
                    host,
                    Some(p.strip_prefix(':').ok_or_else(|| bad("has a malformed port"))?),
                ),
            }
        } else {
            match hostport.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        if host.is_empty() {
            return Err(bad("has no host"));
        }
        let port = match port {
            None => 3306,
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| bad("has a port that is not a number from 1 to 65535"))?,
        };
        let database = percent_decode(database).ok_or_else(|| bad("has a malformed database name"))?;
        if database.is_empty() {
            return Err(bad("has no database"));
        }
        if database.contains('/') || database.contains('`') {
            return Err(bad("has a database name with '/' or '`'"));
        }
        let mut options = MysqlOptions::default();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            options.set(name, value)?;
        }
        options.pool_min = options.pool_min.min(options.pool_max);
        Ok(Self {
            user,
            password,
            host: host.to_owned(),
            port,
            database,
            options,
        })
    }

    /// The password, for connecting; never log or print it.
    pub fn expose_password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The whole URL, password and options included (percent-encoded), for handing to
    /// another process of ours (a test starting workers); never log or print it.
    pub fn expose(&self) -> String {
        let mut out = String::from("mysql://");
        if let Some(user) = &self.user {
            out.push_str(&percent_encode(user.as_bytes()));
            if let Some(password) = &self.password {
                out.push(':');
                out.push_str(&percent_encode(password.as_bytes()));
            }
            out.push('@');
        }
        if self.host.contains(':') {
            out.push_str(&format!("[{}]", self.host));
        } else {
            out.push_str(&self.host);
        }
        let o = &self.options;
        out.push_str(&format!(
            ":{}/{}?pool_max={}&pool_min={}&connect_timeout_ms={}&lock_wait_timeout_s={}&retry_max={}\
             &idle_timeout_s={}&claim_spread={}&skip_locked={}",
            self.port,
            percent_encode(self.database.as_bytes()),
            o.pool_max,
            o.pool_min,
            o.connect_timeout_ms,
            o.lock_wait_timeout_s,
            o.retry_max,
            o.idle_timeout_s,
            o.claim_spread,
            u8::from(o.skip_locked)
        ));
        out
    }

    /// The same server and credentials with another database (tests create one
    /// database per test).
    pub fn with_database(&self, database: &str) -> Self {
        Self {
            database: database.to_owned(),
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_url_parses_with_defaults() {
        let u = MysqlUrl::parse("mysql://root@127.0.0.1:3306/test").unwrap();
        assert_eq!(u.user.as_deref(), Some("root"));
        assert_eq!(u.expose_password(), None);
        assert_eq!(
            (u.host.as_str(), u.port, u.database.as_str()),
            ("127.0.0.1", 3306, "test")
        );
        assert_eq!(u.options, MysqlOptions::default());
        assert_eq!(u.to_string(), "mysql://root@127.0.0.1:3306/test");
    }

    #[test]
    fn passwords_are_decoded_and_never_printed() {
        let u = MysqlUrl::parse("mysql://app:s%40cr%3At@db.example:3307/outbox").unwrap();
        assert_eq!(u.expose_password(), Some("s@cr:t"));
        assert_eq!(u.port, 3307);
        for shown in [u.to_string(), format!("{u:?}")] {
            assert!(!shown.contains("s@cr") && !shown.contains("cr%3A"), "{shown}");
            assert!(shown.contains("***"), "{shown}");
        }
        let raw = MysqlUrl::parse("mysql://app:p@ss@h/db").unwrap();
        assert_eq!(raw.expose_password(), Some("p@ss"));
    }

    #[test]
    fn exposing_round_trips_everything() {
        let u = MysqlUrl::parse("mysql://a%20b:p@ss:w%2Frd@[::1]:3310/db?pool_max=3&idle_timeout_s=9&skip_locked=0")
            .unwrap();
        assert_eq!(MysqlUrl::parse(&u.expose()).unwrap(), u);
        assert_eq!(u.expose_password(), Some("p@ss:w/rd"));
    }

    #[test]
    fn ipv6_hosts_and_default_port() {
        let u = MysqlUrl::parse("mysql://u@[::1]/d").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("::1", 3306));
        assert_eq!(u.to_string(), "mysql://u@[::1]:3306/d");
        let u = MysqlUrl::parse("mysql://[::1]:3310/d").unwrap();
        assert_eq!((u.user.as_deref(), u.port), (None, 3310));
    }

    #[test]
    fn options_are_parsed_and_clamped() {
        let u = MysqlUrl::parse(
            "mysql://u:pw@h/d?pool_max=1000&pool_min=3&connect_timeout_ms=1&lock_wait_timeout_s=2&retry_max=0&claim_spread=1",
        )
        .unwrap();
        let o = u.options;
        assert_eq!((o.pool_max, o.pool_min), (256, 3));
        assert_eq!(
            (o.connect_timeout_ms, o.lock_wait_timeout_s, o.retry_max, o.claim_spread),
            (100, 2, 1, 1)
        );
        let u = MysqlUrl::parse("mysql://u@h/d?pool_max=2&pool_min=9").unwrap();
        assert_eq!((u.options.pool_max, u.options.pool_min), (2, 2));
        assert!(
            u.options.skip_locked,
            "SKIP LOCKED is used where the server has it by default"
        );
        let u = MysqlUrl::parse("mysql://u@h/d?skip_locked=0").unwrap();
        assert!(!u.options.skip_locked);
        let u = MysqlUrl::parse("mysql://u@h/d?skip_locked=7").unwrap();
        assert!(u.options.skip_locked);
    }

    #[test]
    fn errors_name_the_part_and_never_the_password() {
        let cases = [
            ("mysql://u:secret@h", "has no database"),
            ("mysql://u:secret@h/", "has no database"),
            ("mysql://u:secret@/d", "has no host"),
            ("mysql://u:secret@h:99999/d", "port"),
            ("mysql://u:secret@h:x/d", "port"),
            (
                "mysql://u:secret@h/d?pool_max=many",
                "\"pool_max\" must be a whole number",
            ),
            (
                "mysql://u:secret@h/d?password=secret",
                "unknown mysql URL parameter \"password\"",
            ),
            ("mysql://u:secret%zz@h/d", "malformed password"),
        ];
        for (url, expected) in cases {
            let e = MysqlUrl::parse(url).unwrap_err();
            assert!(matches!(e, LedgerError::BadInput(_)), "{url}: {e:?}");
            let text = e.to_string();
            assert!(text.contains(expected), "{url}: {text}");
            assert!(!text.contains("secret"), "{url}: {text}");
        }
    }

    #[test]
    fn an_unencoded_slash_in_the_password_is_named_without_echoing_it() {
        for url in [
            "mysql://root:se/cret@127.0.0.1:3306/test",
            "mysql://root:secret/@db.example/test?pool_max=2",
        ] {
            let e = MysqlUrl::parse(url).unwrap_err().to_string();
            assert!(e.contains("percent-encode a '/'"), "{e}");
            for part in ["cret", "secret", "root", "127.0.0.1", "db.example"] {
                assert!(!e.contains(part), "{part:?} shown in {e}");
            }
        }
    }
}
