//! Delivery to processes on the node's machine, against the real binary: the same S3 API
//! over `--listen-unix` as over TCP (bytes equal); local reads that receive a read-only
//! descriptor of the cache file and map it (objects, ranges, shard members, transform
//! results; cold objects filled first); the access rules of HTTP; a descriptor that
//! cannot write the cache file; and the fall back to HTTP where no descriptor can be had
//! (no socket on this machine, an object the cache cannot admit, a key another node owns).

use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use granary_client::{Client, GetOptions, Local, LocalBytes};
use granary_tests::{reserve_ports, tar_of, Pattern, Server, ServerOpts, ACCESS, SECRET};

const BUCKET: &str = "local-reads";

/// A node serving also on `DIR/granary.sock`.
fn start(dir: &Path, opts: ServerOpts) -> Result<(Server, PathBuf)> {
    let sock = dir.join("granary.sock");
    let server = Server::start(opts.args(&["--listen-unix", sock.to_str().unwrap()]))?;
    Ok((server, sock))
}

fn unix_client(sock: &Path) -> Client {
    Client::new(&format!("unix:{}", sock.display())).unwrap()
}

fn signed(c: Client) -> Client {
    c.with_credentials(ACCESS, SECRET, "us-east-1")
}

/// Objects of several sizes (0 B, across the 64 KiB checksum blocks, 3 MiB + 7) and awkward
/// keys.
fn objects() -> Vec<(String, Vec<u8>)> {
    [
        ("empty", 0usize),
        ("one-byte", 1),
        ("dir/a block.bin", 64 << 10),
        ("dir/ünïcode+plus", 100_003),
        ("big/shard.bin", (3 << 20) + 7),
    ]
    .iter()
    .enumerate()
    .map(|(i, (k, n))| (k.to_string(), Pattern::new(i as u64 + 11).bytes(0, *n)))
    .collect()
}

/// A client given the TCP address of a node on its machine goes on over the node's Unix
/// socket once the node offers it (`x-granary-socket: PID PATH`, on answers over TCP to
/// loopback clients): a proxy on the TCP path sees the first GET only, and every GET
/// brings the same bytes. A client told to keep to its address sends every GET over TCP;
/// answers over the socket carry no offer.
#[test]
fn a_client_on_the_nodes_machine_goes_on_over_its_socket() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (server, sock) = start(dir.path(), ServerOpts::open())?;
    let mut unix = unix_client(&sock);
    unix.create_bucket(BUCKET)?;
    let data = Pattern::new(77).bytes(0, (5 << 20) + 3);
    unix.put_bytes(BUCKET, "obj", &data)?;
    let path = format!("/{BUCKET}/obj");

    let offer = format!("{} {}", server.pid(), sock.display());
    let direct = Client::new(&server.url())?.raw("GET", &path, b"")?;
    let header = |r: &granary_client::Response| r.header("x-granary-socket").map(str::to_owned);
    assert_eq!(
        header(&direct),
        Some(offer),
        "the offer: the node's pid and socket"
    );
    let over_socket = unix_client(&sock).raw("GET", &path, b"")?;
    assert_eq!((over_socket.status, header(&over_socket)), (200, None));

    let proxy = granary_tests::FaultProxy::start(server.addr())?;
    let mut c = Client::new(&proxy.url())?.with_streams(1);
    for _ in 0..4 {
        assert!(c.get(BUCKET, "obj")? == data, "the bytes over either way");
    }
    assert_eq!(
        proxy.recorded("GET", &path).len(),
        1,
        "the rest over the socket"
    );
    let mut tcp = Client::new(&proxy.url())?
        .with_socket_offers(false)
        .with_streams(1);
    for _ in 0..3 {
        assert!(tcp.get(BUCKET, "obj")? == data);
    }
    assert_eq!(proxy.recorded("GET", &path).len(), 4, "kept to TCP");
    Ok(())
}

