#!/usr/bin/env python3
"""P14, prep per core: images per second on one core for decode + RandomResizedCrop(224)
+ horizontal flip to a uint8 HWC array, on the same JPEG bytes (real photographs at
ImageNet's sizes, bench/photos.py), each way pinned to the same one core, taking turns:

  torchvision   what a DataLoader worker runs: PIL decode, torchvision's
                RandomResizedCrop rule (crop, then BILINEAR resize with antialiasing),
                RandomHorizontalFlip, numpy.asarray (torchvision itself is not on PyPI for
                every torch; its PIL path is these calls)
  pil-draft     the same with Pillow's draft(): the JPEG decoded at 1/2, 1/4 or 1/8 where
                the crop stays at least 224 on each side (the careful user's peer)
  granary       granary.Pipeline.prepare, the node's own code (zune-jpeg,
                fast_image_resize), with the GIL released

    python3 bench/p14.py --images 300 --rounds 5

Prints images/s per way (median of the rounds) and the ratio to torchvision. Needs
Pillow, numpy and the granary package.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from photos import imagenet_like  # noqa: E402

SIZE = 224
SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)
SPEC = {"members": ["jpg"], "output": "raw",
        "steps": [{"op": "random_resized_crop", "size": [SIZE, SIZE],
                   "scale": list(SCALE), "ratio": list(RATIO)},
                  {"op": "random_flip", "p": 0.5}]}


def crop_params(width, height, rng):
    """torchvision's RandomResizedCrop.get_params: (top, left, h, w)."""
    area = width * height
    log_ratio = (math.log(RATIO[0]), math.log(RATIO[1]))
    for _ in range(10):
        target = area * rng.uniform(*SCALE)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    in_ratio = width / height
    if in_ratio < RATIO[0]:
        w, h = width, int(round(width / RATIO[0]))
    elif in_ratio > RATIO[1]:
        h, w = height, int(round(height * RATIO[1]))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def torchvision_way(jpegs, rng):
    import numpy as np
    from PIL import Image

    for b in jpegs:
        img = Image.open(io.BytesIO(b)).convert("RGB")
        top, left, h, w = crop_params(img.width, img.height, rng)
        img = img.crop((left, top, left + w, top + h)).resize((SIZE, SIZE), Image.BILINEAR)
        if rng.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        np.asarray(img)


def pil_draft_way(jpegs, rng):
    import numpy as np
    from PIL import Image

    for b in jpegs:
        img = Image.open(io.BytesIO(b))
        width, height = img.size
        top, left, h, w = crop_params(width, height, rng)
        # Ask for the smallest decode that keeps the crop at least SIZE on each side.
        shrink = min(w, h) / SIZE
        img.draft("RGB", (math.ceil(width / shrink), math.ceil(height / shrink)))
        img = img.convert("RGB")
        fx, fy = img.width / width, img.height / height
        box = (left * fx, top * fy, (left + w) * fx, (top + h) * fy)
        img = img.resize((SIZE, SIZE), Image.BILINEAR, box=box)
        if rng.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        np.asarray(img)


def granary_way(jpegs, rng):
    import numpy as np

    import granary

    pipeline = granary._granary.Pipeline(json.dumps(SPEC))
    seed = rng.randrange(1 << 32)
    for i, b in enumerate(jpegs):
        data, w, h = pipeline.prepare(b, seed, 0, f"s{i}")
        np.frombuffer(data, np.uint8).reshape(h, w, 3)


WAYS = {"torchvision": torchvision_way, "pil-draft": pil_draft_way, "granary": granary_way}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--core", type=int, default=0, help="the one core every way runs on")
    ap.add_argument("--ways", default=",".join(WAYS))
    args = ap.parse_args()
    os.sched_setaffinity(0, {args.core})
    jpegs = imagenet_like(args.images)
    import PIL
    from PIL import Image

    import granary  # noqa: F401  (imported here: its import is not the way's time)
    sizes = [Image.open(io.BytesIO(b)).size for b in jpegs]
    print(f"{len(jpegs)} JPEGs, mean {statistics.mean(w for w, _ in sizes):.0f} x "
          f"{statistics.mean(h for _, h in sizes):.0f}, "
          f"{statistics.mean(map(len, jpegs)) / 1024:.1f} KiB; Pillow {PIL.__version__}; "
          f"core {args.core}")
    ways = args.ways.split(",")
    rates = {w: [] for w in ways}
    for r in range(args.rounds):
        for w in ways:
            rng = random.Random(r)
            t0 = time.perf_counter()
            c0 = time.process_time()
            WAYS[w](jpegs, rng)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            rates[w].append(len(jpegs) / cpu)
            print(f"  round {r} {w:12} {len(jpegs) / wall:7.1f} img/s wall, "
                  f"{len(jpegs) / cpu:7.1f} img/s per CPU second", flush=True)
    # Each round's ways ran back to back: their ratio in the round is steadier than the
    # ratio of medians on a host whose speed drifts.
    base = rates.get("torchvision")
    for w in ways:
        m = statistics.median(rates[w])
        line = f"{w:12} {m:7.1f} images/s per core"
        if base:
            paired = sorted(a / b for a, b in zip(rates[w], base))
            line += (f"  {statistics.median(paired):5.2f} x torchvision (rounds "
                     f"{paired[0]:.2f}-{paired[-1]:.2f})")
        print(line)


if __name__ == "__main__":
    main()
