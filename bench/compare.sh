#!/usr/bin/env bash
# Granary side by side with the physical ceiling here, every figure taken by granary-bench
# in one run, pairs interleaved (A/B/A/B) so drift hits both sides alike:
#   P1  warm GET of one 256 MiB object, 1 and 8 streams, read by granary-bench and by curl
#       (a process per read): Granary (default, --sendfile true, --verify-reads false) /
#       nginx at its best (page cache; sendfile on, off, and with aio threads, each figure
#       taking nginx's best), MB/s, server CPU s per GiB (/proc) and the reader's
#   P2  warm GET of 100 KiB objects, 32 connections, req/s: Granary / nginx's best
#       + the bench's own ceiling: granary-bench / wrk, both against nginx, same URL
#   P3  cold GET through Granary (S3 backend) / direct GET from the same S3 server (moto),
#       and through nginx in front of the same moto (proxy_cache, and no cache): MB/s,
#       server CPU s per GiB, first byte
#   P4  shuffled epochs over D = 2 x C: never-evict against LRU, hit ratio and backend bytes
#   P5  3 nodes of D/3 each (one cache of D) against 1 node of D/3: backend bytes per epoch
#   P6  the node's own memory (RssAnon, sampled; and peak RSS) while serving 8 x 1 GiB
#       streams (cold, then warm)
#   P8  256 random samples out of tar shards: one GetBatch / 256 single archpath GETs
#   P9  a first epoch (S3 backend, moto) after a prefetch / the same epoch cold
#   P11 the 256 MiB object on the node's machine: a local read (descriptor + mmap) / HTTP
#       over the Unix socket / HTTP over TCP loopback / read(2) of the file (ceiling),
#       MB/s and CPU s per GiB, with --verify-reads true (default) and false
#   P12 PyTorch loaders over 32 x 8 MiB shards through one node (bench/p12.py):
#       granary.ShardDataset / WebDataset / s3torchconnector / boto3 / the DataLoader's
#       own ceiling / curl, with 0, 1 and 4 workers: samples/s, CPU s per GiB (client and
#       node); resume mid-epoch against restart-and-skip
#
# Usage: bench/compare.sh [--quick] [--rounds N] [--duration 5s] [--out DIR] [--only p1,p2,p8]
#                         [--veth [--veth-rate 10gbit]]
# --only runs the named parts alone (P1 and P2 run together, with the bench ceiling).
# --veth runs P1 and P2 (alone) with the readers on another host as the kernel sees it:
# in a network namespace over a veth pair (bench/netns.sh; root), the servers listening
# on the pair's address; --veth-rate shapes the pair (tc). The node then sees a remote
# reader, which `--sendfile auto` sends files to.
# Installs what it lacks (nginx and wrk from Debian with apt-get, moto from PyPI into
# tests/.venv), builds the release binaries, lays the same files out for every server,
# and prints the table; OUT (default target/compare) keeps results.md, results.json and
# every run's JSON report and SVG plot.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

rounds=3
dur=5s
out="$root/target/compare"
quick=0
only=""
veth=0
veth_rate=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1; rounds=1; dur=2s ;;
    --rounds) rounds=$2; shift ;;
    --duration) dur=$2; shift ;;
    --out) out=$2; shift ;;
    --only) only=",$2,"; shift ;;
    --veth) veth=1 ;;
    --veth-rate) veth_rate=$2; shift ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/!p}' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done

# Sizes of each part (the quick mode only checks that the script works end to end).
if [ "$quick" = 1 ]; then
  big=64MiB; small_n=200; p3_n=4; p3_size=4MiB; p4_n=40; p5_n=42; p6_size=64MiB
  p8_shards=4; p9_n=8
else
  # P3 reads 1 GiB: CPU time comes in 10 ms ticks, 0.01 s per GiB read.
  big=256MiB; small_n=1000; p3_n=64; p3_size=16MiB; p4_n=200; p5_n=210; p6_size=1GiB
  p8_shards=32; p9_n=64
fi

log() { printf '\n== %s\n' "$*" >&2; }
# Whether part $1 (p1 … p12) runs: all of them unless --only names some.
want() { [ -z "$only" ] || [[ "$only" == *",$1,"* ]] || { [ "$1" = p1 ] && [[ "$only" == *",p2,"* ]]; }; }

