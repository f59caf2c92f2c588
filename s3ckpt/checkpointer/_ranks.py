"""The ranks a Checkpointer coordinates: its process group, its coordinator's answers."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import TypeVar

import torch.distributed as dist

from s3ckpt.errors import CheckpointError

__all__ = ["RankGroup", "portable"]

_T = TypeVar("_T")


class RankGroup:
    """The process group of checkpoint traffic and the coordinator's place in it.

    Without an initialised ``torch.distributed`` this is one process: rank 0, the
    coordinator, and :meth:`on_coordinator` just calls its function.

    Args:
        process_group: The group for checkpoint collectives. ``None`` in a distributed job
            creates a new gloo group over all ranks (a collective call: every rank
            constructs its group at the same point).
    """

    def __init__(self, process_group: dist.ProcessGroup | None) -> None:
        self.distributed = dist.is_available() and dist.is_initialized()
        if self.distributed and process_group is None:
            process_group = dist.new_group(backend="gloo")
        self.process_group = process_group
        self.rank = dist.get_rank(process_group) if self.distributed else 0
        self.coordinator_global = dist.get_global_rank(process_group, 0) if self.distributed else 0
        self.is_coordinator = self.rank == 0

    def on_coordinator(self, fn: Callable[[], _T]) -> _T:
        """``fn()`` run on the coordinator; its value, or the error it raised, on every rank
        (a collective call, so no rank waits for a coordinator that failed)."""
        if not self.distributed:
            return fn()
        value: _T | None = None
        error: Exception | None = None
        if self.is_coordinator:
            try:
                value = fn()
            except Exception as exc:
                error = exc
        box = [(value, None if error is None else portable(error, "the coordinator failed: "))]
        dist.broadcast_object_list(box, src=self.coordinator_global, group=self.process_group)
        value, shared = box[0]
        if (raised := error or shared) is not None:
            raise raised
        return value  # type: ignore[return-value]


def portable(exc: Exception, prefix: str = "") -> Exception:
    """``exc``, or (when it does not pickle) a :class:`~s3ckpt.errors.CheckpointError` with
    its words: what one rank sends the others must arrive, or they would wait for it."""
    try:
        pickle.dumps(exc)
    except Exception:
        return CheckpointError(f"{prefix}{type(exc).__name__}: {exc}")
    return exc
