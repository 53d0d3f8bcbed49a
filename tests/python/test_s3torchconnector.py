"""s3torchconnector (the AWS CRT underneath) reading a dataset through a node: a map-style
and an iterable dataset over a prefix that holds empty objects, a multi-part object and
small ones, read with a PyTorch DataLoader. The CRT opens every GET with a range and
learns an empty object's size from the 416's `ActualObjectSize`.

Runs where `s3torchconnector` and `torch` are installed (they are large; the test venv
does not carry them: `pip install s3torchconnector` in it to run this)."""

from __future__ import annotations

import os

import pytest

s3torch = pytest.importorskip("s3torchconnector")
torch = pytest.importorskip("torch")

from granary_testutil import ACCESS_KEY, REGION, SECRET_KEY  # noqa: E402


def test_s3torchconnector_reads_a_dataset_with_empty_objects(s3, bucket, granary_server,
                                                             monkeypatch):
    from s3torchconnector import S3ClientConfig, S3IterableDataset, S3MapDataset

    objects = {
        "ds/a-empty": b"",
        "ds/b-small": os.urandom(1000),
        "ds/c-empty": b"",
        "ds/d-large": os.urandom(9 * 1024 * 1024 + 17),  # more than one 8 MiB part
        "ds/e-one": b"x",
    }
    for k, v in objects.items():
        s3.put_object(Bucket=bucket, Key=k, Body=v)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    cfg = S3ClientConfig(force_path_style=True, max_attempts=1)
    kwargs = dict(region=REGION, endpoint=granary_server.endpoint, s3client_config=cfg,
                  transform=lambda r: (r.key, r.read()))

    mapped = S3MapDataset.from_prefix(f"s3://{bucket}/ds/", **kwargs)
    assert len(mapped) == len(objects)
    assert dict(mapped[i] for i in range(len(mapped))) == objects

    it = S3IterableDataset.from_prefix(f"s3://{bucket}/ds/", **kwargs)
    loader = torch.utils.data.DataLoader(it, batch_size=None, num_workers=0)
    assert dict(loader) == objects
