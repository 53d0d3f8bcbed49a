//! Human quantities on the command line: sizes (`100KiB`, `256MiB`, `1.5GB`), rates
//! (`600MB/s`) and durations (`30s`, `500ms`, `2m`).
//!
//! Decimal suffixes (`KB`, `MB`, `GB`, `TB`) are powers of 1000, binary ones (`KiB`,
//! `MiB`, `GiB`, `TiB`) powers of 1024, as storage tools print them; a bare number is
//! bytes (or seconds for durations).

use std::time::Duration;

use anyhow::{anyhow, bail, Context};

/// Parses a byte size such as `100KiB`, `256MiB`, `1.5GB`, `4096` or `0`.
pub fn parse_size(s: &str) -> anyhow::Result<u64> {
    granary_proto::units::parse_size(s).map_err(|e| anyhow!("size {s:?}: {e}"))
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
    granary_proto::units::parse_duration(s).map_err(|e| anyhow!("duration {s:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
