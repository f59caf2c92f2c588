"""DCP against MemoryStore for the in-process tests: one checkpoint URL, a state dict of
every dtype and layout, ``save``/``load`` with small parts and objects, and a read of
spans that share bytes."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from s3ckpt import S3StorageReader, S3StorageWriter
from s3ckpt.config import MiB
from s3ckpt.store import MemoryStore
from tests._helpers import SMALL

__all__ = ["CONFIG", "OVERLAPPING", "URL", "load", "make_state", "read_overlapping_spans", "save"]

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


OVERLAPPING = ((0, 100), (40, 160), (150, 170))
"""Three spans of one object that share bytes, as a damaged or unusual ``.metadata`` can
name them; they coalesce into one request of 170 bytes."""


def read_overlapping_spans(
    store: MemoryStore, key: str, url: str = URL, **reader_kw: Any
) -> tuple[dict[int, bytes], S3StorageReader]:
    """Read :data:`OVERLAPPING` of object ``key`` (relative to the checkpoint at ``url``,
    which must exist) as one request through the reader's per-request entry point.

    Returns the bytes each span was handed, by its offset, and the reader.
    """
    from types import SimpleNamespace

    from torch.distributed.checkpoint.filesystem import _StorageInfo

    from s3ckpt._transfer import Request
    from s3ckpt.dcp._decode import ItemSpan
    from s3ckpt.dcp._split import Piece, SplitItem

    seen: dict[int, bytes] = {}

    class Recording:  # in place of the reader's span decoder: each span read whole
        def direct(self, span, key):  # type: ignore[no-untyped-def]
            return None

        def decode_buffer(self, span, key, buf, crc):  # type: ignore[no-untyped-def]
            seen[span.info.offset] = bytes(buf)

    reader = S3StorageReader(url, store=store, **reader_kw)
    req: Request[Piece] = Request(0, OVERLAPPING[-1][1])
    read = SimpleNamespace(storage_index=SimpleNamespace(fqn="x"))
    for start, end in OVERLAPPING:
        span = ItemSpan(_StorageInfo(key, start, end - start), None, [read])  # type: ignore[list-item]
        item = SplitItem(span, key, Recording(), 1)  # type: ignore[arg-type]
        req.spans.append((start, end, Piece(item, 0, 0, end - start)))
    walk = reader._walk()
    walk.fetch(key, req)
    reader.bytes_read += walk.bytes_requested
    return seen, reader
