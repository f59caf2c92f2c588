"""Retention after a commit: the policy runs on the coordinator in a background thread.

Its failures are logged and kept (``Checkpointer.last_retention``, and every pass in
``Checkpointer.retention_history``), never raised into training.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from s3ckpt.store import ObjectStore
from s3ckpt.uri import StoreURL

if TYPE_CHECKING:
    from s3ckpt.retention import Policy, PolicyFile, PruneResult

__all__ = ["RETENTION_HISTORY", "RetentionRecord", "RetentionRunner", "resolve_policy"]

log = logging.getLogger("s3ckpt")

RETENTION_HISTORY = 100
"""Passes :attr:`RetentionRunner.history` keeps (the oldest are dropped first): one pass per
commit, so the last 100 saves' worth, a few KiB each (a plan lists the run's checkpoints)."""


@dataclass(frozen=True)
class RetentionRecord:
    """One retention pass: what triggered it and how it ended.

    Attributes:
        step: The step whose commit queued the pass (``None`` when not known).
        started: Wall time (``time.time()``) the pass began.
        seconds: How long the pass ran.
        result: The pass's :class:`~s3ckpt.retention.PruneResult` (``None`` if it failed).
        error: The exception it failed with (``None`` if it succeeded).
    """

    step: int | None
    started: float
    seconds: float
    result: PruneResult | None = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        """Whether the pass finished without an exception (``result`` may still list
        keys it could not delete, in ``result.failures``)."""
        return self.error is None

    @property
    def outcome(self) -> PruneResult | BaseException:
        """``result`` or ``error``: what ``Checkpointer.last_retention`` shows."""
        if self.error is not None:
            return self.error
        assert self.result is not None
        return self.result


def resolve_policy(policy: Policy | PolicyFile | str | None) -> Policy | None:
    """A ``policy`` argument (Checkpointer, plug-ins) as a policy: ``policy`` itself, or the
    policy of the file or built-in name it names (``None``: keep all). Not
    :func:`s3ckpt.retention.load_policy`, which reads one policy file. A file's storage
    tiers (``[[tier]]``) and step pattern come along (:meth:`PolicyFile.as_policy
    <s3ckpt.retention.PolicyFile.as_policy>`), as do a :class:`~s3ckpt.retention.PolicyFile`'s
    given in Python (``PolicyFile(KeepLast(3), tiers=(Tier(...),))``)."""
    if policy is None:
        return None
    if isinstance(policy, str):
        from s3ckpt.retention import load_policy as load_file

        return load_file(policy)
    as_policy = getattr(policy, "as_policy", None)  # a PolicyFile (no import at start-up)
    return as_policy() if callable(as_policy) else policy  # type: ignore[return-value]


class RetentionRunner:
    """Runs a run's retention policy on one background thread, one pass at a time.

    Attributes:
        last: The last pass's :class:`~s3ckpt.retention.PruneResult`, or the exception it
            failed with; ``None`` before the first pass.
    """

    def __init__(self, store: ObjectStore, url: StoreURL) -> None:
        self._store = store
        self._url = url
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="s3ckpt-retention")
        self._future: Future[Any] | None = None
        self._lock = threading.Lock()
        self._history: deque[RetentionRecord] = deque(maxlen=RETENTION_HISTORY)
        self.last: PruneResult | BaseException | None = None

    @property
    def history(self) -> tuple[RetentionRecord, ...]:
        """The last :data:`RETENTION_HISTORY` passes, oldest first (a snapshot: safe to
        read while a pass runs)."""
        with self._lock:
            return tuple(self._history)

    def schedule(self, policy: Policy, grace: timedelta, step: int | None = None) -> None:
        """Queue a pass of ``policy`` (after the passes already queued), recorded as
        triggered by the commit of ``step``."""
        self._future = self._pool.submit(self._run, policy, grace, step)

    def wait(self) -> None:
        """Block until the last queued pass has run (its failure is in :attr:`last`)."""
        fut = self._future
        if fut is not None:
            fut.result()

    def close(self) -> None:
        """Wait for queued passes and release the thread."""
        self._pool.shutdown(wait=True)

    def _run(self, policy: Policy, grace: timedelta, step: int | None) -> None:
        from s3ckpt.retention import prune

        started, t0 = time.time(), time.perf_counter()
        try:
            result = prune(self._store, self._url, policy, apply=True, grace=grace)
        except Exception as exc:
            record = RetentionRecord(step, started, time.perf_counter() - t0, error=exc)
            log.warning("s3ckpt: retention on %s failed (training continues): %s", self._url, exc)
        else:
            record = RetentionRecord(step, started, time.perf_counter() - t0, result=result)
        with self._lock:
            self._history.append(record)
            self.last = record.outcome
