"""Is my job stalled? ``granary.analyze`` measures a training loop by difference, as the
DS-Analyzer does: the step alone on a batch held in memory (what the accelerator takes),
the loader alone cold and warm, the loader with its samples' bytes in memory (fetch taken
out, prep left in), and the loop as the user runs it. The loop's own waits are the stall;
the prep-bound rate splits it into prep and fetch; each Granary lever's rate is computed
from the rates measured.

Phases, in this order, each at most ``steps`` batches and ``seconds`` after ``warmup``:
1. ``loop``: loader and step together, as the user runs them (the current epoch, cold);
2. ``step``: the step alone, again and again on the loop's first batch;
3. ``loader``: the loader alone, as fast as it goes; with a ``ShardDataset``, the next
   epoch (other samples, cold unless the planner has fetched them ahead: the backend's
   throughput is then the bytes it gave over the phase's time);
4. ``loader_cached``: the same batches again (their bytes now in the cache);
5. ``loader_unprepared``: the same samples' bytes held in memory, prepared by the
   dataset's ``map`` and the loader's ``collate_fn`` in as many workers as the loader's.
Phases 4-5 need the ``ShardDataset`` (``dataset=``, or the loader's own dataset); without
it the loader's stall is not split (``report.split`` is False, and it is counted as
fetch).
"""

from __future__ import annotations

import dataclasses
import html
import json
import math
import os
import resource
import sys
import time
from typing import Any, Callable, Dict, Iterable, List, Optional

_STALLED = 0.05  # a loop that waits less than this fraction of its time is not stalled


@dataclasses.dataclass
class StallReport:
    """What ``granary.analyze`` measured: ``rates`` (batches per second by phase),
    ``fetch_stall`` and ``prep_stall`` (fractions of the loop's time), ``bound``
    (``"step"``, ``"fetch"`` or ``"prep"``), ``levers`` (the loop rate each Granary lever
    would give, and why), ``waits`` (the loop's wait before each batch, seconds, with the
    time it began), ``trainer_cpu_per_sample`` (seconds, this process and its loader
    workers, in the loop), ``bytes`` (per phase: the cluster's counters' change, where a
    ``ShardDataset`` names it)."""

    rates: Dict[str, float]
    fetch_stall: float
    prep_stall: float
    bound: str
    levers: List[Dict[str, Any]]
    waits: List[List[float]]
    split: bool
    trainer_cpu_per_sample: Optional[float]
    samples_per_batch: float
    bytes: Dict[str, Dict[str, int]]
    loop_seconds: float

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def __str__(self) -> str:
        r = self.rates
        lines = [f"bound: {self.bound}  (fetch stall {self.fetch_stall:.0%}, prep stall "
                 f"{self.prep_stall:.0%} of the loop's time"
                 + ("" if self.split else "; fetch and prep not split: pass dataset=") + ")",
                 "rates (batches/s): " + ", ".join(f"{k} {v:.2f}" for k, v in r.items())]
        if self.trainer_cpu_per_sample is not None:
            lines.append(f"trainer CPU: {self.trainer_cpu_per_sample * 1e3:.2f} ms a sample")
        for lever in self.levers:
            lines.append(f"lever {lever['name']}: {lever['rate']:.2f} batches/s "
                         f"({lever['rate'] / r['loop']:.2f}x the loop) - {lever['why']}")
        return "\n".join(lines)

    def plot(self, path: str) -> None:
        """The loop's wait per batch over time and where its time went: SVG, or PNG
        where matplotlib is installed."""
        if path.lower().endswith(".png"):
            _png(self, path)
        else:
            with open(path, "w") as f:
                f.write(_svg(self))


