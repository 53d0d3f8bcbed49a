//! The real `granaryctl` binary against the real server: `mb`, `put`, `ls`, `stat`,
//! `get` (to a file and to stdout), `cat --archpath`, `rm` (after which `stat` exits
//! non-zero), `cluster` with `--owner`, `health`; errors as non-zero exits naming the S3
//! code; and signing from flags and from `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`.

use std::process::Output;

use anyhow::Result;
use granary_client::Client;
use granary_tests::ctl::{granaryctl, granaryctl_with_env};
use granary_tests::{md5_hex, tar_of, Pattern, Server, ServerOpts, ACCESS, SECRET};

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn err_text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs granaryctl and requires exit status 0.
fn ok(endpoint: &str, args: &[&str]) -> Output {
    let out = granaryctl(endpoint, args, b"").unwrap();
    assert!(
        out.status.success(),
        "granaryctl {args:?} exited {:?}: {}",
        out.status.code(),
        err_text(&out)
    );
    out
}

#[test]
fn objects_round_trip_through_granaryctl() -> Result<()> {
    let server = Server::start(ServerOpts::open())?;
    let url = server.url();
    let work = server.root().join("work");
    std::fs::create_dir_all(&work)?;

    assert_eq!(ok(&url, &["mb", "ctl"]).status.code(), Some(0));
    let data = Pattern::new(77).bytes(0, (3 << 20) + 123);
    let src = work.join("big file.bin");
    std::fs::write(&src, &data)?;
    let put = ok(
        &url,
        &["put", src.to_str().unwrap(), "ctl/dir/big file.bin"],
    );
    assert_eq!(
        text(&put).trim(),
        format!("ctl/dir/big file.bin\t{}\t{}", data.len(), md5_hex(&data))
    );
    // A key ending in `/` takes the file's name.
    let small = work.join("small.txt");
    std::fs::write(&small, b"hello granary\n")?;
    ok(&url, &["put", small.to_str().unwrap(), "ctl/dir/"]);

    // ls: key, size, ETag per line, in key order.
    let ls = text(&ok(&url, &["ls", "ctl/dir/"]));
    let lines: Vec<&str> = ls.lines().collect();
    assert_eq!(
        lines,
        vec![
            format!("dir/big file.bin\t{}\t{}", data.len(), md5_hex(&data)),
            format!("dir/small.txt\t14\t{}", md5_hex(b"hello granary\n")),
        ]
    );
    assert_eq!(text(&ok(&url, &["ls"])).trim(), "ctl");
    assert_eq!(text(&ok(&url, &["ls", "ctl/nothing-here"])), "");

    // stat: the size and ETag, and where the node has it.
    let stat = text(&ok(&url, &["stat", "ctl/dir/big file.bin"]));
    assert!(
        stat.contains(&format!("size:          {}\n", data.len())),
        "{stat}"
    );
    assert!(
        stat.contains(&format!("etag:          {}\n", md5_hex(&data))),
        "{stat}"
    );
    let json: serde_json::Value =
        serde_json::from_slice(&ok(&url, &["stat", "--json", "ctl/dir/small.txt"]).stdout)?;
    assert_eq!(json["size"], 14);
    assert_eq!(json["etag"], md5_hex(b"hello granary\n"));

    // get: to a named file, to stdout, and to the key's file name in the working directory.
    let dst = work.join("copy.bin");
    ok(
        &url,
        &["get", "ctl/dir/big file.bin", dst.to_str().unwrap()],
    );
    assert!(std::fs::read(&dst)? == data, "downloaded bytes differ");
    let out = ok(&url, &["get", "ctl/dir/big file.bin", "-"]);
    assert!(out.stdout == data, "bytes on stdout differ");
    let out = ok(&url, &["cat", "ctl/dir/small.txt"]);
    assert_eq!(out.stdout, b"hello granary\n");

    // A shard member through --archpath.
    let shard = tar_of(&[
        ("0001.cls".into(), b"7".to_vec()),
        ("0001.jpg".into(), vec![0xFFu8; 3000]),
    ]);
    let shard_file = work.join("s.tar");
    std::fs::write(&shard_file, &shard)?;
    ok(
        &url,
        &["put", shard_file.to_str().unwrap(), "ctl/shards/s.tar"],
    );
    let out = ok(&url, &["cat", "--archpath", "0001.jpg", "ctl/shards/s.tar"]);
    assert_eq!(out.stdout, vec![0xFFu8; 3000]);

    // rm, then stat and get fail with a non-zero exit naming the error.
    ok(&url, &["rm", "ctl/dir/big file.bin"]);
    let gone = granaryctl(&url, &["stat", "ctl/dir/big file.bin"], b"")?;
    assert_eq!(gone.status.code(), Some(1));
    assert!(err_text(&gone).contains("404"), "{}", err_text(&gone));
    let gone = granaryctl(
        &url,
        &["get", "ctl/dir/big file.bin", dst.to_str().unwrap()],
        b"",
    )?;
    assert_eq!(gone.status.code(), Some(1));
    assert!(err_text(&gone).contains("NoSuchKey"), "{}", err_text(&gone));
    assert!(!dst.exists(), "a failed get left a file behind");
    let ls = text(&ok(&url, &["ls", "ctl/dir/"]));
    assert_eq!(ls.lines().count(), 1);

    // Bad input: a missing bucket, a target without a key.
    let missing = granaryctl(&url, &["ls", "no-such-bucket"], b"")?;
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        err_text(&missing).contains("NoSuchBucket"),
        "{}",
        err_text(&missing)
    );
    let bad = granaryctl(&url, &["stat", "ctl"], b"")?;
    assert_eq!(bad.status.code(), Some(1));
    Ok(())
}

