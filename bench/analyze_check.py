"""`granary.analyze`'s levers against runs with the lever turned on, on this machine.

    python bench/analyze_check.py ROOT GRANARY_BIN [--rounds 3]

- **planner**: 64 shards of 16 x 64 KiB (D = 64 MiB) behind an fs backend paced to
  B = 4 MiB/s, a cache of C = D/2, a step of 20 ms a batch of 8. The analyser's loop
  runs without a plan; its planner lever predicts the loop's rate with one. Then the same
  job with `plan=True` on a fresh node runs two epochs; the second's batches per second
  are the lever's truth.
- **pipeline**: 16 shards of 16 JPEGs (640 x 480, noise), decoded and cropped to
  224 x 224 with a flip in one DataLoader worker (Pillow), a step of 4 ms (about half a
  batch's prep). The analyser
  predicts the loop's rate with prep on the node (`pipeline=`); then the same job reads
  `pipeline="train224"` (the node's RandomResizedCrop and flip) with no `map`, for as many
  batches.

Each round on fresh nodes; prints a JSON line per round and the median error of each
prediction against its run.
"""
import argparse, io, json, os, random, shutil, statistics, subprocess, sys, tarfile, time

import granary
import requests
import torch
from PIL import Image
from torch.utils.data import DataLoader

from benchlib import port, wait_healthy

ap = argparse.ArgumentParser()
ap.add_argument("root"); ap.add_argument("granary")
ap.add_argument("--rounds", type=int, default=3)
a = ap.parse_args()
root = os.path.abspath(a.root)
origin = os.path.join(root, "origin")
MIB = 1 << 20
STEP = 0.02
TOML = """
[pipelines.train224]
members = ["jpg"]
steps = [
  { op = "random_resized_crop", size = [224, 224], scale = [0.08, 1.0], ratio = [0.75, 1.3333] },
  { op = "random_flip", p = 0.5 },
]
output = "raw"
"""


def shards(prefix, count, per, member):
    d = os.path.join(origin, "bkt", prefix)
    os.makedirs(d, exist_ok=True)
    for i in range(count):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
            for j in range(per):
                ext, data = member(i, j)
                ti = tarfile.TarInfo(f"s{i:03}{j:03}.{ext}"); ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))
        with open(os.path.join(d, f"shard-{i:04}.tar"), "wb") as f:
            f.write(buf.getvalue())


def lay_out():
    shutil.rmtree(root, ignore_errors=True)
    rng = random.Random(3)
    shards("paced", 64, 16, lambda i, j: ("bin", rng.randbytes(64 << 10)))

    def photo(i, j):
        out = io.BytesIO()
        Image.effect_noise((640, 480), 40).convert("RGB").save(out, format="JPEG", quality=90)
        return "jpg", out.getvalue()
    shards("photos", 16, 16, photo)
    with open(os.path.join(root, "granary.toml"), "w") as f:
        f.write(TOML)


def node(name, *extra):
    p = port()
    data = os.path.join(root, name)
    shutil.rmtree(data, ignore_errors=True); os.makedirs(data)
    proc = subprocess.Popen([a.granary, "serve", "--listen", f"127.0.0.1:{p}", "--data-dir", data,
                             "--backend", f"fs:{origin}", "--config", os.path.join(root, "granary.toml"),
                             *extra], stdout=subprocess.DEVNULL, stderr=open(data + ".log", "w"))
    url = f"http://127.0.0.1:{p}"
    wait_healthy(url)
    return proc, url


def stop(proc):
    proc.kill(); proc.wait()


def step(_batch):
    time.sleep(STEP)


def short_step(_batch):
    time.sleep(0.004)


def crop(sample):
    img = Image.open(io.BytesIO(sample["jpg"])).convert("RGB")
    w, h = img.size
    rng = random.Random(sample["__key__"])
    s = rng.uniform(0.08, 1.0) * w * h
    cw, ch = min(w, int(s ** 0.5)), min(h, int(s ** 0.5))
    x, y = rng.randrange(w - cw + 1), rng.randrange(h - ch + 1)
    out = img.resize((224, 224), Image.BILINEAR, box=(x, y, x + cw, y + ch))
    if rng.random() < 0.5:
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    return {"jpg": out.tobytes()}


def loop_rate(loader, batches, step):
    """Batches per second of the loop with `step`, over `batches` after 2 to warm."""
    it = iter(loader)
    for _ in range(2):
        step(next(it))
    t0 = time.monotonic()
    n = 0
    for b in it:
        step(b)
        n += 1
        if n == batches:
            break
    return n / (time.monotonic() - t0)


def planner_round():
    D, C, B = 64 * 16 * (64 << 10), 32 * MIB, 4 * MIB
    pace = ["--cache-capacity", str(C), "--backend-rate", str(B)]
    proc, url = node("plan-a", *pace)
    ds = granary.ShardDataset(url, "bkt", "paced/", seed=1, batch_size=8, plan=False)
    report = granary.analyze(DataLoader(ds, batch_size=8, num_workers=2, collate_fn=list), step,
                             steps=40, warmup=2, seconds=60)
    stop(proc)
    predicted = {lv["name"]: lv["rate"] for lv in report.levers}["planner"]
    proc, url = node("plan-b", *pace)
    ds = granary.ShardDataset(url, "bkt", "paced/", seed=1, batch_size=8, plan=True)
    dl = DataLoader(ds, batch_size=8, num_workers=2, collate_fn=list)
    rates = []
    for e in range(2):
        ds.set_epoch(e)
        t0 = time.monotonic(); n = 0
        for b in dl:
            step(b); n += 1
        rates.append(n / (time.monotonic() - t0))
    stop(proc)
    bound = (D // (8 * (64 << 10))) / max(D / (report.rates["step"] * 8 * (64 << 10)), (D - C) / B)
    return {"lever": "planner", "predicted": predicted, "run": rates[1], "bound_set_up": bound,
            "error": (predicted - rates[1]) / rates[1], "loop_without": report.rates["loop"]}


def pipeline_round():
    proc, url = node("pipe-a")
    ds = granary.ShardDataset(url, "bkt", "photos/", seed=1, batch_size=4, map=crop)
    report = granary.analyze(DataLoader(ds, batch_size=4, num_workers=1, collate_fn=list), short_step,
                             steps=20, warmup=2, seconds=60)
    predicted = {lv["name"]: lv["rate"] for lv in report.levers}["pipeline"]
    stop(proc)
    proc, url = node("pipe-b")
    ds = granary.ShardDataset(url, "bkt", "photos/", seed=1, batch_size=4, pipeline="train224")
    ds.set_epoch(0)
    run = loop_rate(DataLoader(ds, batch_size=4, num_workers=1, collate_fn=list), 40, short_step)
    stop(proc)
    return {"lever": "pipeline", "predicted": predicted, "run": run, "error": (predicted - run) / run,
            "loop_without": report.rates["loop"], "why": [lv["why"] for lv in report.levers
                                                         if lv["name"] == "pipeline"][0]}


lay_out()
rows = []
for r in range(a.rounds):
    for f in (planner_round, pipeline_round):
        row = {"round": r, **f()}
        rows.append(row)
        print(json.dumps(row), flush=True)
for lever in ("planner", "pipeline"):
    errs = [x["error"] for x in rows if x["lever"] == lever]
    print(f"{lever}: prediction / run - 1, median {statistics.median(errs):+.3f}, "
          f"range {min(errs):+.3f} to {max(errs):+.3f} over {len(errs)} rounds")
