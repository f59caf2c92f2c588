"""The run's ``latest`` pointer: written after each commit, resolved on the coordinator.

``s3ckpt.latest.json`` under the run prefix names the newest commit. It is a hint:
:meth:`LatestPointer.find` checks it against the commit markers and one listing, so a
pointer left behind by a kill, pruned away or malformed never resolves to an uncommitted
checkpoint. Only the coordinator reads the bucket; the other ranks get its answer (or
the error it raised) by broadcast.

Each candidate's state is the catalog's (:func:`s3ckpt.retention.probe_checkpoint`: its
marker, one GET, judged as a scan judges it, with the run's ``s3ckpt.check.json``, one GET
per resolution): ``latest`` is the newest *good* committed checkpoint, and each damaged one
newer than it is named in a WARNING. With ``fallback=False`` a damaged newest checkpoint
raises :class:`~s3ckpt.errors.CorruptCheckpointError` instead. When every committed
checkpoint is damaged (or failed while loading) that error is raised too, never ``None``.

Finding nothing is checked before it becomes ``None`` (``start = load(...) or 0`` would
restart training): a checkpoint's URL given as the run raises, and a run that holds
nothing while runs are stored near it logs a warning (:mod:`._run_url`).
"""

from __future__ import annotations

import json
import logging
import pickle
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Literal, TypeVar

from s3ckpt._step_names import checkpoint_step
from s3ckpt.checkpointer._ranks import RankGroup
from s3ckpt.checkpointer._run_url import refuse_checkpoint_url, warn_if_misspelt
from s3ckpt.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    ConfigError,
    CorruptCheckpointError,
    ObjectNotFoundError,
    StoreError,
)
from s3ckpt.format import CHECK_NAME, LATEST_NAME, MANIFEST_NAME, checkpoint_name
from s3ckpt.metrics.instrument import expecting
from s3ckpt.retention import (
    CheckpointState,
    CheckRecord,
    RetentionOptions,
    list_checkpoints,
    probe_checkpoint,
    read_check_record,
)
from s3ckpt.store import Location, ObjectStore
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

    @property
    def url(self) -> StoreURL:
        """The run."""
        return self._url

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

    def latest(
        self, grace: timedelta, skip: Mapping[int, str] | None = None, *, fallback: bool = True
    ) -> int | None:
        """The newest good committed step on every rank (a collective call), or ``None``
        (see :meth:`find`).

        Raises:
            ConfigError: the run URL is a checkpoint's (:func:`refuse_checkpoint_url`).
            CorruptCheckpointError: no committed checkpoint is good, or (``fallback=False``)
                the newest is damaged.
        """
        return self._on_coordinator(lambda: self._find_or_explain(grace, skip or {}, fallback))

    def check_run_url(self) -> None:
        """Raise :class:`~s3ckpt.errors.ConfigError` if the run URL is a checkpoint's,
        before a save nests checkpoints inside it. Local (every rank asks: one or two
        HEADs), once per Checkpointer."""
        if not self._run_checked:
            refuse_checkpoint_url(self._store, self._url, saving=True)
            self._run_checked = True

    def _find_or_explain(
        self, grace: timedelta, skip: Mapping[int, str], fallback: bool
    ) -> int | None:
        step = self.find(grace, skip, fallback=fallback)
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

    def resolve(
        self,
        step: int | Literal["latest"],
        grace: timedelta,
        *,
        skip: Mapping[int, str] | None = None,
        fallback: bool = True,
    ) -> int | None:
        """``step`` checked to be committed (or for ``"latest"`` the newest good committed
        step, none of ``skip``: :meth:`latest`; ``None`` when there is none), on every rank.

        Raises:
            CheckpointNotFoundError: ``step`` is a number with no committed checkpoint.
            ConfigError: the run URL is a checkpoint's (:func:`refuse_checkpoint_url`).
        """
        if step == "latest":
            return self.latest(grace, skip, fallback=fallback)
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

    def find(
        self, grace: timedelta, skip: Mapping[int, str] | None = None, *, fallback: bool = True
    ) -> int | None:
        """The newest good committed step, none of ``skip`` (steps that failed while
        loading, with why): the pointer is a hint, checked by one listing.

        A kill between a commit and the pointer's update leaves the pointer on an older
        step, so the run's checkpoint prefixes after the pointer's are listed (names are
        zero-padded, so "after" in key order is "newer"; ``start_after`` makes that one
        LIST request however many checkpoints the run holds) and the newest good one with a
        marker wins. Without a usable pointer, or when no candidate is good, the run's
        catalog is read (:func:`~s3ckpt.retention.list_checkpoints`).

        Request cost: one GET of the pointer, one of the run's check record, one LIST, and
        one GET per candidate (its marker: the pointer's, and any newer; normally one).
        """
        found = _Found(self._store, self._url, dict(skip or {}), fallback)
        pointer = self._read()
        if pointer is not None:
            after = self._url.child(checkpoint_name(pointer)).prefix
            newer: list[int] = []
            for prefix in self._store.list_prefixes(self._url.prefix, start_after=after):
                later = checkpoint_step(prefix[len(self._url.prefix) :].rstrip("/"))
                if later is not None and later > pointer:
                    newer.append(later)
            for step in [*sorted(newer, reverse=True), pointer]:
                if found.good(step):
                    if step != pointer:
                        log.info(
                            "s3ckpt: %s names step %d, but %d is committed",
                            LATEST_NAME,
                            pointer,
                            step,
                        )
                    return found.done(step)
            if pointer not in found.skipped:
                log.info(
                    "s3ckpt: %s names step %d, which is not committed; listing",
                    LATEST_NAME,
                    pointer,
                )
        return found.done(self._list_latest(grace, found))

    def committed(self, step: int) -> bool:
        """Whether ``step`` has a commit marker (one HEAD)."""
        key = self._url.child(checkpoint_name(step)).key(MANIFEST_NAME)
        return self._store.head(key) is not None

    def _list_latest(self, grace: timedelta, found: _Found) -> int | None:
        committed = [
            c
            for c in list_checkpoints(
                Location(self._url, self._store), options=RetentionOptions(grace=grace)
            )
            if c.state == CheckpointState.COMMITTED and c.step is not None
        ]
        for c in sorted(committed, key=lambda c: c.step or 0, reverse=True):
            assert c.step is not None
            if found.judge(c.step, c.damage):
                return c.step
        return None

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


