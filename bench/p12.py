#!/usr/bin/env python3
"""P12: PyTorch data loaders over the same shards through the same node, side by side.

32 shards of 8 MiB (~80 samples of ~100 KiB each: a `.bin` and a `.cls`) on a node's
fs backend, warmed first. Each loader reads whole epochs through torch's DataLoader with
1 and 4 workers, rounds interleaved (A/B/A/B…), median kept:
  granary   granary.ShardDataset (range runs from the shard's owner, Rust tar parsing)
  granary-zc  the same over the node's Unix socket with zero_copy: members are
            memoryviews of the node's cache file (workers turn them into bytes)
  wds       WebDataset over the node's plain URLs
  s3tc      s3torchconnector S3IterableDataset over the node's S3 API (+ tarfile)
  boto3     boto3 get_object per shard (+ tarfile)
  ceiling   the DataLoader alone: samples of the same sizes made in memory (what handing
            samples from workers to the training loop costs, whatever reads them)
and, as the ceiling of the reads, curl fetching every shard (1 and 4 at a time). Figures: samples/s,
MB/s, and CPU seconds per GiB of the client (the process and its workers) and of the node.
Then: the time to resume mid-epoch (load_state_dict, first batch) against restarting the
epoch and skipping to the same point.

Usage: bench/p12.py [--rounds 3] [--shards 32] [--out target/p12]
Needs tests/.venv (torch, webdataset, boto3, s3torchconnector, granary) and a release
build of `granary` (target/release/granary, or $GRANARY_BIN).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import boto3
import requests
import torch
from torch.utils.data import DataLoader, IterableDataset

import granary
from datalib import free_port, Ceiling, make_shards, tar_samples, worker_split

ROOT = Path(__file__).resolve().parent.parent
BUCKET = "train"
PREFIX = "ds/"
SAMPLE = 100 << 10
PER_SHARD = 80
SOCKET = ""  # the node's Unix socket, set in main


def make_dataset(origin: Path, shards: int) -> int:
    return make_shards(origin / BUCKET / PREFIX, shards, PER_SHARD, SAMPLE)


def cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


class Boto3Shards(IterableDataset):
    def __init__(self, endpoint: str, keys: list[str]):
        self.endpoint, self.keys = endpoint, keys

    def __iter__(self):
        w, k = worker_split()
        s3 = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                          aws_access_key_id="k", aws_secret_access_key="s")
        for key in self.keys[w::k]:
            body = s3.get_object(Bucket=BUCKET, Key=key)["Body"]
            yield from tar_samples(body, key)


class S3tcShards(IterableDataset):
    def __init__(self, endpoint: str):
        self.endpoint = endpoint

    def __iter__(self):
        from s3torchconnector import S3IterableDataset
        ds = S3IterableDataset.from_prefix(f"s3://{BUCKET}/{PREFIX}", region="us-east-1",
                                           endpoint=self.endpoint, enable_sharding=True)
        for reader in ds:
            yield from tar_samples(reader, reader.key)


def to_bytes(sample: dict) -> dict:
    return {k: bytes(v) if isinstance(v, memoryview) else v for k, v in sample.items()}


def loader_for(name: str, endpoint: str, keys: list[str], workers: int, epoch: int):
    if name == "granary-zc":
        # Over the node's Unix socket, members mapped from its cache file; workers must
        # turn them into bytes to hand them on (a memoryview does not pickle).
        ds = granary.ShardDataset(f"unix:{SOCKET}", BUCKET, PREFIX, seed=0, rank=0,
                                  world_size=1, batch_size=32, read_ahead=2, zero_copy=True,
                                  map=to_bytes if workers else None)
        ds.set_epoch(epoch)
    elif name == "ceiling":
        ds = Ceiling(len(keys) * PER_SHARD, SAMPLE)
    elif name == "granary":
        ds = granary.ShardDataset(endpoint, BUCKET, PREFIX, seed=0, rank=0, world_size=1,
                                  batch_size=32, read_ahead=2)
        ds.set_epoch(epoch)
    elif name == "wds":
        import webdataset as wds
        urls = [f"{endpoint}/{BUCKET}/{k}" for k in keys]
        ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False)
    elif name == "s3tc":
        ds = S3tcShards(endpoint)
    else:
        ds = Boto3Shards(endpoint, keys)
    return DataLoader(ds, batch_size=32, num_workers=workers, collate_fn=lambda b: b,
                      persistent_workers=False)


def one_epoch(name, endpoint, keys, workers, node_pid, epoch) -> dict:
    c0, n0, t0 = own_cpu(), cpu_of(node_pid), time.perf_counter()
    samples = nbytes = 0
    for batch in loader_for(name, endpoint, keys, workers, epoch):
        for s in batch:
            samples += 1
            nbytes += sum(len(v) for k, v in s.items() if not k.startswith("__"))
            if name == "granary-zc" and not workers:
                assert isinstance(s["bin"], memoryview)
    wall = time.perf_counter() - t0
    gib = nbytes / (1 << 30)
    return {"samples": samples, "wall": wall, "samples_s": samples / wall,
            "mb_s": nbytes / wall / 1e6, "client_cpu_gib": (own_cpu() - c0) / gib,
            "node_cpu_gib": (cpu_of(node_pid) - n0) / gib}


def curl_epoch(endpoint, keys, parallel, node_pid, samples_total) -> dict:
    urls = [f"{endpoint}/{BUCKET}/{k}" for k in keys]
    c0, n0, t0 = own_cpu(), cpu_of(node_pid), time.perf_counter()
    procs = []
    for i in range(parallel):
        args = ["curl", "-sf"]
        for u in urls[i::parallel]:
            args += ["-o", "/dev/null", u]
        procs.append(subprocess.Popen(args))
    for p in procs:
        assert p.wait() == 0
    wall = time.perf_counter() - t0
    nbytes = sum(int(requests.head(u, timeout=10).headers["content-length"]) for u in urls)
    gib = nbytes / (1 << 30)
    return {"samples": samples_total, "wall": wall, "samples_s": samples_total / wall,
            "mb_s": nbytes / wall / 1e6, "client_cpu_gib": (own_cpu() - c0) / gib,
            "node_cpu_gib": (cpu_of(node_pid) - n0) / gib}


def resume_times(endpoint, total) -> dict:
    """Half an epoch consumed by 4 ranks; the job comes back on 4: time to the first
    batch after load_state_dict, against restarting the epoch and skipping to the same
    point (what a loader without resume does)."""
    batch = 32
    ds = granary.ShardDataset(endpoint, BUCKET, PREFIX, seed=0, rank=0, world_size=4,
                              batch_size=batch)
    half = (total // 2) // (4 * batch) * (4 * batch)
    state = ds.state_dict(consumed=half)
    t0 = time.perf_counter()
    ds2 = granary.ShardDataset(endpoint, BUCKET, PREFIX, seed=0, rank=0, world_size=4,
                               batch_size=batch)
    ds2.load_state_dict(state)
    next(iter(DataLoader(ds2, batch_size=batch, collate_fn=lambda b: b)))
    resume = time.perf_counter() - t0
    t0 = time.perf_counter()
    ds3 = granary.ShardDataset(endpoint, BUCKET, PREFIX, seed=0, rank=0, world_size=4,
                               batch_size=batch)
    it = iter(DataLoader(ds3, batch_size=batch, collate_fn=lambda b: b))
    for _ in range(half // 4 // batch + 1):
        next(it)
    restart = time.perf_counter() - t0
    return {"consumed": half, "resume_s": resume, "restart_and_skip_s": restart}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shards", type=int, default=32)
    ap.add_argument("--out", default=str(ROOT / "target" / "p12"))
    ap.add_argument("--workers", default="1,4", help="DataLoader worker counts")
    ap.add_argument("--only", default="granary,granary-zc,wds,s3tc,boto3,ceiling",
                    help="loaders to run")
    args = ap.parse_args()
    binary = os.environ.get("GRANARY_BIN", str(ROOT / "target" / "release" / "granary"))
    for k, v in {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s",
                 "AWS_REGION": "us-east-1"}.items():
        os.environ.setdefault(k, v)
    work = Path(tempfile.mkdtemp(prefix="p12-"))
    total = make_dataset(work / "origin", args.shards)
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = open(work / "node.log", "wb")
    global SOCKET
    SOCKET = str(work / "g.sock")
    node = subprocess.Popen([binary, "serve", "--listen", f"127.0.0.1:{port}",
                             "--listen-unix", SOCKET,
                             "--data-dir", str(work / "data"), "--backend",
                             f"fs:{work / 'origin'}", "--cache-capacity", "4GiB"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(100):
            try:
                if requests.get(f"{endpoint}/_granary/health", timeout=1).ok:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.1)
        keys = granary.Client(endpoint).list(BUCKET, PREFIX)
        for k in keys:  # warm: every loader reads hits
            requests.get(f"{endpoint}/{BUCKET}/{k}", timeout=60).raise_for_status()
        names = args.only.split(",")
        worker_counts = [int(w) for w in args.workers.split(",")]
        runs: dict[str, list[dict]] = {}
        for r in range(args.rounds):
            for workers in worker_counts:
                for name in names:
                    got = one_epoch(name, endpoint, keys, workers, node.pid, r)
                    assert got["samples"] == total, (name, got["samples"], total)
                    runs.setdefault(f"{name} w{workers}", []).append(got)
                    print(f"round {r} {name} w{workers}: {got['samples_s']:.0f} samples/s",
                          file=sys.stderr)
                runs.setdefault(f"curl x{max(workers, 1)}", []).append(
                    curl_epoch(endpoint, keys, max(workers, 1), node.pid, total))
        table = {}
        for label, rs in runs.items():
            med = lambda f: statistics.median(x[f] for x in rs)  # noqa: E731
            table[label] = {f: med(f) for f in
                            ("samples_s", "mb_s", "client_cpu_gib", "node_cpu_gib")}
        resume = resume_times(endpoint, total)
    finally:
        node.terminate()
        node.wait()
        shutil.rmtree(work, ignore_errors=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "p12.json").write_text(json.dumps({"table": table, "resume": resume,
                                              "samples": total}, indent=1))
    print(f"\nP12: {args.shards} shards x {PER_SHARD} samples of ~100 KiB, median of "
          f"{args.rounds} rounds; torch {torch.__version__}")
    print("| loader | workers | samples/s | MB/s | client CPU s/GiB | node CPU s/GiB |")
    print("|---|---|---|---|---|---|")
    for label, t in table.items():
        name, w = label.rsplit(" ", 1)
        print(f"| {name} | {w[1:]} | {t['samples_s']:.0f} | {t['mb_s']:.0f} | "
              f"{t['client_cpu_gib']:.2f} | {t['node_cpu_gib']:.2f} |")
    for w in worker_counts:
        if not all(f"{n} w{w}" in table for n in ("granary", "wds", "s3tc", "boto3")):
            continue
        g = table[f"granary w{w}"]["samples_s"]
        if f"ceiling w{w}" in table:
            print(f"ratio, {w} worker(s): granary/DataLoader ceiling "
                  f"{g / table[f'ceiling w{w}']['samples_s']:.2f}")
        print(f"ratios, {w} worker(s): granary/wds {g / table[f'wds w{w}']['samples_s']:.2f}"
              f", granary/s3tc {g / table[f's3tc w{w}']['samples_s']:.2f}"
              f", granary/boto3 {g / table[f'boto3 w{w}']['samples_s']:.2f}"
              f", granary/curl {g / table[f'curl x{max(w, 1)}']['samples_s']:.2f}")
    print(f"resume after {resume['consumed']} samples: first batch in "
          f"{resume['resume_s']:.3f} s; restart and skip: {resume['restart_and_skip_s']:.3f} s")


if __name__ == "__main__":
    main()
