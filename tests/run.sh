#!/usr/bin/env bash
# Every test of the project, in tiers that share one release build:
#   1. formatting and lints (cargo fmt; clippy -D warnings, run by the release build)
#   2. unit tests and Rust integration tests (real granary processes, aws-sdk-s3)
#   3. real-client tests in a venv this script creates (boto3, the AWS CLI, moto, pytest,
#      torch, and the granary package itself); the venv is made first, since Rust tests
#      start moto from it too
#   4. Ray: Ray Train and Ray Data against a real node (Ray installed into the same venv;
#      the tier skips, saying why, where Ray cannot be installed), cut at RAY_TIER_LIMIT
#   5. Ceph's S3 conformance suite (s3-tests, vendored) on the operations Granary serves
# Needs: a Rust toolchain, python3 with venv. Installs the Python packages it uses, and
# with apt-get: dnsmasq (Debian's dnsmasq-base) for the member-list-from-DNS test, and
# Debian's prometheus for the dashboard and alert-rule tests (they skip without it).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}

# Each step says when it began, so a slow run shows which tier took the time.
start=$(date +%s)
step() { printf '\n== %s  [+%ds]\n' "$*" "$(( $(date +%s) - start ))"; }
# Room on the disk, printed where the run's use of it grows (the build, the venv, tests).
room() { df -h --output=avail,target "$root" | tail -1 | awk '{print "disk: " $1 " free on " $2}'; }
room

# The lint tools, where a toolchain came without them.
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  rustup component add rustfmt clippy
fi

step "cargo fmt --check"
cargo fmt --all -- --check

# The API cannot reach below the node service: `granary-core` is its own crate and the
# node's fields are private. Inside that crate, the node service sits above the parts it
# is made of; this keeps them from reaching up to it.
step "inside granary-core, the node's parts do not import the node service"
up=$(cd server/core/src && grep -rlE 'crate::node\b' backend cache cluster io transform stats \
       archive.rs jobs.rs || true)
if [ -n "$up" ]; then
  printf 'imports pointing up to the node service, in server/core/src:\n%s\n' "$up"
  exit 1
fi

step "no two source files of a crate import each other (directly or round a loop)"
python3 tests/import_loops.py server/src server/core/src server/prep/src client/src \
  client/python/src proto/src bench/src tests/src

step "build (release, all targets), linted by clippy as it compiles (-D warnings)"
# Clippy's driver compiles the workspace's own crates and lints them in the same pass
# (what `cargo clippy` runs, but with code generated): the dependencies are compiled
# once, where a separate `cargo clippy` would check every one of them again (~5 min on
# 2 cores). Every cargo command below runs under the same wrapper, so each reuses this
# build; the client's cuda feature is linted where its tests are built.
export RUSTC_WORKSPACE_WRAPPER="${RUSTC_WORKSPACE_WRAPPER:-$(command -v clippy-driver)}"
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
cargo build --release --workspace --all-targets
export GRANARY_BIN="$root/target/release/granary"

