"""DCP against MemoryStore for the in-process tests: one checkpoint URL, a state dict of
every dtype and layout, and ``save``/``load`` with small parts and objects."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from s3ckpt import S3StorageReader, S3StorageWriter
from s3ckpt.config import MiB
from s3ckpt.store import MemoryStore
from tests._helpers import SMALL

__all__ = ["CONFIG", "URL", "load", "make_state", "save"]

URL = "s3://bkt/run/step_1"
CONFIG = dataclasses.replace(SMALL, target_object_size=3 * MiB, read_request_size=4 * MiB)
"""3 MiB objects: the 8 MiB tensor goes multipart and the rest fills several objects;
4 MiB requests coalesce the small items."""


def make_state() -> dict[str, Any]:
    """One of everything DCP stores: dtypes, a non-contiguous tensor, a view, an empty
    tensor, a scalar and nested non-tensor values; ~8.2 MiB, the same on every call."""
    g = torch.Generator().manual_seed(0)
    return {
        "big": torch.randn(1024, 2048, generator=g),  # 8 MiB: multipart
        "half": torch.randn(333, 77, generator=g).to(torch.bfloat16),
        "ints": torch.arange(1000, dtype=torch.int64),
        "bools": torch.rand(17, generator=g) > 0.5,
        "noncontig": torch.randn(64, 32, generator=g).t(),
        "view": torch.arange(100.0)[10:20],
        "empty": torch.empty(0, 4),
        "scalar": torch.tensor(3.5),
        "nested": {"lr": 0.1, "name": "adam", "steps": [1, 2, 3], "t": torch.ones(3)},
    }


def save(store: MemoryStore, sd: dict[str, Any], url: str = URL, **kw: Any) -> S3StorageWriter:
    """``dcp.save`` of ``sd`` to ``url`` in ``store`` with :data:`CONFIG`; the writer."""
    writer = S3StorageWriter(url, store=store, transfer_config=CONFIG, **kw)
    dcp.save(sd, storage_writer=writer)
    return writer


def load(store: MemoryStore, sd: dict[str, Any], url: str = URL, **kw: Any) -> S3StorageReader:
    """``dcp.load`` into ``sd`` from ``url`` in ``store`` with :data:`CONFIG`; the reader."""
    reader = S3StorageReader(url, store=store, transfer_config=CONFIG, **kw)
    dcp.load(sd, storage_reader=reader)
    return reader
