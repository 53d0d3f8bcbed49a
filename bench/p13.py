"""P13: datasets larger than the cluster's cache, behind a backend slower than the job.

    python bench/p13.py ROOT GRANARY_BIN [--nodes 1|3] [--shards 192] [--shard-mib 2]
                        [--rate-mib 32] [--epochs 3] [--policies never-evict,lru,look-ahead,planner]
                        [--dc 2[,4...]] [--bx 0.55[,0.3...]] [--loader default|small]
                        [--read-ahead 2] [--batch 8] [--prefetch-factor 2]
                        [--backend fs|moto|store] [--ranks 1 [--loose]] [--jobs 1|2 --stagger 30]
                        [--draw SEED]

D = SHARDS x SHARD_MIB; for each cell of the matrix DC x BX, the cache C = D / DC (split
over the nodes) and the backend paced to B = BX x X as a whole. X is the job's
consumption rate: ShardDataset in a DataLoader with 2 workers, and a fixed step per
batch that sets X. Loaders: `default` is batches of 8, read_ahead 2 and the DataLoader 2
batches ahead per worker; `small` batches of 2, no read-ahead, 1 batch ahead (the shape
in which never-evict's misses show); `--batch/--read-ahead/--prefetch-factor` set them
one by one. `--ranks R` runs the job as R rank processes (each its own DataLoader, the
plan's `rank`/`world_size`), held in step by a gloo barrier a step as DDP's all-reduce
holds them; each consumes X / R, so that the job's rate stays X (`--loose`: a barrier
an epoch). `--draw SEED` takes the shape drawn by `shapes.py` for SEED (nodes, ranks,
D/C, B/X, shard and sample sizes, loader, jobs, X, shards) over those flags, and
names it in its first JSON line; the second job of a drawn shape starts a quarter of
the ideal epoch after the first.

Backends: `fs` is a directory paced by each node's `--backend-rate` (B split evenly over
the nodes); `moto` a moto server and `store` a granary node over the directory with no
cache (`--cache-capacity 0`), each behind `paceproxy.py`, which paces all the nodes'
reads together to B, as a store's egress cap would, and shares it per connection.

The ideal is the same job's epoch with the whole dataset in cache, measured once per run
before the cells (it depends on neither C nor B). Per cell, each policy runs EPOCHS
epochs on fresh nodes: never-evict and lru without a plan, the look-ahead peer (lru, and
in each rank a thread that reads the next k shards of the rank's known order through the
node as the rank's loop reaches each, k = the shards that fill half the cache over all
ranks; its reads count among the cell's, so its `from cache` is not the job's), the
planner (never-evict with ShardDataset's plan). The bound of an epoch is max(D/X, (D - C)/B): D/X is the ideal
measured, (D - C)/B computed. Per epoch: wall time over the ideal and over the bound,
seconds the loop waited for data, the fraction of reads answered from the cache, the
planned reads that found their entry committed (the plan's reads_ready), and bytes from
the backend over D - C. Prints one JSON line per epoch and a table per cell.
"""
import argparse, io, json, os, shutil, subprocess, sys, tarfile, time
import requests
from benchlib import CREDS, port, start_moto, wait_healthy

LOADERS = {"default": (8, 2, 2), "small": (2, 0, 1)}

ap = argparse.ArgumentParser()
ap.add_argument("root"); ap.add_argument("granary")
ap.add_argument("--nodes", type=int, default=1)
ap.add_argument("--shards", type=int, default=192)
ap.add_argument("--shard-mib", type=int, default=2)
ap.add_argument("--sample-kib", type=int, default=256)
ap.add_argument("--rate-mib", type=float, default=32.0, help="the job's consumption rate X")
ap.add_argument("--epochs", type=int, default=3)
ap.add_argument("--policies", default="never-evict,lru,planner",
                help="of never-evict, lru, look-ahead (lru with each rank reading the next shards of its "
                     "known order ahead through the node) and planner")