#[test]
fn the_unix_socket_serves_the_same_api_as_tcp() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (server, sock) = start(dir.path(), ServerOpts::open())?;
    let mut tcp = Client::new(&server.url())?;
    let mut unix = unix_client(&sock);
    assert_eq!(unix.endpoint(), format!("unix:{}", sock.display()));
    unix.create_bucket(BUCKET)?;
    let objs = objects();
    for (key, data) in &objs {
        let etag = unix.put_bytes(BUCKET, key, data)?;
        assert_eq!(etag, granary_tests::md5_hex(data), "{key}");
    }
    let shard = tar_of(&[
        ("s/0001.cls".into(), b"7".to_vec()),
        ("s/0001.bin".into(), Pattern::new(5).bytes(0, 300_000)),
    ]);
    unix.put_bytes(BUCKET, "shard-0000.tar", &shard)?;

    for (key, data) in &objs {
        // Twice: the cold read fills the cache, the second is a hit.
        for _ in 0..2 {
            assert_eq!(&unix.get(BUCKET, key)?, data, "{key} over the socket");
            assert_eq!(&tcp.get(BUCKET, key)?, data, "{key} over TCP");
        }
        let (u, t) = (unix.stat(BUCKET, key)?, tcp.stat(BUCKET, key)?);
        assert_eq!((u.size, &u.etag), (data.len() as u64, &t.etag), "{key}");
        if data.len() > 10 {
            let r = 3..data.len() as u64 - 2;
            let want = &data[r.start as usize..r.end as usize];
            assert_eq!(unix.get_range(BUCKET, key, r.clone())?, want, "{key}");
            assert_eq!(tcp.get_range(BUCKET, key, r)?, want, "{key}");
        }
    }
    let member = unix.get_member(BUCKET, "shard-0000.tar", "s/0001.bin")?;
    assert_eq!(member, Pattern::new(5).bytes(0, 300_000));
    assert_eq!(
        member,
        tcp.get_member(BUCKET, "shard-0000.tar", "s/0001.bin")?
    );
    let keys = |c: &mut Client| -> Result<Vec<(String, u64)>> {
        Ok(c.list(BUCKET, "")?
            .into_iter()
            .map(|o| (o.key, o.size))
            .collect())
    };
    assert_eq!(keys(&mut unix)?, keys(&mut tcp)?);
    assert_eq!(keys(&mut unix)?.len(), objs.len() + 1);
    // Errors are the same S3 errors.
    let missing = unix.get(BUCKET, "no/such/key").unwrap_err();
    assert_eq!(
        (missing.status(), missing.code()),
        (Some(404), Some("NoSuchKey"))
    );
    unix.delete(BUCKET, "one-byte")?;
    assert_eq!(tcp.get(BUCKET, "one-byte").unwrap_err().status(), Some(404));
    assert_eq!(unix.health()?["status"], "ok");
    Ok(())
}

