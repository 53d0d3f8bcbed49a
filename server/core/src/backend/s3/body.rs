//! Bodies between Granary and the SDK: request streams handed to the SDK with their
//! length and Content-MD5 checked before the last byte leaves, and the SDK's response
//! bodies handed back as our `ByteStream`, chunk by chunk.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use aws_sdk_s3::primitives::ByteStream as SdkByteStream;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use md5::{Digest, Md5};

use super::errors::causes;
use crate::backend::{BackendError, ByteStream};
use crate::sync::Locked;

/// Our request body as an `http_body::Body` for the SDK, checked against its declared
/// length and, when the client sent one, its Content-MD5 (S3 checks it too, but not every
/// S3-compatible store does). The last chunk is held back until the check passes and the
/// stream has ended, so a failing body never reaches the store whole and is never
/// committed. A failure is recorded for the caller, so it reports the client's error
/// (bad signature, short body, BadDigest) rather than the SDK's wrapping of it.
pub(super) struct UploadBody {
    /// A `Mutex` only to make the body `Sync`, as the SDK asks; it is never contended.
    inner: Mutex<ByteStream>,
    size: u64,
    remaining: u64,
    /// The running MD5 and the one expected, until checked.
    md5: Option<(Md5, [u8; 16])>,
    /// The last chunk, sent once the stream has ended.
    held: Option<Bytes>,
    finished: bool,
    failure: Arc<Mutex<Option<BackendError>>>,
}

pub(super) type Polled = Poll<Option<std::result::Result<Frame<Bytes>, io::Error>>>;

impl UploadBody {
    pub(super) fn new(
        inner: ByteStream,
        size: u64,
        expected_md5: Option<[u8; 16]>,
        failure: Arc<Mutex<Option<BackendError>>>,
    ) -> UploadBody {
        UploadBody {
            inner: Mutex::new(inner),
            size,
            remaining: size,
            md5: expected_md5.map(|m| (Md5::new(), m)),
            held: None,
            finished: false,
            failure,
        }
    }

    fn fail(&mut self, e: BackendError) -> Polled {
        let msg = e.to_string();
        *self.failure.locked() = Some(e);
        self.finished = true;
        self.held = None;
        Poll::Ready(Some(Err(io::Error::other(msg))))
    }

    fn too_long(&mut self) -> Polled {
        let size = self.size;
        self.fail(BackendError::IncompleteBody(format!(
            "the body is longer than its declared {size} bytes"
        )))
    }

    /// Checks the MD5 once every byte has been seen.
    fn digest_ok(&mut self) -> bool {
        match self.md5.take() {
            Some((md5, want)) => <[u8; 16]>::from(md5.finalize()) == want,
            None => true,
        }
    }

    fn bad_digest(&mut self) -> Polled {
        self.fail(BackendError::BadDigest(
            "the Content-MD5 you specified did not match what we received".into(),
        ))
    }
}

impl http_body::Body for UploadBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Polled {
        let this = self.get_mut();
        loop {
            if this.finished {
                return Poll::Ready(None);
            }
            let inner = this.inner.get_mut().unwrap_or_else(|p| p.into_inner());
            let next = match inner.as_mut().poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(next) => next,
            };
            match next {
                Some(Err(e)) => return this.fail(BackendError::Body(e)),
                Some(Ok(chunk)) if chunk.is_empty() => continue,
                Some(Ok(_)) if this.held.is_some() => return this.too_long(),
                Some(Ok(chunk)) => {
                    if chunk.len() as u64 > this.remaining {
                        return this.too_long();
                    }
                    this.remaining -= chunk.len() as u64;
                    if let Some((md5, _)) = &mut this.md5 {
                        md5.update(&chunk);
                    }
                    if this.remaining > 0 {
                        return Poll::Ready(Some(Ok(Frame::data(chunk))));
                    }
                    if !this.digest_ok() {
                        return this.bad_digest();
                    }
                    this.held = Some(chunk);
                }
                None if this.remaining > 0 => {
                    let (size, got) = (this.size, this.size - this.remaining);
                    return this.fail(BackendError::IncompleteBody(format!(
                        "expected {size} bytes, received {got}"
                    )));
                }
                None => {
                    // An empty body is checked here; a longer one was when it filled up.
                    if !this.digest_ok() {
                        return this.bad_digest();
                    }
                    this.finished = true;
                    return Poll::Ready(this.held.take().map(|c| Ok(Frame::data(c))));
                }
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        let held = self.held.as_ref().map_or(0, |c| c.len() as u64);
        SizeHint::with_exact(self.remaining + held)
    }
}

