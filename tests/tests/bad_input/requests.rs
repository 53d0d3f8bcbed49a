//! Broken requests: ranges, XML bodies, query arguments, oversized headers, unknown buckets, routes and methods.

use super::*;

#[tokio::test]
async fn malformed_and_unsatisfiable_ranges() {
    let sb = Sandbox::start(ServerOpts::open());
    sb.create_bucket("bkt").await;
    let resp = sb.raw("PUT", "/bkt/ten", &[], b"0123456789").await;
    assert_eq!(resp.status, 200);

    // Syntactically invalid: ignored, the whole object with 200.
    for range in [
        "bytes=abc",
        "bytes=5-2",
        "items=0-1",
        "bytes=",
        "bytes=--1",
        "bytes=1-2-3",
    ] {
        let resp = sb.raw("GET", "/bkt/ten", &[("Range", range)], b"").await;
        assert_eq!(resp.status, 200, "Range: {range}: {}", resp.text());
        assert_eq!(resp.body, b"0123456789", "Range: {range}");
        assert!(resp.header("content-range").is_none(), "Range: {range}");
        sb.server.assert_healthy(range).await;
    }

    // Unsatisfiable: 416 InvalidRange.
    for range in ["bytes=100-", "bytes=-0", "bytes=10-20", "bytes=10-"] {
        let resp = sb.raw("GET", "/bkt/ten", &[("Range", range)], b"").await;
        resp.assert_s3_error(416, &["InvalidRange"]);
        sb.server.assert_healthy(range).await;
    }

    // A huge but valid range is clipped.
    let resp = sb
        .raw(
            "GET",
            "/bkt/ten",
            &[("Range", "bytes=8-99999999999999999")],
            b"",
        )
        .await;
    assert!(
        matches!(resp.status, 206 | 200 | 416),
        "huge range end: {} {}",
        resp.status,
        resp.text()
    );
    if resp.status == 206 {
        assert_eq!(resp.body, b"89");
        assert_eq!(resp.header("content-range"), Some("bytes 8-9/10"));
    }
    sb.server.assert_healthy("huge range").await;
}

#[tokio::test]
async fn garbage_xml_is_malformed_xml() {
    let sb = Sandbox::start(ServerOpts::open());
    sb.create_bucket("bkt").await;
    assert_eq!(
        sb.raw("PUT", "/bkt/keep", &[], b"keep me").await.status,
        200
    );

    let bodies: [&[u8]; 4] = [
        b"this is not xml at all",
        b"<Delete><Object><Key>keep</Key></Obj",
        b"<Delete><Object><Key>keep</Key></Object>",
        b"\x00\xff\xfe<<<>>>",
    ];
    for body in bodies {
        let md5 = content_md5(body);
        let resp = sb
            .raw("POST", "/bkt?delete", &[("Content-MD5", &md5)], body)
            .await;
        resp.assert_s3_error(400, &["MalformedXML"]);
        sb.server.assert_healthy("DeleteObjects garbage").await;
    }
    // Nothing was deleted by a half-parsed body.
    let resp = sb.raw("GET", "/bkt/keep", &[], b"").await;
    assert_eq!(resp.body, b"keep me");

    let resp = sb.raw("POST", "/bkt/mp?uploads", &[], b"").await;
    assert_eq!(resp.status, 200, "CreateMultipartUpload: {}", resp.text());
    let upload_id = xml_tag(&resp.text(), "UploadId").expect("UploadId");
    let part = random_bytes(1000);
    let resp = sb
        .raw(
            "PUT",
            &format!("/bkt/mp?partNumber=1&uploadId={upload_id}"),
            &[],
            &part,
        )
        .await;
    assert_eq!(resp.status, 200, "UploadPart: {}", resp.text());
    let etag = resp.header("etag").expect("part ETag").to_string();

    let truncated =
        format!("<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>{etag}</ETag></Pa");
    let bodies: [&[u8]; 3] = [
        b"garbage",
        truncated.as_bytes(),
        b"<CompleteMultipartUpload><Part><PartNumber>1",
    ];
    for body in bodies {
        let resp = sb
            .raw("POST", &format!("/bkt/mp?uploadId={upload_id}"), &[], body)
            .await;
        resp.assert_s3_error(400, &["MalformedXML"]);
        sb.server
            .assert_healthy("CompleteMultipartUpload garbage")
            .await;
    }
    // The upload survived the garbage and completes.
    let good = format!(
        "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>{etag}</ETag></Part></CompleteMultipartUpload>"
    );
    let resp = sb
        .raw(
            "POST",
            &format!("/bkt/mp?uploadId={upload_id}"),
            &[],
            good.as_bytes(),
        )
        .await;
    assert_eq!(resp.status, 200, "CompleteMultipartUpload: {}", resp.text());
    let resp = sb.raw("GET", "/bkt/mp", &[], b"").await;
    assert_eq!(resp.body, part);
    sb.assert_nothing_outside();
}

