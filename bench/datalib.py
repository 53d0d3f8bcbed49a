"""What the Python data-loader benches share: WebDataset-style tar shards of random
samples, the tarfile reader a boto3 or local-file user writes, and the DataLoader's own
ceiling (samples made in memory). Needs torch; nothing else outside the standard library."""

from __future__ import annotations

import io
import mmap
import os
import socket
import tarfile
from pathlib import Path

from torch.utils.data import IterableDataset, get_worker_info


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def make_shards(directory: Path, shards: int, per_shard: int, sample: int,
                jitter: int = 73) -> int:
    """`shards` tar files `shard-NNNNNN.tar` in `directory`, each of `per_shard`
    samples: a `.bin` of about `sample` bytes (`jitter` varies it; 0 keeps it exact) and
    a `.cls`. Returns the number of samples."""
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(shards):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
            for j in range(per_shard):
                size = sample - 512 + (j % 7) * jitter if jitter else sample
                for ext, data in (("bin", os.urandom(size)), ("cls", str(j % 10).encode())):
                    info = tarfile.TarInfo(f"s{i:04}/{j:04}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        (directory / f"shard-{i:06}.tar").write_bytes(buf.getvalue())
    return shards * per_shard


def tar_samples(stream, url: str):
    """WebDataset-style samples out of a tar stream, with tarfile (what a boto3,
    s3torchconnector or local-file user writes)."""
    current, key = {}, None
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for m in tar:
            if not m.isfile():
                continue
            base, _, ext = m.name.partition(".")
            if key is not None and base != key:
                yield current
                current = {}
            key = base
            current["__key__"], current["__url__"] = base, url
            current[ext] = tar.extractfile(m).read()
    if current:
        yield current


def worker_split():
    """This DataLoader worker's index and the number of workers (0, 1 outside one)."""
    info = get_worker_info()
    return (info.id, info.num_workers) if info else (0, 1)


class Ceiling(IterableDataset):
    """The DataLoader's own ceiling: `total` samples of `sample` bytes made in memory,
    split over the workers, no reading or parsing at all."""

    def __init__(self, total: int, sample: int):
        self.total, self.sample = total, sample

    def __iter__(self):
        w, k = worker_split()
        # Distinct objects (a batch pickles each once, as it would read ones).
        blobs = [os.urandom(self.sample) for _ in range(64)]
        for j in range(w, self.total, k):
            yield {"__key__": str(j), "__url__": "", "bin": blobs[j % 64], "cls": b"1"}


class LocalTarShards(IterableDataset):
    """The same shards read from local files with tarfile, split over the workers."""

    def __init__(self, paths: list):
        self.paths = [str(p) for p in paths]

    def __iter__(self):
        w, k = worker_split()
        for p in self.paths[w::k]:
            with open(p, "rb") as f:
                yield from tar_samples(f, p)


def tar_index(path) -> list:
    """A shard's samples as [(key, {ext: (offset, size)})], from its tar headers alone
    (tarfile seeks from header to header; no member's bytes are read). What a careful
    local-file user builds once per shard and keeps."""
    samples, by_key = [], {}
    with tarfile.open(path, mode="r:") as tar:
        for m in tar.getmembers():
            if not m.isfile():
                continue
            base, _, ext = m.name.partition(".")
            if base not in by_key:
                by_key[base] = {}
                samples.append((base, by_key[base]))
            by_key[base][ext] = (m.offset_data, m.size)
    return samples


class LocalIndexedShards(IterableDataset):
    """The same shards read from local files through an index of member offsets (built
    once, in the constructor): with ``how="pread"`` each member is one ``os.pread`` into
    its own bytes; with ``how="mmap"`` each is a slice of the shard's read-only mapping,
    no copy at all until the collation's (the mapping stays open while slices of it
    live). The best a local reader does, short of the page cache's own pages on a GPU."""

    def __init__(self, paths: list, how: str = "pread"):
        assert how in ("pread", "mmap"), how
        self.paths = [str(p) for p in paths]
        self.index = [tar_index(p) for p in self.paths]
        self.how = how

    def __iter__(self):
        w, k = worker_split()
        for p, samples in list(zip(self.paths, self.index))[w::k]:
            fd = os.open(p, os.O_RDONLY)
            try:
                if self.how == "mmap":
                    view = memoryview(mmap.mmap(fd, 0, access=mmap.ACCESS_READ))
                    read = lambda off, size: view[off:off + size]
                else:
                    read = lambda off, size: os.pread(fd, size, off)
                for key, members in samples:
                    sample = {"__key__": key, "__url__": p}
                    for ext, (off, size) in members.items():
                        sample[ext] = read(off, size)
                    yield sample
            finally:
                os.close(fd)  # a mapping outlives its descriptor
