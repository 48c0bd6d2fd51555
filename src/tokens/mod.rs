//! API tokens: who may call `leasehold serve`, and with which role.
//!
//! A token is a random secret (`lh_` and 64 hex digits, 256 bits from the OS) shown
//! once when it is created. The ledger stores only its SHA-256 ([`token_hash`]), its
//! unique name, its [`Role`], when it was created and, once revoked, when. A request
//! presents the secret; the server hashes it and looks the hash up
//! ([`TokenStore::token_by_hash`]): a revoked token is refused from the next request
//! on. Nothing here ever logs, prints or answers a secret or a hash.
//!
//! Storage: [`TokenStore`] is implemented by every ledger: the memory ledger keeps
//! the rows beside its state, SQLite, MySQL and PostgreSQL in the `api_token` table
//! (`migrations/sqlite/0004_api_tokens.sql`, `migrations/mysql/0003_api_tokens.sql`,
//! `migrations/postgres/0001_init.sql`):
//! `name` (primary key, at most [`NAME_MAX_CHARS`] characters), `role` (`viewer`,
//! `producer`, `operator` or `admin`), `sha256` (64 lowercase hex digits, unique), `created_at`
//! and `revoked_at` (milliseconds since the Unix epoch; `revoked_at` NULL while
//! active). Every operation is one plain SQL statement.

mod mysql;
mod postgres;
mod sqlite;

use crate::ledger::LedgerError;
use leasehold_engine::Timestamp;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::fmt;
use std::future::Future;
use std::str::FromStr;

/// The longest token name, in characters.
pub const NAME_MAX_CHARS: usize = 64;

/// What a token may do. `viewer`, `operator` and `admin` each include the ones before
/// them; `producer` may enqueue attempts and nothing else (it reads nothing), and
/// `operator` and `admin` may do what it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads and metrics.
    Viewer,
    /// Enqueue only: a program that hands work to leasehold.
    Producer,
    /// Viewer, plus enqueue, reconcile, abort, retry and compensate.
    Operator,
    /// Operator, plus plans and tokens.
    Admin,
}

impl Role {
    /// Every role.
    pub const ALL: &'static [Role] = &[Role::Viewer, Role::Producer, Role::Operator, Role::Admin];

    /// The stored and printed name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Producer => "producer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }

    /// Whether this role may do what `needed` may.
    pub fn allows(self, needed: Role) -> bool {
        match (self, needed) {
            (Role::Producer, needed) => needed == Role::Producer,
            (role, Role::Producer) => role >= Role::Operator,
            (role, needed) => role >= needed,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = LedgerError;
    fn from_str(s: &str) -> Result<Self, LedgerError> {
        Role::ALL
            .iter()
            .copied()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| LedgerError::BadInput(format!("role: {s:?} is not viewer, producer, operator or admin")))
    }
}

/// A stored token, without its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TokenInfo {
    /// Its unique name.
    pub name: String,
    /// What it may do.
    pub role: Role,
    /// When it was created.
    pub created_at: Timestamp,
    /// When it was revoked, if it was.
    pub revoked_at: Option<Timestamp>,
}

impl TokenInfo {
    /// Not revoked.
    pub fn is_active(&self) -> bool {
        self.revoked_at.is_none()
    }
}

/// A token's secret, as shown once at creation. Its `Debug` hides it.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenSecret(String);

impl TokenSecret {
    /// A fresh secret: `lh_` and 64 hex digits from the operating system's generator.
    pub fn generate() -> Result<Self, LedgerError> {
        let mut bytes = [0u8; 32];
        getrandom::getrandom(&mut bytes)
            .map_err(|e| LedgerError::Internal(format!("no randomness for a token: {e}")))?;
        Ok(Self(format!("lh_{}", hex::encode(bytes))))
    }

    /// A secret as presented by a client.
    pub fn new(secret: impl Into<String>) -> Self {
        Self(secret.into())
    }

    /// The secret itself: to show once, or to send.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Its SHA-256 in lowercase hex, as stored.
    pub fn hash(&self) -> String {
        token_hash(&self.0)
    }
}

impl fmt::Debug for TokenSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenSecret(<redacted>)")
    }
}

/// The SHA-256 of a presented secret, lowercase hex.
pub fn token_hash(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Checks a token name: no character a name may not hold
/// ([`leasehold_engine::names`], refused naming its code point), then 1 to
/// [`NAME_MAX_CHARS`] characters of `A-Z a-z 0-9 . _ -`.
pub fn check_name(name: &str) -> Result<(), LedgerError> {
    leasehold_engine::names::check("token name", name).map_err(|e| LedgerError::BadInput(e.to_string()))?;
    let ok = !name.is_empty()
        && name.chars().count() <= NAME_MAX_CHARS
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(LedgerError::BadInput(format!(
            "token name: must be 1 to {NAME_MAX_CHARS} characters of A-Z, a-z, 0-9, '.', '_' or '-'"
        )))
    }
}