#[test]
fn cluster_and_health() -> Result<()> {
    let nodes = Server::start_cluster(&["n1", "n2"], &ServerOpts::open())?;
    let refs: Vec<&Server> = nodes.iter().collect();
    Server::wait_cluster_up(&refs, std::time::Duration::from_secs(20))?;
    let url = nodes[0].url();

    let health: serde_json::Value = serde_json::from_slice(&ok(&url, &["health"]).stdout)?;
    assert_eq!(health["node_id"], "n1");

    let table = text(&ok(&url, &["cluster"]));
    let rows: Vec<Vec<&str>> = table
        .lines()
        .skip(1)
        .map(|l| {
            l.trim_start_matches(['*', ' '])
                .split_whitespace()
                .collect()
        })
        .collect();
    assert_eq!(rows.len(), 2, "{table}");
    assert_eq!(rows[0][..3], ["n1", &nodes[0].url(), "up"]);
    assert_eq!(rows[1][..3], ["n2", &nodes[1].url(), "up"]);
    assert!(table.lines().nth(1).unwrap().starts_with('*'), "{table}");

    // The owner agrees with the library and with every node.
    let mut client = Client::new(&url)?;
    for key in ["a", "b/c.tar", "shard-0001.tar", "x y"] {
        let want = client.owner_of("bkt", key)?.owner.unwrap();
        for node in &nodes {
            let out = ok(&node.url(), &["cluster", "--owner", &format!("bkt/{key}")]);
            let owner = text(&out)
                .lines()
                .find_map(|l| l.strip_prefix("owner: ").map(str::to_owned));
            assert_eq!(owner.as_deref(), Some(want.as_str()), "{key}");
        }
    }
    let json: serde_json::Value = serde_json::from_slice(&ok(&url, &["cluster", "--json"]).stdout)?;
    assert_eq!(json["node_id"], "n1");
    assert_eq!(json["members"].as_array().map(Vec::len), Some(2));

    // A node that does not answer: non-zero exit.
    let dead = granaryctl("http://127.0.0.1:1", &["health"], b"")?;
    assert_eq!(dead.status.code(), Some(1));
    Ok(())
}

