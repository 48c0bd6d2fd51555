//! Retention archives: what a prune deleted, kept verifiable ([`ArchiveWriter`],
//! [`verify`]).
//!
//! Format (JSON Lines, `leasehold-archive/1`, docs/retention.md): one line per
//! pruned attempt, [`ArchivedAttempt`] as canonical JSON — the attempt, its command
//! and its receipts as stored (evidence text and its SHA-256 included), the plan id
//! and fingerprint, the raw evidence fingerprint, and the line's own number
//! (`seq`, from 1) — then one manifest line, `{"manifest": {"format", "lines",
//! "sha256", "created_at"}}`, whose `sha256` is the SHA-256 over the bytes of every
//! line before it, newlines included. Lease tokens are never written (a command's
//! token does not serialize).
//!
//! [`verify`] re-checks every receipt's evidence against its SHA-256 and canonical
//! form with the engine's own [`verify_receipt`], recomputes each raw fingerprint,
//! checks each line's number (a removed or moved line shows), the line count and the
//! manifest's hash, and reports every problem with its line.

use crate::ledger::prune::BatchSink;
use crate::ledger::LedgerError;
use leasehold_engine::canonical::canonical_json;
use leasehold_engine::evidence::{raw_fingerprint, verify_receipt};
use leasehold_engine::{Attempt, AttemptRecord, Command, Plan, PlanId, Receipt, Timestamp};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{BufRead, BufWriter, Write};
use std::path::{Path, PathBuf};

/// The archive format this build writes and verifies.
pub const FORMAT: &str = "leasehold-archive/1";

/// One pruned attempt, as one archive line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArchivedAttempt {
    /// This line's number in the archive, from 1.
    pub seq: u64,
    /// The attempt's plan.
    pub plan_id: PlanId,
    /// The plan's fingerprint when the attempt was pruned.
    pub plan_fingerprint: String,
    /// [`raw_fingerprint`] of the receipts.
    pub raw_fingerprint: String,
    /// The attempt row.
    pub attempt: Attempt,
    /// Its command row (without its lease token).
    pub command: Command,
    /// Its receipt rows, by ordinal.
    pub receipts: Vec<Receipt>,
}

/// The last line's content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// [`FORMAT`].
    pub format: String,
    /// How many attempt lines precede it.
    pub lines: u64,
    /// SHA-256 over the bytes of every line before it, newlines included.
    pub sha256: String,
    /// When the archive was closed.
    pub created_at: Timestamp,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ManifestLine {
    manifest: Manifest,
}

/// Writes an archive: [`BatchSink::record`] appends a batch's lines and makes them
/// durable (flush, then `fsync`) before it returns; [`ArchiveWriter::finish`]
/// appends the manifest.
#[derive(Debug)]
pub struct ArchiveWriter {
    path: PathBuf,
    out: BufWriter<File>,
    hash: Sha256,
    lines: u64,
}

fn io_error(path: &Path, e: std::io::Error) -> LedgerError {
    LedgerError::Internal(format!("archive {}: {e}", path.display()))
}

impl ArchiveWriter {
    /// Creates the archive at `path`; an existing file is refused (never
    /// overwritten), naming the path.
    pub fn create(path: &Path) -> Result<Self, LedgerError> {
        let file = File::options()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| LedgerError::BadInput(format!("--archive {}: cannot create it: {e}", path.display())))?;
        Ok(Self {
            path: path.to_owned(),
            out: BufWriter::new(file),
            hash: Sha256::new(),
            lines: 0,
        })
    }

    /// How many attempt lines it holds so far.
    pub fn lines(&self) -> u64 {
        self.lines
    }

    fn line(&mut self, value: &impl Serialize) -> Result<(), LedgerError> {
        let value = serde_json::to_value(value).map_err(|e| LedgerError::Internal(format!("archive line: {e}")))?;
        let mut text = canonical_json(&value);
        text.push('\n');
        self.out
            .write_all(text.as_bytes())
            .map_err(|e| io_error(&self.path, e))?;
        self.hash.update(text.as_bytes());
        Ok(())
    }

    fn sync(&mut self) -> Result<(), LedgerError> {
        self.out.flush().map_err(|e| io_error(&self.path, e))?;
        self.out.get_ref().sync_data().map_err(|e| io_error(&self.path, e))
    }

    /// Appends the manifest and makes the file durable.
    pub fn finish(mut self, now: Timestamp) -> Result<PathBuf, LedgerError> {
        let manifest = Manifest {
            format: FORMAT.to_owned(),
            lines: self.lines,
            sha256: hex::encode(self.hash.clone().finalize()),
            created_at: now,
        };
        self.line(&ManifestLine { manifest })?;
        self.sync()?;
        Ok(self.path)
    }
}

