"""The AWS CLI (v1, from PyPI) against a real Granary server.

The CLI runs as a subprocess of this interpreter's venv with an isolated
HOME/config, the test credentials and `--endpoint-url`. It uses multipart
uploads (8 MiB parts) for every file over 8 MiB.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
import requests

from granary_testutil import MiB, md5_hex, multipart_etag, unique_bucket_name

LS_OBJECT_RE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) +(\d+) (.+)$")
LS_PREFIX_RE = re.compile(r"^ +PRE (.+)$")


def parse_ls(stdout: str) -> tuple[dict[str, int], list[str]]:
    """Parse `aws s3 ls` output into ({name: size}, [prefixes])."""
    objects: dict[str, int] = {}
    prefixes: list[str] = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        m = LS_PREFIX_RE.match(line)
        if m:
            prefixes.append(m.group(1))
            continue
        m = LS_OBJECT_RE.match(line)
        assert m, f"unparsable `aws s3 ls` line: {line!r}"
        name = m.group(3)
        assert name not in objects, f"{name!r} listed twice"
        objects[name] = int(m.group(2))
    return objects, prefixes


@pytest.fixture
def cli_bucket(aws_cli, bucket_name):
    """A bucket made with `aws s3 mb`."""
    res = aws_cli.run("s3", "mb", f"s3://{bucket_name}", timeout=60)
    assert res.stdout.strip() == f"make_bucket: {bucket_name}", res.describe()
    return bucket_name


def test_mb_ls_rb(aws_cli, s3, bucket_name):
    res = aws_cli.run("s3", "mb", f"s3://{bucket_name}", timeout=60)
    assert res.returncode == 0
    assert res.stdout.strip() == f"make_bucket: {bucket_name}"
    assert s3.head_bucket(Bucket=bucket_name)["ResponseMetadata"]["HTTPStatusCode"] == 200

    res = aws_cli.run("s3", "ls", timeout=60)
    names = [line.split(" ", 2)[-1] for line in res.stdout.splitlines() if line.strip()]
    assert bucket_name in names, res.describe()

    res = aws_cli.run("s3api", "head-bucket", "--bucket", bucket_name, timeout=60)
    assert res.returncode == 0

    res = aws_cli.run("s3", "rb", f"s3://{bucket_name}", timeout=60)
    assert res.stdout.strip() == f"remove_bucket: {bucket_name}"
    res = aws_cli.run("s3api", "head-bucket", "--bucket", bucket_name, check=False, timeout=60)
    assert res.returncode != 0
    assert "404" in res.stderr or "Not Found" in res.stderr, res.describe()


def test_cp_100mib_in_and_out(aws_cli, cli_bucket, tmp_path):
    data = os.urandom(100 * MiB)
    src = tmp_path / "hundred.bin"
    src.write_bytes(data)
    res = aws_cli.run("s3", "cp", "--no-progress", src, f"s3://{cli_bucket}/in/hundred.bin")
    # the CLI prints the local path relative to its cwd
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("upload: ") and lines[0].endswith(
        f"hundred.bin to s3://{cli_bucket}/in/hundred.bin"), res.describe()

    dst = tmp_path / "back.bin"
    res = aws_cli.run("s3", "cp", "--no-progress", f"s3://{cli_bucket}/in/hundred.bin", dst)
    assert dst.stat().st_size == 100 * MiB
    assert dst.read_bytes() == data

    res = aws_cli.run("s3api", "head-object", "--bucket", cli_bucket, "--key", "in/hundred.bin",
                      timeout=60)
    head = json.loads(res.stdout)
    assert head["ContentLength"] == 100 * MiB
    # 100 MiB in the CLI's 8 MiB parts: 13 parts
    assert head["ETag"] == multipart_etag(data, 8 * MiB)
    assert head["ETag"].endswith('-13"')


def test_cp_small_and_head_object(aws_cli, cli_bucket, tmp_path):
    data = os.urandom(123_456)
    src = tmp_path / "small file.bin"
    src.write_bytes(data)
    aws_cli.run("s3", "cp", "--no-progress", src, f"s3://{cli_bucket}/small file.bin")
    res = aws_cli.run("s3api", "head-object", "--bucket", cli_bucket, "--key", "small file.bin",
                      timeout=60)
    head = json.loads(res.stdout)
    assert head["ContentLength"] == len(data)
    assert head["ETag"] == f'"{md5_hex(data)}"'

    res = aws_cli.run("s3api", "head-object", "--bucket", cli_bucket, "--key", "nope",
                      check=False, timeout=60)
    assert res.returncode != 0
    assert "404" in res.stderr or "Not Found" in res.stderr, res.describe()

    dst = tmp_path / "out.bin"
    aws_cli.run("s3", "cp", "--no-progress", f"s3://{cli_bucket}/small file.bin", dst)
    assert dst.read_bytes() == data


def test_cp_server_side_copy(aws_cli, s3, cli_bucket, tmp_path):
    """`aws s3 cp s3://… s3://…`: CopyObject for small objects, multipart
    UploadPartCopy (x-amz-copy-source-range) above 8 MiB."""
    small, big = os.urandom(10_000), os.urandom(9 * MiB + 5)
    s3.put_object(Bucket=cli_bucket, Key="src/small", Body=small)
    s3.put_object(Bucket=cli_bucket, Key="src/big", Body=big)
    aws_cli.run("s3", "cp", "--no-progress", f"s3://{cli_bucket}/src/small",
                f"s3://{cli_bucket}/dst/small")
    assert s3.get_object(Bucket=cli_bucket, Key="dst/small")["Body"].read() == small
    aws_cli.run("s3", "cp", "--no-progress", f"s3://{cli_bucket}/src/big",
                f"s3://{cli_bucket}/dst/big")
    got = s3.get_object(Bucket=cli_bucket, Key="dst/big")
    assert got["ContentLength"] == len(big)
    assert got["Body"].read() == big


# --------------------------------------------------------------------------
# sync
# --------------------------------------------------------------------------
def _tree_spec() -> dict[str, int]:
    files = {
        "empty.txt": 0,
        "one byte": 1,
        "readme.md": 100,
        "my file with spaces.txt": 2048,
        "données/résumé ü.txt": 5000,
        "données/naïve café/menu.txt": 777,
        "日本語/ファイル.bin": 10_000,
        "nested/a/b/c/deep.bin": 65_536,
        "nested/a/b/c/d/e/deeper.txt": 10,
        "nested/a/sibling.txt": 333,
        "nested/a/b/zero": 0,
        "big/nine-mib.bin": 9 * MiB + 17,  # multipart
        "mixed/+plus&and=eq.txt": 50,
        "mixed/percent%20name.txt": 60,
        "mixed/tilde~(1).txt": 70,
    }
    for i in range(15):
        files[f"gen/part-{i:02d}.dat"] = i * 1013 + 1
    return files


def _make_tree(root: Path, spec: dict[str, int]) -> dict[str, bytes]:
    """Write the files, dated an hour back (as files usually are when synced:
    `sync` re-uploads a file whose mtime is later than the object's
    LastModified, which S3 gives to the second)."""
    contents = {}
    an_hour_ago = time.time() - 3600
    for rel, size in spec.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        data = os.urandom(size)
        p.write_bytes(data)
        os.utime(p, (an_hour_ago, an_hour_ago))
        contents[rel] = data
    return contents


def _read_tree(root: Path) -> dict[str, bytes]:
    out = {}
    for p in root.rglob("*"):
        if p.is_file():
            out[p.relative_to(root).as_posix()] = p.read_bytes()
    return out


def _assert_trees_equal(got: dict[str, bytes], expected: dict[str, bytes]):
    assert sorted(got) == sorted(expected)
    for k, v in expected.items():
        assert len(got[k]) == len(v), k
        assert got[k] == v, k


def test_sync_up_and_down(aws_cli, s3, cli_bucket, tmp_path):
    spec = _tree_spec()
    assert len(spec) == 30
    src = tmp_path / "src"
    contents = _make_tree(src, spec)
    dest_uri = f"s3://{cli_bucket}/tree/"

    res = aws_cli.run("s3", "sync", "--no-progress", src, dest_uri)
    uploads = [line for line in res.stdout.splitlines() if line.startswith("upload: ")]
    assert len(uploads) == 30, res.describe()

    # what the server now holds, via boto3
    listed = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=cli_bucket, Prefix="tree/"):
        for o in page.get("Contents", []):
            listed[o["Key"]] = o["Size"]
    assert listed == {f"tree/{k}": v for k, v in spec.items()}

    # a second sync has nothing to do
    res = aws_cli.run("s3", "sync", src, dest_uri)
    assert res.stdout.strip() == "", "second sync re-uploaded files:\n" + res.describe()

    # down into a fresh dir
    dst = tmp_path / "dst"
    dst.mkdir()
    res = aws_cli.run("s3", "sync", "--no-progress", dest_uri, dst)
    downloads = [line for line in res.stdout.splitlines() if line.startswith("download: ")]
    assert len(downloads) == 30, res.describe()
    _assert_trees_equal(_read_tree(dst), contents)

    # and a second download sync has nothing to do either
    res = aws_cli.run("s3", "sync", dest_uri, dst)
    assert res.stdout.strip() == "", "second download sync transferred files:\n" + res.describe()

    # a changed file is uploaded again, and only it
    changed = src / "nested/a/sibling.txt"
    new_data = os.urandom(334)
    changed.write_bytes(new_data)
    res = aws_cli.run("s3", "sync", "--no-progress", src, dest_uri)
    uploads = [line for line in res.stdout.splitlines() if line.startswith("upload: ")]
    assert len(uploads) == 1 and uploads[0].endswith("tree/nested/a/sibling.txt"), res.describe()
    got = s3.get_object(Bucket=cli_bucket, Key="tree/nested/a/sibling.txt")["Body"].read()
    assert got == new_data


def test_ls_and_ls_recursive(aws_cli, cli_bucket, tmp_path):
    spec = _tree_spec()
    src = tmp_path / "src"
    _make_tree(src, spec)
    aws_cli.run("s3", "sync", "--no-progress", src, f"s3://{cli_bucket}/tree/")
    aws_cli.run("s3", "cp", "--no-progress", src / "readme.md", f"s3://{cli_bucket}/top-level.md")

    # bucket root
    res = aws_cli.run("s3", "ls", f"s3://{cli_bucket}", timeout=60)
    objects, prefixes = parse_ls(res.stdout)
    assert prefixes == ["tree/"]
    assert objects == {"top-level.md": 100}

    # one level under tree/
    res = aws_cli.run("s3", "ls", f"s3://{cli_bucket}/tree/", timeout=60)
    objects, prefixes = parse_ls(res.stdout)
    expected_files = {k: v for k, v in spec.items() if "/" not in k}
    expected_dirs = sorted({k.split("/", 1)[0] + "/" for k in spec if "/" in k})
    assert objects == expected_files
    assert sorted(prefixes) == expected_dirs

    # a nested level
    res = aws_cli.run("s3", "ls", f"s3://{cli_bucket}/tree/nested/a/", timeout=60)
    objects, prefixes = parse_ls(res.stdout)
    assert objects == {"sibling.txt": 333}
    assert prefixes == ["b/"]

    # recursive: full keys and sizes
    res = aws_cli.run("s3", "ls", "--recursive", f"s3://{cli_bucket}/", timeout=60)
    objects, prefixes = parse_ls(res.stdout)
    assert prefixes == []
    expected = {f"tree/{k}": v for k, v in spec.items()}
    expected["top-level.md"] = 100
    assert objects == expected

    # recursive with summary
    res = aws_cli.run("s3", "ls", "--recursive", "--summarize", f"s3://{cli_bucket}/tree/",
                      timeout=60)
    assert re.search(r"Total Objects: 30\b", res.stdout), res.describe()
    assert re.search(rf"Total Size: {sum(spec.values())}\b", res.stdout), res.describe()

    # a prefix that matches nothing: no output, rc 1 (the CLI's "nothing found")
    res = aws_cli.run("s3", "ls", f"s3://{cli_bucket}/no-such-prefix/", check=False, timeout=60)
    assert res.stdout.strip() == ""
    assert res.returncode == 1, res.describe()


def test_rm_recursive(aws_cli, s3, cli_bucket, tmp_path):
    spec = _tree_spec()
    src = tmp_path / "src"
    _make_tree(src, spec)
    aws_cli.run("s3", "sync", "--no-progress", src, f"s3://{cli_bucket}/")
    assert s3.list_objects_v2(Bucket=cli_bucket)["KeyCount"] == 30

    # rm one object
    res = aws_cli.run("s3", "rm", f"s3://{cli_bucket}/readme.md", timeout=60)
    assert res.stdout.strip() == f"delete: s3://{cli_bucket}/readme.md"

    res = aws_cli.run("s3", "rm", "--recursive", f"s3://{cli_bucket}/")
    deleted = sorted(line[len(f"delete: s3://{cli_bucket}/"):]
                     for line in res.stdout.splitlines() if line.startswith("delete: "))
    assert deleted == sorted(k for k in spec if k != "readme.md"), res.describe()

    # (a bucket-root listing exits 0 even when empty; see also the prefix case below)
    res = aws_cli.run("s3", "ls", "--recursive", f"s3://{cli_bucket}/", timeout=60)
    assert res.stdout.strip() == "", res.describe()
    res = aws_cli.run("s3", "ls", "--recursive", f"s3://{cli_bucket}/nested/", check=False,
                      timeout=60)
    assert res.stdout.strip() == "", res.describe()
    assert res.returncode == 1, res.describe()
    resp = s3.list_objects_v2(Bucket=cli_bucket)
    assert resp["KeyCount"] == 0
    assert "Contents" not in resp

    # the bucket itself is still there, empty, and can now be removed
    res = aws_cli.run("s3", "rb", f"s3://{cli_bucket}", timeout=60)
    assert res.stdout.strip() == f"remove_bucket: {cli_bucket}"


def test_s3api_head_object_json(aws_cli, s3, cli_bucket):
    data = os.urandom(54_321)
    s3.put_object(Bucket=cli_bucket, Key="dir/h.bin", Body=data, ContentType="application/x-test")
    res = aws_cli.run("s3api", "head-object", "--bucket", cli_bucket, "--key", "dir/h.bin",
                      timeout=60)
    head = json.loads(res.stdout)
    assert head["ContentLength"] == len(data)
    assert head["ETag"] == f'"{md5_hex(data)}"'
    assert head["ContentType"] == "application/x-test"
    assert "LastModified" in head

    res = aws_cli.run("s3api", "head-object", "--bucket", cli_bucket, "--key", "dir/h.bin",
                      "--range", "bytes=0-9", timeout=60)
    head = json.loads(res.stdout)
    assert head["ContentLength"] == 10
    assert head["ContentRange"] == f"bytes 0-9/{len(data)}"


def test_s3api_get_object_range(aws_cli, s3, cli_bucket, tmp_path):
    data = os.urandom(4096)
    s3.put_object(Bucket=cli_bucket, Key="r.bin", Body=data)
    out = tmp_path / "r.out"
    res = aws_cli.run("s3api", "get-object", "--bucket", cli_bucket, "--key", "r.bin",
                      "--range", "bytes=100-199", out, timeout=60)
    meta = json.loads(res.stdout)
    assert meta["ContentLength"] == 100
    assert meta["ContentRange"] == "bytes 100-199/4096"
    assert out.read_bytes() == data[100:200]


def test_presign_command(aws_cli, s3, cli_bucket):
    data = os.urandom(2048)
    s3.put_object(Bucket=cli_bucket, Key="p/q r.bin", Body=data)
    res = aws_cli.run("s3", "presign", f"s3://{cli_bucket}/p/q r.bin", "--expires-in", "300",
                      timeout=60)
    url = res.stdout.strip()
    assert url.startswith(aws_cli.endpoint), url
    r = requests.get(url, timeout=30)
    assert r.status_code == 200, r.text[:500]
    assert r.content == data


def test_cli_wrong_secret_fails(aws_cli, cli_bucket, tmp_path):
    bad_env = {"AWS_SECRET_ACCESS_KEY": "wrong-secret-value"}
    res = aws_cli.run("s3", "ls", f"s3://{cli_bucket}/", check=False, timeout=120,
                      extra_env=bad_env)
    assert res.returncode != 0
    assert "SignatureDoesNotMatch" in res.stderr, res.describe()

    f = tmp_path / "x.txt"
    f.write_bytes(b"should not land")
    res = aws_cli.run("s3", "cp", f, f"s3://{cli_bucket}/x.txt", check=False, timeout=120,
                      extra_env=bad_env)
    assert res.returncode != 0
    res = aws_cli.run("s3", "ls", f"s3://{cli_bucket}/", check=False, timeout=60)
    assert res.stdout.strip() == ""


def test_unique_bucket_names_are_valid():
    for hint in ["Test_Something[param-1]", "x" * 100, "日本"]:
        name = unique_bucket_name(hint)
        assert re.fullmatch(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]", name), name

