"""The deployment files under deploy/ hold together and are accepted by their tools.

- Kubernetes: the real `kubectl apply --dry-run=client` over deploy/kubernetes/, against a
  stub API server on 127.0.0.1 that serves only discovery (kubectl needs it to map kinds to
  resources) and answers 404 for every object, so apply computes a create of each. kubectl
  validates schemas with the OpenAPI documents of a live cluster, so here it runs with
  --validate=false and the schemas are checked with kubernetes-validate's bundled upstream
  schemas (strict: unknown fields are errors). Broken copies must be rejected by both.
- The manifests' and compose file's settings: peers, node ids, ports, probes, volumes, and
  config keys that `granary serve` knows (read from server/src).
- Docker Compose: structure; `docker compose config` where the compose plugin works.
- systemd: `systemd-analyze verify` on the unit, its ExecStart binary swapped for one
  that exists here.
- Dockerfile: its stages and the contract of the image (checked as text: no daemon needed).
"""

from __future__ import annotations

import copy
import http.server
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import tomllib
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY = REPO_ROOT / "deploy"
K8S_DIR = DEPLOY / "kubernetes"
COMPOSE_FILE = DEPLOY / "docker-compose.yaml"
UNIT_FILE = DEPLOY / "systemd" / "granary.service"
DOCKERFILE = DEPLOY / "Dockerfile"
HEALTH_PATH = "/_granary/health"
PORT = 7070
TOOL_TIMEOUT_S = 60


# --------------------------------------------------------------------------
# What `granary serve` accepts, read from its source: the TOML keys (fields of
# `Config`) and the env variables (`GRANARY_*`).
# --------------------------------------------------------------------------
def config_fields() -> set[str]:
    text = (REPO_ROOT / "server" / "src" / "config.rs").read_text()
    m = re.search(r"pub struct Config \{(.*?)\n\}", text, re.S)
    assert m, "struct Config not found in server/src/config.rs"
    fields = set(re.findall(r"^\s*pub (\w+):", m.group(1), re.M))
    assert {"listen", "data_dir", "peer", "node_id", "backend"} <= fields, fields
    return fields


def env_flags() -> set[str]:
    text = (REPO_ROOT / "server" / "src" / "main.rs").read_text()
    names = set(re.findall(r'env = "(GRANARY_\w+)"', text))
    assert {"GRANARY_NODE_ID", "GRANARY_PEER", "GRANARY_LISTEN"} <= names, names
    return names


_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def parse_size(s: str) -> int:
    """`90GiB`, `100Gi`, `10G` → bytes (granary's and Kubernetes' spellings)."""
    m = re.fullmatch(r"(\d+)\s*([kmgt]i?)?b?", str(s).strip().lower())
    assert m, f"not a size: {s!r}"
    return int(m.group(1)) * _UNITS[m.group(2) or ""]


# --------------------------------------------------------------------------
# Kubernetes
# --------------------------------------------------------------------------
def load_manifests(directory: Path = K8S_DIR) -> list[dict]:
    docs = []
    for f in sorted(directory.glob("*.y*ml")):
        docs += [d for d in yaml.safe_load_all(f.read_text()) if d]
    assert docs, f"no manifests under {directory}"
    return docs


def one(docs: list[dict], kind: str, pred=lambda d: True) -> dict:
    found = [d for d in docs if d["kind"] == kind and pred(d)]
    assert len(found) == 1, f"expected one {kind}, found {[d['metadata']['name'] for d in found]}"
    return found[0]