# --- what the run needs -------------------------------------------------------------
need_apt=()
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need_apt+=(nginx-light)
command -v wrk >/dev/null 2>&1 || need_apt+=(wrk)
if [ ${#need_apt[@]} -gt 0 ]; then
  log "installing ${need_apt[*]} (apt-get)"
  sudo_=""; [ "$(id -u)" = 0 ] || sudo_=sudo
  $sudo_ apt-get update -qq
  $sudo_ apt-get install -y -qq "${need_apt[@]}" >/dev/null ||
    $sudo_ apt-get install -y -qq nginx wrk >/dev/null
fi
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)

venv="$root/tests/.venv"
if [ ! -x "$venv/bin/moto_server" ]; then
  log "installing moto into $venv"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check 'moto[server]'
fi

log "building granary and granary-bench (release)"
cargo build --release -q -p granary-server -p granary-bench
# GRANARY_BIN runs another build of the node (a before-and-after comparison).
granary="${GRANARY_BIN:-$root/target/release/granary}"
bench="$root/target/release/granary-bench"

mkdir -p "$out"
rm -f "$out"/*.json "$out"/*.svg "$out"/*.log "$out"/results.md
work=$(mktemp -d /tmp/granary-compare.XXXXXX)
chmod 755 "$work"  # nginx workers run as another user
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
  [ "$veth" = 0 ] || netns_down
}
trap cleanup EXIT
# Where servers listen, and what readers run in: the loopback and this namespace, or
# (--veth) the pair's address here and the readers' namespace across it.
addr=127.0.0.1
in_ns=()
if [ "$veth" = 1 ]; then
  [ -z "$only" ] || [[ "$only" == ",p1," || "$only" == ",p2," || "$only" == ",p1,p2," ]] ||
    { echo "--veth runs P1 and P2 only" >&2; exit 2; }
  only=",p1,"
  # shellcheck source=bench/netns.sh
  source bench/netns.sh
  netns_up "$veth_rate"
  addr=$NETNS_HOST_IP
  in_ns=(ip netns exec "$NETNS_NAME")
  log "readers in $NETNS_NAME over veth, servers on $addr${veth_rate:+, the pair shaped to $veth_rate}"
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() { # URL
  for _ in $(seq 200); do
    curl -s -o /dev/null "$1" && return 0
    sleep 0.05
  done
  echo "nothing answered at $1" >&2; return 1
}
# Starts granary with extra flags; sets $g_pid and $g_url.
start_granary() { # NAME FLAGS...
  local name=$1; shift
  local port; port=$(free_port)
  "$granary" serve --listen "$addr:$port" --data-dir "$work/$name" "$@" \
    >"$out/$name.log" 2>&1 &
  g_pid=$!; pids+=("$g_pid")
  g_url="http://$addr:$port"
  wait_http "$g_url/_granary/health"
}
stop_granary() { kill "$g_pid"; wait "$g_pid" 2>/dev/null || true; }
# Busy CPU seconds of the whole machine so far: every process and kernel thread (the
# flusher's writeback, softirqs), not idle, iowait or steal.
machine_busy() { awk '/^cpu / {printf "%.2f\n", ($2 + $3 + $4 + $7 + $8) / 100}' /proc/stat; }
b() { # granary-bench ARGS, quiet unless it fails
  local o
  if ! o=$("${in_ns[@]}" "$bench" "$@" --progress false 2>&1); then
    printf 'granary-bench %s failed:\n%s\n' "$*" "$o" >&2
    return 1
  fi
}

# --- the same files for every server ----------------------------------------------
log "laying out the data in $work/origin"
mkdir -p "$work/origin/bench/small" "$work/origin/bench/p4" "$work/origin/bench/p5" \
  "$work/origin/bench/p6"
P8_SHARDS=$p8_shards python3 - "$work/origin/bench" "$big" "$small_n" "$p4_n" "$p6_size" "$p5_n" <<'EOF'
import os, sys
root, big, small_n, p4_n, p6 = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
p5_n = int(sys.argv[6])
def size(s):
    for u, m in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if s.endswith(u):
            return int(s[: -len(u)]) * m
    return int(s)
def write(path, n):
    with open(path, "wb") as f:
        left = n
        while left:
            k = min(left, 8 << 20)
            f.write(os.urandom(k))
            left -= k
write(f"{root}/big.bin", size(big))
for i in range(small_n):
    write(f"{root}/small/{i:06}", 100 << 10)
for i in range(p4_n):
    write(f"{root}/p4/{i:06}", 1 << 20)
for i in range(p5_n):
    write(f"{root}/p5/shard-{i:06}.tar", 1 << 20)
# P8: WebDataset-like shards, 64 samples each (a 4-40 KiB .jpg and a .cls).
import io, random, tarfile
os.makedirs(f"{root}/p8", exist_ok=True)
rnd = random.Random(8)
for s in range(int(os.environ["P8_SHARDS"])):
    with tarfile.open(f"{root}/p8/shard-{s:06d}.tar", "w", format=tarfile.GNU_FORMAT) as t:
        for i in range(64):
            for ext, data in (("jpg", rnd.randbytes(rnd.randint(4 << 10, 40 << 10))),
                              ("cls", str(i % 10).encode())):
                ti = tarfile.TarInfo(f"{s:06d}{i:04d}.{ext}")
                ti.size, ti.mtime = len(data), 1700000000
                t.addfile(ti, io.BytesIO(data))
# Eight keys, one inode: the streams are distinct objects to Granary, and generating
# them costs one file.
write(f"{root}/p6/000000", size(p6))
for i in range(1, 8):
    os.link(f"{root}/p6/000000", f"{root}/p6/{i:06}")
EOF

machine="$(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), kernel $(uname -r)"
[ "$veth" = 0 ] || machine="$machine; readers in a network namespace over veth${veth_rate:+ shaped to $veth_rate}"

# An nginx configuration: 2 workers, pid and errors in DIR, no access log, BODY in http.
nginx_conf() { # DIR BODY
  cat <<EOF
worker_processes 2;
pid $1/nginx.pid;
error_log $1/nginx.err;
events { worker_connections 4096; }
http {
  access_log off;
$2
}
EOF
}

# --- nginx: the page-cache ceiling, at its best ----------------------------------------
# Three configurations over the same files, each figure taking nginx's best of them:
#   nginx      sendfile on (the kernel sends the page cache's pages), tcp_nopush
#   nginx_off  sendfile off: read(2) into 1 MiB output buffers, then write(2)
#   nginx_aio  sendfile on with `aio threads` (sendfile and reads on a thread pool)
# every one with open_file_cache (no open/fstat/close per request) and no access log.
# Starts an nginx serving $work/origin with DIRECTIVES; sets $st_url and $st_pids.
start_nginx_static() { # NAME DIRECTIVES
  local dir="$work/$1" port; mkdir -p "$dir"; port=$(free_port)
  nginx_conf "$dir" "
  $2
  open_file_cache max=10000 inactive=60s;
  open_file_cache_valid 60s;
  keepalive_requests 1000000;
  server { listen $addr:$port; root $work/origin; }" >"$dir/nginx.conf"
  "$nginx_bin" -c "$dir/nginx.conf"
  pids+=("$(cat "$dir/nginx.pid")")
  st_url="http://$addr:$port"
  wait_http "$st_url/bench/big.bin"
  # nginx's CPU is its master's and its workers'.
  st_pids="$(cat "$dir/nginx.pid"),$(pgrep -P "$(cat "$dir/nginx.pid")" | paste -sd,)"
}
start_nginx_static ng-on "sendfile on; tcp_nopush on;"
nginx_url=$st_url; nginx_pids=$st_pids
nginx_sides=(nginx)
if want p1; then
  start_nginx_static ng-off "sendfile off; output_buffers 2 1m;"
  nginx_off_url=$st_url; nginx_off_pids=$st_pids
  start_nginx_static ng-aio "sendfile on; tcp_nopush on; aio threads;"
  nginx_aio_url=$st_url; nginx_aio_pids=$st_pids
  nginx_sides=(nginx nginx_off nginx_aio)
fi
# Sets $url and $spid for SIDE (an nginx or a node started below).
side_of() { # SIDE
  case $1 in
    nginx) url=$nginx_url; spid=$nginx_pids ;;
    nginx_off) url=$nginx_off_url; spid=$nginx_off_pids ;;
    nginx_aio) url=$nginx_aio_url; spid=$nginx_aio_pids ;;
    granary) url=$fs_url; spid=$fs_pid ;;
    granary_sf) url=$sf_url; spid=$sf_pid ;;
    granary_nv) url=$nv_url; spid=$nv_pid ;;
  esac
}

if want p1; then
# --- Granary over the same directory, warmed ---------------------------------------
start_granary g-fs --backend "fs:$work/origin"
fs_pid=$g_pid; fs_url=$g_url
log "warming Granary's cache and the page cache"
# The first read of the big object is a cold fill from the fs backend: its CPU is recorded.
b run --endpoint "$fs_url" --bucket bench --prefix big.bin --epochs 1 --workers 1 \
  --server-pid "$fs_pid" --json "$out/fill-fs.json"
b run --endpoint "$fs_url" --bucket bench --prefix small/ --epochs 1 --workers 8
b run --endpoint "$nginx_url" --bucket bench --prefix small/ --objects "$small_n" --object-size 100KiB --epochs 1 --workers 8
b get --endpoint "$nginx_url" --path /bench/big.bin --duration 1s --workers 1
b get --endpoint "$fs_url" --path /bench/big.bin --duration 1s --workers 1
# A second node that sends every hit with sendfile(2), readers on this machine too (the
# default sends the copy to them), and a third that checks no block after an entry's
# first whole read.
start_granary g-fs-sf --backend "fs:$work/origin" --sendfile true
sf_pid=$g_pid; sf_url=$g_url
b run --endpoint "$sf_url" --bucket bench --prefix big.bin --epochs 1 --workers 1
b get --endpoint "$sf_url" --path /bench/big.bin --duration 1s --workers 1
start_granary g-fs-nv --backend "fs:$work/origin" --verify-reads false
nv_pid=$g_pid; nv_url=$g_url
b run --endpoint "$nv_url" --bucket bench --prefix big.bin --epochs 1 --workers 1
b get --endpoint "$nv_url" --path /bench/big.bin --duration 1s --workers 1
for side in nginx_off nginx_aio; do
  side_of $side
  b get --endpoint "$url" --path /bench/big.bin --duration 1s --workers 1
done
p1_sides=("${nginx_sides[@]}" granary granary_sf granary_nv)
# curl's sides: the same servers, as JSON for bench/curl_cpu.py.
curl_sides=$(for side in "${p1_sides[@]}"; do
  side_of $side; printf '"%s": ["%s/bench/big.bin", [%s]],' "$side" "$url" "$spid"
done)
curl_sides="{${curl_sides%,}}"

# --- P1, P2 and the bench's ceiling, interleaved -----------------------------------
for r in $(seq "$rounds"); do
  log "round $r/$rounds: P1 (256 MiB object, granary-bench and curl), P2 (100 KiB objects), bench ceiling"
  for streams in 1 8; do
    for side in "${p1_sides[@]}"; do
      side_of $side
      # The machine's busy CPU too: over loopback the kernel bills a socket's receive
      # work to whichever side runs it, so the server's own figure moves with that.
      t0=$(machine_busy)
      b get --endpoint "$url" --path /bench/big.bin --workers "$streams" --duration "$dur" \
        --server-pid "$spid" --json "$out/p1-$streams-$side-$r.json"
      t1=$(machine_busy)
      awk -v a="$t0" -v b="$t1" 'BEGIN {printf "{\"machine_cpu_s\": %.2f}\n", b - a}' \
        >"$out/p1-$streams-$side-$r.machine.json"
    done
  done
  # The same object read by curl, a process per read (what a shell user runs).
  "${in_ns[@]}" python3 bench/curl_cpu.py "$curl_sides" --streams 1,8 --rounds 1 --secs "${dur%s}" \
    --json "$out/p1-curl-$r.json" >/dev/null
  for side in "${nginx_sides[@]}" granary; do
    side_of $side
    b run --endpoint "$url" --bucket bench --prefix small/ --objects "$small_n" \
      --object-size 100KiB --workers 32 --duration "$dur" --epoch-stats false --server-pid "$spid" \
      --json "$out/p2-$side-$r.json" --plot "$out/p2-$side-$r.svg"
  done
  wrk -t2 -c32 -d"$dur" "$nginx_url/bench/small/000000" >"$out/wrk-nginx-$r.log"
  b get --endpoint "$nginx_url" --path /bench/small/000000 --workers 32 --duration "$dur" \
    --json "$out/ceiling-bench-$r.json"
  wrk -t2 -c32 -d"$dur" "$fs_url/bench/small/000000" >"$out/wrk-granary-$r.log"
done
stop_granary
g_pid=$sf_pid; stop_granary
g_pid=$fs_pid; stop_granary

fi

if want p3 || want p9; then
moto_port=$(free_port)
"$venv/bin/moto_server" -H 127.0.0.1 -p "$moto_port" >"$out/moto.log" 2>&1 &
moto_pid=$!; pids+=($!)
moto_url="http://127.0.0.1:$moto_port"
wait_http "$moto_url/"
fi

if want p3; then
# --- P3: cold reads through Granary against the S3 server itself --------------------
# and through nginx in front of the same moto: as a caching proxy (proxy_cache, to disk)
# and as a proxy that keeps nothing, what any proxy's hop costs on this machine.
start_nginx_proxy() { # cache|cache_nosf|pass NAME; sets $ng_url, $ng_pids, $ng_dir
  local mode=$1 port cache="" sf="sendfile on; tcp_nopush on;"
  ng_dir="$work/$2"; mkdir -p "$ng_dir"
  port=$(free_port)
  [ "$mode" != pass ] && cache='proxy_cache c; proxy_cache_valid 200 1d; proxy_cache_key $uri;'
  # sendfile: a cached answer leaves from its cache file; without, from nginx's buffers
  # (the figures take the better of the two).
  [ "$mode" = cache_nosf ] && sf="sendfile off;"
  nginx_conf "$ng_dir" "
  $sf
  proxy_cache_path $ng_dir/cache keys_zone=c:10m max_size=100g;
  proxy_temp_path $ng_dir/tmp;
  server {
    listen 127.0.0.1:$port;
    location / {
      proxy_pass $moto_url;
      proxy_http_version 1.1;
      proxy_max_temp_file_size 0;
      proxy_buffers 16 256k; proxy_buffer_size 64k; proxy_busy_buffers_size 512k;
      $cache
    }
  }" >"$ng_dir/nginx.conf"
  "$nginx_bin" -c "$ng_dir/nginx.conf"
  pids+=("$(cat "$ng_dir/nginx.pid")")
  ng_url="http://127.0.0.1:$port"
  wait_http "$ng_url/"
  ng_pids="$(cat "$ng_dir/nginx.pid"),$(pgrep -P "$(cat "$ng_dir/nginx.pid")" | paste -sd,)"
}
stop_nginx_proxy() {
  local master; master=$(cat "$ng_dir/nginx.pid")
  kill "$master"
  while kill -0 "$master" 2>/dev/null; do sleep 0.05; done
  rm -rf "$ng_dir"
}
# Runs granary-bench ARGS for one P3 side, then writes back what it left dirty (`sync`),
# and records the machine's busy CPU over both in NAME.machine.json.
p3_side() { # NAME ARGS...
  local name=$1 t0 t1; shift
  sync; t0=$(machine_busy)
  b "$@"
  sync; t1=$(machine_busy)
  awk -v a="$t0" -v b="$t1" 'BEGIN {printf "{\"machine_cpu_s\": %.2f}\n", b - a}' \
    >"$out/$name.machine.json"
}
log "P3: moto, $p3_n x $p3_size objects"
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_REGION=us-east-1 \
  AWS_DEFAULT_REGION=us-east-1 AWS_EC2_METADATA_DISABLED=true
b run --endpoint "$moto_url" --bucket cold --objects "$p3_n" --object-size "$p3_size" \
  --pct-put 100 --epochs 1 --workers 4
for r in $(seq "$rounds"); do
  p3_side "p3-direct-$r" run --endpoint "$moto_url" --bucket cold --epochs 1 --workers 4 \
    --server-pid "$moto_pid" --json "$out/p3-direct-$r.json"
  start_granary "g-s3-$r" --backend s3 --s3-endpoint "$moto_url"
  AWS_ACCESS_KEY_ID= AWS_SECRET_ACCESS_KEY= \
    p3_side "p3-granary-$r" run --endpoint "$g_url" --bucket cold --epochs 1 --workers 4 \
    --server-pid "$g_pid" --json "$out/p3-granary-$r.json"
  stop_granary
  rm -rf "$work/g-s3-$r"
  for mode in cache cache_nosf pass; do
    start_nginx_proxy "$mode" "ng-$mode-$r"
    AWS_ACCESS_KEY_ID= AWS_SECRET_ACCESS_KEY= \
      p3_side "p3-nginx-$mode-$r" run --endpoint "$ng_url" --bucket cold --epochs 1 \
      --workers 4 --server-pid "$ng_pids" --json "$out/p3-nginx-$mode-$r.json"
    stop_nginx_proxy
  done
done
unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY

fi

if want p4; then
# --- P4: never-evict against LRU, D = 2 x C ----------------------------------------
log "P4: $p4_n x 1 MiB objects, cache of half of them, 3 shuffled epochs"
for policy in never-evict lru; do
  start_granary "g-$policy" --backend "fs:$work/origin" --cache-policy "$policy" \
    --cache-capacity "$((p4_n / 2))MiB"
  b run --endpoint "$g_url" --bucket bench --prefix p4/ --epochs 3 --workers 8 --seed 7 \
    --json "$out/p4-$policy.json"
  stop_granary
done

fi

if want p5; then
# --- P5: a cluster of 3 nodes of D/3 each ------------------------------------------
log "P5: $p5_n x 1 MiB objects; 3 nodes of D/3 each against 1 node of D/3; 3 epochs"
p5_cap="$((p5_n / 3))MiB"
ports=($(free_port) $(free_port) $(free_port))
peers=()
for i in 0 1 2; do peers+=(--peer "n$i=http://127.0.0.1:${ports[$i]}"); done
p5_pids=()
for i in 0 1 2; do
  "$granary" serve --listen "127.0.0.1:${ports[$i]}" --data-dir "$work/p5-n$i" \
    --backend "fs:$work/origin" --cache-capacity "$p5_cap" --node-id "n$i" "${peers[@]}" \
    >"$out/p5-n$i.log" 2>&1 &
  p5_pids+=($!); pids+=($!)
done
for i in 0 1 2; do wait_http "http://127.0.0.1:${ports[$i]}/_granary/health"; done
for _ in $(seq 100); do  # every node sees the other two
  up=0
  for i in 0 1 2; do
    up=$((up + $(curl -s "http://127.0.0.1:${ports[$i]}/_granary/cluster" | grep -o '"state":"up"' | wc -l)))
  done
  [ "$up" = 9 ] && break
  sleep 0.1
done
b run --endpoint "http://127.0.0.1:${ports[0]}" --bucket bench --prefix p5/ --epochs 3 \
  --workers 8 --seed 7 --json "$out/p5-cluster.json"
for i in 0 1 2; do curl -s "http://127.0.0.1:${ports[$i]}/_granary/stats" >"$out/p5-n$i-stats.json"; done
for p in "${p5_pids[@]}"; do kill "$p"; wait "$p" 2>/dev/null || true; done
start_granary g-p5-single --backend "fs:$work/origin" --cache-capacity "$p5_cap"
b run --endpoint "$g_url" --bucket bench --prefix p5/ --epochs 3 --workers 8 --seed 7 \
  --json "$out/p5-single.json"
stop_granary

fi

if want p8; then
# --- P8: GetBatch against single GETs ------------------------------------------------
log "P8: 256 random samples of $p8_shards shards: one GetBatch against 256 GETs"
start_granary g-p8 --backend "fs:$work/origin"
b batch --endpoint "$g_url" --bucket bench --prefix p8/ --samples 256 --rounds "$((rounds * 3))" \
  --workers 16 --json "$out/p8.json"
stop_granary

fi

if want p9; then
# --- P9: a first epoch after a prefetch against the same epoch cold (S3 backend) ------
log "P9: 2 x $p9_n x 1 MiB objects in moto; cold epoch against prefetched epoch"
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing
for half in p9a/ p9b/; do
  b run --endpoint "$moto_url" --bucket cold --prefix "$half" --objects "$p9_n" \
    --object-size 1MiB --pct-put 100 --epochs 1 --workers 4
done
for r in $(seq "$rounds"); do
  start_granary "g-p9-$r" --backend s3 --s3-endpoint "$moto_url"
  AWS_ACCESS_KEY_ID= AWS_SECRET_ACCESS_KEY= \
    b prefetch --endpoint "$g_url" --bucket cold --cold-prefix p9a/ --warm-prefix p9b/ \
    --workers 8 --json "$out/p9-$r.json"
  stop_granary
  rm -rf "$work/g-p9-$r"
done
unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY

fi

if want p11; then
# --- P11: delivery on the node's machine ---------------------------------------------
log "P11: the $big object read on the node's machine: local fd, Unix socket, TCP"
for v in true false; do
  start_granary "g-p11-$v" --backend "fs:$work/origin" --listen-unix "$work/g-p11-$v.sock" \
    --verify-reads "$v"
  b local --endpoint "$g_url" --socket "$work/g-p11-$v.sock" --bucket bench --key big.bin \
    --rounds "$((rounds * 4))" --direct "$work/origin/bench/big.bin" --json "$out/p11-$v.json"
  stop_granary
done

fi

if want p12; then
# --- P12: PyTorch data loaders, side by side ------------------------------------------
log "P12: ShardDataset / WebDataset / s3torchconnector / boto3 / curl"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  -r tests/python/requirements.txt 's3torchconnector>=1.5'
PATH="$venv/bin:$PATH" "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  --no-build-isolation ./client/python
if [ "$quick" = 1 ]; then p12_args=(--rounds 1 --shards 8); else p12_args=(--rounds 3 --shards 32); fi
GRANARY_BIN="$root/target/release/granary" PATH="$venv/bin:$PATH" \
  "$venv/bin/python" bench/p12.py "${p12_args[@]}" --workers 0,1,4 --out "$out" \
  >"$out/p12.md" 2>"$out/p12.log"

fi

if want p6; then
# --- P6: memory while serving 8 x 1 GiB streams ------------------------------------
log "P6: 8 x $p6_size streams, cold then warm"
start_granary g-p6 --backend "fs:$work/origin"
rss_start=$(awk '/VmRSS/ {print $2}' "/proc/$g_pid/status")
# The node's own memory (RssAnon), sampled: its RSS also counts the page-cache pages of
# the cache windows it keeps mapped between hits.
rm -f "$out/p6.done"
(peak=0; while [ ! -e "$out/p6.done" ] && kill -0 "$g_pid" 2>/dev/null; do
   a=$(awk '/RssAnon/ {print $2}' "/proc/$g_pid/status" 2>/dev/null)
   [ "${a:-0}" -gt "$peak" ] && peak=$a
   echo "RssAnon_peak: $peak" >"$out/p6-anon.txt"; sleep 0.05
 done) &
anon_watch=$!
b run --endpoint "$g_url" --bucket bench --prefix p6/ --epochs 2 --workers 8 \
  --json "$out/p6.json" --plot "$out/p6.svg"
touch "$out/p6.done"; wait "$anon_watch" || true
awk '/VmHWM|VmRSS/ {print $1, $2}' "/proc/$g_pid/status" >"$out/p6-rss.txt"
cat "$out/p6-anon.txt" >>"$out/p6-rss.txt"
echo "VmRSS_start: $rss_start" >>"$out/p6-rss.txt"
stop_granary
for f in "$work"/ng-*/nginx.pid; do kill "$(cat "$f")" 2>/dev/null || true; done

fi

# --- the table ------------------------------------------------------------------------
python3 - "$out" "$rounds" "$machine" "$dur" "$quick" <<'EOF' | tee "$out/results.md"
import json, re, statistics, sys
out, rounds, machine, dur, quick = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5] == "1"
R = range(1, rounds + 1)
def j(name):
    with open(f"{out}/{name}.json") as f:
        return json.load(f)
