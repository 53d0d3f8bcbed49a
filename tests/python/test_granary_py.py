"""The `granary` Python package (client/python) against real nodes: the Client's calls,
and ShardDataset under torch's DataLoader — every sample once per epoch for world sizes
1–4 with 0 and 2 workers, equal counts per rank, the order a function of seed and epoch,
resume on another world size, reads routed to each shard's owner in a 3-node cluster.
"""

from __future__ import annotations

import collections
import contextlib
import gzip
import io
import os
import random
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
import requests

from conftest import _free_port, _server_binary, _stop_process, wait_members_up
from granary_testutil import ACCESS_KEY, SECRET_KEY

granary = pytest.importorskip("granary")
torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

BUCKET = "train"
# Samples per shard: uneven, 60 in all (not a multiple of 7 or 8, a multiple of 1–6).
COUNTS = [8, 12, 5, 10, 9, 7, 9]


def make_shard(i: int, n: int) -> tuple[bytes, dict[str, dict[str, bytes]]]:
    """A WebDataset shard of `n` samples, `{key}.bin` (random) and `{key}.cls`, with a
    member that is no sample (`README`) between two."""
    rng = random.Random(i)
    buf = io.BytesIO()
    samples = {}
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for j in range(n):
            key = f"s{i:02}/{j:03}"
            members = {"bin": rng.randbytes(100 + 1777 * j), "cls": str(j % 10).encode()}
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            if j == 2:
                info = tarfile.TarInfo("README")
                info.size = 5
                tar.addfile(info, io.BytesIO(b"notes"))
            samples[key] = members
    return buf.getvalue(), samples


def write_dataset(origin: Path, prefix: str, counts=COUNTS,
                  gzip_every: int = 0) -> dict[str, dict[str, bytes]]:
    """Shards under `origin/train/prefix` (every `gzip_every`-th one a `.tar.gz`); every
    sample by key."""
    d = origin / BUCKET / prefix
    d.mkdir(parents=True, exist_ok=True)
    every = {}
    for i, n in enumerate(counts):
        data, samples = make_shard(i, n)
        if gzip_every and i % gzip_every == 0:
            (d / f"shard-{i:04}.tar.gz").write_bytes(gzip.compress(data))
        else:
            (d / f"shard-{i:04}.tar").write_bytes(data)
        every.update(samples)
    return every


def start_node(root: Path, origin: Path, node_id: str, port: int, peers: list[str],
               creds: bool, extra: list[str] = (), capacity: str = "1GiB") -> subprocess.Popen:
    log = open(root / f"{node_id}.log", "wb")
    args = [str(_server_binary()), "serve", "--listen", f"127.0.0.1:{port}",
            "--data-dir", str(root / node_id), "--backend", f"fs:{origin}",
            "--cache-capacity", capacity, "--node-id", node_id, *peers, *extra]
    if creds:
        args += ["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY]
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)


@contextlib.contextmanager
def one_node(root: Path, origin: Path, node_id: str, creds: bool = False,
             extra: list[str] = ()):
    """A node of its own over `origin`, up: its endpoint; stopped after."""
    port = _free_port()
    proc = start_node(root, origin, node_id, port, [], creds=creds, extra=extra)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_members_up([endpoint], [proc], [root / f"{node_id}.log"])
        yield endpoint
    finally:
        _stop_process(proc)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """One open node over an fs origin holding the dataset: (endpoint, samples, root)."""
    root = tmp_path_factory.mktemp("pynode")
    origin = root / "origin"
    every = write_dataset(origin, "ds")
    with one_node(root, origin, "solo", extra=["--listen-unix", str(root / "g.sock")]) as e:
        yield e, every, root


