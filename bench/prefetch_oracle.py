"""The ceiling of any prefetcher in `granary-bench plan-sim`'s model: a clairvoyant one.

    python bench/prefetch_oracle.py SHARDS RANKS CACHE_SHARDS BX LEAD_SHARDS [--behind SLOTS]
                                    [--epochs 6] [--seed 1]

The model is the simulation's, in units of one shard: RANKS ranks in lockstep consume
one shard each per slot, the job X = 1 shard a second in all (a slot takes RANKS
seconds); they read LEAD_SHARDS (in the job's seconds) ahead of what they consume; the
backend brings BX shards a second, one fetch at a time at its full rate (no sharing:
better than any real backend); the cache holds CACHE_SHARDS. The oracle knows every
epoch's order. It fetches the missing shard needed soonest as soon as there is room, or
an entry not in use whose next use comes later than the fetched one's (Belady, and as
early as it can). The shards of the slot being read, and of the `--behind` slots before
it, are in use (a planner that cannot tell when a rank's last read of a shard has come
keeps the shards its ranks' slowest readers may still be on).

Prints, per epoch after the first: its time over the bound max(D/X, (D - C)/B), and the
shards present when their slot's reads came. The planner in the same shape is
`granary-bench plan-sim --nodes 1 --ranks RANKS --shards SHARDS --cache C/D --bx BX`.
"""
import argparse
import random


def run(n, ranks, cache, bx, lead, behind=0, epochs=6, seed=1, dt=0.01):
    q = n // ranks
    rng = random.Random(seed)
    slots = []  # per epoch, per slot: the shards its ranks read
    for _ in range(epochs + 1):
        order = list(range(n))
        rng.shuffle(order)
        slots.append([[order[r * q + i] for r in range(ranks)] for i in range(q)])
    seq = [(e, i, sh) for e in range(epochs + 1) for i in range(q) for sh in slots[e][i]]
    held, fetching = set(), None
    t = 0.0

    def next_uses(k):
        """Each shard's next slot (counted over epochs) from slot `k` on."""
        nu = {}
        for e, i, sh in seq[k * ranks:]:
            nu.setdefault(sh, e * q + i)
        return nu

    def advance(until, k, in_use, wait_for=frozenset()):
        nonlocal t, fetching
        nu = next_uses(k)
        while t < until or not wait_for <= held:
            if fetching is None:
                missing = sorted((g, sh) for sh, g in nu.items() if sh not in held)
                if missing:
                    g, sh = missing[0]
                    if len(held) < cache:
                        fetching = [sh, 1.0]
                    else:
                        victims = sorted(((nu.get(h, 1e18), h) for h in held if h not in in_use),
                                         reverse=True)
                        if victims and victims[0][0] > g:
                            held.discard(victims[0][1])
                            fetching = [sh, 1.0]
            t += dt
            if fetching:
                fetching[1] -= bx * dt
                if fetching[1] <= 1e-9:
                    held.add(fetching[0])
                    fetching = None

    consume = 0.0  # when the next slot's consumption may start
    out = []
    for e in range(epochs):
        start, ready = consume, 0
        for i in range(q):
            k = e * q + i
            need = set(slots[e][i])
            in_use = set(need)
            for j in range(max(0, i - behind), i):
                in_use |= set(slots[e][j])
            advance(consume - lead, k, in_use)
            ready += len(need & held)
            advance(consume, k, in_use, frozenset(need))
            consume = max(consume, t) + ranks
        out.append((consume - start, ready / (q * ranks)))
    bound = max(n, (n - cache) / bx)
    return [(round(w / bound, 2), round(r, 2)) for w, r in out[1:]]


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("shards", type=int)
    ap.add_argument("ranks", type=int)
    ap.add_argument("cache", type=float, help="the cache, in shards")
    ap.add_argument("bx", type=float)
    ap.add_argument("lead", type=float, help="read-ahead, in shards of the job's consumption")
    ap.add_argument("--behind", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    for wall, ready in run(a.shards, a.ranks, a.cache, a.bx, a.lead, a.behind, a.epochs, a.seed):
        print(f"wall / bound {wall:.2f}  ready {ready:.2f}")