impl BatchSink for ArchiveWriter {
    fn record(&mut self, plan: &Plan, batch: &[AttemptRecord]) -> Result<(), LedgerError> {
        for record in batch {
            self.lines += 1;
            let line = ArchivedAttempt {
                seq: self.lines,
                plan_id: plan.id.clone(),
                plan_fingerprint: plan.fingerprint.clone(),
                raw_fingerprint: raw_fingerprint(&record.receipts),
                attempt: record.attempt.clone(),
                command: record.command.clone(),
                receipts: record.receipts.clone(),
            };
            self.line(&line)?;
        }
        self.sync()
    }
}

/// One thing wrong with an archive, on one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The line (from 1).
    pub line: u64,
    /// What is wrong there.
    pub what: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.what)
    }
}

/// What [`verify`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verified {
    /// Attempt lines read.
    pub attempts: u64,
    /// Receipts checked.
    pub receipts: u64,
    /// Every problem, in line order; empty: the archive is intact.
    pub problems: Vec<Problem>,
}

impl Verified {
    /// Whether nothing is wrong.
    pub fn intact(&self) -> bool {
        self.problems.is_empty()
    }
}

/// The problems of one attempt line (numbered `line`).
fn check_attempt(line: u64, a: &ArchivedAttempt) -> Vec<String> {
    let mut out = Vec::new();
    if a.seq != line {
        out.push(format!(
            "it says it is line {}: a line before it was removed or lines were moved",
            a.seq
        ));
    }
    let id = &a.attempt.id;
    if a.attempt.plan_id != a.plan_id {
        out.push(format!(
            "attempt {id} belongs to plan {}, not {}",
            a.attempt.plan_id, a.plan_id
        ));
    }
    if &a.command.attempt_id != id {
        out.push(format!("command {} is not attempt {id}'s", a.command.id));
    }
    for r in &a.receipts {
        if &r.attempt_id != id {
            out.push(format!("receipt {} is not attempt {id}'s", r.ordinal));
        }
        if let Err(e) = verify_receipt(r) {
            out.push(e.to_string());
        }
    }
    let raw = raw_fingerprint(&a.receipts);
    if raw != a.raw_fingerprint {
        out.push(format!(
            "attempt {id}'s receipts fingerprint to {raw}, but the line records {}",
            a.raw_fingerprint
        ));
    }
    out
}

/// The problems of the manifest line, given the attempt lines before it and their
/// hash.
fn check_manifest(m: &Manifest, lines: u64, sha256: &str) -> Vec<String> {
    let mut out = Vec::new();
    if m.format != FORMAT {
        out.push(format!("manifest format {:?} is not {FORMAT:?}", m.format));
    }
    if m.lines != lines {
        out.push(format!("manifest counts {} lines but {lines} precede it", m.lines));
    }
    if m.sha256 != sha256 {
        out.push(format!(
            "the lines before it hash to {sha256} but the manifest records {}: a line was changed, added or removed",
            m.sha256
        ));
    }
    out
}

/// Reads one line's problems, or the manifest it is.
enum Read {
    Attempt(Box<ArchivedAttempt>),
    Manifest(Manifest),
    Bad(String),
}

fn read_line(bytes: &[u8]) -> Read {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Read::Bad("not UTF-8 text".into());
    };
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return Read::Bad(format!("not JSON ({e})")),
    };
    if value.get("manifest").is_some() {
        return match serde_json::from_value::<ManifestLine>(value) {
            Ok(m) => Read::Manifest(m.manifest),
            Err(e) => Read::Bad(format!("not a manifest ({e})")),
        };
    }
    match serde_json::from_value::<ArchivedAttempt>(value) {
        Ok(a) => Read::Attempt(Box::new(a)),
        Err(e) => Read::Bad(format!("not an archived attempt ({e})")),
    }
}

/// Verifies an archive read from `input`; an error only when it cannot be read.
pub fn verify(mut input: impl BufRead) -> std::io::Result<Verified> {
    let mut found = Verified::default();
    let mut hash = Sha256::new();
    let (mut line, mut manifest_at) = (0u64, None);
    let mut bytes = Vec::new();
    loop {
        bytes.clear();
        if input.read_until(b'\n', &mut bytes)? == 0 {
            break;
        }
        line += 1;
        let whats = match (manifest_at, read_line(bytes.strip_suffix(b"\n").unwrap_or(&bytes))) {
            (Some(at), _) => vec![format!("a line after the manifest (line {at})")],
            (None, Read::Manifest(m)) => {
                manifest_at = Some(line);
                check_manifest(&m, line - 1, &hex::encode(hash.clone().finalize()))
            }
            (None, Read::Attempt(a)) => {
                found.attempts += 1;
                found.receipts += a.receipts.len() as u64;
                check_attempt(line, &a)
            }
            (None, Read::Bad(what)) => vec![what],
        };
        found
            .problems
            .extend(whats.into_iter().map(|what| Problem { line, what }));
        hash.update(&bytes);
    }
    if manifest_at.is_none() {
        found.problems.push(Problem {
            line: line + 1,
            what: "no manifest line: the archive was cut short or its prune stopped before it ended".into(),
        });
    }
    Ok(found)
}