def labels_select(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


# The resources the stub's discovery lists: (group, version, kind, plural, namespaced),
# as a Kubernetes 1.32 API server names them.
STUB_RESOURCES = [
    ("", "v1", "ConfigMap", "configmaps", True),
    ("", "v1", "Secret", "secrets", True),
    ("", "v1", "Service", "services", True),
    ("", "v1", "Pod", "pods", True),
    ("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims", True),
    ("", "v1", "ServiceAccount", "serviceaccounts", True),
    ("", "v1", "Namespace", "namespaces", False),
    ("apps", "v1", "StatefulSet", "statefulsets", True),
    ("apps", "v1", "Deployment", "deployments", True),
    ("apps", "v1", "DaemonSet", "daemonsets", True),
    ("apps", "v1", "ReplicaSet", "replicasets", True),
    ("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets", True),
]
VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


def _discovery_documents() -> dict[str, dict]:
    by_gv: dict[tuple[str, str], list] = {}
    for g, v, kind, plural, namespaced in STUB_RESOURCES:
        by_gv.setdefault((g, v), []).append({
            "name": plural, "singularName": kind.lower(), "namespaced": namespaced,
            "kind": kind, "verbs": VERBS})
    docs: dict[str, dict] = {
        "/version": {"major": "1", "minor": "32", "gitVersion": "v1.32.0",
                     "platform": "linux/amd64"},
        "/api": {"kind": "APIVersions", "versions": ["v1"],
                 "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0",
                                                 "serverAddress": "127.0.0.1"}]},
    }
    groups = {}
    for (g, v), resources in by_gv.items():
        gv = f"{g}/{v}" if g else v
        docs[f"/apis/{gv}" if g else f"/api/{v}"] = {
            "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
            "resources": resources}
        if g:
            groups[g] = {"name": g, "versions": [{"groupVersion": gv, "version": v}],
                         "preferredVersion": {"groupVersion": gv, "version": v}}
    docs["/apis"] = {"kind": "APIGroupList", "apiVersion": "v1", "groups": list(groups.values())}
    return docs


class StubApiServer:
    """Discovery documents, 404 for everything else; records every request."""

    def __init__(self):
        documents = _discovery_documents()
        self.requests: list[tuple[str, str]] = []
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                stub.requests.append((self.command, self.path))
                path = self.path.split("?", 1)[0]
                if self.command == "GET" and path in documents:
                    code, body = 200, documents[path]
                elif self.command == "GET":
                    code, body = 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                       "reason": "NotFound", "code": 404,
                                       "message": f"{path} not found"}
                else:  # a client dry run writes nothing
                    code, body = 405, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                       "reason": "MethodNotAllowed", "code": 405}
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def kubectl(tmp_path_factory):
    """Runs the real kubectl against the stub, isolated from any kubeconfig or cluster."""
    exe = shutil.which("kubectl")
    if exe is None:
        pytest.skip("kubectl is not installed")
    home = tmp_path_factory.mktemp("kubectl-home")
    stub = StubApiServer()
    kubeconfig = home / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "preferences": {},
        "clusters": [{"name": "stub", "cluster": {"server": stub.url}}],
        "users": [{"name": "stub", "user": {}}],
        "contexts": [{"name": "stub", "context": {"cluster": "stub", "user": "stub",
                                                   "namespace": "default"}}],
        "current-context": "stub",
    }))
    env = {k: v for k, v in os.environ.items()
           if not k.upper().endswith("_PROXY") and not k.startswith("KUBERNETES_")}
    env.update(KUBECONFIG=str(kubeconfig), HOME=str(home), NO_PROXY="127.0.0.1,localhost")

    def run(*args: str) -> subprocess.CompletedProcess:
        stub.requests.clear()
        # A fresh discovery cache each run: every run asks the stub.
        cache = tempfile.mkdtemp(prefix="cache-", dir=home)
        return subprocess.run(
            [exe, *args, "--cache-dir", cache, "--request-timeout", "20s"],
            env=env, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)

    run.stub = stub
    yield run
    stub.close()


def dry_run_apply(kubectl, path: Path) -> subprocess.CompletedProcess:
    return kubectl("apply", "--dry-run=client", "--validate=false", "-f", str(path))


def object_path(doc: dict) -> str:
    """The URL path kubectl GETs to see whether `doc` exists."""
    api, kind = doc["apiVersion"], doc["kind"]
    plural = next(p for g, v, k, p, _ in STUB_RESOURCES
                  if k == kind and (f"{g}/{v}" if g else v) == api)
    prefix = f"/apis/{api}" if "/" in api else f"/api/{api}"
    return f"{prefix}/namespaces/default/{plural}/{doc['metadata']['name']}"


