//! The fs backend against its own files: listings in key order, odd keys, temp files.

use std::time::Duration;

use super::meta::{StoredMeta, META_XATTR};
use super::*;

fn body(data: &'static [u8]) -> ByteStream {
    Box::pin(futures::stream::iter(vec![Ok(Bytes::from_static(data))]))
}

async fn read(b: &FsBackend, bucket: &str, key: &str) -> Vec<u8> {
    let (obj, _) = b.get_object(bucket, key, &|_| Ok(None)).await.unwrap();
    let mut out = Vec::new();
    let mut s = obj.body;
    while let Some(c) = s.next().await {
        out.extend_from_slice(&c.unwrap());
    }
    out
}

async fn keys(b: &FsBackend, bucket: &str, prefix: &str) -> Vec<String> {
    let q = ListQuery {
        prefix: prefix.into(),
        max_keys: 1000,
        ..ListQuery::default()
    };
    let page = b.list_objects(bucket, &q).await.unwrap();
    page.objects.into_iter().map(|o| o.key).collect()
}

/// What a listing must answer, from the keys alone (S3's rules).
fn model(keys: &[String], q: &ListQuery) -> (Vec<String>, Vec<String>, bool) {
    let (mut objects, mut prefixes, mut n) = (Vec::new(), Vec::<String>::new(), 0);
    let delim = q.delimiter.as_deref().filter(|d| !d.is_empty());
    let after = q.after.as_deref();
    let rolled_after =
        after.filter(|a| a.len() > q.prefix.len() && delim.is_some_and(|d| a.ends_with(d)));
    for k in keys {
        if !k.starts_with(&q.prefix) || after.is_some_and(|a| k.as_str() <= a) {
            continue;
        }
        if rolled_after.is_some_and(|cp| k.starts_with(cp)) {
            continue;
        }
        let cp = delim.and_then(|d| {
            k[q.prefix.len()..]
                .find(d)
                .map(|i| k[..q.prefix.len() + i + d.len()].to_owned())
        });
        if let Some(cp) = &cp {
            if prefixes.last() == Some(cp) {
                continue;
            }
        }
        if n == q.max_keys {
            return (objects, prefixes, true);
        }
        n += 1;
        match cp {
            Some(cp) => prefixes.push(cp),
            None => objects.push(k.clone()),
        }
    }
    (objects, prefixes, false)
}

#[tokio::test]
async fn listings_page_in_key_order_across_folders_and_escaped_keys() {
    let dir = tempfile::tempdir().unwrap();
    let b = FsBackend::open(&dir.path().join("origin")).unwrap();
    b.create_bucket("bkt").await.unwrap();
    let mut keys: Vec<String> = [
        "a", "a-b", "a/b", "a/b/c", "a/b-c", "a/c", "a0", "a.", "b/x", "b/y/z", "b/y-", "c",
        "c//d", "c/", "dir/", "d/e/f/g", "d/e/f/h", "e\u{e9}", "f/../g", "z",
    ]
    .iter()
    .map(|k| k.to_string())
    .collect();
    keys.extend((0..40).map(|i| format!("big/{i:03}")));
    for k in &keys {
        b.put_object("bkt", k, body(b"x"), PutOptions::default())
            .await
            .unwrap();
    }
    keys.sort();
    for prefix in ["", "a", "a/", "b/y", "big/0", "c", "d/e/", "nothing"] {
        for delimiter in [None, Some("/"), Some("-")] {
            for max_keys in [1, 3, 1000] {
                let mut q = ListQuery {
                    prefix: prefix.into(),
                    delimiter: delimiter.map(str::to_owned),
                    after: None,
                    max_keys,
                };
                // Page through, each page checked against the model from its start.
                for _ in 0..200 {
                    let want = model(&keys, &q);
                    let page = b.list_objects("bkt", &q).await.unwrap();
                    let got: Vec<String> = page.objects.iter().map(|o| o.key.clone()).collect();
                    assert_eq!(
                        (got, page.common_prefixes.clone(), page.is_truncated),
                        want,
                        "{q:?}"
                    );
                    if !page.is_truncated {
                        break;
                    }
                    q.after = page.last.clone();
                }
            }
        }
    }
    // Written since a folder's listing was kept: the next page sees it.
    let q = ListQuery {
        prefix: "big/".into(),
        max_keys: 1000,
        ..ListQuery::default()
    };
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(b.list_objects("bkt", &q).await.unwrap().objects.len(), 40);
    assert!(
        b.inner
            .listings
            .folders
            .contains_key(&b.inner.root.join("bkt").join("big")),
        "a settled folder's listing is kept"
    );
    b.put_object("bkt", "big/040", body(b"x"), PutOptions::default())
        .await
        .unwrap();
    b.delete_object("bkt", "big/000").await.unwrap();
    let page = b.list_objects("bkt", &q).await.unwrap();
    assert_eq!(page.objects.len(), 40);
    assert_eq!(page.objects.first().unwrap().key, "big/001");
    assert_eq!(page.objects.last().unwrap().key, "big/040");
}

