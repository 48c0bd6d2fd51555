//! Schema parity across `migrations/*`: every backend's migrations, applied to a fresh
//! database, leave the same tables, columns (kind, nullability, default), primary keys,
//! unique constraints, foreign keys and CHECK constraints, and the secondary indexes
//! that [`INDEXES`] declares for that backend — no more, no fewer.
//!
//! The schema is read back from each live database (SQLite's catalogue and pragmas,
//! MySQL's `information_schema`, PostgreSQL's `pg_catalog`), not parsed from the SQL
//! text, so a migration that rebuilds a table or renames an index is seen as the server
//! sees it. SQLite always runs; MySQL needs `LEASEHOLD_TEST_MYSQL_URL`, PostgreSQL
//! `LEASEHOLD_TEST_POSTGRES_URL` (`.ci/run` sets both); without one, that backend is
//! skipped with a message.
//!
//! A CHECK constraint is compared by what it mentions: the table's columns it names and
//! the literals it compares them with (`status IN ('A', 'B')`, `status = 'A' OR status =
//! 'B'` and PostgreSQL's `status = ANY (ARRAY['A'::text, 'B'::text])` are one check).

use leasehold::clock::SystemClock;
use leasehold::entropy::OsEntropy;
use leasehold::ledger::mysql::scratch::ScratchDatabase;
use leasehold::ledger::mysql::{MysqlLedger, MysqlUrl};
use leasehold::ledger::postgres::scratch::ScratchDatabase as PgScratch;
use leasehold::ledger::postgres::{PostgresLedger, PostgresUrl};
use leasehold::ledger::sqlite::SqliteLedger;
use leasehold::ledger::Ledger;
use mysql_async::prelude::Queryable;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Columns that exist on some backends only, and why.
const ONLY_ON: &[(&str, &str, &[Backend], &str)] = &[
    (
        "plan",
        "seq",
        &[Backend::Mysql, Backend::Postgres],
        "registration order; SQLite has its rowid",
    ),
    (
        "attempt",
        "room",
        &[Backend::Sqlite],
        "zero bytes a row grows into in place; the others leave free space in their pages",
    ),
    ("command", "room", &[Backend::Sqlite], "as attempt.room"),
    ("receipt", "room", &[Backend::Sqlite], "as attempt.room"),
];

/// Secondary (non-unique, non-key) indexes: what each serves, and its name on SQLite,
/// MySQL and PostgreSQL (`None`: that backend serves the read otherwise, as the reason says).
const INDEXES: &[(&str, [Option<&str>; 3], &str)] = &[
    (
        "register_plan: READY plans by fingerprint",
        [
            Some("plan_by_fingerprint"),
            Some("plan_by_fingerprint"),
            Some("plan_by_fingerprint"),
        ],
        "",
    ),
    (
        "find_plan: plans by name (history, gate, the API and the console take a name)",
        [Some("plan_by_name"), Some("plan_by_name"), Some("plan_by_name")],
        "MySQL indexes a 191-character prefix of the TEXT name",
    ),
    (
        "claims: PENDING commands by available_at",
        [
            Some("command_pending"),
            Some("command_claimable"),
            Some("command_pending"),
        ],
        "MySQL has no partial index: (status, available_at, id, attempt_id)",
    ),
    (
        "takeovers and reconcile: PROCESSING commands by lease_until",
        [Some("command_leased"), Some("command_expired"), Some("command_leased")],
        "MySQL has no partial index: (status, lease_until)",
    ),
    (
        "open attempts: QUEUED and RUNNING, counted by their PENDING and PROCESSING commands",
        [
            Some("command_leased"),
            Some("command_claimable"),
            Some("command_leased"),
        ],
        "the claims' indexes (MySQL's (status, available_at, id, attempt_id) holds both statuses)",
    ),
    (
        "open attempts: QUEUED behind an order key, counted by their WAITING commands",
        [
            Some("command_waiting"),
            Some("command_claimable"),
            Some("command_waiting"),
        ],
        "MySQL has no partial index: its (status, available_at, id, attempt_id) holds WAITING too",
    ),
    (
        "ordered keys: a template's attempts with an order key, by number",
        [
            Some("attempt_by_order_key"),
            Some("attempt_by_order_key"),
            Some("attempt_by_order_key"),
        ],
        "SQLite and PostgreSQL hold only the attempts with a key",
    ),
    (
        "target limits: a target's live leases, counted on every admission onto it",
        [
            Some("command_leased_by_target"),
            Some("command_leased_by_target"),
            Some("command_leased_by_target"),
        ],
        "MySQL has no partial index: (target, status, lease_until)",
    ),
    (
        "the console's capped counts of ended attempts, and its pages by state",
        [None, Some("attempt_by_status"), None],
        "SQLite and PostgreSQL read FAILED and ABORTED through attempt_failed and attempt_aborted; QUEUED and RUNNING are counted by their commands everywhere",
    ),
    (
        "listing: attempts newest first",
        [Some("attempt_by_created"), None, Some("attempt_by_created")],
        "MySQL pages by primary key (its migrations stay re-runnable without CREATE INDEX IF NOT EXISTS)",
    ),
    (
        "listing: FAILED attempts",
        [Some("attempt_failed"), None, Some("attempt_failed")],
        "MySQL has no partial index",
    ),
    (
        "listing: ABORTED attempts",
        [Some("attempt_aborted"), None, Some("attempt_aborted")],
        "MySQL has no partial index",
    ),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Mysql,
    Postgres,
}

