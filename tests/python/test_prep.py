"""Sample preparation in the client (`granary._granary.Pipeline`, the node's own code):
the bytes are a function of (definition, seed, epoch, sample key) alone, the same in
another process; raw output is H x W x 3; undecodable input is an error naming the
sample, and a definition that cannot run is refused with the field."""

from __future__ import annotations

import io
import json
import multiprocessing

import pytest

granary = pytest.importorskip("granary")
Image = pytest.importorskip("PIL.Image")

SPEC = {"members": ["jpg"], "output": "raw",
        "steps": [{"op": "random_resized_crop", "size": [96, 128]},
                  {"op": "random_flip", "p": 0.5}]}


def photo_like(width=320, height=240, quality=85) -> bytes:
    img = Image.new("RGB", (width, height))
    img.putdata([((x * 255) // width, (y * 255) // height, ((x ^ y) & 0xFF))
                 for y in range(height) for x in range(width)])
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def prepare_elsewhere(spec_json, data, seed, epoch, key, out):
    import granary as g
    out.put(g._granary.Pipeline(spec_json).prepare(data, seed, epoch, key))


def test_a_prepared_sample_is_the_same_bytes_in_another_process():
    spec = json.dumps(SPEC)
    p = granary._granary.Pipeline(spec)
    data = photo_like()
    got, w, h = p.prepare(data, 5, 2, "shard-0000/s0001")
    assert (w, h, len(got)) == (128, 96, 96 * 128 * 3)
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=prepare_elsewhere,
                       args=(spec, data, 5, 2, "shard-0000/s0001", q))
    proc.start()
    assert q.get(timeout=120) == (got, w, h)
    proc.join(timeout=30)
    others = {p.prepare(data, *args)[0] for args in
              [(6, 2, "shard-0000/s0001"), (5, 3, "shard-0000/s0001"),
               (5, 2, "shard-0000/s0002")]}
    assert got not in others and len(others) == 3
    assert p.prepares("s0001.jpg") and not p.prepares("s0001.cls")


def test_damaged_images_and_bad_definitions_are_errors():
    p = granary._granary.Pipeline(json.dumps(SPEC))
    data = photo_like()
    with pytest.raises(granary.GranaryError, match="shard-0000/s0009"):
        p.prepare(data[: len(data) // 2], 0, 0, "shard-0000/s0009")
    with pytest.raises(granary.GranaryError, match="neither a JPEG nor a PNG"):
        p.prepare(b"GIF89a" + bytes(100), 0, 0, "k")
    bad = dict(SPEC, steps=[{"op": "random_resized_crop", "size": [96, 128],
                             "scale": [0.9, 0.1]}])
    with pytest.raises(ValueError, match=r"steps\[0\]: scale"):
        granary._granary.Pipeline(json.dumps(bad))
    with pytest.raises(ValueError, match="unknown variant"):
        granary._granary.Pipeline(json.dumps(dict(SPEC, steps=[{"op": "rotate"}])))
