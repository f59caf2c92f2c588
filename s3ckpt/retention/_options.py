"""A retention run's settings as one value: :class:`RetentionOptions`.

:func:`~s3ckpt.retention.prune`, :func:`~s3ckpt.retention.gc`,
:func:`~s3ckpt.retention.delete_checkpoint`, the report and the CLI take one of these
instead of a dozen loose keyword arguments. It is frozen and validated at construction: a
bad step pattern, batch size or delete limit is refused before any request, and the step
pattern is compiled here, once per run, never again below.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from s3ckpt._step_names import StepMatcher, compile_step_pattern
from s3ckpt.errors import ConfigError
from s3ckpt.retention._delete import ProgressCallback
from s3ckpt.retention._lease import DEFAULT_LEASE_TTL
from s3ckpt.retention._liveness import DEFAULT_GRACE
from s3ckpt.store.base import MAX_DELETE_BATCH

__all__ = ["RetentionOptions"]


@dataclass(frozen=True)
class RetentionOptions:
    """How a retention run judges and deletes (every field has a safe default).

    Attributes:
        grace: A save (a tag) is in progress while any of its objects, heartbeats or open
            uploads is younger than this (raised to 60 s when shorter, with a note).
        now: The time policies and the grace period judge against (default: the store's
            time; with ``apply``, a refusal when this host's clock is further from it than
            the grace period).
        step_pattern: How checkpoint names give their steps: a regular expression with one
            capture group (a string is compiled here, once), or None for the built-in name
            forms. A step recorded in a commit marker always wins.
        include_foreign: Treat stock-DCP checkpoints (no marker) as committed; only their
            DCP names are deleted.
        max_delete: Delete at most this many checkpoints per run (None: no limit).
        lease_ttl: How long the run's lease lasts without renewal.
        batch_size: Keys per DeleteObjects request (1..1000).
        retries: Rounds of retries for throttled / 5xx per-key errors.
        sleep: Back-off sleep (tests pass a no-op).
        on_progress: Called with ``(event, details)`` as a run goes.
    """

    grace: timedelta = DEFAULT_GRACE
    now: datetime | None = None
    step_pattern: StepMatcher | None = None
    include_foreign: bool = False
    max_delete: int | None = None
    lease_ttl: timedelta = DEFAULT_LEASE_TTL
    batch_size: int = MAX_DELETE_BATCH
    retries: int = 5
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)
    on_progress: ProgressCallback | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.step_pattern is not None:
            pattern: Any = self.step_pattern
            if isinstance(pattern, (str, re.Pattern)):
                object.__setattr__(self, "step_pattern", compile_step_pattern(pattern))
        if not 1 <= self.batch_size <= MAX_DELETE_BATCH:
            raise ConfigError(f"batch_size must be 1..{MAX_DELETE_BATCH}, got {self.batch_size}")
        if self.max_delete is not None and self.max_delete < 0:
            raise ConfigError(f"max_delete must be >= 0, got {self.max_delete}")
        if self.retries < 0:
            raise ConfigError(f"retries must be >= 0, got {self.retries}")
        if self.lease_ttl <= timedelta(0):
            raise ConfigError(f"lease_ttl must be positive, got {self.lease_ttl}")

    def replace(self, **changes: Any) -> RetentionOptions:
        """A copy with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes)
