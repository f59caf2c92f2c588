"""The run's ``latest`` pointer: written after each commit, resolved on the coordinator.

``s3ckpt.latest.json`` under the run prefix names the newest commit. It is a hint:
:meth:`LatestPointer.find` checks it against the commit markers and one listing, so a
pointer left behind by a kill, pruned away or malformed never resolves to an uncommitted
checkpoint. Only the coordinator reads the bucket; the other ranks get its answer (or
the error it raised) by broadcast.

Finding nothing is checked before it becomes ``None`` (``start = load(...) or 0`` would
restart training): a checkpoint's URL given as the run raises, and a run that holds
nothing while runs are stored near it logs a warning (:mod:`._run_url`).
"""

from __future__ import annotations

import json
import logging
import pickle
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Literal, TypeVar

from s3ckpt._step_names import checkpoint_step
from s3ckpt.checkpointer._ranks import RankGroup
from s3ckpt.checkpointer._run_url import refuse_checkpoint_url, warn_if_misspelt
from s3ckpt.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    ConfigError,
    ObjectNotFoundError,
)
from s3ckpt.format import LATEST_NAME, MANIFEST_NAME, checkpoint_name
from s3ckpt.metrics.instrument import expecting
from s3ckpt.store import ObjectStore
from s3ckpt.uri import StoreURL

__all__ = ["LatestPointer"]

log = logging.getLogger("s3ckpt")

_T = TypeVar("_T")


class LatestPointer:
    """Writes and resolves the ``latest`` pointer of the run at ``url``."""

    def __init__(self, store: ObjectStore, url: StoreURL, ranks: RankGroup) -> None:
        self._store = store
        self._url = url
        self._ranks = ranks
        self._run_checked = False  # the URL was found to be no checkpoint
        self._warned = False  # a misspelt run is reported once per Checkpointer

    def write(self, step: int) -> None:
        """Point ``latest`` at ``step`` (coordinator only). Never fails the save: the
        pointer is a hint that :meth:`find` verifies."""
        if not self._ranks.is_coordinator:
            return
        body = json.dumps(
            {"step": step, "checkpoint": checkpoint_name(step), "written": time.time()}
        ).encode()
        try:
            self._store.put(self._url.key(LATEST_NAME), body)
        except Exception as exc:
            log.warning("s3ckpt: could not update %s: %s", self._url.key(LATEST_NAME), exc)

    def latest(self, grace: timedelta) -> int | None:
        """The newest committed step on every rank (a collective call), or ``None``.

        Raises:
            ConfigError: the run URL is a checkpoint's (:func:`refuse_checkpoint_url`).
        """
        return self._on_coordinator(lambda: self._find_or_explain(grace))

    def check_run_url(self) -> None:
        """Raise :class:`~s3ckpt.errors.ConfigError` if the run URL is a checkpoint's,
        before a save nests checkpoints inside it. Local (every rank asks: one or two
        HEADs), once per Checkpointer."""
        if not self._run_checked:
            refuse_checkpoint_url(self._store, self._url, saving=True)
            self._run_checked = True

    def _find_or_explain(self, grace: timedelta) -> int | None:
        step = self.find(grace)
        if step is None and not self._run_checked:
            refuse_checkpoint_url(self._store, self._url, saving=False)
            self._run_checked = True
            if not self._warned:
                self._warned = True
                warn_if_misspelt(self._store, self._url)
        return step

    def _on_coordinator(self, fn: Callable[[], _T]) -> _T:
        """``fn()`` run on the coordinator; its value, or the error it raised, on every rank
        (so no rank waits in a collective for a coordinator that failed)."""
        if not self._ranks.distributed:
            return fn()
        value: _T | None = None
        error: BaseException | None = None
        if self._ranks.is_coordinator:
            try:
                value = fn()
            except Exception as exc:
                error = exc
        shared = error
        if error is not None:
            try:
                pickle.dumps(error)
            except Exception:
                shared = CheckpointError(f"the coordinator failed: {type(error).__name__}: {error}")
        value, shared = self._ranks.broadcast((value, shared))
        if error is not None:
            raise error
        if shared is not None:
            raise shared
        return value

    def resolve(self, step: int | Literal["latest"], grace: timedelta) -> int | None:
        """``step`` checked to be committed (or the newest committed step for
        ``"latest"``; ``None`` when there is none), on every rank.

        Raises:
            CheckpointNotFoundError: ``step`` is a number with no committed checkpoint.
            ConfigError: the run URL is a checkpoint's (:func:`refuse_checkpoint_url`).
        """
        if step == "latest":
            return self.latest(grace)
        if not isinstance(step, int):
            raise ConfigError(f"step must be an int or 'latest', got {step!r}")

        def check() -> bool:
            if self.committed(step):
                return True
            refuse_checkpoint_url(self._store, self._url, saving=False)
            return False

        if not self._on_coordinator(check):
            raise CheckpointNotFoundError(
                f"no committed checkpoint for step {step} under {self._url} "
                f"(no {checkpoint_name(step)}/{MANIFEST_NAME}); `s3ckpt ls {self._url}` lists "
                "what there is",
                bucket=self._store.bucket,
                key=self._url.child(checkpoint_name(step)).key(MANIFEST_NAME),
            )
        return step

    def find(self, grace: timedelta) -> int | None:
        """The newest committed step: the pointer is a hint, checked by one listing.

        A kill between a commit and the pointer's update leaves the pointer on an older
        step, so the run's checkpoint prefixes after the pointer's are listed (names are
        zero-padded, so "after" in key order is "newer"; ``start_after`` makes that one
        LIST request however many checkpoints the run holds) and the newest with a marker
        wins. Without a usable pointer, the whole run is listed.

        Request cost: one GET of the pointer, one LIST, and one HEAD per candidate newer
        than the pointer (normally none) plus one for the pointer's own marker.
        """
        pointer = self._read()
        if pointer is None:
            return self._list_latest(grace)
        after = self._url.child(checkpoint_name(pointer)).prefix
        newer: list[int] = []
        for prefix in self._store.list_prefixes(self._url.prefix, start_after=after):
            later = checkpoint_step(prefix[len(self._url.prefix) :].rstrip("/"))
            if later is not None and later > pointer:
                newer.append(later)
        for step in sorted(newer, reverse=True):
            if self.committed(step):
                log.info(
                    "s3ckpt: %s names step %d, but %d is committed", LATEST_NAME, pointer, step
                )
                return step
        if self.committed(pointer):
            return pointer
        log.info("s3ckpt: %s names step %d, which is not committed; listing", LATEST_NAME, pointer)
        return self._list_latest(grace)

    def committed(self, step: int) -> bool:
        """Whether ``step`` has a commit marker (one HEAD)."""
        key = self._url.child(checkpoint_name(step)).key(MANIFEST_NAME)
        return self._store.head(key) is not None

    def _list_latest(self, grace: timedelta) -> int | None:
        from s3ckpt.retention import CheckpointState, list_checkpoints

        committed = [
            c.step
            for c in list_checkpoints(self._store, self._url, grace=grace)
            if c.state == CheckpointState.COMMITTED and c.step is not None
        ]
        return max(committed) if committed else None

    def _read(self) -> int | None:
        key = self._url.key(LATEST_NAME)
        try:
            with expecting("not_found"):  # one GET: a 404 says "no pointer" (a new run)
                data = json.loads(self._store.get(key))
            step = data["step"]
            return step if isinstance(step, int) and step >= 0 else None
        except ObjectNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            log.warning("s3ckpt: ignoring malformed %s", key)
            return None
