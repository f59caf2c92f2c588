"""Saves in flight: :class:`SaveHandle`, staging, the upload thread, one save at a time.

Async saves follow torch's zero-overhead design: the state dict is staged (copied) into a
CPU copy that is cached across saves (pinned when asked for), then uploaded by
``dcp.save`` on one background thread. The staging copy is reused, so one save is in
flight at a time: the next one waits for it to commit (``on_busy="wait"``) or is refused
(``on_busy="raise"``). A failed async save sets its error on its handle and is raised once
more, from the next call that settles the queue.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from s3ckpt.dcp.writer import S3StorageWriter
from s3ckpt.errors import SaveInProgressError, unwrap_checkpoint_exception
from s3ckpt.metrics import instrument

__all__ = ["EXIT_WAIT_SECONDS", "SaveHandle", "SaveQueue"]

log = logging.getLogger("s3ckpt")

EXIT_WAIT_SECONDS = 600.0
"""How long, at most, an interpreter that exits without ``Checkpointer.close()`` waits for
the async save still uploading (and the retention pass after it), logged at WARNING. A save
that then fails, is abandoned (Ctrl-C) or outlasts it is named in an ERROR and the process
exits with status 1 (130 after a Ctrl-C), never 0 with the step silently lost."""


def wait_at_exit(part: Any) -> None:
    """Call ``part.drain_at_exit(deadline)`` (the steps it lost, as text) when the
    interpreter exits: from ``threading``'s exit hooks, which run in reverse order of
    registration, so before ``concurrent.futures`` refuses new work (its hook was registered
    when it was imported, before this one)."""
    with _EXIT_LOCK:
        if not _EXIT_PARTS:
            getattr(threading, "_register_atexit", atexit.register)(_at_exit)
        _EXIT_PARTS[:] = [ref for ref in _EXIT_PARTS if ref() is not None]
        _EXIT_PARTS.append(weakref.ref(part))


_EXIT_LOCK = threading.Lock()
_EXIT_PARTS: list[weakref.ref[Any]] = []
_CTRL_C = "abandoned by Ctrl-C"


def _at_exit() -> None:
    deadline = time.monotonic() + EXIT_WAIT_SECONDS
    lost: list[str] = []
    for ref in list(_EXIT_PARTS):
        part = ref()
        if part is not None:  # after a Ctrl-C here, nothing more is waited for
            lost += part.drain_at_exit(time.monotonic() if _CTRL_C in str(lost) else deadline)
    if lost:
        interrupted = isinstance(getattr(sys, "last_value", None), KeyboardInterrupt)
        code = 130 if interrupted or _CTRL_C in str(lost) else 1
        log.error("s3ckpt: exiting with status %d: %s", code, "; ".join(lost))
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code)  # the only way to change the status once the main module returned


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
        self._upload: Future[None] | None = None
        self._failed: tuple[int, BaseException] | None = None
        self._lock = threading.Lock()
        wait_at_exit(self)

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
                what = f"the save of step {handle.step} to {handle.url}"
                err = unwrap_checkpoint_exception(exc, what)
                raise err from err.__cause__
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
        self._upload = self._uploads.submit(
            self._run_upload,
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

    def drain_at_exit(self, deadline: float) -> list[str]:
        """At interpreter exit: wait (until ``deadline``, ``time.monotonic()``) for the
        upload in flight; the save lost, as text, if it fails, is abandoned or outlasts the
        wait. (A save that failed earlier was logged at ERROR when it failed.)"""
        handle, upload = self._inflight, self._upload
        if handle is None or upload is None or upload.done():
            return []
        if handle.done():  # its outcome is out: only what runs after it is left
            wait([upload], timeout=max(0.0, deadline - time.monotonic()))
            return []
        what = f"the async save of step {handle.step} to {handle.url}"
        log.warning(
            "s3ckpt: the interpreter is exiting while %s uploads: waiting up to %.0fs for it "
            "to commit (Ctrl-C abandons it; Checkpointer.close() or `with Checkpointer(...)` "
            "waits for it in your code)",
            what,
            max(0.0, deadline - time.monotonic()),
        )
        try:
            wait([upload], timeout=max(0.0, deadline - time.monotonic()))
        except KeyboardInterrupt:
            return [f"{what} was {_CTRL_C}"]
        if not upload.done():
            return [f"{what} did not commit within {EXIT_WAIT_SECONDS:.0f}s"]
        failed = handle.committed.exception() if handle.committed.done() else None
        return [] if failed is None else [f"{what} failed: {failed}"]

    def _run_upload(
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
                what = f"the save of step {handle.step} to {handle.url}"
                err = unwrap_checkpoint_exception(exc, what)
                raise err from err.__cause__
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