ap.add_argument("--dc", default="2", help="D / C, a comma-separated list")
ap.add_argument("--bx", default="0.55", help="B / X, a comma-separated list")
ap.add_argument("--loader", choices=sorted(LOADERS), default="default")
ap.add_argument("--read-ahead", type=int, help="ShardDataset's read_ahead (runs per worker)")
ap.add_argument("--backend", choices=("fs", "moto", "store"), default="fs")
ap.add_argument("--batch", type=int, help="samples per batch (one step each)")
ap.add_argument("--prefetch-factor", type=int, help="the DataLoader's batches ahead per worker")
ap.add_argument("--out", help="append every JSON line here too")
ap.add_argument("--jobs", type=int, choices=(1, 2), default=1,
                help="2: a second job on a second dataset of the same size, started --stagger s later "
                     "(the planner only; D is then both datasets, and each job's bound is its half's)")
ap.add_argument("--stagger", type=float, default=30.0)
ap.add_argument("--ranks", type=int, default=1,
                help="rank processes of the one job, in step as DDP holds them (a barrier a step)")
ap.add_argument("--loose", action="store_true", help="ranks held in step once an epoch, not a step")
ap.add_argument("--draw", type=int, metavar="SEED", help="the shape shapes.py draws for SEED")
a = ap.parse_args()
if a.draw is not None:
    from shapes import draw
    drawn = draw(a.draw)
    for k in ("nodes", "ranks", "loose", "shard_mib", "sample_kib", "loader", "jobs", "rate_mib",
              "shards"):
        setattr(a, k, drawn[k])
    a.dc, a.bx = str(drawn["dc"]), str(drawn["bx"])

MIB = 1 << 20
root = os.path.abspath(a.root)
origin = os.path.join(root, "origin")
per_shard = a.shard_mib * 1024 // a.sample_kib
batch, read_ahead, prefetch = LOADERS[a.loader]
batch = a.batch or batch
read_ahead = read_ahead if a.read_ahead is None else a.read_ahead
prefetch = a.prefetch_factor or prefetch
D = a.shards * a.shard_mib * MIB
X = a.rate_mib * MIB
out = open(a.out, "a") if a.out else None


def emit(row):
    line = json.dumps(row)
    print(line, flush=True)
    if out:
        out.write(line + "\n"); out.flush()


if a.draw is not None:
    emit({"drawn": drawn})
PREFIXES = ["p", "q"][: a.jobs]
UNPLANNED = 4


def lay_out():
    want = f"{a.shards}x{a.shard_mib}x{a.sample_kib}x{a.jobs}"
    mark = os.path.join(origin, "shape")
    if os.path.exists(mark) and open(mark).read() == want:
        return
    shutil.rmtree(origin, ignore_errors=True)
    payload = os.urandom(a.sample_kib * 1024 + 4096)
    for n, prefix in enumerate(PREFIXES):
        d = os.path.join(origin, "dsets", prefix)
        os.makedirs(d)
        for s in range(a.shards):
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
                for i in range(per_shard):
                    data = payload[(s * 7 + i + n) % 4096:][: a.sample_kib * 1024 - 1024]
                    ti = tarfile.TarInfo(f"{s:04}{i:04}.bin"); ti.size = len(data)
                    t.addfile(ti, io.BytesIO(data))
            with open(os.path.join(d, f"shard-{s:04}.tar"), "wb") as f:
                f.write(buf.getvalue())
    # Objects no plan reads: read once before the jobs, they must stay cached.
    d = os.path.join(origin, "dsets", "u")
    os.makedirs(d)
    for i in range(UNPLANNED):
        with open(os.path.join(d, f"obj-{i}"), "wb") as f:
            f.write(payload[: 64 << 10])
    open(mark, "w").write(want)


store = {"procs": []}


