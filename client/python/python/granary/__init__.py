"""Granary's client for training jobs.

``Client`` reads and writes objects, shard members, GetBatch streams and prefetch jobs on
any node. ``ShardDataset`` is a PyTorch ``IterableDataset`` over WebDataset-style tar
shards: a per-epoch order every rank computes alike, samples split exactly over ranks and
DataLoader workers with equal counts per rank, reads routed to each shard's owner, and
mid-epoch resume on the same or another world size. The work is done in Rust
(``granary._granary``, over the ``granary-client`` crate); calls that wait on the network
release the GIL.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import warnings
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from . import _granary
from ._granary import BatchIter, GranaryError, SampleIter, Shards

__all__ = ["Client", "GranaryError", "ShardDataset", "StallReport", "analyze", "cuda_available",
           "map_local"]


def cuda_available() -> bool:
    """Whether GPU delivery can run here: a CUDA driver loads and shows a device."""
    return hasattr(_granary, "cuda_available") and _granary.cuda_available()


def _tensor(device_bytes):
    import torch
    return torch.as_tensor(device_bytes, device=f"cuda:{device_bytes.device}")


def _cuda_ordinal(device) -> int:
    text = str(device)
    if text == "cuda":
        return 0
    if text.startswith("cuda:"):
        return int(text[5:])
    raise ValueError(f"device {device!r}: GPU delivery takes 'cuda' or 'cuda:N'")


class Client(_granary.Client):
    """A client of one node: ``http://host:port``, or ``unix:PATH`` on its machine."""

    def get_into(self, bucket: str, key: str, buf,
                 range: Optional[Tuple[int, int]] = None) -> int:
        """Reads an object (or ``range``) into ``buf``, any writable C-contiguous buffer
        (``bytearray``, a numpy array, a pinned tensor's ``.numpy()``, ``mmap``),
        straight from the socket; returns the bytes written. An object larger than
        ``buf`` raises ``GranaryError`` and leaves ``buf``'s contents unspecified."""
        view = memoryview(buf)
        if view.readonly:
            raise TypeError("get_into needs a writable buffer")
        if not view.c_contiguous:
            raise ValueError("get_into needs a C-contiguous buffer")
        view = view.cast("B")
        n = view.nbytes
        if n == 0:
            return super()._get_into(bucket, key, 0, 0, range)
        # A ctypes view holds the buffer exported (it cannot move or shrink) while the
        # bytes are written into it.
        held = (ctypes.c_char * n).from_buffer(view)
        try:
            return super()._get_into(bucket, key, ctypes.addressof(held), n, range)
        finally:
            del held
            view.release()

    def get_to_device(self, bucket: str, key: str, device="cuda",
                      range: Optional[Tuple[int, int]] = None):
        """An object's bytes (or ``range``) as a ``torch.uint8`` CUDA tensor, received
        through two pinned host buffers, each copied to the device while the other
        fills. Raises ``GranaryError`` where no GPU can be used."""
        if not hasattr(_granary.Client, "get_to_device"):
            raise GranaryError("this build of granary has no GPU delivery", None, None)
        return _tensor(super().get_to_device(bucket, key, _cuda_ordinal(device), range))

GranaryError.message = property(lambda self: self.args[0] if self.args else "")
GranaryError.code = property(lambda self: self.args[1] if len(self.args) > 1 else None)
GranaryError.status = property(lambda self: self.args[2] if len(self.args) > 2 else None)

try:  # torch is optional for Client; ShardDataset is a torch dataset when it is there.
    from torch.utils.data import IterableDataset as _Base
    from torch.utils.data import get_worker_info as _worker_info
except ImportError:  # pragma: no cover - exercised without torch only
    _Base = object  # type: ignore[assignment,misc]

    def _worker_info():  # type: ignore[no-redef]
        return None


def map_local(client: Client, bucket: str, key: str,
              range: Optional[Tuple[int, int]] = None) -> Optional[memoryview]:
    """An object's bytes as a read-only ``memoryview`` over the node's cache file, with no
    copy, when the node runs on this machine (a ``unix:`` endpoint, or ``local_socket``)
    and holds the object; else ``None``."""
    got = client.open_local(bucket, key, range)
    if got is None:
        return None
    fd, offset, length = got
    try:
        if length == 0:
            return memoryview(b"")
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        m = mmap.mmap(fd, length + (offset - start), access=mmap.ACCESS_READ, offset=start)
    finally:
        os.close(fd)
    return memoryview(m)[offset - start:offset - start + length]