#[tokio::test]
async fn conflicting_and_odd_keys_round_trip_inside_the_root() {
    let dir = tempfile::tempdir().unwrap();
    let b = FsBackend::open(&dir.path().join("origin")).unwrap();
    b.create_bucket("bkt").await.unwrap();
    let cases: &[(&str, &[u8])] = &[
        ("a", b"file a"),
        ("a/b", b"file a/b"),
        ("x/y/z", b"deep"),
        ("x", b"x beside x/"),
        ("../../escape", b"climb"),
        ("dir/", b"trailing"),
        ("a//b", b"double"),
        (".granary-keys/61.k", b"reserved"),
    ];
    for (k, v) in cases {
        b.put_object("bkt", k, body(v), PutOptions::default())
            .await
            .unwrap();
    }
    for (k, v) in cases {
        assert_eq!(read(&b, "bkt", k).await, *v, "{k}");
    }
    let mut want: Vec<String> = cases.iter().map(|(k, _)| k.to_string()).collect();
    want.sort();
    assert_eq!(keys(&b, "bkt", "").await, want);
    assert_eq!(keys(&b, "bkt", "a/").await, vec!["a//b", "a/b"]);
    assert_eq!(keys(&b, "bkt", "..").await, vec!["../../escape"]);
    // Ordinary keys are ordinary files.
    assert_eq!(fs::read(b.root().join("bkt/x/y/z")).unwrap(), b"deep");
    // Nothing was written outside the root.
    assert_eq!(
        fs::read_dir(dir.path()).unwrap().count(),
        1,
        "only origin/ under the temp dir"
    );
    // Deleting a/b frees the folder: a rewrite of `a` goes back to the plain file.
    b.delete_object("bkt", "a/b").await.unwrap();
    b.put_object("bkt", "a", body(b"again"), PutOptions::default())
        .await
        .unwrap();
    assert!(b.root().join("bkt/a").is_file());
    assert_eq!(read(&b, "bkt", "a").await, b"again");
    assert!(keys(&b, "bkt", "a").await.contains(&"a".to_string()));
}

/// A starting node removes a crashed write's temp file, not the one of a write in
/// progress on another member sharing the directory.
#[test]
fn only_old_temp_files_are_cleared_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join(".granary").join("tmp");
    fs::create_dir_all(&tmp).unwrap();
    let old = tmp.join("tmp-old");
    let new = tmp.join("tmp-new");
    fs::write(&old, b"crashed").unwrap();
    fs::write(&new, b"in progress").unwrap();
    let long_ago = std::time::SystemTime::now() - STALE_TEMP - Duration::from_secs(60);
    File::options()
        .write(true)
        .open(&old)
        .unwrap()
        .set_modified(long_ago)
        .unwrap();
    FsBackend::open(dir.path()).unwrap();
    assert!(!old.exists(), "the crashed write's temp file is gone");
    assert_eq!(fs::read(&new).unwrap(), b"in progress");
}