#[test]
fn local_reads_map_the_cache_file() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("granary.toml");
    std::fs::write(
        &config,
        "[transforms.upper]\nkind = \"exec\"\ncommand = [\"tr\", \"a-z\", \"A-Z\"]\n",
    )?;
    let opts = ServerOpts::open().args(&["--config", config.to_str().unwrap()]);
    let (server, sock) = start(dir.path(), opts)?;
    // Written into the backend directly, so that the node has never seen them.
    let origin = server.data_dir().join("origin").join(BUCKET);
    let objs = objects();
    for (key, data) in &objs {
        let path = origin.join(key);
        std::fs::create_dir_all(path.parent().unwrap())?;
        std::fs::write(path, data)?;
    }
    let mut local = unix_client(&sock);
    for (key, data) in &objs {
        // Cold: the node fills the object, then hands over its file.
        let first = local.open_local(BUCKET, key, &GetOptions::default())?;
        let Local::File(file) = first else {
            panic!("{key}: no descriptor for a cacheable object");
        };
        assert_eq!(file.meta().cache.as_deref(), Some("miss"), "{key}");
        assert_eq!((file.offset(), file.len()), (0, data.len() as u64), "{key}");
        assert_eq!(&file.map()?[..], &data[..], "{key}");
        let again = local.get_local(BUCKET, key)?;
        assert!(again.is_mapped(), "{key}");
        assert_eq!(&again[..], &data[..], "{key}");
    }
    // A range is the bytes at an offset into the same file.
    let (key, data) = &objs[4];
    let opts = GetOptions {
        range: Some(1_000_001..2_000_003),
        ..GetOptions::default()
    };
    let Local::File(part) = local.open_local(BUCKET, key, &opts)? else {
        panic!("no descriptor for a range")
    };
    assert_eq!((part.offset(), part.len()), (1_000_001, 1_000_002));
    assert_eq!(&part.map()?[..], &data[1_000_001..2_000_003]);
    assert_eq!(part.meta().cache.as_deref(), Some("hit"));

    // A member of a cold .tar shard: the shard is filled, the member is a slice of it.
    let samples: Vec<(String, Vec<u8>)> = (0..6)
        .map(|i| {
            (
                format!("s/{i:04}.bin"),
                Pattern::new(40 + i).bytes(0, 5_000 + 70_001 * i as usize),
            )
        })
        .collect();
    std::fs::write(origin.join("shard-0001.tar"), tar_of(&samples))?;
    for (name, bytes) in &samples {
        let opts = GetOptions {
            archpath: Some(name.clone()),
            ..GetOptions::default()
        };
        let got = local.get_local_with(BUCKET, "shard-0001.tar", &opts)?;
        assert!(got.is_mapped(), "{name}");
        assert_eq!(&got[..], &bytes[..], "{name}");
    }
    // A transform's result, computed once and handed over like any cached object.
    std::fs::write(origin.join("text.txt"), b"hello, local reader")?;
    let opts = GetOptions {
        transform: Some("upper".into()),
        ..GetOptions::default()
    };
    for _ in 0..2 {
        let got = local.get_local_with(BUCKET, "text.txt", &opts)?;
        assert!(got.is_mapped());
        assert_eq!(&got[..], b"HELLO, LOCAL READER");
    }
    let stats = server.stats()?;
    assert_eq!(stats["transforms_run"], 1);
    let wanted = objs.len() * 2 + 1 + samples.len() + 2;
    assert_eq!(stats["local_reads"], wanted as u64, "{stats}");

    // Missing objects and bad ranges are the usual errors.
    let e = local.get_local(BUCKET, "no/such/key").unwrap_err();
    assert_eq!((e.status(), e.code()), (Some(404), Some("NoSuchKey")));
    let far = GetOptions {
        range: Some(10_000_000..10_000_010),
        ..GetOptions::default()
    };
    let e = local.get_local_with(BUCKET, key, &far).unwrap_err();
    assert_eq!((e.status(), e.code()), (Some(416), Some("InvalidRange")));
    Ok(())
}

