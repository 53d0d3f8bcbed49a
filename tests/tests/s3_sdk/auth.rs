//! Presigned URLs (SigV4 and SigV2), refused credentials, unsigned requests, `--anonymous-read`.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presigned_urls() {
    let (server, s3, bucket) = setup("presign").await;
    let key = "dir/spaced key é+1.bin";
    let data = random_bytes(50_000);
    put(&s3, &bucket, key, &data).await;
    put(&s3, &bucket, "other", b"other bytes").await;

    let fetch = |url: String, headers: Vec<(String, String)>| {
        let addr = server.addr();
        async move {
            let h: Vec<(&str, &str)> = headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let req = request_bytes("GET", path_and_query(&url), addr, &h, b"");
            granary_tests::raw_request(addr, req)
                .await
                .expect("raw GET")
        }
    };
    let headers_of = |p: &aws_sdk_s3::presigning::PresignedRequest| -> Vec<(String, String)> {
        p.headers()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };

    let presigned = s3
        .get_object()
        .bucket(&bucket)
        .key(key)
        .presigned(PresigningConfig::expires_in(Duration::from_secs(300)).unwrap())
        .await
        .expect("presign GET");
    let url = presigned.uri().to_string();
    assert!(url.contains("X-Amz-Signature="), "{url}");
    let resp = fetch(url.clone(), headers_of(&presigned)).await;
    assert_eq!(resp.status, 200, "presigned GET: {}", resp.text());
    assert!(resp.body == data, "presigned GET bytes");
    assert_eq!(resp.header("etag"), Some(etag_of(&data).as_str()));

    // Tampered signature.
    let sig_at = url.find("X-Amz-Signature=").unwrap() + "X-Amz-Signature=".len();
    let mut tampered = url.clone().into_bytes();
    tampered[sig_at] = if tampered[sig_at] == b'0' { b'1' } else { b'0' };
    let resp = fetch(String::from_utf8(tampered).unwrap(), headers_of(&presigned)).await;
    resp.assert_s3_error(403, &["SignatureDoesNotMatch"]);

    // The signature of one key used for another.
    let encoded_key = encode::path(key);
    assert!(url.contains(&encoded_key), "{url} vs {encoded_key}");
    let swapped = url.replacen(&encoded_key, "other", 1);
    let resp = fetch(swapped, headers_of(&presigned)).await;
    resp.assert_s3_error(403, &["SignatureDoesNotMatch"]);

    // Expired.
    let old = PresigningConfig::builder()
        .start_time(SystemTime::now() - Duration::from_secs(3600))
        .expires_in(Duration::from_secs(60))
        .build()
        .unwrap();
    let expired = s3
        .get_object()
        .bucket(&bucket)
        .key(key)
        .presigned(old)
        .await
        .unwrap();
    let resp = fetch(expired.uri().to_string(), headers_of(&expired)).await;
    assert_eq!(resp.status, 403, "expired presigned URL: {}", resp.text());
    granary_tests::assert_s3_error_body(&resp.body);

    // Presigned PUT.
    let new_data = random_bytes(7777);
    let put_url = s3
        .put_object()
        .bucket(&bucket)
        .key("uploaded/by url")
        .presigned(PresigningConfig::expires_in(Duration::from_secs(300)).unwrap())
        .await
        .expect("presign PUT");
    let h = headers_of(&put_url);
    let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let req = request_bytes(
        "PUT",
        path_and_query(put_url.uri()),
        server.addr(),
        &h,
        &new_data,
    );
    let resp = granary_tests::raw_request(server.addr(), req)
        .await
        .unwrap();
    assert_eq!(resp.status, 200, "presigned PUT: {}", resp.text());
    assert_eq!(resp.header("etag"), Some(etag_of(&new_data).as_str()));
    assert_eq!(get(&s3, &bucket, "uploaded/by url").await, new_data);
}

