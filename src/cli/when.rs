//! Times and durations given on the command line: `--at` and `--since` take an RFC
//! 3339 time (any offset), `--in` and `--fail-for` a duration such as `500ms`,
//! `30s`, `10m`, `1h` or `1h30m`. A value that does not parse, or that is out of
//! bounds, is refused with a one-line message naming the flag.

use super::Failure;
use leasehold::serve::when;
use leasehold_engine::Timestamp;
use std::time::Duration;

/// How far ahead a start may be scheduled (`--at`, `--in`): a year and a day.
pub const MAX_AHEAD: Duration = Duration::from_secs(366 * 86_400);

/// An RFC 3339 time, e.g. `2026-05-01T09:00:00Z` or `2026-05-01T11:00:00.250+02:00`
/// ([`leasehold::serve::when::parse_rfc3339`]).
pub fn parse_time(flag: &str, text: &str) -> Result<Timestamp, Failure> {
    when::parse_rfc3339(text).map_err(|e| Failure::bad_input(format!("{flag} {e}")))
}

/// A duration such as `500ms`, `30s`, `10m`, `1h` or `1h30m` (a number without a
/// unit is refused: it would be ambiguous) ([`leasehold::serve::when::parse_duration_ms`]).
pub fn parse_duration(flag: &str, text: &str) -> Result<Duration, Failure> {
    when::parse_duration_ms(text)
        .map(Duration::from_millis)
        .map_err(|e| Failure::bad_input(format!("{flag} {e}")))
}

/// Refuses a start more than [`MAX_AHEAD`] after `now`.
pub fn check_ahead(flag: &str, text: &str, ahead_ms: u64) -> Result<(), Failure> {
    if u128::from(ahead_ms) > MAX_AHEAD.as_millis() {
        return Err(Failure::bad_input(format!(
            "{flag} {text:?}: more than {} days ahead",
            MAX_AHEAD.as_secs() / 86_400
        )));
    }
    Ok(())
}

/// Milliseconds in `d`, saturating.
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A span in words for people: `42 s`, `3 min 5 s`, `2 h 10 min`, `4 d 3 h`.
pub fn span(ms: u64) -> String {
    let secs = ms.div_ceil(1_000);
    match secs {
        0..=59 => format!("{secs} s"),
        60..=3_599 => format!("{} min {} s", secs / 60, secs % 60),
        3_600..=86_399 => format!("{} h {} min", secs / 3_600, secs % 3_600 / 60),
        _ => format!("{} d {} h", secs / 86_400, secs % 86_400 / 3_600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(r: Result<impl std::fmt::Debug, Failure>) -> String {
        let f = r.unwrap_err();
        assert_eq!(f.code, 2);
        f.message
    }

    #[test]
    fn rfc3339_times_with_any_offset_parse_to_the_same_instant() {
        let utc = parse_time("--at", "2026-05-01T09:00:00Z").unwrap();
        assert_eq!(utc.to_rfc3339(), "2026-05-01T09:00:00.000Z");
        assert_eq!(parse_time("--at", "2026-05-01T11:00:00+02:00").unwrap(), utc);
        assert_eq!(
            parse_time("--at", "2026-05-01T09:00:00.250Z").unwrap(),
            utc.plus_ms(250)
        );
        assert_eq!(parse_time("--at", "1970-01-01T00:00:00Z").unwrap().as_millis(), 0);
    }

    #[test]
    fn bad_times_are_refused_naming_the_flag() {
        for bad in [
            "",
            "tomorrow",
            "2026-05-01",
            "2026-05-01 09:00",
            "2026-13-01T00:00:00Z",
            "10m",
        ] {
            let m = message(parse_time("--since", bad));
            assert!(m.starts_with("--since ") && m.contains("RFC 3339"), "{bad:?}: {m}");
            assert!(!m.contains('\n'), "{m}");
        }
    }

    #[test]
    fn durations_take_the_usual_units() {
        for (text, ms) in [
            ("500ms", 500),
            ("30s", 30_000),
            ("10m", 600_000),
            ("1h", 3_600_000),
            ("1h30m", 5_400_000),
        ] {
            assert_eq!(millis(parse_duration("--in", text).unwrap()), ms, "{text}");
        }
    }

    #[test]
    fn bad_durations_are_refused_naming_the_flag() {
        for bad in ["", "10", "-5m", "ten minutes", "5 parsecs", "99999999999999999999h"] {
            let m = message(parse_duration("--in", bad));
            assert!(m.starts_with("--in ") && m.contains("not a duration"), "{bad:?}: {m}");
        }
    }

    #[test]
    fn a_start_more_than_a_year_ahead_is_refused() {
        assert!(check_ahead("--in", "366d", millis(MAX_AHEAD)).is_ok());
        let m = message(check_ahead("--in", "400d", millis(MAX_AHEAD) + 1));
        assert_eq!(m, "--in \"400d\": more than 366 days ahead");
    }

    #[test]
    fn spans_read_in_words() {
        assert_eq!(span(0), "0 s");
        assert_eq!(span(1), "1 s");
        assert_eq!(span(42_000), "42 s");
        assert_eq!(span(185_000), "3 min 5 s");
        assert_eq!(span(7_800_000), "2 h 10 min");
        assert_eq!(span(363_600_000), "4 d 5 h");
    }
}
