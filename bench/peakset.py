"""Images for the prep memory check (`server/prep/examples/peak.rs`): made ones at the
sizes and layouts that stress a preparation's memory, beside real photographs.

    python3 bench/photos.py 300 /tmp/photos
    python3 bench/peakset.py /tmp/photos /tmp/peakset
    cargo run --release -p granary-prep --example peak -- /tmp/peakset

Writes 20 of the photographs, and smooth noise (seed 5) as baseline JPEGs from 1 x 1 to
8000 x 7500 (60 megapixels, extreme aspects 1 x 8000 and 8000 x 1 included), progressive
JPEGs 4:4:4 and 4:2:0 up to 12 megapixels, and PNGs up to 6 megapixels.
"""

import shutil
import sys
from pathlib import Path

import numpy as np
from PIL import Image

SHAPES = [(1, 1), (7, 3), (1, 8000), (8000, 1), (640, 480), (2000, 1500), (4000, 3000),
          (6000, 4000), (8000, 7500)]


def main(photos: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for p in sorted(photos.glob("*.jpg"))[:20]:
        shutil.copy(p, out / p.name)
    rng = np.random.default_rng(5)
    for w, h in SHAPES:
        base = rng.integers(0, 255, (max(1, h // 16), max(1, w // 16), 3), dtype=np.uint8)
        img = Image.fromarray(base).resize((w, h), Image.BILINEAR)
        img.save(out / f"b_{w}x{h}.jpg", quality=90)
        if w * h <= 12_000_000:
            img.save(out / f"p444_{w}x{h}.jpg", quality=90, progressive=True, subsampling=0)
            img.save(out / f"p420_{w}x{h}.jpg", quality=90, progressive=True, subsampling=2)
        if w * h <= 6_000_000:
            img.save(out / f"png_{w}x{h}.png")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
