"""Shared fixtures for Granary's Python client-compatibility tests.

A single real `granary serve` process is started for the whole session, with
credentials set, so every request from boto3 / the AWS CLI must be signed.

Environment:
  GRANARY_BIN   path of the server binary (default: <repo>/target/release/granary)

The server's stdout/stderr go to `<session tmp>/granary.log`; on a test
failure the lines the server logged during that test are attached to the
report ("granary server log" section).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import requests

from granary_testutil import ACCESS_KEY, REGION, SECRET_KEY, unique_bucket_name

REPO_ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 20.0
CLI_TIMEOUT_S = 300

# --------------------------------------------------------------------------
# Isolate botocore / the AWS CLI from whatever AWS configuration the machine
# has: empty config and credentials files, no profile, no IMDS.
# --------------------------------------------------------------------------
_AWS_ISOLATION_DIR = Path(tempfile.mkdtemp(prefix="granary-pytest-aws-"))
_EMPTY_AWS_CONFIG = _AWS_ISOLATION_DIR / "config"
_EMPTY_AWS_CREDENTIALS = _AWS_ISOLATION_DIR / "credentials"
_EMPTY_AWS_CONFIG.write_text("")
_EMPTY_AWS_CREDENTIALS.write_text("")

for _name in list(os.environ):
    if _name.startswith("AWS_"):
        del os.environ[_name]
os.environ["AWS_CONFIG_FILE"] = str(_EMPTY_AWS_CONFIG)
os.environ["AWS_SHARED_CREDENTIALS_FILE"] = str(_EMPTY_AWS_CREDENTIALS)
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"


def pytest_sessionfinish(session, exitstatus):  # noqa: ARG001
    shutil.rmtree(_AWS_ISOLATION_DIR, ignore_errors=True)


# --------------------------------------------------------------------------
# Server
# --------------------------------------------------------------------------
@dataclasses.dataclass
class GranaryServer:
    endpoint: str  # e.g. http://127.0.0.1:43123
    host: str
    port: int
    data_dir: Path
    log_path: Path
    pid: int
    process: subprocess.Popen

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def log_since(self, offset: int, max_chars: int = 20000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except OSError:
            return ""
        text = data.decode("utf-8", "replace")
        if len(text) > max_chars:
            text = "... (cut) ...\n" + text[-max_chars:]
        return text


def _server_binary() -> Path:
    env_bin = os.environ.get("GRANARY_BIN")
    if env_bin:
        return Path(env_bin)
    return REPO_ROOT / "target" / "release" / "granary"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.kill(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        proc.wait(timeout=10)


def wait_members_up(endpoints: list[str], procs: list[subprocess.Popen], logs: list[Path],
                    verify: str | bool = True) -> None:
    """Waits until every node's /_granary/cluster shows all members up and itself trusted; fails with the
    log of a node that exited, or when STARTUP_TIMEOUT_S passes."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        try:
            views = [requests.get(f"{e}/_granary/cluster", timeout=2, verify=verify).json()
                     for e in endpoints]
            # Up in every view, and trusting its copies (settled, within its lease):
            # before that a node keeps nothing it reads.
            if all(m["state"] == "up" for v in views for m in v["members"]) and all(
                    v.get("trusted", True) for v in views):
                return
        except requests.RequestException:
            pass
        for p, log in zip(procs, logs):
            assert p.poll() is None, log.read_text()[-4000:]
        assert time.monotonic() < deadline, "the nodes never came up: " + "\n".join(
            log.read_text()[-2000:] for log in logs)
        time.sleep(0.1)


_CURRENT_SERVER: GranaryServer | None = None


