"""The distribution of P13's drawn shapes: reads the JSON lines `p13.py --draw SEED --out F`
wrote (one or more files) and prints, per shape, each policy's epoch over its bound, the
planner's reads ready and its backend bytes over D - C, then the summary the planner is
held to; `--svg FILE` draws epoch / bound against each shape's D/C and B/X, a mark per
shape and policy.

    python3 bench/p13_report.py OUT.jsonl [...] [--epoch 2] [--svg p13.svg] [--sim GRANARY_BENCH]

`--sim`: `granary-bench plan-sim` on each one-job shape too (the same nodes, ranks,
shards, samples, C/D, X, B/X; the ranks' lead the loader's batches in flight, two
workers' prefetch, and its read-ahead runs of a rank's part of a shard), its epoch over
its bound beside the real run's, and their difference over the real one; and the
simulation's clairvoyant reference on the shape (the oracle: every order known, one
pooled cache, one fetch at a time in order of need), its epoch over the same bound.

The epoch counted is the `--epoch`th (1-based; the first fills the cache). A shape's
bound is the all-cached epoch when D/X >= (D - C)/B, the backend's otherwise; a two-job
shape counts its slower job, planner only (p13.py runs no other policy there), and its
backend bytes (over all its epochs) are left out of the bytes' figures.
"""
from __future__ import annotations

import argparse
import json
import statistics
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

POLICIES = ("planner", "look-ahead", "never-evict", "lru")
COLOURS = {"planner": "#1f77b4", "look-ahead": "#ff7f0e", "never-evict": "#2ca02c", "lru": "#d62728"}


def load(paths: list[str], epoch: int) -> dict[int, dict]:
    """Per seed: the drawn shape, and per policy the counted epoch's row."""
    shapes: dict[int, dict] = {}
    for path in paths:
        for line in open(path):
            r = json.loads(line)
            if "drawn" in r:
                shapes.setdefault(r["drawn"]["seed"], {"drawn": r["drawn"], "rows": {}})
                continue
            seed = r.get("draw")
            if seed is None:
                continue
            if seed not in shapes:
                # The shape is a function of its seed: drawn again where its line is missing.
                from shapes import draw
                shapes[seed] = {"drawn": draw(seed), "rows": {}}
            s = shapes[seed]
            if "ideal_wall" in r:
                s["ideal"] = r["ideal_wall"]
            elif "backend_over_2D_minus_C" in r:
                s["backend_2"] = r["backend_over_2D_minus_C"]
            elif r.get("epoch") == epoch - 1 and "wall_over_bound" in r:
                policy = r.get("policy", "planner")
                prev = s["rows"].get(policy)
                # Two jobs: the slower one stands for the shape.
                if prev is None or r["wall_over_bound"] > prev["wall_over_bound"]:
                    s["rows"][policy] = r
    return shapes


LOADERS = {"default": (8, 2, 2), "small": (2, 0, 1)}


