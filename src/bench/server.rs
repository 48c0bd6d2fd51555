//! The database server's own figures over a bench's deliveries: what the server did
//! per delivery, by its own counters, and how much CPU its process used, so that a
//! server that is the bottleneck shows as one.
//!
//! Contract: [`probe_for`] answers a probe for a MySQL or MariaDB ledger (none for
//! the others). [`ServerProbe::snapshot`] reads `SHOW GLOBAL STATUS` (statements,
//! commits, InnoDB fsyncs, row-lock waits, the handler's row reads, updates and
//! temporary-table writes, counters MariaDB and MySQL both keep) on one of the
//! ledger's own connections, and, when the server runs on this machine (a loopback
//! host, and the process named by its `@@pid_file` is a `mariadbd` or `mysqld`), the
//! CPU time of every thread of that process from `/proc`. [`ServerFigures::between`]
//! turns two snapshots into the figures of the window between them. The counters are
//! the whole server's: anything else it serves in the window counts too (the probe's
//! own two statements per snapshot included). Threads that end inside the window take
//! their CPU time with them, so the CPU figure is a lower bound.

use crate::ledger::mysql::MysqlLedger;
use crate::ledger::LedgerError;
use serde::Serialize;
use std::any::Any;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

/// The `SHOW GLOBAL STATUS` counters a snapshot reads, and the field each fills.
const COUNTERS: [&str; 9] = [
    "Questions",
    "Com_commit",
    "Innodb_data_fsyncs",
    "Innodb_row_lock_waits",
    "Handler_read_key",
    "Handler_read_next",
    "Handler_read_rnd_next",
    "Handler_update",
    "Handler_tmp_write",
];

/// A server's counters at one moment.
#[derive(Debug, Clone)]
pub struct Snapshot {
    at: Instant,
    version: String,
    counters: BTreeMap<String, u64>,
    cpu_ns: Option<u64>,
}

/// What the server did between two snapshots.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerFigures {
    /// The server's version string (`@@version`).
    pub version: String,
    /// Statements the server received (`Questions`).
    pub statements: u64,
    /// Transactions committed (`Com_commit`; InnoDB's group commit may share one log
    /// flush between several).
    pub commits: u64,
    /// InnoDB's fsyncs, redo log and data files (`Innodb_data_fsyncs`).
    pub fsyncs: u64,
    /// Row-lock waits (`Innodb_row_lock_waits`).
    pub row_lock_waits: u64,
    /// Rows the handler read by key, next in an index, or in a scan
    /// (`Handler_read_key` + `Handler_read_next` + `Handler_read_rnd_next`).
    pub rows_read: u64,
    /// Rows the handler updated (`Handler_update`).
    pub rows_updated: u64,
    /// Rows written to internal temporary tables (`Handler_tmp_write`).
    pub temp_table_rows: u64,
    /// CPU time of the server process over the window, when it runs on this machine.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_ms: Option<u64>,
    /// The window's length.
    pub window_ms: u64,
    /// This machine's cores (the server's CPU is out of these when it runs here).
    pub machine_cores: usize,
}

impl ServerFigures {
    /// The figures of the window from `before` to `after`.
    pub fn between(before: &Snapshot, after: &Snapshot) -> Self {
        let delta = |name: &str| {
            let get = |s: &Snapshot| s.counters.get(name).copied().unwrap_or(0);
            get(after).saturating_sub(get(before))
        };
        let cpu_ns = match (before.cpu_ns, after.cpu_ns) {
            (Some(b), Some(a)) => Some(a.saturating_sub(b)),
            _ => None,
        };
        Self {
            version: after.version.clone(),
            statements: delta("Questions"),
            commits: delta("Com_commit"),
            fsyncs: delta("Innodb_data_fsyncs"),
            row_lock_waits: delta("Innodb_row_lock_waits"),
            rows_read: delta("Handler_read_key") + delta("Handler_read_next") + delta("Handler_read_rnd_next"),
            rows_updated: delta("Handler_update"),
            temp_table_rows: delta("Handler_tmp_write"),
            cpu_ms: cpu_ns.map(|ns| ns / 1_000_000),
            window_ms: after.at.saturating_duration_since(before.at).as_millis() as u64,
            machine_cores: std::thread::available_parallelism().map_or(1, usize::from),
        }
    }

    /// The server's CPU time over the window as a percentage of one core.
    pub fn cpu_percent_of_one_core(&self) -> Option<f64> {
        self.cpu_ms
            .map(|cpu| 100.0 * cpu as f64 / (self.window_ms.max(1) as f64))
    }
}