/// Where API tokens are kept: beside the ledger's tables, on every backend.
pub trait TokenStore: Send + Sync + 'static {
    /// Stores a new token under `name` with the SHA-256 `hash` of its secret. A name
    /// already used (even by a revoked token) is refused as
    /// [`LedgerError::BadInput`]; nothing is written then.
    fn add_token(
        &self,
        name: &str,
        role: Role,
        hash: &str,
        now: Timestamp,
    ) -> impl Future<Output = Result<TokenInfo, LedgerError>> + Send;

    /// Every token, active and revoked, oldest first.
    fn list_tokens(&self) -> impl Future<Output = Result<Vec<TokenInfo>, LedgerError>> + Send;

    /// Revokes the token named `name` (revoking it again changes nothing); a name no
    /// token has is [`LedgerError::NotFound`].
    fn revoke_token(&self, name: &str, now: Timestamp) -> impl Future<Output = Result<TokenInfo, LedgerError>> + Send;

    /// The active token whose secret hashes to `hash`, if any.
    fn token_by_hash(&self, hash: &str) -> impl Future<Output = Result<Option<TokenInfo>, LedgerError>> + Send;
}

/// Creates a token: a fresh secret, its hash stored under `name`. Answers the
/// stored token and the secret (to show once).
pub async fn create_token<S: TokenStore>(
    store: &S,
    name: &str,
    role: Role,
    now: Timestamp,
) -> Result<(TokenInfo, TokenSecret), LedgerError> {
    check_name(name)?;
    let secret = TokenSecret::generate()?;
    let info = store.add_token(name, role, &secret.hash(), now).await?;
    Ok((info, secret))
}

/// The message for a name already taken.
fn name_taken(name: &str) -> LedgerError {
    LedgerError::BadInput(format!(
        "token name {name:?} is already used (a revoked token keeps its name): choose another"
    ))
}

/// The message for a ledger without the token table.
fn no_table() -> LedgerError {
    LedgerError::BadInput("this ledger has no api_token table yet: run `leasehold migrate`".into())
}

/// The in-memory rows of a [`crate::ledger::memory::MemoryLedger`]'s tokens.
#[derive(Debug, Default)]
pub(crate) struct MemoryTokens {
    /// (hash, token), oldest first.
    rows: Vec<(String, TokenInfo)>,
}

impl TokenStore for crate::ledger::memory::MemoryLedger {
    async fn add_token(&self, name: &str, role: Role, hash: &str, now: Timestamp) -> Result<TokenInfo, LedgerError> {
        check_name(name)?;
        let mut tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        if tokens.rows.iter().any(|(h, t)| t.name == name || h == hash) {
            return Err(name_taken(name));
        }
        let info = TokenInfo {
            name: name.to_owned(),
            role,
            created_at: now,
            revoked_at: None,
        };
        tokens.rows.push((hash.to_owned(), info.clone()));
        Ok(info)
    }

    async fn list_tokens(&self) -> Result<Vec<TokenInfo>, LedgerError> {
        let tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        Ok(tokens.rows.iter().map(|(_, t)| t.clone()).collect())
    }

    async fn revoke_token(&self, name: &str, now: Timestamp) -> Result<TokenInfo, LedgerError> {
        let mut tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        let (_, token) = tokens
            .rows
            .iter_mut()
            .find(|(_, t)| t.name == name)
            .ok_or_else(|| LedgerError::NotFound {
                kind: "token",
                id: name.to_owned(),
            })?;
        token.revoked_at.get_or_insert(now);
        Ok(token.clone())
    }

    async fn token_by_hash(&self, hash: &str) -> Result<Option<TokenInfo>, LedgerError> {
        let tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        Ok(tokens
            .rows
            .iter()
            .find(|(h, t)| h == hash && t.is_active())
            .map(|(_, t)| t.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_include_the_weaker_ones() {
        assert!(Role::Admin.allows(Role::Operator) && Role::Operator.allows(Role::Viewer));
        assert!(!Role::Viewer.allows(Role::Operator) && !Role::Operator.allows(Role::Admin));
        assert_eq!("operator".parse::<Role>().unwrap(), Role::Operator);
        assert!("root".parse::<Role>().unwrap_err().to_string().contains("\"root\""));
    }

    #[test]
    fn a_secret_is_random_hidden_in_debug_and_stored_only_as_its_hash() {
        let (a, b) = (TokenSecret::generate().unwrap(), TokenSecret::generate().unwrap());
        assert_ne!(a, b);
        assert!(a.expose().starts_with("lh_") && a.expose().len() == 67);
        assert!(!format!("{a:?}").contains(a.expose()));
        assert_eq!(a.hash().len(), 64);
        assert_ne!(a.hash(), a.expose());
        assert_eq!(a.hash(), token_hash(a.expose()));
    }

    #[test]
    fn names_are_short_plain_words() {
        assert!(check_name("ci-bot_2.prod").is_ok());
        for bad in ["", "has space", "new\nline", &"x".repeat(NAME_MAX_CHARS + 1), "é"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        let e = check_name("ci\u{200b}-bot").unwrap_err();
        assert_eq!(
            e.to_string(),
            "token name: must not contain invisible or separator characters (found U+200B)"
        );
    }
}
