#!/usr/bin/env python3
"""Times ListObjectsV2 pages over one folder of many keys on a node with an fs backend.

    bench/list-pages.py BINARY [KEYS]      (default 100000 keys)

Lays out KEYS empty files in one folder of a fresh origin (once per KEYS, under
/tmp/granary-list-pages), starts BINARY on it, pages through the folder with
max-keys=1000 and then 50 pages of max-keys=1, and prints the page times and the node's
peak RSS."""

import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

binary = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 100_000
origin = f"/tmp/granary-list-pages/{n}/origin"
folder = os.path.join(origin, "big", "f")
if not os.path.isdir(folder) or len(os.listdir(folder)) != n:
    os.makedirs(folder, exist_ok=True)
    for i in range(n):
        open(os.path.join(folder, f"{i:06}"), "wb").close()
    time.sleep(1.5)  # older than a second: a folder's listing may be kept
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
data = tempfile.mkdtemp()
node = subprocess.Popen([binary, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", data,
                         "--backend", f"fs:{origin}"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
url = f"http://127.0.0.1:{port}"
for _ in range(100):
    try:
        urllib.request.urlopen(url + "/_granary/health", timeout=1)
        break
    except OSError:
        time.sleep(0.1)


def pages(max_keys: int, limit: int) -> list[float]:
    token, times = None, []
    for _ in range(limit):
        q = f"list-type=2&prefix=f/&max-keys={max_keys}"
        if token:
            q += "&continuation-token=" + urllib.request.quote(token, safe="")
        t = time.perf_counter()
        body = urllib.request.urlopen(f"{url}/big?{q}").read().decode()
        times.append(time.perf_counter() - t)
        m = re.search(r"<NextContinuationToken>([^<]+)<", body)
        if not m:
            break
        token = m.group(1)
    return times


t = pages(1000, n // 1000 + 1)
print(f"max-keys=1000: {len(t)} pages, all {sum(t):.2f} s, first {t[0] * 1e3:.1f} ms, "
      f"median {sorted(t)[len(t) // 2] * 1e3:.1f} ms")
t = pages(1, 50)
print(f"max-keys=1: median {sorted(t)[len(t) // 2] * 1e3:.2f} ms")
with open(f"/proc/{node.pid}/status") as f:
    print([line.strip() for line in f if line.startswith("VmHWM")][0])
node.terminate()
node.wait()
