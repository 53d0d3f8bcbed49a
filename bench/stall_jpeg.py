#!/usr/bin/env python3
"""The stall harness with JPEG samples: where the prep stall goes when the node prepares.

A training loop takes batches of ``--batch`` 3 x 224 x 224 uint8 images from a torch
DataLoader and waits ``--step-ms`` on each (the GPU's step; no GPU needed). The samples
are real photographs at ImageNet's sizes (``bench/photos.py``), a ``.jpg`` and a ``.cls``
each, in tar shards on one node on this machine (warm in its cache). Loaders:

  synthetic           image tensors made in memory: the DataLoader's ceiling
  torchvision-wN      granary.ShardDataset reads the JPEGs; N DataLoader workers decode
                      and augment them as torchvision's PIL path does (PIL decode,
                      RandomResizedCrop(224) by torchvision's rule, BILINEAR resize,
                      horizontal flip): the prep stall on the trainer
  granary-local-w2    the same pipeline's code in 2 workers (``prepare="local"``)
  pipeline-wN         ``ShardDataset(pipeline="train224")``: the node prepares each
                      sample; N workers only wrap the raw bytes as tensors

Per loader: samples/s (median of ``--rounds`` epochs), the epoch time against
synthetic's, the trainer's CPU seconds per sample (this process and its DataLoader
workers: getrusage of self and children) and the node's (process_cpu_seconds).

    python3 bench/stall_jpeg.py --step-ms 40 --rounds 3
    python3 bench/stall_jpeg.py --step-ms 100 --rounds 3

Needs torch, Pillow, the granary package and a release build of ``granary``.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import random
import resource
import statistics
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from torch.utils.data import DataLoader, IterableDataset  # noqa: E402

import granary  # noqa: E402
from datalib import Ceiling  # noqa: E402
from p15 import BUCKET, PREFIX, photo_node  # noqa: E402
from stall import Step  # noqa: E402

OUT = 224


def torchvision_prep(sample: dict) -> tuple:
    """What a DataLoader worker runs with torchvision's transforms on a PIL image."""
    import numpy as np
    from PIL import Image

    img = Image.open(io.BytesIO(sample["jpg"])).convert("RGB")
    width, height = img.size
    rng = random.Random()
    area = width * height
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        aspect = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top, left = rng.randint(0, height - h), rng.randint(0, width - w)
            break
    else:
        w, h = min(width, height), min(width, height)
        top, left = (height - h) // 2, (width - w) // 2
    img = img.crop((left, top, left + w, top + h)).resize((OUT, OUT), Image.BILINEAR)
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1), int(sample["cls"])


def raw_tensor(sample: dict) -> tuple:
    """A prepared sample's raw bytes as a 3 x 224 x 224 tensor (one copy, into the
    batch, by the DataLoader's collation)."""
    img = torch.frombuffer(bytearray(sample["jpg"]), dtype=torch.uint8).view(OUT, OUT, 3)
    return img.permute(2, 0, 1), int(sample["cls"])


class Synthetic(IterableDataset):
    def __init__(self, total: int):
        self.inner = Ceiling(total, 3 * OUT * OUT)

    def __iter__(self):
        for s in self.inner:
            yield torch.frombuffer(s["bin"], dtype=torch.uint8).view(3, OUT, OUT), 1


def loader(name: str, a, endpoint: str, total: int, epoch: int) -> DataLoader:
    workers = int(name.rsplit("-w", 1)[1]) if "-w" in name else 2
    if name == "synthetic":
        ds = Synthetic(total)
    else:
        kw = {}
        if name.startswith("pipeline"):
            kw = {"pipeline": "train224", "map": raw_tensor}
        elif name.startswith("granary-local"):
            kw = {"pipeline": "train224", "prepare": "local", "map": raw_tensor}
        else:
            kw = {"map": torchvision_prep}
        ds = granary.ShardDataset(endpoint, BUCKET, PREFIX, seed=epoch % 2, rank=0,
                                  world_size=1, batch_size=a.batch, **kw)
        ds.set_epoch(epoch)
    return DataLoader(ds, batch_size=a.batch, num_workers=workers,
                      persistent_workers=False, prefetch_factor=4)


def cpu_here() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def node_cpu(endpoint: str) -> float:
    with urllib.request.urlopen(f"{endpoint}/_granary/stats", timeout=10) as r:
        return json.load(r)["process_cpu_seconds"]


def run_epoch(name: str, a, step: Step, endpoint: str, total: int, n: int) -> dict:
    cpu0, node0 = cpu_here(), node_cpu(endpoint)
    t0 = time.perf_counter()
    samples = 0
    for images, _ in loader(name, a, endpoint, total, n):
        assert images.dtype == torch.uint8 and tuple(images.shape[1:]) == (3, OUT, OUT)
        samples += len(images)
        step(images)
    wall = time.perf_counter() - t0
    assert samples == total, (name, samples, total)
    return {"samples_s": samples / wall, "wall": wall,
            "trainer_cpu_ms": 1e3 * (cpu_here() - cpu0) / samples,
            "node_cpu_ms": 1e3 * (node_cpu(endpoint) - node0) / samples}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--step-ms", type=float, default=40.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default="synthetic,torchvision-w1,torchvision-w2,"
                                      "granary-local-w2,pipeline-w1,pipeline-w2")
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()
    names = a.only.split(",")
    runs: dict = {n: [] for n in names}
    with photo_node(a.images, 64, 16) as endpoint:
        step = Step("none", a.step_ms)
        n = 0
        for r in range(a.rounds):
            for name in names:
                n += 1
                got = run_epoch(name, a, step, endpoint, a.images, n)
                runs[name].append(got)
                print(f"round {r} {name}: {json.dumps(got)}", file=sys.stderr)
    base = statistics.median(x["wall"] for x in runs["synthetic"]) if "synthetic" in runs else None
    print(f"\nstall harness, JPEG: {a.images} photographs (ImageNet sizes), batch {a.batch}, "
          f"a {a.step_ms:g} ms step per batch (demand {1e3 * a.batch / a.step_ms:.0f} "
          f"samples/s); median of {a.rounds} epochs")
    print("| loader | samples/s | epoch time × synthetic | trainer CPU ms/sample "
          "| node CPU ms/sample |")
    print("|---|---|---|---|---|")
    table = {}
    for name, xs in runs.items():
        med = {k: statistics.median(x[k] for x in xs) for k in xs[0]}
        med["of_synthetic"] = med["wall"] / base if base else None
        table[name] = {"runs": xs, "median": med}
        print(f"| {name} | {med['samples_s']:.0f} | {med['of_synthetic']:.2f} | "
              f"{med['trainer_cpu_ms']:.2f} | {med['node_cpu_ms']:.2f} |")
    if a.json:
        Path(a.json).write_text(json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
