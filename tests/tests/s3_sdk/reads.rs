//! Range and conditional reads.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_reads() {
    let (server, s3, bucket) = setup("range").await;
    let data = random_bytes(100);
    let etag = put(&s3, &bucket, "r", &data).await;

    for (range, lo, hi) in [
        ("bytes=0-9", 0usize, 9usize),
        ("bytes=10-", 10, 99),
        ("bytes=-5", 95, 99),
        ("bytes=90-200", 90, 99),
        ("bytes=0-0", 0, 0),
        ("bytes=99-99", 99, 99),
        ("bytes=-500", 0, 99),
    ] {
        let out = s3
            .get_object()
            .bucket(&bucket)
            .key("r")
            .range(range)
            .send()
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "GET {range}: {}",
                    aws_sdk_s3::error::DisplayErrorContext(&e)
                )
            });
        let want_cr = format!("bytes {lo}-{hi}/100");
        assert_eq!(out.content_range(), Some(want_cr.as_str()), "{range}");
        assert_eq!(out.content_length(), Some((hi - lo + 1) as i64), "{range}");
        assert_eq!(out.e_tag(), Some(etag.as_str()), "{range}");
        let body = out.body.collect().await.unwrap().to_vec();
        assert_eq!(body, data[lo..=hi], "{range}");
    }

    // Status 206 for a range, 200 without (the SDK hides the status; ask via presigned raw).
    let presigned = s3
        .get_object()
        .bucket(&bucket)
        .key("r")
        .presigned(PresigningConfig::expires_in(Duration::from_secs(300)).unwrap())
        .await
        .unwrap();
    let req = request_bytes(
        "GET",
        path_and_query(presigned.uri()),
        server.addr(),
        &[("Range", "bytes=0-9")],
        b"",
    );
    let resp = granary_tests::raw_request(server.addr(), req)
        .await
        .unwrap();
    assert_eq!(resp.status, 206);
    assert_eq!(resp.header("content-range"), Some("bytes 0-9/100"));
    assert_eq!(resp.body, data[..10]);

    for range in ["bytes=100-", "bytes=150-200"] {
        expect_sdk_error(
            s3.get_object()
                .bucket(&bucket)
                .key("r")
                .range(range)
                .send()
                .await,
            416,
            &["InvalidRange"],
        );
    }

    let head = s3
        .head_object()
        .bucket(&bucket)
        .key("r")
        .range("bytes=0-9")
        .send()
        .await
        .expect("HeadObject with Range");
    assert_eq!(head.content_length(), Some(10));
    assert_eq!(head.content_range(), Some("bytes 0-9/100"));
    assert_eq!(head.e_tag(), Some(etag.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditional_reads() {
    let (_server, s3, bucket) = setup("cond").await;
    let data = random_bytes(2048);
    let etag = put(&s3, &bucket, "c", &data).await;
    let other = "\"0123456789abcdef0123456789abcdef\"";

    let err = s3
        .get_object()
        .bucket(&bucket)
        .key("c")
        .if_none_match(&etag)
        .send()
        .await
        .expect_err("If-None-Match with the current ETag");
    assert_eq!(sdk_error(&err).0, 304, "If-None-Match current: {err:?}");
    let err = s3
        .head_object()
        .bucket(&bucket)
        .key("c")
        .if_none_match(&etag)
        .send()
        .await
        .expect_err("HEAD If-None-Match with the current ETag");
    assert_eq!(sdk_error(&err).0, 304);

    let out = s3
        .get_object()
        .bucket(&bucket)
        .key("c")
        .if_none_match(other)
        .send()
        .await
        .expect("If-None-Match with another ETag");
    assert_eq!(out.body.collect().await.unwrap().to_vec(), data);

    expect_sdk_error(
        s3.get_object()
            .bucket(&bucket)
            .key("c")
            .if_match(other)
            .send()
            .await,
        412,
        &["PreconditionFailed"],
    );
    expect_sdk_error(
        s3.head_object()
            .bucket(&bucket)
            .key("c")
            .if_match(other)
            .send()
            .await,
        412,
        &[],
    );

    let out = s3
        .get_object()
        .bucket(&bucket)
        .key("c")
        .if_match(&etag)
        .send()
        .await
        .expect("If-Match with the current ETag");
    assert_eq!(out.e_tag(), Some(etag.as_str()));
    assert_eq!(out.body.collect().await.unwrap().to_vec(), data);

    // After an overwrite the old ETag no longer matches.
    let v2 = random_bytes(100);
    put(&s3, &bucket, "c", &v2).await;
    expect_sdk_error(
        s3.get_object()
            .bucket(&bucket)
            .key("c")
            .if_match(&etag)
            .send()
            .await,
        412,
        &["PreconditionFailed"],
    );
    let out = s3
        .get_object()
        .bucket(&bucket)
        .key("c")
        .if_none_match(&etag)
        .send()
        .await
        .expect("If-None-Match with the old ETag");
    assert_eq!(out.body.collect().await.unwrap().to_vec(), v2);
}
