"""S3 behaviours real clients depend on, checked through boto3 against a Granary node and,
where moto gets them right, against moto too: the same test, the same assertions.

- `both`: runs on Granary and on moto.
- `granary`: runs on Granary only; the docstring says what moto does differently.
"""

from __future__ import annotations

import threading
import time

import pytest
import requests
from botocore.exceptions import ClientError

from conftest import MOTO_KEY, make_s3_client
from granary_testutil import MiB, md5_hex, multipart_etag, unique_bucket_name


def error_of(exc: ClientError) -> tuple[str, int]:
    return (exc.value.response.get("Error", {}).get("Code"),
            exc.value.response.get("ResponseMetadata", {}).get("HTTPStatusCode"))


@pytest.fixture(params=["granary", "moto"])
def both(request, granary_server, moto_endpoint):
    """An S3 client of Granary or of moto, and a fresh bucket on it."""
    if request.param == "granary":
        s3 = make_s3_client(granary_server.endpoint)
    else:
        s3 = make_s3_client(moto_endpoint, access_key=MOTO_KEY, secret_key=MOTO_KEY)
    name = unique_bucket_name("fid")
    s3.create_bucket(Bucket=name)
    yield s3, name


@pytest.fixture
def granary(granary_server):
    s3 = make_s3_client(granary_server.endpoint)
    name = unique_bucket_name("fid")
    s3.create_bucket(Bucket=name)
    yield s3, name


def _two_part_object(s3, bucket, key, sizes=(5 * MiB, 1024)):
    parts = [bytes([65 + i]) * n for i, n in enumerate(sizes)]
    up = s3.create_multipart_upload(Bucket=bucket, Key=key)
    done = []
    for i, data in enumerate(parts, 1):
        r = s3.upload_part(Bucket=bucket, Key=key, UploadId=up["UploadId"], PartNumber=i,
                           Body=data)
        done.append({"PartNumber": i, "ETag": r["ETag"]})
    return up["UploadId"], done, parts


# ---------------------------------------------------------------------------
# Reads
# ---------------------------------------------------------------------------
def test_an_empty_objects_416_names_its_size(both):
    """The AWS CRT (s3torchconnector, Mountpoint) opens every GET with a range and, on
    416, reads the object's size from `ActualObjectSize`."""
    s3, bucket = both
    s3.put_object(Bucket=bucket, Key="empty", Body=b"")
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="empty", Range="bytes=0-8388607")
    assert error_of(e) == ("InvalidRange", 416)
    assert e.value.response["Error"]["ActualObjectSize"] == "0"
    s3.put_object(Bucket=bucket, Key="ten", Body=b"0123456789")
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="ten", Range="bytes=10-")
    assert e.value.response["Error"]["ActualObjectSize"] == "10"


def test_the_tail_of_an_empty_object_is_the_empty_object(granary):
    """AWS answers `bytes=-N` (N > 0) of an empty object `200` with no body and no
    `Content-Range`, where RFC 9110 would find nothing to send: readers that ask for a
    file's tail before its size (Parquet footers, Trino, Arrow's object_store) read empty
    files so. Any other range of it stays `416`."""
    s3, bucket = granary
    s3.put_object(Bucket=bucket, Key="empty", Body=b"")
    r = s3.get_object(Bucket=bucket, Key="empty", Range="bytes=-512")
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert r["Body"].read() == b"" and r["ContentLength"] == 0
    assert "ContentRange" not in r
    for bad in ("bytes=-0", "bytes=0-"):
        with pytest.raises(ClientError) as e:
            s3.get_object(Bucket=bucket, Key="empty", Range=bad)
        assert error_of(e) == ("InvalidRange", 416), bad
    s3.put_object(Bucket=bucket, Key="ten", Body=b"0123456789")
    r = s3.get_object(Bucket=bucket, Key="ten", Range="bytes=-3")
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert (r["Body"].read(), r["ContentRange"]) == (b"789", "bytes 7-9/10")


def test_a_304_carries_the_etag(both):
    s3, bucket = both
    etag = s3.put_object(Bucket=bucket, Key="k", Body=b"abc")["ETag"]
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="k", IfNoneMatch=etag)
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 304
    assert e.value.response["ResponseMetadata"]["HTTPHeaders"]["etag"] == etag


