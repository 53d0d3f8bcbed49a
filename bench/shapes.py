"""Shapes drawn at random for the planner's benchmark (P13). A run draws its shape from
the distribution below with a seed it names (`p13.py --draw SEED`), so any shape can be
replayed and none is chosen after seeing a result.

The distribution (each draw independent, in this order, from `random.Random(seed)`):
- nodes: 1-4, uniform.
- ranks: 1, 2, 4, 8 or 16, even odds; in lockstep (a barrier a step, as DDP's
  all-reduce holds them) or loose (a barrier an epoch), even odds (1 rank: lockstep).
- D / C: 1.1-4, log-uniform.
- B / X: 0.2-1.0, uniform.
- shard size: 1-64 MiB, log-uniform, whole MiB.
- samples a shard: 8-2,000, log-uniform, at most one a KiB of the shard.
- loader: `default` or `small` (p13.py's), even odds.
- jobs: 2 one time in 4 (a second job on a second dataset, a quarter epoch later).
- X, the job's rate: 16-64 MiB/s, log-uniform.
- D: 96-384 MiB, log-uniform, in whole shards, at least 2 shards a rank and 4 in all.

    python3 bench/shapes.py 1 2 3      # the shapes of seeds 1, 2, 3, as JSON
"""

from __future__ import annotations

import json
import math
import random
import sys


def log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def draw(seed: int) -> dict:
    """The shape of `seed`: p13.py's arguments, by their names there."""
    rng = random.Random(seed)
    nodes = rng.randint(1, 4)
    ranks = rng.choice([1, 2, 4, 8, 16])
    loose = rng.random() < 0.5 and ranks > 1
    dc = round(log_uniform(rng, 1.1, 4.0), 2)
    bx = round(rng.uniform(0.2, 1.0), 2)
    shard_mib = max(1, min(64, round(log_uniform(rng, 1, 64))))
    samples = min(round(log_uniform(rng, 8, 2000)), shard_mib * 1024)
    sample_kib = max(1, shard_mib * 1024 // samples)
    loader = rng.choice(["default", "small"])
    jobs = 2 if rng.random() < 0.25 else 1
    rate_mib = round(log_uniform(rng, 16, 64), 1)
    d_mib = log_uniform(rng, 96, 384)
    shards = max(4, 2 * ranks, round(d_mib / shard_mib))
    return {"seed": seed, "nodes": nodes, "ranks": ranks, "loose": loose, "dc": dc,
            "bx": bx, "shard_mib": shard_mib, "sample_kib": sample_kib, "loader": loader,
            "jobs": jobs, "rate_mib": rate_mib, "shards": shards}


if __name__ == "__main__":
    for s in sys.argv[1:]:
        print(json.dumps(draw(int(s))))
