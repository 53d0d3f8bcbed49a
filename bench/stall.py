#!/usr/bin/env python3
"""The stall harness: how much of a training step's demand each loader feeds.

A training loop takes batches from a torch DataLoader with ``--workers`` workers, each
worker decoding its samples into uint8 image tensors (collated into one tensor per batch),
and spends a fixed step on each batch: with ``--model none`` (the default, no GPU
needed) it waits ``--step-ms``; with ``--model resnet18`` on a GPU it runs a forward and
backward pass of ResNet-18 on it instead. Samples are 150,528 bytes (a 3x224x224 uint8
image) in WebDataset tar shards, the same shards for every loader:

  synthetic   samples made in memory (the DataLoader's own ceiling: its hand-over)
  granary     granary.ShardDataset given the HTTP address of a node on this machine
              (warm); the node offers its Unix socket, and the reads go on over it
  granary-tcp the same kept on TCP (GRANARY_LOCAL_SOCKET=off)
  granary-zc  the same over the node's Unix socket, members mapped (zero_copy)
  tarfile     the shard files read from local disk with tarfile (page cache warm)
  indexed     the shard files read through an index of member offsets made once from
              their tar headers, each member one pread (what a careful local user writes)
  indexed-mmap  the same, each member a slice of the shard's mapping (no copy)

Each loader runs ``--rounds`` epochs, loaders taking turns; the figure is samples/s
(median) and its fraction of the synthetic loader's: 1.0 means the loader never made
the step wait longer than data made in memory would.

    python3 bench/stall.py --workers 2 --rounds 3          # CPU only
    python3 bench/stall.py --workers 12 --model resnet18   # where a GPU is lent

Needs torch and the granary package, and a release build of ``granary``
(target/release/granary, or $GRANARY_BIN).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import warnings

import torch
from torch.utils.data import DataLoader, IterableDataset

import granary
from datalib import free_port, Ceiling, LocalIndexedShards, LocalTarShards, make_shards

ROOT = Path(__file__).resolve().parent.parent
# Samples are read-only bytes or mappings; the images made of them are never written.
warnings.filterwarnings("ignore", message="The given buffer is not writable")
BUCKET, PREFIX = "train", "ds/"
SAMPLE = 3 * 224 * 224


def decode(sample: dict) -> torch.Tensor:
    """A sample's `.bin` as a 3 x 224 x 224 uint8 image tensor (no copy: the DataLoader's
    collation copies it once into the batch, in shared memory)."""
    return torch.frombuffer(sample["bin"], dtype=torch.uint8).view(3, 224, 224)


class Decoded(IterableDataset):
    """Another dataset's samples, decoded in the worker that reads them."""

    def __init__(self, inner):
        self.inner = inner

    def __iter__(self):
        return map(decode, self.inner)


