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
