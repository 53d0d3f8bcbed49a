"""Granary under Ray, as a Ray user runs it: Ray Train's TorchTrainer with 2 CPU workers
over a ShardDataset built in the driver (every sample once, equal counts), Ray Data's
`read_webdataset` and `read_parquet` (and `write_parquet`) through the node's S3
endpoint, and a Ray Train checkpoint saved to the node and restored from it.

Its own tier in tests/run.sh, which installs Ray (requirements-ray.txt) into the test
venv and bounds the tier's time; the main Python tier leaves this file out. Ray stays on
the loopback: `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` keeps it from replacing 127.0.0.1
with the machine's address, and usage stats are off.
"""

from __future__ import annotations

import collections
import hashlib
import io
import json
import os
import sys
import tarfile
from pathlib import Path

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

ray = pytest.importorskip("ray", reason="Ray is not installed here (tests/run.sh installs "
                                        "it in its Ray tier: tests/python/requirements-ray.txt)")
pytest.importorskip("ray.train.torch", reason="Ray Train is not installed (ray[train])")
pytest.importorskip("ray.data", reason="Ray Data is not installed (ray[data])")
torch = pytest.importorskip("torch")
granary = pytest.importorskip("granary")
import pyarrow.fs  # noqa: E402  (Ray Data's dependency)
from ray.train import Checkpoint, RunConfig, ScalingConfig  # noqa: E402
from ray.train.torch import TorchTrainer  # noqa: E402

from granary_testutil import ACCESS_KEY, REGION, SECRET_KEY  # noqa: E402
from test_granary_py import one_node  # noqa: E402

BUCKET = "train"
CKPT_BUCKET = "ckpts"
SHARDS, PER_SHARD = 6, 11  # 66 samples: 33 per rank of 2


def sample(i: int) -> dict[str, bytes]:
    """Sample `i`'s members: bytes a function of `i`, of varied length."""
    body = hashlib.sha256(str(i).encode()).digest() * (1 + 37 * (i % 9))
    return {"bin": body, "cls": str(i % 10).encode()}


def digest(members: dict) -> str:
    return hashlib.md5(members["bin"] + b"|" + members["cls"]).hexdigest()


def write_shards(d: Path) -> dict[str, str]:
    """WebDataset shards under `d`; each sample's digest by key."""
    d.mkdir(parents=True)
    every = {}
    for s in range(SHARDS):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
            for j in range(PER_SHARD):
                i = s * PER_SHARD + j
                key = f"sample{i:04}"
                members = sample(i)
                for ext, data in members.items():
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                every[key] = digest(members)
        (d / f"shard-{s:04}.tar").write_bytes(buf.getvalue())
    return every


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """One credentialed node over an fs origin with the shards under `train/wds/` and an
    empty `ckpts` bucket: (endpoint, samples' digests, root)."""
    root = tmp_path_factory.mktemp("raynode")
    origin = root / "origin"
    every = write_shards(origin / BUCKET / "wds")
    (origin / CKPT_BUCKET).mkdir()
    with one_node(root, origin, "ray", creds=True) as endpoint:
        yield endpoint, every, root


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray instance on the loopback, with CPU room for 2 train workers, their
    controller and Ray Data's tasks on a 2-core machine."""
    # The train loops below go to Ray's workers by value: this module is not on their
    # path.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=4, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def s3fs(endpoint: str) -> pyarrow.fs.S3FileSystem:
    """pyarrow's S3 filesystem on the node, as Ray Data and Ray Train take it."""
    return pyarrow.fs.S3FileSystem(
        access_key=ACCESS_KEY, secret_key=SECRET_KEY, region=REGION,
        endpoint_override=endpoint.removeprefix("http://"), scheme="http")


def read_epoch(config):
    """Ray Train's loop: reads the epoch of the dataset the driver built, on this
    worker's rank, and writes what it saw; rank 0 saves a checkpoint."""
    import tempfile

    import ray.train
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    ds = config["dataset"]
    ds.set_epoch(config["epoch"])
    keys, digests = [], {}
    for batch in DataLoader(ds, batch_size=4, collate_fn=list):
        for s in batch:
            keys.append(s["__key__"])
            digests[s["__key__"]] = digest(s)
    rank = dist.get_rank()
    seen = {"rank": rank, "place": [ds.rank, ds.world_size], "len": len(ds), "keys": keys,
            "digests": digests}
    Path(config["out"], f"rank-{rank}.json").write_text(json.dumps(seen))
    with tempfile.TemporaryDirectory() as d:
        checkpoint = None
        if rank == 0:
            torch.save({"samples": len(keys), "weights": torch.arange(1000.0) * 0.5},
                       Path(d, "model.pt"))
            checkpoint = Checkpoint.from_directory(d)
        ray.train.report({"samples": len(keys)}, checkpoint=checkpoint)