def _distributed() -> Optional[Tuple[int, int]]:
    """``torch.distributed``'s rank and world size in this process, where it is
    initialised (a forked DataLoader worker inherits its parent's)."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - exercised without torch only
        return None
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def _env_int(name: str) -> Optional[int]:
    text = os.environ.get(name)
    if text is None or not text.strip():
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"env {name}={text!r} is not an integer") from None


class ShardDataset(_Base):  # type: ignore[misc,valid-type]
    """Samples of the tar shards under ``prefix``, one dict each:
    ``{"__key__": str, "__url__": shard key, EXT: bytes, ...}``.

    Each epoch (``set_epoch``) has one order, a function of ``seed``, the epoch and the
    dataset: shards shuffled, their samples laid end to end, each rank taking a contiguous
    span of it (so reads stay sequential within shards), mixed through a
    ``shuffle_buffer`` of samples. Every rank yields the same count: a few samples are
    repeated to pad, or with ``drop_last`` the remainder is dropped. DataLoader workers
    take whole batches of ``batch_size`` in turn, so the training loop sees the rank's
    order whatever the number of workers; give the DataLoader's ``batch_size`` for exact
    resume with workers.

    With the node on this machine (a ``unix:`` endpoint, or the socket the node offers
    to ``http://127.0.0.1:…``), each run of samples is copied out of the node's cache
    file where its pages are in memory, rather than sent through the socket.

    With ``zero_copy=True`` and a ``unix:`` endpoint (the node on this machine), member
    values are read-only ``memoryview``s of the node's cache file, mapped: no byte is
    copied (``numpy.frombuffer``/``torch.frombuffer`` take them as they are). They cannot
    cross to the training loop from DataLoader workers (a ``memoryview`` does not
    pickle): decode them in the worker with ``map`` (a function applied to each sample
    where it is read), or read in the main process.

    With ``device="cuda"`` (or ``"cuda:N"``), member values are raw ``torch.uint8`` CUDA
    tensors, copied through pinned buffers; read in the main process (CUDA does not
    survive a DataLoader worker's fork).

    With ``pipeline="NAME"`` (a node's ``[pipelines.NAME]``) the members the pipeline
    takes arrive prepared by their shard's owner for the dataset's ``seed`` and the
    current epoch: a new random crop and flip each epoch, the same bytes for every job
    with that seed (which the node prepares once for all of them). Raw output reads as
    ``numpy.frombuffer(b, numpy.uint8).reshape(H, W, 3)``. With ``prepare="local"`` the
    same pipeline runs here, in the process that reads, to the same bytes: for a
    cluster with no cores to spare, or to compare. A member that cannot be prepared
    raises ``GranaryError`` naming its sample; the samples, their order, the split over
    ranks and resume are as without a pipeline.

    ``state_dict(consumed)`` (samples consumed in the epoch by all ranks together) and
    ``load_state_dict`` resume the epoch on any world size: the samples not yet consumed,
    each exactly once across the new ranks.

    Rank and world size are looked up where they are used, in the process that uses
    them, not at construction: the arguments where given, else ``torch.distributed``,
    else env ``RANK``/``WORLD_SIZE``, else 0 of 1. A dataset built in a driver and
    shipped to workers (Ray Train's ``train_loop_config``, a spawned process) splits by
    each worker's rank. A DataLoader worker started by ``spawn`` takes its parent's
    ``torch.distributed`` rank when it finds none of its own.
    """

    def __init__(self, endpoint: str, bucket: str, prefix: str, seed: int = 0,
                 shuffle_buffer: int = 0, rank: Optional[int] = None,
                 world_size: Optional[int] = None, drop_last: bool = False,
                 access_key: Optional[str] = None, secret_key: Optional[str] = None, *,
                 batch_size: int = 1, read_ahead: int = 2, shuffle_shards: bool = True,
                 route: bool = True, region: str = "us-east-1", timeout: float = 60.0,
                 zero_copy: bool = False, map=None, device=None, plan: bool = True,
                 pipeline: Optional[str] = None, prepare: str = "node"):
        super().__init__()
        self.endpoint = endpoint
        self.bucket = bucket
        self.prefix = prefix
        self.seed = int(seed)
        self.shuffle_buffer = int(shuffle_buffer)
        # The arguments, where given; the rest is looked up where it is used (`_place`).
        self._rank_arg = None if rank is None else int(rank)
        self._world_arg = None if world_size is None else int(world_size)
        if self._rank_arg is not None and self._world_arg is not None:
            self._check_place(self._rank_arg, self._world_arg, "the arguments")
        # torch.distributed's place in the process that pickled this dataset, for a
        # DataLoader worker that finds none of its own (one started by `spawn`).
        self._parent_place: Optional[Tuple[int, int]] = None
        self._warned = False
        self.drop_last = bool(drop_last)
        self.batch_size = max(1, int(batch_size))
        self.read_ahead = max(0, int(read_ahead))
        self.shuffle_shards = bool(shuffle_shards)
        self.route = bool(route)
        self.zero_copy = bool(zero_copy)
        self.plan = bool(plan)
        self.map = map
        self.device = device if device is None else _cuda_ordinal(device)
        self._auth = (access_key, secret_key, region, float(timeout))
        self.epoch = 0
        # The resume history of epoch `_rounds_epoch`: (world_size, shuffle_buffer,
        # drop_last, consumed) per round.
        self._rounds: List[Tuple[int, int, bool, int]] = []
        self._rounds_epoch: Optional[int] = None
        self._shards = Shards.list(endpoint, bucket, prefix, access_key, secret_key,
                                   region, float(timeout))
        if prepare not in ("node", "local"):
            raise ValueError(f"prepare={prepare!r}: 'node' or 'local'")
        self.pipeline = pipeline
        self.prepare = prepare
        # The definition, for a pipeline run here (the node's own, so the same bytes).
        self._pipeline_json: Optional[str] = None
        self._local_pipeline = None
        if pipeline is not None and prepare == "local":
            defs = Client(endpoint, access_key, secret_key, region, timeout).pipelines()
            if pipeline not in (defs or {}):
                raise ValueError(f"pipeline {pipeline!r}: the node has "
                                 f"{sorted(defs or {}) or 'none'}")
            self._pipeline_json = json.dumps(defs[pipeline])

    # The catalog crosses to spawned workers as JSON; connections are never inherited.
    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        state["_shards"] = self._shards.to_json()
        state["_local_pipeline"] = None
        state["_parent_place"] = _distributed() or self._parent_place
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        state = dict(state)
        state["_shards"] = Shards.from_json(state["_shards"])
        self.__dict__.update(state)

    @staticmethod
    def _check_place(rank: int, world_size: int, source: str) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} of world size {world_size} (from {source})")

    def _found_place(self) -> Tuple[Optional[int], Optional[int], str]:
        """This process's rank and world size where something says them, and what."""
        dist = _distributed()
        if dist is not None:
            return dist[0], dist[1], "torch.distributed"
        rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
        if rank is not None or world is not None:
            return rank, world, "env RANK/WORLD_SIZE"
        if self._parent_place is not None and _worker_info() is not None:
            return self._parent_place[0], self._parent_place[1], "the DataLoader's process"
        return None, None, "no launcher"

    def _place(self) -> Tuple[int, int]:
        """Rank and world size here and now: the arguments, else what
        ``_found_place`` finds, else 0 of 1."""
        rank, world = self._rank_arg, self._world_arg
        found_rank, found_world, source = self._found_place()
        if source == "torch.distributed" and not self._warned:
            given = [f"{name}={arg}" for name, arg, found in
                     (("rank", rank, found_rank), ("world_size", world, found_world))
                     if arg is not None and arg != found]
            if given:
                self._warned = True
                warnings.warn(
                    f"ShardDataset: {', '.join(given)} given, but torch.distributed says "
                    f"rank {found_rank} of {found_world}; the arguments win",
                    RuntimeWarning, stacklevel=3)
        if rank is None:
            rank = 0 if found_rank is None else found_rank
        if world is None:
            world = 1 if found_world is None else found_world
        if self._rank_arg is None or self._world_arg is None:
            self._check_place(rank, world, "the arguments" if source == "no launcher"
                              else f"the arguments and {source}")
        return rank, world

    def _place_known(self) -> bool:
        """Whether the arguments or the process say the world size (a driver that says
        neither leaves its plan to the processes that iterate)."""
        return self._world_arg is not None or self._found_place()[2] != "no launcher"

    @property
    def rank(self) -> int:
        """This process's rank, as looked up now."""
        return self._place()[0]

    @property
    def world_size(self) -> int:
        """The world size, as looked up now."""
        return self._place()[1]

    @property
    def shards(self) -> List[str]:
        """The shard keys, in key order."""
        return self._shards.keys()

    @property
    def num_samples(self) -> int:
        """Samples in the dataset."""
        return len(self._shards)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        self._register()

    def _register(self) -> Optional[str]:
        """Registers the current epoch's plan with the cluster (with ``plan=True``): its
        nodes then fetch each shard before the ranks read it. Nothing changes in what is
        read; a node that takes no plans is left alone. Where nothing says the world
        size yet (a driver), the plan is left to the iteration, which registers it with
        the world size found there."""
        if not self.plan or not self._place_known():
            return None
        return self._shards.register(self._epoch_read(
            world_size=self.world_size,
            pipeline=self.pipeline if self._pipeline_json is None else None))

    def _epoch_read(self, **fields: Any) -> "_granary.EpochRead":
        """How this dataset reads the current epoch, with ``fields`` (the rank's place,
        and what differs between registering and reading) added."""
        access_key, secret_key, region, timeout = self._auth
        return _granary.EpochRead(
            endpoint=self.endpoint, epoch=self.epoch, seed=self.seed,
            shuffle_shards=self.shuffle_shards, rounds=self._current_rounds(),
            shuffle_buffer=self.shuffle_buffer, drop_last=self.drop_last,
            batch_size=self.batch_size, access_key=access_key, secret_key=secret_key,
            region=region, timeout=timeout, **fields)

    def _current_rounds(self) -> List[Tuple[int, int, bool, int]]:
        return list(self._rounds) if self._rounds_epoch == self.epoch else []

    def __len__(self) -> int:
        """Samples this rank yields in the current epoch (all its workers together)."""
        return self._shards.count(self._epoch_read(world_size=self.world_size))

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        info = _worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        # The rank of the process that iterates, found as its epoch starts; the read
        # registers the epoch's plan with it.
        rank, world_size = self._place()
        samples = self._shards.read(self._epoch_read(
            world_size=world_size, rank=rank, worker=worker, workers=workers,
            read_ahead=self.read_ahead, route=self.route, zero_copy=self.zero_copy,
            plan=self.plan,
            # A DataLoader worker copies runs out of a node on this machine as it needs
            # them: the workers are the parallelism, and threads copying ahead take the
            # cores the other workers and the training loop run on.
            ahead_here=info is None,
            pipeline=self.pipeline if self._pipeline_json is None else None))
        if self._pipeline_json is not None:
            samples = (self._prepared_here(s) for s in samples)
        if self.device is not None:
            samples = (self._to_device(s) for s in samples)
        if self.map is None:
            return samples
        return (self.map(s) for s in samples)

    def _prepared_here(self, sample: Dict[str, Any]) -> Dict[str, Any]:
        """``sample`` with the members the pipeline takes prepared in this process, as
        the shard's owner would prepare them."""
        p = self._local_pipeline
        if p is None:
            p = self._local_pipeline = _granary.Pipeline(self._pipeline_json)
        key = _granary.Pipeline.sample_key(sample["__url__"], sample["__key__"])
        for ext, value in sample.items():
            if not ext.startswith("__") and p.prepares("x." + ext):
                data = value if isinstance(value, bytes) else bytes(value)
                sample[ext] = p.prepare(data, self.seed, self.epoch, key)[0]
        return sample

    def _to_device(self, sample: Dict[str, Any]) -> Dict[str, Any]:
        out = {}
        for k, v in sample.items():
            if k.startswith("__"):
                out[k] = v
            else:
                out[k] = _tensor(_granary.to_device(bytes(v), self.device))
        return out

    def state_dict(self, consumed: int) -> Dict[str, Any]:
        """Where the epoch stands after ``consumed`` samples by all ranks together (each
        rank the same count)."""
        rounds = self._current_rounds()
        before = sum(r[3] for r in rounds)
        now = int(consumed) - before
        world_size = self.world_size
        if now < 0 or now % world_size:
            raise ValueError(
                f"consumed={consumed}: expected {before} consumed before this run plus a "
                f"multiple of the world size {world_size}")
        rounds.append((world_size, self.shuffle_buffer, self.drop_last, now))
        return {
            "version": 1,
            "epoch": self.epoch,
            "seed": self.seed,
            "shuffle_shards": self.shuffle_shards,
            "samples": self.num_samples,
            "consumed": int(consumed),
            "rounds": [list(r) for r in rounds],
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resumes the epoch ``state`` describes: this dataset then yields this rank's
        share of the samples not yet consumed."""
        if state.get("version") != 1:
            raise ValueError(f"unknown state version {state.get('version')!r}")
        if state["seed"] != self.seed or state["shuffle_shards"] != self.shuffle_shards:
            raise ValueError("the state was taken with another seed or shard shuffle")
        if state["samples"] != self.num_samples:
            raise ValueError(
                f"the state was taken on a dataset of {state['samples']} samples; "
                f"this one has {self.num_samples}")
        self.epoch = int(state["epoch"])
        self._rounds = [(int(w), int(s), bool(d), int(c)) for w, s, d, c in state["rounds"]]
        self._rounds_epoch = self.epoch
        self._register()

    def prefetch_ahead(self) -> str:
        """Asks the cluster to warm every shard of the dataset (for the next epoch, or
        before the first): the prefetch job's id, for ``Client.job``."""
        access_key, secret_key, region, timeout = self._auth
        c = Client(self.endpoint, access_key, secret_key, region, timeout)
        return c.prefetch(self.bucket, self.prefix)


# Last, as it reads the classes above: `granary.analyze` is the function (the module of
# the same name runs it from the command line: `python -m granary.analyze SCRIPT.py`).
from .analyze import StallReport, analyze  # noqa: E402