/// A client that copies the range out only where it finds it resident
/// (`x-granary-local: fd-resident`, `Client::get_resident`) gets it brought in, and the
/// checksums of its blocks to check its copy against; windows the node sealed (locked in
/// memory, checked) are not checked again for it. Neither that client nor one that maps
/// the file (`fd`) unseals anything: the node's next hits still send every window as
/// checked before.
#[test]
fn copies_out_of_the_cache_file_are_checked_by_the_client_and_leave_it_sealed() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (server, sock) = start(dir.path(), ServerOpts::open())?;
    let mut local = unix_client(&sock);
    local.create_bucket(BUCKET)?;
    // Three whole 4 MiB windows of the mapped hit path.
    let data = Pattern::new(91).bytes(0, 12 << 20);
    local.put_bytes(BUCKET, "obj", &data)?;
    let mut tcp = Client::new(&server.url())?.with_socket_offers(false);
    let counts = || -> Result<(u64, u64, u64)> {
        let s = server.stats()?;
        let n = |k: &str| s[k].as_u64().unwrap_or_else(|| panic!("{k} in {s}"));
        Ok((
            n("local_reads"),
            n("bytes_checked"),
            n("bytes_checked_earlier"),
        ))
    };
    // The first hit seals every window: locked, then checked.
    assert!(tcp.get(BUCKET, "obj")? == data);
    let sealed = server.stat("locked_bytes");
    if sealed == 0 {
        granary_tests::skip("the node may not lock memory here (RLIMIT_MEMLOCK without CAP_IPC_LOCK): nothing is sealed");
        assert!(local.get_resident(BUCKET, "obj", &GetOptions::default())? == data);
        return Ok(());
    }
    assert_eq!(sealed, data.len() as u64, "every window sealed");
    let (reads0, checked0, _) = counts()?;

    let part = GetOptions {
        range: Some(1_000_000..9_000_001),
        ..GetOptions::default()
    };
    let got = local.get_resident(BUCKET, "obj", &part)?;
    assert!(got == data[1_000_000..9_000_001], "the range's bytes");
    let (reads1, checked1, earlier1) = counts()?;
    assert_eq!(reads1 - reads0, 1, "copied out of the file the node passed");
    assert_eq!(
        checked1, checked0,
        "its windows were sealed: not checked again"
    );
    assert!(tcp.get(BUCKET, "obj")? == data);
    let (_, _, earlier2) = counts()?;
    assert_eq!(earlier2 - earlier1, data.len() as u64, "still sealed whole");

    let Local::File(file) = local.open_local(BUCKET, "obj", &GetOptions::default())? else {
        panic!("no descriptor for a cached object");
    };
    assert!(file.map()?[..] == data[..]);
    for _ in 0..2 {
        assert!(tcp.get(BUCKET, "obj")? == data);
    }
    let (reads3, checked3, earlier3) = counts()?;
    assert_eq!(reads3 - reads1, 1);
    assert_eq!(
        (checked3 - checked1, earlier3 - earlier2),
        (0, 2 * data.len() as u64),
        "a mapping reader cannot change locked pages: still sealed"
    );
    assert!(local.get_resident(BUCKET, "obj", &GetOptions::default())? == data);
    Ok(())
}

#[test]
fn the_descriptor_cannot_write_the_cache_file() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (server, sock) = start(dir.path(), ServerOpts::open())?;
    let mut tcp = Client::new(&server.url())?;
    tcp.create_bucket(BUCKET)?;
    let data = Pattern::new(3).bytes(0, 200_000);
    tcp.put_bytes(BUCKET, "obj", &data)?;
    let mut local = unix_client(&sock);
    let Local::File(file) = local.open_local(BUCKET, "obj", &GetOptions::default())? else {
        panic!("no descriptor");
    };
    let fd: BorrowedFd<'_> = file.fd();
    let raw = fd.as_raw_fd();
    // SAFETY: plain system calls on a descriptor this test owns; failures are expected.
    unsafe {
        let flags = libc::fcntl(raw, libc::F_GETFL);
        assert_eq!(
            flags & libc::O_ACCMODE,
            libc::O_RDONLY,
            "opened for reading only"
        );
        let junk = [0xAAu8; 64];
        assert_eq!(libc::pwrite(raw, junk.as_ptr().cast(), junk.len(), 0), -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EBADF)
        );
        assert_eq!(libc::ftruncate(raw, 0), -1);
        let writable = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            raw,
            0,
        );
        assert_eq!(writable, libc::MAP_FAILED, "a shared writable mapping");
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EACCES)
        );
    }
    drop(file);
    // The entry is intact: mapped again, and streamed with its checksums checked.
    let again = local.get_local(BUCKET, "obj")?;
    assert!(again.is_mapped());
    assert_eq!(&again[..], &data[..]);
    assert_eq!(tcp.get(BUCKET, "obj")?, data);
    Ok(())
}