#[tokio::test]
async fn bad_query_arguments() {
    let sb = Sandbox::start(ServerOpts::open());
    sb.create_bucket("bkt").await;
    for query in [
        "list-type=2&max-keys=-1",
        "list-type=2&max-keys=abc",
        "list-type=2&continuation-token=%00garbage%ff",
    ] {
        let resp = sb.raw("GET", &format!("/bkt?{query}"), &[], b"").await;
        assert_eq!(resp.status, 400, "GET /bkt?{query}: {}", resp.text());
        assert_s3_error_body(&resp.body);
        sb.server.assert_healthy(query).await;
    }

    let resp = sb.raw("POST", "/bkt/mp?uploads", &[], b"").await;
    let upload_id = xml_tag(&resp.text(), "UploadId").expect("UploadId");
    for n in ["0", "10001", "-1", "abc"] {
        let path = format!("/bkt/mp?partNumber={n}&uploadId={upload_id}");
        let resp = sb.raw("PUT", &path, &[], b"part").await;
        resp.assert_s3_error(400, &["InvalidArgument"]);
        sb.server.assert_healthy(&path).await;
    }
}

#[tokio::test]
async fn oversized_headers_are_431() {
    let sb = Sandbox::start(ServerOpts::open());

    let big = "a".repeat(64 * 1024);
    let resp = sb
        .raw("GET", "/_granary/health", &[("X-Big", &big)], b"")
        .await;
    assert_eq!(resp.status, 431, "one 64 KiB header: {}", resp.text());
    sb.server.assert_healthy("64 KiB header").await;

    let value = "b".repeat(700);
    let names: Vec<String> = (0..100).map(|i| format!("X-Header-{i}")).collect();
    let many: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), value.as_str())).collect();
    let resp = sb.raw("GET", "/_granary/health", &many, b"").await;
    assert_eq!(
        resp.status,
        431,
        "100 headers of 700 bytes: {}",
        resp.text()
    );
    sb.server.assert_healthy("100 x 700-byte headers").await;

    // The contract's limit is 16 KiB in total.
    let over = "c".repeat(20 * 1024);
    let resp = sb
        .raw("GET", "/_granary/health", &[("X-Over", &over)], b"")
        .await;
    assert_eq!(resp.status, 431, "one 20 KiB header: {}", resp.text());
    sb.server.assert_healthy("20 KiB header").await;

    // Below the limit is served.
    let fine = "d".repeat(8 * 1024);
    let resp = sb
        .raw("GET", "/_granary/health", &[("X-Fine", &fine)], b"")
        .await;
    assert_eq!(resp.status, 200, "one 8 KiB header: {}", resp.text());
}