impl Backend {
    fn slot(self) -> usize {
        match self {
            Self::Sqlite => 0,
            Self::Mysql => 1,
            Self::Postgres => 2,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Text,
    Integer,
    Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Column {
    kind: Kind,
    nullable: bool,
    /// The default, reduced to its literal (`0`), if any.
    default: Option<String>,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Table {
    columns: BTreeMap<String, Column>,
    primary_key: Vec<String>,
    uniques: BTreeSet<Vec<String>>,
    foreign_keys: BTreeSet<ForeignKey>,
    /// Each check as "columns | literals".
    checks: BTreeSet<String>,
    indexes: BTreeSet<String>,
}

type Schema = BTreeMap<String, Table>;

/// (columns, referenced table, referenced columns)
type ForeignKey = (Vec<String>, String, Vec<String>);

fn kind(type_name: &str) -> Kind {
    let t = type_name.to_ascii_lowercase();
    if t.contains("int") {
        Kind::Integer
    } else if t.contains("char") || t.contains("text") {
        Kind::Text
    } else if t.contains("blob") || t.contains("bytea") || t.contains("binary") {
        Kind::Bytes
    } else {
        panic!("column type {type_name} is neither text nor integer: extend the parity test's kinds")
    }
}

/// A default reduced to its literal: `'0'`, `0` and `0::bigint` are `0`.
fn default_literal(raw: Option<String>) -> Option<String> {
    let raw = raw?;
    let raw = raw.trim();
    if raw.eq_ignore_ascii_case("null") {
        return None;
    }
    let raw = raw.split("::").next().unwrap_or(raw);
    Some(raw.trim_matches(|c| c == '\'' || c == '(' || c == ')').to_string())
}

/// A CHECK clause reduced to the table's columns it names and the literals it uses.
fn check_key(clause: &str, columns: &BTreeMap<String, Column>) -> String {
    let mut names = BTreeSet::new();
    let mut literals = BTreeSet::new();
    let chars: Vec<char> = clause.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\'' {
            let start = i + 1;
            i += 1;
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            literals.insert(format!(
                "'{}'",
                chars[start..i.min(chars.len())].iter().collect::<String>()
            ));
            i += 1;
        } else if c.is_ascii_digit() {
            let start = i;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            literals.insert(chars[start..i].iter().collect::<String>());
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            if columns.contains_key(&word) {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    let names: Vec<_> = names.into_iter().collect();
    let literals: Vec<_> = literals.into_iter().collect();
    format!("{} | {}", names.join(","), literals.join(","))
}

/// The bodies of every `CHECK (…)` in a `CREATE TABLE` statement (comments removed).
fn sqlite_checks(sql: &str) -> Vec<String> {
    let text: String = sql
        .lines()
        .map(|l| l.split("--").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let upper = text.to_ascii_uppercase();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = upper[from..].find("CHECK") {
        let start = from + at + "CHECK".len();
        let open = start + upper[start..].find('(').expect("CHECK without (");
        let mut depth = 0;
        let mut end = open;
        for (i, c) in text[open..].char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + i;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.push(text[open + 1..end].to_string());
        from = end;
    }
    out
}

fn sqlite_schema() -> Schema {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("parity.db");
    let path = path.to_str().expect("utf-8 path");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let ledger = SqliteLedger::open(path, Arc::new(SystemClock), Arc::new(OsEntropy)).expect("open");
        ledger.migrate().await.expect("migrate");
    });
    let conn = rusqlite::Connection::open(path).expect("reopen");
    let mut schema = Schema::new();
    let tables: Vec<(String, String)> = conn
        .prepare("SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    for (name, sql) in tables {
        let mut table = Table::default();
        let mut pk: Vec<(i64, String)> = Vec::new();
        let mut stmt = conn.prepare(&format!("PRAGMA table_info(\"{name}\")")).unwrap();
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, Option<String>>(4)?,
                    r.get::<_, i64>(5)?,
                ))
            })
            .unwrap();
        for row in rows {
            let (column, type_name, notnull, default, pk_at) = row.unwrap();
            if pk_at > 0 {
                pk.push((pk_at, column.clone()));
            }
            // A single-column INTEGER/TEXT PRIMARY KEY is NOT NULL by our declarations.
            table.columns.insert(
                column,
                Column {
                    kind: kind(&type_name),
                    nullable: notnull == 0 && pk_at == 0,
                    default: default_literal(default),
                },
            );
        }
        pk.sort();
        table.primary_key = pk.into_iter().map(|(_, c)| c).collect();
        let indexes: Vec<(String, i64, String)> = conn
            .prepare(&format!("PRAGMA index_list(\"{name}\")"))
            .unwrap()
            .query_map([], |r| Ok((r.get(1)?, r.get(2)?, r.get(3)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        for (index, unique, origin) in indexes {
            let columns: Vec<String> = conn
                .prepare(&format!("PRAGMA index_info(\"{index}\")"))
                .unwrap()
                .query_map([], |r| r.get(2))
                .unwrap()
                .map(Result::unwrap)
                .collect();
            match (origin.as_str(), unique) {
                ("pk", _) => {}
                // A unique constraint, or a unique index (SQLite adds no unique column
                // to an existing table: a migration creates the index instead).
                ("u", _) | ("c", 1) => {
                    table.uniques.insert(columns);
                }
                ("c", 0) => {
                    table.indexes.insert(index);
                }
                _ => panic!("sqlite: unexpected index {index} on {name} (origin {origin}, unique {unique})"),
            }
        }
        let fks: Vec<(i64, String, String, String)> = conn
            .prepare(&format!("PRAGMA foreign_key_list(\"{name}\")"))
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(2)?, r.get(3)?, r.get(4)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let mut by_id: BTreeMap<i64, ForeignKey> = BTreeMap::new();
        for (id, target, from, to) in fks {
            let entry = by_id.entry(id).or_insert_with(|| (Vec::new(), target, Vec::new()));
            entry.0.push(from);
            entry.2.push(to);
        }
        table.foreign_keys = by_id.into_values().collect();
        for clause in sqlite_checks(&sql) {
            let key = check_key(&clause, &table.columns);
            table.checks.insert(key);
        }
        schema.insert(name, table);
    }
    schema
}

async fn mysql_schema(admin: &MysqlUrl) -> Schema {
    let db = ScratchDatabase::create(admin, "lh_parity_")
        .await
        .expect("scratch database");
    let ledger = MysqlLedger::open(db.url(), Arc::new(OsEntropy));
    ledger.migrate().await.expect("migrate");
    ledger.disconnect().await.expect("disconnect");
    let url = db.url();
    let opts = mysql_async::OptsBuilder::default()
        .ip_or_hostname(url.host.clone())
        .tcp_port(url.port)
        .user(url.user.clone())
        .pass(url.expose_password().map(str::to_string))
        .db_name(Some(url.database.clone()));
    let pool = mysql_async::Pool::new(opts);
    let mut conn = pool.get_conn().await.expect("connect");
    let database = db.url().database.clone();
    let mut schema = Schema::new();
    let columns: Vec<(String, String, String, String, Option<String>)> = conn
        .exec(
            "SELECT table_name, column_name, data_type, is_nullable, column_default FROM information_schema.columns
             WHERE table_schema = ? ORDER BY table_name, ordinal_position",
            (database.as_str(),),
        )
        .await
        .expect("columns");
    for (table, column, type_name, nullable, default) in columns {
        schema.entry(table).or_default().columns.insert(
            column,
            Column {
                kind: kind(&type_name),
                nullable: nullable == "YES",
                default: default_literal(default),
            },
        );
    }
    let stats: Vec<(String, String, i64, String)> = conn
        .exec(
            "SELECT table_name, index_name, non_unique, column_name FROM information_schema.statistics
             WHERE table_schema = ? ORDER BY table_name, index_name, seq_in_index",
            (database.as_str(),),
        )
        .await
        .expect("statistics");
    let mut indexes: BTreeMap<(String, String), (i64, Vec<String>)> = BTreeMap::new();
    for (table, index, non_unique, column) in stats {
        indexes
            .entry((table, index))
            .or_insert((non_unique, Vec::new()))
            .1
            .push(column);
    }
    for ((table, index), (non_unique, columns)) in indexes {
        let t = schema.get_mut(&table).expect("index on a known table");
        if index == "PRIMARY" {
            t.primary_key = columns;
        } else if non_unique == 0 {
            t.uniques.insert(columns);
        } else {
            t.indexes.insert(index);
        }
    }
    let fks: Vec<(String, String, String, String, String)> = conn
        .exec(
            "SELECT table_name, constraint_name, column_name, referenced_table_name, referenced_column_name
             FROM information_schema.key_column_usage
             WHERE table_schema = ? AND referenced_table_name IS NOT NULL
             ORDER BY table_name, constraint_name, ordinal_position",
            (database.as_str(),),
        )
        .await
        .expect("foreign keys");
    let mut by_name: BTreeMap<(String, String), ForeignKey> = BTreeMap::new();
    for (table, name, column, target, to) in fks {
        let entry = by_name
            .entry((table, name))
            .or_insert_with(|| (Vec::new(), target, Vec::new()));
        entry.0.push(column);
        entry.2.push(to);
    }
    for ((table, _), fk) in by_name {
        schema
            .get_mut(&table)
            .expect("fk on a known table")
            .foreign_keys
            .insert(fk);
    }
    let checks: Vec<(String, String)> = conn
        .exec(
            "SELECT table_name, check_clause FROM information_schema.check_constraints WHERE constraint_schema = ?",
            (database.as_str(),),
        )
        .await
        .expect("checks");
    for (table, clause) in checks {
        let t = schema.get_mut(&table).expect("check on a known table");
        let key = check_key(&clause.replace('`', ""), &t.columns);
        t.checks.insert(key);
    }
    // An UNSIGNED column is MySQL's spelling of `CHECK (column >= 0)`, unless a CHECK of
    // its own already bounds it (`number >= 1`).
    let unsigned: Vec<(String, String)> = conn
        .exec(
            "SELECT table_name, column_name FROM information_schema.columns
             WHERE table_schema = ? AND column_type LIKE '%unsigned%'",
            (database.as_str(),),
        )
        .await
        .expect("unsigned columns");
    for (table, column) in unsigned {
        let t = schema.get_mut(&table).expect("column of a known table");
        if !t.checks.iter().any(|k| k.starts_with(&format!("{column} | "))) {
            t.checks.insert(format!("{column} | 0"));
        }
    }
    drop(conn);
    pool.disconnect().await.expect("disconnect");
    drop(db);
    schema
}

async fn postgres_schema(admin: &PostgresUrl) -> Schema {
    let db = PgScratch::create(admin, "lh_parity_").await.expect("scratch database");
    let ledger = PostgresLedger::open(db.url(), Arc::new(OsEntropy)).expect("open");
    ledger.migrate().await.expect("migrate");
    let (client, connection) = db
        .url()
        .config()
        .connect(tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to LEASEHOLD_TEST_POSTGRES_URL: {e}"));
    tokio::spawn(connection);
    let ns = "public".to_string();
    let mut schema = Schema::new();
    for row in client
        .query(
            "SELECT table_name::text, column_name::text, data_type::text, is_nullable::text, column_default::text
             FROM information_schema.columns WHERE table_schema = $1 ORDER BY table_name, ordinal_position",
            &[&ns],
        )
        .await
        .expect("columns")
    {
        let (table, column, type_name, nullable): (String, String, String, String) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        let default: Option<String> = row.get(4);
        schema.entry(table).or_default().columns.insert(
            column,
            Column {
                kind: kind(&type_name),
                nullable: nullable == "YES",
                default: default_literal(default),
            },
        );
    }
    // Constraints: contype p (primary key), u (unique), f (foreign key), c (check).
    for row in client
        .query(
            "SELECT t.relname::text, c.contype::text,
                    ARRAY(SELECT a.attname::text FROM unnest(c.conkey) WITH ORDINALITY k(n, i)
                          JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n ORDER BY k.i),
                    COALESCE(r.relname::text, ''),
                    ARRAY(SELECT a.attname::text FROM unnest(c.confkey) WITH ORDINALITY k(n, i)
                          JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.n ORDER BY k.i),
                    pg_get_constraintdef(c.oid)
             FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid
             JOIN pg_namespace n ON n.oid = t.relnamespace
             LEFT JOIN pg_class r ON r.oid = c.confrelid
             WHERE n.nspname = $1",
            &[&ns],
        )
        .await
        .expect("constraints")
    {
        let table: String = row.get(0);
        let kind: String = row.get(1);
        let columns: Vec<String> = row.get(2);
        let t = schema.get_mut(&table).expect("constraint on a known table");
        match kind.as_str() {
            "p" => t.primary_key = columns,
            "u" => {
                t.uniques.insert(columns);
            }
            "f" => {
                t.foreign_keys.insert((columns, row.get(3), row.get(4)));
            }
            "c" => {
                let def: String = row.get(5);
                let key = check_key(&def, &t.columns);
                t.checks.insert(key);
            }
            other => panic!("postgres: unexpected constraint kind {other} on {table}"),
        }
    }
    for row in client
        .query(
            "SELECT t.relname::text, i.relname::text FROM pg_index x
             JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid
             JOIN pg_namespace n ON n.oid = t.relnamespace
             WHERE n.nspname = $1 AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid)",
            &[&ns],
        )
        .await
        .expect("indexes")
    {
        let table: String = row.get(0);
        schema
            .get_mut(&table)
            .expect("index on a known table")
            .indexes
            .insert(row.get(1));
    }
    client
        .batch_execute(&format!("DROP SCHEMA {ns} CASCADE"))
        .await
        .expect("drop schema");
    schema
}

/// The schema with what [`ONLY_ON`] allows on `backend` removed, the migrator's own
/// bookkeeping table left out, and the indexes checked against [`INDEXES`].
fn normalised(backend: Backend, mut schema: Schema) -> Schema {
    schema.remove("schema_migrations");
    for (table, column, on, _) in ONLY_ON {
        let t = schema
            .get_mut(*table)
            .unwrap_or_else(|| panic!("{backend:?}: no table {table}"));
        let present = t.columns.remove(*column).is_some();
        assert_eq!(present, on.contains(&backend), "{backend:?}: {table}.{column} presence");
        t.uniques.retain(|u| !u.iter().any(|c| c == column));
        t.checks
            .retain(|k| !k.split(" | ").next().unwrap_or("").split(',').any(|c| c == *column));
    }
    let declared: BTreeSet<String> = INDEXES
        .iter()
        .filter_map(|(_, names, _)| names[backend.slot()].map(str::to_string))
        .collect();
    let actual: BTreeSet<String> = schema
        .values_mut()
        .flat_map(|t| std::mem::take(&mut t.indexes))
        .collect();
    assert_eq!(
        actual, declared,
        "{backend:?}: secondary indexes differ from the parity test's INDEXES table (declare a new index for every backend)"
    );
    schema
}

fn assert_same(left: (Backend, &Schema), right: (Backend, &Schema)) {
    let names = |s: &Schema| s.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(left.1), names(right.1), "tables: {:?} vs {:?}", left.0, right.0);
    for (name, l) in left.1 {
        let r = &right.1[name];
        assert_eq!(l.columns, r.columns, "{name} columns: {:?} vs {:?}", left.0, right.0);
        assert_eq!(
            l.primary_key, r.primary_key,
            "{name} primary key: {:?} vs {:?}",
            left.0, right.0
        );
        assert_eq!(
            l.uniques, r.uniques,
            "{name} unique constraints: {:?} vs {:?}",
            left.0, right.0
        );
        assert_eq!(
            l.foreign_keys, r.foreign_keys,
            "{name} foreign keys: {:?} vs {:?}",
            left.0, right.0
        );
        assert_eq!(l.checks, r.checks, "{name} checks: {:?} vs {:?}", left.0, right.0);
    }
}

#[test]
fn every_backend_migrates_to_the_same_schema() {
    let sqlite = normalised(Backend::Sqlite, sqlite_schema());
    for table in ["plan", "attempt", "receipt", "command", "api_token"] {
        assert!(sqlite.contains_key(table), "sqlite has no {table} table");
    }
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    match std::env::var("LEASEHOLD_TEST_MYSQL_URL") {
        Ok(url) if !url.is_empty() => {
            let admin = MysqlUrl::parse(&url).expect("LEASEHOLD_TEST_MYSQL_URL");
            let mysql = normalised(Backend::Mysql, runtime.block_on(mysql_schema(&admin)));
            assert_same((Backend::Sqlite, &sqlite), (Backend::Mysql, &mysql));
        }
        _ => println!("skipped MySQL: LEASEHOLD_TEST_MYSQL_URL is not set"),
    }
    match std::env::var("LEASEHOLD_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => {
            let admin = PostgresUrl::parse(&url).expect("LEASEHOLD_TEST_POSTGRES_URL");
            let postgres = normalised(Backend::Postgres, runtime.block_on(postgres_schema(&admin)));
            assert_same((Backend::Sqlite, &sqlite), (Backend::Postgres, &postgres));
        }
        _ => println!("skipped PostgreSQL: LEASEHOLD_TEST_POSTGRES_URL is not set"),
    }
}

#[test]
fn check_keys_ignore_spelling_but_not_meaning() {
    let mut columns = BTreeMap::new();
    columns.insert(
        "status".to_string(),
        Column {
            kind: Kind::Text,
            nullable: false,
            default: None,
        },
    );
    let a = check_key("status IN ('READY', 'RETIRED')", &columns);
    let b = check_key("status = 'READY' OR status = 'RETIRED'", &columns);
    let c = check_key("((status = ANY (ARRAY['READY'::text, 'RETIRED'::text])))", &columns);
    let d = check_key("status IN ('READY')", &columns);
    assert_eq!(a, b);
    assert_eq!(a, c);
    assert_ne!(a, d);
}