class Step:
    """What the training loop spends on each batch."""

    def __init__(self, model: str, step_ms: float):
        self.step = step_ms / 1e3
        self.model = None
        if model == "resnet18":
            import torchvision
            self.model = torchvision.models.resnet18().cuda().to(memory_format=torch.channels_last)
            self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
            self.loss = torch.nn.CrossEntropyLoss()

    def __call__(self, images: torch.Tensor) -> None:
        if self.model is None:
            time.sleep(self.step)
            return
        x = images.cuda(non_blocking=True).to(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = self.model(x.float().div_(255))
            loss = self.loss(out, torch.zeros(len(x), dtype=torch.long, device="cuda"))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()

    def sync(self) -> None:
        if self.model is not None:
            torch.cuda.synchronize()


def loader(name: str, a, endpoint: str, sock: str, paths: list, total: int, epoch: int):
    """Each loader's samples decoded into image tensors in its workers, the way a
    training job hands them over (collated into one tensor per batch, in shared memory)."""
    if name == "synthetic":
        ds = Decoded(Ceiling(total, SAMPLE))
    elif name == "tarfile":
        ds = Decoded(LocalTarShards(paths))
    elif name.startswith("indexed"):
        ds = Decoded(LocalIndexedShards(paths, "mmap" if name == "indexed-mmap" else "pread"))
    else:
        zc = name == "granary-zc"
        ds = granary.ShardDataset(f"unix:{sock}" if zc else endpoint, BUCKET, PREFIX,
                                  seed=0, rank=0, world_size=1, batch_size=a.batch,
                                  shuffle_shards=False, zero_copy=zc, map=decode)
        ds.set_epoch(epoch)
    return DataLoader(ds, batch_size=a.batch, num_workers=a.workers,
                      persistent_workers=False, pin_memory=False,
                      prefetch_factor=4 if a.workers else None)


def epoch(name: str, a, step: Step, endpoint: str, sock: str, paths: list, total: int,
          n: int) -> dict:
    samples = 0
    # The workers (forked as the iterator starts) take the setting from the environment.
    os.environ["GRANARY_LOCAL_SOCKET"] = "off" if name == "granary-tcp" else "on"
    it = iter(loader(name, a, endpoint, sock, paths, total, n))
    first = next(it)  # workers started and the first batch in: not timed
    step(first)
    step.sync()
    t0 = time.perf_counter()
    for batch in it:
        samples += len(batch)
        step(batch)
    step.sync()
    wall = time.perf_counter() - t0
    assert samples + len(first) == total, (name, samples + len(first), total)
    return {"samples_s": samples / wall, "wall": wall}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--step-ms", type=float, default=5.0,
                    help="the wait per batch with --model none")
    ap.add_argument("--model", choices=["none", "resnet18"], default="none")
    ap.add_argument("--shards", type=int, default=32)
    ap.add_argument("--per-shard", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", default="synthetic,granary,granary-tcp,granary-zc,tarfile,"
                    "indexed,indexed-mmap")
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()
    binary = os.environ.get("GRANARY_BIN", str(ROOT / "target" / "release" / "granary"))
    work = Path(tempfile.mkdtemp(prefix="stall-"))
    shard_dir = work / "origin" / BUCKET / PREFIX
    total = make_shards(shard_dir, a.shards, a.per_shard, SAMPLE, jitter=0)
    paths = sorted(shard_dir.iterdir())
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    sock = str(work / "g.sock")
    node = subprocess.Popen([binary, "serve", "--listen", f"127.0.0.1:{port}",
                             "--listen-unix", sock, "--data-dir", str(work / "data"),
                             "--backend", f"fs:{work / 'origin'}"],
                            stdout=subprocess.DEVNULL, stderr=open(work / "node.log", "wb"))
    try:
        for _ in range(200):
            try:
                with urllib.request.urlopen(f"{endpoint}/_granary/health", timeout=1):
                    break
            except OSError:
                time.sleep(0.05)
        c = granary.Client(endpoint)
        for p in paths:  # warm: the node serves hits, the files are in the page cache
            assert len(c.get(BUCKET, PREFIX + p.name)) == p.stat().st_size
            p.read_bytes()
        step = Step(a.model, a.step_ms)
        names = a.only.split(",")
        runs: dict = {n: [] for n in names}
        for r in range(a.rounds):
            for name in names:
                got = epoch(name, a, step, endpoint, sock, paths, total, r)
                runs[name].append(got["samples_s"])
                print(f"round {r} {name}: {got['samples_s']:.0f} samples/s", file=sys.stderr)
    finally:
        node.terminate()
        node.wait()
        shutil.rmtree(work, ignore_errors=True)
    base = statistics.median(runs["synthetic"]) if "synthetic" in runs else None
    what = (f"ResNet-18 on {torch.cuda.get_device_name()}" if a.model == "resnet18"
            else f"a {a.step_ms:g} ms wait")
    print(f"\nstall harness: {total} samples of {SAMPLE} bytes, batch {a.batch}, "
          f"{a.workers} workers, step: {what}; median of {a.rounds} epochs")
    print("| loader | samples/s (each epoch) | median | of synthetic |")
    print("|---|---|---|---|")
    table = {}
    for name, rates in runs.items():
        med = statistics.median(rates)
        frac = med / base if base else None
        table[name] = {"samples_s": rates, "median": med, "of_synthetic": frac}
        each = " / ".join(f"{x:.0f}" for x in rates)
        print(f"| {name} | {each} | {med:.0f} | {frac:.3f} |" if frac else
              f"| {name} | {each} | {med:.0f} | — |")
    for local in ("tarfile", "indexed", "indexed-mmap"):
        for mine in ("granary", "granary-zc"):
            if mine in table and local in table:
                ratio = table[mine]["median"] / table[local]["median"]
                print(f"{mine} / local {local} = {ratio:.3f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"workers": a.workers, "batch": a.batch,
                                            "step": what, "samples": total,
                                            "table": table}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
