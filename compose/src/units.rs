//! Compose's value units: durations (`1m30s`), byte sizes (`64m`), CPUs (`0.5`) and file modes.

/// A Compose duration (Go's `time.ParseDuration`: `300ms`, `1.5s`, `1m30s`, `2h`) in
/// milliseconds. Units: `ns`, `us`/`µs`, `ms`, `s`, `m`, `h`. `0` needs no unit.
pub(crate) fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err("a duration must not be empty; write e.g. '10s', '500ms' or '1m30s'".into());
    }
    if s.starts_with('-') {
        return Err("a duration must not be negative".into());
    }
    let s = s.strip_prefix('+').unwrap_or(s);
    if s == "0" {
        return Ok(0);
    }
    let mut total_ns: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number = &rest[..num_len];
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(format!(
                "'{text}' is not a duration; write e.g. '10s', '500ms' or '1m30s'"
            ));
        }
        let unit_ns: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => {
                return Err(format!(
                    "'{text}' has no unit; write e.g. '{number}s' (units: ns, us, ms, s, m, h)"
                ))
            }
            other => {
                return Err(format!(
                    "'{text}' has the unknown unit '{other}'; use ns, us, ms, s, m or h"
                ))
            }
        };
        let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
        let int: u128 = if int_part.is_empty() {
            0
        } else {
            int_part
                .parse()
                .map_err(|_| format!("'{text}' is too long"))?
        };
        let mut ns = int
            .checked_mul(unit_ns)
            .ok_or_else(|| format!("'{text}' is too long"))?;
        let mut scale = unit_ns;
        for d in frac_part.chars().take(18) {
            scale /= 10;
            ns += u128::from(d.to_digit(10).unwrap_or(0)) * scale;
        }
        total_ns = total_ns
            .checked_add(ns)
            .ok_or_else(|| format!("'{text}' is too long"))?;
    }
    let ms = total_ns / 1_000_000;
    if total_ns > 0 && ms == 0 {
        return Err(format!(
            "'{text}' is shorter than 1ms, the smallest step Ployz keeps"
        ));
    }
    u64::try_from(ms).map_err(|_| format!("'{text}' is too long"))
}

/// A byte size as Docker reads it (`units.RAMInBytes`): a number with an optional binary unit
/// `b`, `k`, `m`, `g`, `t`, `p` (`kb`, `mib`, ... also accepted, case-insensitive).
pub(crate) fn parse_size_bytes(text: &str) -> Result<u64, String> {
    let s = text.trim();
    let bad = || {
        format!("'{text}' is not a size; write bytes as a number or with a unit, e.g. '64m', '1g', '512k'")
    };
    let num_len = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(num_len);
    if number.is_empty() || number.starts_with('.') || number.matches('.').count() > 1 {
        return Err(bad());
    }
    let unit = unit.trim_start().to_ascii_lowercase();
    let mut u = unit.as_str();
    u = u.strip_suffix('b').unwrap_or(u);
    u = u.strip_suffix('i').unwrap_or(u);
    let multiplier: u128 = match u {
        "" => 1,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        "t" => 1 << 40,
        "p" => 1 << 50,
        _ => return Err(bad()),
    };
    if unit == "i" || unit == "ib" {
        return Err(bad());
    }
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    let int: u128 = int_part.parse().map_err(|_| bad())?;
    let mut bytes = int.checked_mul(multiplier).ok_or_else(bad)?;
    let mut scale = multiplier;
    let mut frac_num: u128 = 0;
    let mut frac_den: u128 = 1;
    for d in frac_part.chars().take(12) {
        frac_num = frac_num * 10 + u128::from(d.to_digit(10).unwrap_or(0));
        frac_den *= 10;
    }
    if frac_den > 1 {
        scale = scale.saturating_mul(frac_num) / frac_den;
        bytes += scale;
    }
    u64::try_from(bytes).map_err(|_| format!("'{text}' is too large"))
}