@contextlib.contextmanager
def members(root: Path, origin: Path, ids: list[str], creds: bool,
            extra: list[str] = ()):
    """A cluster of `ids` over `origin`, every member up: their endpoints; stopped after."""
    ports = [_free_port() for _ in ids]
    peers = []
    for i, p in zip(ids, ports):
        peers += ["--peer", f"{i}=http://127.0.0.1:{p}"]
    procs = []
    try:
        for i, p in zip(ids, ports):
            procs.append(start_node(root, origin, i, p, peers, creds=creds, extra=extra))
        endpoints = [f"http://127.0.0.1:{p}" for p in ports]
        wait_members_up(endpoints, procs, [root / f"{i}.log" for i in ids])
        yield endpoints
    finally:
        for p in procs:
            _stop_process(p)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Three credentialed nodes over one origin: (endpoints, samples, origin)."""
    root = tmp_path_factory.mktemp("pycluster")
    origin = root / "origin"
    every = write_dataset(origin, "ds", counts=[6] * 12)
    with members(root, origin, ["n0", "n1", "n2"], creds=True) as endpoints:
        yield endpoints, every, origin


def as_list(batch):
    return batch


def check_bytes(sample: dict, every: dict) -> str:
    key = sample["__key__"]
    assert sample["bin"] == every[key]["bin"], key
    assert sample["cls"] == every[key]["cls"], key
    assert sample["__url__"].startswith("ds/shard-")
    return key


def read_rank(endpoint, rank, world, workers, every, *, epoch=0, seed=7, drop_last=False,
              batch=4, buffer=0, state=None, limit=None, **kw) -> list[str]:
    ds = granary.ShardDataset(endpoint, BUCKET, "ds/", seed=seed, shuffle_buffer=buffer,
                              rank=rank, world_size=world, drop_last=drop_last,
                              batch_size=batch, **kw)
    if state is not None:
        ds.load_state_dict(state)
    else:
        ds.set_epoch(epoch)
    loader = DataLoader(ds, batch_size=batch, num_workers=workers, collate_fn=as_list)
    keys = []
    for i, b in enumerate(loader):
        if limit is not None and i == limit:
            break
        keys += [check_bytes(s, every) for s in b]
    if limit is None:
        assert len(keys) == len(ds)
    return keys


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_sample_once_per_epoch_with_equal_counts_per_rank(node, world, workers):
    endpoint, every, _ = node
    n = len(every)
    for drop_last in (False, True):
        per_rank = [read_rank(endpoint, r, world, workers, every, drop_last=drop_last,
                              buffer=5 if drop_last else 0)
                    for r in range(world)]
        counts = {len(k) for k in per_rank}
        assert len(counts) == 1, f"unequal counts per rank: {counts}"
        seen = collections.Counter(k for keys in per_rank for k in keys)
        q = counts.pop()
        if drop_last:
            assert q == n // world
            assert len(seen) == q * world and set(seen.values()) == {1}
        else:
            assert q == -(-n // world)
            assert set(seen) == set(every)
            # Only the padding repeats, and each padded sample comes twice at most.
            assert sum(seen.values()) - n == q * world - n
            assert max(seen.values()) <= 2


def test_the_order_is_a_function_of_seed_and_epoch(node):
    endpoint, every, _ = node
    a = read_rank(endpoint, 1, 2, 0, every, epoch=3, buffer=6)
    b = read_rank(endpoint, 1, 2, 2, every, epoch=3, buffer=6)
    assert a == b, "workers changed the order the rank's loop sees"
    assert read_rank(endpoint, 1, 2, 0, every, epoch=4, buffer=6) != a
    assert read_rank(endpoint, 1, 2, 0, every, epoch=3, buffer=6, seed=8) != a


def test_the_known_order_is_the_order_the_loop_sees(node):
    """`Shards.order`, what a prefetcher outside the dataset reads ahead by: the shard of
    each sample the rank's loop sees, in turn, with its place in the rank's span, which
    reads each shard in one stretch."""
    endpoint, every, _ = node
    ds = granary.ShardDataset(endpoint, BUCKET, "ds/", seed=7, shuffle_buffer=6, rank=1,
                              world_size=2, batch_size=4)
    ds.set_epoch(3)
    order = ds._shards.order(ds._epoch_read(world_size=2, rank=1))
    loader = DataLoader(ds, batch_size=4, num_workers=2, collate_fn=as_list)
    seen = [check_bytes(s, every) and s["__url__"] for b in loader for s in b]
    assert [ds.shards[sh] for sh, _ in order] == seen
    span = [sh for _, sh in sorted((p, sh) for sh, p in order)]
    assert sorted(p for _, p in order) == list(range(len(order)))
    runs = [sh for i, sh in enumerate(span) if i == 0 or sh != span[i - 1]]
    assert len(runs) == len(set(runs)), f"a shard read in two stretches: {runs}"


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_on_fewer_ranks_loses_and_repeats_nothing(node, workers):
    endpoint, every, _ = node
    # 4 ranks consume 3 batches of 2 each (24 samples), then the job comes back on 3.
    first = [read_rank(endpoint, r, 4, workers, every, batch=2, buffer=4, limit=3)
             for r in range(4)]
    assert all(len(k) == 6 for k in first)
    ds = granary.ShardDataset(endpoint, BUCKET, "ds/", seed=7, shuffle_buffer=4, rank=0,
                              world_size=4, batch_size=2)
    ds.set_epoch(0)
    state = ds.state_dict(consumed=24)
    rest = [read_rank(endpoint, r, 3, workers, every, batch=2, buffer=4, state=state)
            for r in range(3)]
    assert [len(k) for k in rest] == [12, 12, 12]
    seen = collections.Counter(k for keys in first + rest for k in keys)
    assert set(seen) == set(every) and set(seen.values()) == {1}
    # Once more, 3 → 2 ranks after 6 more samples each: still all, once.
    ds3 = granary.ShardDataset(endpoint, BUCKET, "ds/", seed=7, shuffle_buffer=4, rank=0,
                               world_size=3, batch_size=2)
    ds3.load_state_dict(state)
    mid = [read_rank(endpoint, r, 3, workers, every, batch=2, buffer=4, state=state,
                     limit=3) for r in range(3)]
    state2 = ds3.state_dict(consumed=24 + 18)
    last = [read_rank(endpoint, r, 2, workers, every, batch=2, buffer=4, state=state2)
            for r in range(2)]
    seen = collections.Counter(k for keys in first + mid + last for k in keys)
    assert set(seen) == set(every) and set(seen.values()) == {1}
    with pytest.raises(ValueError):
        ds3.state_dict(consumed=24 + 17)


def test_an_epoch_read_takes_named_fields_only():
    """The dataset's settings are named: a field that does not exist, or a value of the
    wrong type, is refused by name rather than read into the wrong place."""
    from granary import _granary
    with pytest.raises(ValueError, match="no field `epochs`"):
        _granary.EpochRead(endpoint="http://127.0.0.1:1", epochs=2)
    with pytest.raises(TypeError):
        _granary.EpochRead(world_size="two")
    assert isinstance(_granary.EpochRead(endpoint="http://x", epoch=3, rank=1), _granary.EpochRead)


def test_client_calls(node):
    endpoint, every, root = node
    c = granary.Client(endpoint)
    keys = c.list(BUCKET, "ds/")
    assert keys == [f"ds/shard-{i:04}.tar" for i in range(len(COUNTS))]
    etag = c.put(BUCKET, "misc/obj.bin", b"0123456789" * 1000)
    assert len(etag) == 32
    assert c.get(BUCKET, "misc/obj.bin", range=(5, 14)) == b"5678901234"
    assert c.get_member(BUCKET, keys[1], "s01/003.bin") == every["s01/003"]["bin"]
    # GetBatch: in order, objects and members.
    items = [(BUCKET, keys[0], "s00/001.cls"), (BUCKET, "misc/obj.bin"),
             (BUCKET, keys[2], "s02/004.bin")]
    got = list(c.batch(items))
    assert [g[1] for g in got] == [every["s00/001"]["cls"], b"0123456789" * 1000,
                                   every["s02/004"]["bin"]]
    assert got[0][0].endswith("s00/001.cls")
    with pytest.raises(granary.GranaryError) as e:
        c.get(BUCKET, "misc/none.bin")
    assert e.value.status == 404 and e.value.code == "NoSuchKey"
    assert c.cluster()["node_id"] == "solo"


def test_zero_copy_over_the_local_socket(node):
    endpoint, every, root = node
    c = granary.Client(f"unix:{root / 'g.sock'}")
    key = "ds/shard-0003.tar"
    whole = granary.Client(endpoint).get(BUCKET, key)
    view = granary.map_local(c, BUCKET, key)
    assert view is not None and view.readonly
    assert bytes(view) == whole
    part = granary.map_local(c, BUCKET, key, range=(1000, 5999))
    assert bytes(part) == whole[1000:6000]


def test_prefetch_then_the_reads_are_hits(node):
    endpoint, every, root = node
    write_dataset(root / "origin", "warm", counts=[3, 4])
    c = granary.Client(endpoint)
    job = c.prefetch(BUCKET, "warm/")
    deadline = time.monotonic() + 60
    while c.job(job)["state"] not in ("done", "failed", "cancelled"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert c.job(job)["state"] == "done"
    before = c.stats()
    for k in c.list(BUCKET, "warm/"):
        c.get(BUCKET, k)
    after = c.stats()
    assert after["hits"] - before["hits"] == 2
    assert after["misses"] == before["misses"]
    # The dataset's own: warms the whole prefix, every object already held.
    ds = granary.ShardDataset(endpoint, BUCKET, "warm/")
    job = ds.prefetch_ahead()
    while c.job(job)["state"] not in ("done", "failed", "cancelled"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert c.job(job)["state"] == "done"


def test_wrong_credentials_raise(cluster):
    endpoints, _, _ = cluster
    bad = granary.Client(endpoints[0], access_key=ACCESS_KEY, secret_key="wrong")
    with pytest.raises(granary.GranaryError) as e:
        bad.list(BUCKET, "ds/")
    assert e.value.status == 403 and e.value.code == "SignatureDoesNotMatch"
    with pytest.raises(granary.GranaryError) as e:
        granary.ShardDataset(endpoints[0], BUCKET, "ds/", access_key=ACCESS_KEY,
                             secret_key="wrong")
    assert e.value.status == 403
    with pytest.raises(granary.GranaryError) as e:
        granary.Client(endpoints[1]).list(BUCKET, "ds/")
    assert e.value.status == 403 and e.value.code == "AccessDenied"


def test_reads_go_to_each_shards_owner(cluster):
    endpoints, every, _ = cluster
    c = [granary.Client(e, access_key=ACCESS_KEY, secret_key=SECRET_KEY) for e in endpoints]
    before = [x.stats() for x in c]
    # No plan: its owners' fetches ahead count among their misses, racing the readers.
    ds = granary.ShardDataset(endpoints[0], BUCKET, "ds/", seed=1, rank=0, world_size=1,
                              access_key=ACCESS_KEY, secret_key=SECRET_KEY, plan=False)
    keys = [check_bytes(s, every) for s in DataLoader(ds, batch_size=None, num_workers=2)]
    assert sorted(keys) == sorted(every)
    after = [x.stats() for x in c]
    owners = collections.Counter()
    for shard in ds.shards:
        r = requests.get(f"{endpoints[0]}/_granary/cluster",
                         params={"bucket": BUCKET, "key": shard}, timeout=10)
        owners[r.json()["owner"]] += 1
    assert len(owners) >= 2, owners
    for x, b, a in zip(c, before, after):
        node_id = a["node_id"]
        # No node passed a read on to another: each shard was read from its owner.
        assert a["proxied"] - b["proxied"] == 0, node_id
        reads = sum(a[k] - b[k] for k in ("hits", "misses", "bypasses", "peer_fills"))
        assert (reads > 0) == (owners[node_id] > 0), (node_id, reads, owners)
        # The shards it owns filled there by their first reads (workers reading one at
        # once follow one fill), the rest from its cache.
        misses = a["misses"] - b["misses"]
        assert owners[node_id] <= misses <= 2 * owners[node_id], (node_id, misses)


def test_compressed_shards_are_read_whole(node):
    endpoint, _, root = node
    every = write_dataset(root / "origin", "gz", counts=[4, 6, 5, 3], gzip_every=2)
    seen = collections.Counter()
    for rank in range(2):
        ds = granary.ShardDataset(endpoint, BUCKET, "gz/", seed=3, rank=rank, world_size=2,
                                  shuffle_buffer=3, batch_size=2)
        assert sorted(ds.shards) == ["gz/shard-0000.tar.gz", "gz/shard-0001.tar",
                                     "gz/shard-0002.tar.gz", "gz/shard-0003.tar"]
        for b in DataLoader(ds, batch_size=2, num_workers=2, collate_fn=as_list):
            for sample in b:
                assert sample["bin"] == every[sample["__key__"]]["bin"]
                seen[sample["__key__"]] += 1
    assert set(seen) == set(every) and set(seen.values()) == {1}


def to_bytes(sample: dict) -> dict:
    return {k: bytes(v) if isinstance(v, memoryview) else v for k, v in sample.items()}


def test_zero_copy_samples_over_the_local_socket(node):
    endpoint, every, root = node
    sock = f"unix:{root / 'g.sock'}"
    ds = granary.ShardDataset(sock, BUCKET, "ds/", seed=2, shuffle_buffer=8, zero_copy=True)
    seen = []
    for sample in ds:
        assert isinstance(sample["bin"], memoryview) and sample["bin"].readonly
        assert bytes(sample["bin"]) == every[sample["__key__"]]["bin"]
        assert bytes(sample["cls"]) == every[sample["__key__"]]["cls"]
        seen.append(sample["__key__"])
    assert sorted(seen) == sorted(every)
    # The same order as over HTTP: delivery does not change the plan.
    plain = granary.ShardDataset(endpoint, BUCKET, "ds/", seed=2, shuffle_buffer=8)
    assert [s["__key__"] for s in plain] == seen
    # In DataLoader workers, decoded where they are read.
    ds.map = to_bytes
    keys = [check_bytes(s, every) for b in DataLoader(ds, batch_size=4, num_workers=2,
                                                       collate_fn=as_list) for s in b]
    assert sorted(keys) == sorted(every)


def test_samples_are_copied_out_of_the_cache_file_on_the_nodes_machine(node, monkeypatch):
    """Given the HTTP address of a node on its machine, ShardDataset goes on over the
    node's Unix socket, and each run is copied out of the cache file the node passes
    (counted as a local read), not sent through the socket: the same `bytes`, in the
    same order as kept on TCP, where the node passes no file."""
    endpoint, every, _ = node
    c = granary.Client(endpoint)

    def epoch():
        ds = granary.ShardDataset(endpoint, BUCKET, "ds/", seed=5, shuffle_buffer=8)
        samples = list(ds)
        for s in samples:
            assert type(s["bin"]) is bytes and type(s["cls"]) is bytes
        return [check_bytes(s, every) for s in samples]

    before = c.stats()["local_reads"]
    local = epoch()
    assert sorted(local) == sorted(every)
    copied = c.stats()["local_reads"] - before
    assert copied >= 1, "runs were copied out of the cache file"
    monkeypatch.setenv("GRANARY_LOCAL_SOCKET", "off")
    assert epoch() == local
    assert c.stats()["local_reads"] - before == copied, "none on TCP"


def test_a_client_works_on_both_sides_of_a_fork(node):
    endpoint, every, _ = node
    c = granary.Client(endpoint)
    key = "ds/shard-0001.tar"
    whole = c.get(BUCKET, key)  # the parent's connection is open now
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own connection, the same bytes
        try:
            ok = c.get(BUCKET, key) == whole and c.get(BUCKET, key) == whole
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w)
    assert c.get(BUCKET, key) == whole
    assert os.read(r, 1) == b"1"
    os.waitpid(pid, 0)
    os.close(r)
    assert c.get(BUCKET, key) == whole


def test_an_owner_that_fails_is_read_around(tmp_path):
    """Two members; the dataset is listed, one member is killed, and the epoch still
    comes whole: its shards are read from the next member in the ring's order."""
    origin = tmp_path / "origin"
    every = write_dataset(origin, "ds", counts=[5] * 8)
    ids, ports = ["a", "b"], [_free_port(), _free_port()]
    peers = []
    for i, p in zip(ids, ports):
        peers += ["--peer", f"{i}=http://127.0.0.1:{p}"]
    procs = [start_node(tmp_path, origin, i, p, peers, creds=False) for i, p in zip(ids, ports)]
    endpoints = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        wait_members_up(endpoints, procs, [tmp_path / f"{i}.log" for i in ids])
        ds = granary.ShardDataset(endpoints[0], BUCKET, "ds/", seed=4)
        owners = {requests.get(f"{endpoints[0]}/_granary/cluster",
                               params={"bucket": BUCKET, "key": k}, timeout=10).json()["owner"]
                  for k in ds.shards}
        assert owners == {"a", "b"}
        procs[1].kill()
        procs[1].wait()
        keys = [check_bytes(s, every) for s in ds]
        assert sorted(keys) == sorted(every)
    finally:
        for p in procs:
            _stop_process(p)


