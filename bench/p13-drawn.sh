#!/usr/bin/env bash
# P13 over drawn shapes: seeds FIRST..LAST in turn, each shape once, none skipped, every
# JSON line appended to OUT; then the distribution (p13_report.py) and its plot.
#   bench/p13-drawn.sh FIRST LAST OUT.jsonl [POLICIES]
# Runs from the repository root with the tests' venv (./tests/run.sh makes it) and the
# release build; a shape that fails is recorded as failed and the run goes on.
set -uo pipefail
cd "$(dirname "$0")"
first=$1 last=$2 out=$(realpath -m "$3") policies=${4:-planner,look-ahead,never-evict}
py=../tests/.venv/bin/python
export PATH="$PWD/../tests/.venv/bin:$PATH"
for seed in $(seq "$first" "$last"); do
  # Between shapes, a run can be held (touch /tmp/p13.hold; rm it to go on).
  while [ -e /tmp/p13.hold ]; do sleep 5; done
  root=$(mktemp -d)
  echo "== seed $seed  $(date -u +%H:%M:%S)"
  "$py" p13.py "$root" ../target/release/granary --draw "$seed" --epochs 2 \
    --policies "$policies" --out "$out" | tail -8 \
    || echo "{\"draw\": $seed, \"failed\": true}" >> "$out"
  rm -rf "$root"
done
"$py" p13_report.py "$out" --svg "${out%.jsonl}.svg"
