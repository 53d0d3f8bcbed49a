#!/usr/bin/env python3
"""P15, coordinated prep: what the node's CPU pays to prepare an epoch for several jobs
of one hyper-parameter search (same dataset, same seed), against one job alone and
against independent jobs (each its own seed).

One node on this machine with ``[pipelines.train224]`` (RandomResizedCrop(224) + flip,
raw), over tar shards of real photographs (bench/photos.py, ImageNet's spread of sizes;
a ``.jpg`` and a ``.cls`` per sample). Each job is a ``granary.ShardDataset(...,
pipeline="train224")`` reading one epoch in a thread of its own. Every measurement
reads a fresh epoch, so nothing is kept from an earlier one. Shapes:

  one           one job
  same-seed     ``--jobs`` jobs with one seed, started together
  staggered     ``--jobs`` jobs with one seed, each started when the one before has
                read half its epoch
  independent   ``--jobs`` jobs, each its own seed, started together

The figure is the node's ``prep_cpu_seconds`` for the epoch (its prep threads' CPU
time, from /_granary/stats), and its ratio to one job's; ``prep_samples`` and
``prep_shared`` say how the work was shared. The jobs of one seed are checked to get the
same bytes for every sample.

    python3 bench/p15.py --images 600 --jobs 4 --rounds 3
    python3 bench/p15.py --images 600 --jobs 4 --rounds 3 --prep-memory 32MiB

Needs Pillow (to cut the photographs), the granary package and a release build of
``granary`` (target/release/granary, or $GRANARY_BIN).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from datalib import free_port  # noqa: E402
from photos import imagenet_like  # noqa: E402

import granary  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BUCKET, PREFIX = "photos", "train/"
CONFIG = """
[pipelines.train224]
members = ["jpg"]
steps = [
  { op = "random_resized_crop", size = [224, 224], scale = [0.08, 1.0], ratio = [0.75, 1.3333] },
  { op = "random_flip", p = 0.5 },
]
output = "raw"
"""


def write_shards(directory: Path, jpegs: list[bytes], per_shard: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(0, len(jpegs), per_shard):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for j, jpg in enumerate(jpegs[i:i + per_shard]):
                for ext, data in (("jpg", jpg), ("cls", str(j % 10).encode())):
                    info = tarfile.TarInfo(f"s{i + j:06}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        (directory / f"shard-{i // per_shard:04}.tar").write_bytes(buf.getvalue())


@contextlib.contextmanager
def photo_node(images: int, per_shard: int, seed: int, *extra: str):
    """A node on this machine with `[pipelines.train224]`, over `images` photographs at
    ImageNet's sizes in shards of `per_shard` (`.jpg` and `.cls` each), warm in its cache:
    its endpoint; stopped and its files removed after."""
    binary = os.environ.get("GRANARY_BIN", str(ROOT / "target" / "release" / "granary"))
    work = Path(tempfile.mkdtemp(prefix="photos-"))
    write_shards(work / "origin" / BUCKET / PREFIX.rstrip("/"),
                 imagenet_like(images, seed=seed), per_shard)
    (work / "granary.toml").write_text(CONFIG)
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    node = subprocess.Popen([binary, "serve", "--listen", f"127.0.0.1:{port}",
                             "--data-dir", str(work / "data"),
                             "--backend", f"fs:{work / 'origin'}",
                             "--config", str(work / "granary.toml"), *extra],
                            stdout=subprocess.DEVNULL, stderr=open(work / "node.log", "wb"))
    try:
        for _ in range(300):
            try:
                stats(endpoint)
                break
            except OSError:
                time.sleep(0.05)
        c = granary.Client(endpoint)
        for key in c.list(BUCKET, PREFIX):  # warm: the prep is measured, not the fill
            c.get(BUCKET, key)
        yield endpoint
    finally:
        node.terminate()
        node.wait()
        shutil.rmtree(work, ignore_errors=True)


def stats(endpoint: str) -> dict:
    with urllib.request.urlopen(f"{endpoint}/_granary/stats", timeout=10) as r:
        return json.load(r)


class Job(threading.Thread):
    """One job reading one epoch; `half` is set when it has read half of it."""

    def __init__(self, endpoint: str, seed: int, epoch: int, total: int):
        super().__init__()
        self.endpoint, self.seed, self.epoch, self.total = endpoint, seed, epoch, total
        self.half = threading.Event()
        self.digests: dict = {}
        self.error = None

    def run(self) -> None:
        try:
            ds = granary.ShardDataset(self.endpoint, BUCKET, PREFIX, seed=self.seed,
                                      rank=0, world_size=1, pipeline="train224")
            ds.set_epoch(self.epoch)
            for n, s in enumerate(ds):
                self.digests[s["__key__"]] = hashlib.blake2b(s["jpg"], digest_size=16).digest()
                if n + 1 >= self.total // 2:
                    self.half.set()
        except Exception as e:  # noqa: BLE001 - reported by the caller
            self.error = e
        finally:
            self.half.set()


def measure(endpoint: str, shape: str, jobs: int, epoch: int, total: int) -> dict:
    before = stats(endpoint)
    start = time.monotonic()
    if shape == "one":
        threads = [Job(endpoint, 1, epoch, total)]
    elif shape == "independent":
        threads = [Job(endpoint, 100 + k, epoch, total) for k in range(jobs)]
    else:
        threads = [Job(endpoint, 1, epoch, total) for _ in range(jobs)]
    for t in threads:
        t.start()
        if shape == "staggered":
            t.half.wait()
    for t in threads:
        t.join()
    wall = time.monotonic() - start
    for t in threads:
        if t.error is not None:
            raise t.error
        assert len(t.digests) == total, (len(t.digests), total)
    if shape in ("same-seed", "staggered"):
        assert all(t.digests == threads[0].digests for t in threads), \
            "jobs of one seed got different bytes"
    after = stats(endpoint)
    delta = {k: after[k] - before[k] for k in ("prep_cpu_seconds", "prep_samples",
                                               "prep_shared")}
    delta["wall_s"] = wall
    return delta


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=600)
    ap.add_argument("--per-shard", type=int, default=50)
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prep-memory", default="1GiB",
                    help="the node's --prep-memory (an epoch of 600 is 90 MB prepared)")
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()
    shapes = ["one", "same-seed", "staggered", "independent"]
    runs: dict = {k: [] for k in shapes}
    with photo_node(a.images, a.per_shard, 15, "--prep-memory", a.prep_memory) as endpoint:
        epoch = 0
        for r in range(a.rounds):
            for shape in shapes:
                epoch += 1
                got = measure(endpoint, shape, a.jobs, epoch, a.images)
                runs[shape].append(got)
                print(f"round {r} {shape}: {json.dumps(got)}", file=sys.stderr)
    one = statistics.median(x["prep_cpu_seconds"] for x in runs["one"])
    print(f"\nP15: {a.images} photographs (ImageNet sizes) in {a.images // a.per_shard} "
          f"shards, RandomResizedCrop(224) + flip on the node, {a.jobs} jobs, "
          f"--prep-memory {a.prep_memory}; median of {a.rounds} rounds")
    print("| shape | node prep CPU s per epoch | of one job's | prepared | shared |")
    print("|---|---|---|---|---|")
    table = {}
    for shape, xs in runs.items():
        cpu = statistics.median(x["prep_cpu_seconds"] for x in xs)
        prepared = statistics.median(x["prep_samples"] for x in xs)
        shared = statistics.median(x["prep_shared"] for x in xs)
        table[shape] = {"runs": xs, "cpu_s": cpu, "of_one": cpu / one}
        print(f"| {shape} | {cpu:.2f} | {cpu / one:.2f}x | {prepared:.0f} | {shared:.0f} |")
    if a.json:
        Path(a.json).write_text(json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
