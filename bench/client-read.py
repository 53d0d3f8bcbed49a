#!/usr/bin/env python3
"""A warm object read into Python memory by the ``granary`` package, against the wire.

The ways take turns every round, over the same object on the same node:

- wire: a plain socket's ``recv_into`` a preallocated buffer (the ceiling: nothing but
  the kernel's copy; with ``--pinned``, page-locked memory from torch, as P7's (b));
- ``Client.get``: a new ``bytes`` per read;
- ``Client.get_into``: the same preallocated buffer as the wire's;
- both again on one connection (``GRANARY_CLIENT_STREAMS=1``), one against curl's one;
- ``curl -o /dev/null`` where curl is installed (another client, writing nowhere);
- with ``--pinned`` and a GPU, ``Client.get_to_device``.

Each way is read once untimed and checked against the object's bytes, then ``--rounds``
timed reads: MB/s (1 MB = 10^6 bytes; median, min, max), this process's CPU seconds per
GiB (curl's for curl) and the node's (``process_cpu_seconds`` from its stats).

    python3 bench/client-read.py --endpoint http://127.0.0.1:7070 --bucket B --key K
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import shutil
import sys
import time
from urllib.parse import quote, urlparse

import granary


def cpu(who=resource.RUSAGE_SELF) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


class Wire:
    """One kept-alive connection; GET's body received with recv_into."""

    def __init__(self, endpoint: str):
        u = urlparse(endpoint)
        self.host = u.netloc
        self.sock = socket.create_connection((u.hostname, u.port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def get_into(self, target: str, view: memoryview) -> int:
        self.sock.sendall(f"GET {target} HTTP/1.1\r\nHost: {self.host}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise IOError("closed before the head")
            head += chunk
        head, rest = head.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        if not lines[0].startswith("HTTP/1.1 200"):
            raise IOError(lines[0])
        size = next(int(l.split(":", 1)[1]) for l in lines
                    if l.lower().startswith("content-length:"))
        if size > len(view):
            raise IOError(f"{size} bytes; the buffer holds {len(view)}")
        view[:len(rest)] = rest
        got = len(rest)
        while got < size:
            n = self.sock.recv_into(view[got:size])
            if n == 0:
                raise IOError(f"cut short at {got} of {size}")
            got += n
        return size


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoint", default="http://127.0.0.1:7070")
    ap.add_argument("--bucket", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pinned", action="store_true",
                    help="preallocated buffers in page-locked memory (torch)")
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()

    c = granary.Client(a.endpoint)
    stats = granary.Client(a.endpoint)
    want = c.get(a.bucket, a.key)
    size = len(want)
    target = f"/{a.bucket}/{quote(a.key)}"
    url = a.endpoint.rstrip("/") + target

    gpu = False
    if a.pinned:
        import torch
        gpu = torch.cuda.is_available() and granary.cuda_available()
        if not gpu:
            print("no GPU here: --pinned falls back to ordinary memory", file=sys.stderr)
            a.pinned = False
    if a.pinned:
        host = torch.empty(size, dtype=torch.uint8).pin_memory()
        buf = host.numpy()
    else:
        buf = bytearray(size)
    view = memoryview(buf).cast("B")
    wire = Wire(a.endpoint)
    getter = granary.Client(a.endpoint)
    into = granary.Client(a.endpoint)
    # The same client kept to one connection (a large hit is otherwise read over several).
    os.environ["GRANARY_CLIENT_STREAMS"] = "1"
    one = granary.Client(a.endpoint)
    del os.environ["GRANARY_CLIENT_STREAMS"]

    ways = [
        ("wire: socket recv_into a preallocated buffer", resource.RUSAGE_SELF,
         lambda keep: (wire.get_into(target, view), view.tobytes() if keep else None)),
        # get's bytes are handed back and freed after the clock stops (the caller's
        # business, whenever it likes; its CPU is counted).
        ("Client.get (a new bytes per read)", resource.RUSAGE_SELF,
         lambda keep: (lambda b: (len(b), b))(getter.get(a.bucket, a.key))),
        ("Client.get_into (a preallocated buffer)", resource.RUSAGE_SELF,
         lambda keep: (into.get_into(a.bucket, a.key, buf), view.tobytes() if keep else None)),
        ("Client.get, one connection", resource.RUSAGE_SELF,
         lambda keep: (lambda b: (len(b), b))(one.get(a.bucket, a.key))),
        ("Client.get_into, one connection", resource.RUSAGE_SELF,
         lambda keep: (one.get_into(a.bucket, a.key, buf), view.tobytes() if keep else None)),
    ]
    if shutil.which("curl"):
        def curl(keep):
            out = subprocess.run(["curl", "-sS", "-f", "-o", "/dev/null", "-w",
                                  "%{size_download}", url],
                                 check=True, capture_output=True, text=True)
            return int(out.stdout.strip()), None
        ways.append(("curl -o /dev/null", resource.RUSAGE_CHILDREN, curl))
    if gpu:
        import torch
        dev = granary.Client(a.endpoint)

        def to_device(keep):
            t = dev.get_to_device(a.bucket, a.key)
            torch.cuda.synchronize()
            return t.numel(), t.cpu().numpy().tobytes() if keep else t
        ways.append(("Client.get_to_device", resource.RUSAGE_SELF, to_device))

    for name, _, read in ways:
        n, got = read(True)
        if n != size or (got is not None and got != want):
            print(f"{name}: the bytes differ from the object's", file=sys.stderr)
            return 1
    del want

    tally = {name: {"rates": [], "cpu": 0.0, "node": 0.0, "bytes": 0} for name, _, _ in ways}
    for _ in range(a.rounds):
        for name, who, read in ways:
            node0, cpu0 = stats.stats()["process_cpu_seconds"], cpu(who)
            t0 = time.perf_counter()
            n, held = read(False)
            secs = time.perf_counter() - t0
            del held
            t = tally[name]
            t["cpu"] += cpu(who) - cpu0
            t["node"] += stats.stats()["process_cpu_seconds"] - node0
            t["rates"].append(n / 1e6 / secs)
            t["bytes"] += n

    report = {"object_bytes": size, "rounds": a.rounds, "pinned": a.pinned, "ways": []}
    print(f"{size} bytes, {a.rounds} rounds each:")
    print(f"{'way':<46} {'MB/s':>9} {'min':>9} {'max':>9} {'client s/GiB':>12} {'node s/GiB':>12}")
    for name, _, _ in ways:
        t = tally[name]
        gib = t["bytes"] / 2**30
        w = {"name": name, "mb_per_s_median": statistics.median(t["rates"]),
             "mb_per_s_min": min(t["rates"]), "mb_per_s_max": max(t["rates"]),
             "client_cpu_s_per_gib": t["cpu"] / gib, "node_cpu_s_per_gib": t["node"] / gib}
        report["ways"].append(w)
        print(f"{name:<46} {w['mb_per_s_median']:>9.0f} {w['mb_per_s_min']:>9.0f} "
              f"{w['mb_per_s_max']:>9.0f} {w['client_cpu_s_per_gib']:>12.3f} "
              f"{w['node_cpu_s_per_gib']:>12.3f}")
    rate = {w["name"]: w["mb_per_s_median"] for w in report["ways"]}
    wire_rate = rate[ways[0][0]]
    report["get_over_wire"] = rate[ways[1][0]] / wire_rate
    report["get_into_over_wire"] = rate[ways[2][0]] / wire_rate
    line = (f"Client.get / wire = {report['get_over_wire']:.2f}, "
            f"Client.get_into / wire = {report['get_into_over_wire']:.2f}")
    if "curl -o /dev/null" in rate:
        report["get_over_curl"] = rate[ways[1][0]] / rate["curl -o /dev/null"]
        line += f", Client.get / curl = {report['get_over_curl']:.2f}"
        # One connection against curl's one.
        report["get_one_over_curl"] = rate["Client.get, one connection"] / rate["curl -o /dev/null"]
        report["get_into_one_over_curl"] = (rate["Client.get_into, one connection"]
                                            / rate["curl -o /dev/null"])
        line += (f"; one connection: Client.get / curl = {report['get_one_over_curl']:.2f}, "
                 f"Client.get_into / curl = {report['get_into_one_over_curl']:.2f}")
    print(line)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