def test_get_by_part_number(granary):
    """Clients that download by part (the CRT, the Java and Go transfer managers) get each
    part's bytes, never the whole object as if it were the part. (moto 5 answers
    `PartsCount` but serves part 1 of a whole object with `200`.) Over the S3 backend:
    `test_s3_backend.py`."""
    check_get_by_part_number(*granary)


def check_get_by_part_number(s3, bucket):
    upload_id, done, parts = _two_part_object(s3, bucket, "mp")
    s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=upload_id,
                                 MultipartUpload={"Parts": done})
    total = sum(len(p) for p in parts)
    r = s3.get_object(Bucket=bucket, Key="mp", PartNumber=1)
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert r["ContentRange"] == f"bytes 0-{len(parts[0]) - 1}/{total}"
    assert r["PartsCount"] == 2
    assert r["Body"].read() == parts[0]
    r = s3.get_object(Bucket=bucket, Key="mp", PartNumber=2)
    assert r["ContentRange"] == f"bytes {len(parts[0])}-{total - 1}/{total}"
    assert r["Body"].read() == parts[1]
    h = s3.head_object(Bucket=bucket, Key="mp", PartNumber=2)
    assert h["ContentLength"] == len(parts[1])
    assert h["PartsCount"] == 2
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="mp", PartNumber=3)
    assert error_of(e) == ("InvalidPartNumber", 416)
    # An object written whole is one part.
    s3.put_object(Bucket=bucket, Key="whole", Body=b"xyz")
    r = s3.get_object(Bucket=bucket, Key="whole", PartNumber=1)
    assert r["Body"].read() == b"xyz"
    assert r["ContentRange"] == "bytes 0-2/3"
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="whole", PartNumber=2)
    assert error_of(e) == ("InvalidPartNumber", 416)
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="whole", PartNumber=1, Range="bytes=0-1")
    assert error_of(e)[1] == 400


# ---------------------------------------------------------------------------
# Sub-resources
# ---------------------------------------------------------------------------
def test_the_owner_has_full_control(both):
    """s3cmd `info` and `cp`, and boto3's get_object_acl, read ACLs."""
    s3, bucket = both
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    for acl in (s3.get_bucket_acl(Bucket=bucket), s3.get_object_acl(Bucket=bucket, Key="k")):
        assert [g["Permission"] for g in acl["Grants"]] == ["FULL_CONTROL"]
        assert acl["Grants"][0]["Grantee"]["ID"] == acl["Owner"]["ID"]
    s3.put_object_acl(Bucket=bucket, Key="k", ACL="private")
    s3.put_bucket_acl(Bucket=bucket, ACL="private")
    with pytest.raises(ClientError) as e:
        s3.get_object_acl(Bucket=bucket, Key="missing")
    assert error_of(e) == ("NoSuchKey", 404)


def test_what_granary_does_not_serve_is_not_implemented(granary):
    """S3, MinIO and Ceph answer `501 NotImplemented` for what they do not serve. (moto
    serves these.)"""
    s3, bucket = granary
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    calls = [
        lambda: s3.get_bucket_policy(Bucket=bucket),
        lambda: s3.get_bucket_tagging(Bucket=bucket),
        lambda: s3.get_object_tagging(Bucket=bucket, Key="k"),
        lambda: s3.put_bucket_acl(Bucket=bucket, ACL="public-read"),
        lambda: s3.get_bucket_lifecycle_configuration(Bucket=bucket),
    ]
    for call in calls:
        with pytest.raises(ClientError) as e:
            call()
        assert error_of(e) == ("NotImplemented", 501)


# ---------------------------------------------------------------------------
# Keys, listings, buckets
# ---------------------------------------------------------------------------
def test_delete_objects_keeps_white_space_in_keys(both):
    s3, bucket = both
    keys = [" ", "_ ", " a", "b\t"]
    for k in keys:
        s3.put_object(Bucket=bucket, Key=k, Body=k.encode())
    r = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys]})
    assert sorted(d["Key"] for d in r["Deleted"]) == sorted(keys)
    assert r.get("Errors", []) == []
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0