med = statistics.median
rows, res = [], {"machine": machine, "rounds": rounds, "duration": dur, "quick": quick}

def field_of(doc, field):
    for part in field.split("."):
        doc = doc[part] if doc is not None else None
    return doc if doc is not None else float("nan")

def pair(key, label, a, b, field, unit, fmt="{:.0f}"):
    va = [field_of(j(a.format(r=r)), field) for r in R]
    vb = [field_of(j(b.format(r=r)), field) for r in R]
    ratios = [x / y if y else float("nan") for x, y in zip(va, vb)]
    res[key] = {"granary": va, "reference": vb, "ratios": ratios, "ratio": med(ratios)}
    rows.append((label, " / ".join(fmt.format(x) for x in va) + f" {unit}",
                 " / ".join(fmt.format(x) for x in vb) + f" {unit}",
                 f"**{med(ratios):.2f}**"))

import os
def have(name):
    return os.path.exists(f"{out}/{name}.json")
NGINX = [n for n in ("nginx", "nginx_off", "nginx_aio") if have(f"p1-1-{n}-1")]
NGINX_WHAT = {"nginx": "sendfile on", "nginx_off": "sendfile off", "nginx_aio": "sendfile, aio threads"}
import functools
@functools.lru_cache(maxsize=None)
def figures(name):
    """A run's report (read once), with the machine's busy CPU per GiB beside it where
    the run recorded it."""
    doc = j(name)
    if have(f"{name}.machine"):
        doc["machine_s_per_gib"] = j(f"{name}.machine")["machine_cpu_s"] / (doc["bytes_read"] / 2**30)
    return doc

