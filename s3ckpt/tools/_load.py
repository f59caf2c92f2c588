"""Full (unsharded) values out of a DCP checkpoint, a bounded window at a time.

Each window is one ``dcp.load(..., no_dist=True)`` of a flat state dict holding just the
keys of that window, with destinations allocated from ``.metadata``: DCP assembles full
tensors from however many saved chunks (any world size) and the reader coalesces and
parallelises the ranged GETs, checking every CRC32C. No process group is needed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from s3ckpt.dcp import quiet_dcp
from s3ckpt.dcp.reader import S3StorageReader
from s3ckpt.metrics.instrument import in_context
from s3ckpt.tools._common import Entry

__all__ = ["iter_loaded", "load_entries"]


def load_entries(reader: S3StorageReader, entries: Sequence[Entry]) -> dict[str, Any]:
    """Full values of ``entries``: tensors, and non-tensor items as they were saved
    (decoded with ``torch.load(weights_only=True)`` checks by the reader)."""
    state: dict[str, Any] = {}
    for e in entries:
        if e.kind == "tensor":
            assert e.shape is not None and e.dtype is not None
            state[e.name] = torch.empty(e.shape, dtype=e.dtype)
        else:
            state[e.name] = None  # replaced by the loaded object
    if not state:
        return state
    reader.reset()
    with quiet_dcp():
        dcp.load(state, storage_reader=reader, planner=DefaultLoadPlanner(), no_dist=True)
    return state


def _batches(entries: Sequence[Entry], window: int) -> Iterator[list[Entry]]:
    batch: list[Entry] = []
    size = 0
    for e in entries:
        n = max(e.nbytes, e.stored_bytes)
        if batch and size + n > window:
            yield batch
            batch, size = [], 0
        batch.append(e)
        size += n
    if batch:
        yield batch


def iter_loaded(
    reader: S3StorageReader,
    entries: Sequence[Entry],
    *,
    window: int,
    prefetch: bool = True,
) -> Iterator[tuple[Entry, Any]]:
    """Yield ``(entry, value)`` in the order of ``entries``.

    Keys are loaded in windows of about ``window`` bytes (a larger tensor is a window of
    its own). With ``prefetch`` the next window downloads while the caller works on this
    one, so memory holds at most two windows (or the two largest tensors). Closing the
    generator early waits for a download in flight.
    """
    batches = list(_batches(entries, window))
    if not batches:
        return
    if not prefetch or len(batches) == 1:
        for batch in batches:
            values = load_entries(reader, batch)
            for e in batch:
                yield e, values.pop(e.name)
        return
    with ThreadPoolExecutor(1, thread_name_prefix="s3ckpt-prefetch") as pool:
        load = in_context(load_entries)  # requests count for the caller's operation
        nxt: Future[dict[str, Any]] | None = pool.submit(load, reader, batches[0])
        for i, batch in enumerate(batches):
            assert nxt is not None
            values = nxt.result()
            nxt = pool.submit(load, reader, batches[i + 1]) if i + 1 < len(batches) else None
            for e in batch:
                yield e, values.pop(e.name)
            del values
