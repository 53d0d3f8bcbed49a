//! Multipart uploads: completion, ETags, aborts, refused completions, re-uploaded parts.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multipart_upload_complete() {
    let (_server, s3, bucket) = setup("mpu").await;
    let key = "big/shard-0001.tar";
    let parts = [
        random_bytes(5 * MIB),
        random_bytes(5 * MIB),
        random_bytes(MIB),
    ];

    let create = s3
        .create_multipart_upload()
        .bucket(&bucket)
        .key(key)
        .content_type("application/x-tar")
        .send()
        .await
        .expect("CreateMultipartUpload");
    let upload_id = create.upload_id().expect("UploadId").to_string();
    assert_eq!(create.key(), Some(key));
    assert_eq!(create.bucket(), Some(bucket.as_str()));

    let mut completed = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        let n = i as i32 + 1;
        let out = s3
            .upload_part()
            .bucket(&bucket)
            .key(key)
            .upload_id(&upload_id)
            .part_number(n)
            .body(ByteStream::from(part.clone()))
            .send()
            .await
            .expect("UploadPart");
        let etag = out.e_tag().expect("part ETag").to_string();
        assert_eq!(etag, etag_of(part), "part {n} ETag");
        completed.push(CompletedPart::builder().part_number(n).e_tag(etag).build());
    }

    let listed = s3
        .list_parts()
        .bucket(&bucket)
        .key(key)
        .upload_id(&upload_id)
        .send()
        .await
        .expect("ListParts");
    let got: Vec<(i32, i64, String)> = listed
        .parts()
        .iter()
        .map(|p| {
            (
                p.part_number().unwrap_or(0),
                p.size().unwrap_or(0),
                p.e_tag().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let want: Vec<(i32, i64, String)> = parts
        .iter()
        .enumerate()
        .map(|(i, p)| (i as i32 + 1, p.len() as i64, etag_of(p)))
        .collect();
    assert_eq!(got, want, "ListParts");

    // Not visible before completion.
    expect_sdk_error(
        s3.get_object().bucket(&bucket).key(key).send().await,
        404,
        &["NoSuchKey"],
    );

    let done = s3
        .complete_multipart_upload()
        .bucket(&bucket)
        .key(key)
        .upload_id(&upload_id)
        .multipart_upload(
            CompletedMultipartUpload::builder()
                .set_parts(Some(completed))
                .build(),
        )
        .send()
        .await
        .expect("CompleteMultipartUpload");
    let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
    let want_etag = multipart_etag(&refs);
    assert_eq!(done.e_tag(), Some(want_etag.as_str()));

    let whole: Vec<u8> = parts.concat();
    let out = s3
        .get_object()
        .bucket(&bucket)
        .key(key)
        .send()
        .await
        .expect("GetObject of the completed upload");
    assert_eq!(out.e_tag(), Some(want_etag.as_str()));
    assert_eq!(out.content_length(), Some(whole.len() as i64));
    assert_eq!(out.content_type(), Some("application/x-tar"));
    let body = out.body.collect().await.unwrap().to_vec();
    assert_eq!(md5_hex(&body), md5_hex(&whole), "completed object bytes");

    // A range across the part 1/2 boundary.
    let lo = 5 * MIB - 10;
    let out = s3
        .get_object()
        .bucket(&bucket)
        .key(key)
        .range(format!("bytes={lo}-{}", lo + 19))
        .send()
        .await
        .expect("range over a part boundary");
    assert_eq!(
        out.body.collect().await.unwrap().to_vec(),
        whole[lo..lo + 20]
    );

    let listed = list_all(&s3, &bucket, None).await;
    assert_eq!(
        listed,
        [(key.to_string(), whole.len() as i64, want_etag.clone())]
    );

    // The upload is gone once completed.
    expect_sdk_error(
        s3.list_parts()
            .bucket(&bucket)
            .key(key)
            .upload_id(&upload_id)
            .send()
            .await,
        404,
        &["NoSuchUpload"],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multipart_abort_and_bad_completions() {
    let (_server, s3, bucket) = setup("mpu-bad").await;

    // Abort: the upload is gone for every later call, and no object appears.
    let id = start_upload(&s3, &bucket, "aborted").await;
    upload_part(&s3, &bucket, "aborted", &id, 1, &random_bytes(1000)).await;
    s3.abort_multipart_upload()
        .bucket(&bucket)
        .key("aborted")
        .upload_id(&id)
        .send()
        .await
        .expect("AbortMultipartUpload");
    expect_sdk_error(
        s3.list_parts()
            .bucket(&bucket)
            .key("aborted")
            .upload_id(&id)
            .send()
            .await,
        404,
        &["NoSuchUpload"],
    );
    expect_sdk_error(
        s3.upload_part()
            .bucket(&bucket)
            .key("aborted")
            .upload_id(&id)
            .part_number(2)
            .body(ByteStream::from_static(b"late"))
            .send()
            .await,
        404,
        &["NoSuchUpload"],
    );
    let late = CompletedPart::builder()
        .part_number(1)
        .e_tag(etag_of(b"x"))
        .build();
    expect_sdk_error(
        complete(&s3, &bucket, "aborted", &id, vec![late]).await,
        404,
        &["NoSuchUpload"],
    );
    expect_sdk_error(
        s3.get_object().bucket(&bucket).key("aborted").send().await,
        404,
        &["NoSuchKey"],
    );
    expect_sdk_error(
        s3.upload_part()
            .bucket(&bucket)
            .key("k")
            .upload_id("no-such-upload-id")
            .part_number(1)
            .body(ByteStream::from_static(b"x"))
            .send()
            .await,
        404,
        &["NoSuchUpload"],
    );

    // Wrong ETag, unknown part, wrong order: each refused, the upload survives them.
    let key = "assembled";
    let id = start_upload(&s3, &bucket, key).await;
    let p1 = random_bytes(5 * MIB);
    let p2 = random_bytes(MIB);
    let c1 = upload_part(&s3, &bucket, key, &id, 1, &p1).await;
    let c2 = upload_part(&s3, &bucket, key, &id, 2, &p2).await;
    let wrong_etag = CompletedPart::builder()
        .part_number(2)
        .e_tag("\"ffffffffffffffffffffffffffffffff\"")
        .build();
    expect_sdk_error(
        complete(&s3, &bucket, key, &id, vec![c1.clone(), wrong_etag]).await,
        400,
        &["InvalidPart"],
    );
    let never_uploaded = CompletedPart::builder()
        .part_number(3)
        .e_tag(etag_of(&p2))
        .build();
    expect_sdk_error(
        complete(
            &s3,
            &bucket,
            key,
            &id,
            vec![c1.clone(), c2.clone(), never_uploaded],
        )
        .await,
        400,
        &["InvalidPart"],
    );
    expect_sdk_error(
        complete(&s3, &bucket, key, &id, vec![c2.clone(), c1.clone()]).await,
        400,
        &["InvalidPartOrder"],
    );
    expect_sdk_error(
        s3.get_object().bucket(&bucket).key(key).send().await,
        404,
        &["NoSuchKey"],
    );
    let done = complete(&s3, &bucket, key, &id, vec![c1, c2])
        .await
        .expect("complete after refused attempts");
    assert_eq!(done.e_tag(), Some(multipart_etag(&[&p1, &p2]).as_str()));
    assert_eq!(get(&s3, &bucket, key).await, [p1, p2].concat());

    // A part other than the last under 5 MiB.
    let key = "small-parts";
    let id = start_upload(&s3, &bucket, key).await;
    let c1 = upload_part(&s3, &bucket, key, &id, 1, &random_bytes(MIB)).await;
    let c2 = upload_part(&s3, &bucket, key, &id, 2, &random_bytes(MIB)).await;
    expect_sdk_error(
        complete(&s3, &bucket, key, &id, vec![c1, c2]).await,
        400,
        &["EntityTooSmall"],
    );
    expect_sdk_error(
        s3.get_object().bucket(&bucket).key(key).send().await,
        404,
        &["NoSuchKey"],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multipart_part_reupload_replaces_it() {
    let (_server, s3, bucket) = setup("mpu-re").await;
    let key = "k";
    let id = start_upload(&s3, &bucket, key).await;
    upload_part(&s3, &bucket, key, &id, 1, &random_bytes(5 * MIB)).await;
    let p1 = random_bytes(5 * MIB);
    let c1 = upload_part(&s3, &bucket, key, &id, 1, &p1).await;
    let p2 = random_bytes(10);
    let c2 = upload_part(&s3, &bucket, key, &id, 2, &p2).await;
    let listed = s3
        .list_parts()
        .bucket(&bucket)
        .key(key)
        .upload_id(&id)
        .send()
        .await
        .expect("ListParts");
    let etags: Vec<&str> = listed.parts().iter().filter_map(|p| p.e_tag()).collect();
    assert_eq!(etags, [etag_of(&p1), etag_of(&p2)]);
    complete(&s3, &bucket, key, &id, vec![c1, c2])
        .await
        .expect("complete");
    let body = get(&s3, &bucket, key).await;
    assert!(body == [p1, p2].concat(), "re-uploaded part 1 must win");
}