def restore(config):
    """Ray Train's loop on resume: loads the checkpoint of the run it resumes (Ray's
    own, where it restarts a run) or the one it was handed, and writes what it holds."""
    import ray.train
    import torch.distributed as dist

    checkpoint = ray.train.get_checkpoint() or config["checkpoint"]
    got = None
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            state = torch.load(Path(d, "model.pt"))
        got = {"samples": state["samples"], "weights": state["weights"].tolist()}
    Path(config["out"], f"restored-{dist.get_rank()}.json").write_text(json.dumps(got))
    ray.train.report({"restored": got is not None})


@pytest.fixture(scope="module")
def trained(node, ray_local, tmp_path_factory):
    """TorchTrainer, 2 CPU workers, over a ShardDataset built here in the driver (world
    size 1 here) and handed over in `train_loop_config`; its checkpoint on the node.
    (result, what each rank wrote)."""
    endpoint, _, _ = node
    out = tmp_path_factory.mktemp("rayout")
    ds = granary.ShardDataset(endpoint, BUCKET, "wds/", seed=3, batch_size=4,
                              access_key=ACCESS_KEY, secret_key=SECRET_KEY)
    assert ds.world_size == 1
    trainer = TorchTrainer(
        read_epoch,
        train_loop_config={"dataset": ds, "epoch": 1, "out": str(out)},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(name="granary-ray", storage_path=f"{CKPT_BUCKET}/runs",
                             storage_filesystem=s3fs(endpoint)))
    result = trainer.fit()
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)]
    return result, ranks, out


def test_torch_trainer_reads_each_sample_once_from_a_driver_built_dataset(node, trained):
    _, every, _ = node
    _, ranks, _ = trained
    assert [r["place"] for r in ranks] == [[0, 2], [1, 2]]
    counts = [len(r["keys"]) for r in ranks]
    assert counts == [len(every) // 2] * 2 == [r["len"] for r in ranks]
    seen = collections.Counter(k for r in ranks for k in r["keys"])
    assert set(seen) == set(every) and set(seen.values()) == {1}
    for r in ranks:
        for key, d in r["digests"].items():
            assert d == every[key], key
    # The cluster holds the ranks' plan (world size 2), not the driver's.
    plans = [p for p in granary.Client(node[0], ACCESS_KEY, SECRET_KEY).plans()
             if p["prefix"] == "wds/" and p["epoch"] == 1]
    assert [p["world_size"] for p in plans] == [2], plans


def test_a_ray_train_checkpoint_is_saved_to_granary_and_restored(node, ray_local, trained):
    endpoint, _, _ = node
    result, _, out = trained
    checkpoint = result.checkpoint
    assert checkpoint is not None and checkpoint.path.startswith(f"{CKPT_BUCKET}/runs/")
    # The checkpoint's file is an object on the node, its bytes a loadable state.
    c = granary.Client(endpoint, ACCESS_KEY, SECRET_KEY)
    prefix = checkpoint.path.removeprefix(f"{CKPT_BUCKET}/") + "/"
    assert f"{prefix}model.pt" in c.list(CKPT_BUCKET, prefix)
    state = torch.load(io.BytesIO(c.get(CKPT_BUCKET, f"{prefix}model.pt")))
    assert state["samples"] == 33
    assert torch.equal(state["weights"], torch.arange(1000.0) * 0.5)
    # A new run handed the checkpoint (Ray Train's way since `resume_from_checkpoint`
    # went): each worker loads it from the node.
    trainer = TorchTrainer(
        restore, train_loop_config={"out": str(out), "checkpoint": checkpoint},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(name="granary-ray-resumed", storage_path=f"{CKPT_BUCKET}/runs",
                             storage_filesystem=s3fs(endpoint)))
    trainer.fit()
    for r in range(2):
        got = json.loads((out / f"restored-{r}.json").read_text())
        assert got == {"samples": 33, "weights": [i * 0.5 for i in range(1000)]}, r


def test_ray_data_reads_webdataset_shards_through_the_s3_endpoint(node, ray_local):
    endpoint, every, _ = node
    rows = ray.data.read_webdataset(f"{BUCKET}/wds/", filesystem=s3fs(endpoint),
                                    decoder=None).take_all()
    got = {r["__key__"]: digest({"bin": r["bin"], "cls": r["cls"]}) for r in rows}
    assert len(rows) == len(every)
    assert got == every


def test_ray_data_writes_and_reads_parquet_through_the_s3_endpoint(node, ray_local):
    endpoint, _, _ = node
    fs = s3fs(endpoint)
    items = [{"id": i, "text": f"row {i}", "value": i * 0.25} for i in range(500)]
    ray.data.from_items(items).write_parquet(f"{BUCKET}/table/", filesystem=fs)
    # pyarrow marks the folder with an empty `table/` object, as on S3.
    names = granary.Client(endpoint, ACCESS_KEY, SECRET_KEY).list(BUCKET, "table/")
    files = [n for n in names if n != "table/"]
    assert files and all(n.endswith(".parquet") for n in files), names
    back = ray.data.read_parquet(f"{BUCKET}/table/", filesystem=fs).take_all()
    assert sorted(back, key=lambda r: r["id"]) == items
