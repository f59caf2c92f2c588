"""Reading a committed checkpoint into the Checkpointer's state dict, checked first; and
the resume that heals: ``load(step="latest")`` falls back past a damaged checkpoint.

Fallback (:func:`load_resolved`). The coordinator resolves ``latest`` from the catalog's
verdicts (:meth:`LatestPointer.resolve`: a checkpoint known damaged, its marker unreadable
or ``s3ckpt check`` found damage in it, is skipped with a WARNING) and broadcasts the step.
Every rank then reads it; a read that fails verification (a checksum mismatch, a missing
object, a corrupt ``.metadata`` or marker: :data:`DAMAGE`) is logged as a WARNING naming the
step and why, and the coordinator resolves again without it. DCP gathers every rank's
failure into one ``CheckpointException`` on all ranks, so every rank takes the same
decision. A transient, permission, shape or configuration error is never damage: it is
raised. The older checkpoint is read into a freshly collected state dict and applied only
when its read succeeded, and a strict load (the default) writes every tensor the state dict
holds, so nothing the failed read wrote survives. With ``strict=False`` a tensor the older
checkpoint lacks keeps whatever the failed read left in it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from s3ckpt.checkpointer._latest import LatestPointer
from s3ckpt.dcp import SafeGlobal
from s3ckpt.dcp.reader import S3StorageReader
from s3ckpt.dcp.restore import check_state_dict, load_verified
from s3ckpt.errors import (
    CorruptCheckpointError,
    ObjectNotFoundError,
    S3CkptError,
    unwrap_checkpoint_exception,
)
from s3ckpt.store import Location
from s3ckpt.uri import StoreURL

if TYPE_CHECKING:
    from s3ckpt.retention import CheckpointInfo

__all__ = ["DAMAGE", "Candidate", "load_newest_good", "load_resolved", "read_checkpoint"]

log = logging.getLogger("s3ckpt")

_T = TypeVar("_T")

DAMAGE: tuple[type[S3CkptError], ...] = (CorruptCheckpointError, ObjectNotFoundError)
"""The failures of a read that mean the checkpoint is damaged (a checksum mismatch is a
:class:`~s3ckpt.errors.ChecksumMismatchError`, a corrupt ``.metadata`` or marker a
:class:`~s3ckpt.errors.CorruptCheckpointError`, a missing object an
:class:`~s3ckpt.errors.ObjectNotFoundError`): ``load(step="latest")`` falls back past them."""


def load_resolved(
    pointer: LatestPointer,
    step: int | Literal["latest"],
    read: Callable[[int], None],
    *,
    grace: timedelta,
    fallback: bool,
) -> int | None:
    """Resolve ``step`` and ``read`` it (every rank calls it); with ``step="latest"`` and
    ``fallback``, past every checkpoint found damaged (see the module docstring).

    Returns:
        The step read; None when ``step="latest"`` and the run has no committed checkpoint.

    Raises:
        S3CkptError: what failed (torch's ``CheckpointException`` unwrapped); a
            :class:`~s3ckpt.errors.CorruptCheckpointError` naming every damaged step when
            no good checkpoint is left.
    """
    heal = fallback and step == "latest"
    skip: dict[int, str] = {}
    while True:
        resolved = pointer.resolve(step, grace, skip=skip, fallback=fallback)
        if resolved is None:
            return None
        try:
            read(resolved)
            return resolved
        except BaseException as exc:
            what = f"step {resolved} of {pointer.url}"
            skip[resolved] = _skipped(exc, what, pointer.url.bucket, heal=heal)


def _skipped(exc: BaseException, what: str, bucket: str, *, heal: bool) -> str:
    """Why the read of ``what`` that raised ``exc`` is skipped, after a WARNING saying so:
    ``exc`` is damage (:data:`DAMAGE`, DCP's wrapper unwrapped) and ``heal``; else the
    s3ckpt error ``exc`` is, raised."""
    err = unwrap_checkpoint_exception(exc, f"the load of {what}", bucket=bucket)
    if not heal or not isinstance(err, DAMAGE):
        if err is exc:
            raise exc
        raise err from err.__cause__
    log.warning(
        "s3ckpt: skipping %s: it failed verification while loading (%s); loading the newest "
        "good checkpoint before it",
        what,
        err,
    )
    return f"failed verification while loading: {err}"


@dataclass(frozen=True)
class Candidate:
    """A committed checkpoint a framework plug-in may resume from, with the catalog's
    verdict (:attr:`~s3ckpt.retention.CheckpointInfo.damage`: None when it is good)."""

    url: str
    step: int | None = None
    damage: str | None = None

    @classmethod
    def newest_first(cls, infos: Iterable[CheckpointInfo]) -> list[Candidate]:
        """The committed checkpoints of a catalog (oldest first, as ``list_checkpoints``
        gives them), newest first."""
        return [cls(str(c.url), c.step, c.damage) for c in reversed(list(infos)) if c.is_committed]

    def __str__(self) -> str:
        return self.url if self.step is None else f"step {self.step} ({self.url})"


def load_newest_good(
    candidates: Sequence[Candidate],
    read: Callable[[Candidate], _T],
    *,
    fallback: bool,
    run: StoreURL,
) -> tuple[Candidate, _T] | None:
    """The plug-ins' resume from "latest" (every rank calls it with the same
    ``candidates``, newest first): ``read`` the newest good candidate, skipping those the
    catalog knows damaged and, with ``fallback``, those whose read fails verification
    (:data:`DAMAGE`), each named in a WARNING. What :func:`load_resolved` does for the
    Checkpointer, over a list the plug-in made (its own names and folders).

    Returns:
        The candidate read and what ``read`` returned; None when there are no candidates.

    Raises:
        CorruptCheckpointError: ``fallback=False`` and the newest is known damaged, or no
            candidate is good.
        S3CkptError: what else failed (DCP's ``CheckpointException`` unwrapped).
    """
    skipped: list[str] = []
    for c in candidates:
        if c.damage is not None:
            if not fallback:
                raise CorruptCheckpointError(
                    f"the newest checkpoint, {c}, is damaged: {c.damage}; load it by name to "
                    "read it anyway, or allow the fallback to the newest good one",
                    bucket=run.bucket,
                    key=c.url,
                )
            skipped.append(f"{c}: damaged: {c.damage}")
            log.warning("s3ckpt: skipping %s (damaged: %s)", c, c.damage)
            continue
        try:
            return c, read(c)
        except BaseException as exc:
            skipped.append(f"{c}: {_skipped(exc, str(c), run.bucket, heal=fallback)}")
    if skipped:
        raise CorruptCheckpointError(
            f"no good checkpoint under {run}: {'; '.join(skipped)}; `s3ckpt ls {run}` lists "
            "them, `s3ckpt check` names the damage",
            bucket=run.bucket,
            key=run.prefix,
        )
    return None


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
        StateMismatchError: from the check (or inside DCP's ``CheckpointException`` when
            only the reader saw it: :func:`load_resolved` unwraps it).
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
    if verify_complete:
        load_verified(sd, reader, process_group=process_group)
    else:
        planner = DefaultLoadPlanner(allow_partial_load=not strict)
        dcp.load(sd, storage_reader=reader, planner=planner, process_group=process_group)
