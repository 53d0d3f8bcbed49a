"""P13: a dataset twice the cluster's cache, behind a backend slower than the job.

    python bench/p13.py ROOT GRANARY_BIN [--nodes 1|3] [--shards 192] [--shard-mib 2]
                        [--rate-mib 32] [--epochs 3] [--policies never-evict,lru,planner]
                        [--read-ahead 2] [--batch 8] [--prefetch-factor 2] [--backend fs|moto]

D = SHARDS x SHARD_MIB, the cache C = D/2 (split over the nodes), the backend paced to
B = 0.55 x X as a whole: `fs` is a directory paced by each node's `--backend-rate`
(B split evenly over the nodes), `moto` a moto server behind `paceproxy.py`, which paces
all the nodes' reads together to B, as a store's egress cap would. X is the job's
consumption rate: ShardDataset in a DataLoader with 2 workers, and a fixed step per
batch that sets X (BATCH samples a batch, the DataLoader PREFETCH_FACTOR batches ahead per
worker). Each policy runs EPOCHS epochs on fresh nodes: never-evict and lru
without a plan, the planner (never-evict with ShardDataset's plan). The ideal is the
same job's epoch with the whole dataset in cache, measured in the same run. Per epoch:
wall time / ideal, seconds the loop waited for data, the fraction of reads answered from
the cache, and bytes from the backend / (D - C). Prints one JSON line per epoch and a
table.

How far the loader looks ahead decides whether never-evict's misses show in its wall
time: with the defaults they hide behind the hits before them (about 1.1 x ideal); with
`--batch 2 --read-ahead 0 --prefetch-factor 1 --backend moto` the backend idles while the
job reads the cached half, as in the 0.5 + 0.5 / 0.55 of the arithmetic (about 1.5).
"""
import argparse, io, json, os, shutil, subprocess, sys, tarfile, time
import requests
from benchlib import CREDS, port, start_moto, wait_healthy

ap = argparse.ArgumentParser()
ap.add_argument("root"); ap.add_argument("granary")
ap.add_argument("--nodes", type=int, default=1)
ap.add_argument("--shards", type=int, default=192)
ap.add_argument("--shard-mib", type=int, default=2)
ap.add_argument("--sample-kib", type=int, default=256)
ap.add_argument("--rate-mib", type=float, default=32.0, help="the job's consumption rate X")
ap.add_argument("--epochs", type=int, default=3)
ap.add_argument("--policies", default="never-evict,lru,planner")
ap.add_argument("--read-ahead", type=int, default=2, help="ShardDataset's read_ahead (runs per worker)")
ap.add_argument("--backend", choices=("fs", "moto"), default="fs")
ap.add_argument("--batch", type=int, default=8, help="samples per batch (one step each)")
ap.add_argument("--prefetch-factor", type=int, default=2, help="the DataLoader's batches ahead per worker")
a = ap.parse_args()

MIB = 1 << 20
root = os.path.abspath(a.root)
origin = os.path.join(root, "origin")
per_shard = a.shard_mib * 1024 // a.sample_kib
batch = a.batch
D = a.shards * a.shard_mib * MIB
C = D // 2
X = a.rate_mib * MIB
B = int(0.55 * X)


def lay_out():
    d = os.path.join(origin, "dsets", "p")
    if os.path.isdir(d) and len(os.listdir(d)) == a.shards:
        return
    shutil.rmtree(origin, ignore_errors=True)
    os.makedirs(d)
    payload = os.urandom(a.sample_kib * 1024 + 4096)
    for s in range(a.shards):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
            for i in range(per_shard):
                data = payload[(s * 7 + i) % 4096:][: a.sample_kib * 1024 - 1024]
                ti = tarfile.TarInfo(f"{s:04}{i:04}.bin"); ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))
        with open(os.path.join(d, f"shard-{s:04}.tar"), "wb") as f:
            f.write(buf.getvalue())


store = {}


def start_store():
    """The moto server with the dataset, and a proxy pacing it to B (moto only)."""
    if a.backend != "moto":
        return
    moto = os.environ.get("MOTO_SERVER", "moto_server")
    proc, url, s3 = start_moto(moto)
    d = os.path.join(origin, "dsets")
    for name in sorted(os.listdir(os.path.join(d, "p"))):
        with open(os.path.join(d, "p", name), "rb") as f:
            s3.put_object(Bucket="dsets", Key=f"p/{name}", Body=f.read())
    pp = port()
    proxy = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "paceproxy.py"),
                              str(pp), url.rsplit(":", 1)[1], str(B)], stdout=subprocess.PIPE, text=True)
    assert proxy.stdout.readline().strip() == "ready"
    store.update(url=url, paced=f"http://127.0.0.1:{pp}", procs=[proc, proxy])


