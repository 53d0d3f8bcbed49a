"""The node under conditions a deployment meets: an inherited low open-file limit, and
unsigned requests to what describes the node when credentials are set."""

from __future__ import annotations

import resource
import socket
import subprocess
import time

import requests
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from conftest import _free_port, _server_binary, _stop_process, wait_healthy
from granary_testutil import ACCESS_KEY, REGION, SECRET_KEY


def _soft_nofile(pid: int) -> int:
    for line in open(f"/proc/{pid}/limits"):
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open-file limit")


def test_a_low_inherited_open_file_limit_is_raised(tmp_path):
    """Started with a soft limit of 256, the node raises it to the hard limit at start,
    so 400 idle connections do not starve its health checks."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 2048:
        import pytest
        pytest.skip(f"the hard open-file limit here is {hard}")
    port = _free_port()
    log = open(tmp_path / "granary.log", "ab")
    proc = subprocess.Popen(
        [str(_server_binary()), "serve", "--listen", f"127.0.0.1:{port}",
         "--data-dir", str(tmp_path / "data")],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)))
    idle = []
    try:
        url = f"http://127.0.0.1:{port}/_granary/health"
        why = wait_healthy(f"http://127.0.0.1:{port}", proc, timeout=20)
        assert why is None, why
        assert _soft_nofile(proc.pid) == hard
        for _ in range(400):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(0.5)
        assert requests.get(url, timeout=5).status_code == 200
    finally:
        for s in idle:
            s.close()
        _stop_process(proc)
        log.close()
    assert "open-file limit" in (tmp_path / "granary.log").read_text()


def _signed_get(url: str) -> requests.Response:
    req = AWSRequest(method="GET", url=url, headers={"x-amz-content-sha256": "UNSIGNED-PAYLOAD"})
    SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", REGION).add_auth(req)
    return requests.get(url, headers=dict(req.headers), timeout=5)


def test_unsigned_requests_do_not_learn_where_things_are(granary_server):
    """With credentials set, `/_granary/stats` names only the backend's kind and
    `/_granary/cluster` no member's URL to an unsigned request; a signed one sees
    both."""
    stats = f"{granary_server.endpoint}/_granary/stats"
    open_view = requests.get(stats, timeout=5).json()
    assert open_view["backend"] == "fs"
    assert "objects" in open_view and "hits" in open_view
    signed = _signed_get(stats)
    assert signed.status_code == 200
    assert signed.json()["backend"].startswith("fs:/")
    cluster = f"{granary_server.endpoint}/_granary/cluster"
    members = requests.get(cluster, timeout=5).json()["members"]
    assert members and all("url" not in m for m in members)
    signed_members = _signed_get(cluster).json()["members"]
    assert [m["id"] for m in signed_members] == [m["id"] for m in members]
    assert all(m["url"].startswith("http") for m in signed_members)
    # What a health check and a scrape need stays open.
    assert requests.get(f"{granary_server.endpoint}/_granary/health", timeout=5).status_code == 200
    assert requests.get(f"{granary_server.endpoint}/_granary/metrics", timeout=5).status_code == 200