def test_max_keys_zero_is_not_truncated(both):
    s3, bucket = both
    s3.put_object(Bucket=bucket, Key="a", Body=b"x")
    v2 = s3.list_objects_v2(Bucket=bucket, MaxKeys=0)
    assert (v2["IsTruncated"], v2["KeyCount"], v2.get("Contents")) == (False, 0, None)
    v1 = s3.list_objects(Bucket=bucket, MaxKeys=0)
    assert (v1["IsTruncated"], v1.get("Contents")) == (False, None)


def test_owners_in_listings(both):
    s3, bucket = both
    s3.put_object(Bucket=bucket, Key="a", Body=b"x")
    assert "Owner" not in s3.list_objects_v2(Bucket=bucket)["Contents"][0]
    owner = s3.list_objects_v2(Bucket=bucket, FetchOwner=True)["Contents"][0]["Owner"]
    assert owner["ID"]
    assert s3.list_objects(Bucket=bucket)["Contents"][0]["Owner"]["ID"] == owner["ID"]


def test_list_buckets_in_pages(granary):
    """`max-buckets` and `continuation-token`. (moto 5 ignores `max-buckets`.)"""
    s3, bucket = granary
    prefix = unique_bucket_name("pg")
    names = [f"{prefix}-{i}" for i in range(3)]
    for n in names:
        s3.create_bucket(Bucket=n)
    seen, token = [], None
    for _ in range(5):
        kw = {"MaxBuckets": 2, "Prefix": prefix}
        if token:
            kw["ContinuationToken"] = token
        r = s3.list_buckets(**kw)
        seen += [b["Name"] for b in r["Buckets"]]
        assert len(r["Buckets"]) <= 2
        token = r.get("ContinuationToken")
        if not token:
            break
    assert seen == names


def test_creating_your_own_bucket_again_succeeds(both):
    """As S3 answers in us-east-1."""
    s3, bucket = both
    r = s3.create_bucket(Bucket=bucket)
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 200


# ---------------------------------------------------------------------------
# Conditional writes
# ---------------------------------------------------------------------------
def test_conditional_puts(both):
    """Checkpointing code writes with `If-None-Match: *` (create once) and `If-Match`
    (replace only the version it read)."""
    s3, bucket = both
    first = s3.put_object(Bucket=bucket, Key="ckpt", Body=b"v1", IfNoneMatch="*")["ETag"]
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="ckpt", Body=b"v2", IfNoneMatch="*")
    assert error_of(e) == ("PreconditionFailed", 412)
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="ckpt", Body=b"v2", IfMatch='"' + "0" * 32 + '"')
    assert error_of(e) == ("PreconditionFailed", 412)
    assert s3.get_object(Bucket=bucket, Key="ckpt")["Body"].read() == b"v1"
    s3.put_object(Bucket=bucket, Key="ckpt", Body=b"v3", IfMatch=first)
    assert s3.get_object(Bucket=bucket, Key="ckpt")["Body"].read() == b"v3"
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="never", Body=b"x", IfMatch=first)
    assert error_of(e) == ("NoSuchKey", 404)


def test_of_racing_creations_one_wins(granary):
    """Eight writers create one key with `If-None-Match: *` at once: one succeeds, seven
    are refused, and the object is the winner's."""
    s3, bucket = granary
    outcomes: dict[int, str] = {}

    def create(i):
        c = make_s3_client(s3.meta.endpoint_url)
        try:
            c.put_object(Bucket=bucket, Key="lock", Body=str(i).encode(), IfNoneMatch="*")
            outcomes[i] = "ok"
        except ClientError as e:
            outcomes[i] = e.response["Error"]["Code"]

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, o in outcomes.items() if o == "ok"]
    assert len(winners) == 1, outcomes
    assert sorted(o for o in outcomes.values() if o != "ok") == ["PreconditionFailed"] * 7
    assert s3.get_object(Bucket=bucket, Key="lock")["Body"].read() == str(winners[0]).encode()