def start_nodes(policy, capacity, rate):
    """Fresh nodes: (processes, urls). `rate`: pace the backend to it (else unpaced)."""
    ids = [f"n{i}" for i in range(a.nodes)]
    ports = [port() for _ in ids]
    peers = ",".join(f"{i}=http://127.0.0.1:{p}" for i, p in zip(ids, ports))
    procs, urls = [], []
    for i, p in zip(ids, ports):
        data = os.path.join(root, "run", i)
        shutil.rmtree(data, ignore_errors=True); os.makedirs(data)
        args = [a.granary, "serve", "--listen", f"127.0.0.1:{p}", "--data-dir", data,
                "--node-id", i, "--cache-capacity", str(capacity // a.nodes),
                "--cache-policy", "lru" if policy == "lru" else "never-evict"]
        if a.backend == "moto":
            args += ["--backend", "s3", "--s3-endpoint", store["paced"] if rate else store["url"]]
        else:
            args += ["--backend", f"fs:{origin}"]
            if rate:
                args += ["--backend-rate", str(rate // a.nodes)]
        if a.nodes > 1:
            args += ["--peer", peers]
        procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, env=dict(os.environ, **CREDS),
                                      stderr=open(os.path.join(root, "run", f"{i}.log"), "w")))
        urls.append(f"http://127.0.0.1:{p}")
    for u in urls:
        wait_healthy(u)
    return procs, urls


def totals(urls):
    keys = ("hits", "misses", "bypasses", "peer_fills", "planned_fetches", "bytes_from_backend")
    out = dict.fromkeys(keys, 0)
    for u in urls:
        s = requests.get(f"{u}/_granary/stats").json()
        for k in keys:
            out[k] += s.get(k, 0)
    return out


JOB = r"""
import json, sys, time, torch, granary
url, epochs, first, step, plan, ahead = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5] == "1", int(sys.argv[6])
ds = granary.ShardDataset(url, "dsets", "p/", seed=3, batch_size=%d, read_ahead=ahead, plan=plan)
dl = torch.utils.data.DataLoader(ds, batch_size=%d, num_workers=2, collate_fn=lambda b: b,
                                 persistent_workers=False, prefetch_factor=%d)
for e in range(first, first + epochs):
    ds.set_epoch(e)
    t0 = time.monotonic(); waited = 0.0; n = 0
    t = time.monotonic()
    for b in dl:
        now = time.monotonic(); waited += now - t
        n += sum(len(s["bin"]) for s in b)
        time.sleep(step)
        t = time.monotonic()
    print(json.dumps({"epoch": e, "wall": time.monotonic() - t0, "waited": waited, "bytes": n}), flush=True)
""" % (batch, batch, a.prefetch_factor)


def run_job(url, epochs, first, plan, on_epoch):
    step = batch * (a.sample_kib * 1024 - 1024) / X
    p = subprocess.Popen([sys.executable, "-c", JOB, url, str(epochs), str(first), str(step),
                          "1" if plan else "0", str(a.read_ahead)], stdout=subprocess.PIPE, text=True)
    for line in p.stdout:
        on_epoch(json.loads(line))
    assert p.wait() == 0, "the job failed"


lay_out()
start_store()
rows = []
# The ideal: the whole dataset in cache, no pacing; an epoch to warm, then one timed.
procs, urls = start_nodes("never-evict", 4 * D, 0)
ideal = []
run_job(urls[0], 2, 0, False, lambda r: ideal.append(r))
for p in procs:
    p.kill(); p.wait()
ideal_wall = ideal[-1]["wall"]
print(json.dumps({"ideal_wall": ideal_wall, "D": D, "C": C, "B": B, "X": X, "nodes": a.nodes}), flush=True)
for policy in a.policies.split(","):
    procs, urls = start_nodes(policy, C, B)
    before = [totals(urls)]

    def on_epoch(r):
        now = totals(urls)
        prev = before[-1]
        before.append(now)
        d = {k: now[k] - prev[k] for k in now}
        # The planner's own fetches count among the misses; they are no reads of the job.
        reads = d["hits"] + d["misses"] + d["bypasses"] + d["peer_fills"] - d["planned_fetches"]
        row = {"policy": policy, "nodes": a.nodes, "epoch": r["epoch"],
               "wall_over_ideal": round(r["wall"] / ideal_wall, 3),
               "waited_s": round(r["waited"], 2),
               "cache_fraction": round(d["hits"] / reads, 3) if reads else None,
               "backend_over_D_minus_C": round(d["bytes_from_backend"] / (D - C), 3),
               "wall_s": round(r["wall"], 2),
               **{k: d[k] for k in ("hits", "misses", "bypasses", "peer_fills", "planned_fetches")}}
        rows.append(row)
        print(json.dumps(row), flush=True)

    run_job(urls[0], a.epochs, 0, policy == "planner", on_epoch)
    for p in procs:
        p.kill(); p.wait()

for p in store.get("procs", []):
    p.kill(); p.wait()

print(f"\nP13, {a.nodes} node(s), {a.backend}: D = {D / MIB:.0f} MiB, C = {C / MIB:.0f} MiB, "
      f"X = {X / MIB:.1f} MiB/s, B = {B / MIB:.1f} MiB/s; ideal epoch {ideal_wall:.2f} s")
print("| policy | epoch | wall / ideal | waited (s) | from cache | backend / (D-C) |")
print("|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['policy']} | {r['epoch'] + 1} | {r['wall_over_ideal']:.2f} | {r['waited_s']:.2f} "
          f"| {r['cache_fraction']} | {r['backend_over_D_minus_C']:.2f} |")