def runs(pattern, field):
    """A side's FIELD in each round, from the reports named PATTERN (with {s} and {r})."""
    return lambda side: [field_of(figures(pattern.format(s=side, r=r)), field) for r in R]

def against_best(key, label, side, values, unit, lower, fmt="{:.0f}"):
    """SIDE's figure (VALUES(side): one per round) against nginx's best configuration
    for the same figure: each row takes nginx at its best for that row."""
    va, every = values(side), {n: values(n) for n in NGINX}
    name = (min if lower else max)(NGINX, key=lambda n: med(every[n]))
    vb = every[name]
    ratios = [x / y if y else float("nan") for x, y in zip(va, vb)]
    res[key] = {"granary": va, "reference": vb, "nginx": name, "ratios": ratios, "ratio": med(ratios),
                "every_nginx": every}
    rows.append((f"{label} [nginx {NGINX_WHAT[name]}]", " / ".join(fmt.format(x) for x in va) + f" {unit}",
                 " / ".join(fmt.format(x) for x in vb) + f" {unit}", f"**{med(ratios):.2f}**"))

if have("p1-1-granary-1"):
    cpu = "server_cpu.cpu_s_per_gib"
    sides = [("granary", ""), ("granary_sf", ", --sendfile true"), ("granary_nv", ", --verify-reads false")]
    for side, what in sides:
        if not have(f"p1-1-{side}-1"):
            continue
        suffix = side.removeprefix("granary")
        for streams in (1, 8):
            n = f"{streams} stream{'s' if streams > 1 else ''}"
            pattern = f"p1-{streams}-{{s}}-{{r}}"
            against_best(f"p1_{streams}{suffix}", f"P1 warm GET 256 MiB, {n}{what} (MB/s)", side,
                         runs(pattern, "read_throughput_mb_s"), "MB/s", False)
            against_best(f"p1_{streams}{suffix}_cpu", f"P1 {n}{what}, server CPU s/GiB (lower is better)",
                         side, runs(pattern, cpu), "s", True, "{:.3f}")
            against_best(f"p1_{streams}{suffix}_client_cpu", f"P1 {n}{what}, the bench's CPU s/GiB (reader)",
                         side, runs(pattern, "client_cpu.cpu_s_per_gib"), "s", True, "{:.3f}")
            if have(f"p1-{streams}-{side}-1.machine"):
                against_best(f"p1_{streams}{suffix}_machine_cpu",
                             f"P1 {n}{what}, the machine's CPU s/GiB (server, reader, kernel)",
                             side, runs(pattern, "machine_s_per_gib"), "s", True, "{:.3f}")
    against_best("p2", "P2 warm GET 100 KiB, 32 conns (req/s)", "granary", runs("p2-{s}-{r}", "requests_per_s"),
                 "req/s", False)
    against_best("p2_cpu", "P2 100 KiB, server CPU s/GiB (lower is better)", "granary", runs("p2-{s}-{r}", cpu),
                 "s", True, "{:.3f}")
