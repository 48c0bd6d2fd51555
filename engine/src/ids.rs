//! Identifiers, lease tokens and timestamps.
//!
//! Ids and tokens are minted by the ledger (from the OS in production, from the seed
//! in simulation) and passed into the engine; the engine never creates one itself.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! id_newtype {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Wraps an id string minted by a ledger.
            pub fn new(value: impl Into<String>) -> Self {
                Self(value.into())
            }
            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0)
            }
        }
    };
}

id_newtype!(
    /// Identifies a registered plan.
    PlanId
);
id_newtype!(
    /// Identifies an attempt (one execution of a plan).
    AttemptId
);
id_newtype!(
    /// Identifies an outbox command (exactly one per attempt).
    CommandId
);

/// The secret that fences a lease. It never prints its value: `Debug` shows
/// `LeaseToken(***)` and there is no `Display` and no `Serialize`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct LeaseToken(String);

impl LeaseToken {
    /// Wraps a token minted by a ledger.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }
    /// The token's value, for storing it; never log or print it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LeaseToken(***)")
    }
}

/// A point in time in milliseconds since the Unix epoch, as read from some clock.
/// Which clock is the caller's business: lease decisions use the ledger's.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
#[serde(transparent)]
pub struct Timestamp(i64);

impl Timestamp {
    /// A timestamp from milliseconds since the Unix epoch.
    pub const fn from_millis(ms: i64) -> Self {
        Self(ms)
    }
    /// Milliseconds since the Unix epoch.
    pub const fn as_millis(self) -> i64 {
        self.0
    }
    /// This time plus `ms` milliseconds (saturating).
    pub const fn plus_ms(self, ms: u64) -> Self {
        let ms = if ms > i64::MAX as u64 { i64::MAX } else { ms as i64 };
        Self(self.0.saturating_add(ms))
    }
    /// Milliseconds from `earlier` to `self`, zero if `earlier` is later.
    pub fn millis_since(self, earlier: Timestamp) -> u64 {
        u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(0)
    }
    /// RFC 3339 text in UTC with millisecond precision, e.g. `2026-11-30T01:02:03.004Z`.
    pub fn to_rfc3339(self) -> String {
        let ms = self.0.rem_euclid(1000);
        let secs = self.0.div_euclid(1000);
        let days = secs.div_euclid(86_400);
        let sod = secs.rem_euclid(86_400);
        let (y, m, d) = civil_from_days(days);
        format!(
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
            sod / 3600,
            (sod % 3600) / 60,
            sod % 60
        )
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Timestamp({})", self.to_rfc3339())
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

/// Howard Hinnant's days-to-civil algorithm (proleptic Gregorian calendar).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_token_never_prints_its_value() {
        let token = LeaseToken::new("s3cr3t-value");
        assert_eq!(format!("{token:?}"), "LeaseToken(***)");
        assert!(!format!("{:?}", Some(token)).contains("s3cr3t"));
    }

    #[test]
    fn timestamps_format_as_rfc3339() {
        assert_eq!(Timestamp::from_millis(0).to_rfc3339(), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            Timestamp::from_millis(1_796_000_523_004).to_rfc3339(),
            "2026-11-30T01:02:03.004Z"
        );
        assert_eq!(
            Timestamp::from_millis(951_782_400_000).to_rfc3339(),
            "2000-02-29T00:00:00.000Z"
        );
    }

    #[test]
    fn timestamps_format_across_leap_days_and_centuries() {
        for (ms, text) in [
            (951_868_799_999, "2000-02-29T23:59:59.999Z"),
            (951_868_800_000, "2000-03-01T00:00:00.000Z"),
            (4_107_499_200_000, "2100-02-28T12:00:00.000Z"),
            (4_107_542_400_000, "2100-03-01T00:00:00.000Z"),
            (13_574_563_200_000, "2400-02-29T00:00:00.000Z"),
            (1_703_980_800_000, "2023-12-31T00:00:00.000Z"),
            (-1, "1969-12-31T23:59:59.999Z"),
            (-2_203_891_200_000, "1900-03-01T00:00:00.000Z"),
            (-11_670_998_400_000, "1600-02-29T00:00:00.000Z"),
        ] {
            let t = Timestamp::from_millis(ms);
            assert_eq!(t.to_rfc3339(), text);
            assert_eq!(t.to_string(), text, "Display");
            assert_eq!(format!("{t:?}"), format!("Timestamp({text})"), "Debug");
        }
    }

    #[test]
    fn plus_ms_saturates_past_the_largest_timestamp() {
        let t = Timestamp::from_millis(5);
        assert_eq!(t.plus_ms(u64::MAX), Timestamp::from_millis(i64::MAX));
        assert_eq!(t.plus_ms(i64::MAX as u64 + 1), Timestamp::from_millis(i64::MAX));
        assert_eq!(t.plus_ms(7), Timestamp::from_millis(12));
    }

    #[test]
    fn a_lease_token_exposes_its_value_for_storage() {
        assert_eq!(LeaseToken::new("tok-1").expose(), "tok-1");
    }

    #[test]
    fn millis_since_saturates_at_zero() {
        let a = Timestamp::from_millis(10);
        assert_eq!(a.plus_ms(5).millis_since(a), 5);
        assert_eq!(a.millis_since(a.plus_ms(5)), 0);
    }
}
