//! Keys that must survive as they are, and ListObjectsV2: prefixes, delimiters, paging.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awkward_keys_round_trip() {
    let (server, s3, bucket) = setup("keys").await;
    let long_key = format!("long/{}", "k".repeat(1019));
    assert_eq!(long_key.len(), 1024);
    let keys: Vec<String> = [
        "a",
        "a/b",
        "a/b/c",
        "with space",
        "dir with space/file name.txt",
        "données/été ☃.txt",
        "100%",
        "%41%2F",
        "a+b",
        "plus+and space",
        "a//b",
        "//leading",
        "./x",
        "x/../y",
        "x/./y",
        "dir/",
        "dir/inner",
        "semi;colon,comma=eq&amp?q#h",
        "tilde~star*quote'paren()",
        long_key.as_str(),
    ]
    .into_iter()
    .map(str::to_string)
    .collect();

    let mut expected = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let mut data = format!("object {i} named {key:?}\n").into_bytes();
        data.extend(random_bytes(100 + i));
        let etag = put(&s3, &bucket, key, &data).await;
        assert_eq!(etag, etag_of(&data), "ETag of {key:?}");
        expected.push((key.clone(), data));
    }
    for (key, data) in &expected {
        assert!(
            get(&s3, &bucket, key).await == *data,
            "bytes of {key:?} differ"
        );
    }

    let listed = list_all(&s3, &bucket, None).await;
    let mut want: Vec<(String, i64, String)> = expected
        .iter()
        .map(|(k, d)| (k.clone(), d.len() as i64, etag_of(d)))
        .collect();
    want.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let listed_keys: Vec<&str> = listed.iter().map(|x| x.0.as_str()).collect();
    let want_keys: Vec<&str> = want.iter().map(|x| x.0.as_str()).collect();
    assert_eq!(listed_keys, want_keys, "ListObjectsV2 keys");
    assert_eq!(listed, want, "ListObjectsV2 sizes and ETags");

    // Prefixes of keys that are not keys themselves (directories to an fs backend).
    for not_a_key in ["dir", "long", "données", "x", "x/..", "a/b/", "a/"] {
        expect_sdk_error(
            s3.get_object().bucket(&bucket).key(not_a_key).send().await,
            404,
            &["NoSuchKey"],
        );
    }

    // `a` beside `a/`: a key and a common prefix of the same name.
    let out = s3
        .list_objects_v2()
        .bucket(&bucket)
        .delimiter("/")
        .prefix("a")
        .send()
        .await
        .expect("ListObjectsV2 prefix a, delimiter /");
    let keys: Vec<&str> = out.contents().iter().filter_map(|o| o.key()).collect();
    let prefixes: Vec<&str> = out
        .common_prefixes()
        .iter()
        .filter_map(|p| p.prefix())
        .collect();
    assert_eq!(keys, ["a", "a+b"]);
    assert_eq!(prefixes, ["a/"]);
    // `dir/` is both the prefix asked for and a key under it.
    let out = s3
        .list_objects_v2()
        .bucket(&bucket)
        .delimiter("/")
        .prefix("dir/")
        .send()
        .await
        .expect("ListObjectsV2 prefix dir/");
    let keys: Vec<&str> = out.contents().iter().filter_map(|o| o.key()).collect();
    assert_eq!(keys, ["dir/", "dir/inner"]);
    assert!(out.common_prefixes().is_empty());

    // `a` and `a/b` coexist; deleting one leaves the other.
    s3.delete_object()
        .bucket(&bucket)
        .key("a")
        .send()
        .await
        .expect("delete a");
    assert_eq!(get(&s3, &bucket, "a/b").await, expected[1].1);
    expect_sdk_error(
        s3.get_object().bucket(&bucket).key("a").send().await,
        404,
        &["NoSuchKey"],
    );

    let too_long = format!("long/{}", "k".repeat(1020));
    assert_eq!(too_long.len(), 1025);
    expect_sdk_error(
        s3.put_object()
            .bucket(&bucket)
            .key(&too_long)
            .body(ByteStream::from_static(b"x"))
            .send()
            .await,
        400,
        &["KeyTooLongError"],
    );
    server.assert_healthy("awkward keys").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_objects_v2_prefix_delimiter_paging() {
    let (_server, s3, bucket) = setup("list").await;
    let mut page_keys: Vec<String> = (0..240).map(|i| format!("page/k{i:04}")).collect();
    page_keys.extend(
        [
            "page/K",
            "page/a",
            "page/é",
            "page/k0005/sub",
            "page/k0005-",
        ]
        .into_iter()
        .map(str::to_string),
    );
    let others = [
        "top1",
        "dir1/a",
        "dir1/b",
        "dir2/c",
        "dir2/sub/d",
        "other/x",
    ];
    let all: Vec<String> = page_keys
        .iter()
        .cloned()
        .chain(others.iter().map(|s| s.to_string()))
        .collect();
    let mut tasks = tokio::task::JoinSet::new();
    for chunk in all.chunks(all.len().div_ceil(8)) {
        let s3 = s3.clone();
        let bucket = bucket.clone();
        let chunk = chunk.to_vec();
        tasks.spawn(async move {
            for key in chunk {
                put(&s3, &bucket, &key, key.as_bytes()).await;
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("put task");
    }
    page_keys.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));

    // Paging through `page/` 37 at a time sees every key once, in byte order.
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    let mut pages = 0;
    loop {
        let out = s3
            .list_objects_v2()
            .bucket(&bucket)
            .prefix("page/")
            .max_keys(37)
            .set_continuation_token(token.clone())
            .send()
            .await
            .expect("ListObjectsV2 page");
        pages += 1;
        let n = out.contents().len();
        assert_eq!(out.key_count(), Some(n as i32), "KeyCount of page {pages}");
        assert_eq!(out.max_keys(), Some(37));
        assert_eq!(out.prefix(), Some("page/"));
        assert!(n <= 37);
        seen.extend(
            out.contents()
                .iter()
                .map(|o| o.key().unwrap_or_default().to_string()),
        );
        if out.is_truncated() == Some(true) {
            assert_eq!(n, 37, "a truncated page is full");
            token = Some(
                out.next_continuation_token()
                    .expect("NextContinuationToken on a truncated page")
                    .to_string(),
            );
        } else {
            assert_eq!(out.is_truncated(), Some(false));
            assert!(out.next_continuation_token().is_none());
            break;
        }
        assert!(pages < 100, "paging does not end");
    }
    assert_eq!(seen, page_keys);
    assert_eq!(pages, page_keys.len().div_ceil(37));

    // StartAfter.
    let out = s3
        .list_objects_v2()
        .bucket(&bucket)
        .prefix("page/")
        .start_after("page/k0100")
        .max_keys(3)
        .send()
        .await
        .expect("ListObjectsV2 start-after");
    let keys: Vec<&str> = out.contents().iter().filter_map(|o| o.key()).collect();
    assert_eq!(keys, ["page/k0101", "page/k0102", "page/k0103"]);
    assert_eq!(out.is_truncated(), Some(true));
    assert_eq!(out.key_count(), Some(3));

    // Delimiter at the root: files and common prefixes.
    let out = s3
        .list_objects_v2()
        .bucket(&bucket)
        .delimiter("/")
        .send()
        .await
        .expect("ListObjectsV2 delimiter");
    let keys: Vec<&str> = out.contents().iter().filter_map(|o| o.key()).collect();
    let prefixes: Vec<&str> = out
        .common_prefixes()
        .iter()
        .filter_map(|p| p.prefix())
        .collect();
    assert_eq!(keys, ["top1"]);
    assert_eq!(prefixes, ["dir1/", "dir2/", "other/", "page/"]);
    assert_eq!(out.key_count(), Some(5));
    assert_eq!(out.is_truncated(), Some(false));

    // Prefix and delimiter together.
    let out = s3
        .list_objects_v2()
        .bucket(&bucket)
        .prefix("dir2/")
        .delimiter("/")
        .send()
        .await
        .expect("ListObjectsV2 prefix+delimiter");
    let keys: Vec<&str> = out.contents().iter().filter_map(|o| o.key()).collect();
    let prefixes: Vec<&str> = out
        .common_prefixes()
        .iter()
        .filter_map(|p| p.prefix())
        .collect();
    assert_eq!(keys, ["dir2/c"]);
    assert_eq!(prefixes, ["dir2/sub/"]);
    assert_eq!(out.key_count(), Some(2));

    // Common prefixes count against max-keys and page like keys.
    let mut entries = Vec::new();
    let mut token: Option<String> = None;
    for _ in 0..10 {
        let out = s3
            .list_objects_v2()
            .bucket(&bucket)
            .delimiter("/")
            .max_keys(2)
            .set_continuation_token(token.clone())
            .send()
            .await
            .expect("ListObjectsV2 delimiter paging");
        let n = out.contents().len() + out.common_prefixes().len();
        assert!(n <= 2, "page of {n} entries with max-keys 2");
        assert_eq!(out.key_count(), Some(n as i32));
        entries.extend(
            out.contents()
                .iter()
                .filter_map(|o| o.key())
                .map(String::from),
        );
        entries.extend(
            out.common_prefixes()
                .iter()
                .filter_map(|p| p.prefix())
                .map(String::from),
        );
        token = out.next_continuation_token().map(String::from);
        if out.is_truncated() != Some(true) {
            break;
        }
    }
    entries.sort();
    assert_eq!(entries, ["dir1/", "dir2/", "other/", "page/", "top1"]);

    // Nothing under a prefix.
    let out = s3
        .list_objects_v2()
        .bucket(&bucket)
        .prefix("nothing/")
        .send()
        .await
        .expect("ListObjectsV2 empty");
    assert!(out.contents().is_empty());
    assert_eq!(out.key_count(), Some(0));
    assert_eq!(out.is_truncated(), Some(false));

    expect_sdk_error(
        s3.list_objects_v2()
            .bucket(bucket_name("missing"))
            .send()
            .await,
        404,
        &["NoSuchBucket"],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pages_cap_at_1000_keys() {
    let (_server, s3, bucket) = setup("thousand").await;
    let keys: Vec<String> = (0..1005).map(|i| format!("k{i:05}")).collect();
    let mut tasks = tokio::task::JoinSet::new();
    for chunk in keys.chunks(keys.len().div_ceil(8)) {
        let s3 = s3.clone();
        let bucket = bucket.clone();
        let chunk = chunk.to_vec();
        tasks.spawn(async move {
            for key in chunk {
                put(&s3, &bucket, &key, b"").await;
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("put task");
    }
    for max_keys in [None, Some(5000)] {
        let out = s3
            .list_objects_v2()
            .bucket(&bucket)
            .set_max_keys(max_keys)
            .send()
            .await
            .expect("ListObjectsV2");
        assert_eq!(out.contents().len(), 1000, "max-keys {max_keys:?}");
        assert_eq!(out.key_count(), Some(1000));
        assert_eq!(out.is_truncated(), Some(true));
        let next = s3
            .list_objects_v2()
            .bucket(&bucket)
            .continuation_token(out.next_continuation_token().expect("token"))
            .send()
            .await
            .expect("second page");
        let rest: Vec<&str> = next.contents().iter().filter_map(|o| o.key()).collect();
        assert_eq!(rest, ["k01000", "k01001", "k01002", "k01003", "k01004"]);
        assert_eq!(next.is_truncated(), Some(false));
    }
    assert_eq!(list_all(&s3, &bucket, None).await.len(), 1005);
}