#[test]
fn local_reads_follow_the_access_rules_of_http() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (server, sock) = start(dir.path(), ServerOpts::with_credentials())?;
    let mut writer = signed(Client::new(&server.url())?);
    writer.create_bucket(BUCKET)?;
    let data = Pattern::new(9).bytes(0, 70_000);
    writer.put_bytes(BUCKET, "private", &data)?;

    let e = unix_client(&sock).open_local(BUCKET, "private", &GetOptions::default());
    let e = e.expect_err("an unsigned local read of a private object");
    assert_eq!(
        (e.status(), e.code()),
        (Some(403), Some("AccessDenied")),
        "{e}"
    );
    let wrong = unix_client(&sock).with_credentials(ACCESS, "not-the-secret", "us-east-1");
    let e = wrong.fresh().get_local(BUCKET, "private").unwrap_err();
    assert_eq!(e.status(), Some(403), "{e}");
    assert_eq!(e.code(), Some("SignatureDoesNotMatch"), "{e}");
    let got = signed(unix_client(&sock)).get_local(BUCKET, "private")?;
    assert!(got.is_mapped());
    assert_eq!(&got[..], &data[..]);
    assert_eq!(server.stats()?["local_reads"], 1);
    drop(server);

    // With --anonymous-read, unsigned local reads are allowed (and writes are not).
    let dir = tempfile::tempdir()?;
    let opts = ServerOpts {
        credentials: true,
        anonymous_read: true,
        ..ServerOpts::default()
    };
    let (server, sock) = start(dir.path(), opts)?;
    let mut writer = signed(Client::new(&server.url())?);
    writer.create_bucket(BUCKET)?;
    writer.put_bytes(BUCKET, "public", &data)?;
    let mut anon = unix_client(&sock);
    let got = anon.get_local(BUCKET, "public")?;
    assert!(got.is_mapped());
    assert_eq!(&got[..], &data[..]);
    let e = anon.put_bytes(BUCKET, "other", b"x").unwrap_err();
    assert_eq!(e.status(), Some(403));
    Ok(())
}

#[test]
fn without_a_descriptor_local_reads_fall_back_to_http() -> Result<()> {
    // No socket on this machine: the endpoint answers over TCP.
    let dir = tempfile::tempdir()?;
    let (server, sock) = start(
        dir.path(),
        ServerOpts::open().args(&["--cache-capacity", "1000000"]),
    )?;
    let mut tcp = Client::new(&server.url())?;
    tcp.create_bucket(BUCKET)?;
    let small = Pattern::new(1).bytes(0, 100_000);
    let big = Pattern::new(2).bytes(0, 1_500_000);
    tcp.put_bytes(BUCKET, "small", &small)?;
    tcp.put_bytes(BUCKET, "big", &big)?;
    let mut away = Client::new(&server.url())?.with_local_socket(dir.path().join("absent.sock"));
    let got = away.get_local(BUCKET, "small")?;
    assert!(matches!(got, LocalBytes::Fetched(_)));
    assert_eq!(&got[..], &small[..]);
    // The socket is there: the same client maps.
    let mut near = Client::new(&server.url())?.with_local_socket(&sock);
    let got = near.get_local(BUCKET, "small")?;
    assert!(got.is_mapped());
    assert_eq!(&got[..], &small[..]);
    // Larger than the cache can ever admit: the bytes come in the answer.
    for _ in 0..2 {
        let got = near.get_local(BUCKET, "big")?;
        assert!(!got.is_mapped());
        assert_eq!(&got[..], &big[..]);
    }
    drop(server);

    // Two nodes: a key the other node owns comes over HTTP through this node's socket.
    let dir = tempfile::tempdir()?;
    let (a, _b, sock) = two_nodes(dir.path())?;
    let mut tcp = Client::new(&a.url())?;
    tcp.create_bucket(BUCKET)?;
    let mut mine = None;
    let mut theirs = None;
    for i in 0..64 {
        let key = format!("k{i}");
        match owner(&a, &key)?.as_str() {
            "a" if mine.is_none() => mine = Some(key),
            "b" if theirs.is_none() => theirs = Some(key),
            _ => {}
        }
    }
    let (mine, theirs) = (mine.expect("a key of a"), theirs.expect("a key of b"));
    let data = Pattern::new(77).bytes(0, 250_000);
    tcp.put_bytes(BUCKET, &mine, &data)?;
    tcp.put_bytes(BUCKET, &theirs, &data)?;
    let mut local = unix_client(&sock);
    let got = local.get_local(BUCKET, &mine)?;
    assert!(got.is_mapped(), "a key this node owns");
    assert_eq!(&got[..], &data[..]);
    let got = local.get_local(BUCKET, &theirs)?;
    assert!(!got.is_mapped(), "a key the other node owns");
    assert_eq!(&got[..], &data[..]);
    Ok(())
}