def start_store():
    """The store the nodes read (moto, or a granary node with no cache over the
    directory); `pace(B)` puts a proxy pacing it to B in front of it."""
    if a.backend == "moto":
        moto = os.environ.get("MOTO_SERVER", "moto_server")
        proc, url, s3 = start_moto(moto)
        d = os.path.join(origin, "dsets")
        for prefix in PREFIXES + ["u"]:
            for name in sorted(os.listdir(os.path.join(d, prefix))):
                with open(os.path.join(d, prefix, name), "rb") as f:
                    s3.put_object(Bucket="dsets", Key=f"{prefix}/{name}", Body=f.read())
    elif a.backend == "store":
        sp = port()
        data = os.path.join(root, "store")
        shutil.rmtree(data, ignore_errors=True); os.makedirs(data)
        proc = subprocess.Popen([a.granary, "serve", "--listen", f"127.0.0.1:{sp}", "--data-dir", data,
                                 "--backend", f"fs:{origin}", "--cache-capacity", "0"],
                                stdout=subprocess.DEVNULL, stderr=open(f"{data}.log", "w"))
        url = f"http://127.0.0.1:{sp}"
        wait_healthy(url)
    else:
        return
    store.update(url=url)
    store["procs"].append(proc)


def pace(rate):
    """A paceproxy in front of the store at `rate` bytes per second: its URL."""
    stop_pace()
    pp = port()
    proxy = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "paceproxy.py"),
                              str(pp), store["url"].rsplit(":", 1)[1], str(int(rate))],
                             stdout=subprocess.PIPE, text=True)
    assert proxy.stdout.readline().strip() == "ready"
    store["proxy"] = proxy
    return f"http://127.0.0.1:{pp}"


def stop_pace():
    p = store.pop("proxy", None)
    if p:
        p.kill(); p.wait()


