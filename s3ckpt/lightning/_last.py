"""``ckpt_path="last"`` on an object store, whichever fsspec file system owns the scheme.

Lightning resolves ``fit(ckpt_path="last")`` (and ``validate`` / ``test`` / ``predict``) in
``_CheckpointConnector._parse_ckpt_path``: it gathers every ``ModelCheckpoint``'s
``last*.ckpt`` candidates and picks the one with the newest ``fs.modified(path)``. Two
things break on S3:

* ``ModelCheckpoint._find_last_checkpoints`` passes fsspec's scheme-less names through
  ``os.path.normpath``, so ``s3://b/run/last.ckpt`` becomes ``b/run/last.ckpt``, a local
  path that does not exist: "no last checkpoint". Fixed by :func:`find_last` (which also
  drops the file system's cached listings first: s3fs caches them forever, and
  the checkpoints were written by s3ckpt, not through s3fs).
* an s3ckpt checkpoint is a prefix, and s3fs's ``modified`` of a prefix raises
  ``IsADirectoryError``. :func:`fix_parse_ckpt_path` picks the newest candidate itself when
  a candidate is remote, by the time the store gives: an s3ckpt checkpoint's commit
  marker's ``LastModified`` (else its ``.metadata``'s, for a stock DCP checkpoint; else the
  object's own, for a single-file checkpoint), and hands Lightning the chosen path. Local
  candidates keep Lightning's ``fs.modified``.

The resume heals (:func:`resume_chain`): a candidate the catalog knows damaged (``s3ckpt
check`` found it, or its marker is unreadable) is skipped with a WARNING, and the chain of
what to fall back to (the older candidates, then every committed checkpoint of the
candidates' folders, newest first) goes to the trainer's :class:`S3CheckpointIO`, whose
load falls back along it when the chosen checkpoint fails verification while loading
(``S3CheckpointIO(fallback=False)``: both raise instead).

Nothing is patched at import. :func:`fix_parse_ckpt_path` is installed (for the process,
idempotent) when an :class:`~s3ckpt.lightning.S3CheckpointIO` is constructed, or by
:func:`s3ckpt.lightning.install`; it applies :func:`find_last` to every ``ModelCheckpoint``
itself, so a stock ``ModelCheckpoint`` needs no patch. :class:`S3ModelCheckpoint` also
finds its remote ``last*.ckpt`` when Lightning resolves "last" on its own (no plug-in).
Both change nothing for local folders.
"""

from __future__ import annotations

import os
from typing import Any

from fsspec.core import split_protocol
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.callbacks.model_checkpoint import ModelCheckpoint
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from s3ckpt.checkpointer import Candidate, load_newest_good
from s3ckpt.errors import S3CkptError
from s3ckpt.format import MANIFEST_NAME, METADATA_NAME
from s3ckpt.lightning._common import _is_remote, log
from s3ckpt.lightning._stores import location_for
from s3ckpt.retention import list_checkpoints
from s3ckpt.store import Location

__all__ = [
    "checkpoint_mtime",
    "find_last",
    "fix_parse_ckpt_path",
    "newest_last",
    "resume_chain",
]


def find_last(cb: ModelCheckpoint, trainer: Any, find: Any) -> set[str]:
    """``find(trainer)`` (Lightning's ``_find_last_checkpoints`` of ``cb``) with the URL
    scheme given back to a remote folder's names, after a fresh listing (see module)."""
    protocol, _ = split_protocol(str(cb.dirpath or ""))
    remote = protocol not in (None, "file", "local")
    if remote:
        invalidate = getattr(cb._fs, "invalidate_cache", None)
        if callable(invalidate):
            invalidate()
    found: set[str] = find(trainer)
    if not remote:
        return found
    prefix = f"{protocol}://"
    return {p if p.startswith(prefix) else prefix + p.replace(os.sep, "/") for p in found}


def fix_parse_ckpt_path() -> None:
    """Resolve ``ckpt_path="last"`` by store time when a candidate is remote (see module)."""
    from lightning.pytorch.trainer.connectors.checkpoint_connector import _CheckpointConnector

    original = _CheckpointConnector._parse_ckpt_path
    if getattr(original, "_s3ckpt_fixed", False):
        return

    def _parse_ckpt_path(
        self: _CheckpointConnector,
        state_fn: Any,
        ckpt_path: Any,
        model_provided: bool,
        model_connected: bool,
    ) -> Any:
        if ckpt_path == "last":
            candidates = last_candidates(self.trainer)
            if any(_is_remote(p) for p in candidates):
                ckpt_path = newest_last(self.trainer, candidates)
                if ckpt_path is None:  # Lightning's own words for this case
                    rank_zero_warn(
                        f'.{state_fn.value}(ckpt_path="last") is set, but there is no last '
                        "checkpoint available. No checkpoint will be loaded. HINT: Set "
                        "`ModelCheckpoint(..., save_last=True)`."
                    )
                    return None
        return original(
            self,
            state_fn,
            ckpt_path,
            model_provided=model_provided,
            model_connected=model_connected,
        )

    _parse_ckpt_path._s3ckpt_fixed = True  # type: ignore[attr-defined]
    _CheckpointConnector._parse_ckpt_path = _parse_ckpt_path