def test_conditional_complete(both):
    s3, bucket = both
    s3.put_object(Bucket=bucket, Key="mp", Body=b"old")
    upload_id, done, _ = _two_part_object(s3, bucket, "mp")
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=upload_id,
                                     MultipartUpload={"Parts": done}, IfNoneMatch="*")
    assert error_of(e) == ("PreconditionFailed", 412)
    assert s3.get_object(Bucket=bucket, Key="mp")["Body"].read() == b"old"


# ---------------------------------------------------------------------------
# Multipart
# ---------------------------------------------------------------------------
def test_completing_twice_succeeds_with_the_same_etag(both):
    s3, bucket = both
    upload_id, done, parts = _two_part_object(s3, bucket, "mp")
    first = s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=upload_id,
                                         MultipartUpload={"Parts": done})
    again = s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=upload_id,
                                         MultipartUpload={"Parts": done})
    assert again["ETag"] == first["ETag"] == multipart_etag(b"".join(parts), 5 * MiB)


def test_upload_part_copy_past_the_source_end_is_refused(granary):
    """A copied part names bytes the source has, every one. (moto 5 copies what there
    is.)"""
    s3, bucket = granary
    s3.put_object(Bucket=bucket, Key="src", Body=b"x" * 100)
    up = s3.create_multipart_upload(Bucket=bucket, Key="dst")
    with pytest.raises(ClientError) as e:
        s3.upload_part_copy(Bucket=bucket, Key="dst", UploadId=up["UploadId"], PartNumber=1,
                            CopySource={"Bucket": bucket, "Key": "src"},
                            CopySourceRange="bytes=0-100")
    assert error_of(e)[1] in (400, 416)
    r = s3.upload_part_copy(Bucket=bucket, Key="dst", UploadId=up["UploadId"], PartNumber=1,
                            CopySource={"Bucket": bucket, "Key": "src"},
                            CopySourceRange="bytes=0-99")
    assert r["CopyPartResult"]["ETag"] == '"' + md5_hex(b"x" * 100) + '"'


def test_a_completed_upload_is_cached(granary, granary_server):
    """`aws s3 cp` uploads every file over 8 MiB in parts: the dataset it uploads starts
    warm, as one PUT's does. The node caches the object once it is complete, before
    anyone reads it; its first read is a hit."""
    s3, bucket = granary
    upload_id, done, parts = _two_part_object(s3, bucket, "mp")

    def held() -> int:
        return requests.get(f"{granary_server.endpoint}/_granary/stats", timeout=5).json()["objects"]

    before = held()
    s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=upload_id,
                                 MultipartUpload={"Parts": done})
    deadline = time.monotonic() + 10
    while held() == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert held() == before + 1
    r = s3.get_object(Bucket=bucket, Key="mp")
    assert r["ResponseMetadata"]["HTTPHeaders"].get("x-granary-cache") == "hit"
    assert r["Body"].read() == b"".join(parts)


# ---------------------------------------------------------------------------
# Authentication
# ---------------------------------------------------------------------------
def test_presigned_urls_valid_for_longer_than_a_week_or_less_than_nothing(granary):
    """Refused as expired ones are: `403 AccessDenied`. (moto does not check
    signatures.)"""
    _, bucket = granary
    s3 = make_s3_client(granary[0].meta.endpoint_url, signature_version="s3v4")
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    week = 7 * 24 * 3600
    ok = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "k"},
                                   ExpiresIn=week)
    assert requests.get(ok, timeout=10).content == b"x"
    long = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "k"},
                                     ExpiresIn=week + 1)
    negative = ok.replace(f"X-Amz-Expires={week}", "X-Amz-Expires=-1")
    assert negative != ok
    for url in (long, negative):
        r = requests.get(url, timeout=10)
        assert r.status_code == 403
        assert "<Code>AccessDenied</Code>" in r.text


# ---------------------------------------------------------------------------
# Checksums, attributes, metadata
# ---------------------------------------------------------------------------
def _b64sha256(data: bytes) -> str:
    import base64
    import hashlib
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


def test_a_puts_checksum_is_returned_in_checksum_mode(granary):
    """(moto 5 does not return it.)"""
    s3, bucket = granary
    body = b"A" * 1024
    ck = _b64sha256(body)
    s3.put_object(Bucket=bucket, Key="k", Body=body, ChecksumSHA256=ck)
    assert "ChecksumSHA256" not in s3.head_object(Bucket=bucket, Key="k")
    assert s3.head_object(Bucket=bucket, Key="k", ChecksumMode="ENABLED")["ChecksumSHA256"] == ck