#[tokio::test]
async fn unknown_buckets_routes_and_methods() {
    let sb = Sandbox::start(ServerOpts::open());
    sb.create_bucket("bkt").await;

    let missing = bucket_name("nobucket");
    for (method, path) in [
        ("GET", format!("/{missing}/key")),
        ("GET", format!("/{missing}?list-type=2")),
        ("PUT", format!("/{missing}/key")),
        ("DELETE", format!("/{missing}")),
    ] {
        let resp = sb.raw(method, &path, &[], b"").await;
        resp.assert_s3_error(404, &["NoSuchBucket"]);
    }
    let resp = sb.raw("GET", "/bkt/no/such/key", &[], b"").await;
    resp.assert_s3_error(404, &["NoSuchKey"]);

    for path in ["/_granary/nope", "/_granary/health/extra"] {
        let resp = sb.raw("GET", path, &[], b"").await;
        assert_eq!(resp.status, 404, "GET {path}: {}", resp.text());
    }
    let resp = sb.raw("PUT", "/_granary", &[], b"").await;
    assert!(
        (400..500).contains(&resp.status),
        "PUT /_granary made a bucket? {} {}",
        resp.status,
        resp.text()
    );

    for method in ["BREW", "PATCH", "TRACE"] {
        let resp = sb.raw(method, "/bkt/key", &[], b"").await;
        assert!(
            (400..500).contains(&resp.status),
            "{method}: {} {}",
            resp.status,
            resp.text()
        );
        sb.server.assert_healthy(method).await;
    }

    let resp = sb
        .raw("PUT", "/bkt/cl", &[("Content-Length", "abc")], b"")
        .await;
    assert_eq!(resp.status, 400, "Content-Length: abc");
    sb.server.assert_healthy("Content-Length: abc").await;
    sb.assert_nothing_outside();
}

/// A folder under the fs origin whose name breaks S3's rules is said at start, with the
/// rule, and a request for it answers `InvalidBucketName` naming the rule, not
/// `NoSuchBucket`; ListBuckets leaves it out, and a folder that is not there is still
/// `NoSuchBucket`.
#[tokio::test]
async fn bucket_folders_that_break_the_rules_are_said_out_loud() {
    let mut sb = Sandbox::start(ServerOpts::open());
    let origin = sb.server.data_dir().join("origin");
    for folder in ["ds", "Train_Set"] {
        std::fs::create_dir_all(origin.join(folder)).unwrap();
        std::fs::write(origin.join(folder).join("k"), b"v").unwrap();
    }
    sb.server.restart(false).unwrap();
    sb.before = list_files(sb.server.root(), Some(sb.server.data_dir()));
    let log = sb.server.log();
    for (folder, rule) in [
        ("ds", "a bucket name is 3 to 63 characters long"),
        ("Train_Set", "a bucket name has only lowercase letters"),
    ] {
        let said = log
            .lines()
            .find(|l| l.contains("not served as a bucket") && l.contains(&format!("/{folder}")));
        let said = said.unwrap_or_else(|| panic!("{folder} not logged at start:\n{log}"));
        assert!(said.contains(rule), "{folder}: {said}");
        for (method, path) in [
            ("GET", format!("/{folder}/k")),
            ("HEAD", format!("/{folder}/k")),
            ("PUT", format!("/{folder}/new")),
            ("GET", format!("/{folder}?list-type=2")),
        ] {
            let resp = sb.raw(method, &path, &[], b"x").await;
            assert_eq!(resp.status, 400, "{method} {path}: {}", resp.text());
            if method != "HEAD" {
                resp.assert_s3_error(400, &["InvalidBucketName"]);
                assert!(
                    resp.text().contains(rule),
                    "{method} {path}: {}",
                    resp.text()
                );
            }
        }
    }
    let resp = sb.raw("GET", "/", &[], b"").await;
    assert_eq!(resp.status, 200);
    assert!(
        !resp.text().contains("<Name>ds</Name>") && !resp.text().contains("Train_Set"),
        "{}",
        resp.text()
    );
    sb.raw("GET", "/zz/k", &[], b"")
        .await
        .assert_s3_error(404, &["NoSuchBucket"]);
    assert!(!origin.join("ds").join("new").exists(), "a write landed");
    sb.assert_nothing_outside();
}