def start_nodes(policy, capacity, rate):
    """Fresh nodes: (processes, urls). `rate`: pace the backend to it (else unpaced)."""
    ids = [f"n{i}" for i in range(a.nodes)]
    ports = [port() for _ in ids]
    peers = ",".join(f"{i}=http://127.0.0.1:{p}" for i, p in zip(ids, ports))
    procs, urls = [], []
    endpoint = None
    if a.backend != "fs":
        endpoint = pace(rate) if rate else store["url"]
    for i, p in zip(ids, ports):
        data = os.path.join(root, "run", i)
        shutil.rmtree(data, ignore_errors=True); os.makedirs(data)
        args = [a.granary, "serve", "--listen", f"127.0.0.1:{p}", "--data-dir", data,
                "--node-id", i, "--cache-capacity", str(capacity // a.nodes),
                "--cache-policy", "lru" if policy in ("lru", "look-ahead") else "never-evict"]
        if endpoint:
            args += ["--backend", "s3", "--s3-endpoint", endpoint]
        else:
            args += ["--backend", f"fs:{origin}"]
            if rate:
                args += ["--backend-rate", str(int(rate) // a.nodes)]
        if a.nodes > 1:
            args += ["--peer", peers]
        procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, env=dict(os.environ, **CREDS),
                                      stderr=open(os.path.join(root, "run", f"{i}.log"), "w")))
        urls.append(f"http://127.0.0.1:{p}")
    for u in urls:
        wait_healthy(u)
    return procs, urls


def stop(procs):
    for p in procs:
        p.kill(); p.wait()
    stop_pace()


def totals(urls):
    keys = ("hits", "misses", "bypasses", "peer_fills", "planned_fetches", "bytes_from_backend")
    out = dict.fromkeys(keys, 0)
    for u in urls:
        s = requests.get(f"{u}/_granary/stats").json()
        for k in keys:
            out[k] += s.get(k, 0)
    # The plan's reads, summed over the cluster by its home: the same through any node.
    plans = requests.get(f"{urls[0]}/_granary/plans").json().get("plans", [])
    out["reads_ready"] = sum(p.get("reads_ready", 0) for p in plans)
    out["reads_waited"] = sum(p.get("reads_waited", 0) for p in plans)
    return out


JOB = r"""
import json, sys, time, torch, granary
url, epochs, first, step, plan = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5] == "1"
batch, ahead, prefetch, prefix = int(sys.argv[6]), int(sys.argv[7]), int(sys.argv[8]), sys.argv[9]
rank, world, loose = int(sys.argv[10]), int(sys.argv[11]), sys.argv[12] == "1"
if world > 1:
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=rank, world_size=world)
    epoch_sync = dist.barrier
else:
    epoch_sync = lambda: None
sync = (lambda: None) if loose else epoch_sync
look = int(sys.argv[13])
ds = granary.ShardDataset(url, "dsets", prefix, seed=3, batch_size=batch, read_ahead=ahead, plan=plan,
                          rank=rank, world_size=world)
dl = torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=2, collate_fn=lambda b: b,
                                 persistent_workers=False, prefetch_factor=prefetch)


def look_ahead(state, keys):
    # The look-ahead peer: the next `look` shards of this rank's known order (its span,
    # read front to back) after the one its reads have reached, each read once through the
    # node, whose LRU cache then holds them for the rank's own read.
    import bisect, requests
    starts = [p for p, _ in state["runs"]]
    fetched = set()
    with requests.Session() as http:
        while not state["done"]:
            i = max(0, bisect.bisect_right(starts, state["front"]) - 1)
            todo = [sh for _, sh in state["runs"][i: i + 1 + look] if sh not in fetched]
            if not todo:
                time.sleep(0.01)
                continue
            fetched.add(todo[0])
            with http.get(f"{url}/dsets/{keys[todo[0]]}", stream=True) as r:
                for _ in r.iter_content(1 << 20):
                    pass


for e in range(first, first + epochs):
    ds.set_epoch(e)
    state = None
    if look:
        import threading
        entries = ds._shards.order(ds._epoch_read(world_size=world, rank=rank))
        by_span = sorted((p, sh) for sh, p in entries)
        runs = [(p, sh) for i, (p, sh) in enumerate(by_span) if i == 0 or by_span[i - 1][1] != sh]
        front_at, f = [], -1
        for sh, p in entries:
            f = max(f, p); front_at.append(f)
        state = {"runs": runs, "front": 0, "done": False}
        th = threading.Thread(target=look_ahead, args=(state, ds.shards), daemon=True)
        th.start()
    epoch_sync()
    t0 = time.monotonic(); waited = 0.0; n = 0; consumed = 0
    t = time.monotonic()
    for b in dl:
        now = time.monotonic(); waited += now - t
        n += sum(len(s["bin"]) for s in b)
        if state:
            consumed += len(b)
            # Where the rank's reads are: its loader's batches in flight past its loop.
            state["front"] = front_at[min(consumed + 2 * prefetch * batch, len(front_at)) - 1]
        time.sleep(step)
        sync()
        t = time.monotonic()
    if state:
        state["done"] = True
        th.join()
    epoch_sync()
    if rank == 0:
        print(json.dumps({"epoch": e, "wall": time.monotonic() - t0, "waited": waited, "bytes": n}), flush=True)
"""


def start_job(url, epochs, first, plan, prefix="p/", look=0):
    """The job's rank processes (rank 0 first, the one that prints the epochs).
    With RANKS > 1 each steps at X / RANKS and all wait for the slowest at each step,
    as DDP's all-reduce holds them. `look` > 0: each rank runs the look-ahead peer that
    many shards ahead."""
    step = a.ranks * batch * (a.sample_kib * 1024 - 1024) / X
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port()))
    return [subprocess.Popen([sys.executable, "-c", JOB, url, str(epochs), str(first), str(step),
                              "1" if plan else "0", str(batch), str(read_ahead), str(prefetch), prefix,
                              str(r), str(a.ranks), "1" if a.loose else "0", str(look)],
                             stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL, text=True, env=env)
            for r in range(a.ranks)]


def wait_job(ps):
    for p in ps:
        assert p.wait() == 0, "the job failed"


