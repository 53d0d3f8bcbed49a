//! HTTP/1.1 answers as a client reads them: where a body ends (RFC 9112 §6.3) and a
//! chunk's size line. The client library's blocking reader and the node's reads from an
//! S3 store frame bodies by the same rules.

/// How an answer's body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyLength {
    /// After this many bytes.
    Length(u64),
    /// At the last chunk (`Transfer-Encoding: chunked`).
    Chunked,
    /// When the server closes the connection.
    UntilClose,
}

/// Where the body of an answer with `status` ends, given its `Transfer-Encoding` and
/// `Content-Length`: nothing follows a HEAD's answer, a 1xx, 204 or 304; chunked comes
/// before a length. A length that is not a number is an error, naming it.
pub fn body_length(
    status: u16,
    head_request: bool,
    transfer_encoding: Option<&str>,
    content_length: Option<&str>,
) -> Result<BodyLength, String> {
    if head_request || status == 204 || status == 304 || status < 200 {
        return Ok(BodyLength::Length(0));
    }
    if transfer_encoding.is_some_and(|v| v.to_ascii_lowercase().contains("chunked")) {
        return Ok(BodyLength::Chunked);
    }
    match content_length {
        Some(v) => v
            .trim()
            .parse()
            .map(BodyLength::Length)
            .map_err(|_| format!("content-length `{v}`")),
        None => Ok(BodyLength::UntilClose),
    }
}

/// The size of the chunk a chunk-size line (without or with its CRLF) announces,
/// extensions ignored.
pub fn chunk_size(line: &str) -> Option<u64> {
    let size = line.trim().split(';').next().unwrap_or("").trim();
    u64::from_str_radix(size, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_end_where_the_rules_say() {
        assert_eq!(
            body_length(200, true, None, Some("10")),
            Ok(BodyLength::Length(0))
        );
        for status in [100, 204, 304] {
            assert_eq!(
                body_length(status, false, None, Some("10")),
                Ok(BodyLength::Length(0))
            );
        }
        assert_eq!(
            body_length(200, false, Some("gzip, Chunked"), Some("10")),
            Ok(BodyLength::Chunked)
        );
        assert_eq!(
            body_length(404, false, None, Some(" 17 ")),
            Ok(BodyLength::Length(17))
        );
        assert_eq!(
            body_length(200, false, None, None),
            Ok(BodyLength::UntilClose)
        );
        assert_eq!(
            body_length(200, false, None, Some("x1")),
            Err("content-length `x1`".to_owned())
        );
    }

    #[test]
    fn chunk_sizes_are_hex_before_any_extension() {
        assert_eq!(chunk_size("1A\r\n"), Some(26));
        assert_eq!(chunk_size("0;name=value"), Some(0));
        assert_eq!(chunk_size(" ff ; x"), Some(255));
        assert_eq!(chunk_size(""), None);
        assert_eq!(chunk_size("g"), None);
    }
}