#[tokio::test]
async fn an_object_whose_parts_are_not_known_is_one_part() {
    let dir = tempfile::tempdir().unwrap();
    let b = FsBackend::open(dir.path()).unwrap();
    b.create_bucket("bkt").await.unwrap();
    b.put_object("bkt", "k", body(b"0123456789"), PutOptions::default())
        .await
        .unwrap();
    // Metadata naming a multipart ETag without the parts' sizes (as written before
    // they were kept).
    use xattr::FileExt;
    let file = File::open(b.root().join("bkt/k")).unwrap();
    let mut stored: StoredMeta =
        serde_json::from_slice(&file.get_xattr(META_XATTR).unwrap().unwrap()).unwrap();
    stored.etag = "\"0123456789abcdef0123456789abcdef-3\"".into();
    stored.parts.clear();
    file.set_xattr(META_XATTR, &serde_json::to_vec(&stored).unwrap())
        .unwrap();
    assert_eq!(b.parts_of("bkt", "k").await.unwrap(), None);
    let first = b.part_of("bkt", "k", 1).await.unwrap();
    assert_eq!(
        (first.etag.as_str(), first.count),
        (stored.etag.as_str(), 1)
    );
    assert_eq!(
        first.part,
        Some(crate::backend::PartRange {
            start: 0,
            len: 10,
            checksum: None
        }),
        "part 1 is every byte"
    );
    assert_eq!(b.part_of("bkt", "k", 2).await.unwrap().part, None);
}

#[tokio::test]
async fn failed_writes_leave_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let b = FsBackend::open(dir.path()).unwrap();
    b.create_bucket("bkt").await.unwrap();
    let bad: ByteStream = Box::pin(futures::stream::iter(vec![
        Ok(Bytes::from_static(b"partial")),
        Err(io::Error::other("client went away")),
    ]));
    assert!(b
        .put_object("bkt", "k", bad, PutOptions::default())
        .await
        .is_err());
    let opts = PutOptions {
        expected_md5: Some([0; 16]),
        ..PutOptions::default()
    };
    let e = b
        .put_object("bkt", "k", body(b"data"), opts)
        .await
        .unwrap_err();
    assert!(matches!(e, BackendError::BadDigest(_)));
    assert!(matches!(
        b.head_object("bkt", "k").await,
        Err(BackendError::NoSuchKey(_))
    ));
    assert_eq!(
        fs::read_dir(b.root().join(".granary/tmp")).unwrap().count(),
        0
    );
}

#[tokio::test]
async fn etag_is_md5_and_foreign_files_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let b = FsBackend::open(dir.path()).unwrap();
    b.create_bucket("bkt").await.unwrap();
    let m = b
        .put_object("bkt", "k", body(b"hello\n"), PutOptions::default())
        .await
        .unwrap();
    assert_eq!(m.etag, "b1946ac92492d2347c6235b4d2611184");
    assert_eq!(b.head_object("bkt", "k").await.unwrap().etag, m.etag);
    fs::write(b.root().join("bkt/dropped.bin"), b"by hand").unwrap();
    let meta = b.head_object("bkt", "dropped.bin").await.unwrap();
    assert_eq!(meta.size, 7);
    assert_eq!(meta.etag.len(), 32);
    assert_eq!(read(&b, "bkt", "dropped.bin").await, b"by hand");
}

/// A folder whose name breaks S3's rules is no bucket: ListBuckets leaves it out, and a
/// request for it is `InvalidBucketName` naming the rule, where one for a folder that is
/// not there at all is `NoSuchBucket`; nothing outside the root is ever looked at.
#[tokio::test]
async fn folders_that_break_the_rules_are_named_not_missing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("origin");
    for folder in ["ds", "Data_Set", "fine"] {
        fs::create_dir_all(root.join(folder)).unwrap();
        fs::write(root.join(folder).join("k"), b"v").unwrap();
    }
    let b = FsBackend::open(&root).unwrap();
    let names: Vec<String> = b
        .list_buckets()
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.name)
        .collect();
    assert_eq!(names, ["fine"]);
    assert_eq!(read(&b, "fine", "k").await, b"v");
    for (bucket, rule) in [
        ("ds", "3 to 63 characters"),
        ("Data_Set", "only lowercase letters"),
    ] {
        let err = b.head_bucket(bucket).await.unwrap_err();
        match &err {
            BackendError::InvalidBucketName { bucket: b, rule: r } => {
                assert_eq!(b, bucket);
                assert!(r.contains(rule), "{bucket}: {r}");
            }
            other => panic!("{bucket}: {other:?}"),
        }
        let got = b.get_object(bucket, "k", &|_| Ok(None)).await.err();
        assert!(
            matches!(got, Some(BackendError::InvalidBucketName { .. })),
            "{bucket}: {got:?}"
        );
    }
    for missing in ["no", "..", ".", ".granary", "Missing_Folder"] {
        let err = b.head_bucket(missing).await.unwrap_err();
        assert!(
            matches!(err, BackendError::NoSuchBucket(_)),
            "{missing}: {err:?}"
        );
    }
}
