//! Times as the client reads and prints them: `Last-Modified` headers, and RFC 3339 for
//! people.

use std::time::SystemTime;

/// `Thu, 29 Feb 2024 12:34:56 GMT` (`Last-Modified`).
pub(crate) fn parse_http_date(s: &str) -> Option<SystemTime> {
    let format = time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    time::PrimitiveDateTime::parse(s.trim(), format)
        .ok()
        .map(|t| SystemTime::from(t.assume_utc()))
}

/// RFC 3339 text of a time, to the second, in UTC.
pub fn format_time(t: SystemTime) -> String {
    let format =
        time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z");
    time::OffsetDateTime::from(t)
        .format(format)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn dates_parse() {
        let t = UNIX_EPOCH + Duration::from_secs(1_709_210_096);
        assert_eq!(parse_http_date("Thu, 29 Feb 2024 12:34:56 GMT"), Some(t));
        assert_eq!(format_time(t), "2024-02-29T12:34:56Z");
        assert_eq!(parse_http_date("yesterday"), None);
    }
}
