"""HTTPS with `--tls-cert/--tls-key`: a self-signed certificate made here, boto3 trusting
exactly it (uploads, a multipart upload, downloads, listings, presigned URLs), a client
that does not trust it refused, plain HTTP to the TLS port refused; and two nodes whose
peer URLs are https, so that a read through one node of a key the other owns crosses TLS
between them.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import os
import subprocess
from pathlib import Path

import botocore.exceptions
import pytest
import requests
from boto3.s3.transfer import TransferConfig
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from conftest import _free_port, _server_binary, _stop_process, make_s3_client, wait_members_up
from granary_testutil import ACCESS_KEY, SECRET_KEY, MiB, unique_bucket_name


def self_signed(dir: Path) -> tuple[Path, Path]:
    """A P-256 certificate for localhost and 127.0.0.1, valid for a day; (cert, key)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "granary test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = dir / "cert.pem", dir / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def start_nodes(root: Path, cert: Path, key: Path, ids: list[str]):
    """Nodes over one fs backend, each serving HTTPS; their peer URLs are https."""
    origin = root / "origin"
    origin.mkdir(exist_ok=True)
    ports = [_free_port() for _ in ids]
    peers = []
    if len(ids) > 1:
        for node_id, port in zip(ids, ports):
            peers += ["--peer", f"{node_id}=https://127.0.0.1:{port}"]
    procs = []
    for node_id, port in zip(ids, ports):
        log = open(root / f"{node_id}.log", "wb")
        procs.append(subprocess.Popen(
            [str(_server_binary()), "serve", "--listen", f"127.0.0.1:{port}",
             "--data-dir", str(root / node_id), "--backend", f"fs:{origin}",
             "--node-id", node_id, "--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY,
             "--tls-cert", str(cert), "--tls-key", str(key), *peers],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
    endpoints = [f"https://127.0.0.1:{p}" for p in ports]
    try:
        wait_members_up(endpoints, procs, [root / f"{i}.log" for i in ids], verify=str(cert))
    except BaseException:
        for p in procs:
            _stop_process(p)
        raise
    return procs, endpoints


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    root = tmp_path_factory.mktemp("tls")
    cert, key = self_signed(root)
    procs, endpoints = start_nodes(root, cert, key, ["t0"])
    try:
        yield endpoints[0], cert
    finally:
        for p in procs:
            _stop_process(p)


def test_boto3_over_https_with_the_certificate(tls, tmp_path):
    endpoint, cert = tls
    s3 = make_s3_client(endpoint, verify=str(cert))
    bucket = unique_bucket_name("tls")
    s3.create_bucket(Bucket=bucket)
    small = os.urandom(100_000)
    s3.put_object(Bucket=bucket, Key="small.bin", Body=small)
    got = s3.get_object(Bucket=bucket, Key="small.bin")
    assert got["Body"].read() == small
    assert got["ETag"].strip('"') == hashlib.md5(small).hexdigest()
    assert s3.get_object(Bucket=bucket, Key="small.bin", Range="bytes=10-19")["Body"].read() \
        == small[10:20]

    big = os.urandom(12 * MiB + 5)
    src = tmp_path / "big.bin"
    src.write_bytes(big)
    config = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
    s3.upload_file(str(src), bucket, "big.bin", Config=config)
    dst = tmp_path / "back.bin"
    s3.download_file(bucket, "big.bin", str(dst), Config=config)
    assert dst.read_bytes() == big

    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert keys == ["big.bin", "small.bin"]
    url = s3.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": "small.bin"}, ExpiresIn=300)
    assert url.startswith("https://")
    r = requests.get(url, verify=str(cert), timeout=10)
    assert r.status_code == 200 and r.content == small
    # A wrong secret is refused over TLS as over HTTP.
    bad = make_s3_client(endpoint, secret_key="not-the-secret", verify=str(cert))
    with pytest.raises(botocore.exceptions.ClientError) as e:
        bad.get_object(Bucket=bucket, Key="small.bin")
    assert e.value.response["Error"]["Code"] == "SignatureDoesNotMatch"


def test_clients_that_do_not_trust_it_or_speak_plain_http_are_refused(tls):
    endpoint, _ = tls
    # The system's CA bundle does not hold the test certificate.
    s3 = make_s3_client(endpoint)
    with pytest.raises(botocore.exceptions.SSLError):
        s3.list_buckets()
    # Plain HTTP to the TLS port never gets an HTTP answer.
    plain = endpoint.replace("https://", "http://")
    with pytest.raises(requests.RequestException):
        requests.get(f"{plain}/_granary/health", timeout=5)
    # The node goes on serving.
    r = requests.get(f"{endpoint}/_granary/health", verify=str(tls[1]), timeout=5)
    assert r.status_code == 200


def test_peers_speak_https_to_each_other(tmp_path):
    cert, key = self_signed(tmp_path)
    procs, endpoints = start_nodes(tmp_path, cert, key, ["a", "b"])
    try:
        s3 = [make_s3_client(e, verify=str(cert)) for e in endpoints]
        bucket = unique_bucket_name("tlspeer")
        s3[0].create_bucket(Bucket=bucket)
        data = {f"k{i:02}": os.urandom(50_000 + i) for i in range(12)}
        for k, v in data.items():
            s3[0].put_object(Bucket=bucket, Key=k, Body=v)
        # Every key read through each node: half of them are the other node's, proxied.
        nodes = set()
        for client in s3:
            for k, v in data.items():
                got = client.get_object(Bucket=bucket, Key=k)
                assert got["Body"].read() == v
                nodes.add(got["ResponseMetadata"]["HTTPHeaders"]["x-granary-node"])
        assert nodes == {"a", "b"}
        stats = [requests.get(f"{e}/_granary/stats", verify=str(cert), timeout=5).json()
                 for e in endpoints]
        assert sum(s["proxied"] for s in stats) >= len(data)
    finally:
        for p in procs:
            _stop_process(p)
