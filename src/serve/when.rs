//! The instants and durations the API, the console and the CLI take as text: RFC 3339
//! timestamps (`2026-11-30T01:02:03Z`, `2026-11-30T02:02:03.5+01:00`), read by the
//! `time` crate, and short durations (`500ms`, `30s`, `10m`, `2h`, `1d`, or a sum such
//! as `1h30m`), read by `humantime`. Each error says what was expected, for the
//! caller to prefix with its field or flag.

use leasehold_engine::Timestamp;

/// The longest duration [`parse_duration_ms`] accepts: 10 years.
pub const DURATION_MAX_MS: u64 = 10 * 366 * 86_400_000;

/// Parses an RFC 3339 timestamp (date, `T`, time, optional fraction, then `Z` or
/// an offset `±HH:MM`) to milliseconds; digits past the millisecond are dropped.
pub fn parse_rfc3339(text: &str) -> Result<Timestamp, String> {
    let format = &time::format_description::well_known::Rfc3339;
    let parsed = time::OffsetDateTime::parse(text.trim(), format)
        .map_err(|e| format!("{text:?}: not an RFC 3339 time such as 2026-11-30T01:02:03Z ({e})"))?;
    let ms = i64::try_from(parsed.unix_timestamp_nanos().div_euclid(1_000_000))
        .map_err(|_| format!("{text:?}: out of range"))?;
    Ok(Timestamp::from_millis(ms))
}

/// Parses a duration: one or more `<whole number><unit>` (`10m`, `500ms`, `1h30m`;
/// units from `ns` to `y`, as `humantime` reads them), at most [`DURATION_MAX_MS`]. A
/// number without a unit is refused: it would be ambiguous.
pub fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let d = humantime::parse_duration(text.trim())
        .map_err(|e| format!("{text:?}: not a duration such as 500ms, 30s, 10m or 1h ({e})"))?;
    u64::try_from(d.as_millis())
        .ok()
        .filter(|ms| *ms <= DURATION_MAX_MS)
        .ok_or_else(|| format!("{text:?}: longer than 10 years"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trips_the_engine_s_own_format() {
        for ms in [
            0,
            -1,
            951_782_400_000,
            951_868_799_999,
            1_796_000_523_004,
            4_107_542_400_000,
        ] {
            let t = Timestamp::from_millis(ms);
            assert_eq!(parse_rfc3339(&t.to_rfc3339()), Ok(t), "{t}");
        }
    }

    #[test]
    fn offsets_and_fractions_are_read() {
        let utc = parse_rfc3339("2026-11-30T01:02:03Z").unwrap();
        assert_eq!(utc.to_rfc3339(), "2026-11-30T01:02:03.000Z");
        assert_eq!(parse_rfc3339("2026-11-30T02:02:03+01:00"), Ok(utc));
        assert_eq!(parse_rfc3339("2026-11-29T23:32:03-01:30"), Ok(utc));
        assert_eq!(
            parse_rfc3339("2026-11-30T01:02:03.123456789Z").unwrap().to_rfc3339(),
            "2026-11-30T01:02:03.123Z"
        );
    }

    #[test]
    fn malformed_or_impossible_timestamps_are_refused_with_what_was_expected() {
        for bad in [
            "",
            "yesterday",
            "2026-11-30",
            "2026-11-30T01:02:03",
            "2026-11-30T01:02:03Zjunk",
            "2026-02-29T00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-01-01T24:00:00Z",
        ] {
            let e = parse_rfc3339(bad).unwrap_err();
            assert!(e.contains("RFC 3339"), "{bad}: {e}");
        }
        assert!(parse_rfc3339("2024-02-29T00:00:00Z").is_ok());
    }

    #[test]
    fn durations_sum_their_parts_and_refuse_anything_else() {
        assert_eq!(parse_duration_ms("500ms"), Ok(500));
        assert_eq!(parse_duration_ms("30s"), Ok(30_000));
        assert_eq!(parse_duration_ms("10m"), Ok(600_000));
        assert_eq!(parse_duration_ms("1d"), Ok(86_400_000));
        assert_eq!(parse_duration_ms("1h30m"), Ok(5_400_000));
        assert_eq!(parse_duration_ms(" 0s "), Ok(0));
        for bad in ["", "10", "m", "-5s", "10x"] {
            assert!(parse_duration_ms(bad).unwrap_err().contains("not a duration"), "{bad}");
        }
        assert!(parse_duration_ms("3661d").unwrap_err().contains("longer than 10 years"));
    }
}
