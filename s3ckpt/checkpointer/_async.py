"""Saves in flight: :class:`SaveHandle`, staging, the upload thread, one save at a time.

Async saves follow torch's zero-overhead design: the state dict is staged (copied) into a
CPU copy that is cached across saves (pinned when asked for), then uploaded by
``dcp.save`` on one background thread. The staging copy is reused, so one save is in
flight at a time: the next one waits for it to commit (``on_busy="wait"``) or is refused
(``on_busy="raise"``). A failed async save sets its error on its handle and is raised once
more, from the next call that settles the queue.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from s3ckpt.dcp.writer import S3StorageWriter
from s3ckpt.errors import (
    CheckpointError,
    SaveInProgressError,
    find_interrupt,
    find_s3ckpt_error,
)
from s3ckpt.metrics import instrument

__all__ = ["SaveHandle", "SaveQueue", "save_error"]

log = logging.getLogger("s3ckpt")


@dataclass
class SaveHandle:
    """One save in flight (or done).

    Attributes:
        step: The step being saved.
        url: The checkpoint's URL (``s3://bucket/run/step_000000100``).
        staged: Resolves (to ``None``) when the state has been copied: training may modify
            parameters and optimizer state again.
        committed: Resolves (to ``None``) when ``s3ckpt.json`` is written and the
            checkpoint is durable; holds the exception if the save failed.
        blocked_seconds: Time from the call until ``staged`` resolved, including any wait
            for the previous save to commit: the longest the training loop is held up if it
            waits for ``staged`` before its next optimizer step (set once staged; for a
            synchronous save, the whole save).
        call_seconds: Time the ``async_save`` call itself took before returning.
        commit_seconds: Time from the call until ``committed`` resolved (set once committed).
    """

    step: int
    url: str
    staged: Future[None] = field(default_factory=Future)
    committed: Future[None] = field(default_factory=Future)
    blocked_seconds: float | None = None
    call_seconds: float | None = None
    commit_seconds: float | None = None

    def wait(self, timeout: float | None = None) -> None:
        """Block until committed; raise the save's error if it failed."""
        self.committed.result(timeout)

    def done(self) -> bool:
        """Whether the save has finished (committed or failed)."""
        return self.committed.done()


def save_error(exc: BaseException, step: int, url: str) -> BaseException:
    """The error to raise for a failed ``dcp.save`` of ``step`` to ``url``.

    DCP wraps per-rank failures in ``CheckpointException`` (a ``BaseException``): callers
    get the s3ckpt error inside it (naming bucket, key and rank), or a
    :class:`CheckpointError` that says which save failed. A Ctrl-C (``KeyboardInterrupt``)
    or ``SystemExit``, bare or inside the wrapper, comes back as itself, never as an error
    (a program stopped by Ctrl-C must stop, not handle a ``CheckpointError``). Other
    exceptions pass through unchanged.
    """
    interrupt = find_interrupt(exc)
    if interrupt is not None:
        return interrupt
    found = find_s3ckpt_error(exc)
    if found is not None:
        return found
    if isinstance(exc, Exception) and not isinstance(exc, CheckpointException):
        return exc
    return CheckpointError(f"the save of step {step} to {url} failed: {exc}")