/// SigV2 query-string presigning, as boto3's default presigner makes it.
fn sigv2_url(bucket: &str, key: &str, expires: u64, secret: &str) -> String {
    let resource = format!("/{bucket}/{}", encode::path(key));
    let string_to_sign = format!("GET\n\n\n{expires}\n{resource}");
    let sig = granary_proto::sigv2::signature(secret, &string_to_sign);
    format!(
        "{resource}?AWSAccessKeyId={ACCESS}&Expires={expires}&Signature={}",
        encode::query_value(&sig)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigv2_presigned_get() {
    let (server, s3, bucket) = setup("sigv2").await;
    let data = random_bytes(3000);
    put(&s3, &bucket, "v2/obj.bin", &data).await;
    let get_raw = |path: String| {
        let addr = server.addr();
        async move {
            let req = request_bytes("GET", &path, addr, &[], b"");
            granary_tests::raw_request(addr, req)
                .await
                .expect("raw GET")
        }
    };

    let resp = get_raw(sigv2_url(&bucket, "v2/obj.bin", unix_now() + 300, SECRET)).await;
    assert_eq!(resp.status, 200, "SigV2 presigned GET: {}", resp.text());
    assert!(resp.body == data);

    let resp = get_raw(sigv2_url(
        &bucket,
        "v2/obj.bin",
        unix_now() + 300,
        "wrong-secret",
    ))
    .await;
    resp.assert_s3_error(403, &["SignatureDoesNotMatch"]);

    let resp = get_raw(sigv2_url(&bucket, "v2/obj.bin", unix_now() - 10, SECRET)).await;
    assert_eq!(resp.status, 403, "expired SigV2 URL: {}", resp.text());
    granary_tests::assert_s3_error_body(&resp.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_failures() {
    let (server, s3, bucket) = setup("auth").await;
    put(&s3, &bucket, "k", b"secret bytes").await;

    let wrong_secret = server.s3_client_with(ACCESS, "not-the-secret");
    expect_sdk_error(
        wrong_secret
            .get_object()
            .bucket(&bucket)
            .key("k")
            .send()
            .await,
        403,
        &["SignatureDoesNotMatch"],
    );
    expect_sdk_error(
        wrong_secret
            .put_object()
            .bucket(&bucket)
            .key("k")
            .body(ByteStream::from_static(b"overwrite"))
            .send()
            .await,
        403,
        &["SignatureDoesNotMatch"],
    );
    expect_sdk_error(
        wrong_secret.list_buckets().send().await,
        403,
        &["SignatureDoesNotMatch"],
    );

    let unknown = server.s3_client_with("nobodysaccesskey", SECRET);
    expect_sdk_error(
        unknown.get_object().bucket(&bucket).key("k").send().await,
        403,
        &["InvalidAccessKeyId"],
    );

    for (method, path) in [
        ("GET", format!("/{bucket}/k")),
        ("HEAD", format!("/{bucket}/k")),
        ("GET", "/".to_string()),
        ("GET", format!("/{bucket}?list-type=2")),
        ("PUT", format!("/{bucket}/k")),
        ("DELETE", format!("/{bucket}/k")),
        ("PUT", format!("/{}", bucket_name("anon"))),
    ] {
        let resp = server.raw(method, &path, &[], b"").await.unwrap();
        assert_eq!(
            resp.status,
            403,
            "unsigned {method} {path}: {}",
            resp.text()
        );
        if method != "HEAD" {
            resp.assert_s3_error(403, &["AccessDenied"]);
        }
    }
    // Nothing above changed the object.
    assert_eq!(get(&s3, &bucket, "k").await, b"secret bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_read_allows_reads_only() {
    let server = Server::start(ServerOpts {
        credentials: true,
        anonymous_read: true,
        ..ServerOpts::default()
    })
    .expect("start granary");
    let s3 = server.s3_client();
    let bucket = bucket_name("anon");
    s3.create_bucket().bucket(&bucket).send().await.unwrap();
    let data = random_bytes(20_000);
    put(&s3, &bucket, "train/shard-0.tar", &data).await;

    let resp = server
        .raw("GET", &format!("/{bucket}/train/shard-0.tar"), &[], b"")
        .await
        .unwrap();
    assert_eq!(resp.status, 200, "anonymous GET: {}", resp.text());
    assert!(resp.body == data);
    let resp = server
        .raw("HEAD", &format!("/{bucket}/train/shard-0.tar"), &[], b"")
        .await
        .unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("content-length"), Some("20000"));
    let resp = server
        .raw(
            "GET",
            &format!("/{bucket}/train/shard-0.tar"),
            &[("Range", "bytes=5-14")],
            b"",
        )
        .await
        .unwrap();
    assert_eq!(resp.status, 206);
    assert_eq!(resp.body, data[5..15]);
    let resp = server
        .raw(
            "GET",
            &format!("/{bucket}?list-type=2&prefix=train/"),
            &[],
            b"",
        )
        .await
        .unwrap();
    assert_eq!(resp.status, 200, "anonymous ListObjectsV2: {}", resp.text());
    assert_eq!(
        granary_tests::xml_tags(&resp.text(), "Key"),
        ["train/shard-0.tar"]
    );

    // Writes stay closed.
    let writes = [
        (
            "PUT",
            format!("/{bucket}/train/shard-0.tar"),
            b"evil".to_vec(),
        ),
        ("PUT", format!("/{bucket}/new"), b"evil".to_vec()),
        ("DELETE", format!("/{bucket}/train/shard-0.tar"), Vec::new()),
        ("PUT", format!("/{}", bucket_name("anon-new")), Vec::new()),
        ("DELETE", format!("/{bucket}"), Vec::new()),
        ("POST", format!("/{bucket}/mpu?uploads"), Vec::new()),
        (
            "POST",
            format!("/{bucket}?delete"),
            b"<Delete><Object><Key>train/shard-0.tar</Key></Object></Delete>".to_vec(),
        ),
    ];
    for (method, path, body) in writes {
        let resp = server.raw(method, &path, &[], &body).await.unwrap();
        resp.assert_s3_error(403, &["AccessDenied"]);
    }

    // A bad signature is refused even where anonymous reads are allowed.
    let wrong = server.s3_client_with(ACCESS, "not-the-secret");
    expect_sdk_error(
        wrong
            .get_object()
            .bucket(&bucket)
            .key("train/shard-0.tar")
            .send()
            .await,
        403,
        &["SignatureDoesNotMatch"],
    );

    assert_eq!(get(&s3, &bucket, "train/shard-0.tar").await, data);
    let keys: Vec<String> = list_all(&s3, &bucket, None)
        .await
        .into_iter()
        .map(|x| x.0)
        .collect();
    assert_eq!(keys, ["train/shard-0.tar"]);
}