class _Progress:
    """A phase's progress on stderr: tqdm where installed, else a line kept current."""

    def __init__(self, phase: str, total: int) -> None:
        self.phase, self.total, self.n = phase, total, 0
        try:
            from tqdm import tqdm  # type: ignore[import-not-found]
            self.bar = tqdm(total=total, desc=f"analyze: {phase}", unit="batch", leave=False)
        except ImportError:
            self.bar = None

    def tick(self) -> None:
        self.n += 1
        if self.bar is not None:
            self.bar.update(1)
        elif sys.stderr.isatty() or self.n == self.total:
            print(f"\ranalyze: {self.phase} {self.n}/{self.total} batches", end="",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        else:
            print(file=sys.stderr, flush=True)


def _cpu() -> float:
    """CPU seconds of this process and its finished children (a DataLoader's workers)."""
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def _batch_len(batch: Any) -> int:
    """Samples in a batch: a list's length, a tensor's first dimension, or a dict's or
    tuple's first value's."""
    if isinstance(batch, dict):
        return _batch_len(next(iter(batch.values()))) if batch else 1
    shape = getattr(batch, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    if isinstance(batch, (list, tuple)):
        if batch and isinstance(batch, tuple) and hasattr(batch[0], "shape"):
            return _batch_len(batch[0])
        return len(batch)
    return 1


def _sync() -> None:
    """Waits for the accelerator's queued work, where torch has a GPU."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.synchronize()


def _run(phase: str, batches: Iterable[Any], step: Optional[Callable[[Any], Any]], steps: int,
         seconds: float, warmup: int, keep: int = 0,
         counters: Callable[[], Any] = lambda: None) -> Dict[str, Any]:
    """Runs `batches` (with `step` each, when given): the rate after `warmup`, the wait
    before each batch, the samples and CPU, the first `keep` batches, and `counters()`
    as the measured stretch begins and ends (the cluster's bytes over the same window as
    the rate)."""
    progress = _Progress(phase, warmup + steps)
    it = iter(batches)
    kept: List[Any] = []
    waits: List[List[float]] = []
    n = samples = 0
    t0 = start = cpu0 = before = None
    deadline = time.monotonic() + seconds
    try:
        while n < warmup + steps:
            t = time.monotonic()
            try:
                b = next(it)
            except StopIteration:
                break
            got = time.monotonic()
            if len(kept) < keep:
                kept.append(b)
            if step is not None:
                step(b)
                _sync()
            n += 1
            progress.tick()
            if n == warmup:
                before = counters()
                t0, cpu0 = time.monotonic(), _cpu()
            elif n > warmup:
                if start is None:
                    start = t
                waits.append([round(t - start, 6), round(got - t, 6)])
                samples += _batch_len(b)
            if time.monotonic() > deadline and n > warmup:
                break
    finally:
        progress.close()
        # Non-persistent workers end with their iterator: their CPU is then counted.
        del it
    if t0 is None or n <= warmup:
        raise ValueError(f"{phase}: the loader gave {n} batches, fewer than warmup + 1")
    end = time.monotonic()
    after = counters()
    return {"rate": (n - warmup) / (end - t0), "waits": waits, "samples": samples,
            "cpu": _cpu() - cpu0, "seconds": end - t0, "kept": kept,
            "moved": _delta(after, before), "after": after}


def _counters(dataset: Any) -> Optional[Dict[str, int]]:
    """The cluster's counters summed over its members (a ShardDataset's endpoint)."""
    from . import Client
    access_key, secret_key, region, timeout = dataset._auth
    keys = ("hits", "misses", "peer_fills", "bypasses", "bytes_served", "bytes_from_backend",
            "capacity_bytes", "prep_samples", "prep_cpu_seconds")
    try:
        c = Client(dataset.endpoint, access_key, secret_key, region, timeout)
        urls = [m["url"] for m in c.cluster().get("members", []) if m.get("state") == "up"]
        out = dict.fromkeys(keys, 0)
        for u in urls or [dataset.endpoint]:
            s = Client(u, access_key, secret_key, region, timeout).stats()
            for k in keys:
                out[k] += s.get(k, 0)
        return out
    except Exception:  # a node that cannot be asked: the report goes on without it
        return None


def _delta(after: Optional[Dict[str, int]], before: Optional[Dict[str, int]]) -> Dict[str, int]:
    if not after or not before:
        return {}
    return {k: after[k] - before[k] for k in after if k != "capacity_bytes"}


class _Held:
    """The raw samples of a ShardDataset's batches, held in memory and prepared by its
    ``map`` on each read: a map-style dataset for a DataLoader like the user's."""

    def __init__(self, samples: List[Any], prep: Optional[Callable[[Any], Any]]) -> None:
        self.samples, self.prep = samples, prep

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> Any:
        s = self.samples[i]
        return self.prep(dict(s)) if self.prep is not None else s


def _shard_dataset(loader: Any, dataset: Any) -> Any:
    from . import ShardDataset
    if dataset is None:
        dataset = getattr(loader, "dataset", None)
    return dataset if isinstance(dataset, ShardDataset) else None


def analyze(loader: Iterable[Any], step: Optional[Callable[[Any], Any]] = None, *,
            steps: int = 100, seconds: float = 120, warmup: int = 5, dataset: Any = None,
            plot: Optional[str] = None) -> StallReport:
    """Measures where `loader` and `step` spend a training loop's time (see the module)."""
    if steps < 1 or warmup < 0 or seconds <= 0:
        raise ValueError("steps >= 1, warmup >= 0 and seconds > 0")
    ds = _shard_dataset(loader, dataset)
    rates: Dict[str, float] = {}
    moved: Dict[str, Dict[str, int]] = {}

    counters = (lambda: _counters(ds)) if ds is not None else (lambda: None)
    loop = _run("loop", loader, step, steps, seconds, warmup, keep=1, counters=counters)
    after = loop["after"]
    moved["loop"] = loop["moved"]
    rates["loop"] = loop["rate"]
    held = loop["kept"][0]

    def again():
        while True:
            yield held
    rates["step"] = (_run("step", again(), step, steps, seconds, warmup)["rate"]
                     if step is not None else math.inf)

    backend_rate = None
    if ds is not None:
        epoch = ds.epoch
        try:
            ds.set_epoch(epoch + 1)
            cold = _run("loader", loader, None, steps, seconds, warmup, counters=counters)
            warm = _run("loader_cached", loader, None, steps, seconds, warmup, counters=counters)
            moved["loader"], moved["loader_cached"] = cold["moved"], warm["moved"]
            rates["loader"], rates["loader_cached"] = cold["rate"], warm["rate"]
            if moved["loader"].get("bytes_from_backend"):
                backend_rate = moved["loader"]["bytes_from_backend"] / cold["seconds"]
            rates["loader_unprepared"] = _unprepared(loader, ds, steps, seconds, warmup)
        finally:
            ds.set_epoch(epoch)
    else:
        rates["loader"] = _run("loader", loader, None, steps, seconds, warmup)["rate"]

    # The stall: the loop's own waits. Prep's part: what the loader with its bytes in
    # memory takes beyond the step (the DS-Analyzer's difference); fetch's the rest.
    total = sum(w for _, w in loop["waits"]) / loop["seconds"]
    prep = 0.0
    if "loader_unprepared" in rates:
        t_loop, t_step = 1 / rates["loop"], 1 / rates["step"]
        t_prep = 1 / rates["loader_unprepared"]
        prep = min(total, max(0.0, (t_prep - t_step) / t_loop))
    fetch = max(0.0, total - prep)
    bound = "step" if total < _STALLED else ("prep" if prep > fetch else "fetch")
    per_batch = loop["samples"] / max(1, len(loop["waits"]))
    report = StallReport(
        rates=rates, fetch_stall=fetch, prep_stall=prep, bound=bound,
        levers=_levers(rates, ds, after, backend_rate, per_batch, loader, prep),
        waits=loop["waits"], split="loader_unprepared" in rates,
        trainer_cpu_per_sample=loop["cpu"] / loop["samples"] if loop["samples"] else None,
        samples_per_batch=per_batch, bytes=moved, loop_seconds=loop["seconds"])
    if plot:
        report.plot(plot)
    return report


def _unprepared(loader: Any, ds: Any, steps: int, seconds: float, warmup: int) -> float:
    """The loader's rate with its samples' bytes in memory: the same epoch's first
    batches read raw, then prepared by the dataset's `map` and the loader's collate in
    as many workers as the loader's."""
    import copy
    import itertools
    from torch.utils.data import DataLoader  # type: ignore[import-not-found]

    batch = getattr(loader, "batch_size", None) or ds.batch_size
    raw = copy.copy(ds)
    raw.map = None
    samples = list(itertools.islice(iter(raw), (warmup + steps) * batch))
    held = DataLoader(_Held(samples, ds.map), batch_size=batch,
                      num_workers=getattr(loader, "num_workers", 0),
                      collate_fn=getattr(loader, "collate_fn", None))
    return _run("loader_unprepared", held, None, steps, seconds, warmup)["rate"]


def _levers(rates: Dict[str, float], ds: Any, stats: Optional[Dict[str, int]],
            backend_rate: Optional[float], per_batch: float, loader: Any,
            prep: float) -> List[Dict[str, Any]]:
    """The loop rate each lever would give, from the rates measured: the loop runs at
    the slowest of the step and what feeds it."""
    levers: List[Dict[str, Any]] = []
    step = rates["step"]
    if "loader_cached" not in rates:
        return levers
    cached = min(step, rates["loader_cached"])
    levers.append({"name": "cache", "rate": cached,
                   "why": f"the whole dataset in the cache: the loader reads warm at "
                          f"{rates['loader_cached']:.2f} batches/s"})
    shards = json.loads(ds._shards.to_json())["shards"]
    D = sum(s.get("size", 0) for s in shards)
    n = max(1, ds.num_samples)
    capacity = (stats or {}).get("capacity_bytes", 0)
    if D and backend_rate:
        b = D / n * per_batch  # bytes a batch
        X = cached * b
        epoch = max(D / X, max(0, D - capacity) / backend_rate)
        levers.append({"name": "planner", "rate": (D / b) / epoch,
                       "why": f"a cache of {capacity / 2**30:.2f} GiB over a dataset of "
                              f"{D / 2**30:.2f} GiB, the backend at {backend_rate / 2**20:.1f} MiB/s "
                              f"(as the cold loader drew it): max(D/X, (D - C)/B)"})
    if "loader_unprepared" in rates:
        workers = max(1, getattr(loader, "num_workers", 0) or 1)
        if stats and stats.get("prep_samples") and stats.get("prep_cpu_seconds"):
            per_core = stats["prep_samples"] / stats["prep_cpu_seconds"] / per_batch
            source = "the nodes' own prep rate"
        else:
            per_core = rates["loader_unprepared"] / workers
            source = "this loader's prep rate a worker"
        cores = os.cpu_count() or 1
        # The trainer then only reads prepared bytes; the nodes' cores prepare them. It
        # takes the prep stall out of the loop and leaves the fetch stall in.
        unstalled = rates["loop"] / max(1e-9, 1 - prep)
        levers.append({"name": "pipeline", "rate": min(step, cores * per_core, unstalled),
                       "why": f"prep on the nodes: {source} ({per_core:.2f} batches/s a core) over "
                              f"{cores} cores (as many as this machine's); the loop without its "
                              f"prep stall at {unstalled:.2f}, the step at {step:.2f}"})
    return levers


def _svg(r: StallReport) -> str:
    """Two panels: the loop's wait before each batch over time, and a bar of where its
    time went (step, prep stall, fetch stall)."""
    w, h, m = 720, 260, 50
    waits = r.waits or [[0.0, 0.0]]
    tmax = max(t for t, _ in waits) or 1.0
    wmax = max(x for _, x in waits) or 1.0
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h + 120}" '
           'font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h + 120}" fill="white"/>',
           f'<text x="{m}" y="20">the loop\'s wait before each batch (s), over the loop\'s time (s); '
           f'bound: {html.escape(r.bound)}</text>',
           f'<line x1="{m}" y1="{h - m + 20}" x2="{w - m}" y2="{h - m + 20}" stroke="black"/>',
           f'<line x1="{m}" y1="{h - m + 20}" x2="{m}" y2="40" stroke="black"/>',
           f'<text x="{m - 45}" y="45">{wmax:.3f}</text><text x="{w - m - 20}" y="{h - m + 36}">'
           f'{tmax:.1f}</text>']
    for t, x in waits:
        px = m + t / tmax * (w - 2 * m)
        py = h - m + 20 - x / wmax * (h - m - 20 - 40)
        out.append(f'<line x1="{px:.1f}" y1="{h - m + 20}" x2="{px:.1f}" y2="{py:.1f}" stroke="#d62728"/>')
    step = max(0.0, 1 - r.fetch_stall - r.prep_stall)
    x, y = m, h + 40
    for name, frac, colour in (("step and the rest", step, "#1f77b4"), ("prep stall", r.prep_stall, "#ff7f0e"),
                               ("fetch stall", r.fetch_stall, "#d62728")):
        width = frac * (w - 2 * m)
        out.append(f'<rect x="{x:.1f}" y="{y}" width="{width:.1f}" height="24" fill="{colour}">'
                   f'<title>{name} {frac:.1%}</title></rect>')
        if frac > 0.08:
            out.append(f'<text x="{x + 2:.1f}" y="{y + 44}">{name} {frac:.0%}</text>')
        x += width
    out.append(f'<text x="{m}" y="{h + 30}">where the loop\'s time went</text></svg>')
    return "\n".join(out) + "\n"


