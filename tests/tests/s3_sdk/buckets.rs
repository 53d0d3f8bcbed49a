//! Bucket lifecycle and bucket-name rules.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bucket_create_list_head_delete() {
    let (server, s3, bucket) = setup("life").await;

    let listed = s3.list_buckets().send().await.expect("ListBuckets");
    let names: Vec<&str> = listed.buckets().iter().filter_map(|b| b.name()).collect();
    assert!(
        names.contains(&bucket.as_str()),
        "{bucket} not in {names:?}"
    );

    s3.head_bucket()
        .bucket(&bucket)
        .send()
        .await
        .expect("HeadBucket of an existing bucket");
    let missing = bucket_name("missing");
    let err = s3.head_bucket().bucket(&missing).send().await.unwrap_err();
    assert_eq!(sdk_error(&err).0, 404);
    assert!(
        err.as_service_error().is_some_and(|e| e.is_not_found()),
        "HeadBucket of a missing bucket: {err:?}"
    );

    // Creating a bucket you own already succeeds, as S3 answers in us-east-1.
    s3.create_bucket()
        .bucket(&bucket)
        .send()
        .await
        .expect("CreateBucket of a bucket of one's own");

    put(&s3, &bucket, "dir/obj", b"payload").await;
    expect_sdk_error(
        s3.delete_bucket().bucket(&bucket).send().await,
        409,
        &["BucketNotEmpty"],
    );
    // The refused delete must not have touched the contents.
    assert_eq!(get(&s3, &bucket, "dir/obj").await, b"payload");

    s3.delete_object()
        .bucket(&bucket)
        .key("dir/obj")
        .send()
        .await
        .expect("DeleteObject");
    s3.delete_bucket()
        .bucket(&bucket)
        .send()
        .await
        .expect("DeleteBucket of an empty bucket");
    expect_sdk_error(s3.head_bucket().bucket(&bucket).send().await, 404, &[]);
    let listed = s3.list_buckets().send().await.expect("ListBuckets");
    assert!(!listed.buckets().iter().any(|b| b.name() == Some(&bucket)));
    expect_sdk_error(
        s3.delete_bucket().bucket(&bucket).send().await,
        404,
        &["NoSuchBucket"],
    );

    // The name is free again.
    s3.create_bucket()
        .bucket(&bucket)
        .send()
        .await
        .expect("re-create a deleted bucket");
    assert!(list_all(&s3, &bucket, None).await.is_empty());
    server.assert_healthy("bucket lifecycle").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_bucket_names_are_refused() {
    let server = Server::start(ServerOpts::with_credentials()).expect("start granary");
    let s3 = server.s3_client();
    let too_long = "a".repeat(64);
    for name in [
        "A_B",
        "ab",
        "Upper",
        "-leading-hyphen",
        "trailing-hyphen-",
        "two..dots",
        "192.168.5.4",
        too_long.as_str(),
    ] {
        let result = s3.create_bucket().bucket(name).send().await;
        let err = result.expect_err(&format!("bucket name {name:?} was accepted"));
        let (status, code) = sdk_error(&err);
        assert_eq!(
            (status, code.as_deref()),
            (400, Some("InvalidBucketName")),
            "CreateBucket {name:?}"
        );
    }
    // A valid 63-character name with dots and hyphens is fine.
    let longest = format!("a1.b-{}", "c".repeat(58));
    assert_eq!(longest.len(), 63);
    s3.create_bucket()
        .bucket(&longest)
        .send()
        .await
        .expect("63-character bucket name");
    let listed = s3.list_buckets().send().await.expect("ListBuckets");
    let names: Vec<&str> = listed.buckets().iter().filter_map(|b| b.name()).collect();
    assert_eq!(names, vec![longest.as_str()]);
}
