"""The operators' files under deploy/ against a real Prometheus (Debian's `prometheus`
package, which tests/run.sh installs) and a real 3-node cluster under bench load:

- `promtool` accepts deploy/prometheus/alerts.yml and prometheus.yml, and rejects a
  broken copy;
- Prometheus, configured from deploy/prometheus/prometheus.yml (intervals shortened,
  targets swapped for the test's nodes), scrapes every node;
- every query of every panel of deploy/grafana/granary.json returns data through
  Prometheus's HTTP API, and the ones whose value is known return it;
- the GranaryMemberDown alert fires once its `for:` window has passed after a member is
  killed, and resolves after the member returns.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests
import yaml

from conftest import REPO_ROOT, _free_port, _server_binary, _stop_process, wait_members_up

DEPLOY = REPO_ROOT / "deploy"
RULES = DEPLOY / "prometheus" / "alerts.yml"
SCRAPE = DEPLOY / "prometheus" / "prometheus.yml"
DASHBOARD = DEPLOY / "grafana" / "granary.json"
BUCKET = "prom"
# Grafana's variables, as the dashboard is opened: every node, and a rate window that
# spans a few of the test's 1 s scrapes.
VARIABLES = {"$node": ".*", "$__rate_interval": "10s"}

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None or PROMTOOL is None,
    reason="no prometheus/promtool on PATH (tests/run.sh installs Debian's prometheus)")


def bench_binary() -> Path:
    return _server_binary().parent / "granary-bench"


def for_window(alert: str) -> float:
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                m = re.fullmatch(r"(\d+)([sm])", rule["for"])
                assert m, rule["for"]
                return int(m[1]) * (60 if m[2] == "m" else 1)
    raise AssertionError(f"no alert {alert} in {RULES}")


def panel_queries() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    out = []
    for p in dash["panels"]:
        for t in p["targets"]:
            expr = t["expr"]
            for var, value in VARIABLES.items():
                expr = expr.replace(var, value)
            assert "$" not in expr, f"an unknown variable in {p['title']}: {expr}"
            out.append((p["title"], expr))
    return out


@needs_prometheus
def test_promtool_takes_the_rules_and_the_config_and_refuses_broken_ones(tmp_path):
    for args in (["check", "rules", str(RULES)], ["check", "config", str(SCRAPE)]):
        r = subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
    assert "7 rules found" in subprocess.run(
        [PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True).stdout
    broken = tmp_path / "alerts.yml"
    broken.write_text(RULES.read_text().replace("expr: up{job=\"granary\"} == 0",
                                                "expr: up{job=\"granary\"} ==", 1))
    assert broken.read_text() != RULES.read_text()
    r = subprocess.run([PROMTOOL, "check", "rules", str(broken)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0, r.stdout


def test_every_panel_names_metrics_the_node_exports():
    """Without Prometheus: each metric a panel or rule names appears in a node's
    exposition (checked live below; this catches a renamed metric anywhere)."""
    names = set()
    for _, expr in panel_queries():
        names |= set(re.findall(r"\b(granary_[a-z_]+)", expr))
    names |= set(re.findall(r"\b(granary_[a-z_]+)", RULES.read_text()))
    source = (REPO_ROOT / "server" / "core" / "src" / "stats" / "mod.rs").read_text()
    exported = {f"granary_{n}" for n in re.findall(r'"[a-z_]+", "([a-z_]+)",', source)}
    with_suffixes = set()
    for n in exported:
        with_suffixes |= {n, n + "_total", n + "_bucket"}
    with_suffixes |= {"granary_request_duration_seconds_bucket"}
    missing = sorted(n for n in names if n not in with_suffixes)
    assert not missing, f"named but not exported: {missing}"
    assert len(panel_queries()) >= 12


class Cluster:
    def __init__(self, root: Path, origin: Path, ids: list[str]):
        self.root, self.origin, self.ids = root, origin, ids
        self.ports = [_free_port() for _ in ids]
        self.peers = []
        for i, p in zip(ids, self.ports):
            self.peers += ["--peer", f"{i}=http://127.0.0.1:{p}"]
        self.procs: list[subprocess.Popen | None] = [None] * len(ids)

    def endpoint(self, i: int) -> str:
        return f"http://127.0.0.1:{self.ports[i]}"

    def start(self, i: int) -> None:
        log = open(self.root / f"{self.ids[i]}.log", "ab")
        self.procs[i] = subprocess.Popen(
            [str(_server_binary()), "serve", "--listen", f"127.0.0.1:{self.ports[i]}",
             "--data-dir", str(self.root / self.ids[i]), "--backend", f"fs:{self.origin}",
             "--cache-capacity", "2MiB", "--node-id", self.ids[i], *self.peers],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()

    def wait_up(self) -> None:
        wait_members_up([self.endpoint(i) for i in range(len(self.ids))],
                        [p for p in self.procs if p is not None],
                        [self.root / f"{i}.log" for i in self.ids])

    def kill(self, i: int) -> None:
        os.kill(self.procs[i].pid, signal.SIGKILL)
        self.procs[i].wait(timeout=10)

    def stop(self) -> None:
        for p in self.procs:
            if p is not None:
                _stop_process(p)


class Prometheus:
    def __init__(self, root: Path, targets: list[str]):
        config = yaml.safe_load(SCRAPE.read_text())
        config["global"]["scrape_interval"] = "1s"
        config["global"]["evaluation_interval"] = "1s"
        config["rule_files"] = [str(RULES)]
        job = next(j for j in config["scrape_configs"] if j["job_name"] == "granary")
        job["static_configs"] = [{"targets": targets}]
        path = root / "prometheus.yml"
        path.write_text(yaml.safe_dump(config))
        self.url = f"http://127.0.0.1:{_free_port()}"
        self.log = root / "prometheus.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={path}", f"--storage.tsdb.path={root / 'tsdb'}",
                 f"--web.listen-address={self.url.removeprefix('http://')}",
                 "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            assert time.monotonic() < deadline, "prometheus never got ready"
            time.sleep(0.2)

    def api(self, path: str, **params) -> dict:
        r = requests.get(f"{self.url}/api/v1/{path}", params=params, timeout=10)
        body = r.json()
        assert r.status_code == 200 and body["status"] == "success", (path, params, body)
        return body["data"]

    def query(self, expr: str) -> list:
        return self.api("query", query=expr)["result"]

    def targets_up(self) -> int:
        return sum(t["health"] == "up" for t in self.api("targets")["activeTargets"])

    def alert_state(self, name: str, instance: str) -> str | None:
        for a in self.api("alerts")["alerts"]:
            if a["labels"].get("alertname") == name and a["labels"].get("instance") == instance:
                return a["state"]
        return None

    def stop(self) -> None:
        _stop_process(self.proc)


@needs_prometheus
def test_the_dashboard_and_the_alerts_against_a_real_prometheus(tmp_path):
    origin = tmp_path / "origin"
    (origin / BUCKET / "obj").mkdir(parents=True)
    for i in range(80):
        (origin / BUCKET / "obj" / f"{i:04d}.bin").write_bytes(os.urandom(128 * 1024))
    cluster = Cluster(tmp_path, origin, ["p0", "p1", "p2"])
    prom = None
    bench = None
    try:
        for i in range(3):
            cluster.start(i)
        cluster.wait_up()
        targets = [cluster.endpoint(i).removeprefix("http://") for i in range(3)]
        prom = Prometheus(tmp_path, targets)
        # Bench load through one node (it passes each read on to the key's owner), and a
        # prefetch job, for the while the panels are asked.
        bench = subprocess.Popen(
            [str(bench_binary()), "run", "--endpoint", cluster.endpoint(0), "--bucket",
             BUCKET, "--prefix", "obj/", "--duration", "40s", "--workers", "4",
             "--progress", "false"],
            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "bench.log", "wb"))
        r = requests.post(f"{cluster.endpoint(1)}/_granary/prefetch",
                          json={"bucket": BUCKET, "prefix": "obj/"}, timeout=10)
        assert r.status_code == 202, r.text
        deadline = time.monotonic() + 30
        while prom.targets_up() < 3:
            assert time.monotonic() < deadline, prom.api("targets")
            time.sleep(0.5)
        time.sleep(12)  # a rate window's worth of scrapes under load

        for title, expr in panel_queries():
            result = []
            deadline = time.monotonic() + 15
            while not result and time.monotonic() < deadline:
                result = prom.query(expr)
                if not result:
                    time.sleep(1)
            assert result, f"panel {title!r}: no data for {expr}"
            for series in result:
                float(series["value"][1])  # a number (NaN parses too)
        # The values these panels must show.
        value = lambda e: [float(s["value"][1]) for s in prom.query(e)]  # noqa: E731
        assert value('sum(up{job="granary"})') == [3.0]
        assert value('max(granary_cluster_members{job="granary"})') == [3.0]
        assert value('min(granary_cluster_members_up{job="granary"})') == [3.0]
        assert value(f'sum(rate(granary_requests_total{{job="granary"}}[10s]))')[0] > 0
        ratio = value('sum(rate(granary_cache_hits_total{job="granary"}[10s])) / ('
                      'sum(rate(granary_cache_hits_total{job="granary"}[10s])) + '
                      'sum(rate(granary_cache_misses_total{job="granary"}[10s])) + '
                      'sum(rate(granary_cache_peer_fills_total{job="granary"}[10s])) + '
                      'sum(rate(granary_cache_bypasses_total{job="granary"}[10s])))')[0]
        assert 0.0 < ratio < 1.0, ratio  # 6 MiB of 10 MiB fits: hits and bypasses both
        used = value('sum(granary_cache_used_bytes{job="granary"})')[0]
        assert 0 < used <= 6 * 1024 * 1024, used
        assert value('granary:hit_ratio:rate5m'), "the recording rule evaluates"

        # A member killed: the alert is pending, then fires once its window has passed.
        window = for_window("GranaryMemberDown")
        victim = targets[2]
        cluster.kill(2)
        killed = time.monotonic()
        state = None
        while state != "firing":
            assert time.monotonic() - killed < window + 20, f"not firing: {state}"
            state = prom.alert_state("GranaryMemberDown", victim)
            assert state != "firing" or time.monotonic() - killed >= window, \
                "fired before its for: window"
            time.sleep(0.5)
        fired = time.monotonic() - killed
        assert prom.alert_state("GranaryMemberDown", targets[0]) is None
        # Back: the alert resolves.
        cluster.start(2)
        cluster.wait_up()
        back = time.monotonic()
        while prom.alert_state("GranaryMemberDown", victim) is not None:
            assert time.monotonic() - back < 20, "the alert did not resolve"
            time.sleep(0.5)
        print(f"GranaryMemberDown fired {fired:.1f} s after the kill (for: {window:.0f} s), "
              f"resolved {time.monotonic() - back:.1f} s after the member was back")
    finally:
        if bench is not None and bench.poll() is None:
            bench.terminate()
            bench.wait(timeout=10)
        if prom is not None:
            prom.stop()
        cluster.stop()
