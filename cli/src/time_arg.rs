//! Points in time given on the command line, as `docker logs --since` takes them: Unix seconds,
//! a duration back from now (`10m`, `1h30m`, `2d`), or an RFC 3339 time.

use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// A point in time as Unix seconds, parsed from what a user typed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeArg(pub i64);

impl FromStr for TimeArg {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs() as i64;
        parse_at(text, now).map(TimeArg)
    }
}

/// `text` as Unix seconds, durations counted back from `now`.
fn parse_at(text: &str, now: i64) -> Result<i64, String> {
    let text = text.trim();
    let fix = "give Unix seconds (1733050000), a duration back from now (45s, 10m, 1h30m, 2d) \
               or an RFC 3339 time (2026-12-01T10:00:00Z)";
    if text.is_empty() {
        return Err(format!("an empty time; {fix}"));
    }
    if let Ok(seconds) = text.parse::<i64>() {
        return Ok(seconds);
    }
    if text.contains('-') || text.contains(':') {
        return OffsetDateTime::parse(text, &Rfc3339)
            .map(OffsetDateTime::unix_timestamp)
            .map_err(|e| format!("'{text}' is not an RFC 3339 time ({e}); {fix}"));
    }
    let back = parse_duration(text).ok_or_else(|| format!("'{text}' is not a time; {fix}"))?;
    Ok(now - back.as_secs() as i64)
}

/// `1h30m`, `10m`, `45s`, `2d`, `500ms` (rounded down to seconds by the caller): one or more
/// number-unit pairs.
fn parse_duration(text: &str) -> Option<Duration> {
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let value: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let unit = match &rest[..unit_len] {
            "ms" => Duration::from_millis(1),
            "s" => Duration::from_secs(1),
            "m" => Duration::from_secs(60),
            "h" => Duration::from_secs(3600),
            "d" => Duration::from_secs(86_400),
            _ => return None,
        };
        rest = &rest[unit_len..];
        total = total.checked_add(unit.checked_mul(u32::try_from(value).ok()?)?)?;
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;

    #[test]
    fn unix_seconds_durations_and_rfc3339_times() {
        assert_eq!(parse_at("1733050000", NOW), Ok(1_733_050_000));
        assert_eq!(parse_at("10m", NOW), Ok(NOW - 600));
        assert_eq!(parse_at("1h30m", NOW), Ok(NOW - 5400));
        assert_eq!(parse_at("2d", NOW), Ok(NOW - 172_800));
        assert_eq!(parse_at("45s", NOW), Ok(NOW - 45));
        assert_eq!(parse_at("1500ms", NOW), Ok(NOW - 1));
        assert_eq!(parse_at("2026-12-01T10:00:00Z", NOW), Ok(1_796_119_200));
        assert_eq!(
            parse_at("2026-12-01T11:00:00+01:00", NOW),
            Ok(1_796_119_200)
        );
    }

    #[test]
    fn anything_else_is_refused_with_the_accepted_forms() {
        for bad in [
            "",
            "ten minutes",
            "10x",
            "m10",
            "2026-13-01T00:00:00Z",
            "1h-5m",
        ] {
            let err = parse_at(bad, NOW).unwrap_err();
            assert!(err.contains("RFC 3339"), "{bad}: {err}");
        }
    }
}