def expected_created(doc: dict) -> str:
    group = doc["apiVersion"].rsplit("/", 1)[0] if "/" in doc["apiVersion"] else ""
    resource = doc["kind"].lower() + (f".{group}" if group else "")
    return f"{resource}/{doc['metadata']['name']} created (dry run)"


def test_kubectl_dry_run_creates_every_object(kubectl):
    docs = load_manifests()
    r = dry_run_apply(kubectl, K8S_DIR)
    assert r.returncode == 0, f"kubectl failed:\n{r.stdout}\n{r.stderr}"
    lines = sorted(line for line in r.stdout.splitlines() if line.strip())
    assert lines == sorted(expected_created(d) for d in docs), r.stdout + r.stderr
    # kubectl mapped each kind through the stub's discovery and looked each object up.
    gets = {p.split("?", 1)[0] for m, p in kubectl.stub.requests if m == "GET"}
    for d in docs:
        assert object_path(d) in gets, (object_path(d), sorted(gets))
    assert {"/api/v1", "/apis/apps/v1"} <= gets
    assert not [r for r in kubectl.stub.requests if r[0] != "GET"], kubectl.stub.requests


def _write_docs(path: Path, docs: list[dict]) -> Path:
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


def test_kubectl_dry_run_rejects_an_unknown_kind(kubectl, tmp_path):
    docs = load_manifests()
    broken = copy.deepcopy(docs)
    one(broken, "StatefulSet")["kind"] = "StatefulSett"
    r = dry_run_apply(kubectl, _write_docs(tmp_path / "broken.yaml", broken))
    assert r.returncode != 0, r.stdout
    assert 'no matches for kind "StatefulSett"' in r.stderr, r.stderr
    # The same file with the kind put back goes through: the rejection was the kind.
    one(broken, "StatefulSett")["kind"] = "StatefulSet"
    r = dry_run_apply(kubectl, _write_docs(tmp_path / "fixed.yaml", broken))
    assert r.returncode == 0, r.stderr


def test_kubectl_dry_run_rejects_an_object_without_a_name(kubectl, tmp_path):
    docs = load_manifests()
    broken = copy.deepcopy(docs)
    del one(broken, "ConfigMap")["metadata"]["name"]
    r = dry_run_apply(kubectl, _write_docs(tmp_path / "broken.yaml", broken))
    assert r.returncode != 0, r.stdout
    assert "resource name may not be empty" in r.stderr, r.stderr


def schema_versions() -> list[str]:
    """The oldest and the newest Kubernetes whose schemas kubernetes-validate bundles."""
    from kubernetes_validate import utils
    versions = utils.all_versions()
    return sorted({utils.major_minor(versions[0]), utils.major_minor(versions[-1])})


def schema_errors(doc: dict) -> list[str]:
    import kubernetes_validate
    errors = []
    for version in schema_versions():
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            where = ".".join(str(p) for p in e.path)
            errors.append(f"{doc['kind']}/{doc['metadata'].get('name')} @ {version}: "
                          f"{where}: {e.message}")
    return errors


def test_manifests_match_the_kubernetes_schemas():
    docs = load_manifests()
    assert len(schema_versions()) == 2
    for d in docs:
        assert schema_errors(d) == []