def run_job(url, epochs, first, plan, on_epoch, look=0):
    ps = start_job(url, epochs, first, plan, look=look)
    for line in ps[0].stdout:
        on_epoch(json.loads(line))
    wait_job(ps)


def two_jobs():
    """Two jobs on two datasets of D each, one cache C = 2D / DC, one backend B = BX x X,
    the second started STAGGER s after the first. Each job's bound is its half's:
    max(D/X, (D - C/2) / (B/2)) while both run. Unplanned objects read before the jobs
    must still be cached after them."""
    import threading
    rows = []
    for dc in [float(v) for v in a.dc.split(",")]:
        for bx in [float(v) for v in a.bx.split(",")]:
            C = int(2 * D / dc)
            B = bx * X
            half = max(ideal_wall, (D - C / 2) / (B / 2))
            procs, urls = start_nodes("planner", C, B)
            for i in range(UNPLANNED):
                requests.get(f"{urls[0]}/dsets/u/obj-{i}").raise_for_status()
            before_u = totals(urls)
            out = {}

            def job(prefix, delay):
                time.sleep(delay)
                ps = start_job(urls[0], a.epochs, 0, True, prefix + "/")
                for line in ps[0].stdout:
                    r = json.loads(line)
                    plans = requests.get(f"{urls[0]}/_granary/plans").json().get("plans", [])
                    mine = [x for x in plans if x.get("prefix") == prefix + "/"]
                    row = {**shape, "jobs": 2, "job": prefix, "dc": dc, "bx": bx, "epoch": r["epoch"],
                           "wall_over_bound": round(r["wall"] / half, 3), "bound_s": round(half, 2),
                           "waited_s": round(r["waited"], 2), "wall_s": round(r["wall"], 2),
                           "reads_ready": sum(x.get("reads_ready", 0) for x in mine),
                           "reads_waited": sum(x.get("reads_waited", 0) for x in mine)}
                    out.setdefault(prefix, []).append(row)
                    emit(row)
                wait_job(ps)

            ts = [threading.Thread(target=job, args=(pre, i * a.stagger)) for i, pre in enumerate(PREFIXES)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            mid = totals(urls)
            for i in range(UNPLANNED):
                requests.get(f"{urls[0]}/dsets/u/obj-{i}").raise_for_status()
            after = totals(urls)
            kept = after["hits"] - mid["hits"]
            emit({**shape, "jobs": 2, "dc": dc, "bx": bx, "unplanned_kept": kept, "unplanned": UNPLANNED,
                  "backend_over_2D_minus_C": round((mid["bytes_from_backend"] - before_u["bytes_from_backend"])
                                                   / (a.epochs * (2 * D - C)), 3)})
            rows += [r for v in out.values() for r in v]
            stop(procs)
    print("| D/C | B/X | job | epoch | wall / its bound | ready (cumulative) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        n = r["reads_ready"] + r["reads_waited"]
        print(f"| {r['dc']:g} | {r['bx']:g} | {r['job']} | {r['epoch'] + 1} | {r['wall_over_bound']:.2f} "
              f"| {r['reads_ready'] / n if n else 0:.3f} |")


def look_shards(C):
    """The look-ahead peer's depth, fixed before any run: as many shards a rank as fill
    half the cache over all the ranks (the other half holds what the ranks are reading),
    at least one."""
    return max(1, int(C // (2 * a.ranks * a.shard_mib * MIB)))


lay_out()
start_store()
shape = {"nodes": a.nodes, "backend": a.backend, "shard_mib": a.shard_mib, "shards": a.shards, "ranks": a.ranks,
         "loader": f"{batch}/{read_ahead}/{prefetch}", "X": X, "D": D, "loose": a.loose, "draw": a.draw}
# The ideal: the whole dataset in cache, no pacing; an epoch to warm, then one timed.
procs, urls = start_nodes("never-evict", 4 * D, 0)
ideal = []
run_job(urls[0], 2, 0, False, lambda r: ideal.append(r))
stop(procs)
ideal_wall = ideal[-1]["wall"]
if a.draw is not None:
    a.stagger = ideal_wall / 4
emit({**shape, "ideal_wall": ideal_wall})
if a.jobs == 2:
    two_jobs()
    stop_pace()
    for p in store["procs"]:
        p.kill(); p.wait()
    sys.exit(0)
rows = []
for dc in [float(v) for v in a.dc.split(",")]:
    for bx in [float(v) for v in a.bx.split(",")]:
        C = int(D / dc)
        B = bx * X
        bound = max(ideal_wall, (D - C) / B)
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
                # Ready: planned reads answered from a committed entry, by the nodes' own
                # counters at the epoch's end (every read of the job is a planned one; one
                # that joins a fill in flight counts as a miss). The plan's reads_ready is
                # the cluster's as its home last learned it, up to an exchange behind: at an
                # epoch's end it still lacks the last second's reads, which it would give
                # to the next epoch. It is checked against these once the cell is over.
                planned = d["reads_ready"] + d["reads_waited"]
                row = {**shape, "dc": dc, "bx": bx, "policy": policy, "epoch": r["epoch"],
                       "wall_over_ideal": round(r["wall"] / ideal_wall, 3),
                       "wall_over_bound": round(r["wall"] / bound, 3),
                       "bound_s": round(bound, 2),
                       "waited_s": round(r["waited"], 2),
                       "cache_fraction": round(d["hits"] / reads, 3) if reads else None,
                       "ready": round(d["hits"] / reads, 3) if reads and policy == "planner" else None,
                       "ready_as_home_knew": round(d["reads_ready"] / planned, 3) if planned else None,
                       "backend_over_D_minus_C": round(d["bytes_from_backend"] / (D - C), 3),
                       "wall_s": round(r["wall"], 2),
                       **{k: d[k] for k in ("hits", "misses", "bypasses", "peer_fills", "planned_fetches")}}
                rows.append(row)
                emit(row)

            try:
                run_job(urls[0], a.epochs, 0, policy == "planner", on_epoch,
                        look=look_shards(C) if policy == "look-ahead" else 0)
            except BaseException:
                # A failed job leaves no node behind to load the shapes after it.
                stop(procs)
                raise
            if policy == "planner":
                # The plan's counts once the last reports are in, against the nodes'.
                time.sleep(2.5)
                now = totals(urls)
                reads = sum(now[k] for k in ("hits", "misses", "bypasses", "peer_fills")) - now["planned_fetches"]
                check = {"plan_reads": now["reads_ready"] + now["reads_waited"], "reads": reads,
                         "plan_ready": now["reads_ready"], "hits": now["hits"]}
                check["agree"] = check["plan_reads"] == reads and check["plan_ready"] == now["hits"]
                emit({**shape, "dc": dc, "bx": bx, "policy": policy, "ready_check": check})
                if not check["agree"]:
                    print(f"the plan's counts and the nodes' differ: {check}", file=sys.stderr)
            stop(procs)

stop_pace()
for p in store["procs"]:
    p.kill(); p.wait()

print(f"\nP13, {a.nodes} node(s), {a.backend}: D = {D / MIB:.0f} MiB in {a.shard_mib} MiB shards, "
      f"X = {X / MIB:.1f} MiB/s, loader {batch}/{read_ahead}/{prefetch}; ideal epoch {ideal_wall:.2f} s")
print("| D/C | B/X | policy | epoch | wall / bound | wall / ideal | waited (s) | from cache | ready | backend / (D-C) |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['dc']:g} | {r['bx']:g} | {r['policy']} | {r['epoch'] + 1} | {r['wall_over_bound']:.2f} "
          f"| {r['wall_over_ideal']:.2f} | {r['waited_s']:.2f} | {r['cache_fraction']} | {r['ready']} "
          f"| {r['backend_over_D_minus_C']:.2f} |")
