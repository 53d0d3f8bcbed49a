"""Helpers shared by the Granary Python test modules (imported by conftest and tests)."""

from __future__ import annotations

import hashlib
import re
import uuid
from pathlib import Path

ACCESS_KEY = "granarytest"
SECRET_KEY = "granarysecret123"
REGION = "us-east-1"
MiB = 1024 * 1024


def md5_hex(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def multipart_etag(data: bytes, part_size: int) -> str:
    """S3's ETag for `data` uploaded in parts of `part_size` bytes (quoted)."""
    digests = [hashlib.md5(data[i:i + part_size]).digest()
               for i in range(0, len(data), part_size)]
    return '"%s-%d"' % (hashlib.md5(b"".join(digests)).hexdigest(), len(digests))


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def unique_bucket_name(hint: str) -> str:
    """A valid S3 bucket name (lowercase, 3-63 chars) unique to this run."""
    hint = re.sub(r"[^a-z0-9-]+", "-", hint.lower()).strip("-")
    hint = re.sub(r"-+", "-", hint)[:40].strip("-") or "t"
    name = f"gt-{hint}-{uuid.uuid4().hex[:10]}"
    assert 3 <= len(name) <= 63
    return name


def as_list(batch):
    """A DataLoader's collate_fn that keeps a batch's samples as they are."""
    return batch


def read_where_launched(ds, env: dict, workers: int, out, dist_file: str | None = None,
                        rank: int | None = None, world: int | None = None) -> None:
    """Runs in a spawned process, as a launcher's worker: sets ``env``, joins a gloo
    group through ``dist_file`` where given (rank ``rank`` of ``world``), then reads
    ``ds``'s epoch through a DataLoader of ``workers`` (started by ``spawn``) and puts
    ``(rank and world as the dataset saw them, keys, the warnings it gave)`` on ``out``."""
    import os
    import warnings

    os.environ.update(env)
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    if dist_file is not None:
        dist.init_process_group("gloo", init_method=f"file://{dist_file}", rank=rank,
                                world_size=world)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        place = (ds.rank, ds.world_size)
        loader = DataLoader(ds, batch_size=4, num_workers=workers, collate_fn=as_list,
                            multiprocessing_context="spawn" if workers else None)
        keys = [s["__key__"] for batch in loader for s in batch]
        n = len(ds)
    said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)
            and "ShardDataset" in str(w.message)]
    out.put((place, keys, n, said))
    if dist_file is not None:
        dist.destroy_process_group()
