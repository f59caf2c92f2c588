"""The run's ``latest`` pointer, and the resume that heals: the newest *good* checkpoint.

``s3ckpt.latest.json`` under the run prefix names the newest commit. It is a hint:
:meth:`LatestPointer.candidates` checks it against the commit markers and one listing, so a
pointer left behind by a kill, pruned away or malformed never resolves to an uncommitted
checkpoint. Only the coordinator reads the bucket; the other ranks get its answer (or
the error it raised) by broadcast.

Each candidate's state is the catalog's (:func:`s3ckpt.retention.probe_checkpoint`: its
marker, one GET, judged as a scan judges it, with the run's ``s3ckpt.check.json``).
:func:`load_newest_good`, the one resume of the Checkpointer and the framework plug-ins,
reads the newest good candidate: one known damaged is skipped with a WARNING, and so is
one whose read fails verification (a checksum mismatch, a missing object, a corrupt
``.metadata`` or marker: :data:`DAMAGE`). DCP gathers every rank's failure into one
``CheckpointException`` on all ranks, so every rank takes the same decision; a transient,
permission, shape or configuration error is never damage: it is raised. With
``fallback=False`` a damaged newest checkpoint raises
:class:`~s3ckpt.errors.CorruptCheckpointError`, and so does a run whose every committed
checkpoint is damaged, never ``None``.

Finding nothing is checked before it becomes ``None`` (``start = load(...) or 0`` would
restart training): a checkpoint's URL given as the run raises, and a run that holds
nothing while runs are stored near it logs a warning (:func:`warn_if_misspelt`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from difflib import get_close_matches
from itertools import islice
from typing import Any, TypeVar

from s3ckpt._step_names import checkpoint_step
from s3ckpt.checkpointer._ranks import RankGroup
from s3ckpt.errors import (
    CheckpointNotFoundError,
    ConfigError,
    CorruptCheckpointError,
    ObjectNotFoundError,
    S3CkptError,
    StoreError,
    unwrap_checkpoint_exception,
)
from s3ckpt.format._names import (
    CHECK_NAME,
    LATEST_NAME,
    MANIFEST_NAME,
    METADATA_NAME,
    SHARDS_DIR,
    checkpoint_name,
)
from s3ckpt.metrics.instrument import expecting
from s3ckpt.retention import CheckpointInfo, RetentionOptions, list_checkpoints
from s3ckpt.retention._check_record import read_check_record
from s3ckpt.retention._scan import probe_checkpoint
from s3ckpt.store import Location, ObjectStore
from s3ckpt.uri import StoreURL

__all__ = ["Candidate", "LatestPointer", "load_newest_good", "nearby_runs", "warn_if_misspelt"]

log = logging.getLogger("s3ckpt")

_T = TypeVar("_T")

DAMAGE: tuple[type[S3CkptError], ...] = (CorruptCheckpointError, ObjectNotFoundError)
"""The failures of a read that mean the checkpoint is damaged (a checksum mismatch is a
:class:`~s3ckpt.errors.ChecksumMismatchError`, a corrupt ``.metadata`` or marker a
:class:`~s3ckpt.errors.CorruptCheckpointError`, a missing object an
:class:`~s3ckpt.errors.ObjectNotFoundError`): a resume from "latest" falls back past them."""


@dataclass(frozen=True)
class Candidate:
    """A committed checkpoint to resume from, with the catalog's verdict
    (:attr:`~s3ckpt.retention.CheckpointInfo.damage`: None when it is good)."""

    url: str
    step: int | None = None
    damage: str | None = None

    @classmethod
    def newest_first(cls, infos: Iterable[CheckpointInfo]) -> list[Candidate]:
        """The committed checkpoints of a catalog (oldest first, as ``list_checkpoints``
        gives them), newest first."""
        return [cls(str(c.url), c.step, c.damage) for c in reversed(list(infos)) if c.is_committed]

    def __str__(self) -> str:
        return self.url if self.step is None else f"step {self.step} ({self.url})"


def load_newest_good(
    candidates: Iterable[Candidate],
    read: Callable[[Candidate], _T],
    *,
    fallback: bool,
    run: StoreURL,
) -> tuple[Candidate, _T] | None:
    """Resume from "latest" (every rank calls it with the same ``candidates``, newest
    first): ``read`` the newest good candidate, skipping those the catalog knows damaged
    and, with ``fallback``, those whose read fails verification (:data:`DAMAGE`), each
    named in a WARNING. Without ``fallback`` the first candidate's failure is raised.

    Returns:
        The candidate read and what ``read`` returned; None when there are no candidates.

    Raises:
        CorruptCheckpointError: ``fallback=False`` and the newest is known damaged, or no
            candidate is good.
        S3CkptError: what else failed (DCP's ``CheckpointException`` unwrapped).
    """
    skipped: list[str] = []
    for c in candidates:
        if c.damage is not None:
            if not fallback:
                raise CorruptCheckpointError(
                    f"the newest checkpoint, {c}, is damaged: {c.damage}; load it by its step "
                    "or name to read it anyway, allow the fallback (load(fallback=True)) to load "
                    "the newest good one, or delete it with s3ckpt rm",
                    bucket=run.bucket,
                    key=c.url,
                )
            skipped.append(f"{c}: damaged: {c.damage}")
            log.warning("s3ckpt: skipping %s (damaged: %s)", c, c.damage)
            continue
        try:
            return c, read(c)
        except BaseException as exc:
            err = unwrap_checkpoint_exception(exc, f"the load of {c}", bucket=run.bucket)
            if not fallback or not isinstance(err, DAMAGE):
                raise err from err.__cause__
            skipped.append(f"{c}: failed verification while loading: {err}")
            log.warning(f"s3ckpt: skipping {skipped[-1]}; loading the newest good one before it")
    if skipped:
        raise CorruptCheckpointError(
            f"no good checkpoint under {run}: {'; '.join(skipped)}; `s3ckpt ls {run}` lists "
            "them, `s3ckpt check` names the damage",
            bucket=run.bucket,
            key=run.prefix,
        )
    return None


class LatestPointer:
    """Writes the ``latest`` pointer of the run at ``url`` and resolves steps from it."""

    def __init__(self, store: ObjectStore, url: StoreURL, ranks: RankGroup) -> None:
        self._store, self.url, self._ranks = store, url, ranks
        self._run_checked = False  # the URL was found to be no checkpoint (a misspelt run
        # is reported once per Checkpointer, when a resume first finds nothing)

    def write(self, step: int) -> None:
        """Point ``latest`` at ``step`` (coordinator only). Never fails the save: the
        pointer is a hint that :meth:`candidates` verifies."""
        if not self._ranks.is_coordinator:
            return
        body = {"step": step, "checkpoint": checkpoint_name(step), "written": time.time()}
        try:
            self._store.put(self.url.key(LATEST_NAME), json.dumps(body).encode())
        except Exception as exc:
            log.warning("s3ckpt: could not update %s: %s", self.url.key(LATEST_NAME), exc)

    def check_run_url(self, *, saving: bool = True) -> bool:
        """Raise :class:`~s3ckpt.errors.ConfigError` if the run URL is a checkpoint's,
        before a save nests checkpoints inside it (``saving``; else before a resume finds
        nothing). Local (every rank asks: one or two HEADs), once per Checkpointer: whether
        it was checked now."""
        if self._run_checked:
            return False
        refuse_checkpoint_url(self._store, self.url, saving=saving)
        self._run_checked = True
        return True

    def candidates(self, grace: timedelta) -> Iterator[Candidate]:
        """The run's committed checkpoints, newest first, each with the catalog's damage, on
        every rank (each step a collective call); ask for the next only when the previous
        one would not do. The pointer's and any newer (after the pointer, in key order,
        zero-padded names: one LIST however many checkpoints the run holds) come first; the
        run's catalog (:func:`~s3ckpt.retention.list_checkpoints`) past those.

        Request cost of the first: one GET of the pointer, one of the run's check record,
        one LIST, and one GET per marker probed (the pointer's, and any newer; normally one).

        Raises:
            ConfigError: the run holds no checkpoint and its URL is a checkpoint's.
        """
        search = self._search(grace) if self._ranks.is_coordinator else iter(())
        while (found := self._ranks.on_coordinator(lambda: next(search, None))) is not None:
            yield Candidate(str(self.url.child(checkpoint_name(found[0]))), *found)

    def resolve(self, step: Any) -> Candidate:
        """Numbered ``step`` checked to be committed (one HEAD), on every rank.

        Raises:
            CheckpointNotFoundError: no committed checkpoint for ``step``.
            ConfigError: ``step`` is no int, or the run URL is a checkpoint's.
        """
        if not isinstance(step, int):
            raise ConfigError(f"step must be an int or 'latest', got {step!r}")
        key = self.url.child(checkpoint_name(step)).key(MANIFEST_NAME)

        def check() -> bool:
            if self._store.head(key) is not None:
                return True
            refuse_checkpoint_url(self._store, self.url, saving=False)
            return False

        if not self._ranks.on_coordinator(check):
            raise CheckpointNotFoundError(
                f"no committed checkpoint for step {step} under {self.url} "
                f"(no {checkpoint_name(step)}/{MANIFEST_NAME}); `s3ckpt ls {self.url}` lists "
                "what there is",
                bucket=self._store.bucket,
                key=key,
            )
        return Candidate(str(self.url.child(checkpoint_name(step))), step)

    def _search(self, grace: timedelta) -> Iterator[tuple[int, str | None]]:
        """The coordinator's side of :meth:`candidates`: ``(step, damage)`` pairs."""
        seen: set[int] = set()
        pointer = self._read()
        if pointer is not None:
            try:
                record = read_check_record(self._store, self.url)
            except StoreError as exc:  # what a check found is unknown: a load still verifies
                log.warning("s3ckpt: could not read %s: %s", self.url.key(CHECK_NAME), exc)
                record = None
            after = self.url.child(checkpoint_name(pointer)).prefix
            steps = (
                checkpoint_step(p[len(self.url.prefix) :].rstrip("/"))
                for p in self._store.list_prefixes(self.url.prefix, start_after=after)
            )
            newer = sorted((s for s in steps if s is not None and s > pointer), reverse=True)
            for step in [*newer, pointer]:
                info = probe_checkpoint(self._store, self.url, checkpoint_name(step), record)
                if info is not None:
                    seen.add(step)
                    yield step, info.damage
        options = RetentionOptions(grace=grace)
        catalog = list_checkpoints(Location(self.url, self._store), options=options)
        for c in sorted(catalog, key=lambda c: c.step or 0, reverse=True):
            if c.is_committed and c.step is not None and c.step not in seen:
                seen.add(c.step)
                yield c.step, c.damage
        if not seen and self.check_run_url(saving=False):  # nothing to resume: a wrong URL?
            warn_if_misspelt(self._store, self.url)

    def _read(self) -> int | None:
        key = self.url.key(LATEST_NAME)
        try:
            with expecting("not_found"):  # one GET: a 404 says "no pointer" (a new run)
                step = json.loads(self._store.get(key))["step"]
            return step if isinstance(step, int) and step >= 0 else None
        except ObjectNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            log.warning("s3ckpt: ignoring malformed %s", key)
            return None


# -- is the URL a run? ---------------------------------------------------------------------
# Is a Checkpointer's URL a run? Two mistakes that would otherwise restart training silently.
#
# ``start = ckpt.load(...) or 0`` trains from step 0 whenever ``load`` finds nothing, so a
# wrong URL must not look like an empty run:
#
# * **A checkpoint's URL** (``s3://b/runs/llama/step_000010000``, copied from ``s3ckpt ls``)
#   holds a commit marker (or a stock DCP ``.metadata``) rather than checkpoints.
#   :func:`refuse_checkpoint_url` raises :class:`~s3ckpt.errors.ConfigError` naming the run
#   URL to use, for a load and for a save alike. Loading it for ``step="latest"`` would
#   look helpful, but the same Checkpointer's next save would then nest a checkpoint inside
#   a checkpoint (``.../step_000010000/step_000010100/``), hours later; failing at once,
#   with the fix in the message, is the safer surprise.
# * **A misspelt run** (``s3://b/runs/lama``) holds nothing. ``load`` still returns
#   ``None`` (a new run looks the same), but :func:`warn_if_misspelt` logs a WARNING naming
#   the URL and the runs nearest to it by likeness of name, found by a bounded search.
#
# Request cost: :func:`refuse_checkpoint_url` is one or two HEADs; :func:`nearby_runs` at most
# ``2 + _MAX_UNCLES`` LISTs of sub-prefixes (each stopped after :data:`_MAX_LISTED`
# prefixes, one request) plus :data:`_MAX_PROBES` LISTs to confirm candidates. Both run only
# when a load finds nothing (and the run check once before a Checkpointer's first save).

#: The most sub-prefixes read from one listing (a bucket may hold thousands of runs).
_MAX_LISTED = 300
#: How many of the grandparent's other children (nearest by name first) are searched.
_MAX_UNCLES = 2
#: How many candidates are listed to confirm they hold checkpoints.
_MAX_PROBES = 6
#: How many runs a warning names.
_MAX_NAMED = 3


def refuse_checkpoint_url(store: ObjectStore, url: StoreURL, *, saving: bool) -> None:
    """Raise :class:`~s3ckpt.errors.ConfigError` if ``url`` is a checkpoint, not a run: it
    holds a commit marker or a stock DCP ``.metadata`` (one or two HEADs).

    The message names the run to give the Checkpointer instead (the checkpoint's parent)
    and the step to load, or, for a checkpoint the Checkpointer would not name so (another
    framework's, stock DCP), how to load it directly.
    """
    with expecting("not_found"):  # a run holds neither: the normal answer is 404
        marker = next(
            (m for m in (MANIFEST_NAME, METADATA_NAME) if store.head(url.key(m)) is not None), None
        )
    if marker is None:
        return
    run, name = url.parent, url.name
    step = checkpoint_step(name)
    own = marker == MANIFEST_NAME and step is not None and checkpoint_name(step) == name
    what = "a committed checkpoint" if marker == MANIFEST_NAME else "a DCP checkpoint (.metadata)"
    if saving:
        todo = (
            f"saving here would nest checkpoints inside it. Give the Checkpointer the run: "
            f"Checkpointer({str(run)!r})"
        )
    elif own:
        todo = (
            f"give the Checkpointer the run and the step: Checkpointer({str(run)!r})"
            f".load(..., step={step})"
        )
    else:
        todo = (
            "a Checkpointer loads the step_* checkpoints of a run; load this one with "
            f"dcp.load(state_dict, storage_reader=S3StorageReader({str(url)!r}))"
        )
    raise ConfigError(
        f"{url} is {what}, not a run of checkpoints: {todo}",
        bucket=store.bucket,
        key=url.key(marker),
    )


def _children(store: ObjectStore, url: StoreURL) -> Iterator[StoreURL]:
    """The sub-prefixes of ``url`` (at most :data:`_MAX_LISTED`; one LIST request)."""
    for prefix in islice(store.list_prefixes(url.prefix), _MAX_LISTED):
        child = StoreURL(url.scheme, url.bucket, prefix)
        if child.name != SHARDS_DIR:
            yield child


def _is_run(children: Iterable[StoreURL]) -> bool:
    """Whether ``children`` (:func:`_children`: one LIST request) hold a sub-prefix named like
    a checkpoint."""
    return any(checkpoint_step(c.name) is not None for c in children)


def nearby_runs(store: ObjectStore, url: StoreURL) -> list[StoreURL] | None:
    """Runs (prefixes holding checkpoints) near ``url``, nearest first, or ``None`` when
    ``url`` is a run itself (it holds checkpoint prefixes, committed or not).

    Searched, each listing bounded: the sub-prefixes of ``url`` (it may be the folder of
    runs), its siblings (a typo in the run's name), and the children of the two
    grandparent's children named nearest to its parent (a typo one level up). Candidates
    are ranked by the likeness of their whole prefix to ``url``'s
    (:func:`difflib.get_close_matches`); the nearest are confirmed by one listing each.
    """
    children = list(_children(store, url))
    if _is_run(children):
        return None
    candidates = {c.prefix: c for c in children}
    parent = url.parent
    if parent != url:
        candidates.update((c.prefix, c) for c in _children(store, parent) if c != url)
        if parent.parent != parent:
            uncles = {c.name: c for c in _children(store, parent.parent) if c != parent}
            for name in get_close_matches(parent.name, uncles, _MAX_UNCLES, cutoff=0):
                candidates.update((c.prefix, c) for c in _children(store, uncles[name]))
    ranked = get_close_matches(url.prefix, candidates, _MAX_PROBES, cutoff=0)
    confirmed = (candidates[p] for p in ranked if _is_run(_children(store, candidates[p])))
    return list(islice(confirmed, _MAX_NAMED))


def warn_if_misspelt(store: ObjectStore, url: StoreURL) -> None:
    """Log a WARNING when ``url`` holds nothing but runs with checkpoints are near it.

    Never raises: a role may list its own run but not the bucket around it (the search is
    then logged at DEBUG and skipped).
    """
    try:
        runs = nearby_runs(store, url)
    except Exception as exc:
        log.debug("s3ckpt: could not look for runs near %s: %s", url, exc)
        return
    if not runs:
        return
    log.warning(
        f"s3ckpt: nothing to resume at {url}: it holds no checkpoint, so load() returns None "
        f"and training starts from step 0. Runs with checkpoints near it: "
        f"{', '.join(map(str, runs))}. If you meant one of them, fix the Checkpointer's URL; "
        "if this is a new run, ignore this"
    )
