//! Wrong and malformed signatures, signed payload hashes, chunk signatures, clock skew.

use super::*;

#[tokio::test]
async fn wrong_and_malformed_signatures() {
    let sb = Sandbox::start(ServerOpts::with_credentials());
    let s3 = sb.server.s3_client();
    let bucket = bucket_name("sig");
    s3.create_bucket().bucket(&bucket).send().await.unwrap();
    s3.put_object()
        .bucket(&bucket)
        .key("k")
        .body(ByteStream::from_static(b"protected"))
        .send()
        .await
        .unwrap();
    let path = format!("/{bucket}/k");
    let empty_sha = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    let now = amz_date(unix_now());
    let wrong_sig = format!(
        "AWS4-HMAC-SHA256 Credential=granarytest/{}/us-east-1/s3/aws4_request, \
         SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature={}",
        &now[..8],
        "0123456789abcdef".repeat(4)
    );
    for method in ["GET", "PUT", "DELETE"] {
        let resp = sb
            .raw(
                method,
                &path,
                &[
                    ("x-amz-date", &now),
                    ("x-amz-content-sha256", empty_sha),
                    ("Authorization", &wrong_sig),
                ],
                b"",
            )
            .await;
        resp.assert_s3_error(403, &["SignatureDoesNotMatch"]);
        sb.server.assert_healthy("wrong signature").await;
    }

    let old = amz_date(unix_now() - 7 * 86_400);
    let stale_sig = wrong_sig.replace(&now[..8], &old[..8]);
    let malformed: Vec<(String, String)> = vec![
        ("AWS4-HMAC-SHA256".into(), now.clone()),
        ("AWS4-HMAC-SHA256 ".into(), now.clone()),
        ("AWS4-HMAC-SHA256 Credential=".into(), now.clone()),
        ("AWS4-HMAC-SHA256 Credential=granarytest, SignedHeaders=, Signature=".into(), now.clone()),
        ("AWS4-HMAC-SHA256 garbage=1, Signature=zz".into(), now.clone()),
        (
            "AWS4-HMAC-SHA256 Credential=granarytest/notadate/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=abc"
                .into(),
            now.clone(),
        ),
        (
            "AWS4-HMAC-SHA256 Credential=granarytest/20250101/us-east-1/s3/aws4_request,SignedHeaders=host;x-amz-date,Signature=ééé"
                .into(),
            now.clone(),
        ),
        ("Bearer abcdef".into(), now.clone()),
        ("AWS granarytest:".into(), now.clone()),
        ("AWS granarytest:bm90IGEgc2lnbmF0dXJl".into(), now.clone()),
        (String::new(), now.clone()),
        (wrong_sig.clone(), "yesterday".into()),
        (wrong_sig.clone(), String::new()),
        (stale_sig, old),
    ];
    for (auth, date) in &malformed {
        let resp = sb
            .raw(
                "GET",
                &path,
                &[
                    ("x-amz-date", date),
                    ("x-amz-content-sha256", empty_sha),
                    ("Authorization", auth),
                ],
                b"",
            )
            .await;
        assert!(
            matches!(resp.status, 400 | 403),
            "Authorization {auth:?} x-amz-date {date:?}: {} {}",
            resp.status,
            resp.text()
        );
        assert_s3_error_body(&resp.body);
        assert_ne!(resp.body, b"protected");
        sb.server.assert_healthy(auth).await;
    }

    // Presigned query parameters that do not parse.
    for query in [
        "X-Amz-Algorithm=AWS4-HMAC-SHA256",
        "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=x&X-Amz-Date=y&X-Amz-Expires=z&X-Amz-SignedHeaders=host&X-Amz-Signature=00",
        "X-Amz-Algorithm=NOPE&X-Amz-Signature=00",
        "AWSAccessKeyId=granarytest&Expires=abc&Signature=%%%",
        "AWSAccessKeyId=granarytest&Signature=abc",
    ] {
        let resp = sb.raw("GET", &format!("{path}?{query}"), &[], b"").await;
        assert!(
            matches!(resp.status, 400 | 403),
            "query {query}: {} {}",
            resp.status,
            resp.text()
        );
        assert_s3_error_body(&resp.body);
        sb.server.assert_healthy(query).await;
    }
    // Still intact and still readable by the rightful client.
    let got = s3
        .get_object()
        .bucket(&bucket)
        .key("k")
        .send()
        .await
        .unwrap();
    assert_eq!(got.body.collect().await.unwrap().to_vec(), b"protected");
}