/// Two nodes of one cluster over an fs backend in `dir`: `a`, also serving on the
/// returned socket, and `b`, on TCP only.
fn two_nodes(dir: &Path) -> Result<(Server, Server, PathBuf)> {
    let sock = dir.join("a.sock");
    let addrs = reserve_ports(2)?;
    let peers = [
        "--peer".to_owned(),
        format!("a=http://{}", addrs[0]),
        "--peer".to_owned(),
        format!("b=http://{}", addrs[1]),
    ];
    let peers: Vec<&str> = peers.iter().map(String::as_str).collect();
    let backend = format!("fs:{}", dir.join("origin").display());
    let shared = ServerOpts::open()
        .args(&["--backend", &backend])
        .args(&peers);
    let (a_opts, b_opts) = (shared.clone().listen(addrs[0]), shared.listen(addrs[1]));
    let a =
        Server::start(a_opts.args(&["--node-id", "a", "--listen-unix", sock.to_str().unwrap()]))?;
    let b = Server::start(b_opts.args(&["--node-id", "b"]))?;
    Server::wait_cluster_up(&[&a, &b], Duration::from_secs(20))?;
    Ok((a, b, sock))
}

/// The member that owns `key` in `BUCKET`, as `node` sees the ring.
fn owner(node: &Server, key: &str) -> Result<String> {
    Ok(node.cluster_view(Some((BUCKET, key)))?["owner"]
        .as_str()
        .unwrap_or("")
        .to_owned())
}

/// A dataset read through a node on this machine without fetching its runs ahead (as a
/// DataLoader worker reads) copies them out of the node's cache file, and starts its
/// read-ahead threads only once a run comes from another member. The
/// runs read here before the switch (out of order: a shuffle buffer wider than a shard)
/// and those the threads fetch after it are every sample of the plan once, in order, with
/// their bytes.
#[test]
fn a_dataset_read_here_and_from_another_member_yields_its_plan() -> Result<()> {
    const PER_SHARD: usize = 3;
    let size_of = |s: usize, i: usize| 1_000 + (s * 7_919 + i * 104_729) % 60_000;
    let dir = tempfile::tempdir()?;
    let (a, _b, _sock) = two_nodes(dir.path())?;
    let mut tcp = Client::new(&a.url())?;
    tcp.create_bucket(BUCKET)?;
    // In key order (shards not shuffled): 10 shards of this node, then 10 of either.
    let mut keys = Vec::new();
    for n in 0.. {
        let key = format!("ds/a{n:03}.tar");
        if keys.len() < 10 && owner(&a, &key)? == "a" {
            keys.push(key);
        }
        if keys.len() == 10 {
            break;
        }
    }
    let mut others = 0;
    for n in 0..10 {
        let key = format!("ds/b{n:03}.tar");
        others += usize::from(owner(&a, &key)? == "b");
        keys.push(key);
    }
    assert!(others > 0, "a shard of the other member among {keys:?}");
    for (s, key) in keys.iter().enumerate() {
        let members: Vec<(String, Vec<u8>)> = (0..PER_SHARD)
            .map(|i| {
                let bin = Pattern::new((s * PER_SHARD + i) as u64).bytes(0, size_of(s, i));
                (format!("s{s:02}/{i:03}.bin"), bin)
            })
            .collect();
        tcp.put_bytes(BUCKET, key, &tar_of(&members))?;
    }
    for (read_ahead, buffer) in [(2, 7), (1, 0), (0, 7)] {
        let ds = granary_client::Dataset::builder()
            .endpoint(&a.url())
            .bucket(BUCKET)
            .prefix("ds/")
            .shuffle_shards(false)
            .read_ahead(read_ahead)
            .read_ahead_here(false)
            .shuffle_buffer(buffer)
            .build()?;
        let planned: Vec<String> = ds
            .plan(1)?
            .iter()
            .map(|id| format!("s{:02}/{:03}", id.shard, id.index))
            .collect();
        assert_eq!(planned.len(), keys.len() * PER_SHARD);
        let mut read = Vec::new();
        for sample in ds.epoch(1) {
            let sample = sample?;
            let (s, i) = sample.key.split_once('/').unwrap();
            let (s, i): (usize, usize) = (s[1..].parse()?, i.parse()?);
            let want = Pattern::new((s * PER_SHARD + i) as u64).bytes(0, size_of(s, i));
            assert!(sample.fields["bin"] == want, "{}", sample.key);
            read.push(sample.key);
        }
        assert_eq!(
            read, planned,
            "read_ahead {read_ahead}, shuffle buffer {buffer}"
        );
    }
    Ok(())
}

