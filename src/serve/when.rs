//! The instants and durations the API and console take as text: RFC 3339
//! timestamps (`2026-11-30T01:02:03Z`, `2026-11-30T02:02:03.5+01:00`) and short
//! durations (`500ms`, `30s`, `10m`, `2h`, `1d`, or a sum such as `1h30m`).
//! Each error says what was expected, for the caller to prefix with its field.

use leasehold_engine::Timestamp;

/// The longest duration [`parse_duration_ms`] accepts: 10 years.
pub const DURATION_MAX_MS: u64 = 10 * 366 * 86_400_000;

/// Parses an RFC 3339 timestamp (date, `T`, time, optional fraction, then `Z` or
/// an offset `±HH:MM`) to milliseconds; digits past the millisecond are dropped.
pub fn parse_rfc3339(text: &str) -> Result<Timestamp, String> {
    let bad = || format!("{text:?} is not an RFC 3339 timestamp such as 2026-11-30T01:02:03Z");
    let b = text.trim().as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return Err(bad());
    }
    let num = |from: usize, to: usize| -> Result<i64, String> {
        let digits = &b[from..to];
        if !digits.iter().all(u8::is_ascii_digit) {
            return Err(bad());
        }
        Ok(digits.iter().fold(0, |n, d| n * 10 + i64::from(d - b'0')))
    };
    let (year, month, day) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (hour, minute, second) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return Err(format!("{text:?}: no such date"));
    }
    if hour > 23 || minute > 59 || second > 60 {
        return Err(format!("{text:?}: no such time of day"));
    }
    let mut rest = &b[19..];
    let mut millis = 0;
    if let Some(frac) = rest.strip_prefix(b".") {
        let n = frac.iter().take_while(|c| c.is_ascii_digit()).count();
        if n == 0 {
            return Err(bad());
        }
        millis = frac[..n.min(3)]
            .iter()
            .chain(std::iter::repeat(&b'0'))
            .take(3)
            .fold(0, |m, d| m * 10 + i64::from(d - b'0'));
        rest = &frac[n..];
    }
    let offset_minutes = match rest {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let digits = [*h1, *h2, *m1, *m2];
            if !digits.iter().all(u8::is_ascii_digit) {
                return Err(bad());
            }
            let d = |i: usize| i64::from(digits[i] - b'0');
            let (h, m) = (d(0) * 10 + d(1), d(2) * 10 + d(3));
            if h > 23 || m > 59 {
                return Err(format!("{text:?}: no such offset"));
            }
            if *sign == b'-' {
                -(h * 60 + m)
            } else {
                h * 60 + m
            }
        }
        _ => return Err(bad()),
    };
    // A leap second is read as the last millisecond of its minute.
    let (second, millis) = if second == 60 { (59, 999) } else { (second, millis) };
    let secs = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second - offset_minutes * 60;
    Ok(Timestamp::from_millis(secs * 1000 + millis))
}

/// Parses a duration: one or more `<whole number><unit>` with units `ms`, `s`,
/// `m`, `h` and `d` (`10m`, `500ms`, `1h30m`), at most [`DURATION_MAX_MS`].
pub fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let bad = || format!("{text:?} is not a duration such as 500ms, 30s, 10m, 2h or 1d");
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let unit_len = rest[digits..].bytes().take_while(u8::is_ascii_alphabetic).count();
        if digits == 0 || unit_len == 0 {
            return Err(bad());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        let unit: u64 = match &rest[digits..digits + unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(bad()),
        };
        total = n
            .checked_mul(unit)
            .and_then(|ms| total.checked_add(ms))
            .filter(|ms| *ms <= DURATION_MAX_MS)
            .ok_or_else(|| format!("{text:?} is longer than 10 years"))?;
        rest = &rest[digits + unit_len..];
    }
    Ok(total)
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Howard Hinnant's days-from-civil algorithm: days since 1970-01-01.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
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
            -2_203_891_200_000,
            -11_670_998_400_000,
        ] {
            let t = Timestamp::from_millis(ms);
            assert_eq!(parse_rfc3339(&t.to_rfc3339()), Ok(t), "{t}");
        }
    }

    #[test]
    fn offsets_fractions_and_separators_are_read() {
        let utc = parse_rfc3339("2026-11-30T01:02:03Z").unwrap();
        assert_eq!(utc.to_rfc3339(), "2026-11-30T01:02:03.000Z");
        assert_eq!(parse_rfc3339("2026-11-30T02:02:03+01:00"), Ok(utc));
        assert_eq!(parse_rfc3339("2026-11-29T23:32:03-01:30"), Ok(utc));
        assert_eq!(parse_rfc3339("2026-11-30 01:02:03z"), Ok(utc));
        assert_eq!(
            parse_rfc3339("2026-11-30T01:02:03.123456789Z").unwrap().to_rfc3339(),
            "2026-11-30T01:02:03.123Z"
        );
        assert_eq!(
            parse_rfc3339("2026-11-30T01:02:03.5Z").unwrap().to_rfc3339(),
            "2026-11-30T01:02:03.500Z"
        );
        assert_eq!(
            parse_rfc3339("2016-12-31T23:59:60Z").unwrap().to_rfc3339(),
            "2016-12-31T23:59:59.999Z"
        );
    }

    #[test]
    fn malformed_timestamps_are_refused_with_what_was_expected() {
        for bad in [
            "",
            "yesterday",
            "2026-11-30",
            "2026-11-30T01:02:03",
            "2026-11-30T01:02:03+0100",
            "2026-11-30T01:02:03.Z",
            "2026-11-30T01:02:03Zjunk",
            "2026-1a-30T01:02:03Z",
            "２026-11-30T01:02:03Z",
        ] {
            let e = parse_rfc3339(bad).unwrap_err();
            assert!(e.contains("RFC 3339") || e.contains("no such"), "{bad}: {e}");
        }
        for bad in [
            "2026-02-29T00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-04-31T00:00:00Z",
            "2026-01-01T24:00:00Z",
            "2026-01-01T00:60:00Z",
            "2026-01-01T00:00:00+24:00",
        ] {
            assert!(parse_rfc3339(bad).unwrap_err().contains("no such"), "{bad}");
        }
        assert!(parse_rfc3339("2024-02-29T00:00:00Z").is_ok());
    }

    #[test]
    fn durations_sum_their_parts_and_refuse_anything_else() {
        assert_eq!(parse_duration_ms("500ms"), Ok(500));
        assert_eq!(parse_duration_ms("30s"), Ok(30_000));
        assert_eq!(parse_duration_ms("10m"), Ok(600_000));
        assert_eq!(parse_duration_ms("2h"), Ok(7_200_000));
        assert_eq!(parse_duration_ms("1d"), Ok(86_400_000));
        assert_eq!(parse_duration_ms("1h30m"), Ok(5_400_000));
        assert_eq!(parse_duration_ms(" 0s "), Ok(0));
        for bad in ["", "10", "m", "10 m", "-5s", "1.5h", "10w", "10M", "1h 30m"] {
            assert!(parse_duration_ms(bad).unwrap_err().contains("not a duration"), "{bad}");
        }
        assert!(parse_duration_ms("3661d").unwrap_err().contains("longer than 10 years"));
        assert!(parse_duration_ms("99999999999999999999ms").is_err());
        assert!(parse_duration_ms("18446744073709551615d")
            .unwrap_err()
            .contains("10 years"));
    }
}