/// Sends one request signed with the test credentials; `payload_sha256` may lie about `body`.
async fn signed(
    sb: &Sandbox,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    payload_sha256: &str,
    body: &[u8],
    unix: u64,
) -> RawResponse {
    let sig = SignedRequest::new(
        method,
        path,
        sb.server.addr(),
        headers,
        payload_sha256,
        ACCESS,
        SECRET,
        unix,
    );
    let mut all: Vec<(&str, &str)> = headers.to_vec();
    all.extend(sig.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    sb.raw(method, path, &all, body).await
}

#[tokio::test]
async fn signed_payloads_are_verified() {
    let sb = Sandbox::start(ServerOpts::with_credentials());
    let now = unix_now();
    let empty = sha256_hex(b"");
    let resp = signed(&sb, "PUT", "/sig", &[], &empty, b"", now).await;
    assert_eq!(resp.status, 200, "signed CreateBucket: {}", resp.text());

    // The hand signer agrees with the server.
    let original = b"original bytes".to_vec();
    let resp = signed(
        &sb,
        "PUT",
        "/sig/k",
        &[],
        &sha256_hex(&original),
        &original,
        now,
    )
    .await;
    assert_eq!(resp.status, 200, "signed PUT: {}", resp.text());
    let resp = signed(&sb, "GET", "/sig/k?x-id=GetObject", &[], &empty, b"", now).await;
    assert_eq!(resp.status, 200, "signed GET: {}", resp.text());
    assert_eq!(resp.body, original);

    // A body that is not the one whose hash was signed.
    let resp = signed(
        &sb,
        "PUT",
        "/sig/k",
        &[],
        &sha256_hex(b"the signed bytes"),
        b"other bytes!!!!!",
        now,
    )
    .await;
    resp.assert_s3_error(400, &["XAmzContentSHA256Mismatch", "BadDigest"]);
    let resp = signed(&sb, "GET", "/sig/k", &[], &empty, b"", now).await;
    assert_eq!(
        resp.body, original,
        "a body with the wrong hash replaced the object"
    );

    // A signed request from an hour ago is refused (S3 allows 15 minutes of skew).
    let resp = signed(&sb, "GET", "/sig/k", &[], &empty, b"", now - 3600).await;
    resp.assert_s3_error(403, &["RequestTimeTooSkewed"]);

    // A signed header sent with another value.
    let sig = SignedRequest::new(
        "GET",
        "/sig/k",
        sb.server.addr(),
        &[("range", "bytes=0-3")],
        &empty,
        ACCESS,
        SECRET,
        now,
    );
    let mut headers: Vec<(&str, &str)> = vec![("Range", "bytes=0-9")];
    headers.extend(sig.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let resp = sb.raw("GET", "/sig/k", &headers, b"").await;
    resp.assert_s3_error(403, &["SignatureDoesNotMatch"]);
    sb.server.assert_healthy("signed payloads").await;
}

#[tokio::test]
async fn signed_chunks_are_verified() {
    let sb = Sandbox::start(ServerOpts::with_credentials());
    let now = unix_now();
    let empty = sha256_hex(b"");
    assert_eq!(
        signed(&sb, "PUT", "/sig", &[], &empty, b"", now)
            .await
            .status,
        200
    );

    let a = random_bytes(64 * 1024);
    let b = random_bytes(64 * 1024);
    let c = random_bytes(100);
    let decoded = (a.len() + b.len() + c.len()).to_string();
    let encoded = signed_chunks_len(&[a.len(), b.len(), c.len()]).to_string();
    let put = |key: &'static str, tamper: fn(&mut Vec<u8>)| {
        let (a, b, c) = (a.clone(), b.clone(), c.clone());
        let (decoded, encoded) = (decoded.clone(), encoded.clone());
        let sb = &sb;
        async move {
            let extra = [
                ("content-encoding", "aws-chunked"),
                ("content-length", encoded.as_str()),
                ("x-amz-decoded-content-length", decoded.as_str()),
            ];
            let path = format!("/sig/{key}");
            let sig = SignedRequest::new(
                "PUT",
                &path,
                sb.server.addr(),
                &extra,
                "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
                ACCESS,
                SECRET,
                now,
            );
            let mut body = sig.signed_chunks(&[&a, &b, &c]);
            tamper(&mut body);
            let mut headers: Vec<(&str, &str)> = extra.to_vec();
            headers.extend(sig.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            sb.raw("PUT", &path, &headers, &body).await
        }
    };

    let resp = put("good", |_| {}).await;
    assert_eq!(resp.status, 200, "signed aws-chunked PUT: {}", resp.text());
    let whole = [a.clone(), b.clone(), c.clone()].concat();
    assert_eq!(
        resp.header("etag"),
        Some(granary_tests::etag_of(&whole).as_str())
    );
    let resp = signed(&sb, "GET", "/sig/good", &[], &empty, b"", now).await;
    assert!(
        resp.body == whole,
        "signed aws-chunked PUT stored other bytes"
    );

    // One payload byte of the second chunk flipped: its signature no longer holds.
    let resp = put("tampered", |body| {
        let at = body.len() / 2;
        body[at] ^= 0xff;
    })
    .await;
    resp.assert_s3_error(403, &["SignatureDoesNotMatch"]);
    // The final (empty) chunk's signature broken.
    let resp = put("bad-final", |body| {
        let at = body.len() - 5;
        body[at] = if body[at] == b'0' { b'1' } else { b'0' };
    })
    .await;
    resp.assert_s3_error(403, &["SignatureDoesNotMatch"]);
    for key in ["tampered", "bad-final"] {
        let resp = signed(&sb, "GET", &format!("/sig/{key}"), &[], &empty, b"", now).await;
        resp.assert_s3_error(404, &["NoSuchKey"]);
    }
    sb.server.assert_healthy("signed chunks").await;
}
