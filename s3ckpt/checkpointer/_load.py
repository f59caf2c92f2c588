"""Reading one committed checkpoint into the Checkpointer's state dict, checked first."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from s3ckpt.dcp import SafeGlobal
from s3ckpt.dcp.reader import S3StorageReader
from s3ckpt.dcp.restore import check_state_dict, load_verified
from s3ckpt.errors import StateMismatchError, find_s3ckpt_error
from s3ckpt.store import Location

__all__ = ["read_checkpoint"]


def read_checkpoint(
    sd: dict[str, Any],
    location: Location,
    *,
    verify_checksums: bool,
    safe_globals: Sequence[SafeGlobal],
    allow_unsafe_pickle: bool,
    fan_out: bool,
    process_group: dist.ProcessGroup | None,
    verify_complete: bool,
    strict: bool,
) -> None:
    """Load the checkpoint at ``location`` (its store and settings come with it) into ``sd``
    in place (every rank calls it).

    The checkpoint's ``.metadata`` is compared with ``sd`` first, on every rank with one
    gather (:func:`~s3ckpt.dcp.restore.check_state_dict`), so a checkpoint that does not
    fit raises :class:`~s3ckpt.errors.StateMismatchError` on all ranks before a byte of
    data is read or the model changes. The model's keys are checked both ways (a
    checkpoint of another architecture has keys the model lacks); the optimizer's and the
    train state's only for what the destination needs.

    Raises:
        StateMismatchError: from the check, or unwrapped from DCP's
            ``CheckpointException`` when only the reader saw it.
    """
    reader = S3StorageReader(
        location,
        verify_checksums=verify_checksums,
        safe_globals=safe_globals,
        allow_unsafe_pickle=allow_unsafe_pickle,
        fan_out=fan_out,
        process_group=process_group,
    )
    check_state_dict(
        sd,
        reader.metadata,
        strict=strict,
        unexpected_under=("model",),
        process_group=process_group,
        url=location.url,
    )
    try:
        if verify_complete:
            load_verified(sd, reader, process_group=process_group)
        else:
            planner = DefaultLoadPlanner(allow_partial_load=not strict)
            dcp.load(sd, storage_reader=reader, planner=planner, process_group=process_group)
    except CheckpointException as exc:
        if isinstance(found := find_s3ckpt_error(exc), StateMismatchError):
            raise found from exc
        raise
