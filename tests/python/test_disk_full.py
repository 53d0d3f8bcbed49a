"""A node whose disk holds less than its `--cache-capacity`: the data dir is a 32 MiB
tmpfs (mounted in a mount namespace of the node's own, so nothing outlives it), the
capacity says 1 GiB, and the object store is a real S3 server (moto) behind a proxy that
sends bodies at 8 MB/s, so that fills are still running when the test fills the disk
beside them.

Every read must come back whole and right: a fill that meets ENOSPC goes on from the
source; once the disk refuses, the node serves through (health 200, `admitting:
false`); freed space is seen and the node admits again."""

from __future__ import annotations

import http.client
import http.server
import os
import random
import shutil
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from conftest import (MOTO_KEY, STARTUP_TIMEOUT_S, _free_port, _server_binary,
                      _stop_process, make_s3_client)
from granary_testutil import MiB, unique_bucket_name

RATE = 8_000_000  # bytes per second per answer, from the proxy
CHUNK = 64 * 1024
DISK = "32m"


class _Trickle(http.server.BaseHTTPRequestHandler):
    """Passes each request on to the upstream and sends the answer's body back at
    `RATE`."""

    protocol_version = "HTTP/1.1"
    upstream: tuple[str, int] = ("127.0.0.1", 0)

    def _relay(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else None
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
        conn.request(self.command, self.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        self.send_response_only(resp.status, resp.reason)
        length = None
        for k, v in resp.getheaders():
            if k.lower() in ("connection", "transfer-encoding", "date", "server"):
                continue
            if k.lower() == "content-length":
                length = v
            self.send_header(k, v)
        if length is None:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command == "HEAD":
            return
        try:
            for i in range(0, len(data), CHUNK):
                self.wfile.write(data[i:i + CHUNK])
                self.wfile.flush()
                time.sleep(CHUNK / RATE)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the node stopped reading: it had enough

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _relay

    def log_message(self, *args) -> None:  # noqa: ARG002
        pass


def _namespace_prefix() -> list[str]:
    """How to run a command in a mount namespace of its own, where it may mount."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1) here")
    prefix = [unshare, "--mount"] if os.geteuid() == 0 else \
        [unshare, "--user", "--map-root-user", "--mount"]
    probe = subprocess.run(prefix + ["sh", "-c", "mount -t tmpfs -o size=1m probe /mnt"],
                           capture_output=True, timeout=20)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount in a namespace here: {probe.stderr.decode()[-200:]}")
    return prefix


def _payload(i: int, size: int) -> bytes:
    return random.Random(i).randbytes(size)


def _get(url: str) -> tuple[int, str, bytes, int]:
    r = requests.get(url, timeout=120)
    return (r.status_code, r.headers.get("x-granary-cache", ""), r.content,
            int(r.headers.get("Content-Length", -1)))


def _health(endpoint: str) -> tuple[int, dict]:
    r = requests.get(f"{endpoint}/_granary/health", timeout=10)
    return r.status_code, r.json()


def test_a_disk_smaller_than_the_capacity_serves_every_object_whole_and_admits_again(
        tmp_path, moto_endpoint):
    prefix = _namespace_prefix()
    bucket = unique_bucket_name("diskfull")
    moto = make_s3_client(moto_endpoint, access_key=MOTO_KEY, secret_key=MOTO_KEY)
    moto.create_bucket(Bucket=bucket)
    big = {f"big-{i}": _payload(i, 8 * MiB) for i in range(3)}
    small = {f"small-{i:02}": _payload(100 + i, MiB) for i in range(40)}
    for k, v in {**big, **small}.items():
        moto.put_object(Bucket=bucket, Key=k, Body=v)

    _Trickle.upstream = ("127.0.0.1", int(moto_endpoint.rsplit(":", 1)[1]))
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Trickle)
    proxy.daemon_threads = True
    threading.Thread(target=proxy.serve_forever, daemon=True).start()

    data = tmp_path / "data"
    data.mkdir()
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRANARY_")}
    env.update({"AWS_ACCESS_KEY_ID": MOTO_KEY, "AWS_SECRET_ACCESS_KEY": MOTO_KEY,
                "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
                "RUST_LOG": "info"})
    log_path = tmp_path / "granary.log"
    log = open(log_path, "ab")
    cmd = prefix + [
        "sh", "-c", f'mount -t tmpfs -o size={DISK} granary-disk "$0" && exec "$@"', str(data),
        str(_server_binary()), "serve", "--backend", "s3",
        "--s3-endpoint", f"http://127.0.0.1:{proxy.server_address[1]}",
        "--data-dir", str(data), "--listen", f"127.0.0.1:{port}", "--cache-capacity", "1GiB"]
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT)
    # The node's view of its data dir (the tmpfs is in its namespace only).
    disk = Path(f"/proc/{proc.pid}/root") / str(data).lstrip("/")
    url = lambda k: f"{endpoint}/{bucket}/{k}"  # noqa: E731
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            try:
                if _health(endpoint)[0] == 200:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, "the node did not start"
            time.sleep(0.1)
        assert shutil.disk_usage(disk).total <= 32 * MiB, "the data dir is the small disk"
        status, h = _health(endpoint)
        assert h["capacity_bytes"] == 1 << 30, "the weight stays the configured capacity"
        assert h["free_bytes"] < 32 * MiB, "free space is the disk's"
        assert h["admitting"] is True

        # 1. Three 8 MiB fills under way (24 MiB of a 32 MiB disk reserved), then another
        # file fills the disk beside them: each fill meets ENOSPC mid-way.
        opened = [requests.get(url(k), stream=True, timeout=120) for k in big]
        assert all(r.headers["x-granary-cache"] == "miss" for r in opened)
        ballast = disk / "ballast"
        room = shutil.disk_usage(disk).free - 2 * MiB
        with open(ballast, "wb", buffering=0) as f:
            try:
                while room > 0:
                    f.write(bytes(min(room, MiB)))
                    room -= MiB
            except OSError:
                pass  # full already: the fills got there first
        with ThreadPoolExecutor(3) as ex:
            bodies = list(ex.map(lambda r: r.content, opened))
        for r, (k, want), got in zip(opened, big.items(), bodies):
            assert r.status_code == 200
            assert len(got) == len(want) == int(r.headers["Content-Length"]), k
            assert got == want, f"{k}: the bytes after the disk failed came from the source"
        text = log_path.read_text()
        assert "the cache's disk is full" in text
        assert any("cache fill failed" in line and "No space left" in line
                   for line in text.splitlines()), "a fill met ENOSPC mid-way"
        status, h = _health(endpoint)
        assert status == 200 and h["admitting"] is False

        # 2. The disk quite full now: every read whole, straight through, in every pass.
        with open(ballast, "ab", buffering=0) as f:
            try:
                while True:
                    f.write(bytes(64 * 1024))
            except OSError:
                pass
        for _ in range(2):
            with ThreadPoolExecutor(6) as ex:
                got = list(ex.map(_get, [url(k) for k in [*big, *list(small)[:10]]]))
            for (code, origin, body, length), want in zip(
                    got, [*big.values(), *list(small.values())[:10]]):
                assert (code, origin) == (200, "bypass")
                assert body == want and length == len(want)
            assert _health(endpoint)[0] == 200
        assert not any(p.name.startswith("fill-") for p in (disk / "cache" / "tmp").iterdir()), \
            "failed fills leave no temp files"

        # 3. Space freed: the node sees it and admits again.
        ballast.unlink()
        deadline = time.monotonic() + 15
        while _health(endpoint)[1]["admitting"] is False:
            assert time.monotonic() < deadline, "the freed space was never seen"
            time.sleep(0.2)
        assert "has room again" in log_path.read_text()

        # 4. 40 MiB of objects onto ~31 MiB of disk, three passes: what fits is kept,
        # the rest served through, every read whole and right.
        origins = []
        for _ in range(3):
            with ThreadPoolExecutor(8) as ex:
                got = list(ex.map(_get, [url(k) for k in small]))
            for (code, origin, body, length), want in zip(got, small.values()):
                assert code == 200 and body == want and length == len(want)
            origins.append([g[1] for g in got])
            assert _health(endpoint)[0] == 200
        stats = requests.get(f"{endpoint}/_granary/stats", timeout=10).json()
        held = stats["objects"]
        assert 15 <= held <= 31, f"{held} objects kept on a 32 MiB disk"
        assert origins[0].count("miss") >= 15
        last = {o: origins[2].count(o) for o in ("hit", "miss", "bypass")}
        assert last["hit"] + last["miss"] == held, f"every kept object is a hit: {last}"
        assert last["bypass"] == 40 - held
        assert stats["admitting"] is False and stats["disk_free_bytes"] < 2 * MiB
    finally:
        _stop_process(proc)
        log.close()
        proxy.shutdown()


def test_a_cluster_spills_past_a_member_whose_disk_is_full(tmp_path):
    """Two members over one fs origin: n1's data dir is a 16 MiB tmpfs, n2's the plain
    disk, both with a 1 GiB capacity. 60 objects of 1 MiB read through n2: n1 fills its
    disk and says `admitting: false`; the objects it owns and cannot hold are then cached
    once on n2 instead. Every read is right; in the end each object is held once."""
    prefix = _namespace_prefix()
    from conftest import wait_members_up
    origin = tmp_path / "origin"
    bucket = "spill"
    (origin / bucket).mkdir(parents=True)
    objects = {f"o{i:02}": _payload(300 + i, MiB) for i in range(60)}
    for k, v in objects.items():
        (origin / bucket / k).write_bytes(v)
    ports = [_free_port(), _free_port()]
    endpoints = [f"http://127.0.0.1:{p}" for p in ports]
    peers = []
    for i, e in enumerate(endpoints):
        peers += ["--peer", f"n{i + 1}={e}"]
    procs, logs = [], []
    try:
        for i, port in enumerate(ports):
            data = tmp_path / f"data{i + 1}"
            data.mkdir()
            serve = [str(_server_binary()), "serve", "--node-id", f"n{i + 1}",
                     "--backend", f"fs:{origin}", "--data-dir", str(data),
                     "--listen", f"127.0.0.1:{port}", "--cache-capacity", "1GiB", *peers]
            if i == 0:
                serve = prefix + ["sh", "-c", 'mount -t tmpfs -o size=16m granary-disk "$0" '
                                  '&& exec "$@"', str(data)] + serve
            logs.append(tmp_path / f"n{i + 1}.log")
            with open(logs[-1], "ab") as log:
                procs.append(subprocess.Popen(serve, stdin=subprocess.DEVNULL, stdout=log,
                                              stderr=subprocess.STDOUT))
        wait_members_up(endpoints, procs, logs)
        owners = {k: requests.get(f"{endpoints[1]}/_granary/cluster",
                                  params={"bucket": bucket, "key": k}, timeout=10).json()["owner"]
                  for k in objects}
        assert 20 < list(owners.values()).count("n1"), "n1 owns more than its disk holds"

        def a_pass():
            with ThreadPoolExecutor(4) as ex:
                got = list(ex.map(_get, [f"{endpoints[1]}/{bucket}/{k}" for k in objects]))
            for (code, _, body, length), want in zip(got, objects.values()):
                assert code == 200 and body == want and length == len(want)

        a_pass()
        deadline = time.monotonic() + 15
        while True:
            view = requests.get(f"{endpoints[1]}/_granary/cluster", timeout=10).json()
            n1 = next(m for m in view["members"] if m["id"] == "n1")
            if n1.get("admitting") is False:
                break
            assert time.monotonic() < deadline, f"n2 never heard n1 is full: {view}"
            time.sleep(0.2)
        a_pass()
        a_pass()
        held = [requests.get(f"{e}/_granary/stats", timeout=10).json() for e in endpoints]
        assert held[0]["admitting"] is False and held[0]["objects"] < 16
        mine_n2 = list(owners.values()).count("n2")
        assert held[1]["objects"] > mine_n2, "n2 took objects n1 could not hold"
        assert held[0]["objects"] + held[1]["objects"] == len(objects), \
            f"each object held once: {held[0]['objects']} + {held[1]['objects']}"
        assert all(requests.get(f"{e}/_granary/health", timeout=10).status_code == 200
                   for e in endpoints)
    finally:
        for p in procs:
            _stop_process(p)
