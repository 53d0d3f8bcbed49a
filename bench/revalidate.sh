#!/usr/bin/env bash
# What --revalidate-after costs a hit: P1 (one 256 MiB object, 1 and 8 streams) and P2
# (1000 objects of 100 KiB, 32 connections) against two nodes over the same files, one
# with the default (never) and one with --revalidate-after 1s, interleaved, ROUNDS
# rounds; MB/s or req/s, the node's CPU seconds per GiB, and the checks it made.
#
#   bench/revalidate.sh [ROUNDS] [DURATION]        # defaults: 3 rounds of 5s
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}; dur=${2:-5s}
cargo build --release --bin granary --bin granary-bench >/dev/null
granary=target/release/granary; bench=target/release/granary-bench
work=$(mktemp -d); out=target/revalidate; mkdir -p "$out"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"' EXIT
mkdir -p "$work/origin/bench/small"
head -c $((256 << 20)) /dev/urandom >"$work/origin/bench/big.bin"
for i in $(seq 0 999); do head -c $((100 << 10)) /dev/urandom >"$work/origin/bench/small/$(printf %06d "$i")"; done
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
start() { # NAME FLAGS...
  local name=$1 p; shift; p=$(port)
  "$granary" serve --listen "127.0.0.1:$p" --data-dir "$work/$name" --backend "fs:$work/origin" "$@" \
    >"$out/$name.log" 2>&1 &
  pids+=("$!"); echo "$! http://127.0.0.1:$p"
}
read -r never_pid never_url < <(start never)
read -r rv_pid rv_url < <(start rv1s --revalidate-after 1s)
sleep 1
for url in "$never_url" "$rv_url"; do
  "$bench" run --endpoint "$url" --bucket bench --prefix big.bin --epochs 1 --workers 1 --progress false >/dev/null
  "$bench" run --endpoint "$url" --bucket bench --prefix small/ --epochs 1 --workers 8 --progress false >/dev/null
done
sleep 1
checks() { curl -s "$1/_granary/stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["hit_checks"])'; }
field() { python3 -c "import json,sys; r=json.load(open('$1')); print(r$2)"; }
printf '| round | part | never | revalidate 1s | checks made |\n|---|---|---|---|---|\n'
for r in $(seq "$rounds"); do
  for part in p1-1 p1-8 p2; do
    row=""
    for side in never rv; do
      url=$never_url; pid=$never_pid
      [ $side = rv ] && { url=$rv_url; pid=$rv_pid; }
      before=$(checks "$url")
      j="$out/$part-$side-$r.json"
      case $part in
        p1-1) "$bench" get --endpoint "$url" --path /bench/big.bin --workers 1 --duration "$dur" --server-pid "$pid" --json "$j" --progress false >/dev/null ;;
        p1-8) "$bench" get --endpoint "$url" --path /bench/big.bin --workers 8 --duration "$dur" --server-pid "$pid" --json "$j" --progress false >/dev/null ;;
        p2) "$bench" run --endpoint "$url" --bucket bench --prefix small/ --objects 1000 --object-size 100KiB --workers 32 --duration "$dur" --epoch-stats false --server-pid "$pid" --json "$j" --progress false >/dev/null ;;
      esac
      made=$(( $(checks "$url") - before ))
      row="$row | $(python3 - "$j" "$part" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
rate = f"{r['requests_per_s']:.0f} req/s" if sys.argv[2] == "p2" else f"{r['throughput_mb_s']:.0f} MB/s"
print(f"{rate}, {r['server_cpu']['cpu_s_per_gib']:.3f} CPU s/GiB")
PY
)"
      [ $side = rv ] && row="$row | $made"
    done
    echo "| $r | $part$row |"
  done
done