def test_get_and_get_into_land_the_bytes_whole(node):
    """`get` returns the object's bytes (ranges too) and `get_into` writes them into the
    caller's writable buffer, whatever kind, returning the count; a buffer too small, a
    read-only or a non-contiguous one is refused, and a missing key is GranaryError."""
    endpoint, _, root = node
    c = granary.Client(endpoint)
    key = "ds/shard-0001.tar"
    whole = (root / "origin" / BUCKET / key).read_bytes()
    got = c.get(BUCKET, key)
    assert type(got) is bytes and got == whole
    assert c.get(BUCKET, key, range=(10, 5009)) == whole[10:5010]

    buf = bytearray(len(whole) + 100)
    assert c.get_into(BUCKET, key, buf) == len(whole)
    assert bytes(buf[:len(whole)]) == whole and buf[len(whole):] == bytearray(100)
    exact = bytearray(len(whole))
    assert c.get_into(BUCKET, key, memoryview(exact)) == len(whole) and exact == whole
    part = bytearray(5000)
    assert c.get_into(BUCKET, key, part, range=(10, 5009)) == 5000
    assert bytes(part) == whole[10:5010]
    t = torch.zeros(len(whole), dtype=torch.uint8)
    assert c.get_into(BUCKET, key, t.numpy()) == len(whole)
    assert t.numpy().tobytes() == whole

    with pytest.raises(granary.GranaryError) as e:
        c.get_into(BUCKET, key, bytearray(len(whole) - 1))
    assert f"is {len(whole)} bytes" in str(e.value)
    assert c.get_into(BUCKET, key, exact) == len(whole), "the client reads on after a refusal"
    with pytest.raises(TypeError):
        c.get_into(BUCKET, key, whole)
    with pytest.raises(ValueError):
        c.get_into(BUCKET, key, memoryview(bytearray(2 * len(whole)))[::2])
    with pytest.raises(granary.GranaryError) as e:
        c.get_into(BUCKET, "ds/no-such-shard.tar", exact)
    assert e.value.status == 404 and e.value.code == "NoSuchKey"