@pytest.mark.parametrize("breakage,expected", [
    (lambda ss: ss["spec"].pop("selector"), "'selector' is a required property"),
    (lambda ss: ss["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]
        .update(pathh="/"), "'pathh' was unexpected"),
    (lambda ss: ss["spec"].update(replicas="three"), "'three' is not of type"),
], ids=["no-selector", "unknown-field", "wrong-type"])
def test_schema_check_rejects_a_broken_statefulset(breakage, expected):
    ss = copy.deepcopy(one(load_manifests(), "StatefulSet"))
    breakage(ss)
    errors = schema_errors(ss)
    assert len(errors) == len(schema_versions()), errors
    assert all(expected in e for e in errors), errors


def test_statefulset_and_services_fit_together():
    docs = load_manifests()
    ss = one(docs, "StatefulSet")
    headless = one(docs, "Service", lambda d: d["spec"].get("clusterIP") == "None")
    spec = ss["spec"]
    pod = spec["template"]
    assert spec["replicas"] == 3
    assert spec["serviceName"] == headless["metadata"]["name"] == "granary"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert [p["port"] for p in headless["spec"]["ports"]] == [PORT]
    labels = pod["metadata"]["labels"]
    assert labels_select(spec["selector"]["matchLabels"], labels)
    for svc in [d for d in docs if d["kind"] == "Service"]:
        assert labels_select(svc["spec"]["selector"], labels), svc["metadata"]["name"]
        for p in svc["spec"]["ports"]:
            assert p["port"] == PORT and p["targetPort"] in ("http", PORT)
    pdb = one(docs, "PodDisruptionBudget")
    assert labels_select(pdb["spec"]["selector"]["matchLabels"], labels)

    (c,) = pod["spec"]["containers"]
    assert c["image"] == "granary:latest"
    assert c.get("imagePullPolicy") == "IfNotPresent"  # `:latest` would default to Always
    assert [(p["name"], p["containerPort"]) for p in c["ports"]] == [("http", PORT)]
    env = {e["name"]: e for e in c["env"]}
    assert env["GRANARY_NODE_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        ref = env[key]["valueFrom"]["secretKeyRef"]
        assert ref["key"] == key and ref["name"] and ref.get("optional") is True
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] == HEALTH_PATH and get["port"] in ("http", PORT), probe
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]

    # The config: mounted where --config points, with keys granary knows.
    cm = one(docs, "ConfigMap")
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    (config_volume,) = [n for n, v in volumes.items()
                        if v.get("configMap", {}).get("name") == cm["metadata"]["name"]]
    (key,) = cm["data"]
    assert c["args"] == ["--config", f"{mounts[config_volume]['mountPath']}/{key}"]
    config = tomllib.loads(cm["data"][key])
    assert set(config) <= config_fields(), set(config) - config_fields()
    assert config["listen"] == f"0.0.0.0:{PORT}"
    assert config["backend"] == "s3" and config["s3_endpoint"].startswith("http")

    # Members come from the headless Service's name: every pod's address (ready or not),
    # each named by its own PTR record, whose first label is the pod's name, the node id
    # a node gives itself; scaling the StatefulSet needs no change of config.
    svc = headless["metadata"]["name"]
    assert "peer" not in config and "peers_file" not in config
    assert config["peers_dns"] == f"{svc}:{PORT}"

    # The cache lives on the claim, and fits in it.
    (claim,) = spec["volumeClaimTemplates"]
    assert mounts[claim["metadata"]["name"]]["mountPath"] == config["data_dir"]
    assert claim["metadata"]["name"] not in volumes
    storage = parse_size(claim["spec"]["resources"]["requests"]["storage"])
    assert 0 < parse_size(config["cache_capacity"]) < storage


# --------------------------------------------------------------------------
# Docker Compose
# --------------------------------------------------------------------------
def load_compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def granary_services(compose: dict) -> dict[str, dict]:
    return {n: s for n, s in compose["services"].items() if n.startswith("granary")}


def env_map(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) for e in env)
    return {k: str(v) for k, v in env.items()}


