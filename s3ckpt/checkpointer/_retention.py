"""Retention after a commit: the policy runs on the coordinator in a background thread.

Each deletion is logged at INFO with its reason; failures are logged and kept
(``Checkpointer.last_retention``, and every pass in ``Checkpointer.retention_history``),
never raised into training. Deletes the store refuses (403 ``AccessDenied``: terraform's
trainer role without ``trainer_may_prune``) are one WARNING naming the cron route, and
the job's later passes are skipped: every checkpoint is kept.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from s3ckpt.checkpointer._async import wait_at_exit
from s3ckpt.errors import AccessDeniedError, LeaseHeldError
from s3ckpt.retention import Policy, PolicyFile, PruneResult, RetentionOptions, load_policy, prune
from s3ckpt.store import Location, ObjectStore
from s3ckpt.uri import StoreURL

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
        return self.result if self.error is None else self.error  # type: ignore[return-value]


def resolve_policy(policy: Policy | PolicyFile | str | None) -> Policy | None:
    """A ``policy`` argument (Checkpointer, plug-ins) as a policy: ``policy`` itself, or the
    policy of the file or built-in name it names (``None``: keep all). Not
    :func:`s3ckpt.retention.load_policy`, which reads one policy file. A file's storage
    tiers (``[[tier]]``) and step pattern come along (:meth:`PolicyFile.as_policy
    <s3ckpt.retention.PolicyFile.as_policy>`), as do a :class:`~s3ckpt.retention.PolicyFile`'s
    given in Python (``PolicyFile(KeepLast(3), tiers=(Tier(...),))``)."""
    if isinstance(policy, str):
        return load_policy(policy)
    return policy.as_policy() if isinstance(policy, PolicyFile) else policy


LEASE_RETRIES = (0.25, 0.5, 1.0, 2.0, 4.0)
"""Pauses (seconds) between a pass's tries while another holder has the run's lease."""


class RetentionRunner:
    """Runs a run's retention policy on one background thread, one pass at a time.

    Attributes:
        last: The last pass's :class:`~s3ckpt.retention.PruneResult`, or the exception it
            failed with; ``None`` before the first pass.
    """

    def __init__(self, store: ObjectStore, url: StoreURL) -> None:
        self._store, self._url = store, url
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="s3ckpt-retention")
        self._future: Future[Any] | None = None
        self._lock = threading.Lock()
        self._history: deque[RetentionRecord] = deque(maxlen=RETENTION_HISTORY)
        self._denied = False
        self.last: PruneResult | BaseException | None = None
        wait_at_exit(self)

    @property
    def history(self) -> tuple[RetentionRecord, ...]:
        """The last :data:`RETENTION_HISTORY` passes, oldest first (a snapshot: safe to
        read while a pass runs)."""
        with self._lock:
            return tuple(self._history)

    def schedule(self, policy: Policy, grace: timedelta, step: int | None = None) -> None:
        """Queue a pass of ``policy`` (after the passes already queued), recorded as
        triggered by the commit of ``step``. Nothing once the store refused a delete."""
        if self._denied:
            log.debug("s3ckpt: no retention pass after step %s: deletes are denied", step)
            return
        self._future = self._pool.submit(self._run, policy, grace, step)

    def wait(self) -> None:
        """Block until the last queued pass has run (its failure is in :attr:`last`)."""
        if self._future is not None:
            self._future.result()

    def close(self) -> None:
        """Wait for queued passes and release the thread."""
        self._pool.shutdown(wait=True)

    def drain_at_exit(self, deadline: float) -> list[str]:
        """At interpreter exit: wait (until ``deadline``, ``time.monotonic()``) for the pass
        in flight. Nothing is lost if it is cut short (the next prune finishes it)."""
        fut = self._future
        if fut is not None and not fut.done():
            log.warning(f"s3ckpt: the interpreter is exiting: waiting for retention on {self._url}")
            wait([fut], timeout=max(0.0, deadline - time.monotonic()))
        return []

    def _run(self, policy: Policy, grace: timedelta, step: int | None) -> None:
        started, t0 = time.time(), time.perf_counter()
        run, options = Location(self._url, self._store), RetentionOptions(grace=grace)
        try:
            # The run's lease is often held for a moment by this job itself (a plug-in's
            # removal of one checkpoint, the previous pass's release): try again for a few
            # seconds before calling the pass failed.
            for pause in (*LEASE_RETRIES, None):
                try:
                    result = prune(run, policy, apply=True, options=options)
                    break
                except LeaseHeldError:
                    if pause is None:
                        raise
                    time.sleep(pause)
        except Exception as exc:
            record = RetentionRecord(step, started, time.perf_counter() - t0, error=exc)
            if isinstance(exc, AccessDeniedError):
                self._deny(str(exc))
            else:
                log.warning(f"s3ckpt: retention on {self._url} failed (training continues): {exc}")
        else:
            record = RetentionRecord(step, started, time.perf_counter() - t0, result=result)
            _log_deletions(result)
            if denied := [f for f in result.failures if f.code == "AccessDenied"]:
                self._deny(f"AccessDenied on {denied[0].key}: {denied[0].message}")
        with self._lock:
            self._history.append(record)
            self.last = record.outcome

    def _deny(self, why: str) -> None:
        self._denied = True
        log.warning(
            f"s3ckpt: in-job retention on {self._url} may not delete ({why}): every checkpoint "
            "is kept and training continues; this job runs no more retention passes. Prune "
            f"from a cron with the pruner role instead (`s3ckpt prune {self._url} --policy "
            "POLICY --apply`, docs/operations.md), or give the trainer deletes (terraform: "
            "trainer_may_prune = true)"
        )


def _log_deletions(result: PruneResult) -> None:
    """One INFO line per checkpoint a pass deleted, with why; one WARNING for the keys it
    could not delete."""
    reasons = {d.checkpoint.name: d.reasons for d in result.plan.decisions}
    for name in result.deleted:
        why = "; ".join(reasons.get(name, ())) or "finishing an interrupted prune"
        why += f", policy {result.plan.policy}"
        log.info(f"s3ckpt: retention deleted {result.run.child(name)} ({why})")
    if result.failures:
        first = result.failures[0]
        log.warning(
            f"s3ckpt: retention could not delete {len(result.failures)} key(s) under "
            f"{result.run} (first: {first.key} {first.code})"
        )
