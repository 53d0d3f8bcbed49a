#!/usr/bin/env python3
"""A cold dataset's start through one node over moto: how long its catalog and its first
sample take, and how many bytes the backend served by then; then a second job's start.

    bench/catalog.py WORKDIR GRANARY_BIN MOTO_SERVER SHARDS SAMPLES MEMBER index|noindex [RATE]

Each shard holds SAMPLES samples of a .jpg of MEMBER to MEMBER+4 KiB and a .cls; with
`index`, the dataset keeps a wids.json beside its shards. RATE is --backend-rate (0: none).
Prints one JSON line. Needs boto3, requests and the granary package (tests/.venv).
"""
import io, json, os, random, subprocess, sys, tarfile, time, socket
import boto3, requests, granary
from benchlib import start_moto, start_node, wait_healthy
root, granary_bin, moto_bin = sys.argv[1], sys.argv[2], sys.argv[3]
n_shards, samples, member, with_index = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7] == "index"
rate = sys.argv[8] if len(sys.argv) > 8 else "0"
moto, moto_url, s3 = start_moto(moto_bin)
total = 0; shardlist = []
payload = os.urandom(member + 4096)
for s in range(n_shards):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
        for i in range(samples):
            for ext, size in (("jpg", member + (i * 37) % 4096), ("cls", 1)):
                ti = tarfile.TarInfo(f"{s:04}{i:04}.{ext}"); ti.size = size
                t.addfile(ti, io.BytesIO(payload[:size]))
    data = buf.getvalue(); total += len(data)
    s3.put_object(Bucket="dsets", Key=f"p/shard-{s:04}.tar", Body=data)
    shardlist.append({"url": f"shard-{s:04}.tar", "nsamples": samples})
if with_index:
    s3.put_object(Bucket="dsets", Key="p/wids.json", Body=json.dumps({"shardlist": shardlist}).encode())
node, url = start_node(granary_bin, f"{root}/node", moto_url, "--backend-rate", rate)
wait_healthy(url)
def backend(): return requests.get(f"{url}/_granary/stats").json()["bytes_from_backend"]
t0 = time.time()
ds = granary.ShardDataset(url, "dsets", "p/", seed=0)
t_catalog = time.time() - t0; b_catalog = backend()
it = iter(ds)
first = next(it)
t_first = time.time() - t0; b_first = backend()
del it
time.sleep(1.0)
b_before = backend()
# A second job: no shard read to start.
t1 = time.time(); ds2 = granary.ShardDataset(url, "dsets", "p/", seed=5); t_second = time.time() - t1
b_second = backend()
node.kill(); moto.kill()
print(json.dumps({"index": with_index, "rate": rate, "shards": n_shards, "dataset_bytes": total, "shard_bytes": total // n_shards,
  "catalog_s": round(t_catalog, 3), "catalog_backend_bytes": b_catalog,
  "first_sample_s": round(t_first, 3), "backend_bytes_at_first_sample": b_first, "fraction": round(b_first / total, 4),
  "second_job_start_s": round(t_second, 3), "second_job_backend_bytes": b_second - b_before}))