def test_gpu_delivery(node):
    """Where a GPU is lent: objects and samples land in CUDA memory whole. Elsewhere:
    asking for it fails with a clear error, and the rest is skipped."""
    endpoint, every, _ = node
    c = granary.Client(endpoint)
    key = "ds/shard-0002.tar"
    whole = c.get(BUCKET, key)
    if not (torch.cuda.is_available() and granary.cuda_available()):
        with pytest.raises(granary.GranaryError) as e:
            c.get_to_device(BUCKET, key)
        assert "CUDA" in str(e.value) or "GPU" in str(e.value)
        pytest.skip("no CUDA device here: GPU delivery refused cleanly")
    t = c.get_to_device(BUCKET, key)
    assert t.device.type == "cuda" and t.dtype == torch.uint8 and t.numel() == len(whole)
    assert t.cpu().numpy().tobytes() == whole
    part = c.get_to_device(BUCKET, key, range=(100, 4195))
    assert part.cpu().numpy().tobytes() == whole[100:4196]
    # Larger than a split read's first 32 MiB: the rest comes behind the fill (a miss),
    # then in parts over several connections into device memory (a hit).
    big = bytes(range(256)) * ((80 << 20) // 256) + b"tail!"
    c.put(BUCKET, "gpu/big.bin", big)
    for _ in range(3):
        t = c.get_to_device(BUCKET, "gpu/big.bin")
        assert t.numel() == len(big) and t.cpu().numpy().tobytes() == big
    ds = granary.ShardDataset(endpoint, BUCKET, "ds/", device="cuda")
    n = 0
    for s in ds:
        assert s["bin"].is_cuda
        assert s["bin"].cpu().numpy().tobytes() == every[s["__key__"]]["bin"]
        n += 1
    assert n == len(every)


def test_the_planner_changes_no_sample_and_no_order(tmp_path):
    """On a node whose cache holds a third of the dataset, ShardDataset with its plan
    (the default) and without yields the same keys in the same order, per rank, with
    workers and with a resumed epoch; the cluster shows the plan, and fetched ahead."""
    origin = tmp_path / "origin"
    every = write_dataset(origin, "ds", counts=[6] * 12)
    size = sum(p.stat().st_size for p in (origin / BUCKET / "ds").iterdir())

    def job(endpoint, plan):
        out = []
        for epoch in (0, 1):
            out.append([read_rank(endpoint, r, 2, 2, every, epoch=epoch, batch=3,
                                  buffer=4, plan=plan) for r in range(2)])
        ds = granary.ShardDataset(endpoint, BUCKET, "ds/", seed=7, shuffle_buffer=4,
                                  rank=0, world_size=2, batch_size=3, plan=plan)
        ds.set_epoch(2)
        state = ds.state_dict(consumed=12)
        out.append([read_rank(endpoint, r, 3, 2, every, batch=3, buffer=4,
                              state=state, plan=plan) for r in range(3)])
        return out

    # Without a plan, on a node of its own: the entries it admits are no plan's, and
    # the planner never drops those, so they would leave a later plan no room.
    port = _free_port()
    proc = start_node(tmp_path, origin, "plain", port, [], creds=False,
                      capacity=str(size // 3))
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_members_up([endpoint], [proc], [tmp_path / "plain.log"])
        without = job(endpoint, False)
        assert granary.Client(endpoint).plans() == []
    finally:
        _stop_process(proc)
    port = _free_port()
    proc = start_node(tmp_path, origin, "small", port, [], creds=False,
                      capacity=str(size // 3))
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_members_up([endpoint], [proc], [tmp_path / "small.log"])
        with_plan = job(endpoint, True)
        assert with_plan == without
        for epoch in with_plan[:2]:
            seen = collections.Counter(k for keys in epoch for k in keys)
            assert set(seen) == set(every) and set(seen.values()) == {1}
        plans = granary.Client(endpoint).plans()
        assert len(plans) == 1, plans
        p = plans[0]
        assert (p["bucket"], p["prefix"], p["shards"]) == (BUCKET, "ds/", 12)
        # The last registration: epoch 2 resumed on 3 ranks.
        assert (p["epoch"], p["world_size"]) == (2, 3)
        stats = requests.get(f"{endpoint}/_granary/stats").json()
        assert stats["plans"] == 1
        # The planner fetched ahead of the readers (its count may trail the last reads).
        deadline = time.monotonic() + 15
        while stats["bytes_planned"] == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
            stats = requests.get(f"{endpoint}/_granary/stats").json()
        assert stats["bytes_planned"] > 0, stats
        assert stats["used_bytes"] <= size // 3
    finally:
        _stop_process(proc)


def _launch(targets, timeout=180):
    """Starts each `(args)` of `targets` in a spawned process running
    `read_where_launched`; their results, in order."""
    import multiprocessing

    from granary_testutil import read_where_launched

    ctx = multiprocessing.get_context("spawn")
    out = [ctx.Queue() for _ in targets]
    procs = [ctx.Process(target=read_where_launched, args=(*args[:3], q, *args[3:]))
             for args, q in zip(targets, out)]
    for p in procs:
        p.start()
    try:
        got = [q.get(timeout=timeout) for q in out]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0] * len(procs)
    return got


def _check_split(got, every, world):
    per_rank = [keys for _, keys, _, _ in got]
    assert [len(k) for k in per_rank] == [n for _, _, n, _ in got]
    assert len({len(k) for k in per_rank}) == 1, [len(k) for k in per_rank]
    seen = collections.Counter(k for keys in per_rank for k in keys)
    assert set(seen) == set(every)
    assert sum(seen.values()) == -(-len(every) // world) * world


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataset_built_without_a_rank_splits_where_it_iterates(node, workers):
    """A ShardDataset built in a driver with no rank (world 1 there), pickled into 2
    spawned processes with RANK/WORLD_SIZE set there, yields every sample once across
    them with equal counts, with and without DataLoader workers; the plan the cluster
    holds is the ranks', not the driver's."""
    endpoint, every, _ = node
    ds = granary.ShardDataset(endpoint, BUCKET, "ds/", seed=11, batch_size=4)
    assert (ds.rank, ds.world_size) == (0, 1)
    ds.set_epoch(13)
    got = _launch([(ds, {"RANK": str(r), "WORLD_SIZE": "2"}, workers) for r in range(2)])
    assert [place for place, _, _, _ in got] == [(0, 2), (1, 2)]
    _check_split(got, every, 2)
    assert all(not said for _, _, _, said in got)
    plan = next(p for p in granary.Client(endpoint).plans() if p["epoch"] == 13)
    assert plan["world_size"] == 2, plan


def test_torch_distributed_gives_the_rank_and_spawned_loader_workers_keep_it(
        node, tmp_path):
    """Two processes in a gloo group (no RANK/WORLD_SIZE in their env) read a dataset
    built with no rank through DataLoader workers started by `spawn`: each worker
    takes its process's rank, so every sample comes once. Arguments that disagree with
    torch.distributed win, with one warning."""
    endpoint, every, _ = node
    ds = granary.ShardDataset(endpoint, BUCKET, "ds/", seed=12, batch_size=4)
    group = str(tmp_path / "gloo")
    got = _launch([(ds, {}, 2, group, r, 2) for r in range(2)])
    assert [place for place, _, _, _ in got] == [(0, 2), (1, 2)]
    _check_split(got, every, 2)
    # Rank 0 of the group told to be rank 1 of 3: it reads rank 1's share, and says so
    # once, however often the place is looked up.
    told = granary.ShardDataset(endpoint, BUCKET, "ds/", seed=12, batch_size=4, rank=1,
                                world_size=3)
    [(place, keys, n, said)] = _launch([(told, {}, 0, str(tmp_path / "gloo1"), 0, 1)])
    assert place == (1, 3)
    assert len(keys) == n == -(-len(every) // 3)
    assert len(said) == 1 and "rank=1, world_size=3" in said[0], said
    plain = granary.ShardDataset(endpoint, BUCKET, "ds/", seed=12, batch_size=4, rank=1,
                                 world_size=3)
    plain.set_epoch(0)
    assert [check_bytes(s, every) for s in plain] == keys
