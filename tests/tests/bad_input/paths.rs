//! Request paths that try to leave the data directory, NUL and control characters in keys.

use super::*;

#[tokio::test]
async fn traversal_paths_stay_inside_the_data_dir() {
    let sb = Sandbox::start(ServerOpts::open());
    sb.create_bucket("bkt2").await;

    // Each path gets a bucket of its own (`/bkt` is replaced by it), since several spell the
    // same key: `..%2f` and `%2e%2e/` decode to `../`, as S3 decodes them.

    let paths = [
        "/bkt/../../outside/x",
        "/bkt/../../../outside/x",
        "/bkt/../../../../outside/x",
        "/bkt/..%2f..%2foutside%2fx",
        "/bkt/..%2f..%2f..%2foutside%2fx",
        "/bkt/..%2F..%2F..%2F..%2Foutside%2Fx",
        "/bkt/%2e%2e/%2e%2e/outside/x",
        "/bkt/%2e%2e/%2e%2e/%2e%2e/outside/x",
        "/bkt/%2E%2E%2F%2E%2E%2F%2E%2E%2Foutside%2Fx",
        "/bkt/a/b/../../../../../../../../outside/x",
        "/bkt/../bkt2/stolen",
        "/bkt/..",
        "/bkt/.",
        "/bkt/./.",
        "/bkt//etc/passwd",
        "/bkt/%2Fetc%2Fpasswd",
        "/bkt/%2e%2e",
        "/..%2f/x",
        "/..%2f..%2foutside/x",
        "/%2e%2e/outside/x",
        "/bkt/%ff%fe",
        "/bkt/%zz",
    ];
    for (i, path) in paths.into_iter().enumerate() {
        let bucket = format!("bkt-{i}");
        sb.create_bucket(&bucket).await;
        let path = path.replacen("/bkt/", &format!("/{bucket}/"), 1);
        let path = path.as_str();
        // Before anything was written there, no read may find anything.
        let resp = sb.raw("GET", path, &[], b"").await;
        assert!(
            resp.body != sb.sentinel_bytes && !resp.text().contains("root:"),
            "GET {path} served a file from outside the data dir"
        );
        assert_client_error(&resp, &format!("GET {path} before any PUT"));
        sb.server.assert_healthy(&format!("GET {path}")).await;

        let body = format!("written through {path}").into_bytes();
        let resp = sb.raw("PUT", path, &[], &body).await;
        sb.server.assert_healthy(&format!("PUT {path}")).await;
        if resp.status == 200 {
            let back = sb.raw("GET", path, &[], b"").await;
            assert_eq!(
                back.status,
                200,
                "GET {path} after a 200 PUT: {}",
                back.text()
            );
            assert_eq!(back.body, body, "GET {path} after a 200 PUT");
            let inside = list_files(sb.server.data_dir(), None)
                .into_iter()
                .any(|f| std::fs::read(f).is_ok_and(|b| b == body));
            assert!(
                inside,
                "PUT {path}: no file in the data dir holds the bytes"
            );
        } else {
            assert_client_error(&resp, &format!("PUT {path}"));
        }
        sb.assert_nothing_outside();
    }
    // The object `stolen` must not have landed in bkt2 by a `..` in bkt's key.
    let resp = sb.raw("GET", "/bkt2/stolen", &[], b"").await;
    assert_eq!(resp.status, 404, "/bkt/../bkt2/stolen escaped its bucket");
    sb.assert_nothing_outside();
}

#[tokio::test]
async fn nul_in_key_is_400() {
    let sb = Sandbox::start(ServerOpts::open());
    sb.create_bucket("bkt").await;
    for path in ["/bkt/a%00b", "/bkt/%00", "/bkt/dir/%00/x", "/bkt/x%00/../y"] {
        let resp = sb.raw("PUT", path, &[], b"nul").await;
        assert_eq!(resp.status, 400, "PUT {path}: {}", resp.text());
        assert_s3_error_body(&resp.body);
        let resp = sb.raw("GET", path, &[], b"").await;
        assert_eq!(resp.status, 400, "GET {path}: {}", resp.text());
        assert_s3_error_body(&resp.body);
        sb.server.assert_healthy(path).await;
    }
    let listing = sb.raw("GET", "/bkt?list-type=2", &[], b"").await;
    assert_eq!(listing.status, 200);
    check_xml(&listing.body).expect("ListObjectsV2 XML");
    assert_eq!(xml_tag(&listing.text(), "KeyCount").as_deref(), Some("0"));
    sb.assert_nothing_outside();
}

/// S3 takes control characters in keys; every answer that names such a key must still be XML
/// that a parser accepts (XML 1.0 has no way to write U+0001, even as `&#x1;`).
#[tokio::test]
async fn control_characters_in_keys_keep_answers_parseable() {
    let sb = Sandbox::start(ServerOpts::open());
    sb.create_bucket("bkt").await;

    let resp = sb.raw("PUT", "/bkt/ctl%01x", &[], b"ctl").await;
    assert_eq!(resp.status, 200, "PUT a key with U+0001: {}", resp.text());
    let resp = sb.raw("GET", "/bkt/ctl%01x", &[], b"").await;
    assert_eq!(resp.body, b"ctl");

    // boto3 lists with encoding-type=url, which exists for exactly these keys.
    let listing = sb
        .raw("GET", "/bkt?list-type=2&encoding-type=url", &[], b"")
        .await;
    assert_eq!(listing.status, 200, "{}", listing.text());
    check_xml(&listing.body).expect("ListObjectsV2 with encoding-type=url is XML");
    assert_eq!(xml_tags(&listing.text(), "Key"), ["ctl%01x"]);
    assert_eq!(
        xml_tag(&listing.text(), "EncodingType").as_deref(),
        Some("url")
    );

    // Errors about such keys.
    let resp = sb.raw("GET", "/bkt/missing%01key%1f", &[], b"").await;
    resp.assert_s3_error(404, &["NoSuchKey"]);
    let resp = sb
        .raw("GET", "/bkt/ctl%01x", &[("If-Match", "\"nope\"")], b"")
        .await;
    resp.assert_s3_error(412, &["PreconditionFailed"]);
    sb.server.assert_healthy("control characters").await;
}
