"""WebDataset reading tar shards through Granary by plain URL
(`http://node/bucket/shard-{000000..000009}.tar`): every sample's bytes equal the
source, the second epoch comes from the cache, and `?archpath=` reads single samples.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import time

import pytest
import requests
import webdataset as wds

from conftest import _free_port, _server_binary, _stop_process, wait_healthy

SHARDS = 10
PER_SHARD = 20


def make_shard(i: int) -> tuple[bytes, dict]:
    """A WebDataset shard: samples `{key}.jpg` (random bytes) and `{key}.cls`."""
    buf = io.BytesIO()
    samples = {}
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for j in range(PER_SHARD):
            key = f"s{i:03}{j:04}"
            jpg = os.urandom(1000 + 997 * j)
            cls = str((i + j) % 10).encode()
            for ext, data in (("jpg", jpg), ("cls", cls)):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                info.mtime = 1_700_000_000
                tar.addfile(info, io.BytesIO(data))
            samples[key] = {"jpg": jpg, "cls": cls}
    return buf.getvalue(), samples


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """An open node over an fs backend holding the shards; yields (endpoint, samples)."""
    root = tmp_path_factory.mktemp("wds")
    bucket = root / "origin" / "data"
    bucket.mkdir(parents=True)
    samples = {}
    for i in range(SHARDS):
        data, s = make_shard(i)
        (bucket / f"shard-{i:06}.tar").write_bytes(data)
        samples.update(s)
    port = _free_port()
    log = open(root / "granary.log", "wb")
    proc = subprocess.Popen(
        [str(_server_binary()), "serve", "--listen", f"127.0.0.1:{port}",
         "--data-dir", str(root), "--cache-capacity", "1GiB"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        why = wait_healthy(endpoint, proc)
        assert why is None, f"{why}\n" + (root / "granary.log").read_text()[-4000:]
        yield endpoint, samples
    finally:
        _stop_process(proc)


def stats(endpoint: str) -> dict:
    return requests.get(f"{endpoint}/_granary/stats", timeout=10).json()


def settle(endpoint: str) -> None:
    deadline = time.monotonic() + 10
    while stats(endpoint)["reserved_bytes"] != 0:
        assert time.monotonic() < deadline, "fills still in flight"
        time.sleep(0.05)


def epoch(endpoint: str) -> dict:
    url = f"{endpoint}/data/shard-{{000000..{SHARDS - 1:06}}}.tar"
    seen = {}
    for sample in wds.WebDataset(url, shardshuffle=False):
        seen[sample["__key__"]] = {"jpg": sample["jpg"], "cls": sample["cls"]}
    return seen


def test_webdataset_reads_every_sample_through_granary(node):
    endpoint, samples = node
    total = sum(len(v["jpg"]) + len(v["cls"]) for v in samples.values())
    before = stats(endpoint)
    first = epoch(endpoint)
    assert first == samples, "every sample's bytes, first (cold) epoch"
    settle(endpoint)
    mid = stats(endpoint)
    # The shards came from the backend once (the tar framing adds headers and padding).
    assert mid["bytes_from_backend"] - before["bytes_from_backend"] >= total
    assert mid["misses"] - before["misses"] == SHARDS
    second = epoch(endpoint)
    assert second == samples, "every sample's bytes, second epoch"
    after = stats(endpoint)
    assert after["bytes_from_backend"] == mid["bytes_from_backend"], "the second epoch is cached"
    assert after["hits"] - mid["hits"] == SHARDS


def test_archpath_reads_single_samples(node):
    endpoint, samples = node
    for key in ("s0000000", "s0040007", "s0090019"):
        shard = int(key[1:4])
        for ext in ("jpg", "cls"):
            r = requests.get(f"{endpoint}/data/shard-{shard:06}.tar",
                             params={"archpath": f"{key}.{ext}"}, timeout=30)
            assert r.status_code == 200, r.text[:300]
            assert r.content == samples[key][ext]
    r = requests.get(f"{endpoint}/data/shard-000000.tar", params={"archpath": "nope.jpg"},
                     timeout=30)
    assert r.status_code == 404
    assert "<Code>NoSuchKey</Code>" in r.text