if have("p1-curl-1"):
    # curl, a process per read: the same servers, its own files ({side: {streams: figures}}).
    curl = {r: j(f"p1-curl-{r}") for r in R}
    for side, what in (("granary", ""), ("granary_sf", ", --sendfile true")):
        suffix = side.removeprefix("granary")
        for streams in ("1", "8"):
            n = f"{streams} stream{'s' if streams != '1' else ''}"
            for field, lab, lower, fmt, unit in (("mb_s", "MB/s", False, "{:.0f}", "MB/s"),
                                                 ("cpu_s_per_gib", "server CPU s/GiB", True, "{:.3f}", "s"),
                                                 ("client_cpu_s_per_gib", "curl's CPU s/GiB", True, "{:.3f}", "s"),
                                                 ("machine_cpu_s_per_gib", "the machine's CPU s/GiB", True, "{:.3f}", "s")):
                against_best(f"p1_curl_{streams}{suffix}_{field}", f"P1 curl (a process per read), {n}{what}, {lab}",
                             side, lambda x: [curl[r][x][streams][field] for r in R], unit, lower, fmt)
if have("fill-fs"):
    f = j("fill-fs")
    res["fill_fs_cpu_s_per_gib"] = field_of(f, "server_cpu.cpu_s_per_gib")
    rows.append(("Cold fill from the fs backend, 256 MiB: node CPU s/GiB",
                 f"{res['fill_fs_cpu_s_per_gib']:.3f} s at {f['read_throughput_mb_s']:.0f} MB/s", "—", "—"))