def test_compose_cluster_structure():
    compose = load_compose()
    nodes = granary_services(compose)
    assert sorted(nodes) == ["granary-0", "granary-1", "granary-2"]
    known_env = env_flags()
    peer_lists, node_ids, host_ports, volumes = set(), [], [], []
    for name, svc in nodes.items():
        assert svc["build"]["dockerfile"] == "deploy/Dockerfile"
        assert (COMPOSE_FILE.parent / svc["build"]["context"] / svc["build"]["dockerfile"]) \
            .resolve() == DOCKERFILE.resolve()
        env = env_map(svc)
        assert {k for k in env if k.startswith("GRANARY_")} <= known_env
        node_ids.append(env["GRANARY_NODE_ID"])
        peer_lists.add(env["GRANARY_PEER"])
        assert env["GRANARY_BACKEND"] == "s3"
        (port,) = svc["ports"]
        ip, host, container = port.split(":")
        assert ip == "127.0.0.1" and container == str(PORT)
        host_ports.append(int(host))
        (vol,) = svc["volumes"]
        source, target = vol.split(":")
        assert target == "/var/lib/granary"
        volumes.append(source)
        assert "networks" not in svc  # all on the project's default network
    assert node_ids == sorted(nodes) == ["granary-0", "granary-1", "granary-2"]
    assert len(peer_lists) == 1, peer_lists
    peers = dict(p.split("=", 1) for p in peer_lists.pop().split(","))
    assert sorted(peers) == sorted(nodes)
    for node_id, url in peers.items():
        assert url == f"http://{node_id}:{PORT}"
        assert node_id in compose["services"]
    assert sorted(host_ports) == [7070, 7071, 7072]
    assert len(set(volumes)) == 3 and set(volumes) <= set(compose["volumes"])


def test_compose_backend_is_a_service_or_configurable():
    compose = load_compose()
    for svc in granary_services(compose).values():
        env = env_map(svc)
        endpoint = env["GRANARY_S3_ENDPOINT"]
        # ${S3_ENDPOINT:-http://s3:5000}: the demo store unless told otherwise
        m = re.fullmatch(r"\$\{S3_ENDPOINT:-(http://([\w-]+):(\d+))\}", endpoint)
        assert m, endpoint
        assert m.group(2) in compose["services"]
        assert m.group(2) in svc["depends_on"]
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
            assert env[key], key
    assert compose["services"]["s3"]["image"].startswith("motoserver/moto")


def _compose_plugin() -> list[str] | None:
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cmd[0]) is None:
            continue
        try:
            r = subprocess.run([*cmd, "version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0:
            return cmd
    return None


def test_docker_compose_config_accepts_it(tmp_path):
    cmd = _compose_plugin()
    if cmd is None:
        pytest.skip("no working `docker compose` here")

    def config(path: Path) -> subprocess.CompletedProcess:
        return subprocess.run([*cmd, "-f", str(path), "--project-directory", str(DEPLOY),
                               "config", "-q"],
                              capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)

    r = config(COMPOSE_FILE)
    assert r.returncode == 0, r.stderr
    # ... and rejects a service that names neither an image nor a build.
    broken = load_compose()
    del broken["services"]["s3"]["image"]
    r = config(_write_docs(tmp_path / "broken-compose.yaml", [broken]))
    assert r.returncode != 0, r.stdout


# --------------------------------------------------------------------------
# systemd
# --------------------------------------------------------------------------
def _verify(unit: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)],
                          capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)


def _about(r: subprocess.CompletedProcess, unit_name: str) -> list[str]:
    """The lines of verify's output about this unit (not other units it loads)."""
    return [line for line in (r.stdout + r.stderr).splitlines() if unit_name in line]


@pytest.fixture(scope="module")
def systemd_verify(tmp_path_factory):
    """`systemd-analyze verify`, where it runs: a trivial valid unit must pass."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    true = os.path.realpath(shutil.which("true") or "/bin/true")
    d = tmp_path_factory.mktemp("systemd-probe")
    probe = d / "granary-probe.service"
    probe.write_text(f"[Service]\nType=oneshot\nExecStart={true}\n")
    r = _verify(probe)
    if r.returncode != 0:
        pytest.skip(f"systemd-analyze verify cannot run here: {r.stdout}{r.stderr}")

    def verify(text: str) -> subprocess.CompletedProcess:
        unit = tmp_path_factory.mktemp("systemd") / "granary.service"
        unit.write_text(text)
        return _verify(unit)

    verify.true = true
    return verify


def unit_for_verify(true: str) -> str:
    """The unit with ExecStart's binary, absent here, replaced by one that exists."""
    text = UNIT_FILE.read_text()
    (exec_start,) = [ln for ln in text.splitlines() if ln.startswith("ExecStart=")]
    assert exec_start.startswith("ExecStart=/usr/local/bin/granary serve --config ")
    return text.replace("ExecStart=/usr/local/bin/granary ", f"ExecStart={true} ")