def _png(r: StallReport, path: str) -> None:
    try:
        import matplotlib  # type: ignore[import-not-found]
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found]
    except ImportError as e:
        raise ValueError("a PNG plot needs matplotlib; give a .svg path") from e
    fig, (a, b) = plt.subplots(2, 1, figsize=(8, 5), gridspec_kw={"height_ratios": [3, 1]})
    a.vlines([t for t, _ in r.waits], 0, [x for _, x in r.waits], colors="#d62728")
    a.set_xlabel("loop time (s)"); a.set_ylabel("wait before the batch (s)")
    step = max(0.0, 1 - r.fetch_stall - r.prep_stall)
    left = 0.0
    for name, frac, colour in (("step", step, "#1f77b4"), ("prep stall", r.prep_stall, "#ff7f0e"),
                               ("fetch stall", r.fetch_stall, "#d62728")):
        b.barh(0, frac, left=left, color=colour, label=f"{name} {frac:.0%}")
        left += frac
    b.set_xlim(0, 1); b.set_yticks([]); b.legend(loc="upper center", ncol=3, bbox_to_anchor=(0.5, -0.3))
    fig.tight_layout(); fig.savefig(path); plt.close(fig)


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m granary.analyze SCRIPT.py [--steps N] [--seconds S] [--plot F] [--json F]``:
    runs SCRIPT.py's ``loader()`` and ``step(batch)`` and prints the report."""
    import argparse
    import runpy
    ap = argparse.ArgumentParser(prog="python -m granary.analyze")
    ap.add_argument("script")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--plot", help="write the figures here (.svg, or .png with matplotlib)")
    ap.add_argument("--json", help="write the report's figures here as JSON")
    a = ap.parse_args(argv)
    ns = runpy.run_path(a.script, run_name="__granary_analyze__")
    if "loader" not in ns:
        print(f"{a.script} defines no loader()", file=sys.stderr)
        return 2
    report = analyze(ns["loader"](), ns.get("step"), steps=a.steps, seconds=a.seconds,
                     warmup=a.warmup, plot=a.plot)
    print(report)
    if a.json:
        with open(a.json, "w") as f:
            f.write(report.to_json())
    return 0
