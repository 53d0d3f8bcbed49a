#!/usr/bin/env bash
# PUT throughput and latency through a 3-member cluster (static --peer list), on tmpfs so
# that the disk does not drown what the cluster adds: 8 workers write 64 KiB objects
# through one member for 6 s, twice. Give two binaries to compare builds, alternating.
#
# Usage: bench/cluster-writes.sh [--rounds N] GRANARY_BIN [GRANARY_BIN_2]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=3
if [ "${1:-}" = "--rounds" ]; then rounds=$2; shift 2; fi
[ $# -ge 1 ] || { echo "usage: $0 [--rounds N] GRANARY_BIN [GRANARY_BIN_2]" >&2; exit 2; }
bins=("$@")
cargo build --release -q -p granary-bench
bench=target/release/granary-bench
base=${TMPDIR_FAST:-/dev/shm}/granary-cluster-writes
ports=(7501 7502 7503)
ids=(a b c)
peers=()
for i in 0 1 2; do peers+=(--peer "${ids[$i]}=http://127.0.0.1:${ports[$i]}"); done

one() {
  local bin=$1 out=$base/run pids=()
  rm -rf "$out"; mkdir -p "$out/origin"
  for i in 0 1 2; do
    "$bin" serve --listen "127.0.0.1:${ports[$i]}" --node-id "${ids[$i]}" \
      --data-dir "$out/${ids[$i]}" --backend "fs:$out/origin" --cache-capacity 4GiB \
      "${peers[@]}" >"$out/${ids[$i]}.log" 2>&1 &
    pids+=($!)
  done
  for p in "${ports[@]}"; do
    for _ in $(seq 200); do curl -sf "http://127.0.0.1:$p/_granary/health" >/dev/null && break; sleep 0.1; done
  done
  curl -sf -X PUT http://127.0.0.1:7501/scratch >/dev/null
  for _ in 1 2; do
    "$bench" run --endpoint http://127.0.0.1:7501 --bucket scratch --objects 500 \
      --object-size 64KiB --pct-put 100 --duration 6s --workers 8 | grep -E 'req/s|latency ms'
  done
  kill "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true
  rm -rf "$out"
}

for r in $(seq "$rounds"); do
  for b in "${bins[@]}"; do
    echo "== round $r: $b"
    one "$b"
  done
done
