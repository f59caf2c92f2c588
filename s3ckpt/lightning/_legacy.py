"""Checkpoints stock Lightning wrote to S3: one ``torch.save`` object, read without local disk.

Before s3ckpt, ``ModelCheckpoint(dirpath="s3://...")`` with s3fs wrote each checkpoint as a
single object, ``s3://bucket/run/last.ckpt``, holding ``torch.save(checkpoint)``. The
plug-in reads those, so a run moves to s3ckpt by resuming from its last stock checkpoint
(docs/frameworks/lightning.md, "Migrating from stock Lightning / s3fs checkpoints"):

* streamed: an object up to ``block`` bytes is read with one GET into memory; a larger one
  through a seekable file over ranged GETs (:class:`_RangeFile`, buffered ``block`` bytes
  at a time; a large tensor record is read straight into its destination), so memory
  holds the checkpoint being built and one block, and nothing touches the local disk;
* with the plug-in's ``weights_only`` rules: ``True`` or ``None`` is
  ``torch.load(weights_only=True)`` with :data:`s3ckpt.dcp.SAFE_GLOBALS` and the
  plug-in's ``safe_globals`` allowed on top of torch's defaults (and what the process
  registered with ``torch.serialization.add_safe_globals``); ``False`` is full pickle;
* failures as s3ckpt errors naming the object and its size: a refused global
  (:class:`~s3ckpt.errors.UnsafeCheckpointError`), bytes ``torch.load`` cannot read or an
  object that changed or shrank while it was read
  (:class:`~s3ckpt.errors.CorruptCheckpointError`), an object deleted meanwhile
  (:class:`~s3ckpt.errors.CheckpointNotFoundError`); store errors as they are.

torch keeps its allowed globals in one process-wide list; the globals a load adds are
added for the duration of that load, under a lock, and exactly those are removed after
(never what the process registered itself). Register your own process-wide globals before
loading, as for :class:`~s3ckpt.dcp.S3StorageReader`.
"""

from __future__ import annotations

import io
import pickle
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from s3ckpt._units import format_bytes
from s3ckpt.dcp import SAFE_GLOBALS, SafeGlobal
from s3ckpt.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    ObjectNotFoundError,
    S3CkptError,
    UnsafeCheckpointError,
)
from s3ckpt.lightning._common import log
from s3ckpt.store import ObjectInfo, ObjectStore

__all__ = ["load_object"]

_GLOBALS_LOCK = threading.Lock()


def load_object(
    store: ObjectStore,
    info: ObjectInfo,
    *,
    map_location: Any,
    weights_only: bool | None,
    safe_globals: Sequence[SafeGlobal],
    block: int,
) -> Any:
    """``torch.load`` of the object ``info`` (a HEAD of it), streamed; see the module.

    Raises:
        UnsafeCheckpointError: ``weights_only`` is not False and the pickle asks for a
            global outside the allow-list (the message names it, as torch does).
        CorruptCheckpointError: empty, unreadable, or changed while it was read.
        CheckpointNotFoundError: deleted while it was read.
    """
    where = f"{store.url_scheme}://{store.bucket}/{info.key}"
    size = format_bytes(info.size)
    if info.size == 0:
        raise CorruptCheckpointError(
            f"{where} is an empty object (0 bytes), not a torch.save checkpoint",
            bucket=store.bucket,
            key=info.key,
        )
    log.info("s3ckpt: loading %s, one torch.save object of %s (stock Lightning)", where, size)
    raw = _RangeFile(store, info.key, info.size)
    f: io.IOBase = (
        io.BytesIO(_read_all(raw)) if info.size <= block else io.BufferedReader(raw, block)
    )
    try:
        if weights_only is False:
            obj = torch.load(f, map_location=map_location, weights_only=False)
        else:
            with _allowed([*SAFE_GLOBALS, *safe_globals]):
                obj = torch.load(f, map_location=map_location, weights_only=True)
    except S3CkptError as exc:
        raise _not_found(exc, store, info) from exc
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        if raw.error is not None:  # the store failed under torch's reader, which wrapped it
            raise _not_found(raw.error, store, info) from exc
        _check_unchanged(store, info, where)
        if weights_only is not False and isinstance(exc, pickle.UnpicklingError):
            raise UnsafeCheckpointError(
                f"{where} ({size}) does not load with torch.load(weights_only=True): "
                f"{_reason(exc)} (torch's weights_only defaults, s3ckpt.dcp.SAFE_GLOBALS"
                f"{_listed(safe_globals)}). If the types it holds are plain values, pass them "
                "as S3CheckpointIO(safe_globals=[...]) (or torch.serialization."
                "add_safe_globals); if you trust this bucket, load with weights_only=False",
                bucket=store.bucket,
                key=info.key,
            ) from exc
        raise CorruptCheckpointError(
            f"{where} ({size}) is not a checkpoint torch.load can read: "
            f"{type(exc).__name__}: {_reason(exc)}",
            bucket=store.bucket,
            key=info.key,
        ) from exc
    _check_unchanged(store, info, where)
    return obj