/// Reads a server's counters (see the module's contract).
#[derive(Clone)]
pub struct ServerProbe {
    ledger: MysqlLedger,
}

impl std::fmt::Debug for ServerProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerProbe").field("url", self.ledger.url()).finish()
    }
}

/// A probe for the server behind `ledger`, if it is a MySQL or MariaDB ledger.
pub fn probe_for(ledger: &dyn Any) -> Option<ServerProbe> {
    ledger
        .downcast_ref::<MysqlLedger>()
        .map(|mysql| ServerProbe { ledger: mysql.clone() })
}

impl ServerProbe {
    /// The server's counters now, read on one of the ledger's own connections.
    pub async fn snapshot(&self) -> Result<Snapshot, LedgerError> {
        let status = self.ledger.server_status(&COUNTERS).await?;
        let at = Instant::now();
        let mut counters = BTreeMap::new();
        for (name, value) in status.variables {
            let value = value
                .parse::<u64>()
                .map_err(|_| LedgerError::Internal(format!("server figures: {name} is {value:?}, not a count")))?;
            counters.insert(name, value);
        }
        let cpu_ns = if is_loopback(&self.ledger.url().host) {
            status.pid_file.and_then(|f| local_server_cpu_ns(Path::new(&f)))
        } else {
            None
        };
        Ok(Snapshot {
            at,
            version: status.version,
            counters,
            cpu_ns,
        })
    }
}

fn is_loopback(host: &str) -> bool {
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The CPU time (ns) of every thread of the server process whose pid `pid_file`
/// holds, if that process is a MariaDB or MySQL server on this machine.
fn local_server_cpu_ns(pid_file: &Path) -> Option<u64> {
    let pid: u32 = std::fs::read_to_string(pid_file).ok()?.trim().parse().ok()?;
    let proc_dir = Path::new("/proc").join(pid.to_string());
    let comm = std::fs::read_to_string(proc_dir.join("comm")).ok()?;
    if !matches!(comm.trim(), "mariadbd" | "mysqld") {
        return None;
    }
    let mut total = 0u64;
    for task in std::fs::read_dir(proc_dir.join("task")).ok()? {
        let Ok(task) = task else { continue };
        // The first field of schedstat is the time the thread ran, in nanoseconds.
        let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue;
        };
        total += stat
            .split_whitespace()
            .next()
            .and_then(|ns| ns.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(ms: u64, counters: &[(&str, u64)], cpu_ns: Option<u64>, at: Instant) -> Snapshot {
        Snapshot {
            at: at + std::time::Duration::from_millis(ms),
            version: "10.11.19-MariaDB".into(),
            counters: counters.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
            cpu_ns,
        }
    }

    #[test]
    fn figures_are_the_differences_of_two_snapshots() {
        let t = Instant::now();
        let before = snapshot(0, &[("Questions", 100), ("Com_commit", 10)], Some(5_000_000_000), t);
        let after = snapshot(
            2_000,
            &[
                ("Questions", 1_100),
                ("Com_commit", 210),
                ("Innodb_data_fsyncs", 7),
                ("Handler_read_key", 3),
                ("Handler_read_next", 4),
            ],
            Some(7_500_000_000),
            t,
        );
        let f = ServerFigures::between(&before, &after);
        assert_eq!((f.statements, f.commits, f.fsyncs, f.rows_read), (1_000, 200, 7, 7));
        assert_eq!(f.cpu_ms, Some(2_500));
        assert_eq!(f.window_ms, 2_000);
        assert_eq!(f.cpu_percent_of_one_core(), Some(125.0));
        let unknown = ServerFigures::between(&before, &snapshot(1_000, &[], None, t));
        assert_eq!(
            (unknown.statements, unknown.cpu_ms),
            (0, None),
            "a counter never goes below zero"
        );
    }

    #[test]
    fn only_a_loopback_host_is_read_from_this_machine() {
        assert!(is_loopback("127.0.0.1") && is_loopback("::1") && is_loopback("localhost"));
        assert!(!is_loopback("db.internal") && !is_loopback("10.0.0.5"));
    }

    #[test]
    fn a_pid_file_of_another_program_gives_no_cpu_figure() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("server.pid");
        // This test process is not a database server.
        std::fs::write(&pid_file, std::process::id().to_string()).unwrap();
        assert_eq!(local_server_cpu_ns(&pid_file), None);
        assert_eq!(local_server_cpu_ns(&dir.path().join("missing.pid")), None);
    }
}
