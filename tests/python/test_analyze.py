"""`granary.analyze` against real nodes, on loops whose answer the test sets up and then
measures itself: a fixed step fed through a paced backend (fetch-bound), a loader that
decodes and crops JPEGs in one worker (prep-bound), batches already in memory
(unstalled); and `python -m granary.analyze SCRIPT.py`. Each figure is checked against
the waits the test's own loop measured, on a node of its own (a cold cache, as the
analyser's loop had).
"""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from test_granary_py import one_node

granary = pytest.importorskip("granary")
torch = pytest.importorskip("torch")
Image = pytest.importorskip("PIL.Image")
from torch.utils.data import DataLoader  # noqa: E402

BUCKET = "train"
KIB = 1024


def as_list(batch):
    return batch


def write_shards(origin: Path, prefix: str, shards: int, per_shard: int, member) -> None:
    d = origin / BUCKET / prefix
    d.mkdir(parents=True, exist_ok=True)
    for i in range(shards):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for j in range(per_shard):
                name, data = member(i, j)
                info = tarfile.TarInfo(f"s{i:03}{j:03}.{name}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        (d / f"shard-{i:04}.tar").write_bytes(buf.getvalue())


def own_loop(loader, step, warmup: int, steps: int) -> float:
    """The test's own measure: the fraction of the loop's time spent waiting for
    batches, after `warmup`."""
    it = iter(loader)
    for _ in range(warmup):
        step(next(it))
    waited, t0 = 0.0, time.monotonic()
    for _ in range(steps):
        t = time.monotonic()
        b = next(it)
        waited += time.monotonic() - t
        step(b)
    total = time.monotonic() - t0
    del it
    return waited / total


def sleeper(seconds: float):
    def step(_batch):
        time.sleep(seconds)
    return step


@pytest.fixture(scope="module")
def origin(tmp_path_factory):
    root = tmp_path_factory.mktemp("analyze")
    origin = root / "origin"
    rng = random.Random(5)
    # 48 shards of 16 samples of 32 KiB: 24 MiB, 2 batches of 8 a shard.
    write_shards(origin, "paced/", 48, 16, lambda i, j: ("bin", rng.randbytes(32 * KIB)))

    def photo(i, j):
        img = Image.effect_noise((640, 480), 40).convert("RGB")
        out = io.BytesIO()
        img.save(out, format="JPEG", quality=90)
        return "jpg", out.getvalue()
    write_shards(origin, "photos/", 12, 16, photo)
    return root, origin


def paced_loader(endpoint: str, epoch: int = 0):
    ds = granary.ShardDataset(endpoint, BUCKET, "paced/", seed=1, batch_size=8, read_ahead=0)
    ds.set_epoch(epoch)
    return ds, DataLoader(ds, batch_size=8, num_workers=1, collate_fn=as_list)


def test_a_loop_fed_through_a_slow_backend_is_fetch_bound(origin):
    """2 MiB/s from the backend, batches of 256 KiB: 0.125 s a batch, a step of 0.05 s:
    about 60% of the loop waits on fetching, none on prep (no `map`)."""
    root, o = origin
    pace = ["--backend-rate", str(2 << 20)]
    step = sleeper(0.05)
    with one_node(root, o, "fetch-a", extra=pace) as endpoint:
        ds, loader = paced_loader(endpoint)
        report = granary.analyze(loader, step, steps=14, warmup=2, seconds=60,
                                 plot=str(root / "fetch.svg"))
    with one_node(root, o, "fetch-b", extra=pace) as endpoint:
        _, loader = paced_loader(endpoint)
        own = own_loop(loader, step, 2, 14)
    assert report.split and report.bound == "fetch", str(report)
    assert 0.4 < own < 0.8, f"the set-up stall is about 0.6; the test measured {own:.3f}"
    total = report.fetch_stall + report.prep_stall
    assert abs(total - own) <= 0.1 * own, f"analyzer {total:.3f}, the test's own loop {own:.3f}"
    assert abs(report.fetch_stall - own) <= 0.1 * own, str(report)
    assert report.prep_stall < 0.1 * own, str(report)
    # The loop's rate over the waits it measured, and the step alone at 0.05 s.
    assert abs(report.rates["step"] - 20) < 3, report.rates
    assert report.rates["loader_cached"] > 2 * report.rates["loader"], report.rates
    # Bytes and where from: the cold loader drew from the backend, the warm one hit.
    assert report.bytes["loader"]["bytes_from_backend"] > 0, report.bytes
    assert report.bytes["loader_cached"]["hits"] > 0, report.bytes
    assert report.bytes["loader_cached"]["bytes_from_backend"] == 0, report.bytes
    levers = {lv["name"]: lv["rate"] for lv in report.levers}
    assert set(levers) >= {"cache", "planner"}, report.levers
    assert levers["cache"] > 1.5 * report.rates["loop"], report.levers
    # A cache of 1 GiB holds the 24 MiB: the planner's rate is the cached one.
    assert abs(levers["planner"] - levers["cache"]) <= 0.01 * levers["cache"], report.levers
    svg = (root / "fetch.svg").read_text()
    assert svg.startswith("<svg") and svg.count("<line") >= 14
    figures = json.loads(report.to_json())
    assert figures["bound"] == "fetch" and len(figures["waits"]) == 14


def crop(sample: dict) -> dict:
    """Decode and a RandomResizedCrop to 224 x 224 with a flip, as torchvision's would."""
    img = Image.open(io.BytesIO(sample["jpg"])).convert("RGB")
    w, h = img.size
    rng = random.Random(sample["__key__"])
    s = rng.uniform(0.08, 1.0) * w * h
    cw, ch = min(w, int(s ** 0.5)), min(h, int(s ** 0.5))
    x, y = rng.randrange(w - cw + 1), rng.randrange(h - ch + 1)
    out = img.resize((224, 224), Image.BILINEAR, box=(x, y, x + cw, y + ch))
    if rng.random() < 0.5:
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    return {"__key__": sample["__key__"], "jpg": out.tobytes()}


def test_a_loader_that_decodes_in_one_worker_is_prep_bound(origin):
    """Decode and crop in one worker, the step half that batch's prep: about half the loop
    waits, on prep; the bytes come from the fs backend at disk speed."""
    root, o = origin
    with one_node(root, o, "prep-a") as endpoint:
        ds = granary.ShardDataset(endpoint, BUCKET, "photos/", seed=1, batch_size=4, map=crop)
        raw = granary.ShardDataset(endpoint, BUCKET, "photos/", seed=1, batch_size=4)
        held = [s for _, s in zip(range(16), iter(raw))]
        t = time.monotonic()
        for s in held:
            crop(s)
        prep_batch = (time.monotonic() - t) / 16 * 4
        step = sleeper(prep_batch / 2)
        loader = DataLoader(ds, batch_size=4, num_workers=1, collate_fn=as_list)
        report = granary.analyze(loader, step, steps=30, warmup=6, seconds=60)
    with one_node(root, o, "prep-b") as endpoint:
        ds = granary.ShardDataset(endpoint, BUCKET, "photos/", seed=1, batch_size=4, map=crop)
        own = own_loop(DataLoader(ds, batch_size=4, num_workers=1, collate_fn=as_list), step, 6, 30)
    assert report.bound == "prep", str(report)
    assert 0.25 < own < 0.75, f"the set-up stall is about 0.5; the test measured {own:.3f}"
    total = report.fetch_stall + report.prep_stall
    assert abs(total - own) <= 0.1 * own, f"analyzer {total:.3f}, the test's own loop {own:.3f}"
    # The one worker fetches each shard before it decodes it: a few percent of its time is
    # fetch, the rest prep.
    assert report.prep_stall >= 0.8 * total, str(report)
    assert report.trainer_cpu_per_sample is not None
    # The trainer's CPU covers the worker's decoding: at least most of the prep's time.
    assert report.trainer_cpu_per_sample > 0.5 * prep_batch / 4, str(report)
    assert "pipeline" in {lv["name"] for lv in report.levers}


def test_batches_in_memory_are_not_stalled():
    batches = [torch.zeros(8, 3, 32, 32) for _ in range(40)]
    step = sleeper(0.01)
    report = granary.analyze(batches, step, steps=20, warmup=2, seconds=30)
    own = own_loop(batches, step, 2, 20)
    assert report.bound == "step" and not report.split, str(report)
    assert report.fetch_stall + report.prep_stall < 0.05 and own < 0.05
    assert report.samples_per_batch == 8
    assert 60 < report.rates["step"] < 110, report.rates
    assert report.levers == []


def test_the_command_line_runs_a_scripts_loader_and_step(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(
        "import time\n"
        "def loader():\n"
        "    return [[0] * 4 for _ in range(30)]\n"
        "def step(batch):\n"
        "    time.sleep(0.005)\n")
    out = subprocess.run([sys.executable, "-m", "granary.analyze", str(script), "--steps", "10",
                          "--warmup", "1", "--json", str(tmp_path / "r.json"),
                          "--plot", str(tmp_path / "r.svg")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("bound: step"), out.stdout
    figures = json.loads((tmp_path / "r.json").read_text())
    assert figures["bound"] == "step" and figures["samples_per_batch"] == 4
    assert (tmp_path / "r.svg").read_text().startswith("<svg")
    (tmp_path / "none.py").write_text("x = 1\n")
    bad = subprocess.run([sys.executable, "-m", "granary.analyze", str(tmp_path / "none.py")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "defines no loader()" in bad.stderr, bad.stderr