#[test]
fn credentials_from_flags_and_environment_sign_requests() -> Result<()> {
    let server = Server::start(ServerOpts::with_credentials())?;
    let url = server.url();
    let flags = ["--access-key", ACCESS, "--secret-key", SECRET];
    let with = |args: &[&str]| -> Vec<String> {
        flags.iter().chain(args).map(|s| s.to_string()).collect()
    };
    let run = |args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ok(&url, &args)
    };
    run(with(&["mb", "signed"]));
    let file = server.root().join("payload");
    let data = Pattern::new(5).bytes(0, 100_000);
    std::fs::write(&file, &data)?;
    run(with(&["put", file.to_str().unwrap(), "signed/k"]));
    assert!(run(with(&["get", "signed/k", "-"])).stdout == data);

    let env = [
        ("AWS_ACCESS_KEY_ID", ACCESS),
        ("AWS_SECRET_ACCESS_KEY", SECRET),
    ];
    let out = granaryctl_with_env(&url, &["ls", "signed"], b"", &env)?;
    assert!(out.status.success(), "{}", err_text(&out));
    assert_eq!(
        text(&out).trim(),
        format!("k\t{}\t{}", data.len(), md5_hex(&data))
    );

    let unsigned = granaryctl(&url, &["get", "signed/k", "-"], b"")?;
    assert_eq!(unsigned.status.code(), Some(1));
    assert!(
        err_text(&unsigned).contains("AccessDenied"),
        "{}",
        err_text(&unsigned)
    );
    assert!(unsigned.stdout.is_empty());
    let wrong = granaryctl(
        &url,
        &[
            "--access-key",
            ACCESS,
            "--secret-key",
            "wrong",
            "ls",
            "signed",
        ],
        b"",
    )?;
    assert_eq!(wrong.status.code(), Some(1));
    assert!(
        err_text(&wrong).contains("SignatureDoesNotMatch"),
        "{}",
        err_text(&wrong)
    );
    let half = granaryctl(&url, &["--access-key", ACCESS, "ls", "signed"], b"")?;
    assert_eq!(half.status.code(), Some(1));
    Ok(())
}

/// A prefix of objects and one shard, uploaded through the library.
fn warm_data(client: &mut Client) -> Result<Vec<(String, Vec<u8>)>> {
    client.create_bucket("warm")?;
    let mut objs = Vec::new();
    for i in 0..6u64 {
        let data =
            Pattern::new(100 + i).bytes(0, [10, 4096, 100_000, 1 << 20, 7, 250_000][i as usize]);
        objs.push((format!("p/o{i}"), data));
    }
    let shard = tar_of(&[
        ("0001.cls".into(), b"3".to_vec()),
        ("0001.jpg".into(), vec![0xABu8; 5000]),
    ]);
    objs.push(("p/s.tar".to_owned(), shard));
    for (key, data) in &objs {
        client.put_bytes("warm", key, data)?;
    }
    Ok(objs)
}

