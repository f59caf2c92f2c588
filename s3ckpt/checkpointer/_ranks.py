"""The ranks a Checkpointer coordinates: its process group, its coordinator, broadcast."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

__all__ = ["RankGroup"]


class RankGroup:
    """The process group of checkpoint traffic and the coordinator's place in it.

    Without an initialised ``torch.distributed`` this is one process: rank 0, the
    coordinator, and :meth:`broadcast` returns its argument.

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

    def broadcast(self, value: Any) -> Any:
        """``value`` as the coordinator holds it, on every rank (a collective call)."""
        if not self.distributed:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=self.coordinator_global, group=self.process_group)
        return box[0]
