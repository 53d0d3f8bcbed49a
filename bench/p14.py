#!/usr/bin/env python3
"""P14, prep per core: images per second on one core from JPEG bytes to a uint8 HWC
array, each way pinned to the same one core, taking turns in every round, on the same
JPEGs (real photographs, bench/photos.py).

Recipes (``--recipe``):
  train   decode + RandomResizedCrop(224) + horizontal flip (a training step's prep)
  eval    decode + Resize(256) + CenterCrop(224) (the evaluation recipe)
Sizes (``--size``):
  imagenet  longer side 340-660 (about 490 x 390, ImageNet's training images)
  large     longer side 1280-1920 (photos as cameras and the web give them; cut from the
            same 640-pixel photographs, so they are smoother than a camera's)

Ways:
  torchvision   what a DataLoader worker runs: PIL decode (Pillow's wheel bundles
                libjpeg-turbo), torchvision's crop rules, BILINEAR resize with
                antialiasing, flip, numpy.asarray (torchvision itself is not on PyPI for
                every torch; its PIL path is these calls)
  pil-draft     the same with Pillow's draft(): the JPEG decoded at 1/2, 1/4 or 1/8
                where the crop stays at least the output size
  simplejpeg    libjpeg-turbo through simplejpeg, its DCT scaling to the smallest size
                that keeps the crop at least the output size, then Pillow's resize and
                flip: the careful user's fastest peer here (pillow-simd has no wheel)
  granary       granary.Pipeline.prepare, the node's own code (zune-jpeg,
                fast_image_resize), with the GIL released

    python3 bench/p14.py --recipe train --size imagenet --images 500 --rounds 7

Prints images/s per way (median of the rounds, CPU time) and, per way, the median of the
rounds' own ratios to torchvision (the ways run back to back within a round; this host's
speed drifts between rounds). Needs Pillow, numpy, simplejpeg and the granary package.
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

OUT = 224
SHORTER = 256
SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)
SIZES = {"imagenet": (340, 660), "large": (1280, 1920)}
SPECS = {
    "train": [{"op": "random_resized_crop", "size": [OUT, OUT], "scale": list(SCALE),
               "ratio": list(RATIO)}, {"op": "random_flip", "p": 0.5}],
    "eval": [{"op": "resize", "shorter": SHORTER}, {"op": "center_crop", "size": [OUT, OUT]}],
}


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


def plan(recipe, width, height, rng):
    """What a recipe does to a `width` x `height` image: the source box (left, top,
    right, bottom) resized to the output, the output size, the crop taken after the
    resize (eval), and whether to flip; and the smallest side the box may shrink to."""
    if recipe == "train":
        top, left, h, w = crop_params(width, height, rng)
        flip = rng.random() < 0.5
        return (left, top, left + w, top + h), (OUT, OUT), None, flip, min(w, h) / OUT
    short, long_ = min(width, height), max(width, height)
    new_long = SHORTER * long_ // short
    size = (SHORTER, new_long) if width <= height else (new_long, SHORTER)
    left = int(round((size[0] - OUT) / 2.0))
    top = int(round((size[1] - OUT) / 2.0))
    return (0, 0, width, height), size, (left, top, left + OUT, top + OUT), False, \
        short / SHORTER


def finish(img, size, after, flip):
    from PIL import Image

    if after is not None:
        img = img.crop(after)
    if flip:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return img


def torchvision_way(jpegs, rng, recipe):
    import numpy as np
    from PIL import Image

    for b in jpegs:
        img = Image.open(io.BytesIO(b)).convert("RGB")
        box, size, after, flip, _ = plan(recipe, img.width, img.height, rng)
        img = img.crop(box).resize(size, Image.BILINEAR)
        np.asarray(finish(img, size, after, flip))


def pil_draft_way(jpegs, rng, recipe):
    import numpy as np
    from PIL import Image

    for b in jpegs:
        img = Image.open(io.BytesIO(b))
        width, height = img.size
        box, size, after, flip, shrink = plan(recipe, width, height, rng)
        img.draft("RGB", (math.ceil(width / shrink), math.ceil(height / shrink)))
        img = img.convert("RGB")
        fx, fy = img.width / width, img.height / height
        box = (box[0] * fx, box[1] * fy, box[2] * fx, box[3] * fy)
        img = img.resize(size, Image.BILINEAR, box=box)
        np.asarray(finish(img, size, after, flip))


def simplejpeg_way(jpegs, rng, recipe):
    import numpy as np
    import simplejpeg
    from PIL import Image

    for b in jpegs:
        width, height, _, _ = simplejpeg.decode_jpeg_header(b)
        box, size, after, flip, shrink = plan(recipe, width, height, rng)
        arr = simplejpeg.decode_jpeg(b, colorspace="RGB",
                                     min_width=math.ceil(width / shrink),
                                     min_height=math.ceil(height / shrink))
        img = Image.fromarray(arr)
        fx, fy = img.width / width, img.height / height
        box = (box[0] * fx, box[1] * fy, box[2] * fx, box[3] * fy)
        img = img.resize(size, Image.BILINEAR, box=box)
        np.asarray(finish(img, size, after, flip))


def granary_way(jpegs, rng, recipe):
    import numpy as np

    import granary

    spec = {"members": ["jpg"], "output": "raw", "steps": SPECS[recipe]}
    pipeline = granary._granary.Pipeline(json.dumps(spec))
    seed = rng.randrange(1 << 32)
    for i, b in enumerate(jpegs):
        data, w, h = pipeline.prepare(b, seed, 0, f"s{i}")
        np.frombuffer(data, np.uint8).reshape(h, w, 3)


WAYS = {"torchvision": torchvision_way, "pil-draft": pil_draft_way,
        "simplejpeg": simplejpeg_way, "granary": granary_way}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", choices=sorted(SPECS), default="train")
    ap.add_argument("--size", choices=sorted(SIZES), default="imagenet")
    ap.add_argument("--images", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--core", type=int, default=0, help="the one core every way runs on")
    ap.add_argument("--ways", default=",".join(WAYS))
    args = ap.parse_args()
    os.sched_setaffinity(0, {args.core})
    jpegs = imagenet_like(args.images, longer=SIZES[args.size])
    import PIL
    from PIL import Image

    import granary  # noqa: F401  (imported here: its import is not the way's time)
    sizes = [Image.open(io.BytesIO(b)).size for b in jpegs]
    print(f"{args.recipe} recipe, {len(jpegs)} JPEGs, mean "
          f"{statistics.mean(w for w, _ in sizes):.0f} x "
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
            WAYS[w](jpegs, rng, args.recipe)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            rates[w].append(len(jpegs) / cpu)
            print(f"  round {r} {w:12} {len(jpegs) / wall:7.1f} img/s wall, "
                  f"{len(jpegs) / cpu:7.1f} img/s per CPU second", flush=True)
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