/// Opens the same version of the object again from an offset (`If-Match` on its ETag),
/// for a read that broke off: the new answer's body, which must hold the rest.
pub(super) type Reopen = Box<
    dyn Fn(u64) -> futures::future::BoxFuture<'static, io::Result<SdkByteStream>> + Send + Sync,
>;

/// How often one read is resumed after the store or the network broke it off.
const RESUMES: u32 = 3;

/// The SDK's response body as our `ByteStream`, chunk by chunk, failing unless exactly
/// `expected` bytes arrive. The body holds the object's bytes from `start`; when it breaks
/// off (a reset, a close before its length), `reopen` asks for the rest of the same
/// version, up to [`RESUMES`] times, so a cache fill survives a dropped connection. A
/// version that changed meanwhile, or a store that keeps failing, fails the stream.
pub(super) fn download(
    body: SdkByteStream,
    start: u64,
    expected: u64,
    backend: String,
    reopen: Option<Reopen>,
) -> ByteStream {
    Box::pin(async_stream::try_stream! {
        let mut body = body;
        let mut got = 0u64;
        let mut resumed = 0;
        loop {
            let broke = match body.next().await {
                Some(Ok(chunk)) => {
                    got += chunk.len() as u64;
                    if got > expected {
                        Err(io::Error::other(format!(
                            "the S3 backend at {backend} sent more than the {expected} bytes it announced"
                        )))?;
                    }
                    yield chunk;
                    continue;
                }
                None if got == expected => break,
                None => format!("ended after {got} of {expected} bytes"),
                // The store or the network broke off: its side; a retry may help.
                Some(Err(e)) => format!("broke off after {got} of {expected} bytes: {}", causes(&e)),
            };
            match &reopen {
                Some(reopen) if resumed < RESUMES => {
                    resumed += 1;
                    tracing::warn!(backend = %backend, at = start + got, attempt = resumed, why = %broke, "resuming a backend read");
                    body = reopen(start + got).await.map_err(|e| io::Error::other(format!(
                        "the S3 backend at {backend} {broke}, and resuming failed: {e}"
                    )))?;
                }
                _ => Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!(
                    "the S3 backend at {backend} {broke}"
                )))?,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(parts: &[&'static [u8]]) -> ByteStream {
        let items: Vec<io::Result<Bytes>> =
            parts.iter().map(|p| Ok(Bytes::from_static(p))).collect();
        Box::pin(futures::stream::iter(items))
    }

    /// Collects an upload body: its bytes, or the failure it recorded.
    async fn send(
        parts: &[&'static [u8]],
        size: u64,
        md5: Option<[u8; 16]>,
    ) -> std::result::Result<Vec<u8>, BackendError> {
        use http_body_util::BodyExt;
        let failure = Arc::new(Mutex::new(None));
        let body = UploadBody::new(chunks(parts), size, md5, failure.clone());
        match body.collect().await {
            Ok(c) => Ok(c.to_bytes().to_vec()),
            Err(_) => Err(failure
                .lock()
                .unwrap()
                .take()
                .expect("a failure is recorded")),
        }
    }

    #[tokio::test]
    async fn upload_body_checks_length_and_md5_before_its_last_byte() {
        let md5 = |b: &[u8]| -> [u8; 16] { Md5::digest(b).into() };
        assert_eq!(
            send(&[b"ab", b"", b"c"], 3, Some(md5(b"abc")))
                .await
                .unwrap(),
            b"abc"
        );
        assert_eq!(send(&[], 0, Some(md5(b""))).await.unwrap(), b"");
        assert!(matches!(
            send(&[b"abc"], 5, None).await,
            Err(BackendError::IncompleteBody(_))
        ));
        assert!(matches!(
            send(&[b"abc", b"d"], 3, None).await,
            Err(BackendError::IncompleteBody(_))
        ));
        assert!(matches!(
            send(&[b"ab", b"c"], 3, Some(md5(b"abd"))).await,
            Err(BackendError::BadDigest(_))
        ));
        assert!(matches!(
            send(&[], 0, Some(md5(b"x"))).await,
            Err(BackendError::BadDigest(_))
        ));

        // The bytes before the last chunk go out; the last waits for the check.
        let failure = Arc::new(Mutex::new(None));
        let mut body = UploadBody::new(
            chunks(&[b"ab", b"c"]),
            3,
            Some(md5(b"xyz")),
            failure.clone(),
        );
        let mut frames = Vec::new();
        while let Some(f) =
            std::future::poll_fn(|cx| http_body::Body::poll_frame(Pin::new(&mut body), cx)).await
        {
            frames.push(f.map(|f| f.into_data().unwrap()));
        }
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].as_deref().unwrap(), b"ab");
        assert!(frames[1].is_err());
    }
}
