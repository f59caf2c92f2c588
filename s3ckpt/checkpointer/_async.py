"""Saves in flight: :class:`SaveHandle`, staging, the upload thread, one save at a time.

Async saves follow torch's zero-overhead design: the state dict is staged (copied) into a
CPU copy that is cached across saves (pinned when asked for), then uploaded by
``dcp.save`` on one background thread. The staging copy is reused, so one save is in
flight at a time: the next one waits for it to commit (``on_busy="wait"``) or is refused
(``on_busy="raise"``). A failed async save sets its error on its handle and is raised once
more, from the next call that settles the queue.

The state dict a Checkpointer saves and loads, ``{"model", "optim", "train_state"}``
(:func:`collect_state_dict`, :func:`apply_state_dict`), is built by torch's
``get_state_dict`` / ``set_state_dict``, so plain modules, DDP, DTensor and FSDP2
(``fully_shard``) all work.
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
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from s3ckpt.dcp.writer import S3StorageWriter
from s3ckpt.errors import ConfigError, SaveInProgressError, unwrap_checkpoint_exception
from s3ckpt.metrics import instrument

__all__ = [
    "EXIT_WAIT_SECONDS", "SaveHandle", "SaveQueue", "apply_state_dict", "collect_state_dict",
]


def collect_state_dict(model: Any, optimizer: Any, train_state: Any) -> dict[str, Any]:
    """The state dict to save (or to load into): ``model``, ``optim`` when an optimizer is
    given, ``train_state`` when a train state is given."""
    sd: dict[str, Any] = {}
    if optimizer is None:
        sd["model"] = get_model_state_dict(model)
    else:
        sd["model"], sd["optim"] = get_state_dict(model, optimizer)
    if train_state is not None:
        fn = getattr(train_state, "state_dict", None)
        if fn is None or not callable(getattr(train_state, "load_state_dict", None)):
            raise ConfigError(
                "train_state must have state_dict() and load_state_dict() (torch's Stateful); "
                f"got {type(train_state).__name__}"
            )
        sd["train_state"] = fn()
    return sd


def apply_state_dict(sd: dict[str, Any], model: Any, optimizer: Any, train_state: Any) -> None:
    """Put a loaded ``sd`` (from :func:`collect_state_dict`) back into its owners."""
    if optimizer is None:
        set_model_state_dict(model, sd["model"])
    else:
        set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    if train_state is not None:
        train_state.load_state_dict(sd["train_state"])


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
    for part in [p for ref in _EXIT_PARTS if (p := ref()) is not None]:
        # After a Ctrl-C here, nothing more is waited for.
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
    """Runs saves one at a time: each staged, then uploaded on the upload thread (an async
    save) or on the caller's (a save waited on, so that Ctrl-C reaches its ``dcp.save``).

    Args:
        pin_memory: Stage into pinned memory (default: when CUDA is available).
        process_group: The group ``dcp.save`` runs over.
        after_commit: Called with the step once a checkpoint is committed, before its
            ``handle.committed`` resolves (the ``latest`` pointer).
        on_committed: Called with the step after ``handle.committed`` resolved (retention).
    """

    def __init__(
        self,
        pin_memory: bool | None,
        process_group: dist.ProcessGroup | None,
        after_commit: Callable[[int], None],
        on_committed: Callable[[int], None],
    ) -> None:
        self._pg, self._after_commit, self._on_committed = process_group, after_commit, on_committed
        use_cuda = torch.cuda.is_available()
        self.pin_memory = use_cuda if pin_memory is None else pin_memory
        # Pinned memory as asked, no shared memory, async staging, non-blocking copies on CUDA.
        self._stager = DefaultStager(StagingOptions(self.pin_memory, False, True, use_cuda))
        self._uploads = ThreadPoolExecutor(1, thread_name_prefix="s3ckpt-upload")
        self.inflight: SaveHandle | None = None  # the last async save, until settled
        self._upload: Future[None] | None = None
        self._failed: tuple[int, BaseException] | None = None
        self._lock = threading.Lock()
        wait_at_exit(self)

    def settle(self, on_busy: Literal["wait", "raise"]) -> None:
        """Wait for (or refuse to overlap) the save in flight; raise a pending failure once.
        Ctrl-C and ``SystemExit`` during the wait propagate.

        Raises:
            SaveInProgressError: a save is uploading and ``on_busy`` is ``"raise"``.
        """
        handle, upload = self.inflight, self._upload
        if handle is not None and not handle.done() and on_busy == "raise":
            raise SaveInProgressError(
                f"the save of step {handle.step} to {handle.url} is still uploading; "
                "wait for handle.committed (or use on_busy='wait')"
            )
        if upload is not None:
            wait([upload])  # its outcome is on its handle, and in _failed
        with self._lock:
            failed, self._failed, self.inflight = self._failed, None, None
        if failed is not None:
            step, exc = failed
            log.error("s3ckpt: the async save of step %d failed: %s", step, exc)
            raise exc

    def start(
        self,
        handle: SaveHandle,
        sd: dict[str, Any],
        writer: S3StorageWriter,
        t0: float,
        recorder: instrument.Recorder,
        *,
        blocking: bool,
    ) -> None:
        """Stage ``sd`` and upload it: queued for the upload thread, or with ``blocking``
        now on this thread, uncopied (``handle`` then holds the outcome: the caller raises
        it, nothing is kept to raise later). The upload runs with ``recorder`` current and
        publishes its event (with the time training was blocked, since ``t0``: for a
        blocking save, all of it) before ``handle.committed`` resolves.
        """
        staging: Future[Any] = Future() if blocking else self._stager.stage(sd)
        if blocking:
            staging.set_result(sd)

        def on_staged(fut: Future[Any]) -> None:
            handle.blocked_seconds = time.perf_counter() - t0
            if (exc := fut.exception()) is not None:
                handle.staged.set_exception(exc)
                return
            handle.staged.set_result(None)
            if not blocking:
                held = f"{handle.blocked_seconds:.3f}s (training blocked at most this long)"
                log.info(f"s3ckpt: step {handle.step} staged in {held}")

        def blocked() -> float | None:
            # All of it for a blocking save; else until staged (once the staging callback
            # that sets it has run: it may still be running when the state is handed over).
            if blocking:
                handle.blocked_seconds = time.perf_counter() - t0
            else:
                wait([handle.staged], timeout=5.0)
            return handle.blocked_seconds

        def upload() -> None:
            what = f"the save of step {handle.step} to {handle.url}"
            try:
                with instrument.bound(recorder):
                    try:
                        dcp.save(staging.result(), storage_writer=writer, process_group=self._pg)
                    except BaseException as exc:
                        err = unwrap_checkpoint_exception(exc, what)
                        raise err from err.__cause__
                    self._after_commit(handle.step)
            except BaseException as exc:
                recorder.finish(exc, blocked_s=blocked())
                if not blocking:
                    with self._lock:
                        self._failed = (handle.step, exc)
                    log.error("s3ckpt: %s failed (async): %s", what, exc)
                if not handle.staged.done():
                    handle.staged.set_exception(exc)
                handle.committed.set_exception(exc)
                return
            handle.commit_seconds = time.perf_counter() - t0
            held = blocked()
            took = f"{handle.commit_seconds:.2f}s (training blocked {held or 0.0:.3f}s)"
            log.info(f"s3ckpt: committed step {handle.step} to {handle.url} in {took}")
            recorder.finish(blocked_s=held)
            handle.committed.set_result(None)
            self._on_committed(handle.step)

        staging.add_done_callback(on_staged)
        if blocking:
            upload()
            handle.call_seconds = handle.blocked_seconds
            return
        with self._lock:
            self.inflight = handle
        handle.call_seconds = time.perf_counter() - t0
        self._upload = self._uploads.submit(upload)

    def close(self) -> None:
        """Wait for the upload thread to finish, then release it and the staging memory."""
        self._uploads.shutdown(wait=True)
        self._stager.close()

    def drain_at_exit(self, deadline: float) -> list[str]:
        """At interpreter exit: wait (until ``deadline``, ``time.monotonic()``) for the
        upload in flight; the save lost, as text, if it fails, is abandoned or outlasts the
        wait. (A save that failed earlier was logged at ERROR when it failed.)"""
        handle, upload = self.inflight, self._upload
        if handle is None or upload is None or upload.done():
            return []
        if handle.done():  # its outcome is out: only what runs after it is left
            wait([upload], timeout=max(0.0, deadline - time.monotonic()))
            return []
        what = f"the async save of step {handle.step} to {handle.url}"
        log.warning(
            f"s3ckpt: the interpreter is exiting while {what} uploads: waiting up to "
            f"{max(0.0, deadline - time.monotonic()):.0f}s for it to commit (Ctrl-C abandons "
            "it; Checkpointer.close() or `with Checkpointer(...)` waits for it in your code)"
        )
        try:
            wait([upload], timeout=max(0.0, deadline - time.monotonic()))
        except KeyboardInterrupt:
            return [f"{what} was {_CTRL_C}"]
        if not upload.done():
            return [f"{what} did not commit within {EXIT_WAIT_SECONDS:.0f}s"]
        failed = handle.committed.exception() if handle.committed.done() else None
        return [] if failed is None else [f"{what} failed: {failed}"]