#[test]
fn prefetch_jobs_and_batches() -> Result<()> {
    let server = Server::start(ServerOpts::open())?;
    let url = server.url();
    let mut client = Client::new(&url)?;
    let objs = warm_data(&mut client)?;
    let total: usize = objs.iter().map(|(_, d)| d.len()).sum();

    // Followed to the end: the last line is the finished job.
    let out = ok(&url, &["prefetch", "warm/p/", "--interval-ms", "50"]);
    let line = text(&out);
    let fields: Vec<&str> = line.trim().split('\t').collect();
    assert_eq!(
        fields[1..],
        [
            "prefetch",
            "done",
            &format!("objects {0}/{0}", objs.len()),
            &format!("bytes {0}/{0}", total),
            "errors 0"
        ],
        "{line}"
    );
    let id = fields[0].to_owned();

    // The same job by id, as text and as JSON; cancelling a finished job leaves it done.
    let shown = text(&ok(&url, &["job", &id]));
    assert_eq!(shown.trim(), line.trim());
    let json: serde_json::Value =
        serde_json::from_slice(&ok(&url, &["job", "--json", &id]).stdout)?;
    assert_eq!(json["bytes_done"], total);
    assert_eq!(json["objects_total"], objs.len());
    let cancelled = text(&ok(&url, &["job", "cancel", &id]));
    assert!(cancelled.contains("\tdone\t"), "{cancelled}");
    let missing = granaryctl(&url, &["job", "no-such-job"], b"")?;
    assert_eq!(missing.status.code(), Some(1));
    assert!(err_text(&missing).contains("404"), "{}", err_text(&missing));

    // --no-wait prints the id of a job the library can follow.
    let out = ok(&url, &["prefetch", "--no-wait", "warm"]);
    let id = text(&out).trim().to_owned();
    assert!(!id.is_empty() && !id.contains('\t'));
    let job = client.wait_job(&id, std::time::Duration::from_millis(20), |_| {})?;
    assert_eq!(job.state, granary_client::JobState::Done);
    assert_eq!(
        (job.objects_done, job.bytes_done),
        (objs.len() as u64, total as u64)
    );
    let waited = text(&ok(&url, &["job", "wait", &id]));
    assert!(waited.contains("\tdone\t"), "{waited}");
    let bad = granaryctl(&url, &["prefetch", "no-such-bucket/x"], b"")?;
    assert_eq!(bad.status.code(), Some(1));

    // Batch from a file of lines, missing items marked, into a file.
    let work = server.root().join("work");
    std::fs::create_dir_all(&work)?;
    let list = work.join("items.txt");
    std::fs::write(
        &list,
        "warm/p/o3\n# a comment\nwarm/p/s.tar#0001.jpg\nwarm/p/gone\nwarm/p/o0\n",
    )?;
    let tar_path = work.join("out.tar");
    ok(
        &url,
        &[
            "batch",
            list.to_str().unwrap(),
            "-o",
            tar_path.to_str().unwrap(),
            "--missing",
            "mark",
        ],
    );
    let bytes = std::fs::read(&tar_path)?;
    let members: Vec<(String, Vec<u8>)> =
        granary_client::TarReader::new(bytes.as_slice()).collect::<std::io::Result<_>>()?;
    let names: Vec<&str> = members.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["p/o3", "p/s.tar/0001.jpg", "__404__/p/gone", "p/o0"]
    );
    assert!(members[0].1 == objs[3].1);
    assert_eq!(members[1].1, vec![0xABu8; 5000]);
    assert!(members[2].1.is_empty());
    assert_eq!(members[3].1, objs[0].1);

    // The same through the library: parsed, and raw bytes equal to the CLI's.
    let items = vec![
        granary_client::BatchItem::object("warm", "p/o3"),
        granary_client::BatchItem::member("warm", "p/s.tar", "0001.jpg"),
        granary_client::BatchItem::object("warm", "p/gone"),
        granary_client::BatchItem::object("warm", "p/o0"),
    ];
    assert_eq!(
        client.batch(&items, granary_client::Missing::Mark)?,
        members
    );

    // JSON items on stdin, tar on stdout; without `--missing mark` a missing item fails.
    let json = serde_json::to_vec(&items[..2])?;
    let out = granaryctl(&url, &["batch"], &json)?;
    assert!(out.status.success(), "{}", err_text(&out));
    let mut raw = Vec::new();
    client.batch_into(&items[..2], granary_client::Missing::Error, &mut raw)?;
    assert!(out.stdout == raw, "CLI and library tars differ");
    // A missing item fails the batch: 404 when it is the first (before any byte); an
    // aborted stream, or a 404, when items before it may have been sent already.
    let first_missing = work.join("first-missing.txt");
    std::fs::write(&first_missing, "warm/p/gone\nwarm/p/o0\n")?;
    for items_file in [&first_missing, &list] {
        let failed = granaryctl(
            &url,
            &[
                "batch",
                items_file.to_str().unwrap(),
                "-o",
                tar_path.to_str().unwrap(),
            ],
            b"",
        )?;
        assert_eq!(failed.status.code(), Some(1));
        assert!(!tar_path.exists(), "a failed batch left its file");
        if items_file == &first_missing {
            assert!(err_text(&failed).contains("404"), "{}", err_text(&failed));
        }
    }
    let err = client
        .batch(&items[2..], granary_client::Missing::Error)
        .unwrap_err();
    assert_eq!(err.status(), Some(404));
    assert!(client
        .batch(&items, granary_client::Missing::Error)
        .is_err());
    // The client carries on after an aborted answer.
    assert_eq!(client.get("warm", "p/o0")?, objs[0].1);
    Ok(())
}