class SaveQueue:
    """Runs saves one at a time: synchronously, or staged now and uploaded in the background.

    Args:
        pin_memory: Stage into pinned memory (default: when CUDA is available).
    """

    def __init__(self, pin_memory: bool | None) -> None:
        use_cuda = torch.cuda.is_available()
        self.pin_memory = use_cuda if pin_memory is None else pin_memory
        self._stager = DefaultStager(
            StagingOptions(
                use_pinned_memory=self.pin_memory,
                use_shared_memory=False,
                use_async_staging=True,
                use_non_blocking_copy=use_cuda,
            )
        )
        self._uploads = ThreadPoolExecutor(1, thread_name_prefix="s3ckpt-upload")
        self._inflight: SaveHandle | None = None
        self._failed: tuple[int, BaseException] | None = None
        self._lock = threading.Lock()

    @property
    def inflight(self) -> SaveHandle | None:
        """The handle of the last async save, until a settle finds it done."""
        return self._inflight

    def settle(self, on_busy: Literal["wait", "raise"]) -> None:
        """Wait for (or refuse to overlap) the save in flight; raise a pending failure once.

        Raises:
            SaveInProgressError: a save is uploading and ``on_busy`` is ``"raise"``.
        """
        handle = self._inflight
        if handle is not None and not handle.done():
            if on_busy == "raise":
                raise SaveInProgressError(
                    f"the save of step {handle.step} to {handle.url} is still uploading; "
                    "wait for handle.committed (or use on_busy='wait')"
                )
            _wait_for(handle.committed)
        with self._lock:
            failed, self._failed = self._failed, None
            if handle is not None and handle.done():
                self._inflight = None
        if failed is not None:
            step, exc = failed
            log.error("s3ckpt: the async save of step %d failed: %s", step, exc)
            raise exc

    def save(
        self,
        handle: SaveHandle,
        sd: dict[str, Any],
        writer: S3StorageWriter,
        process_group: dist.ProcessGroup | None,
        t0: float,
        after_commit: Callable[[int], None],
    ) -> None:
        """Save ``sd`` now and resolve ``handle``; raise the save's error.

        ``after_commit(step)`` runs once the checkpoint is committed, before the handle
        resolves; ``t0`` is when the caller's save began.
        """
        try:
            try:
                dcp.save(sd, storage_writer=writer, process_group=process_group)
            except BaseException as exc:
                _raise_save_error(exc, handle.step, handle.url)
            after_commit(handle.step)
        except BaseException as exc:
            handle.staged.set_exception(exc)
            handle.committed.set_exception(exc)
            raise
        elapsed = time.perf_counter() - t0
        handle.blocked_seconds = handle.call_seconds = handle.commit_seconds = elapsed
        handle.staged.set_result(None)
        handle.committed.set_result(None)
        log.info(
            "s3ckpt: saved step %d to %s in %.2fs (synchronous)", handle.step, handle.url, elapsed
        )

    def start(
        self,
        handle: SaveHandle,
        sd: dict[str, Any],
        writer: S3StorageWriter,
        process_group: dist.ProcessGroup | None,
        t0: float,
        after_commit: Callable[[int], None],
        on_committed: Callable[[], None],
        recorder: instrument.Recorder | None = None,
    ) -> None:
        """Start staging ``sd`` and queue its upload; return at once.

        ``after_commit(step)`` runs on the upload thread once the checkpoint is committed,
        before ``handle.committed`` resolves; ``on_committed()`` runs after it resolves.
        The upload runs with ``recorder`` current, and publishes its event (with the time
        training was blocked) before ``handle.committed`` resolves.
        """
        staging = self._stager.stage(sd)
        assert isinstance(staging, Future)

        def on_staged(fut: Future[Any]) -> None:
            handle.blocked_seconds = time.perf_counter() - t0
            exc = fut.exception()
            if exc is not None:
                handle.staged.set_exception(exc)
            else:
                handle.staged.set_result(None)
                log.info(
                    "s3ckpt: step %d staged in %.3fs (training blocked at most this long)",
                    handle.step,
                    handle.blocked_seconds,
                )

        staging.add_done_callback(on_staged)
        with self._lock:
            self._inflight = handle
        self._uploads.submit(
            self._upload,
            handle,
            staging,
            writer,
            process_group,
            t0,
            after_commit,
            on_committed,
            recorder,
        )
        handle.call_seconds = time.perf_counter() - t0

    def close(self) -> None:
        """Wait for the upload thread to finish, then release it and the staging memory."""
        self._uploads.shutdown(wait=True)
        self._stager.close()

    def _upload(
        self,
        handle: SaveHandle,
        staging: Future[Any],
        writer: S3StorageWriter,
        process_group: dist.ProcessGroup | None,
        t0: float,
        after_commit: Callable[[int], None],
        on_committed: Callable[[], None],
        recorder: instrument.Recorder | None,
    ) -> None:
        try:
            staged_sd = staging.result()
            try:
                with instrument.bound(recorder):
                    dcp.save(staged_sd, storage_writer=writer, process_group=process_group)
            except BaseException as exc:
                _raise_save_error(exc, handle.step, handle.url)
            with instrument.bound(recorder):
                after_commit(handle.step)
        except BaseException as exc:
            if recorder is not None:
                recorder.finish(exc, blocked_s=_blocked(handle))
            with self._lock:
                self._failed = (handle.step, exc)
            if not handle.staged.done():
                handle.staged.set_exception(exc)
            handle.committed.set_exception(exc)
            log.error(
                "s3ckpt: async save of step %d to %s failed: %s", handle.step, handle.url, exc
            )
            return
        handle.commit_seconds = time.perf_counter() - t0
        log.info(
            "s3ckpt: committed step %d to %s in %.2fs (training blocked %.3fs)",
            handle.step,
            handle.url,
            handle.commit_seconds,
            handle.blocked_seconds or 0.0,
        )
        if recorder is not None:
            recorder.finish(blocked_s=_blocked(handle))
        handle.committed.set_result(None)
        on_committed()


def _raise_save_error(exc: BaseException, step: int, url: str) -> NoReturn:
    """Raise :func:`save_error` of ``exc``: chained to DCP's wrapper, except an interrupt,
    which is raised as itself (its own traceback, no wrapper in front of it)."""
    err = save_error(exc, step, url)
    if err is exc:
        raise exc
    if isinstance(err, (KeyboardInterrupt, SystemExit)):
        raise err from None
    raise err from exc


def _blocked(handle: SaveHandle) -> float | None:
    """``handle.blocked_seconds``, once the staging callback that sets it has run (it may
    still be running when the upload thread gets the staged state)."""
    wait([handle.staged], timeout=5.0)
    return handle.blocked_seconds


def _wait_for(committed: Future[None]) -> None:
    """Wait for a save to finish, whatever its outcome: its failure is raised once, from
    :meth:`SaveQueue.settle`. Ctrl-C and ``SystemExit`` during the wait propagate."""
    try:
        committed.result()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # recorded in SaveQueue._failed, raised once by settle()
        pass
