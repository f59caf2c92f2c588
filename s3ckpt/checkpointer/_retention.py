"""Retention after a commit: the policy runs on the coordinator in a background thread.

Its failures are logged and kept (``Checkpointer.last_retention``), never raised into
training.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from s3ckpt.store import ObjectStore
from s3ckpt.uri import StoreURL

if TYPE_CHECKING:
    from s3ckpt.retention import Policy, PruneResult

__all__ = ["RetentionRunner", "load_policy"]

log = logging.getLogger("s3ckpt")


def load_policy(policy: Policy | str | None) -> Policy | None:
    """``policy`` itself, or the policy of the TOML file it names (``None``: keep all)."""
    if policy is None:
        return None
    if isinstance(policy, str):
        from s3ckpt.retention import load_policy as load_file

        return load_file(policy)
    return policy


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
        self.last: PruneResult | BaseException | None = None

    def schedule(self, policy: Policy, grace: timedelta) -> None:
        """Queue a pass of ``policy`` (after the passes already queued)."""
        self._future = self._pool.submit(self._run, policy, grace)

    def wait(self) -> None:
        """Block until the last queued pass has run (its failure is in :attr:`last`)."""
        fut = self._future
        if fut is not None:
            fut.result()

    def close(self) -> None:
        """Wait for queued passes and release the thread."""
        self._pool.shutdown(wait=True)

    def _run(self, policy: Policy, grace: timedelta) -> None:
        from s3ckpt.retention import prune

        try:
            self.last = prune(self._store, self._url, policy, apply=True, grace=grace)
        except Exception as exc:
            self.last = exc
            log.warning("s3ckpt: retention on %s failed (training continues): %s", self._url, exc)