if have("p3-granary-1"):
    pair("p3_mb", "P3 cold GET via S3 backend (MB/s)", "p3-granary-{r}", "p3-direct-{r}", "read_throughput_mb_s", "MB/s")
    pair("p3_cpu", "P3 cold GET, node / moto CPU s/GiB", "p3-granary-{r}", "p3-direct-{r}", "server_cpu.cpu_s_per_gib", "s", "{:.3f}")
    ttfb_g = [j(f"p3-granary-{r}")["ttfb_us"]["p50"] / 1e3 for r in R]
    ttfb_d = [j(f"p3-direct-{r}")["ttfb_us"]["p50"] / 1e3 for r in R]
    res["p3_ttfb_ms"] = {"granary": ttfb_g, "reference": ttfb_d, "ratio": med(ttfb_g) / med(ttfb_d)}
    rows.append(("P3 cold GET, first byte p50 (ms)", " / ".join(f"{x:.1f}" for x in ttfb_g) + " ms",
                 " / ".join(f"{x:.1f}" for x in ttfb_d) + " ms", f"{med(ttfb_g) / med(ttfb_d):.2f} (lower is better)"))
    # nginx in front of the same moto: a caching proxy, and one that keeps nothing.
    for mode, what in (("cache", "nginx proxy_cache"), ("pass", "nginx proxy, no cache")):
        if not have(f"p3-nginx-{mode}-1"):
            continue
        pair(f"p3_nginx_{mode}_mb", f"P3 {what} / moto directly (MB/s)", f"p3-nginx-{mode}-{{r}}",
             "p3-direct-{r}", "read_throughput_mb_s", "MB/s")
        pair(f"p3_nginx_{mode}_cpu", f"P3 {what}, nginx / moto CPU s/GiB", f"p3-nginx-{mode}-{{r}}",
             "p3-direct-{r}", "server_cpu.cpu_s_per_gib", "s", "{:.3f}")
        t = [j(f"p3-nginx-{mode}-{r}")["ttfb_us"]["p50"] / 1e3 for r in R]
        res[f"p3_nginx_{mode}_ttfb_ms"] = {"nginx": t, "reference": ttfb_d, "ratio": med(t) / med(ttfb_d)}
        rows.append((f"P3 {what}, first byte p50 (ms)", " / ".join(f"{x:.1f}" for x in t) + " ms",
                     " / ".join(f"{x:.1f}" for x in ttfb_d) + " ms", f"{med(t) / med(ttfb_d):.2f} (lower is better)"))
    # proxy_cache at its best: with sendfile or without, whichever does better per figure.
    caches = [m for m in ("cache", "cache_nosf") if have(f"p3-nginx-{m}-1")]
    def best_cache(field, lower):
        v = {m: [field_of(j(f"p3-nginx-{m}-{r}"), field) for r in R] for m in caches}
        return (min if lower else max)(caches, key=lambda m: med(v[m]))
    for m in caches:
        sf = "with sendfile" if m == "cache" else "sendfile off"
        pair(f"p3_nginx_{m}_summary_mb", f"P3 nginx proxy_cache, {sf} (MB/s, / moto)", f"p3-nginx-{m}-{{r}}",
             "p3-direct-{r}", "read_throughput_mb_s", "MB/s")
    if caches:
        m = best_cache("read_throughput_mb_s", False)
        pair("p3_vs_nginx_cache_mb", f"P3 Granary / nginx proxy_cache at its best ({m}) (MB/s)", "p3-granary-{r}",
             f"p3-nginx-{m}-{{r}}", "read_throughput_mb_s", "MB/s")
        m = best_cache("server_cpu.cpu_s_per_gib", True)
        pair("p3_vs_nginx_cache_cpu", f"P3 Granary / nginx proxy_cache at its best ({m}), CPU s/GiB", "p3-granary-{r}",
             f"p3-nginx-{m}-{{r}}", "server_cpu.cpu_s_per_gib", "s", "{:.3f}")
    if have("p3-nginx-cache-1.machine"):
        # The whole machine's busy CPU over each side's pass and the `sync` after it, per
        # GiB: what a server leaves to kernel threads (nginx's writeback) counts too. Less
        # moto read directly's: what the proxy adds to the machine.
        def machine_s_per_gib(side, r):
            return j(f"{side}-{r}.machine")["machine_cpu_s"] / (j(f"{side}-{r}")["bytes_read"] / 2**30)
        g = [machine_s_per_gib("p3-granary", r) - machine_s_per_gib("p3-direct", r) for r in R]
        n = [machine_s_per_gib("p3-nginx-cache", r) - machine_s_per_gib("p3-direct", r) for r in R]
        ratios = [a / b if b > 0 else float("nan") for a, b in zip(g, n)]
        res["p3_vs_nginx_cache_machine_cpu"] = {"granary": g, "reference": n, "ratios": ratios,
                                                "ratio": med(ratios)}
        rows.append(("P3 Granary / nginx proxy_cache, CPU s/GiB added to the machine (writeback included)",
                     " / ".join(f"{x:.3f}" for x in g) + " s", " / ".join(f"{x:.3f}" for x in n) + " s",
                     f"**{med(ratios):.2f}**"))