/// A dataset read through a node on this machine copies each member straight out of the
/// node's cache file where its pages are in memory. A member whose pages left memory
/// after the node checked its run is asked of the node again, which reads them in and
/// checks them: a block damaged on the disk meanwhile is never delivered. The node drops
/// the damaged entry, and the pages it read in and refused stay in memory: the members
/// after it are asked of the node too (the file is no longer the node's), and every
/// member comes whole.
#[test]
fn a_member_whose_pages_left_memory_is_read_through_the_node() -> Result<()> {
    const MEMBER: usize = 256 << 10;
    let dir = tempfile::tempdir()?;
    let backend = format!("fs:{}", dir.path().join("origin").display());
    let (server, sock) = start(
        dir.path(),
        ServerOpts::open().args(&["--backend", &backend]),
    )?;
    let mut c = unix_client(&sock);
    c.create_bucket(BUCKET)?;
    let members: Vec<(String, Vec<u8>)> = (0..6)
        .map(|i| {
            (
                format!("s/{i:03}.bin"),
                Pattern::new(500 + i).bytes(0, MEMBER),
            )
        })
        .collect();
    // Each sample a member of 256 KiB and an empty one.
    let with_empty: Vec<(String, Vec<u8>)> = members
        .iter()
        .flat_map(|(name, bin)| {
            let empty = (name.replace(".bin", ".cls"), Vec::new());
            [(name.clone(), bin.clone()), empty]
        })
        .collect();
    let key = "ds/only.tar";
    c.put_bytes(BUCKET, key, &tar_of(&with_empty))?;
    let ds = granary_client::Dataset::builder()
        .endpoint(&format!("unix:{}", sock.display()))
        .bucket(BUCKET)
        .prefix("ds/")
        .shuffle_shards(false)
        .shuffle_buffer(0)
        .read_ahead(0)
        .build()?;
    let mut epoch = ds.epoch(0);
    let first = epoch.next().expect("a sample")?;
    assert!(first.fields["bin"] == members[0].1, "{}", first.key);

    // The run is mapped, its first member copied out. Member 4's bytes are damaged on
    // the disk, and its pages dropped from memory.
    let Local::File(f) = c.open_local(BUCKET, key, &GetOptions::default())? else {
        panic!("no descriptor for a cached shard");
    };
    let at = f.offset() + 4 * (512 + MEMBER as u64 + 512) + 512 + 1000;
    drop(f);
    let entries = granary_tests::disk::cache_entries(&server.data_dir().join("cache"));
    let [entry] = entries.as_slice() else {
        panic!("one entry expected, found {entries:?}")
    };
    if !granary_tests::disk::damage_on_disk(entry, at)? {
        granary_tests::skip(
            "this filesystem refuses O_DIRECT: nothing to damage around the page cache",
        );
        return Ok(());
    }
    let (checked, misses) = (server.stat("bytes_checked"), server.stat("misses"));
    for (i, sample) in epoch.enumerate() {
        let sample = sample?;
        assert_eq!(sample.key, format!("s/{:03}", i + 1));
        assert!(sample.fields["bin"] == members[i + 1].1, "{}", sample.key);
        assert_eq!(sample.fields["cls"], b"", "{}", sample.key);
    }
    assert!(
        server.stat("bytes_checked") > checked,
        "the node read the dropped pages in again and checked them"
    );
    assert!(
        server.stat("misses") > misses,
        "it dropped the damaged entry: the members after it were read anew"
    );
    Ok(())
}
