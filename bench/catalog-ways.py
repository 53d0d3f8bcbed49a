#!/usr/bin/env python3
"""Cataloguing a dataset two ways through one node over moto: the cluster's catalog
(`GET /_granary/catalog`: headers by range, hopping over members' data, or read through)
against each shard read whole to list its members (`GET ?archlist`, 8 at a time, what
clients did before catalogs). Wall time and backend bytes of each, on fresh nodes.

    bench/catalog-ways.py WORKDIR GRANARY_BIN MOTO_SERVER SHARDS SAMPLES MEMBER [RATE]

Each shard holds SAMPLES samples: a .jpg of MEMBER to 1.5 x MEMBER bytes, a .cls and a
.json. RATE is --backend-rate (0: none). Prints one JSON line.
"""
import io, os, random, subprocess, sys, tarfile, time, json, socket, concurrent.futures as cf
import boto3, requests
from benchlib import start_moto, start_node, wait_healthy
root = sys.argv[1]; granary = sys.argv[2]; moto_bin = sys.argv[3]
n_shards, samples, big = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
rate = sys.argv[7] if len(sys.argv) > 7 else "0"
moto, moto_url, s3 = start_moto(moto_bin)
rnd = random.Random(1); total = 0
for s in range(n_shards):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
        for i in range(samples):
            for ext, size in (("jpg", big + rnd.randint(0, big // 2)), ("cls", 1), ("json", 20)):
                ti = tarfile.TarInfo(f"{s:03}{i:04}.{ext}"); ti.size = size
                t.addfile(ti, io.BytesIO(os.urandom(size)))
    data = buf.getvalue(); total += len(data)
    s3.put_object(Bucket="dsets", Key=f"p/shard-{s:04}.tar", Body=data)
def node(name):
    p, url = start_node(granary, f"{root}/{name}", moto_url, "--backend-rate", rate)
    wait_healthy(url)
    return p, url
# (a) the catalog: headers by range
p, url = node("hop"); t = time.time()
c = requests.get(f"{url}/_granary/catalog", params={"bucket": "dsets", "prefix": "p/"}).json()
hop_s = time.time() - t; hop_b = requests.get(f"{url}/_granary/stats").json()["bytes_from_backend"]
p.kill()
# (b) each shard read whole to list its members (what a client did shard by shard)
p, url = node("whole"); t = time.time()
keys = [s["key"] for s in c["shards"]]
with cf.ThreadPoolExecutor(8) as ex:
    lists = list(ex.map(lambda k: requests.get(f"{url}/dsets/{k}", params={"archlist": ""}).json(), keys))
whole_s = time.time() - t; whole_b = requests.get(f"{url}/_granary/stats").json()["bytes_from_backend"]
p.kill(); moto.kill()
print(json.dumps({"rate": rate, "shards": n_shards, "samples": samples, "member": big, "dataset_bytes": total,
  "hop": {"s": round(hop_s, 2), "backend_bytes": hop_b, "fraction": round(hop_b / total, 4)},
  "whole": {"s": round(whole_s, 2), "backend_bytes": whole_b, "fraction": round(whole_b / total, 4)}}))