step "fuzz targets: each run briefly over a copy of its corpus (longer runs: docs/reliability.md)"
fuzz_tmp=$(mktemp -d)
for t in fuzz/corpus/*/; do
  name=$(basename "$t")
  mkdir -p "$fuzz_tmp/$name"
  # Not coverage-instrumented in this build (cargo fuzz builds that): libFuzzer says so
  # and mutates blindly; a crash still fails the step.
  "target/release/$name" -runs=20000 -rss_limit_mb=2048 -artifact_prefix="$fuzz_tmp/" \
    "$fuzz_tmp/$name" "$t" 2>"$fuzz_tmp/$name.log" \
    || { tail -40 "$fuzz_tmp/$name.log"; exit 1; }
  grep -E '^Done [0-9]+ runs' "$fuzz_tmp/$name.log" | sed "s/^/$name: /"
done
rm -rf "$fuzz_tmp"

step "Python venv for the real clients (boto3, AWS CLI, moto)"
venv="$root/tests/.venv"
if [ ! -x "$venv/bin/python" ]; then
  # Debian's python3 without python3-venv: fall back to virtualenv from PyPI.
  python3 -m venv "$venv" 2>/dev/null || {
    rm -rf "$venv"
    python3 -m pip install --quiet --user virtualenv
    python3 -m virtualenv --quiet "$venv"
  }
fi
room
# No pip cache: every wheel would be kept twice on disk.
export PIP_NO_CACHE_DIR=1
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  -r tests/python/requirements.txt -r tests/s3-tests/requirements.txt
# torch and s3torchconnector (tests/python/requirements-torch.txt), without triton.
"$venv/bin/python" tests/python/install_torch.py
room
export PATH="$venv/bin:$PATH"
export MOTO_SERVER="$venv/bin/moto_server"

step "the granary Python package (client/python, built with maturin over the release build)"
# No build isolation: maturin comes from the venv, and cargo reuses the build above.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-build-isolation \
  ./client/python
"$venv/bin/python" -c 'import granary; print("granary", granary.__file__)'

step "a DNS server for the member-list tests (Debian's dnsmasq-base)"
if ! command -v dnsmasq >/dev/null 2>&1 && [ ! -x /usr/sbin/dnsmasq ]; then
  sudo_=""; [ "$(id -u)" = 0 ] || sudo_=sudo
  $sudo_ apt-get update -qq
  $sudo_ apt-get install -y -qq dnsmasq-base >/dev/null
fi

step "Prometheus for the dashboard and alert-rule tests (Debian's prometheus)"
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  sudo_=""; [ "$(id -u)" = 0 ] || sudo_=sudo
  # The package would start a service of its own: policy-rc.d keeps it from starting
  # (made here only where the machine has none, and removed after).
  made_policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo_ tee /usr/sbin/policy-rc.d >/dev/null
    $sudo_ chmod +x /usr/sbin/policy-rc.d
    made_policy=1
  fi
  { $sudo_ apt-get update -qq \
      && $sudo_ apt-get install -y -qq --no-install-recommends prometheus >/dev/null; } \
    || echo "prometheus could not be installed: the tests that need it skip"
  if [ -n "$made_policy" ]; then $sudo_ rm -f /usr/sbin/policy-rc.d; fi
fi

step "Rust unit and integration tests"
# A test that cannot run here (no O_DIRECT, no right to lock memory or mount a loop
# device) says why in this file, listed after the tier: skipped, never passed unseen.
export GRANARY_SKIPPED="$root/target/skipped-tests"
: > "$GRANARY_SKIPPED"
cargo test --release --workspace --no-fail-fast
if [ -s "$GRANARY_SKIPPED" ]; then
  echo "Rust tests skipped here, with the reason:"
  sed 's/^/  /' "$GRANARY_SKIPPED"
else
  echo "no Rust test skipped"
fi

step "client with the cuda feature, linted (its GPU tests skip without a device)"
cargo test --release -p granary-client --features cuda

step "Python real-client tests (boto3, AWS CLI, moto)"
"$venv/bin/python" -m pytest -q tests/python --ignore=tests/python/test_ray.py

step "Ray: TorchTrainer over ShardDataset, Ray Data and checkpoints through a node (tests/python/test_ray.py)"
# Ray Train and Ray Data in the test venv; where they cannot be installed the tier's
# tests skip, with the reason, and the rest of the run goes on.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    -r tests/python/requirements-ray.txt \
  || echo "Ray could not be installed (tests/python/requirements-ray.txt): the Ray tier skips"
room
# A hung Ray is a failure, not a stall of the whole run.
timeout -k 30 "${RAY_TIER_LIMIT:-900}" "$venv/bin/python" -m pytest -q -rs tests/python/test_ray.py

step "Ceph s3-tests on the operations Granary serves (tests/s3-tests; failures: docs/s3-compatibility.md)"
# The floor below is the pass rate reached; every failure left is listed, with its reason.
S3TESTS_MIN_PERCENT=${S3TESTS_MIN_PERCENT:-98} VENV="$venv" tests/s3-tests/run.sh

room
step "all tests passed"
