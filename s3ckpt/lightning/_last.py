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

The resume heals (:func:`newest_last`): a candidate the catalog knows damaged (``s3ckpt
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

The ``s3://`` file system the process gets when s3fs is missing is :class:`_S3CkptFileSystem`
(registered by :func:`install_filesystem`, never at import; not over s3fs or another file
system registered for ``s3://`` unless ``S3CheckpointIO(register_filesystem=True)``),
complete enough for ``ModelCheckpoint`` and Lightning's loggers: a checkpoint is a
directory timed by its commit marker; ``makedirs`` remembers folders in this process;
``open`` reads, writes (one PUT on close), appends (read, then one PUT: small files such as
``metrics.csv``) and ``x``; ``rm_file`` deletes one plain object and refuses a checkpoint or
an object inside a committed one (those go through
:func:`s3ckpt.retention.delete_checkpoint`).
"""

from __future__ import annotations

import importlib.util
import io
import os
import threading
from datetime import UTC, datetime
from typing import Any

import fsspec
from fsspec import AbstractFileSystem, register_implementation
from fsspec.core import split_protocol
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.callbacks import ModelCheckpoint, OnExceptionCheckpoint
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from s3ckpt._plugin_common import patch_once
from s3ckpt.checkpointer._latest import Candidate, load_newest_good
from s3ckpt.errors import ObjectNotFoundError, S3CkptError
from s3ckpt.format._names import MANIFEST_NAME, METADATA_NAME
from s3ckpt.lightning._async import _is_remote, install_async_teardown, location_for, log
from s3ckpt.retention import list_checkpoints
from s3ckpt.store import Location, ObjectStore
from s3ckpt.uri import StoreURL


def setup(register_filesystem: bool | None) -> None:
    """What a Trainer using the plug-in needs, installed when it is constructed (idempotent)
    rather than at import: the ``s3://`` file system, ``ckpt_path="last"`` by store time, and
    ``AsyncCheckpointIO``'s teardown reaching the plug-in."""
    install_filesystem(register_filesystem)
    fix_parse_ckpt_path()
    install_async_teardown()


def find_last(cb: ModelCheckpoint, trainer: Any, find: Any) -> set[str]:
    """``find(trainer)`` (Lightning's ``_find_last_checkpoints`` of ``cb``) with the URL
    scheme given back to a remote folder's names, after a fresh listing (see module)."""
    protocol, _ = split_protocol(str(cb.dirpath or ""))
    if protocol in (None, "file", "local"):
        return set(find(trainer))
    cb._fs.invalidate_cache()
    prefix = f"{protocol}://"
    return {p if p.startswith(prefix) else prefix + p.replace(os.sep, "/") for p in find(trainer)}


def fix_parse_ckpt_path() -> None:
    """Resolve ``ckpt_path="last"`` by store time when a candidate is remote (see module)."""
    from lightning.pytorch.trainer.connectors.checkpoint_connector import _CheckpointConnector

    @patch_once(_CheckpointConnector, "_parse_ckpt_path")
    def _parse_ckpt_path(
        original: Any,
        self: _CheckpointConnector,
        state_fn: Any,
        ckpt_path: Any,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        if ckpt_path == "last":
            # What Lightning considers: each OnExceptionCheckpoint's path and each
            # ModelCheckpoint's last*.ckpt files.
            found: set[Any] = set()
            for cb in self.trainer.checkpoint_callbacks:  # (both are Checkpoint callbacks)
                if isinstance(cb, OnExceptionCheckpoint):
                    found.add(getattr(cb, "ckpt_path", None))
                elif isinstance(cb, ModelCheckpoint):
                    found |= find_last(cb, self.trainer, cb._find_last_checkpoints)
            candidates = sorted(str(p) for p in found if p)
            if any(_is_remote(p) for p in candidates):
                ckpt_path = newest_last(self.trainer, candidates)
                if ckpt_path is None:  # Lightning's own words for this case
                    rank_zero_warn(
                        f'.{state_fn.value}(ckpt_path="last") is set, but there is no last '
                        "checkpoint available. No checkpoint will be loaded. HINT: Set "
                        "`ModelCheckpoint(..., save_last=True)`."
                    )
                    return None
        return original(self, state_fn, ckpt_path, *args, **kwargs)


def newest_last(trainer: Any, candidates: list[str]) -> str | None:
    """The good candidate with the newest modification time (None when none exists), and
    the chain of what to fall back to, which the trainer's plug-in is told for its load.

    The chain, in order: the candidates that exist, newest first by modification time,
    then the other committed checkpoints of the remote candidates' folders, newest first
    (by step, then commit time); each with the catalog's verdict on it
    (:attr:`~s3ckpt.retention.CheckpointInfo.damage`): one known damaged is skipped.

    Request cost: a candidate's HEADs (:func:`modified`), and one catalog per remote folder
    (:func:`~s3ckpt.retention.list_checkpoints`)."""
    stamps = {p: t for p in candidates if (t := modified(p, trainer)) is not None}
    folders: set[str] = set()  # those listed
    known: dict[str, Candidate] = {}  # the listed folders' checkpoints not yet in the chain
    chain = []
    for path in sorted(stamps, key=stamps.__getitem__, reverse=True):
        c = None
        try:
            here = _location(path, trainer) if _is_remote(path) else None
            if here is not None and str(here.url.parent) not in folders:
                known.update(
                    (c.url, c) for c in Candidate.newest_first(list_checkpoints(here.parent))
                )
                folders.add(str(here.url.parent))
            c = known.pop(str(here.url), None) if here is not None else None
        except S3CkptError as exc:  # what is known about damage is then unknown: loads verify
            log.warning(
                "s3ckpt: cannot list the folder of %s (%s); no fallback beyond it", path, exc
            )
        chain.append(Candidate(path, c.step, c.damage) if c is not None else Candidate(path))
    chain += [Candidate(c.url.rstrip("/"), c.step, c.damage) for c in known.values()]
    remote = [c.url for c in chain if _is_remote(c.url)]
    if not remote:
        return chain[0].url if chain else None
    io = _plugin(trainer)
    run = _location(remote[0], trainer).url.parent
    # Known damage only (nothing is read); the plug-in's fallback, if the trainer has one.
    found = load_newest_good(chain, lambda c: None, fallback=getattr(io, "fallback", True), run=run)
    assert found is not None
    good = chain[chain.index(found[0]) :]
    if io is not None:
        io.resume_from(good)
    return good[0].url


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
        return fs.modified(f"{path.rstrip('/')}/{MANIFEST_NAME}").timestamp()


def checkpoint_mtime(location: Location) -> float | None:
    """When the checkpoint at ``location`` was committed, in the store's time: its commit
    marker's ``LastModified``, else its ``.metadata``'s (stock DCP), else the object at
    ``location`` itself (a single-file checkpoint). None when none of them exists.

    Request cost: one to three HEADs."""
    plain = location.url.prefix.rstrip("/")
    keys = filter(None, (location.key(MANIFEST_NAME), location.key(METADATA_NAME), plain))
    head = next(filter(None, map(location.store.head, keys)), None)  # HEADs until one is there
    return None if head is None else head.last_modified or 0.0


def _plugin(trainer: Any) -> Any:
    """The trainer's :class:`S3CheckpointIO`, inside Lightning's wrappers; None without."""
    io = getattr(getattr(trainer, "strategy", None), "checkpoint_io", None)
    while io is not None and not getattr(io, "_s3ckpt_plugin", False):
        io = getattr(io, "checkpoint_io", None)  # Lightning's wrappers (AsyncCheckpointIO)
    return io


def _location(path: str, trainer: Any) -> Location:
    """``path`` in the trainer's s3ckpt plug-in's store (its endpoint and credentials),
    else with the settings registered for its bucket (:mod:`s3ckpt.lightning._async`)."""
    io = _plugin(trainer)
    return location_for(path) if io is None else io._open(path)


_PROTOCOLS = ("s3", "s3a")

# Folders made in this process ((bucket, key) pairs): they exist before anything is in them.
_MADE: set[tuple[str, str]] = set()
_FS_LOCK = threading.Lock()


def install_filesystem(register: bool | None) -> None:
    """Register the file system for ``s3://`` and ``s3a://`` (``register=None``: when s3fs
    is missing and no file system other than ours and s3fs's is registered for ``s3://``;
    ``True``: in any case; ``False``: never). Idempotent.

    Called by :class:`~s3ckpt.lightning.S3ModelCheckpoint` (a ``ModelCheckpoint`` is
    usually built before the Trainer and its plug-in, and needs a file system then),
    :func:`s3ckpt.lightning.install`, and each :class:`S3CheckpointIO` with its
    ``register_filesystem``."""
    if register is None:
        fs = fsspec.registry.get("s3")
        other = fs not in (None, _S3CkptFileSystem) and not fs.__module__.startswith("s3fs")
        register = importlib.util.find_spec("s3fs") is None and not other
    for protocol in _PROTOCOLS if register else ():
        register_implementation(protocol, _S3CkptFileSystem, clobber=True)


def _dir(name: str) -> dict[str, Any]:
    return {"name": name, "size": 0, "type": "directory"}


def _file(name: str, obj: Any) -> dict[str, Any]:
    return {"name": name, "size": obj.size, "type": "file", "mtime": obj.last_modified}


class _S3CkptFileSystem(AbstractFileSystem):
    """An fsspec file system for ``s3://`` over s3ckpt's store: what Lightning's
    ``ModelCheckpoint`` and loggers use (see the module)."""

    protocol = _PROTOCOLS
    root_marker = ""

    def _split(self, path: Any) -> tuple[ObjectStore, str, str]:
        bucket, _, key = self._strip_protocol(path).partition("/")
        return location_for(f"s3://{bucket}/").store, bucket, key

    def info(self, path: Any, **kwargs: Any) -> dict[str, Any]:
        store, bucket, key = self._split(path)
        head = store.head(key) if key else None
        if head is not None:
            return _file(f"{bucket}/{key}", head)
        # (a membership test of _MADE needs no lock)
        if not key or (bucket, key) in _MADE or any(True for _ in store.list(key + "/")):
            return _dir(f"{bucket}/{key}" if key else bucket)
        raise FileNotFoundError(str(path))

    def ls(self, path: Any, detail: bool = True, **kwargs: Any) -> list[Any]:
        store, bucket, key = self._split(path)
        prefix = key + "/" if key else ""
        with _FS_LOCK:  # folders made here, then the store's, then its objects
            made = [k for b, k in _MADE if b == bucket and k.rpartition("/")[0] == key]
        names = [*made, *(p.rstrip("/") for p in store.list_prefixes(prefix))]
        found = {f"{bucket}/{k}": _dir(f"{bucket}/{k}") for k in names}
        for obj in store.list(prefix):
            if "/" not in obj.key[len(prefix) :]:
                found[f"{bucket}/{obj.key}"] = _file(f"{bucket}/{obj.key}", obj)
        entries = sorted(found.values(), key=lambda e: e["name"])
        if not entries:  # a file, a folder made here and still empty, or FileNotFoundError
            info = self.info(path)
            entries = [info] if info["type"] == "file" else []
        return entries if detail else [e["name"] for e in entries]

    def modified(self, path: Any) -> datetime:
        """A checkpoint's time as ``ckpt_path="last"`` judges it (:func:`checkpoint_mtime`);
        any other folder's, its newest object's."""
        store, bucket, key = self._split(path)
        here = Location(StoreURL(store.url_scheme, bucket, key + "/"), store)
        stamp = checkpoint_mtime(here) if key else None
        if stamp is None:
            known = [o.last_modified for o in store.list(key + "/" if key else "")]
            stamp = max((s for s in known if s is not None), default=None)
            if stamp is None:
                raise FileNotFoundError(str(path))
        return datetime.fromtimestamp(stamp, UTC)

    def makedirs(self, path: Any, exist_ok: bool = False) -> None:
        """Remember the folder (and its parents) in this process: see the module."""
        store, bucket, key = self._split(path)
        if key and store.head(key) is not None:
            raise FileExistsError(f"{path} is a file")
        parts = key.split("/") if key else []
        with _FS_LOCK:
            _MADE.update((bucket, "/".join(parts[:i])) for i in range(1, len(parts) + 1))

    def mkdir(self, path: Any, create_parents: bool = True, **kwargs: Any) -> None:
        """Remember the folder in this process: see the module."""
        self.makedirs(path, exist_ok=True)

    def rmdir(self, path: Any) -> None:
        """Forget a folder made in this process (objects under it stay)."""
        _, bucket, key = self._split(path)
        with _FS_LOCK:
            _MADE.discard((bucket, key))

    def _rm(self, path: Any) -> None:
        """Delete one plain object (``rm_file``, ``rm``); a checkpoint, or a file inside
        one, is refused."""
        store, bucket, key = self._split(path)
        if not key or store.head(key) is None:
            if key and (bucket, key) in _MADE:
                return self.rmdir(path)
            if key and self.isdir(path):
                raise IsADirectoryError(
                    f"s3://{bucket}/{key} is a folder (a checkpoint?): delete a checkpoint "
                    "with s3ckpt.retention.delete_checkpoint or `s3ckpt rm`"
                )
            raise FileNotFoundError(str(path))
        parent = key.rpartition("/")[0]
        if parent and store.head(f"{parent}/{MANIFEST_NAME}") is not None:
            raise PermissionError(
                f"s3://{bucket}/{key} belongs to the committed checkpoint s3://{bucket}/{parent}: "
                "delete it whole with s3ckpt.retention.delete_checkpoint or `s3ckpt rm`"
            )
        failures = store.delete([key])
        if failures:
            raise OSError(f"could not delete s3://{bucket}/{key}: {failures[0]}")

    def _open(self, path: Any, mode: str = "rb", **kwargs: Any) -> Any:
        store, bucket, key = self._split(path)
        if "x" in mode and store.head(key) is not None:
            raise FileExistsError(f"s3://{bucket}/{key}")
        try:
            start = store.get(key) if "r" in mode or "a" in mode else b""
        except ObjectNotFoundError as exc:
            if "r" in mode:
                raise FileNotFoundError(f"s3://{bucket}/{key}") from exc
            start = b""
        return io.BytesIO(start) if "r" in mode else _PutOnClose(store, key, start)


class _PutOnClose(io.BytesIO):
    """A small file written with one PUT when closed (hparams.yaml, metrics.csv)."""

    def __init__(self, store: ObjectStore, key: str, start: bytes = b"") -> None:
        super().__init__(start)
        self.seek(0, io.SEEK_END)
        self._store, self._key = store, key

    def close(self) -> None:
        if not self.closed:
            self._store.put(self._key, self.getvalue())
        super().close()
