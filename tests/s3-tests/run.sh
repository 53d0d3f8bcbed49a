#!/usr/bin/env bash
# Ceph's S3 conformance suite (s3-tests, vendored under s3tests/; see README.md) against a
# single Granary node with an fs backend, or with --moto against moto_server to compare.
#
#   tests/s3-tests/run.sh [--moto] [extra pytest args...]
#
# The selection is test_s3.py minus what scope.txt deselects (see conftest.py). Prints
#   s3-tests: P passed of N in scope (X%)
# and exits 0 when X >= S3TESTS_MIN_PERCENT (default 0), 1 otherwise, 2 when the run broke.
#
# Env: GRANARY_BIN (default target/release/granary), VENV (default tests/.venv, needs
# tests/python/requirements.txt and tests/s3-tests/requirements.txt; the latter is
# installed when missing), S3TESTS_MIN_PERCENT, S3TESTS_TIMEOUT (per test, seconds,
# default 300), S3TESTS_JUNIT (copy the JUnit XML there), S3TESTS_KEEP=1 (keep the temp
# dir with the server log), S3TESTS_ALL=1 (ignore scope.txt).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

target=granary
if [ "${1:-}" = "--moto" ]; then
  target=moto
  shift
fi

venv=${VENV:-$root/tests/.venv}
py="$venv/bin/python"
[ -x "$py" ] || { echo "no venv at $venv (tests/run.sh makes it)" >&2; exit 2; }
if ! "$py" -c 'import munch, isodate, pytz, dateutil' 2>/dev/null; then
  "$py" -m pip install --quiet --disable-pip-version-check -r "$here/requirements.txt"
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/s3tests.XXXXXX")
server_pid=
cleanup() {
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  if [ -n "${S3TESTS_KEEP:-}" ]; then
    echo "kept $tmp" >&2
  else
    rm -rf "$tmp"
  fi
}
trap cleanup EXIT

port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# One key pair: Granary serves one identity, so main, alt and tenant users share it
# (tests that need distinct users are out of scope, see scope.txt). moto gets the same.
access_key=S3TESTSACCESSKEY0001
secret_key=s3tests/secret/key/0000000000000000000000

case $target in
  granary)
    bin=${GRANARY_BIN:-$root/target/release/granary}
    [ -x "$bin" ] || { echo "no granary binary at $bin" >&2; exit 2; }
    mkdir -p "$tmp/data" "$tmp/origin"
    "$bin" serve --listen "127.0.0.1:$port" --data-dir "$tmp/data" \
      --backend "fs:$tmp/origin" --node-id s3tests \
      --access-key "$access_key" --secret-key "$secret_key" \
      >"$tmp/server.log" 2>&1 &
    server_pid=$!
    ready_path=/_granary/health
    ;;
  moto)
    "$venv/bin/moto_server" -H 127.0.0.1 -p "$port" >"$tmp/server.log" 2>&1 &
    server_pid=$!
    ready_path=/moto-api/
    ;;
esac

for _ in $(seq 1 150); do
  if ! kill -0 "$server_pid" 2>/dev/null; then
    echo "$target exited at start:" >&2; cat "$tmp/server.log" >&2; exit 2
  fi
  if "$py" -c "import sys, urllib.request
try: urllib.request.urlopen('http://127.0.0.1:$port$ready_path', timeout=1)
except Exception: sys.exit(1)" 2>/dev/null; then
    break
  fi
  sleep 0.2
done

users=""
for section in "s3 main" "s3 alt" "s3 tenant"; do
  users+="
[$section]
display_name = s3tests
user_id = s3tests
email = s3tests@example.com
access_key = $access_key
secret_key = $secret_key
"
done
cat >"$tmp/s3tests.conf" <<EOF
[DEFAULT]
host = 127.0.0.1
port = $port
is_secure = False
ssl_verify = False

[fixtures]
bucket prefix = s3t-{random}-
$users
tenant = s3tests

# Required by the config reader; the IAM/STS tests that use them are out of scope.
[iam]
email = s3tests@example.com
user_id = s3tests
access_key = $access_key
secret_key = $secret_key
display_name = s3tests

[iam root]
access_key = $access_key
secret_key = $secret_key
user_id = s3tests
email = s3tests@example.com

[iam alt root]
access_key = $access_key
secret_key = $secret_key
user_id = s3tests
email = s3tests@example.com
EOF

export S3TEST_CONF="$tmp/s3tests.conf"
# Keep the user's AWS settings out of it; region us-east-1.
export AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null
export AWS_DEFAULT_REGION=us-east-1 AWS_REGION=us-east-1
unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_SESSION_TOKEN AWS_PROFILE AWS_ENDPOINT_URL
export PYTHONDONTWRITEBYTECODE=1

echo "s3-tests against $target on 127.0.0.1:$port"
start=$(date +%s)
set +e
(cd "$here" && "$py" -m pytest -p no:cacheprovider -q --tb=short -rfE \
  --junitxml="$tmp/junit.xml" s3tests/functional/test_s3.py "$@")
rc=$?
set -e
elapsed=$(( $(date +%s) - start ))
[ -n "${S3TESTS_JUNIT:-}" ] && [ -f "$tmp/junit.xml" ] && cp "$tmp/junit.xml" "$S3TESTS_JUNIT"
# pytest: 0 all passed, 1 some failed, 5 none selected; anything else is a broken run.
if [ ! -f "$tmp/junit.xml" ] || { [ "$rc" -ne 0 ] && [ "$rc" -ne 1 ] && [ "$rc" -ne 5 ]; }; then
  echo "pytest broke (exit $rc)" >&2
  tail -50 "$tmp/server.log" >&2 || true
  exit 2
fi

"$py" - "$tmp/junit.xml" "${S3TESTS_MIN_PERCENT:-0}" "$elapsed" "$target" <<'EOF'
import sys
import xml.etree.ElementTree as ET

path, min_percent, elapsed, target = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
outcome = {}
for case in ET.parse(path).iter("testcase"):
    name = case.get("name")
    tags = {child.tag for child in case}
    if "error" in tags and "failure" not in tags and outcome.get(name) != "failed":
        state = "error"
    elif "failure" in tags:
        state = "failed"
    elif "skipped" in tags:
        state = "skipped"
    else:
        state = "passed"
    # A test that passed but errored in teardown appears twice: the worse outcome wins.
    rank = {"passed": 0, "skipped": 1, "error": 2, "failed": 3}
    if name not in outcome or rank[state] > rank[outcome[name]]:
        outcome[name] = state
counts = {k: sum(1 for v in outcome.values() if v == k) for k in ("passed", "failed", "error", "skipped")}
n = len(outcome)
pct = 100.0 * counts["passed"] / n if n else 0.0
print(f"({target}: {counts['failed']} failed, {counts['error']} errors, "
      f"{counts['skipped']} skipped, {elapsed}s)")
print(f"s3-tests: {counts['passed']} passed of {n} in scope ({pct:.1f}%)")
if n == 0 or pct < min_percent:
    if n:
        print(f"below S3TESTS_MIN_PERCENT={min_percent:g}", file=sys.stderr)
    sys.exit(1)
EOF