/// A CPU count (`0.5`, `2`) as billionths of a CPU; `0` means no limit (`None`).
pub(crate) fn cpus_to_nano(cpus: f64, text: &str) -> Result<Option<u64>, String> {
    if !cpus.is_finite() || cpus < 0.0 {
        return Err(format!("'{text}' is not a CPU count; write e.g. 0.5 or 2"));
    }
    let nano = (cpus * 1e9).round();
    if nano >= u64::MAX as f64 {
        return Err(format!("'{text}' CPUs is too many"));
    }
    Ok(if nano == 0.0 { None } else { Some(nano as u64) })
}

/// A file mode: an integer is taken as written (`mode: 0o440`, `mode: 288`); text is octal
/// (`mode: 0440`, `mode: "440"`, `mode: "0o440"`).
pub(crate) fn parse_octal_mode(text: &str) -> Result<u32, String> {
    let t = text.trim();
    let digits = t.strip_prefix("0o").unwrap_or(t);
    if digits.is_empty() || !digits.chars().all(|c| matches!(c, '0'..='7')) {
        return Err(format!(
            "'{text}' is not an octal file mode; write e.g. 0440 or 0644"
        ));
    }
    let mode = u32::from_str_radix(digits, 8)
        .map_err(|_| format!("'{text}' is not an octal file mode; write e.g. 0440 or 0644"))?;
    check_mode(mode, text)
}

/// Checks a mode fits in the permission and special bits.
pub(crate) fn check_mode(mode: u32, text: &str) -> Result<u32, String> {
    if mode > 0o7777 {
        return Err(format!(
            "'{text}' is larger than 07777, the largest file mode; write modes in octal, e.g. 0440"
        ));
    }
    Ok(mode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_follow_go_syntax() {
        let cases = [
            ("0", 0),
            ("10s", 10_000),
            ("500ms", 500),
            ("1m30s", 90_000),
            ("1.5s", 1_500),
            ("2h", 7_200_000),
            ("1h2m3s4ms", 3_723_004),
            ("1500us", 1),
            ("5m", 300_000),
            (" 3s ", 3_000),
            ("0.5m", 30_000),
        ];
        for (input, want) in cases {
            assert_eq!(parse_duration_ms(input), Ok(want), "{input}");
        }
        for bad in [
            "",
            "10",
            "ten",
            "-5s",
            "5d",
            "1.2.3s",
            "s",
            "100ns",
            "1x",
            "9999999999999999999h",
        ] {
            assert!(parse_duration_ms(bad).is_err(), "{bad}");
        }
        assert!(parse_duration_ms("10").unwrap_err().contains("'10s'"));
        assert!(parse_duration_ms("5d")
            .unwrap_err()
            .contains("unknown unit 'd'"));
    }

    #[test]
    fn sizes_use_binary_units() {
        let cases = [
            ("100", 100),
            ("64m", 64 << 20),
            ("64M", 64 << 20),
            ("1g", 1 << 30),
            ("1gb", 1 << 30),
            ("512MiB", 512 << 20),
            ("512k", 512 << 10),
            ("1.5g", 3 << 29),
            ("10 mb", 10 << 20),
            ("2b", 2),
        ];
        for (input, want) in cases {
            assert_eq!(parse_size_bytes(input), Ok(want), "{input}");
        }
        for bad in ["", "m", "-1m", "1x", "1.2.3m", "lots", "99999999p", "1i"] {
            assert!(parse_size_bytes(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn cpus_become_billionths() {
        assert_eq!(cpus_to_nano(0.5, "0.5"), Ok(Some(500_000_000)));
        assert_eq!(cpus_to_nano(2.0, "2"), Ok(Some(2_000_000_000)));
        assert_eq!(cpus_to_nano(0.0, "0"), Ok(None));
        assert!(cpus_to_nano(-1.0, "-1").is_err());
        assert!(cpus_to_nano(f64::NAN, "nan").is_err());
        assert!(cpus_to_nano(1e30, "1e30").is_err());
    }

    #[test]
    fn modes_are_octal_text() {
        assert_eq!(parse_octal_mode("0440"), Ok(0o440));
        assert_eq!(parse_octal_mode("440"), Ok(0o440));
        assert_eq!(parse_octal_mode("0o644"), Ok(0o644));
        assert_eq!(parse_octal_mode("1777"), Ok(0o1777));
        assert!(parse_octal_mode("0948").is_err());
        assert!(parse_octal_mode("77777").is_err());
        assert!(parse_octal_mode("rw").is_err());
    }
}
