//! Bodies that end early or whose `aws-chunked` framing is broken never become objects.

use super::*;

/// Sends a PUT whose body stops short of its Content-Length, then closes the connection.
fn truncated_put(addr: SocketAddr, path: &str, claimed: usize, sent: &[u8]) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let head = format!(
        "PUT {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {claimed}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(sent).unwrap();
    stream.flush().unwrap();
    // Give the server time to read the partial body before it sees the end.
    std::thread::sleep(Duration::from_millis(300));
    stream.shutdown(Shutdown::Write).unwrap();
    // Whatever the answer (or none), it must not be success.
    if let Ok((status, _)) = read_response_head(&mut BufReader::new(stream)) {
        assert!(
            !(200..300).contains(&status),
            "a truncated PUT of {path} answered {status}"
        );
    }
}

#[tokio::test]
async fn truncated_upload_never_becomes_an_object() {
    let sb = Sandbox::start(ServerOpts::open());
    sb.create_bucket("bkt").await;
    let v1 = random_bytes(200_000);
    assert_eq!(sb.raw("PUT", "/bkt/obj", &[], &v1).await.status, 200);

    let partial = random_bytes(100_000);
    let addr = sb.server.addr();
    tokio::task::spawn_blocking(move || {
        truncated_put(addr, "/bkt/obj", 1_000_000, &partial);
        truncated_put(addr, "/bkt/fresh", 1_000_000, &partial);
    })
    .await
    .expect("truncated PUTs");
    sb.server.assert_healthy("truncated PUTs").await;

    let resp = sb.raw("GET", "/bkt/obj", &[], b"").await;
    assert_eq!(resp.status, 200);
    assert!(resp.body == v1, "a truncated overwrite replaced the object");
    let resp = sb.raw("GET", "/bkt/fresh", &[], b"").await;
    resp.assert_s3_error(404, &["NoSuchKey"]);
    let listing = sb.raw("GET", "/bkt?list-type=2", &[], b"").await;
    assert_eq!(
        granary_tests::xml_tags(&listing.text(), "Key"),
        ["obj"],
        "listing after truncated PUTs"
    );
    sb.assert_nothing_outside();
}

#[tokio::test]
async fn garbled_aws_chunked_bodies_are_refused() {
    let sb = Sandbox::start(ServerOpts::open());
    sb.create_bucket("bkt").await;
    let crc = |d: &[u8]| {
        base64::engine::general_purpose::STANDARD.encode(crc32fast::hash(d).to_be_bytes())
    };
    let good_crc = crc(b"hello world");
    let trailer_ok = format!("b\r\nhello world\r\n0\r\nx-amz-checksum-crc32:{good_crc}\r\n\r\n");
    let unsigned = "STREAMING-UNSIGNED-PAYLOAD-TRAILER";

    let send = |key: &'static str, decoded: &'static str, trailer: bool, body: Vec<u8>| {
        let sb = &sb;
        async move {
            let mut headers = vec![
                ("Content-Encoding", "aws-chunked"),
                ("x-amz-content-sha256", unsigned),
                ("x-amz-decoded-content-length", decoded),
            ];
            if trailer {
                headers.push(("x-amz-trailer", "x-amz-checksum-crc32"));
            }
            sb.raw("PUT", &format!("/bkt/{key}"), &headers, &body).await
        }
    };

    // Well-formed framing is decoded: the checks below refuse framing, not the feature.
    let resp = send("ok", "11", true, trailer_ok.clone().into_bytes()).await;
    assert_eq!(resp.status, 200, "aws-chunked PUT: {}", resp.text());
    assert_eq!(
        sb.raw("GET", "/bkt/ok", &[], b"").await.body,
        b"hello world"
    );

    let bad: Vec<(&'static str, &'static str, bool, Vec<u8>)> = vec![
        (
            "size-not-hex",
            "11",
            false,
            b"zz\r\nhello world\r\n0\r\n\r\n".to_vec(),
        ),
        (
            "short-chunk",
            "100",
            false,
            b"64\r\nhello world\r\n0\r\n\r\n".to_vec(),
        ),
        (
            "no-final-chunk",
            "11",
            false,
            b"b\r\nhello world\r\n".to_vec(),
        ),
        (
            "decoded-mismatch",
            "20",
            false,
            b"b\r\nhello world\r\n0\r\n\r\n".to_vec(),
        ),
        (
            "huge-size",
            "11",
            false,
            b"ffffffffffffffff\r\nhello world\r\n0\r\n\r\n".to_vec(),
        ),
        (
            "missing-crlf",
            "11",
            false,
            b"b\r\nhello worldXX0\r\n\r\n".to_vec(),
        ),
        (
            "wrong-trailer-crc",
            "11",
            true,
            b"b\r\nhello world\r\n0\r\nx-amz-checksum-crc32:AAAAAA==\r\n\r\n".to_vec(),
        ),
    ];
    for (key, decoded, trailer, body) in bad {
        let resp = send(key, decoded, trailer, body).await;
        assert_client_error(&resp, &format!("aws-chunked body {key}"));
        sb.server.assert_healthy(key).await;
        let resp = sb.raw("GET", &format!("/bkt/{key}"), &[], b"").await;
        assert_eq!(
            resp.status, 404,
            "a garbled aws-chunked body became /bkt/{key}"
        );
    }
    sb.assert_nothing_outside();
}
