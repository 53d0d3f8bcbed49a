//! Header values that S3 answers and S3 errors both carry.

use http::HeaderValue;

/// A time as HTTP headers write it.
pub fn http_date(t: std::time::SystemTime) -> HeaderValue {
    HeaderValue::from_str(&httpdate::fmt_http_date(t)).expect("HTTP dates are ASCII")
}

/// `"etag"`, quoted as S3 sends it.
pub fn quoted(etag: &str) -> HeaderValue {
    HeaderValue::from_str(&format!("\"{etag}\""))
        .unwrap_or_else(|_| HeaderValue::from_static("\"\""))
}
