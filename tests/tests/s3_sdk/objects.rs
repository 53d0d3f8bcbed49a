//! Single-part objects: round trips, ETags, metadata, digests and checksums, streaming bodies, concurrent overwrites, deletes, copies.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_get_round_trip_and_etag() {
    let (_server, s3, bucket) = setup("rt").await;
    for (i, len) in [0usize, 1, 100_000, MIB + 7].into_iter().enumerate() {
        let key = format!("obj-{i}");
        let data = random_bytes(len);
        let etag = put(&s3, &bucket, &key, &data).await;
        assert_eq!(etag, etag_of(&data), "PutObject ETag of {len} bytes");

        let out = s3
            .get_object()
            .bucket(&bucket)
            .key(&key)
            .send()
            .await
            .expect("GetObject");
        assert_eq!(out.e_tag(), Some(etag.as_str()));
        assert_eq!(out.content_length(), Some(len as i64));
        assert!(out.last_modified().is_some(), "GetObject has Last-Modified");
        let body = out.body.collect().await.expect("body").to_vec();
        assert_eq!(body.len(), len);
        assert!(body == data, "GetObject bytes differ for {len} bytes");

        let head = s3
            .head_object()
            .bucket(&bucket)
            .key(&key)
            .send()
            .await
            .expect("HeadObject");
        assert_eq!(head.e_tag(), Some(etag.as_str()));
        assert_eq!(head.content_length(), Some(len as i64));
    }

    // Overwrite: the new bytes and ETag win.
    let v2 = random_bytes(1234);
    assert_eq!(put(&s3, &bucket, "obj-1", &v2).await, etag_of(&v2));
    assert_eq!(get(&s3, &bucket, "obj-1").await, v2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_type_and_user_metadata_round_trip() {
    let (_server, s3, bucket) = setup("meta").await;
    let data = random_bytes(4096);
    s3.put_object()
        .bucket(&bucket)
        .key("shard-000.tar")
        .content_type("application/x-tar")
        .metadata("owner", "alice")
        .metadata("note", "hello world")
        .body(ByteStream::from(data.clone()))
        .send()
        .await
        .expect("PutObject with metadata");
    let want: HashMap<String, String> = [("owner", "alice"), ("note", "hello world")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();

    let got = s3
        .get_object()
        .bucket(&bucket)
        .key("shard-000.tar")
        .send()
        .await
        .expect("GetObject");
    assert_eq!(got.content_type(), Some("application/x-tar"));
    assert_eq!(got.metadata(), Some(&want));
    assert_eq!(got.body.collect().await.unwrap().to_vec(), data);

    let head = s3
        .head_object()
        .bucket(&bucket)
        .key("shard-000.tar")
        .send()
        .await
        .expect("HeadObject");
    assert_eq!(head.content_type(), Some("application/x-tar"));
    assert_eq!(head.metadata(), Some(&want));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_md5_is_checked() {
    let (_server, s3, bucket) = setup("md5").await;
    let b64 = |d: &[u8]| base64::engine::general_purpose::STANDARD.encode(Md5::digest(d));
    let v1 = random_bytes(10_000);
    s3.put_object()
        .bucket(&bucket)
        .key("k")
        .content_md5(b64(&v1))
        .body(ByteStream::from(v1.clone()))
        .send()
        .await
        .expect("PutObject with the right Content-MD5");
    assert_eq!(get(&s3, &bucket, "k").await, v1);

    let v2 = random_bytes(10_000);
    expect_sdk_error(
        s3.put_object()
            .bucket(&bucket)
            .key("k")
            .content_md5(b64(b"something else"))
            .body(ByteStream::from(v2.clone()))
            .send()
            .await,
        400,
        &["BadDigest"],
    );
    // The refused write changed nothing.
    assert_eq!(get(&s3, &bucket, "k").await, v1);

    expect_sdk_error(
        s3.put_object()
            .bucket(&bucket)
            .key("new")
            .content_md5(b64(b"something else"))
            .body(ByteStream::from(v2.clone()))
            .send()
            .await,
        400,
        &["BadDigest"],
    );
    expect_sdk_error(
        s3.get_object().bucket(&bucket).key("new").send().await,
        404,
        &["NoSuchKey"],
    );

    expect_sdk_error(
        s3.put_object()
            .bucket(&bucket)
            .key("new")
            .content_md5("not base64 at all!")
            .body(ByteStream::from(v2))
            .send()
            .await,
        400,
        &["InvalidDigest", "BadDigest"],
    );
    assert_eq!(list_all(&s3, &bucket, None).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flexible_checksums_are_checked() {
    let (_server, s3, bucket) = setup("cksum").await;
    let v1 = random_bytes(10_000);
    put(&s3, &bucket, "k", &v1).await;
    // A CRC32 that does not match the body.
    expect_sdk_error(
        s3.put_object()
            .bucket(&bucket)
            .key("k")
            .checksum_crc32("AAAAAA==")
            .body(ByteStream::from(random_bytes(10_000)))
            .send()
            .await,
        400,
        &["BadDigest"],
    );
    assert_eq!(get(&s3, &bucket, "k").await, v1);
    // The right one is accepted.
    let crc = base64::engine::general_purpose::STANDARD.encode(crc32fast::hash(&v1).to_be_bytes());
    s3.put_object()
        .bucket(&bucket)
        .key("k2")
        .checksum_crc32(crc)
        .body(ByteStream::from(v1.clone()))
        .send()
        .await
        .expect("PutObject with the right CRC32");
    assert_eq!(get(&s3, &bucket, "k2").await, v1);
    // CRC-64/NVME: a wrong one is refused, and the one the SDK computes is accepted.
    expect_sdk_error(
        s3.put_object()
            .bucket(&bucket)
            .key("k3")
            .checksum_crc64_nvme("AAAAAAAAAAA=")
            .body(ByteStream::from(v1.clone()))
            .send()
            .await,
        400,
        &["BadDigest"],
    );
    let v2 = random_bytes(300_000);
    s3.put_object()
        .bucket(&bucket)
        .key("k3")
        .checksum_algorithm(aws_sdk_s3::types::ChecksumAlgorithm::Crc64Nvme)
        .body(ByteStream::from(v2.clone()))
        .send()
        .await
        .expect("PutObject with the SDK's CRC-64/NVME");
    assert_eq!(get(&s3, &bucket, "k3").await, v2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_bodies_in_aws_chunked_encoding() {
    // A body the SDK cannot hold in memory (a file) goes out as `aws-chunked` with a trailing
    // checksum, as most real uploads do; only the payload may be stored.
    let (_server, s3, bucket) = setup("chunked").await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("upload.bin");
    let data = random_bytes(3 * MIB + 17);
    std::fs::write(&path, &data).unwrap();

    let out = s3
        .put_object()
        .bucket(&bucket)
        .key("from-file")
        .body(ByteStream::from_path(&path).await.unwrap())
        .send()
        .await
        .unwrap_or_else(|e| {
            panic!(
                "streaming PutObject: {}",
                aws_sdk_s3::error::DisplayErrorContext(&e)
            )
        });
    assert_eq!(out.e_tag(), Some(etag_of(&data).as_str()));
    let got = get(&s3, &bucket, "from-file").await;
    assert_eq!(got.len(), data.len(), "stored length");
    assert!(got == data, "streaming PutObject stored other bytes");

    // The same for multipart parts read from the file.
    let big = random_bytes(5 * MIB + 1000);
    std::fs::write(&path, &big).unwrap();
    let id = start_upload(&s3, &bucket, "parts-from-file").await;
    let mut parts = Vec::new();
    for (n, (offset, len)) in [(0u64, 5 * MIB as u64), (5 * MIB as u64, 1000)]
        .into_iter()
        .enumerate()
    {
        let body = ByteStream::read_from()
            .path(&path)
            .offset(offset)
            .length(aws_sdk_s3::primitives::Length::Exact(len))
            .build()
            .await
            .unwrap();
        let out = s3
            .upload_part()
            .bucket(&bucket)
            .key("parts-from-file")
            .upload_id(&id)
            .part_number(n as i32 + 1)
            .body(body)
            .send()
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "streaming UploadPart: {}",
                    aws_sdk_s3::error::DisplayErrorContext(&e)
                )
            });
        let range = offset as usize..(offset + len) as usize;
        assert_eq!(out.e_tag(), Some(etag_of(&big[range]).as_str()));
        parts.push(
            CompletedPart::builder()
                .part_number(n as i32 + 1)
                .e_tag(out.e_tag().unwrap())
                .build(),
        );
    }
    complete(&s3, &bucket, "parts-from-file", &id, parts)
        .await
        .expect("complete");
    assert!(get(&s3, &bucket, "parts-from-file").await == big);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_overwrites_leave_one_whole_version() {
    let (_server, s3, bucket) = setup("race").await;
    let versions: Vec<Vec<u8>> = (0..8).map(|_| random_bytes(MIB + 3)).collect();
    let mut tasks = tokio::task::JoinSet::new();
    for v in versions.clone() {
        let s3 = s3.clone();
        let bucket = bucket.clone();
        tasks.spawn(async move { put(&s3, &bucket, "contended", &v).await });
    }
    // Readers meanwhile see a whole version or nothing, never a mix.
    for _ in 0..5 {
        if let Ok(out) = s3
            .get_object()
            .bucket(&bucket)
            .key("contended")
            .send()
            .await
        {
            let etag = out.e_tag().unwrap_or_default().to_string();
            let body = out.body.collect().await.expect("body").to_vec();
            assert!(
                versions.contains(&body),
                "a read during overwrites saw a mix of versions"
            );
            assert_eq!(etag, etag_of(&body));
        }
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("put task");
    }
    let out = s3
        .get_object()
        .bucket(&bucket)
        .key("contended")
        .send()
        .await
        .expect("get");
    let etag = out.e_tag().unwrap_or_default().to_string();
    let body = out.body.collect().await.unwrap().to_vec();
    assert!(
        versions.contains(&body),
        "final object is none of the versions"
    );
    assert_eq!(etag, etag_of(&body));
    assert_eq!(list_all(&s3, &bucket, None).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_object_and_delete_objects() {
    let (_server, s3, bucket) = setup("del").await;
    put(&s3, &bucket, "gone", b"bytes").await;
    s3.delete_object()
        .bucket(&bucket)
        .key("gone")
        .send()
        .await
        .expect("DeleteObject");
    expect_sdk_error(
        s3.get_object().bucket(&bucket).key("gone").send().await,
        404,
        &["NoSuchKey"],
    );
    expect_sdk_error(
        s3.head_object().bucket(&bucket).key("gone").send().await,
        404,
        &[],
    );
    // Deleting what is not there succeeds, as in S3.
    s3.delete_object()
        .bucket(&bucket)
        .key("never-existed")
        .send()
        .await
        .expect("DeleteObject of a missing key");

    for key in ["d/1", "d/2", "d/<&'\"> 3", "keep"] {
        put(&s3, &bucket, key, key.as_bytes()).await;
    }
    let ids: Vec<ObjectIdentifier> = ["d/1", "d/2", "d/<&'\"> 3", "d/missing"]
        .into_iter()
        .map(|k| ObjectIdentifier::builder().key(k).build().unwrap())
        .collect();
    let out = s3
        .delete_objects()
        .bucket(&bucket)
        .delete(Delete::builder().set_objects(Some(ids)).build().unwrap())
        .send()
        .await
        .expect("DeleteObjects");
    let deleted: BTreeSet<&str> = out.deleted().iter().filter_map(|d| d.key()).collect();
    assert_eq!(
        deleted,
        BTreeSet::from(["d/1", "d/2", "d/<&'\"> 3", "d/missing"]),
        "Deleted entries"
    );
    assert!(out.errors().is_empty(), "errors: {:?}", out.errors());
    for key in ["d/1", "d/2", "d/<&'\"> 3"] {
        expect_sdk_error(
            s3.get_object().bucket(&bucket).key(key).send().await,
            404,
            &["NoSuchKey"],
        );
    }
    let left: Vec<String> = list_all(&s3, &bucket, None)
        .await
        .into_iter()
        .map(|x| x.0)
        .collect();
    assert_eq!(left, ["keep"]);

    // Quiet mode reports no successes.
    put(&s3, &bucket, "q/1", b"1").await;
    let out = s3
        .delete_objects()
        .bucket(&bucket)
        .delete(
            Delete::builder()
                .objects(ObjectIdentifier::builder().key("q/1").build().unwrap())
                .quiet(true)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .expect("DeleteObjects quiet");
    assert!(out.deleted().is_empty(), "quiet: {:?}", out.deleted());
    assert!(out.errors().is_empty());
    expect_sdk_error(
        s3.get_object().bucket(&bucket).key("q/1").send().await,
        404,
        &["NoSuchKey"],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_object() {
    let (_server, s3, bucket) = setup("copy").await;
    let data = random_bytes(300_000);
    let src = "src dir/naïve key+1.bin";
    s3.put_object()
        .bucket(&bucket)
        .key(src)
        .content_type("application/x-custom")
        .metadata("origin", "unit")
        .body(ByteStream::from(data.clone()))
        .send()
        .await
        .expect("put source");
    let src_etag = etag_of(&data);
    let copy_source = format!("{bucket}/{}", encode::path(src));

    let out = s3
        .copy_object()
        .bucket(&bucket)
        .key("dst/copy.bin")
        .copy_source(&copy_source)
        .send()
        .await
        .expect("CopyObject");
    let etag = out
        .copy_object_result()
        .and_then(|r| r.e_tag())
        .expect("CopyObjectResult ETag");
    assert_eq!(etag, src_etag);
    let got = s3
        .get_object()
        .bucket(&bucket)
        .key("dst/copy.bin")
        .send()
        .await
        .expect("get copy");
    assert_eq!(got.e_tag(), Some(src_etag.as_str()));
    assert_eq!(got.content_type(), Some("application/x-custom"));
    assert_eq!(
        got.metadata()
            .and_then(|m| m.get("origin"))
            .map(String::as_str),
        Some("unit")
    );
    assert_eq!(got.body.collect().await.unwrap().to_vec(), data);
    // The source is untouched.
    assert_eq!(get(&s3, &bucket, src).await, data);

    // Across buckets.
    let other = bucket_name("copy-dst");
    s3.create_bucket().bucket(&other).send().await.unwrap();
    s3.copy_object()
        .bucket(&other)
        .key("x")
        .copy_source(&copy_source)
        .send()
        .await
        .expect("CopyObject across buckets");
    assert_eq!(get(&s3, &other, "x").await, data);

    expect_sdk_error(
        s3.copy_object()
            .bucket(&bucket)
            .key("y")
            .copy_source(format!("{bucket}/no-such-source"))
            .send()
            .await,
        404,
        &["NoSuchKey"],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_bucket_and_key() {
    let (_server, s3, bucket) = setup("miss").await;
    let missing = bucket_name("nobucket");
    expect_sdk_error(
        s3.get_object().bucket(&missing).key("k").send().await,
        404,
        &["NoSuchBucket"],
    );
    expect_sdk_error(
        s3.put_object()
            .bucket(&missing)
            .key("k")
            .body(ByteStream::from_static(b"x"))
            .send()
            .await,
        404,
        &["NoSuchBucket"],
    );
    expect_sdk_error(
        s3.get_object().bucket(&bucket).key("nokey").send().await,
        404,
        &["NoSuchKey"],
    );
    let err = s3
        .head_object()
        .bucket(&bucket)
        .key("nokey")
        .send()
        .await
        .unwrap_err();
    assert_eq!(sdk_error(&err).0, 404);
    assert!(err.as_service_error().is_some_and(|e| e.is_not_found()));
}