def test_a_completions_composite_checksum_is_checked_and_kept(granary):
    """The SHA-256 of the parts' SHA-256 digests, then `-N`; GetObjectAttributes names
    it and each part's. (moto 5 refuses the correct composite.)"""
    import base64
    import hashlib
    s3, bucket = granary
    parts = [b"A" * (5 * MiB), b"B" * 1024]
    up = s3.create_multipart_upload(Bucket=bucket, Key="mp", ChecksumAlgorithm="SHA256")
    assert up["ChecksumAlgorithm"] == "SHA256"
    done = []
    for i, data in enumerate(parts, 1):
        r = s3.upload_part(Bucket=bucket, Key="mp", UploadId=up["UploadId"], PartNumber=i,
                           Body=data, ChecksumSHA256=_b64sha256(data))
        done.append({"PartNumber": i, "ETag": r["ETag"], "ChecksumSHA256": r["ChecksumSHA256"]})
    digests = b"".join(base64.b64decode(_b64sha256(p)) for p in parts)
    composite = base64.b64encode(hashlib.sha256(digests).digest()).decode() + "-2"
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=up["UploadId"],
                                     MultipartUpload={"Parts": done},
                                     ChecksumSHA256=_b64sha256(b"other") + "-2")
    assert error_of(e) == ("BadDigest", 400)
    r = s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=up["UploadId"],
                                     MultipartUpload={"Parts": done}, ChecksumSHA256=composite)
    assert (r["ChecksumSHA256"], r["ChecksumType"]) == (composite, "COMPOSITE")
    h = s3.head_object(Bucket=bucket, Key="mp", ChecksumMode="ENABLED")
    assert (h["ChecksumSHA256"], h["ChecksumType"]) == (composite, "COMPOSITE")
    p2 = s3.get_object(Bucket=bucket, Key="mp", PartNumber=2)
    assert p2["ChecksumSHA256"] == _b64sha256(parts[1])
    a = s3.get_object_attributes(Bucket=bucket, Key="mp",
                                 ObjectAttributes=["ETag", "Checksum", "ObjectParts",
                                                   "ObjectSize"])
    assert a["ObjectSize"] == sum(map(len, parts))
    assert a["Checksum"]["ChecksumSHA256"] == composite
    assert [p["Size"] for p in a["ObjectParts"]["Parts"]] == [len(p) for p in parts]
    assert [p["ChecksumSHA256"] for p in a["ObjectParts"]["Parts"]] == [
        _b64sha256(p) for p in parts]


def test_non_ascii_metadata_reads_back(granary):
    """A value beyond ASCII is kept and sent back in the bytes botocore reads it from.
    (moto 5 sends back other bytes.)"""
    s3, bucket = granary

    def set_meta(**kwargs):
        kwargs["params"]["headers"]["x-amz-meta-label"] = "caf\u00e9"

    s3.meta.events.register("before-call.s3.PutObject", set_meta)
    try:
        s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    finally:
        s3.meta.events.unregister("before-call.s3.PutObject", set_meta)
    assert s3.get_object(Bucket=bucket, Key="k")["Metadata"]["label"] == "caf\u00e9"


def test_a_cors_preflight_is_refused_clearly(granary, granary_server):
    s3, bucket = granary
    url = f"{granary_server.endpoint}/{bucket}/k"
    assert requests.options(url, timeout=5).status_code == 400
    r = requests.options(url, headers={"Origin": "http://example.com",
                                       "Access-Control-Request-Method": "GET"}, timeout=5)
    assert r.status_code == 403 and "<Code>AccessDenied</Code>" in r.text


def test_list_objects_v1_sends_its_prefix_back_as_given(both):
    s3, bucket = both
    s3.put_object(Bucket=bucket, Key="a b/+c%", Body=b"x")
    r = s3.list_objects(Bucket=bucket, Prefix="a b/+")
    assert r["Prefix"] == "a b/+"
    assert [o["Key"] for o in r["Contents"]] == ["a b/+c%"]