class _RangeFile(io.RawIOBase):
    """A read-only, seekable file over one object: each ``readinto`` is one ranged GET
    (resumed by the store on a transient failure mid-body)."""

    def __init__(self, store: ObjectStore, key: str, size: int) -> None:
        super().__init__()
        self._store, self._key, self._size = store, key, size
        self._pos = 0
        self.error: S3CkptError | None = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        want = min(len(view), self._size - self._pos)
        if want <= 0:
            return 0
        try:
            reader = self._store.open_range(self._key, self._pos, want)
            got = 0
            try:
                while got < want:
                    n = reader.readinto(view[got:want])
                    if not n:
                        break
                    got += n
            finally:
                reader.close()
        except S3CkptError as exc:
            self.error = exc
            raise
        if got < want:
            self.error = CorruptCheckpointError(
                f"{self._store.url_scheme}://{self._store.bucket}/{self._key} ended at byte "
                f"{self._pos + got}, before the {self._size} bytes its HEAD reported "
                "(rewritten or truncated while it was read)",
                bucket=self._store.bucket,
                key=self._key,
            )
            raise self.error
        self._pos += got
        return got


def _read_all(raw: _RangeFile) -> bytearray:
    data = bytearray(raw._size)
    raw.readinto(data)
    raw.seek(0)
    return data


@contextmanager
def _allowed(globs: Sequence[SafeGlobal]) -> Iterator[None]:
    """``globs`` added to torch's allowed globals for the duration (see the module)."""
    with _GLOBALS_LOCK:
        present = set(torch.serialization.get_safe_globals())
        extra = [g for g in dict.fromkeys(globs) if g not in present]
        torch.serialization.add_safe_globals(extra)
    try:
        yield
    finally:
        if extra:
            with _GLOBALS_LOCK:
                keep = [g for g in torch.serialization.get_safe_globals() if g not in extra]
                torch.serialization.clear_safe_globals()
                torch.serialization.add_safe_globals(keep)


def _not_found(exc: S3CkptError, store: ObjectStore, info: ObjectInfo) -> S3CkptError:
    if isinstance(exc, ObjectNotFoundError):
        return CheckpointNotFoundError(
            "the checkpoint object was deleted while it was read",
            bucket=store.bucket,
            key=info.key,
        )
    return exc


def _check_unchanged(store: ObjectStore, info: ObjectInfo, where: str) -> None:
    if info.etag is None:
        return
    now = store.head(info.key)
    if now is None:
        raise CheckpointNotFoundError(
            "the checkpoint object was deleted while it was read",
            bucket=store.bucket,
            key=info.key,
        )
    if now.etag is not None and now.etag != info.etag:
        raise CorruptCheckpointError(
            f"{where} was rewritten while it was read (ETag {info.etag} -> {now.etag}); "
            "load it again",
            bucket=store.bucket,
            key=info.key,
        )


def _reason(exc: BaseException) -> str:
    """torch's own words, first paragraph, without its boilerplate."""
    text = str(exc)
    marker = "WeightsUnpickler error:"
    if marker in text:
        text = text.split(marker, 1)[1]
    first = text.strip().split("\n\n", 1)[0]
    return " ".join(first.split()) or type(exc).__name__


def _listed(safe_globals: Sequence[SafeGlobal]) -> str:
    if not safe_globals:
        return ""
    names = [
        g[1] if isinstance(g, tuple) else f"{g.__module__}.{g.__qualname__}" for g in safe_globals
    ]
    return ", safe_globals " + ", ".join(names)
