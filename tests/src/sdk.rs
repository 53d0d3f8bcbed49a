//! Reading the status and S3 code out of `aws-sdk-s3` errors.

use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};

/// HTTP status and S3 error code of a failed SDK call; status 0 when no response came back.
pub fn sdk_error<E, R>(err: &SdkError<E, R>) -> (u16, Option<String>)
where
    E: ProvideErrorMetadata,
    R: HasStatus,
{
    let status = err.raw_response().map(HasStatus::status_u16).unwrap_or(0);
    (status, err.code().map(str::to_string))
}

/// Access to the HTTP status of the SDK's raw response type.
pub trait HasStatus {
    fn status_u16(&self) -> u16;
}

impl HasStatus for aws_sdk_s3::config::http::HttpResponse {
    fn status_u16(&self) -> u16 {
        self.status().as_u16()
    }
}

/// Panics unless `result` is an SDK error with `status` and one of `codes` (any code if
/// `codes` is empty, e.g. for `HEAD`, whose errors have no body).
pub fn expect_sdk_error<T, E>(
    result: std::result::Result<T, SdkError<E, aws_sdk_s3::config::http::HttpResponse>>,
    status: u16,
    codes: &[&str],
) where
    T: std::fmt::Debug,
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let err = match result {
        Ok(v) => panic!("expected HTTP {status} {codes:?}, got success: {v:?}"),
        Err(e) => e,
    };
    let (got_status, code) = sdk_error(&err);
    assert_eq!(
        got_status,
        status,
        "expected HTTP {status} {codes:?}, got {got_status} {code:?}: {}",
        aws_sdk_s3::error::DisplayErrorContext(&err)
    );
    if !codes.is_empty() {
        let code = code.unwrap_or_default();
        assert!(
            codes.contains(&code.as_str()),
            "expected code in {codes:?}, got {code:?}: {}",
            aws_sdk_s3::error::DisplayErrorContext(&err)
        );
    }
}
