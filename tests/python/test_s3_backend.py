"""Granary over the S3 backend: a real `moto_server` is the object store, Granary runs
with `--backend s3 --s3-endpoint <moto>` as an open node, boto3 drives Granary, and a
second boto3 client talks to moto directly to check what landed there.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError

from conftest import (MOTO_KEY, GranaryServer, _free_port, wait_healthy,
                      _server_binary, _stop_process, make_s3_client)
from granary_testutil import MiB, md5_hex, multipart_etag, unique_bucket_name

HTTP_TIMEOUT = 30


def error_of(exc: ClientError) -> tuple[str, int]:
    return (exc.response.get("Error", {}).get("Code"),
            exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode"))


def status_of(resp) -> int:
    return resp["ResponseMetadata"]["HTTPStatusCode"]




def _start_granary(root: Path, s3_endpoint: str) -> GranaryServer:
    binary = _server_binary()
    if not binary.is_file() or not os.access(binary, os.X_OK):
        pytest.fail(f"granary server binary not found at {binary} "
                    "(build it with `cargo build --release -p granary-server` or set GRANARY_BIN)",
                    pytrace=False)
    data_dir = root / "data"
    data_dir.mkdir()
    log_path = root / "granary.log"
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRANARY_")}
    env.update({
        "AWS_ACCESS_KEY_ID": MOTO_KEY,
        "AWS_SECRET_ACCESS_KEY": MOTO_KEY,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "RUST_LOG": env.get("RUST_LOG", "info"),
    })
    cmd = [str(binary), "serve", "--backend", "s3", "--s3-endpoint", s3_endpoint,
           "--data-dir", str(data_dir), "--listen", f"127.0.0.1:{port}"]
    log = open(log_path, "ab")
    proc = subprocess.Popen(cmd, cwd=str(root), env=env, stdin=subprocess.DEVNULL,
                            stdout=log, stderr=subprocess.STDOUT)
    log.close()
    endpoint = f"http://127.0.0.1:{port}"
    why = wait_healthy(endpoint, proc)
    if why is None:
        return GranaryServer(endpoint=endpoint, host="127.0.0.1", port=port,
                             data_dir=data_dir, log_path=log_path, pid=proc.pid, process=proc)
    rc = proc.poll()
    _stop_process(proc)
    pytest.fail(f"granary (s3 backend) did not become healthy: {why} (exit code {rc}); "
                f"cmd: {' '.join(cmd)}\n{log_path.read_text('utf-8', 'replace')[-5000:]}",
                pytrace=False)


@pytest.fixture(scope="module")
def granary_s3(moto_endpoint, tmp_path_factory) -> GranaryServer:
    server = _start_granary(tmp_path_factory.mktemp("granary-s3"), moto_endpoint)
    try:
        yield server
    finally:
        _stop_process(server.process)


@pytest.fixture(scope="module")
def gs3(granary_s3):
    """boto3 pointed at Granary (an open node: any key signs)."""
    return make_s3_client(granary_s3.endpoint, access_key=MOTO_KEY, secret_key=MOTO_KEY)


@pytest.fixture(scope="module")
def moto(moto_endpoint):
    """boto3 pointed straight at moto."""
    return make_s3_client(moto_endpoint, access_key=MOTO_KEY, secret_key=MOTO_KEY)


@pytest.fixture
def bkt(gs3, request) -> str:
    name = unique_bucket_name("s3b-" + request.node.name.replace("test_", "", 1))
    gs3.create_bucket(Bucket=name)
    return name


# --------------------------------------------------------------------------
# buckets and objects
# --------------------------------------------------------------------------
def test_create_bucket_lands_in_moto(gs3, moto):
    name = unique_bucket_name("s3b-create")
    assert status_of(gs3.create_bucket(Bucket=name)) == 200
    assert name in [b["Name"] for b in moto.list_buckets()["Buckets"]]
    assert name in [b["Name"] for b in gs3.list_buckets()["Buckets"]]
    assert status_of(gs3.head_bucket(Bucket=name)) == 200
    assert status_of(gs3.delete_bucket(Bucket=name)) == 204
    assert name not in [b["Name"] for b in moto.list_buckets()["Buckets"]]


def test_put_get_round_trip_matches_moto(gs3, moto, bkt):
    data = os.urandom(1 * MiB + 4321)
    put = gs3.put_object(Bucket=bkt, Key="a/obj.bin", Body=data, ContentType="text/x-test",
                         CacheControl="max-age=60", Metadata={"Owner": "me"})
    assert put["ETag"] == f'"{md5_hex(data)}"'
    direct = moto.get_object(Bucket=bkt, Key="a/obj.bin")
    assert direct["Body"].read() == data
    assert direct["ETag"] == put["ETag"]
    assert direct["ContentType"] == "text/x-test"
    assert direct["Metadata"] == {"owner": "me"}

    got = gs3.get_object(Bucket=bkt, Key="a/obj.bin")
    assert status_of(got) == 200
    assert got["Body"].read() == data
    assert got["ETag"] == direct["ETag"]
    assert got["ContentLength"] == len(data)
    assert got["ContentType"] == "text/x-test"
    assert got["CacheControl"] == "max-age=60"
    assert got["Metadata"] == {"owner": "me"}

    # An object written to moto directly is served as is.
    body = b"from moto\n"
    moto.put_object(Bucket=bkt, Key="direct.txt", Body=body)
    got = gs3.get_object(Bucket=bkt, Key="direct.txt")
    assert got["Body"].read() == body
    assert got["ETag"] == f'"{md5_hex(body)}"'


def test_empty_object(gs3, moto, bkt):
    gs3.put_object(Bucket=bkt, Key="empty", Body=b"")
    assert moto.head_object(Bucket=bkt, Key="empty")["ContentLength"] == 0
    got = gs3.get_object(Bucket=bkt, Key="empty")
    assert got["Body"].read() == b""
    assert got["ETag"] == f'"{md5_hex(b"")}"'


@pytest.mark.parametrize("spec,start,end", [
    ("bytes=0-99", 0, 100),
    ("bytes=-10", 4086, 4096),
    ("bytes=100-", 100, 4096),
    ("bytes=4000-9999", 4000, 4096),
])
def test_ranges(gs3, bkt, spec, start, end):
    data = os.urandom(4096)
    gs3.put_object(Bucket=bkt, Key="r.bin", Body=data)
    got = gs3.get_object(Bucket=bkt, Key="r.bin", Range=spec)
    assert status_of(got) == 206
    assert got["Body"].read() == data[start:end]
    assert got["ContentLength"] == end - start
    assert got["ContentRange"] == f"bytes {start}-{end - 1}/4096"


def test_unsatisfiable_range_is_416(gs3, bkt):
    gs3.put_object(Bucket=bkt, Key="r.bin", Body=b"x" * 100)
    with pytest.raises(ClientError) as ei:
        gs3.get_object(Bucket=bkt, Key="r.bin", Range="bytes=100-200")
    assert error_of(ei.value) == ("InvalidRange", 416)


def test_conditional_get(gs3, bkt):
    data = b"conditional body"
    etag = gs3.put_object(Bucket=bkt, Key="c", Body=data)["ETag"]
    with pytest.raises(ClientError) as ei:
        gs3.get_object(Bucket=bkt, Key="c", IfNoneMatch=etag)
    assert error_of(ei.value)[1] == 304
    with pytest.raises(ClientError) as ei:
        gs3.get_object(Bucket=bkt, Key="c", IfMatch='"0123456789abcdef0123456789abcdef"')
    assert error_of(ei.value) == ("PreconditionFailed", 412)
    got = gs3.get_object(Bucket=bkt, Key="c", IfMatch=etag)
    assert got["Body"].read() == data


def test_head_object_matches_moto(gs3, moto, bkt):
    data = os.urandom(12345)
    gs3.put_object(Bucket=bkt, Key="h", Body=data)
    mine = gs3.head_object(Bucket=bkt, Key="h")
    theirs = moto.head_object(Bucket=bkt, Key="h")
    assert mine["ContentLength"] == theirs["ContentLength"] == 12345
    assert mine["ETag"] == theirs["ETag"] == f'"{md5_hex(data)}"'
    assert mine["LastModified"] == theirs["LastModified"]


def test_list_objects_v2_prefix_delimiter_and_pages(gs3, moto, bkt):
    keys = [f"dir{i % 3}/k{i:04d}" for i in range(270)] + [f"top{i:02d}" for i in range(30)]
    for k in keys:
        moto.put_object(Bucket=bkt, Key=k, Body=k.encode())
    keys.sort()

    # Every key once, in order, over pages of 37.
    seen, token, pages = [], None, 0
    while True:
        kw = {"Bucket": bkt, "MaxKeys": 37}
        if token:
            kw["ContinuationToken"] = token
        page = gs3.list_objects_v2(**kw)
        pages += 1
        seen += [o["Key"] for o in page.get("Contents", [])]
        assert page["KeyCount"] <= 37
        if not page["IsTruncated"]:
            break
        token = page["NextContinuationToken"]
    assert seen == keys
    assert pages == 9  # ceil(300 / 37)

    # Sizes and ETags are moto's.
    direct = {o["Key"]: o for o in moto.list_objects_v2(Bucket=bkt, Prefix="dir1/")["Contents"]}
    mine = gs3.list_objects_v2(Bucket=bkt, Prefix="dir1/")["Contents"]
    assert [o["Key"] for o in mine] == sorted(direct)
    assert len(mine) == 90
    for o in mine:
        assert o["Size"] == direct[o["Key"]]["Size"] == len(o["Key"])
        assert o["ETag"] == direct[o["Key"]]["ETag"]

    # Delimiter: three common prefixes and the top-level keys.
    page = gs3.list_objects_v2(Bucket=bkt, Delimiter="/")
    assert [p["Prefix"] for p in page["CommonPrefixes"]] == ["dir0/", "dir1/", "dir2/"]
    assert [o["Key"] for o in page["Contents"]] == [f"top{i:02d}" for i in range(30)]

    # Delimiter with pages of 2: every prefix and key once, in order.
    entries, token = [], None
    while True:
        kw = {"Bucket": bkt, "MaxKeys": 2, "Delimiter": "/"}
        if token:
            kw["ContinuationToken"] = token
        page = gs3.list_objects_v2(**kw)
        names = [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        names += [o["Key"] for o in page.get("Contents", [])]
        assert 1 <= len(names) <= 2
        entries += sorted(names)
        if not page["IsTruncated"]:
            break
        token = page["NextContinuationToken"]
    assert entries == ["dir0/", "dir1/", "dir2/"] + [f"top{i:02d}" for i in range(30)]

    # Paginator with a prefix, through boto3's own paging.
    pager = gs3.get_paginator("list_objects_v2")
    got = [o["Key"] for p in pager.paginate(Bucket=bkt, Prefix="dir2/",
                                            PaginationConfig={"PageSize": 25})
           for o in p.get("Contents", [])]
    assert got == [k for k in keys if k.startswith("dir2/")]


def test_copy_object(gs3, moto, bkt):
    data = os.urandom(300 * 1024)
    src = gs3.put_object(Bucket=bkt, Key="src", Body=data)
    out = gs3.copy_object(Bucket=bkt, Key="dst", CopySource={"Bucket": bkt, "Key": "src"})
    assert out["CopyObjectResult"]["ETag"] == src["ETag"]
    direct = moto.get_object(Bucket=bkt, Key="dst")
    assert direct["Body"].read() == data
    assert direct["ETag"] == src["ETag"]


def test_delete_object_and_objects(gs3, moto, bkt):
    for k in ["d1", "d2", "d3", "keep"]:
        gs3.put_object(Bucket=bkt, Key=k, Body=k.encode())
    assert status_of(gs3.delete_object(Bucket=bkt, Key="d1")) == 204
    with pytest.raises(ClientError) as ei:
        moto.head_object(Bucket=bkt, Key="d1")
    assert error_of(ei.value)[1] == 404
    # Deleting a missing key is not an error.
    assert status_of(gs3.delete_object(Bucket=bkt, Key="d1")) == 204
    out = gs3.delete_objects(Bucket=bkt, Delete={"Objects": [{"Key": "d2"}, {"Key": "d3"}]})
    assert sorted(d["Key"] for d in out["Deleted"]) == ["d2", "d3"]
    assert out.get("Errors", []) == []
    assert [o["Key"] for o in moto.list_objects_v2(Bucket=bkt)["Contents"]] == ["keep"]


@pytest.mark.parametrize("key", [" ", "  \t", "dir/ "])
def test_a_key_of_white_space_round_trips(gs3, moto, bkt, key):
    """S3 stores a key of white space alone; aws-sdk-s3 refuses to send one (it takes it
    for an unset key), so the backend sends a stand-in and puts the key back into the
    signed path. Written, read whole and by range, listed, copied, deleted one by one and
    in a batch: every answer and what lands in moto."""
    data = os.urandom(70 * 1024)
    put = gs3.put_object(Bucket=bkt, Key=key, Body=data)
    assert moto.get_object(Bucket=bkt, Key=key)["Body"].read() == data
    assert gs3.get_object(Bucket=bkt, Key=key)["Body"].read() == data
    assert gs3.get_object(Bucket=bkt, Key=key, Range="bytes=5-9")["Body"].read() == data[5:10]
    head = gs3.head_object(Bucket=bkt, Key=key)
    assert (head["ETag"], head["ContentLength"]) == (put["ETag"], len(data))
    assert [o["Key"] for o in gs3.list_objects_v2(Bucket=bkt)["Contents"]] == [key]
    gs3.copy_object(Bucket=bkt, Key="copy", CopySource={"Bucket": bkt, "Key": key})
    assert moto.get_object(Bucket=bkt, Key="copy")["Body"].read() == data
    up = gs3.create_multipart_upload(Bucket=bkt, Key=key)["UploadId"]
    part = gs3.upload_part(Bucket=bkt, Key=key, UploadId=up, PartNumber=1, Body=b"m" * 1000)
    assert [p["PartNumber"] for p in
            gs3.list_parts(Bucket=bkt, Key=key, UploadId=up)["Parts"]] == [1]
    gs3.complete_multipart_upload(Bucket=bkt, Key=key, UploadId=up, MultipartUpload={
        "Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]})
    assert gs3.get_object(Bucket=bkt, Key=key)["Body"].read() == b"m" * 1000
    assert status_of(gs3.delete_object(Bucket=bkt, Key=key)) == 204
    with pytest.raises(ClientError) as ei:
        moto.head_object(Bucket=bkt, Key=key)
    assert error_of(ei.value)[1] == 404
    gs3.put_object(Bucket=bkt, Key=key, Body=b"again")
    out = gs3.delete_objects(Bucket=bkt, Delete={"Objects": [{"Key": key}, {"Key": "copy"}]})
    assert out.get("Errors", []) == []
    assert sorted(d["Key"] for d in out["Deleted"]) == sorted([key, "copy"])
    assert moto.list_objects_v2(Bucket=bkt).get("Contents", []) == []


def test_multipart_upload_file_20mib(gs3, moto, bkt, tmp_path):
    data = os.urandom(20 * MiB)
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    cfg = TransferConfig(multipart_threshold=8 * MiB, multipart_chunksize=8 * MiB,
                         max_concurrency=4)
    gs3.upload_file(str(path), bkt, "mp/big.bin", Config=cfg)
    want = multipart_etag(data, 8 * MiB)
    assert want.endswith('-3"')
    assert moto.head_object(Bucket=bkt, Key="mp/big.bin")["ETag"] == want
    head = gs3.head_object(Bucket=bkt, Key="mp/big.bin")
    assert head["ETag"] == want
    assert head["ContentLength"] == 20 * MiB
    got = gs3.get_object(Bucket=bkt, Key="mp/big.bin")["Body"].read()
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()


def test_multipart_list_parts_and_abort(gs3, moto, bkt):
    up = gs3.create_multipart_upload(Bucket=bkt, Key="ab", ContentType="text/plain")
    uid = up["UploadId"]
    part = gs3.upload_part(Bucket=bkt, Key="ab", UploadId=uid, PartNumber=1, Body=b"p" * 1000)
    assert part["ETag"] == f'"{md5_hex(b"p" * 1000)}"'
    parts = gs3.list_parts(Bucket=bkt, Key="ab", UploadId=uid)["Parts"]
    assert [(p["PartNumber"], p["Size"], p["ETag"]) for p in parts] == [(1, 1000, part["ETag"])]
    assert [u["UploadId"] for u in moto.list_multipart_uploads(Bucket=bkt)["Uploads"]] == [uid]
    mine = gs3.list_multipart_uploads(Bucket=bkt)["Uploads"]
    assert [(u["Key"], u["UploadId"]) for u in mine] == [("ab", uid)]
    assert status_of(gs3.abort_multipart_upload(Bucket=bkt, Key="ab", UploadId=uid)) == 204
    assert moto.list_multipart_uploads(Bucket=bkt).get("Uploads", []) == []
    # (moto answers UploadPart to an aborted upload with a bare 500, which Granary
    # reports as 503; ListParts and AbortMultipartUpload get S3's NoSuchUpload.)
    with pytest.raises(ClientError) as ei:
        gs3.list_parts(Bucket=bkt, Key="ab", UploadId=uid)
    assert error_of(ei.value) == ("NoSuchUpload", 404)
    with pytest.raises(ClientError) as ei:
        gs3.abort_multipart_upload(Bucket=bkt, Key="ab", UploadId=uid)
    assert error_of(ei.value) == ("NoSuchUpload", 404)


def test_multipart_small_part_is_entity_too_small(gs3, bkt):
    uid = gs3.create_multipart_upload(Bucket=bkt, Key="small")["UploadId"]
    p1 = gs3.upload_part(Bucket=bkt, Key="small", UploadId=uid, PartNumber=1, Body=b"a" * 100)
    p2 = gs3.upload_part(Bucket=bkt, Key="small", UploadId=uid, PartNumber=2, Body=b"b" * 100)
    with pytest.raises(ClientError) as ei:
        gs3.complete_multipart_upload(
            Bucket=bkt, Key="small", UploadId=uid,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": p1["ETag"]},
                                       {"PartNumber": 2, "ETag": p2["ETag"]}]})
    assert error_of(ei.value) == ("EntityTooSmall", 400)


def test_bad_content_md5_is_bad_digest(gs3, moto, bkt):
    import base64
    wrong = base64.b64encode(hashlib.md5(b"other").digest()).decode()
    with pytest.raises(ClientError) as ei:
        gs3.put_object(Bucket=bkt, Key="md5", Body=b"payload", ContentMD5=wrong)
    assert error_of(ei.value) == ("BadDigest", 400)
    with pytest.raises(ClientError) as ei:
        moto.head_object(Bucket=bkt, Key="md5")
    assert error_of(ei.value)[1] == 404


def test_missing_key_and_bucket(gs3, bkt):
    with pytest.raises(ClientError) as ei:
        gs3.get_object(Bucket=bkt, Key="nope")
    assert error_of(ei.value) == ("NoSuchKey", 404)
    with pytest.raises(ClientError) as ei:
        gs3.head_object(Bucket=bkt, Key="nope")
    assert error_of(ei.value)[1] == 404
    missing = unique_bucket_name("s3b-missing")
    with pytest.raises(ClientError) as ei:
        gs3.get_object(Bucket=missing, Key="k")
    assert error_of(ei.value) == ("NoSuchBucket", 404)
    with pytest.raises(ClientError) as ei:
        gs3.list_objects_v2(Bucket=missing)
    assert error_of(ei.value) == ("NoSuchBucket", 404)
    with pytest.raises(ClientError) as ei:
        gs3.put_object(Bucket=missing, Key="k", Body=b"x")
    assert error_of(ei.value) == ("NoSuchBucket", 404)


def test_get_by_part_number_over_the_s3_backend(gs3, bkt):
    """`?partNumber=N` over the S3 backend: the store is asked where part N lies (moto
    sends no `Content-Range`, so the lengths of the parts before it), and the part's
    bytes are read like any range."""
    from test_s3_fidelity import check_get_by_part_number
    check_get_by_part_number(gs3, bkt)


def test_an_unknown_upload_is_no_such_upload(gs3, moto, bkt):
    """Every way of naming an upload that does not exist is `404 NoSuchUpload` through
    Granary, as S3 answers (never a `503`, which clients retry); moto itself says so for
    two of them and fails the other two with `500`."""
    calls = {
        "upload_part": lambda c: c.upload_part(Bucket=bkt, Key="k", UploadId="nope",
                                               PartNumber=1, Body=b"x"),
        "list_parts": lambda c: c.list_parts(Bucket=bkt, Key="k", UploadId="nope"),
        "complete": lambda c: c.complete_multipart_upload(
            Bucket=bkt, Key="k", UploadId="nope",
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": '"' + "0" * 32 + '"'}]}),
        "abort": lambda c: c.abort_multipart_upload(Bucket=bkt, Key="k", UploadId="nope"),
    }
    for name, call in calls.items():
        seen = []
        for client in (moto, gs3):
            with pytest.raises(ClientError) as ei:
                call(client)
            seen.append(error_of(ei.value))
        assert seen[1] == ("NoSuchUpload", 404), (name, seen)
        assert seen[0] in (seen[1], ("500", 500)), (name, seen)


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_64mib_streams_both_ways(gs3, moto, granary_s3, bkt, tmp_path):
    size = 64 * MiB
    src = tmp_path / "src.bin"
    h = hashlib.sha256()
    with open(src, "wb") as f:
        for _ in range(size // MiB):
            chunk = os.urandom(MiB)
            h.update(chunk)
            f.write(chunk)
    want = h.hexdigest()
    rss_before = _peak_rss(granary_s3.pid)

    # In: one PutObject of 64 MiB through Granary.
    with open(src, "rb") as f:
        gs3.put_object(Bucket=bkt, Key="big/in.bin", Body=f)
    d = hashlib.sha256()
    body = moto.get_object(Bucket=bkt, Key="big/in.bin")["Body"]
    for chunk in iter(lambda: body.read(MiB), b""):
        d.update(chunk)
    assert d.hexdigest() == want

    # Out: an object written to moto, read through Granary in pieces.
    with open(src, "rb") as f:
        moto.put_object(Bucket=bkt, Key="big/out.bin", Body=f)
    got = gs3.get_object(Bucket=bkt, Key="big/out.bin")
    assert got["ContentLength"] == size
    d, n = hashlib.sha256(), 0
    for chunk in iter(lambda: got["Body"].read(MiB), b""):
        d.update(chunk)
        n += len(chunk)
    assert n == size
    assert d.hexdigest() == want

    # Neither direction held the object in memory.
    grew = _peak_rss(granary_s3.pid) - rss_before
    assert grew < 48 * MiB, f"granary's peak RSS grew by {grew / MiB:.1f} MiB"


# --------------------------------------------------------------------------
# a backend that is not there
# --------------------------------------------------------------------------
def test_unreachable_backend_answers_503(tmp_path):
    dead = f"http://127.0.0.1:{_free_port()}"  # nothing listens here
    server = _start_granary(tmp_path, dead)
    try:
        t0 = time.monotonic()
        r = requests.get(f"{server.endpoint}/some-bucket/some/key", timeout=60)
        elapsed = time.monotonic() - t0
        assert r.status_code == 503
        assert b"<Code>ServiceUnavailable</Code>" in r.content
        assert elapsed < 30, f"took {elapsed:.1f}s"
        r = requests.put(f"{server.endpoint}/some-bucket/k", data=b"abc", timeout=60)
        assert r.status_code == 503
        assert requests.get(f"{server.endpoint}/_granary/health", timeout=5).status_code == 200
        assert server.process.poll() is None
    finally:
        _stop_process(server.process)
    assert server.process.returncode in (0, -signal.SIGTERM)