@pytest.fixture(scope="session")
def granary_server(tmp_path_factory) -> GranaryServer:
    global _CURRENT_SERVER
    binary = _server_binary()
    if not binary.is_file() or not os.access(binary, os.X_OK):
        pytest.fail(
            f"granary server binary not found at {binary} "
            "(build it with `cargo build --release -p granary-server` or set GRANARY_BIN)",
            pytrace=False,
        )

    root = tmp_path_factory.mktemp("granary")
    data_dir = root / "data"
    data_dir.mkdir()
    log_path = root / "granary.log"
    port = _free_port()
    host = "127.0.0.1"

    env = {k: v for k, v in os.environ.items() if not k.startswith("GRANARY_")}
    env.setdefault("RUST_LOG", "info")
    env.setdefault("RUST_BACKTRACE", "1")
    cmd = [
        str(binary), "serve",
        "--listen", f"{host}:{port}",
        "--data-dir", str(data_dir),
        "--access-key", ACCESS_KEY,
        "--secret-key", SECRET_KEY,
    ]
    log_file = open(log_path, "ab")
    proc = subprocess.Popen(
        cmd,
        cwd=str(root),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )
    endpoint = f"http://{host}:{port}"
    why = wait_healthy(endpoint, proc)
    if why is not None:
        rc = proc.poll()
        _stop_process(proc)
        log_file.close()
        log_tail = log_path.read_text("utf-8", "replace")[-5000:]
        pytest.fail(
            f"granary did not become healthy: {why} "
            f"(exit code {rc}); cmd: {' '.join(cmd)}\n"
            f"--- server log ---\n{log_tail}",
            pytrace=False,
        )

    server = GranaryServer(
        endpoint=endpoint, host=host, port=port, data_dir=data_dir,
        log_path=log_path, pid=proc.pid, process=proc,
    )
    _CURRENT_SERVER = server
    try:
        yield server
    finally:
        _CURRENT_SERVER = None
        _stop_process(proc)
        log_file.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    server = _CURRENT_SERVER
    offset = server.log_size() if server is not None else 0
    item._granary_log_offset = offset
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    server = _CURRENT_SERVER
    if report.when == "call" and report.failed and server is not None:
        offset = getattr(item, "_granary_log_offset", 0)
        text = server.log_since(offset)
        report.sections.append(
            ("granary server log", f"({server.log_path})\n{text or '(nothing logged)'}")
        )


# --------------------------------------------------------------------------
# moto: a real S3-compatible server, the backend of some tests and the reference
# others compare Granary with
# --------------------------------------------------------------------------
MOTO_KEY = "testing"


def _poll(url: str, proc: subprocess.Popen, timeout: float, ready) -> str | None:
    """Polls `url` until `ready(response)`; returns why it did not become ready (the
    process exited, or the last status or error when the time ran out)."""
    deadline = time.monotonic() + timeout
    last = "no attempt"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"exited with {proc.returncode} ({last})"
        try:
            r = requests.get(url, timeout=2)
            if ready(r):
                return None
            last = f"status {r.status_code}"
        except requests.RequestException as e:  # not up yet
            last = repr(e)
        time.sleep(0.1)
    return f"not ready within {timeout}s ({last})"


def wait_healthy(endpoint: str, proc: subprocess.Popen,
                 timeout: float = STARTUP_TIMEOUT_S) -> str | None:
    """Polls the node's `/_granary/health` until it answers 200; returns why it did not."""
    return _poll(f"{endpoint}/_granary/health", proc, timeout, lambda r: r.status_code == 200)