def last_candidates(trainer: Any) -> list[str]:
    """What Lightning considers for ``ckpt_path="last"``: each ``OnExceptionCheckpoint``'s
    path and each ``ModelCheckpoint``'s ``last*.ckpt`` files."""
    from lightning.pytorch.callbacks.on_exception_checkpoint import OnExceptionCheckpoint

    found = {
        getattr(cb, "ckpt_path", None)
        for cb in trainer.callbacks
        if isinstance(cb, OnExceptionCheckpoint)
    }
    for cb in trainer.checkpoint_callbacks:
        if isinstance(cb, ModelCheckpoint):
            found |= find_last(cb, trainer, cb._find_last_checkpoints)
    return sorted(str(p) for p in found if p)


def newest_last(trainer: Any, candidates: list[str]) -> str | None:
    """The good candidate with the newest modification time (None when none exists): the
    head of :func:`resume_chain`, which the trainer's plug-in is told for its load."""
    chain = resume_chain(trainer, candidates)
    remote = [c.url for c in chain if _is_remote(c.url)]
    if not remote:
        return chain[0].url if chain else None
    io = _plugin(trainer)
    fallback = True if io is None else bool(io.fallback)
    run = _location(remote[0], trainer).url.parent
    found = load_newest_good(chain, lambda c: None, fallback=fallback, run=run)  # known damage
    assert found is not None
    good = chain[chain.index(found[0]) :]
    if io is not None:
        io.resume_from(good)
    return good[0].url


def resume_chain(trainer: Any, candidates: list[str]) -> list[Candidate]:
    """What ``ckpt_path="last"`` may load, in order: the candidates that exist, newest
    first by modification time, then the other committed checkpoints of the remote
    candidates' folders, newest first (by step, then commit time); each with the catalog's
    verdict on it (:attr:`~s3ckpt.retention.CheckpointInfo.damage`).

    Request cost: a candidate's HEADs (:func:`modified`), and one catalog per remote folder
    (:func:`~s3ckpt.retention.list_checkpoints`)."""
    stamps: dict[str, float] = {}
    for path in candidates:
        stamp = modified(path, trainer)
        if stamp is not None:
            stamps[path] = stamp
    ordered = sorted(stamps, key=stamps.__getitem__, reverse=True)
    folders: dict[str, list[Candidate]] = {}
    urls: dict[str, str] = {}  # a remote candidate's path: its URL as the catalog spells it
    for path in ordered:
        try:
            here = _location(path, trainer) if _is_remote(path) else None
            if here is not None and str(here.url.parent) not in folders:
                folders[str(here.url.parent)] = Candidate.newest_first(
                    list_checkpoints(here.parent)
                )
        except S3CkptError as exc:  # what is known about damage is then unknown: loads verify
            log.warning(
                "s3ckpt: cannot list the folder of %s (%s); no fallback beyond it", path, exc
            )
            continue
        if here is not None:
            urls[path] = str(here.url)
    known = {c.url: c for found in folders.values() for c in found}
    chain = []
    for path in ordered:
        c = known.pop(urls.get(path, ""), None)
        chain.append(Candidate(path, c.step, c.damage) if c is not None else Candidate(path))
    rest = [c for found in folders.values() for c in found if c.url in known]
    return chain + [Candidate(c.url.rstrip("/"), c.step, c.damage) for c in rest]


def modified(path: str, trainer: Any = None) -> float | None:
    """``path``'s modification time (seconds since the epoch), None when nothing is there:
    the store's time for a remote path (:func:`checkpoint_mtime`), the file system's otherwise."""
    if _is_remote(path):
        try:
            here = _location(path, trainer)
        except Exception as exc:  # a scheme s3ckpt does not open: the file system's word
            log.debug("s3ckpt: %s: %s; asking fsspec for its time", path, exc)
        else:
            return checkpoint_mtime(here)
    fs = get_filesystem(path)
    if not fs.exists(path):
        return None
    try:
        return fs.modified(path).timestamp()
    except IsADirectoryError:  # a folder: time it by what is in it
        stamp = fs.modified(f"{path.rstrip('/')}/{MANIFEST_NAME}")
        return stamp.timestamp()


def checkpoint_mtime(location: Location) -> float | None:
    """When the checkpoint at ``location`` was committed, in the store's time: its commit
    marker's ``LastModified``, else its ``.metadata``'s (stock DCP), else the object at
    ``location`` itself (a single-file checkpoint). None when none of them exists.

    Request cost: one to three HEADs."""
    plain = location.url.prefix.rstrip("/")
    for key in (location.key(MANIFEST_NAME), location.key(METADATA_NAME), plain):
        if not key:
            continue
        head = location.store.head(key)
        if head is not None:
            return head.last_modified if head.last_modified is not None else 0.0
    return None


def _plugin(trainer: Any) -> Any:
    """The trainer's :class:`S3CheckpointIO`, inside Lightning's wrappers; None without."""
    io = getattr(getattr(trainer, "strategy", None), "checkpoint_io", None)
    while io is not None and not getattr(io, "_s3ckpt_plugin", False):
        io = getattr(io, "checkpoint_io", None)  # Lightning's wrappers (AsyncCheckpointIO)
    return io


def _location(path: str, trainer: Any) -> Location:
    """``path`` in the trainer's s3ckpt plug-in's store (its endpoint and credentials),
    else with the settings registered for its bucket (:mod:`s3ckpt.lightning._stores`)."""
    io = _plugin(trainer)
    if io is not None:
        found: Location = io._open(path)
        return found
    return location_for(path)
