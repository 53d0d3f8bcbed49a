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


# ---- ShardDataset(pipeline=...) against real nodes -----------------------------------

PIPELINE_TOML = """
[pipelines.train]
members = ["jpg"]
steps = [
  { op = "random_resized_crop", size = [96, 128], scale = [0.08, 1.0], ratio = [0.75, 1.3333] },
  { op = "random_flip", p = 0.5 },
]
output = "raw"
"""
PREP_BUCKET = "photos"


def write_photo_shards(origin, prefix, counts, damaged=None):
    """Tar shards of (jpg, cls) samples under `origin/photos/prefix`: every sample by key,
    with its shard. `damaged`: a sample key whose JPEG is cut in half."""
    import tarfile
    d = origin / PREP_BUCKET / prefix
    d.mkdir(parents=True, exist_ok=True)
    every = {}
    for i, n in enumerate(counts):
        shard = f"{prefix}/shard-{i:04}.tar"
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for j in range(n):
                key = f"s{i:02}{j:03}"
                jpg = photo_like(120 + 8 * j, 90 + 6 * i, quality=80 + j % 10)
                if key == damaged:
                    jpg = jpg[: len(jpg) // 2]
                for ext, data in (("jpg", jpg), ("cls", str(j).encode())):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                every[key] = {"jpg": jpg, "cls": str(j).encode(), "__url__": shard}
        (d / f"shard-{i:04}.tar").write_bytes(buf.getvalue())
    return every


@pytest.fixture(scope="module")
def prep_cluster(tmp_path_factory):
    """Two nodes with the `train` pipeline over one origin: (endpoints, samples, origin)."""
    from test_granary_py import members
    root = tmp_path_factory.mktemp("prepcluster")
    origin = root / "origin"
    every = write_photo_shards(origin, "ds", [5, 7, 6, 4, 6])
    config = root / "granary.toml"
    config.write_text(PIPELINE_TOML)
    with members(root, origin, ["p0", "p1"], creds=False,
                 extra=["--config", str(config)]) as endpoints:
        yield endpoints, every, origin


def expected(every, seed, epoch, key):
    """Sample `key` as the pipeline prepares it for (seed, epoch), here."""
    spec = PIPELINE_TOML_SPEC
    p = granary._granary.Pipeline(spec)
    s = every[key]
    return p.prepare(s["jpg"], seed, epoch,
                     granary._granary.Pipeline.sample_key(s["__url__"], key))[0]


PIPELINE_TOML_SPEC = json.dumps({
    "members": ["jpg"], "output": "raw",
    "steps": [{"op": "random_resized_crop", "size": [96, 128], "scale": [0.08, 1.0],
               "ratio": [0.75, 1.3333]},
              {"op": "random_flip", "p": 0.5}]})


def prep_totals(endpoints):
    """prep_samples and prep_shared over the nodes."""
    stats = [granary.Client(e).stats() for e in endpoints]
    return (sum(s["prep_samples"] for s in stats), sum(s["prep_shared"] for s in stats))


def read_ranks(endpoint, world, seed, epoch, **kw):
    out = []
    for rank in range(world):
        ds = granary.ShardDataset(endpoint, PREP_BUCKET, "ds/", seed=seed, rank=rank,
                                  world_size=world, **kw)
        ds.set_epoch(epoch)
        out.append(list(ds))
    return out


def test_shard_dataset_samples_arrive_prepared_for_the_seed_and_epoch(prep_cluster):
    endpoints, every, _ = prep_cluster
    ranks = read_ranks(endpoints[0], 2, 7, 1, pipeline="train")
    keys = [s["__key__"] for r in ranks for s in r]
    assert sorted(keys) == sorted(every), "every sample once per epoch"
    assert len(ranks[0]) == len(ranks[1]) == len(every) // 2
    for s in (s for r in ranks for s in r):
        assert s["jpg"] == expected(every, 7, 1, s["__key__"]), s["__key__"]
        assert len(s["jpg"]) == 96 * 128 * 3
        assert s["cls"] == every[s["__key__"]]["cls"], "members it does not take pass"
    # The same pipeline run in the reading process: the same samples, the same bytes.
    local = read_ranks(endpoints[1], 2, 7, 1, pipeline="train", prepare="local")
    assert local == ranks
    # Another epoch: the same samples, other crops.
    later = read_ranks(endpoints[0], 2, 7, 2, pipeline="train")
    before = {s["__key__"]: s["jpg"] for r in ranks for s in r}
    after = {s["__key__"]: s["jpg"] for r in later for s in r}
    assert before.keys() == after.keys()
    assert sum(before[k] != after[k] for k in before) >= len(before) - 1
    with pytest.raises(ValueError, match="nope"):
        granary.ShardDataset(endpoints[0], PREP_BUCKET, "ds/", pipeline="nope",
                             prepare="local")


def test_jobs_of_one_seed_share_each_preparation(prep_cluster):
    endpoints, every, _ = prep_cluster
    samples0, shared0 = prep_totals(endpoints)
    first = read_ranks(endpoints[0], 1, 11, 0, pipeline="train")
    second = read_ranks(endpoints[1], 1, 11, 0, pipeline="train")
    assert first == second
    samples1, shared1 = prep_totals(endpoints)
    assert samples1 - samples0 == len(every), "each sample prepared once for both jobs"
    # The second job's every sample, and the first job's that the owners prepared
    # ahead of its reads (its plan names the pipeline).
    assert len(every) <= shared1 - shared0 <= 2 * len(every)
    plans = granary.Client(endpoints[0]).plans()
    assert any(p.get("pipeline") == "train" for p in plans), plans


def test_a_resumed_epoch_with_a_pipeline_reads_the_rest_once(prep_cluster):
    endpoints, every, _ = prep_cluster
    seed, epoch, batch = 3, 5, 2
    it = []
    for rank in range(2):
        ds = granary.ShardDataset(endpoints[0], PREP_BUCKET, "ds/", seed=seed, rank=rank,
                                  world_size=2, pipeline="train")
        ds.set_epoch(epoch)
        it.append((ds, iter(ds)))
    taken = [next(i) for _, i in it for _ in range(batch)]
    state = it[0][0].state_dict(consumed=2 * batch)
    rest = []
    for rank in range(3):
        ds = granary.ShardDataset(endpoints[1], PREP_BUCKET, "ds/", seed=seed, rank=rank,
                                  world_size=3, pipeline="train")
        ds.load_state_dict(state)
        rest += list(ds)
    keys = [s["__key__"] for s in taken + rest]
    # The new world pads to equal counts: the rest once each, a few repeated.
    assert set(keys) == set(every)
    assert len(keys) - len(set(keys)) < 3
    for s in taken + rest:
        assert s["jpg"] == expected(every, seed, epoch, s["__key__"]), s["__key__"]


def test_a_member_that_cannot_be_prepared_is_an_error_naming_it(prep_cluster):
    endpoints, _, origin = prep_cluster
    write_photo_shards(origin, "bad", [3], damaged="s00000")
    for prepare in ("node", "local"):
        ds = granary.ShardDataset(endpoints[0], PREP_BUCKET, "bad/", seed=1,
                                  pipeline="train", prepare=prepare, plan=False)
        with pytest.raises(granary.GranaryError, match="s00000"):
            list(ds)


def to_tensors(s):
    """The README's per-sample map, for this pipeline's 96 x 128 output."""
    import numpy as np
    import torch
    img = np.frombuffer(s["jpg"], np.uint8).reshape(96, 128, 3)
    return torch.from_numpy(img.copy()).permute(2, 0, 1), int(s["cls"])


def test_the_readmes_training_loop_gets_prepared_batches(prep_cluster):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader
    endpoints, every, _ = prep_cluster
    ds = granary.ShardDataset(endpoints[0], PREP_BUCKET, "ds/", seed=21,
                              pipeline="train", batch_size=4, map=to_tensors)
    loader = DataLoader(ds, batch_size=4, num_workers=2)
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        images, labels = [], []
        for x, y in loader:
            assert x.dtype == torch.uint8 and tuple(x.shape[1:]) == (3, 96, 128)
            images.append(x)
            labels.append(y)
        images, labels = torch.cat(images), torch.cat(labels)
        assert len(images) == len(every)
        want = sorted(int(s["cls"]) for s in every.values())
        assert sorted(labels.tolist()) == want
        # Each image is one the pipeline made for this epoch.
        made = {expected(every, 21, epoch, k) for k in every}
        got = {bytes(im.permute(1, 2, 0).contiguous().numpy().tobytes()) for im in images}
        assert got == made