def test_systemd_unit_verifies(systemd_verify):
    r = systemd_verify(unit_for_verify(systemd_verify.true))
    assert r.returncode == 0, r.stdout + r.stderr
    # verify exits 0 on unknown keys and bad values too: it must say nothing about the unit.
    assert _about(r, "granary.service") == [], r.stdout + r.stderr


@pytest.mark.parametrize("breakage,expected_rc0", [
    (lambda t: t.replace("RestartSec=", "RestartSecs="), True),
    (lambda t: t.replace("Restart=on-failure", "Restart=sometimes"), True),
    (lambda t: t.replace("[Service]", "[Servic]"), False),
], ids=["unknown-key", "bad-value", "no-service-section"])
def test_systemd_verify_rejects_a_broken_unit(systemd_verify, breakage, expected_rc0):
    good = unit_for_verify(systemd_verify.true)
    broken = breakage(good)
    assert broken != good
    r = systemd_verify(broken)
    assert _about(r, "granary.service"), r.stdout + r.stderr
    assert (r.returncode == 0) == expected_rc0, r.stdout + r.stderr


def test_systemd_unit_settings():
    text = UNIT_FILE.read_text()
    assert "StateDirectory=granary" in text
    assert re.search(r"^WantedBy=multi-user\.target$", text, re.M)
    assert re.search(r"^After=network-online\.target$", text, re.M)


# --------------------------------------------------------------------------
# Dockerfile
# --------------------------------------------------------------------------
def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, pending = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full = pending + line
        pending = ""
        op, _, args = full.strip().partition(" ")
        out.append((op.upper(), " ".join(args.split())))
    assert not pending
    return out


def test_dockerfile_builds_and_runs_the_node():
    ins = dockerfile_instructions()
    froms = [a for op, a in ins if op == "FROM"]
    assert len(froms) == 2, froms
    assert re.fullmatch(r"rust:1-bookworm AS (\w+)", froms[0], re.I), froms[0]
    builder = froms[0].split()[-1]
    assert froms[1] == "debian:bookworm-slim"
    runtime = ins[[i for i, (op, _) in enumerate(ins) if op == "FROM"][1]:]
    build_stage = ins[:len(ins) - len(runtime)]

    runs = " ".join(a for op, a in build_stage if op == "RUN")
    assert re.search(r"cargo build --release\b.*--bin granary\b", runs), runs
    # ... a binary the workspace has.
    server_toml = tomllib.loads((REPO_ROOT / "server" / "Cargo.toml").read_text())
    assert "granary" in [b["name"] for b in server_toml.get("bin", [])]

    assert "ca-certificates" in " ".join(a for op, a in runtime if op == "RUN")
    copies = [a for op, a in runtime if op == "COPY"]
    assert any(a.startswith(f"--from={builder} ") and a.endswith(" /usr/local/bin/granary")
               for a in copies), copies
    (user,) = [a for op, a in runtime if op == "USER"]
    assert user.split(":")[0] not in ("root", "0")
    assert [a for op, a in runtime if op == "EXPOSE"] == [str(PORT)]
    (entrypoint,) = [a for op, a in runtime if op == "ENTRYPOINT"]
    assert json.loads(entrypoint) == ["/usr/local/bin/granary", "serve"]
    (cmd,) = [a for op, a in runtime if op == "CMD"]
    cmd = json.loads(cmd)
    assert cmd[cmd.index("--listen") + 1] == f"0.0.0.0:{PORT}"
    # The compose file mounts each node's volume where the image keeps its data.
    assert cmd[cmd.index("--data-dir") + 1] == "/var/lib/granary"
    # Defaults as flags, not ENV: an ENV GRANARY_* would override a --config file.
    assert not [a for op, a in runtime if op == "ENV" and "GRANARY_" in a]


def test_dockerignore_keeps_the_build_context_small():
    ignore = (REPO_ROOT / ".dockerignore").read_text().split()
    for path in ("target", "tests/.venv", "granary-data"):
        assert path in ignore or f"{path}/" in ignore, path