def wrk_rps(path):
    m = re.search(r"Requests/sec:\s+([\d.]+)", open(path).read())
    return float(m.group(1)) if m else float("nan")
if have("ceiling-bench-1"):
    bench_rps = [j(f"ceiling-bench-{r}")["requests_per_s"] for r in R]
    wrk_n = [wrk_rps(f"{out}/wrk-nginx-{r}.log") for r in R]
    wrk_g = [wrk_rps(f"{out}/wrk-granary-{r}.log") for r in R]
    ceil = [x / y for x, y in zip(bench_rps, wrk_n)]
    res["bench_ceiling"] = {"bench_rps": bench_rps, "wrk_rps": wrk_n, "ratio": med(ceil), "wrk_granary_rps": wrk_g}
    rows.append(("bench ceiling: granary-bench / wrk vs nginx, 100 KiB, 32 conns (req/s)",
                 " / ".join(f"{x:.0f}" for x in bench_rps), " / ".join(f"{x:.0f}" for x in wrk_n),
                 f"**{med(ceil):.2f}**"))
    rows.append(("(wrk against Granary, same object, req/s)", " / ".join(f"{x:.0f}" for x in wrk_g),
                 "", f"{med(wrk_g) / med(wrk_n):.2f} of wrk vs nginx"))

print(f"# granary-bench comparison\n\nMachine: {machine}. Rounds: {rounds} (A/B interleaved), {dur} per run.\n")
print("| figure | Granary (each round) | reference (each round) | ratio (median) |")
print("|---|---|---|---|")
for r in rows:
    print("| " + " | ".join(r) + " |")

