"""What the framework plug-ins (lightning, accelerate, torchtitan) share: DCP calls with
s3ckpt's errors in place of DCP's, and one decision for every rank of a collective load.

A rank that reads the store on its own may see what another rank does not (a transient
failure, a checkpoint changing under it) and decide differently: raise where the others
go on into ``dcp.load``, or fall back to another checkpoint. The others then wait in a
collective that never comes. :func:`agree` (rank 0 decides, every rank gets its answer)
and :func:`together` (every rank runs it, every rank raises if one failed) keep each
decision the same on all ranks.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, TypeVar

import torch.distributed as dist

from s3ckpt.checkpointer import RetentionRecord
from s3ckpt.checkpointer._ranks import RankGroup, portable
from s3ckpt.checkpointer._retention import RetentionRunner
from s3ckpt.dcp import S3StorageReader, quiet_dcp
from s3ckpt.errors import unwrap_checkpoint_exception
from s3ckpt.retention import Policy
from s3ckpt.store import Location
from s3ckpt.uri import StoreURL

_T = TypeVar("_T")


def rank_of(group: dist.ProcessGroup | None = None) -> int:
    """This process's rank (0 without a process group)."""
    return dist.get_rank(group) if dist.is_available() and dist.is_initialized() else 0


@contextmanager
def dcp_errors(what: str, url: StoreURL | None = None, rank: int | None = None) -> Iterator[None]:
    """DCP's logging quietened, and every failure an s3ckpt error (an ``Exception``) in place
    of DCP's ``CheckpointException`` (:func:`~s3ckpt.errors.unwrap_checkpoint_exception`),
    naming ``url`` and ``rank`` when given."""
    try:
        with quiet_dcp():
            yield
    except BaseException as exc:
        at = {} if url is None else {"bucket": url.bucket, "key": url.prefix}
        err = unwrap_checkpoint_exception(exc, f"{what} of {url}" if url else what, rank=rank, **at)
        raise err from err.__cause__


def open_reader(where: Location, plugin: Any, allow_unsafe_pickle: bool) -> S3StorageReader:
    """The checkpoint at ``where``, opened with a plug-in's ``verify_checksums`` and
    ``safe_globals`` (``plugin=None``: the defaults, checksums verified and no more globals)."""
    return S3StorageReader(
        where,
        verify_checksums=getattr(plugin, "verify_checksums", True),
        allow_unsafe_pickle=allow_unsafe_pickle,
        safe_globals=getattr(plugin, "safe_globals", ()),
    )


def agree(fn: Callable[[], _T], group: dist.ProcessGroup | None) -> _T:
    """``fn()`` on rank 0 of ``group`` (``None``: one process), its result or exception on
    every rank (:meth:`~s3ckpt.checkpointer._ranks.RankGroup.on_coordinator`)."""
    return fn() if group is None else RankGroup(group).on_coordinator(fn)


def together(fn: Callable[[], _T], group: dist.ProcessGroup | None) -> _T:
    """``fn()`` on every rank of ``group``; when it failed on any rank, every rank raises:
    the failed rank its own exception, the others the first failed rank's (the same type,
    so a fallback decides the same everywhere)."""
    result: Any = None
    try:
        result, error = fn(), None
    except Exception as exc:
        error = exc
    if group is not None:
        errors: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(errors, None if error is None else portable(error), group=group)
        if error is None:  # the first failed rank's
            error = next((exc for exc in errors if exc is not None), None)
    if error is not None:
        raise error
    return result


def patch_once(owner: Any, name: str) -> Callable[[Callable[..., Any]], None]:
    """Decorator: replace ``owner.name`` (a function, or an instance's bound method) with
    the decorated ``fn``, called as ``fn(original, *args, **kwargs)`` under the original's
    name and docstring. Idempotent: a replacement of ours is not wrapped again; nothing
    happens when ``owner`` has no ``name``."""

    def install(fn: Callable[..., Any]) -> None:
        original = getattr(owner, name, None)
        if original is None or getattr(original, "_s3ckpt_hook", False):
            return

        @functools.wraps(original)
        def patched(*args: Any, **kwargs: Any) -> Any:
            return fn(original, *args, **kwargs)

        patched._s3ckpt_hook = True  # type: ignore[attr-defined]
        setattr(owner, name, patched)

    return install


class Retention:
    """A plug-in's retention passes: one :class:`~s3ckpt.checkpointer.RetentionRunner` per
    run (made on its first pass), each running its passes one at a time in the background.

    Attributes:
        last: The runner of the last pass scheduled (``None`` before the first).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runners: dict[StoreURL, RetentionRunner] = {}
        self.last: RetentionRunner | None = None

    def schedule(self, run: Location, policy: Policy, grace: timedelta, step: int | None) -> None:
        """Queue a pass of ``policy`` over ``run`` after the commit of ``step``."""
        with self._lock:
            runner = self._runners.get(run.url)
            if runner is None:
                runner = self._runners[run.url] = RetentionRunner(run.store, run.url)
            self.last = runner
        runner.schedule(policy, grace, step)

    @property
    def history(self) -> tuple[RetentionRecord, ...]:
        """Every run's passes (the last 100 per run), oldest first."""
        records = [r for runner in list(self._runners.values()) for r in runner.history]
        return tuple(sorted(records, key=lambda r: r.started))

    def wait(self) -> None:
        """Block until the passes queued so far have run."""
        for runner in list(self._runners.values()):
            runner.wait()

    def close(self) -> None:
        """Run the passes queued so far, then stop every runner."""
        for runner in list(self._runners.values()):
            runner.close()
        self._runners.clear()
