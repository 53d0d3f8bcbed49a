"""boto3 against a real Granary server (credentials on, path-style, us-east-1).

These use boto3's defaults, as a user would: over plain HTTP botocore signs
the payload (x-amz-content-sha256 = hex SHA-256 of the body) and, for
operations that support flexible checksums, adds x-amz-checksum-crc32 and
x-amz-sdk-checksum-algorithm headers.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import os
import re
import socket
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError

from granary_testutil import (ACCESS_KEY, REGION, SECRET_KEY, MiB, md5_hex, multipart_etag,
                              sha256_file, unique_bucket_name)

HTTP_TIMEOUT = 30


def error_of(exc: ClientError) -> tuple[str, int]:
    return (exc.response.get("Error", {}).get("Code"),
            exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode"))


def status_of(resp) -> int:
    return resp["ResponseMetadata"]["HTTPStatusCode"]


def xml_error_code(body: bytes) -> str | None:
    m = re.search(rb"<Code>([^<]*)</Code>", body)
    return m.group(1).decode() if m else None


# --------------------------------------------------------------------------
# basic object round trips
# --------------------------------------------------------------------------
def test_put_get_round_trip(s3, bucket):
    data = os.urandom(1 * MiB + 12345)
    put = s3.put_object(Bucket=bucket, Key="obj/random.bin", Body=data)
    assert status_of(put) == 200
    assert put["ETag"] == f'"{md5_hex(data)}"'

    got = s3.get_object(Bucket=bucket, Key="obj/random.bin")
    assert status_of(got) == 200
    body = got["Body"].read()
    assert len(body) == len(data)
    assert body == data
    assert got["ETag"] == f'"{md5_hex(data)}"'
    assert got["ContentLength"] == len(data)
    headers = got["ResponseMetadata"]["HTTPHeaders"]
    assert headers.get("x-granary-cache") in ("hit", "miss", "peer", "bypass"), headers
    assert headers.get("x-granary-node"), headers


def test_put_get_empty_object(s3, bucket):
    put = s3.put_object(Bucket=bucket, Key="empty", Body=b"")
    assert put["ETag"] == '"d41d8cd98f00b204e9800998ecf8427e"'
    got = s3.get_object(Bucket=bucket, Key="empty")
    assert got["Body"].read() == b""
    assert got["ContentLength"] == 0
    assert got["ETag"] == '"d41d8cd98f00b204e9800998ecf8427e"'


def test_overwrite_replaces_content(s3, bucket):
    first, second = os.urandom(5000), os.urandom(3000)
    s3.put_object(Bucket=bucket, Key="k", Body=first)
    s3.put_object(Bucket=bucket, Key="k", Body=second)
    got = s3.get_object(Bucket=bucket, Key="k")
    assert got["Body"].read() == second
    assert got["ETag"] == f'"{md5_hex(second)}"'
    head = s3.head_object(Bucket=bucket, Key="k")
    assert head["ContentLength"] == 3000


def test_head_object(s3, bucket):
    data = os.urandom(77777)
    s3.put_object(Bucket=bucket, Key="head/me", Body=data)
    head = s3.head_object(Bucket=bucket, Key="head/me")
    assert status_of(head) == 200
    assert head["ContentLength"] == len(data)
    assert head["ETag"] == f'"{md5_hex(data)}"'
    lm = head["LastModified"]
    assert isinstance(lm, dt.datetime)
    now = dt.datetime.now(dt.timezone.utc)
    assert abs((now - lm).total_seconds()) < 300, (lm, now)

    with pytest.raises(ClientError) as ei:
        s3.head_object(Bucket=bucket, Key="head/missing")
    assert error_of(ei.value)[1] == 404


def test_content_type_and_user_metadata(s3, bucket):
    s3.put_object(Bucket=bucket, Key="meta.json", Body=b'{"a": 1}',
                  ContentType="application/json", Metadata={"origin": "granary-test"})
    head = s3.head_object(Bucket=bucket, Key="meta.json")
    assert head["ContentType"] == "application/json"
    assert head["Metadata"] == {"origin": "granary-test"}
    got = s3.get_object(Bucket=bucket, Key="meta.json")
    assert got["ContentType"] == "application/json"
    assert got["Body"].read() == b'{"a": 1}'


# --------------------------------------------------------------------------
# ranges
# --------------------------------------------------------------------------
RANGE_SIZE = 10_000


@pytest.mark.parametrize("range_header,start,end", [
    ("bytes=0-99", 0, 99),
    ("bytes=-10", RANGE_SIZE - 10, RANGE_SIZE - 1),
    ("bytes=100-", 100, RANGE_SIZE - 1),
    ("bytes=5000-5000", 5000, 5000),
    ("bytes=9990-20000", 9990, RANGE_SIZE - 1),  # end past the size is clamped
])
def test_get_range(s3, bucket, range_header, start, end):
    data = os.urandom(RANGE_SIZE)
    s3.put_object(Bucket=bucket, Key="ranged.bin", Body=data)
    got = s3.get_object(Bucket=bucket, Key="ranged.bin", Range=range_header)
    assert status_of(got) == 206
    body = got["Body"].read()
    assert body == data[start:end + 1]
    assert got["ContentLength"] == end - start + 1
    assert got["ContentRange"] == f"bytes {start}-{end}/{RANGE_SIZE}"
    assert got["ETag"] == f'"{md5_hex(data)}"'


@pytest.mark.parametrize("range_header", ["bytes=10000-10010", "bytes=20000-"])
def test_get_unsatisfiable_range(s3, bucket, range_header):
    s3.put_object(Bucket=bucket, Key="ranged.bin", Body=os.urandom(RANGE_SIZE))
    with pytest.raises(ClientError) as ei:
        s3.get_object(Bucket=bucket, Key="ranged.bin", Range=range_header)
    assert error_of(ei.value) == ("InvalidRange", 416)


# --------------------------------------------------------------------------
# conditional requests
# --------------------------------------------------------------------------
def test_conditional_get(s3, bucket):
    data = os.urandom(4096)
    etag = s3.put_object(Bucket=bucket, Key="cond", Body=data)["ETag"]
    assert s3.get_object(Bucket=bucket, Key="cond", IfMatch=etag)["Body"].read() == data
    got = s3.get_object(Bucket=bucket, Key="cond", IfNoneMatch='"0123456789abcdef0123456789abcdef"')
    assert got["Body"].read() == data

    with pytest.raises(ClientError) as ei:
        s3.get_object(Bucket=bucket, Key="cond", IfNoneMatch=etag)
    assert error_of(ei.value)[1] == 304

    with pytest.raises(ClientError) as ei:
        s3.get_object(Bucket=bucket, Key="cond", IfMatch='"0123456789abcdef0123456789abcdef"')
    assert error_of(ei.value) == ("PreconditionFailed", 412)


# --------------------------------------------------------------------------
# listing
# --------------------------------------------------------------------------
def _put_many(s3, bucket, items: dict[str, bytes], workers: int = 16):
    def put(kv):
        k, v = kv
        s3.put_object(Bucket=bucket, Key=k, Body=v)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(put, items.items()))


def test_list_objects_v2_pagination(s3, bucket):
    # Keys whose lexicographic order differs from numeric order.
    items = {f"data/{i % 10}/sample-{i}.bin": str(i).encode() * (i % 4) for i in range(1100)}
    _put_many(s3, bucket, items)
    expected = sorted(items)

    paginator = s3.get_paginator("list_objects_v2")

    for page_size, expected_counts in [(None, [1000, 100]), (250, [250, 250, 250, 250, 100])]:
        kwargs = {"Bucket": bucket}
        if page_size is not None:
            kwargs["PaginationConfig"] = {"PageSize": page_size}
        pages = list(paginator.paginate(**kwargs))
        seen = []
        sizes = {}
        for i, page in enumerate(pages):
            contents = page.get("Contents", [])
            assert page["KeyCount"] == len(contents)
            assert page["MaxKeys"] == (page_size or 1000)
            last = i == len(pages) - 1
            assert page["IsTruncated"] is (not last), (page_size, i)
            if not last:
                assert page.get("NextContinuationToken")
            for obj in contents:
                seen.append(obj["Key"])
                sizes[obj["Key"]] = obj["Size"]
                assert obj["ETag"] == f'"{md5_hex(items[obj["Key"]])}"'
        assert [p["KeyCount"] for p in pages] == expected_counts, page_size
        assert sum(p["KeyCount"] for p in pages) == 1100
        assert seen == expected, f"page_size={page_size}: keys out of order, missing or repeated"
        assert sizes == {k: len(v) for k, v in items.items()}

    # prefix + pagination
    pages = list(paginator.paginate(Bucket=bucket, Prefix="data/3/",
                                    PaginationConfig={"PageSize": 30}))
    seen = [o["Key"] for p in pages for o in p.get("Contents", [])]
    assert seen == [k for k in expected if k.startswith("data/3/")]
    assert len(seen) == 110
    assert len(pages) == 4

    # StartAfter
    resp = s3.list_objects_v2(Bucket=bucket, StartAfter=expected[1049])
    assert [o["Key"] for o in resp["Contents"]] == expected[1050:]
    assert resp["KeyCount"] == 50

    # MaxKeys on a single call
    resp = s3.list_objects_v2(Bucket=bucket, MaxKeys=7)
    assert [o["Key"] for o in resp["Contents"]] == expected[:7]
    assert resp["IsTruncated"] is True
    resp2 = s3.list_objects_v2(Bucket=bucket, MaxKeys=7,
                               ContinuationToken=resp["NextContinuationToken"])
    assert [o["Key"] for o in resp2["Contents"]] == expected[7:14]


def test_list_objects_v2_delimiter(s3, bucket):
    keys = ["a.txt", "dir1/x", "dir1/y", "dir2/sub/z", "dir2/sub/w", "dir2/top.txt",
            "dir3/deep/er/f", "z.txt"]
    _put_many(s3, bucket, {k: k.encode() for k in keys})

    resp = s3.list_objects_v2(Bucket=bucket, Delimiter="/")
    assert [o["Key"] for o in resp.get("Contents", [])] == ["a.txt", "z.txt"]
    assert [p["Prefix"] for p in resp.get("CommonPrefixes", [])] == ["dir1/", "dir2/", "dir3/"]
    assert resp["KeyCount"] == 5
    assert resp["IsTruncated"] is False
    assert resp.get("Delimiter") == "/"

    resp = s3.list_objects_v2(Bucket=bucket, Delimiter="/", Prefix="dir2/")
    assert [o["Key"] for o in resp.get("Contents", [])] == ["dir2/top.txt"]
    assert [p["Prefix"] for p in resp.get("CommonPrefixes", [])] == ["dir2/sub/"]
    assert resp.get("Prefix") == "dir2/"

    resp = s3.list_objects_v2(Bucket=bucket, Delimiter="/", Prefix="dir2/sub/")
    assert [o["Key"] for o in resp.get("Contents", [])] == ["dir2/sub/w", "dir2/sub/z"]
    assert "CommonPrefixes" not in resp or resp["CommonPrefixes"] == []

    resp = s3.list_objects_v2(Bucket=bucket, Delimiter="/", Prefix="nope/")
    assert resp["KeyCount"] == 0
    assert "Contents" not in resp

    # delimiter listing over several small pages: each entry exactly once, in order
    pages = list(s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Delimiter="/", PaginationConfig={"PageSize": 2}))
    entries = []
    for p in pages:
        entries += [o["Key"] for o in p.get("Contents", [])]
        entries += [c["Prefix"] for c in p.get("CommonPrefixes", [])]
    assert sorted(entries) == ["a.txt", "dir1/", "dir2/", "dir3/", "z.txt"]
    assert len(entries) == 5


def test_list_buckets_and_bucket_lifecycle(s3, bucket_name):
    s3.create_bucket(Bucket=bucket_name)
    assert status_of(s3.head_bucket(Bucket=bucket_name)) == 200
    names = [b["Name"] for b in s3.list_buckets()["Buckets"]]
    assert bucket_name in names

    s3.put_object(Bucket=bucket_name, Key="x", Body=b"x")
    with pytest.raises(ClientError) as ei:
        s3.delete_bucket(Bucket=bucket_name)
    assert error_of(ei.value) == ("BucketNotEmpty", 409)

    s3.delete_object(Bucket=bucket_name, Key="x")
    s3.delete_bucket(Bucket=bucket_name)
    with pytest.raises(ClientError) as ei:
        s3.head_bucket(Bucket=bucket_name)
    assert error_of(ei.value)[1] == 404
    assert bucket_name not in [b["Name"] for b in s3.list_buckets()["Buckets"]]


def test_no_such_bucket(s3):
    missing = unique_bucket_name("missing")
    with pytest.raises(ClientError) as ei:
        s3.get_object(Bucket=missing, Key="k")
    assert error_of(ei.value) == ("NoSuchBucket", 404)
    with pytest.raises(ClientError) as ei:
        s3.list_objects_v2(Bucket=missing)
    assert error_of(ei.value) == ("NoSuchBucket", 404)


# --------------------------------------------------------------------------
# multipart
# --------------------------------------------------------------------------
def test_upload_file_multipart_50mib(s3, bucket, tmp_path):
    src = tmp_path / "big.bin"
    data = os.urandom(50 * MiB)
    src.write_bytes(data)
    config = TransferConfig()  # defaults: multipart above 8 MiB, 8 MiB parts
    assert config.multipart_threshold == 8 * MiB and config.multipart_chunksize == 8 * MiB

    s3.upload_file(str(src), bucket, "big/file.bin", Config=config)

    head = s3.head_object(Bucket=bucket, Key="big/file.bin")
    assert head["ContentLength"] == 50 * MiB
    etag = head["ETag"]
    m = re.fullmatch(r'"([0-9a-f]{32})-(\d+)"', etag)
    assert m, f"multipart ETag should look like \"<md5>-N\", got {etag!r}"
    assert int(m.group(2)) == 7
    assert etag == multipart_etag(data, 8 * MiB)

    listed = s3.list_objects_v2(Bucket=bucket, Prefix="big/")["Contents"]
    assert [(o["Key"], o["Size"], o["ETag"]) for o in listed] == [("big/file.bin", 50 * MiB, etag)]

    dst = tmp_path / "big.out"
    s3.download_file(bucket, "big/file.bin", str(dst))
    assert dst.stat().st_size == 50 * MiB
    assert sha256_file(dst) == hashlib.sha256(data).hexdigest()

    # a range across the first part boundary
    got = s3.get_object(Bucket=bucket, Key="big/file.bin", Range="bytes=8388600-8388700")
    assert got["Body"].read() == data[8388600:8388701]
    assert got["ContentRange"] == f"bytes 8388600-8388700/{50 * MiB}"


def test_multipart_low_level(s3, bucket):
    part1, part2 = os.urandom(5 * MiB), os.urandom(1 * MiB + 7)
    mpu = s3.create_multipart_upload(Bucket=bucket, Key="mp/obj")
    upload_id = mpu["UploadId"]
    assert upload_id
    r1 = s3.upload_part(Bucket=bucket, Key="mp/obj", UploadId=upload_id, PartNumber=1, Body=part1)
    r2 = s3.upload_part(Bucket=bucket, Key="mp/obj", UploadId=upload_id, PartNumber=2, Body=part2)
    assert r1["ETag"] == f'"{md5_hex(part1)}"'
    assert r2["ETag"] == f'"{md5_hex(part2)}"'

    parts = s3.list_parts(Bucket=bucket, Key="mp/obj", UploadId=upload_id)["Parts"]
    assert [(p["PartNumber"], p["Size"], p["ETag"]) for p in parts] == [
        (1, len(part1), r1["ETag"]), (2, len(part2), r2["ETag"])]

    done = s3.complete_multipart_upload(
        Bucket=bucket, Key="mp/obj", UploadId=upload_id,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": r1["ETag"]},
                                   {"PartNumber": 2, "ETag": r2["ETag"]}]})
    expected_etag = '"%s-2"' % hashlib.md5(
        hashlib.md5(part1).digest() + hashlib.md5(part2).digest()).hexdigest()
    assert done["ETag"] == expected_etag
    got = s3.get_object(Bucket=bucket, Key="mp/obj")
    assert got["ETag"] == expected_etag
    assert got["Body"].read() == part1 + part2


def test_multipart_abort(s3, bucket):
    mpu = s3.create_multipart_upload(Bucket=bucket, Key="mp/aborted")
    upload_id = mpu["UploadId"]
    s3.upload_part(Bucket=bucket, Key="mp/aborted", UploadId=upload_id, PartNumber=1,
                   Body=os.urandom(1024))
    assert status_of(s3.abort_multipart_upload(Bucket=bucket, Key="mp/aborted",
                                               UploadId=upload_id)) == 204
    with pytest.raises(ClientError) as ei:
        s3.list_parts(Bucket=bucket, Key="mp/aborted", UploadId=upload_id)
    assert error_of(ei.value) == ("NoSuchUpload", 404)
    with pytest.raises(ClientError) as ei:
        s3.get_object(Bucket=bucket, Key="mp/aborted")
    assert error_of(ei.value) == ("NoSuchKey", 404)
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0


# --------------------------------------------------------------------------
# presigned URLs
# --------------------------------------------------------------------------
PRESIGNERS = {
    "default": {},  # boto3's default presigner for S3 (SigV2 query: AWSAccessKeyId/Expires/Signature)
    "s3v4": {"signature_version": "s3v4"},
}


@pytest.mark.parametrize("presigner", list(PRESIGNERS))
def test_presigned_get(s3, s3_factory, bucket, presigner):
    data = os.urandom(300_000)
    key = "presigned/dir/object one.bin"
    s3.put_object(Bucket=bucket, Key=key, Body=data)
    signer = s3_factory(**PRESIGNERS[presigner])
    url = signer.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key},
                                        ExpiresIn=600)
    if presigner == "default":
        assert "AWSAccessKeyId=" in url and "Signature=" in url
    else:
        assert "X-Amz-Signature=" in url
    r = requests.get(url, timeout=HTTP_TIMEOUT)
    assert r.status_code == 200, r.text[:500]
    assert r.content == data
    assert r.headers.get("ETag") == f'"{md5_hex(data)}"'

    # a ranged read through the same URL
    r = requests.get(url, headers={"Range": "bytes=10-19"}, timeout=HTTP_TIMEOUT)
    assert r.status_code == 206
    assert r.content == data[10:20]

    # presigned HEAD
    head_url = signer.generate_presigned_url("head_object", Params={"Bucket": bucket, "Key": key},
                                             ExpiresIn=600)
    r = requests.head(head_url, timeout=HTTP_TIMEOUT)
    assert r.status_code == 200
    assert int(r.headers["Content-Length"]) == len(data)


def _tamper_signature(url: str) -> str:
    m = re.search(r"(X-Amz-Signature|Signature)=([^&]+)", url)
    assert m, url
    value = m.group(2)
    # change the first plain alphanumeric character of the signature
    for i, ch in enumerate(value):
        if ch.isalnum():
            new = ("b" if ch != "b" else "c")
            value = value[:i] + new + value[i + 1:]
            break
    return url[:m.start(2)] + value + url[m.end(2):]


def _tamper_expiry(url: str) -> str:
    def bump(m):
        return f"{m.group(1)}={int(m.group(2)) + 1}"
    new = re.sub(r"(X-Amz-Expires|Expires)=(\d+)", bump, url, count=1)
    assert new != url
    return new


def _tamper_key(url: str, bucket: str, key: str, other: str) -> str:
    old_path = f"/{bucket}/{urllib.parse.quote(key)}"
    assert old_path in url, url
    return url.replace(old_path, f"/{bucket}/{urllib.parse.quote(other)}", 1)


@pytest.mark.parametrize("presigner", list(PRESIGNERS))
@pytest.mark.parametrize("tamper", ["signature", "expiry", "key"])
def test_presigned_tampered_is_403(s3, s3_factory, bucket, presigner, tamper):
    secret_data, other_data = os.urandom(1000), os.urandom(1000)
    s3.put_object(Bucket=bucket, Key="public.bin", Body=secret_data)
    s3.put_object(Bucket=bucket, Key="private.bin", Body=other_data)
    signer = s3_factory(**PRESIGNERS[presigner])
    url = signer.generate_presigned_url("get_object",
                                        Params={"Bucket": bucket, "Key": "public.bin"},
                                        ExpiresIn=600)
    assert requests.get(url, timeout=HTTP_TIMEOUT).content == secret_data  # sanity
    if tamper == "signature":
        bad = _tamper_signature(url)
    elif tamper == "expiry":
        bad = _tamper_expiry(url)
    else:
        bad = _tamper_key(url, bucket, "public.bin", "private.bin")
    assert bad != url
    r = requests.get(bad, timeout=HTTP_TIMEOUT)
    assert r.status_code == 403, (bad, r.status_code, r.text[:500])
    assert other_data not in r.content and secret_data not in r.content
    assert xml_error_code(r.content) in ("SignatureDoesNotMatch", "AccessDenied"), r.text[:500]


@pytest.mark.parametrize("presigner", list(PRESIGNERS))
def test_presigned_expired_is_403(s3, s3_factory, bucket, presigner):
    s3.put_object(Bucket=bucket, Key="soon-gone", Body=b"data")
    signer = s3_factory(**PRESIGNERS[presigner])
    url = signer.generate_presigned_url("get_object",
                                        Params={"Bucket": bucket, "Key": "soon-gone"},
                                        ExpiresIn=1)
    time.sleep(2.5)
    r = requests.get(url, timeout=HTTP_TIMEOUT)
    assert r.status_code == 403, r.text[:500]
    assert xml_error_code(r.content) == "AccessDenied", r.text[:500]


def test_unsigned_request_is_403(granary_server, s3, bucket):
    s3.put_object(Bucket=bucket, Key="k", Body=b"secret")
    r = requests.get(f"{granary_server.endpoint}/{bucket}/k", timeout=HTTP_TIMEOUT)
    assert r.status_code == 403
    assert b"secret" not in r.content
    assert xml_error_code(r.content) == "AccessDenied", r.text[:500]
    r = requests.put(f"{granary_server.endpoint}/{bucket}/k2", data=b"x", timeout=HTTP_TIMEOUT)
    assert r.status_code == 403
    with pytest.raises(ClientError) as ei:
        s3.head_object(Bucket=bucket, Key="k2")
    assert error_of(ei.value)[1] == 404


# --------------------------------------------------------------------------
# delete / copy
# --------------------------------------------------------------------------
def test_delete_object(s3, bucket):
    s3.put_object(Bucket=bucket, Key="doomed", Body=b"bye")
    assert s3.get_object(Bucket=bucket, Key="doomed")["Body"].read() == b"bye"
    resp = s3.delete_object(Bucket=bucket, Key="doomed")
    assert status_of(resp) == 204
    with pytest.raises(ClientError) as ei:
        s3.get_object(Bucket=bucket, Key="doomed")
    assert error_of(ei.value) == ("NoSuchKey", 404)
    with pytest.raises(ClientError) as ei:
        s3.head_object(Bucket=bucket, Key="doomed")
    assert error_of(ei.value)[1] == 404
    # deleting a key that does not exist is not an error in S3
    assert status_of(s3.delete_object(Bucket=bucket, Key="never-existed")) == 204
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0


def test_delete_objects(s3, bucket):
    keys = [f"batch/{i}.txt" for i in range(6)]
    _put_many(s3, bucket, {k: k.encode() for k in keys})
    to_delete = keys[:4] + ["batch/does-not-exist"]
    resp = s3.delete_objects(Bucket=bucket,
                             Delete={"Objects": [{"Key": k} for k in to_delete]})
    assert status_of(resp) == 200
    assert sorted(d["Key"] for d in resp.get("Deleted", [])) == sorted(to_delete)
    assert resp.get("Errors", []) == []
    remaining = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert remaining == keys[4:]
    for k in keys[:4]:
        with pytest.raises(ClientError) as ei:
            s3.get_object(Bucket=bucket, Key=k)
        assert error_of(ei.value) == ("NoSuchKey", 404)

    # Quiet mode reports no successes
    resp = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[4:]],
                                                    "Quiet": True})
    assert resp.get("Deleted", []) == []
    assert resp.get("Errors", []) == []
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0


@pytest.mark.parametrize("src_key", ["plain/src.bin", "spaced dir/ünï cødé+plus&amp.bin"])
def test_copy_object(s3, bucket, src_key):
    data = os.urandom(200_000)
    s3.put_object(Bucket=bucket, Key=src_key, Body=data)
    resp = s3.copy_object(Bucket=bucket, Key="copies/dst.bin",
                          CopySource={"Bucket": bucket, "Key": src_key})
    assert resp["CopyObjectResult"]["ETag"] == f'"{md5_hex(data)}"'
    got = s3.get_object(Bucket=bucket, Key="copies/dst.bin")
    assert got["Body"].read() == data
    assert got["ETag"] == f'"{md5_hex(data)}"'
    # the source is still there
    assert s3.get_object(Bucket=bucket, Key=src_key)["Body"].read() == data

    # into another bucket
    other = unique_bucket_name("copy-dst")
    s3.create_bucket(Bucket=other)
    s3.copy_object(Bucket=other, Key="x/y.bin", CopySource={"Bucket": bucket, "Key": src_key})
    assert s3.get_object(Bucket=other, Key="x/y.bin")["Body"].read() == data

    # from a key that does not exist
    with pytest.raises(ClientError) as ei:
        s3.copy_object(Bucket=bucket, Key="copies/none",
                       CopySource={"Bucket": bucket, "Key": "no/such/key"})
    assert error_of(ei.value) == ("NoSuchKey", 404)


# --------------------------------------------------------------------------
# awkward keys
# --------------------------------------------------------------------------
ODD_KEYS = [
    "sp ace/with spaces.txt",
    "plus+sign&amp=eq;semi,comma",
    "percent%2Fencoded%20looking",
    "ünïcødé/日本語/ファイル.txt",
    "tilde~star*paren(1)!'quote",
    "dir/",            # a "folder marker" key
    "a/./b",
    "a/../b",
    "double//slash",
    "long/" + "/".join(["x" * 200] * 4),  # 805 bytes, each segment < 255
]


@pytest.mark.parametrize("key", ODD_KEYS, ids=lambda k: k[:24])
def test_odd_key_round_trip(s3, bucket, key):
    data = os.urandom(321)
    s3.put_object(Bucket=bucket, Key=key, Body=data)
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == data
    assert s3.head_object(Bucket=bucket, Key=key)["ContentLength"] == 321
    listed = s3.list_objects_v2(Bucket=bucket)
    assert [(o["Key"], o["Size"]) for o in listed.get("Contents", [])] == [(key, 321)]
    s3.delete_object(Bucket=bucket, Key=key)
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0


def test_overlong_path_segment_round_trips_or_clean_error(s3, bucket):
    """A 300-byte key without '/' is valid S3; a server on a filesystem with a
    255-byte name limit must store it (by escaping) or refuse it cleanly."""
    key = "y" * 300
    data = os.urandom(100)
    try:
        s3.put_object(Bucket=bucket, Key=key, Body=data)
    except ClientError as e:
        code, status = error_of(e)
        assert 400 <= status < 500 and code and not code.isdigit(), (code, status)
        return
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == data


def test_key_beside_prefix(s3, bucket):
    """`a` and `a/b` can both exist in S3 (a file and a folder of the same name on disk)."""
    s3.put_object(Bucket=bucket, Key="a", Body=b"file a")
    s3.put_object(Bucket=bucket, Key="a/b", Body=b"file a/b")
    s3.put_object(Bucket=bucket, Key="c/d", Body=b"file c/d")
    s3.put_object(Bucket=bucket, Key="c", Body=b"file c")
    for k in ("a", "a/b", "c", "c/d"):
        assert s3.get_object(Bucket=bucket, Key=k)["Body"].read() == b"file " + k.encode()
    listed = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert listed == ["a", "a/b", "c", "c/d"]
    resp = s3.list_objects_v2(Bucket=bucket, Delimiter="/")
    assert [o["Key"] for o in resp.get("Contents", [])] == ["a", "c"]
    assert [p["Prefix"] for p in resp.get("CommonPrefixes", [])] == ["a/", "c/"]


# --------------------------------------------------------------------------
# bad credentials
# --------------------------------------------------------------------------
def test_wrong_secret_is_signature_does_not_match(s3, s3_factory, bucket):
    s3.put_object(Bucket=bucket, Key="guarded", Body=b"guarded data")
    bad = s3_factory(secret_key="not-the-right-secret", max_attempts=1)

    with pytest.raises(ClientError) as ei:
        bad.get_object(Bucket=bucket, Key="guarded")
    assert error_of(ei.value) == ("SignatureDoesNotMatch", 403)

    with pytest.raises(ClientError) as ei:
        bad.list_objects_v2(Bucket=bucket)
    assert error_of(ei.value) == ("SignatureDoesNotMatch", 403)

    with pytest.raises(ClientError) as ei:
        bad.put_object(Bucket=bucket, Key="intruder", Body=b"evil")
    assert error_of(ei.value) == ("SignatureDoesNotMatch", 403)
    with pytest.raises(ClientError) as ei:
        s3.head_object(Bucket=bucket, Key="intruder")
    assert error_of(ei.value)[1] == 404

    with pytest.raises(ClientError) as ei:
        bad.delete_object(Bucket=bucket, Key="guarded")
    assert error_of(ei.value) == ("SignatureDoesNotMatch", 403)
    assert s3.get_object(Bucket=bucket, Key="guarded")["Body"].read() == b"guarded data"


def test_unknown_access_key(s3, s3_factory, bucket):
    bad = s3_factory(access_key="NOSUCHACCESSKEY", max_attempts=1)
    with pytest.raises(ClientError) as ei:
        bad.list_objects_v2(Bucket=bucket)
    assert error_of(ei.value) == ("InvalidAccessKeyId", 403)


# --------------------------------------------------------------------------
# Expect: 100-continue (botocore sends it on PUT/POST with a file-like body:
# upload_file, upload_fileobj, the AWS CLI)
# --------------------------------------------------------------------------
def test_expect_100_continue_empty_then_nonempty_puts(s3, bucket):
    """Zero-length and non-empty file-like bodies alternate on pooled connections."""
    payloads = [b"", os.urandom(1000), b"", b"", os.urandom(70_000), b"", os.urandom(10)]
    for i, payload in enumerate(payloads):
        t0 = time.monotonic()
        resp = s3.put_object(Bucket=bucket, Key=f"expect/{i}", Body=io.BytesIO(payload))
        elapsed = time.monotonic() - t0
        assert resp["ETag"] == f'"{md5_hex(payload)}"'
        assert elapsed < 5, f"PUT #{i} ({len(payload)} bytes) took {elapsed:.1f}s"
    for i, payload in enumerate(payloads):
        assert s3.get_object(Bucket=bucket, Key=f"expect/{i}")["Body"].read() == payload


def _signed_put_headers(endpoint: str, bucket: str, key: str, body: bytes) -> dict:
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    req = AWSRequest(method="PUT", url=f"{endpoint}/{bucket}/{key}", data=body)
    S3SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", REGION).add_auth(req)
    headers = {k: v for k, v in req.headers.items()}
    headers["Host"] = endpoint.split("://", 1)[1]
    headers["Content-Length"] = str(len(body))
    headers["Expect"] = "100-continue"
    return headers


def _read_response_head(f) -> tuple[int, dict]:
    status_line = f.readline()
    assert status_line.startswith(b"HTTP/1.1 "), status_line
    status = int(status_line.split()[1])
    headers = {}
    while True:
        line = f.readline()
        assert line, "connection closed inside a response head"
        if line in (b"\r\n", b"\n"):
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


@pytest.mark.parametrize("size", [0, 200_000])
def test_expect_100_continue_raw(granary_server, s3, bucket, size):
    """The server answers `Expect: 100-continue` with `100 Continue` before it
    reads the body (clients wait up to 1 s for it), or, for an empty body, may
    answer with the final status at once; either way the connection stays usable."""
    body = os.urandom(size)
    key = f"raw-expect-{size}"
    headers = _signed_put_headers(granary_server.endpoint, bucket, key, body)
    head = "PUT /%s/%s HTTP/1.1\r\n" % (bucket, key)
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"

    with socket.create_connection((granary_server.host, granary_server.port), timeout=10) as sock:
        f = sock.makefile("rb")
        sock.sendall(head.encode())
        t0 = time.monotonic()
        status, resp_headers = _read_response_head(f)
        first_wait = time.monotonic() - t0
        if size > 0:
            assert status == 100, (status, resp_headers)
            assert first_wait < 1.0, f"100 Continue took {first_wait:.2f}s"
        if status == 100:
            sock.sendall(body)
            status, resp_headers = _read_response_head(f)
        assert status == 200, (status, resp_headers)
        assert resp_headers.get("etag") == f'"{md5_hex(body)}"'
        length = int(resp_headers.get("content-length", "0"))
        if length:
            f.read(length)

        # the same connection serves a second request
        headers2 = _signed_put_headers(granary_server.endpoint, bucket, key + "-2", b"abc")
        headers2.pop("Expect")
        head2 = "PUT /%s/%s-2 HTTP/1.1\r\n" % (bucket, key)
        head2 += "".join(f"{k}: {v}\r\n" for k, v in headers2.items()) + "\r\n"
        sock.sendall(head2.encode() + b"abc")
        status, resp_headers = _read_response_head(f)
        assert status == 200, (status, resp_headers)
        assert resp_headers.get("etag") == f'"{md5_hex(b"abc")}"'

    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == body
    assert s3.get_object(Bucket=bucket, Key=key + "-2")["Body"].read() == b"abc"


# --------------------------------------------------------------------------
# Signature Version 2 in the Authorization header (s3cmd's signature_v2, old SDKs)
# --------------------------------------------------------------------------
def test_signature_v2_headers_are_accepted(s3_factory, bucket):
    """boto3 signing with SigV2 (`Authorization: AWS key:sig`, botocore's HmacV1Auth)
    writes, reads, lists and deletes; a wrong secret is SignatureDoesNotMatch, an unknown
    key InvalidAccessKeyId, and a stale Date RequestTimeTooSkewed."""
    v2 = s3_factory(signature_version="s3")
    data = os.urandom(100_000)
    key = "v2/dir/object one+ü.bin"
    v2.put_object(Bucket=bucket, Key=key, Body=data, ContentType="application/x-test",
                  Metadata={"who": "v2"})
    got = v2.get_object(Bucket=bucket, Key=key)
    assert got["Body"].read() == data
    assert got["Metadata"] == {"who": "v2"}
    assert v2.get_object(Bucket=bucket, Key=key, Range="bytes=5-9")["Body"].read() == data[5:10]
    assert [o["Key"] for o in v2.list_objects_v2(Bucket=bucket, Prefix="v2/")["Contents"]] == [key]
    v2.delete_object(Bucket=bucket, Key=key)
    with pytest.raises(ClientError) as ei:
        v2.head_object(Bucket=bucket, Key=key)
    assert ei.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404

    wrong = s3_factory(signature_version="s3", secret_key="not-the-secret")
    with pytest.raises(ClientError) as ei:
        wrong.list_objects_v2(Bucket=bucket)
    assert ei.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    unknown = s3_factory(signature_version="s3", access_key="AKIDUNKNOWN")
    with pytest.raises(ClientError) as ei:
        unknown.list_objects_v2(Bucket=bucket)
    assert ei.value.response["Error"]["Code"] == "InvalidAccessKeyId"

    # A request signed an hour ago, sent now; and the same signed now, accepted.
    import base64
    import email.utils
    import hmac

    def v2_get(date: str) -> requests.Response:
        sts = f"GET\n\n\n{date}\n/{bucket}"
        sig = base64.b64encode(hmac.new(SECRET_KEY.encode(), sts.encode(), "sha1").digest())
        return requests.get(f"{v2.meta.endpoint_url}/{bucket}?list-type=2", timeout=HTTP_TIMEOUT,
                            headers={"Date": date,
                                     "Authorization": f"AWS {ACCESS_KEY}:{sig.decode()}"})
    r = v2_get(email.utils.formatdate(time.time() - 3600, usegmt=True))
    assert r.status_code == 403 and "<Code>RequestTimeTooSkewed</Code>" in r.text, r.text
    r = v2_get(email.utils.formatdate(time.time(), usegmt=True))
    assert r.status_code == 200 and "<ListBucketResult" in r.text, r.text