def simulate(bench: str, d: dict, epoch: int) -> float:
    """plan-sim's epoch over its bound for the drawn shape `d`."""
    import subprocess
    batch, ahead, prefetch = LOADERS[d["loader"]]
    samples = d["shard_mib"] * 1024 // d["sample_kib"]
    lead = 2 * prefetch * batch + ahead * -(-samples // d["ranks"])
    out = subprocess.run([bench, "plan-sim", "--nodes", str(d["nodes"]), "--ranks", str(d["ranks"]),
                          "--shards", str(d["shards"]), "--samples", str(samples),
                          "--sample-size", f'{d["sample_kib"]}KiB', "--cache", str(1 / d["dc"]),
                          "--job-rate", f'{d["rate_mib"]}MiB', "--bx", str(d["bx"]),
                          "--epochs", str(epoch), "--lead", str(lead)],
                         check=True, capture_output=True, text=True).stdout
    e = json.loads(out.strip().splitlines()[-1])["report"]["epochs"][epoch - 1]
    return e["wall_s"] / e["bound_s"], (e["oracle_s"] or float("nan")) / e["bound_s"]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def ready_of(r: dict) -> float | None:
    if r.get("ready") is not None:
        return r["ready"]
    n = r.get("reads_ready", 0) + r.get("reads_waited", 0)
    return r["reads_ready"] / n if n else None


def svg(shapes: dict[int, dict], path: str) -> None:
    """Two panels, epoch / bound against D/C and against B/X, a dot per shape and policy."""
    w, h, m = 460, 360, 50
    # Up to 3 x the bound; a mark above it sits on the top line (its title says where).
    ymax = min(3.0, max([1.6] + [r["wall_over_bound"] for s in shapes.values() for r in s["rows"].values()]))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * w}" height="{h + 40}" '
           'font-family="sans-serif" font-size="12">', f'<rect width="{2 * w}" height="{h + 40}" fill="white"/>']
    for panel, (name, lo, hi) in enumerate((("dc", 1.0, 4.2), ("bx", 0.1, 1.05))):
        ox = panel * w

        def X(v, lo=lo, hi=hi, ox=ox):
            return ox + m + (v - lo) / (hi - lo) * (w - 2 * m)

        def Y(v):
            return h - m + 10 - (v - 0.8) / (ymax - 0.8) * (h - 2 * m)

        out.append(f'<line x1="{ox + m}" y1="{Y(0.8)}" x2="{ox + w - m}" y2="{Y(0.8)}" stroke="black"/>')
        out.append(f'<line x1="{ox + m}" y1="{Y(0.8)}" x2="{ox + m}" y2="{Y(ymax)}" stroke="black"/>')
        for v in (1.0, 1.1, 1.25, 2.0, 3.0):
            out.append(f'<line x1="{ox + m}" y1="{Y(v)}" x2="{ox + w - m}" y2="{Y(v)}" stroke="#bbb" '
                       f'stroke-dasharray="4 3"/><text x="{ox + m - 30}" y="{Y(v) + 4}">{v:.2f}</text>')
        for i in range(5):
            v = lo + (hi - lo) * i / 4
            out.append(f'<text x="{X(v) - 10}" y="{Y(0.8) + 16}">{v:.2f}</text>')
        label = "D / C" if name == "dc" else "B / X"
        out.append(f'<text x="{ox + w / 2 - 20}" y="{h + 10}">{label}</text>')
        out.append(f'<text x="{ox + 8}" y="{m - 20}">epoch {"/"} its bound</text>')
        for s in shapes.values():
            for policy, r in s["rows"].items():
                off = POLICIES.index(policy) * 0.012 * (hi - lo)
                out.append(f'<circle cx="{X(s["drawn"][name] + off):.1f}" cy="{Y(min(ymax, r["wall_over_bound"])):.1f}" '
                           f'r="4" fill="{COLOURS[policy]}" fill-opacity="0.8"><title>seed {s["drawn"]["seed"]} '
                           f'{policy} {r["wall_over_bound"]}</title></circle>')
    for i, policy in enumerate(POLICIES[:3]):
        out.append(f'<circle cx="{w - 120 + i * 110}" cy="{h + 28}" r="5" fill="{COLOURS[policy]}"/>'
                   f'<text x="{w - 110 + i * 110}" y="{h + 32}">{policy}</text>')
    out.append("</svg>")
    open(path, "w").write("\n".join(out) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--epoch", type=int, default=2)
    ap.add_argument("--svg")
    ap.add_argument("--sim", metavar="GRANARY_BENCH")
    a = ap.parse_args()
    shapes = load(a.files, a.epoch)
    print("| seed | nodes | ranks | D/C | B/X | bound | planner | look-ahead | never-evict | ready "
          "| backend / (D-C) | plan-sim | oracle (sim) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    cached, backend_bound, ready, bytes_ok, worse, sim_err = [], [], [], [], [], []
    for seed in sorted(shapes):
        s = shapes[seed]
        d, rows = s["drawn"], s["rows"]
        p = rows.get("planner")
        if p is None or "ideal" not in s:
            continue
        by_cache = p["bound_s"] <= round(s["ideal"], 2) + 0.01
        (cached if by_cache else backend_bound).append(p["wall_over_bound"])
        rd = ready_of(p)
        if by_cache and rd is not None:
            ready.append(rd)
        # Two jobs report their backend bytes over every epoch, the cold one too: not
        # counted against 1.3 x (D - C) an epoch.
        b = p.get("backend_over_D_minus_C")
        if b is not None:
            bytes_ok.append(b)
        for other in ("look-ahead", "never-evict"):
            if other in rows:
                worse.append((p["wall_over_bound"] / rows[other]["wall_over_bound"], seed, other))
        sim = oracle = None
        if a.sim and d["jobs"] == 1:
            sim, oracle = simulate(a.sim, d, a.epoch)
            sim_err.append(abs(sim - p["wall_over_bound"]) / p["wall_over_bound"])
        cell = {k: f'{rows[k]["wall_over_bound"]:.2f}' if k in rows else "–" for k in POLICIES}
        print(f'| {seed} | {d["nodes"]} | {d["ranks"]}{" loose" if d["loose"] else ""}'
              f'{" 2 jobs" if d["jobs"] == 2 else ""} | {d["dc"]} | {d["bx"]} '
              f'| {"cached" if by_cache else "backend"} | {cell["planner"]} | {cell["look-ahead"]} '
              f'| {cell["never-evict"]} | {"–" if rd is None else f"{rd:.2f}"} '
              f'| {"–" if b is None else f"{b:.2f}"} | {"–" if sim is None else f"{sim:.2f}"} '
              f'| {"–" if oracle is None else f"{oracle:.2f}"} |')
    print()
    if cached:
        print(f"all-cached bound, {len(cached)} shapes: median {statistics.median(cached):.3f}, "
              f"90th percentile {pct(cached, 0.9):.3f}, worst {max(cached):.3f}")
    if ready:
        print(f"reads ready there: median {statistics.median(ready):.3f}, 10th percentile {pct(ready, 0.1):.3f}")
    if backend_bound:
        print(f"backend bound, {len(backend_bound)} shapes: median {statistics.median(backend_bound):.3f}, "
              f"90th percentile {pct(backend_bound, 0.9):.3f}, worst {max(backend_bound):.3f}")
    if bytes_ok:
        print(f"backend bytes / (D - C): median {statistics.median(bytes_ok):.3f}, "
              f"90th percentile {pct(bytes_ok, 0.9):.3f}; "
              f"{sum(b <= 1.3 for b in bytes_ok)} of {len(bytes_ok)} within 1.3")
    if worse:
        ratio, seed, other = max(worse)
        print(f"planner over the other policies: worst {ratio:.3f} (seed {seed}, {other}); "
              f"{sum(r > 1.05 for r, _, _ in worse)} of {len(worse)} above 1.05")
    if sim_err:
        print(f"plan-sim against the real runs: median error {statistics.median(sim_err):.3f}, "
              f"{sum(e <= 0.1 for e in sim_err)} of {len(sim_err)} within 10%")
    if a.svg:
        svg(shapes, a.svg)


if __name__ == "__main__":
    main()
