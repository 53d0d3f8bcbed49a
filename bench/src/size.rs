//! Human quantities on the command line: sizes (`100KiB`, `256MiB`, `1.5GB`), rates
//! (`600MB/s`) and durations (`30s`, `500ms`, `2m`).
//!
//! Decimal suffixes (`KB`, `MB`, `GB`, `TB`) are powers of 1000, binary ones (`KiB`,
//! `MiB`, `GiB`, `TiB`) powers of 1024, as storage tools print them; a bare number is
//! bytes (or seconds for durations).

use std::time::Duration;

use anyhow::{bail, Context};

/// Parses a byte size such as `100KiB`, `256MiB`, `1.5GB`, `4096` or `0`.
pub fn parse_size(s: &str) -> anyhow::Result<u64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        bail!("size {s:?}: expected a number, e.g. 100KiB or 256MiB");
    }
    let value: f64 = num
        .parse()
        .with_context(|| format!("size {s:?}: bad number {num:?}"))?;
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
            bail!("size {s:?}: unknown unit {other:?} (use B, KB, KiB, MB, MiB, GB, GiB, TB, TiB)")
        }
    };
    let bytes = value * mult;
    if !bytes.is_finite() || bytes > u64::MAX as f64 {
        bail!("size {s:?} is out of range");
    }
    Ok(bytes.round() as u64)
}

/// A size or an inclusive range of sizes, `100KiB` or `64KiB-1MiB`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizeRange {
    pub min: u64,
    pub max: u64,
}

/// Parses `SIZE` or `MIN-MAX` (e.g. `64KiB-1MiB`).
pub fn parse_size_range(s: &str) -> anyhow::Result<SizeRange> {
    match s.split_once('-') {
        None => {
            let n = parse_size(s)?;
            Ok(SizeRange { min: n, max: n })
        }
        Some((a, b)) => {
            let (min, max) = (parse_size(a)?, parse_size(b)?);
            if min > max {
                bail!("size range {s:?}: the first size is larger than the second");
            }
            Ok(SizeRange { min, max })
        }
    }
}

/// Parses a rate such as `600MB/s` or `1GiB/s` into bytes per second (`/s` optional).
pub fn parse_rate(s: &str) -> anyhow::Result<f64> {
    let t = s.trim();
    let t = t
        .strip_suffix("/s")
        .or_else(|| t.strip_suffix("ps"))
        .unwrap_or(t);
    Ok(parse_size(t).with_context(|| format!("rate {s:?}"))? as f64)
}

/// Parses a duration such as `30s`, `500ms`, `2m`, `1h` or `10` (seconds).
pub fn parse_duration(s: &str) -> anyhow::Result<Duration> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .with_context(|| format!("duration {s:?}: expected e.g. 30s, 500ms, 2m"))?;
    let secs = match unit.trim() {
        "" | "s" => value,
        "ms" => value / 1e3,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        other => bail!("duration {s:?}: unknown unit {other:?} (use ms, s, m, h)"),
    };
    Duration::try_from_secs_f64(secs).with_context(|| format!("duration {s:?} is out of range"))
}

/// Formats bytes with a binary suffix for the human summary.
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
        assert_eq!(parse_size("100KiB").unwrap(), 102_400);
        assert_eq!(parse_size("256MiB").unwrap(), 268_435_456);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("1.5GB").unwrap(), 1_500_000_000);
        assert_eq!(parse_size("10kb").unwrap(), 10_000);
        assert_eq!(parse_size(" 2 MiB ").unwrap(), 2 << 20);
        assert_eq!(parse_size("7B").unwrap(), 7);
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("12XB").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn size_ranges() {
        assert_eq!(
            parse_size_range("100KiB").unwrap(),
            SizeRange {
                min: 102_400,
                max: 102_400
            }
        );
        assert_eq!(
            parse_size_range("64KiB-1MiB").unwrap(),
            SizeRange {
                min: 65_536,
                max: 1 << 20
            }
        );
        assert!(parse_size_range("2MiB-1MiB").is_err());
        assert!(parse_size_range("1MiB-").is_err());
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("600MB/s").unwrap(), 600e6);
        assert_eq!(parse_rate("1GiB/s").unwrap(), 1073741824.0);
        assert_eq!(parse_rate("500MB").unwrap(), 500e6);
        assert!(parse_rate("fast").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
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
