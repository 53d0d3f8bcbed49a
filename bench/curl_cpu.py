"""Server CPU per GiB with curl as the client: STREAMS loops, each running
`curl -s -o /dev/null URL` one process per read, for SECS seconds; bytes from curl's
`%{size_download}`, CPU (user + system) of the server's processes from /proc, and curl's
own (the receiving side: the children's rusage).

    python3 bench/curl_cpu.py '{"granary": ["http://127.0.0.1:7070/b/k", [PID]],
                                "nginx": ["http://127.0.0.1:8080/b/k", [PID1, PID2]]}' \
        [--streams 1,8] [--rounds 2] [--secs 4] [--json FILE]

Prints one line per round, streams and server: MB/s and CPU s per GiB, the servers
interleaved so that drift hits them alike; --json writes the last round's figures as
{server: {streams: {"mb_s", "cpu_s_per_gib", "client_cpu_s_per_gib",
"machine_cpu_s_per_gib"}}} (the machine's: every process and kernel thread, busy).
"""
import argparse, json, os, resource, subprocess, threading, time


def cpu(pids):
    t = 0
    for p in pids:
        f = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
        t += int(f[11]) + int(f[12])
    return t / os.sysconf("SC_CLK_TCK")


def run(url, pids, streams, secs):
    got, lock, stop = [0], threading.Lock(), time.time() + secs

    def loop():
        while time.time() < stop:
            r = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{size_download}", url],
                               capture_output=True, text=True)
            with lock:
                got[0] += int(float(r.stdout or 0))

    def children():
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    def machine():
        # Busy CPU of the whole machine: user, nice, system, irq, softirq.
        f = open("/proc/stat").readline().split()
        return sum(int(f[i]) for i in (1, 2, 3, 6, 7)) / os.sysconf("SC_CLK_TCK")

    c0, k0, m0, t0 = cpu(pids), children(), machine(), time.time()
    threads = [threading.Thread(target=loop) for _ in range(streams)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    c1, k1, m1, elapsed = cpu(pids), children(), machine(), time.time() - t0
    gib = max(got[0] / (1 << 30), 1e-9)
    return got[0] / elapsed / 1e6, (c1 - c0) / gib, (k1 - k0) / gib, (m1 - m0) / gib


ap = argparse.ArgumentParser()
ap.add_argument("servers", help="JSON: name -> [url, [pids]]")
ap.add_argument("--streams", default="1,8")
ap.add_argument("--rounds", type=int, default=2)
ap.add_argument("--secs", type=float, default=4.0)
ap.add_argument("--json", help="write the last round's figures here")
a = ap.parse_args()
servers = json.loads(a.servers)
for rnd in range(1, a.rounds + 1):
    last = {name: {} for name in servers}
    for streams in map(int, a.streams.split(",")):
        for name, (url, pids) in servers.items():
            mb, per_gib, curl_gib, machine_gib = run(url, pids, streams, a.secs)
            last[name][streams] = {"mb_s": mb, "cpu_s_per_gib": per_gib, "client_cpu_s_per_gib": curl_gib,
                                   "machine_cpu_s_per_gib": machine_gib}
            print(f"round {rnd} streams {streams} {name}: {mb:.0f} MB/s, {per_gib:.3f} CPU s/GiB "
                  f"(curl {curl_gib:.3f}, the machine {machine_gib:.3f})", flush=True)
if a.json:
    with open(a.json, "w") as f:
        json.dump(last, f, indent=1)