if have("p4-lru"):
    print("\nP4: shuffled epochs over D = 2 x C (same seed for both policies)\n")
    print("| policy | epoch | hit ratio | backend MB | MB/s |")
    print("|---|---|---|---|---|")
    res["p4"] = {}
    for policy in ("never-evict", "lru"):
        rep = j(f"p4-{policy}")
        res["p4"][policy] = []
        for e in rep["epochs"]:
            d = e.get("server_stats_delta") or {}
            be = d.get("bytes_from_backend", 0) / 1e6
            res["p4"][policy].append({"epoch": e["epoch"], "hit_ratio": e["hit_ratio"], "backend_mb": be})
            print(f"| {policy} | {e['epoch']} | {e['hit_ratio']:.3f} | {be:.1f} | {e['throughput_mb_s']:.0f} |")
if have("p5-single"):
    print("\nP5: 3 nodes of D/3 each (one cache of D) against 1 node of D/3, 3 shuffled epochs\n")
    print("| setup | epoch | hits | from peers | backend MB | peer MB | MB/s |")
    print("|---|---|---|---|---|---|---|")
    res["p5"] = {}
    for setup in ("cluster", "single"):
        rep = j(f"p5-{setup}")
        res["p5"][setup] = []
        for e in rep["epochs"]:
            d = e.get("server_stats_delta") or {}
            be = d.get("bytes_from_backend", 0) / 1e6
            pe = d.get("bytes_from_peers", 0) / 1e6
            c = e.get("cache") or {}
            n = sum(c.get(k, 0) for k in ("hit", "miss", "peer", "bypass")) or 1
            res["p5"][setup].append({"epoch": e["epoch"], "hit": c.get("hit", 0) / n,
                                     "peer": c.get("peer", 0) / n, "backend_mb": be, "peer_mb": pe})
            print(f"| {'3 nodes' if setup == 'cluster' else '1 node'} | {e['epoch']} | "
                  f"{c.get('hit', 0) / n:.3f} | {c.get('peer', 0) / n:.3f} | {be:.1f} | {pe:.1f} | "
                  f"{e['throughput_mb_s']:.0f} |")
    objs = []
    for i in range(3):
        with open(f"{out}/p5-n{i}-stats.json") as f:
            objs.append(json.load(f)["objects"])
    res["p5"]["objects_per_node"] = objs
    print(f"\nObjects cached per node: {objs}")
if have("p6"):
    rss = dict(l.split(":")[0:2] for l in open(f"{out}/p6-rss.txt").read().split("\n") if ":" in l)
    rss = {k.strip(): int(v.split()[0]) for k, v in rss.items()}
    p6 = j("p6")
    res["p6"] = {"vmhwm_kib": rss.get("VmHWM"), "rss_start_kib": rss.get("VmRSS_start"),
                 "rss_anon_peak_kib": rss.get("RssAnon_peak"),
                 "bytes_read": p6["bytes_read"],
                 "epochs_mb_s": [e["throughput_mb_s"] for e in p6["epochs"]]}
    print(f"\nP6: 8 streams of distinct objects, {p6['bytes_read'] / 2**30:.1f} GiB served "
          f"(epoch 1 cold at {p6['epochs'][0]['throughput_mb_s']:.0f} MB/s, epoch 2 warm at "
          f"{p6['epochs'][-1]['throughput_mb_s']:.0f} MB/s): the node's own memory (RssAnon, "
          f"sampled) at most **{rss.get('RssAnon_peak', 0) / 1024:.0f} MiB**; peak RSS (VmHWM, "
          f"with the page-cache pages of windows kept mapped) {rss.get('VmHWM', 0) / 1024:.0f} MiB, "
          f"{rss.get('VmRSS_start', 0) / 1024:.0f} MiB at start.")
if have("p8"):
    p8 = j("p8")
    res["p8"] = p8
    print(f"\nP8: 256 random samples (warm cache), {len(p8['rounds'])} rounds: one GetBatch "
          + " / ".join(f"{x['batch_s'] * 1e3:.0f}" for x in p8["rounds"]) + " ms; 256 sequential GETs "
          + " / ".join(f"{x['sequential_s'] * 1e3:.0f}" for x in p8["rounds"]) + " ms; 16 parallel GETs "
          + " / ".join(f"{x['parallel_s'] * 1e3:.0f}" for x in p8["rounds"]) + " ms. "
          f"Sequential / batch **{p8['sequential_over_batch']:.2f}**, parallel / batch "
          f"**{p8['parallel_over_batch']:.2f}** (medians).")
if have("p9-1"):
    p9 = [j(f"p9-{r}") for r in R]
    res["p9"] = p9
    print(f"\nP9: first epoch over {p9[0]['objects']} x 1 MiB (S3 backend, 8 workers): cold "
          + " / ".join(f"{x['cold_epoch_s']:.2f}" for x in p9) + " s; after a prefetch "
          + " / ".join(f"{x['warm_epoch_s']:.2f}" for x in p9) + " s (the prefetch itself "
          + " / ".join(f"{x['prefetch_s']:.2f}" for x in p9) + " s). Cold / prefetched "
          f"**{med([x['cold_over_warm'] for x in p9]):.2f}**; prefetch + epoch / cold "
          f"{med([x['prefetch_plus_epoch_over_cold'] for x in p9]):.2f}.")
if have("p11-true"):
    for v in ("true", "false"):
        p11 = j(f"p11-{v}")
        res[f"p11_verify_{v}"] = p11
        print(f"\nP11 (--verify-reads {v}): {p11['object_bytes'] >> 20} MiB on the node's machine, "
              f"{p11['rounds']} reads each: "
              + "; ".join(f"{w['name']} {w['mb_per_s_median']:.0f} MB/s, {w['total_cpu_s_per_gib']:.2f} CPU s/GiB"
                          for w in p11["ways"])
              + f". Local / TCP **{p11['local_over_tcp']:.2f}**, local / Unix HTTP "
              f"**{p11['local_over_unix']:.2f}**; CPU per GiB TCP / local **{p11['tcp_cpu_over_local']:.2f}**.")
if os.path.exists(f"{out}/p12.md"):
    res["p12"] = j("p12")
    print("\n" + open(f"{out}/p12.md").read().strip())
with open(f"{out}/results.json", "w") as f:
    json.dump(res, f, indent=2)
EOF
