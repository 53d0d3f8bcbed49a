//! Human quantities in flags and config files: sizes (`100KiB`, `256MiB`, `1.5GB`) and
//! durations (`30s`, `500ms`, `2m`). Decimal suffixes (`KB`, `MB`, `GB`, `TB`) are powers
//! of 1000, binary ones (`KiB`, `MiB`, `GiB`, `TiB`) powers of 1024, as storage tools
//! print them; a bare number is bytes (or seconds).

use std::time::Duration;

/// Splits `12.5MiB` into the number and what follows it.
fn number_and_unit(t: &str) -> (&str, &str) {
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    t.split_at(split)
}

/// Parses a byte size such as `100KiB`, `256MiB`, `1.5GB`, `4096` or `0`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let (num, unit) = number_and_unit(s.trim());
    let value: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size (e.g. 100KiB, 500MB, 10GiB)"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "ki" | "kib" => 1024.0,
        "mi" | "mib" => 1024.0 * 1024.0,
        "gi" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "ti" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        other => {
            return Err(format!(
                "unknown size unit `{other}` in `{s}` (use B, KB, KiB, MB, MiB, GB, GiB, TB, TiB)"
            ))
        }
    };
    let bytes = value * mult;
    if !bytes.is_finite() || bytes > u64::MAX as f64 {
        return Err(format!("`{s}` is out of range"));
    }
    Ok(bytes.round() as u64)
}

/// Parses a duration such as `30s`, `500ms`, `2m`, `1h` or `10` (seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = number_and_unit(s.trim());
    let bad = || format!("`{s}` is not a duration (e.g. 30s, 500ms, 2m)");
    let value: f64 = num.parse().map_err(|_| bad())?;
    let secs = match unit.trim() {
        "" | "s" => value,
        "ms" => value / 1e3,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(bad()),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| bad())
}

/// A duration, or `never` (`None`).
pub fn parse_duration_or_never(s: &str) -> Result<Option<Duration>, String> {
    if s.trim().eq_ignore_ascii_case("never") {
        return Ok(None);
    }
    parse_duration(s).map(Some)
}

/// Bytes with a binary suffix, for people: `512 B`, `1.5 GiB`.
pub fn fmt_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("0").unwrap(), 0);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("500MB").unwrap(), 500_000_000);
        assert_eq!(parse_size("10GiB").unwrap(), 10 << 30);
        assert_eq!(parse_size("1.5KiB").unwrap(), 1536);
        assert_eq!(parse_size("100KiB").unwrap(), 102_400);
        assert_eq!(parse_size("1.5GB").unwrap(), 1_500_000_000);
        assert_eq!(parse_size("10kb").unwrap(), 10_000);
        assert_eq!(parse_size(" 2 MiB ").unwrap(), 2 << 20);
        assert_eq!(parse_size("7B").unwrap(), 7);
        for bad in ["ten", "5XB", "MiB", "12XB", ""] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("120").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn formats() {
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(1 << 20), "1.0 MiB");
        assert_eq!(fmt_bytes(3 << 29), "1.5 GiB");
    }
}