def _wait_http(url: str, proc: subprocess.Popen, timeout: float) -> str | None:
    """Polls `url` until it answers with any status; returns why it did not."""
    return _poll(url, proc, timeout, lambda r: True)


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory):
    moto_bin = Path(sys.executable).parent / "moto_server"
    if not moto_bin.exists():
        pytest.fail(f"moto_server not found at {moto_bin}; "
                    "pip install -r tests/python/requirements.txt", pytrace=False)
    port = _free_port()
    log_path = tmp_path_factory.mktemp("moto") / "moto.log"
    log = open(log_path, "ab")
    proc = subprocess.Popen([str(moto_bin), "-H", "127.0.0.1", "-p", str(port)],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    why = _wait_http(endpoint + "/", proc, 30)
    if why is not None:
        _stop_process(proc)
        log.close()
        pytest.fail(f"moto_server did not start: {why}\n"
                    f"{log_path.read_text('utf-8', 'replace')[-3000:]}", pytrace=False)
    try:
        yield endpoint
    finally:
        _stop_process(proc)
        log.close()


# --------------------------------------------------------------------------
# boto3
# --------------------------------------------------------------------------
def make_s3_client(endpoint: str, *, access_key: str = ACCESS_KEY,
                   secret_key: str = SECRET_KEY, signature_version: str | None = None,
                   max_attempts: int = 1, verify: str | bool | None = None):
    import boto3
    from botocore.config import Config

    cfg_kwargs = dict(
        region_name=REGION,
        s3={"addressing_style": "path"},
        connect_timeout=10,
        read_timeout=30,
        # No hidden retries: a stalled or failed request is a test failure.
        retries={"total_max_attempts": max_attempts, "mode": "standard"},
    )
    if signature_version is not None:
        cfg_kwargs["signature_version"] = signature_version
    session = boto3.session.Session(
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name=REGION,
    )
    return session.client("s3", endpoint_url=endpoint, config=Config(**cfg_kwargs),
                          verify=verify)


@pytest.fixture(scope="session")
def s3(granary_server):
    """A boto3 S3 client for the test server (path-style, us-east-1)."""
    return make_s3_client(granary_server.endpoint)


@pytest.fixture
def s3_factory(granary_server):
    """Make extra clients: s3_factory(secret_key=..., signature_version=...)."""
    def factory(**kwargs):
        return make_s3_client(granary_server.endpoint, **kwargs)
    return factory


@pytest.fixture
def bucket_name(request) -> str:
    """A fresh, not yet created bucket name for this test."""
    return unique_bucket_name(request.node.name.replace("test_", "", 1))


@pytest.fixture
def bucket(s3, bucket_name) -> str:
    """A fresh bucket, created with boto3, for this test."""
    s3.create_bucket(Bucket=bucket_name)
    return bucket_name


# --------------------------------------------------------------------------
# AWS CLI (v1, installed in the same venv as this interpreter)
# --------------------------------------------------------------------------
def _aws_cli_path() -> Path:
    bindir = Path(sys.executable).parent
    for name in ("aws", "aws.cmd"):
        p = bindir / name
        if p.exists():
            return p
    found = shutil.which("aws")
    if found is None:
        pytest.fail("the `aws` CLI (awscli from PyPI) is not installed next to "
                    f"{sys.executable}; pip install -r tests/python/requirements.txt",
                    pytrace=False)
    return Path(found)


@dataclasses.dataclass
class CliResult:
    args: list
    returncode: int
    stdout: str
    stderr: str

    def describe(self) -> str:
        return (f"aws {' '.join(map(str, self.args))} -> rc={self.returncode}\n"
                f"--- stdout ---\n{self.stdout[-4000:]}\n--- stderr ---\n{self.stderr[-4000:]}")


class AwsCli:
    def __init__(self, endpoint: str, home: Path):
        self.endpoint = endpoint
        self.home = home
        self.path = _aws_cli_path()
        home.mkdir(parents=True, exist_ok=True)
        (home / "config").write_text("")
        (home / "credentials").write_text("")
        keep = ("PATH", "TMPDIR", "SYSTEMROOT")
        env = {k: os.environ[k] for k in keep if k in os.environ}
        env.update({
            "HOME": str(home),
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_CONFIG_FILE": str(home / "config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(home / "credentials"),
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_PAGER": "",
            # No hidden retries: a stalled or failed request is a test failure.
            "AWS_RETRY_MODE": "standard",
            "AWS_MAX_ATTEMPTS": "1",
            # awscli 1.x vendors botocore (1.46.3 has botocore 1.43.62), which has
            # boto/botocore#3755 (fixed in botocore 1.43.77): after a zero-length
            # PUT sent with `Expect: 100-continue` is answered straight away with
            # its final status (as S3 itself does), the pooled connection keeps
            # that cached status and the next PUT on it misparses its response and
            # stalls for the read timeout. This makes the CLI send no Expect header
            # for empty bodies. The server side of that exchange is covered by
            # test_boto3.py::test_expect_100_continue_*.
            "BOTO_EXPERIMENTAL__NO_EMPTY_CONTINUE": "true",
            "LC_ALL": "C.UTF-8",
            "LANG": "C.UTF-8",
            "PYTHONUTF8": "1",
            "PYTHONIOENCODING": "utf-8",
        })
        self.env = env

    def run(self, *args, check: bool = True, timeout: float = CLI_TIMEOUT_S,
            cwd: Path | None = None, extra_env: dict | None = None) -> CliResult:
        args = [str(a) for a in args]
        full = [sys.executable, str(self.path), "--endpoint-url", self.endpoint,
                "--cli-read-timeout", "30", "--cli-connect-timeout", "10", *args]
        try:
            p = subprocess.run(full, env={**self.env, **(extra_env or {})}, cwd=cwd,
                               stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"aws {' '.join(args)} timed out after {timeout}s\n"
                        f"stdout: {(e.stdout or b'')[-2000:]!r}\nstderr: {(e.stderr or b'')[-2000:]!r}")
        res = CliResult(args, p.returncode, p.stdout.decode("utf-8", "replace"),
                        p.stderr.decode("utf-8", "replace"))
        if check and res.returncode != 0:
            pytest.fail("aws CLI failed: " + res.describe(), pytrace=False)
        return res


@pytest.fixture(scope="session")
def aws_cli(granary_server, tmp_path_factory) -> AwsCli:
    return AwsCli(granary_server.endpoint, tmp_path_factory.mktemp("awshome"))
