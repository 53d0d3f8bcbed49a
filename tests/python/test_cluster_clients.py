"""Real S3 clients against a 3-node cluster: boto3 and the AWS CLI point at one node
each, with credentials, and every upload (multipart included), download, listing and
presigned URL works whichever node owns the key — the nodes proxy to the owner and keep
the client's signature, which the owner checks.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest
import requests
from boto3.s3.transfer import TransferConfig

from conftest import (AwsCli, _free_port, _server_binary, _stop_process, make_s3_client,
                      wait_members_up)
from granary_testutil import ACCESS_KEY, SECRET_KEY, MiB, multipart_etag, unique_bucket_name

IDS = ("n0", "n1", "n2")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Three credentialed nodes over one fs backend directory; yields their endpoints."""
    root = tmp_path_factory.mktemp("cluster")
    origin = root / "origin"
    origin.mkdir()
    ports = [_free_port() for _ in IDS]
    peers = []
    for node_id, port in zip(IDS, ports):
        peers += ["--peer", f"{node_id}=http://127.0.0.1:{port}"]
    procs = []
    try:
        for node_id, port in zip(IDS, ports):
            log = open(root / f"{node_id}.log", "wb")
            procs.append(subprocess.Popen(
                [str(_server_binary()), "serve", "--listen", f"127.0.0.1:{port}",
                 "--data-dir", str(root / node_id), "--backend", f"fs:{origin}",
                 "--cache-capacity", "1GiB", "--node-id", node_id,
                 "--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY, *peers],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        endpoints = [f"http://127.0.0.1:{p}" for p in ports]
        wait_members_up(endpoints, procs, [root / f"{i}.log" for i in IDS])
        yield endpoints
    finally:
        for p in procs:
            _stop_process(p)


def owner(endpoint: str, bucket: str, key: str) -> str:
    r = requests.get(f"{endpoint}/_granary/cluster", params={"bucket": bucket, "key": key},
                     timeout=10)
    assert r.status_code == 200
    return r.json()["owner"]


def test_boto3_through_every_node(cluster, tmp_path):
    s3 = [make_s3_client(e) for e in cluster]
    keys = [f"shards/shard-{i:03}.tar" for i in range(6)]
    # Bucket names are random, and so is the owners' split of six keys: one in 243 names
    # puts them all on one node. Take a name whose keys land on every node.
    for _ in range(100):
        bucket = unique_bucket_name("cluster-boto3")
        if {owner(cluster[0], bucket, k) for k in keys} == set(IDS):
            break
    else:
        pytest.fail("no bucket name in 100 spread six keys over three nodes")
    s3[0].create_bucket(Bucket=bucket)
    # Multipart (8 MiB parts) and single-part uploads, each through a different node.
    cfg = TransferConfig(multipart_threshold=8 * MiB, multipart_chunksize=8 * MiB)
    bodies = {}
    for i in range(6):
        size = (20 * MiB + 12345) if i % 2 == 0 else 50_000 + i
        data = os.urandom(size)
        path = tmp_path / f"up{i}"
        path.write_bytes(data)
        key = keys[i]
        s3[i % 3].upload_file(str(path), bucket, key, Config=cfg)
        bodies[key] = data
    owners = {k: owner(cluster[0], bucket, k) for k in bodies}
    assert set(owners.values()) == set(IDS), f"the owners moved: {owners}"
    for k, data in bodies.items():
        # The owners agree whichever node is asked.
        assert {owner(e, bucket, k) for e in cluster} == {owners[k]}
        for c in s3:
            got = c.get_object(Bucket=bucket, Key=k)
            body = got["Body"].read()
            assert hashlib.md5(body).digest() == hashlib.md5(data).digest()
            assert got["ResponseMetadata"]["HTTPHeaders"]["x-granary-node"] == owners[k]
            if len(data) > 8 * MiB:
                assert got["ETag"] == multipart_etag(data, 8 * MiB)
        # A range through a node that is not the owner.
        other = next(i for i, n in enumerate(IDS) if n != owners[k])
        r = s3[other].get_object(Bucket=bucket, Key=k, Range="bytes=100-199")
        assert r["Body"].read() == data[100:200]
    listed = s3[2].list_objects_v2(Bucket=bucket, Prefix="shards/")
    assert sorted(o["Key"] for o in listed["Contents"]) == sorted(bodies)
    # A presigned URL made for node n0 works with a plain HTTP client, the node proxying
    # it to the owner with the signed Host intact.
    for k, data in bodies.items():
        url = s3[0].generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": k},
                                           ExpiresIn=300)
        r = requests.get(url, timeout=30)
        assert r.status_code == 200, r.text[:500]
        assert r.content == data
        assert r.headers["x-granary-node"] == owners[k]
    # Overwrite through one node, read through the others: the new bytes.
    k = "shards/shard-001.tar"
    s3[1].put_object(Bucket=bucket, Key=k, Body=b"new bytes")
    for c in s3:
        assert c.get_object(Bucket=bucket, Key=k)["Body"].read() == b"new bytes"
    s3[2].delete_object(Bucket=bucket, Key=k)
    for c in s3:
        with pytest.raises(c.exceptions.NoSuchKey):
            c.get_object(Bucket=bucket, Key=k)


def test_aws_cli_through_every_node(cluster, tmp_path):
    bucket = unique_bucket_name("cluster-cli")
    clis = [AwsCli(e, tmp_path / f"home{i}") for i, e in enumerate(cluster)]
    clis[0].run("s3", "mb", f"s3://{bucket}")
    src = tmp_path / "src"
    src.mkdir()
    files = {}
    for i in range(5):
        data = os.urandom(12 * MiB + i if i < 2 else 4096 + i)  # the CLI uses multipart above 8 MiB
        (src / f"part-{i}.bin").write_bytes(data)
        files[f"part-{i}.bin"] = data
    clis[1].run("s3", "cp", "--recursive", "--only-show-errors", str(src), f"s3://{bucket}/data/")
    out = clis[2].run("s3", "ls", f"s3://{bucket}/data/").stdout
    for name, data in files.items():
        assert f"{len(data)} {name}" in " ".join(out.split()), out
    for i, cli in enumerate(clis):
        dst = tmp_path / f"down{i}"
        cli.run("s3", "cp", "--recursive", "--only-show-errors", f"s3://{bucket}/data/", str(dst))
        for name, data in files.items():
            assert (dst / name).read_bytes() == data, f"{name} through node {IDS[i]}"