class _Found:
    """One resolution of ``latest``: the steps skipped (damaged, or failed while loading)
    and the one found; the WARNING naming each skipped step; the error when nothing good
    is left, or (``fallback=False``) when the newest committed checkpoint is damaged."""

    def __init__(
        self, store: ObjectStore, url: StoreURL, skip: dict[int, str], fallback: bool
    ) -> None:
        self._store = store
        self._url = url
        self.skipped = skip
        self._fallback = fallback
        self._record: CheckRecord | None = None
        self._record_read = False

    def good(self, step: int) -> bool:
        """Whether ``step`` is a good committed checkpoint (one GET of its marker)."""
        if step in self.skipped:
            return False
        if not self._record_read:
            self._record_read = True
            try:
                self._record = read_check_record(self._store, self._url)
            except StoreError as exc:  # what a check found is unknown: a load still verifies
                log.warning("s3ckpt: could not read %s: %s", self._url.key(CHECK_NAME), exc)
        info = probe_checkpoint(self._store, self._url, checkpoint_name(step), self._record)
        return info is not None and self.judge(step, info.damage)

    def judge(self, step: int, damage: str | None) -> bool:
        """Whether committed ``step``, damaged as ``damage`` says, is the one."""
        if step in self.skipped:
            return False
        if damage is None:
            return True
        if not self._fallback:
            raise CorruptCheckpointError(
                f"the newest checkpoint, step {step}, is damaged: {damage}; load(step={step}) "
                "reads it anyway, load(fallback=True) loads the newest good one, s3ckpt rm "
                "deletes it",
                bucket=self._store.bucket,
                key=self._url.child(checkpoint_name(step)).prefix,
            )
        self.skipped[step] = f"damaged: {damage}"
        return False

    def done(self, step: int | None) -> int | None:
        """``step``, after a WARNING per damaged step skipped; raises when steps were
        skipped and none is good."""
        if step is None and self.skipped:
            why = "; ".join(f"step {s}: {w}" for s, w in sorted(self.skipped.items()))
            raise CorruptCheckpointError(
                f"no good checkpoint under {self._url}: {why}; `s3ckpt ls {self._url}` lists "
                "them, `s3ckpt check` names the damage",
                bucket=self._store.bucket,
                key=self._url.prefix,
            )
        for s, why in sorted(self.skipped.items(), reverse=True):
            if why.startswith("damaged: ") and (step is None or s > step):
                log.warning(
                    "s3ckpt: skipping step %d of %s (%s); the newest good checkpoint is step %s",
                    s,
                    self._url,
                    why,
                    step,
                )
        return step
