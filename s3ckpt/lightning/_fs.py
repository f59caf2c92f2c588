"""fsspec: the ``s3://`` file system the process gets when s3fs is missing.

``ModelCheckpoint`` lists, checks and time-stamps its folder through fsspec, and is usually
built before the Trainer and its plug-in; Lightning's loggers (``CSVLogger("s3://...")``)
make folders, write, append to and delete small files through it. Without s3fs, fsspec has
nothing for ``s3://``, so :class:`~s3ckpt.lightning.S3ModelCheckpoint`, each plug-in and
:func:`s3ckpt.lightning.install` register :class:`_S3CkptFileSystem` for ``s3://`` and
``s3a://`` for the whole process (never the import), and it is complete enough for both:

* a checkpoint is a directory; its modification time is its commit marker's (store time);
* ``makedirs`` / ``mkdir`` remember the folder in this process (object stores have no
  folders: it exists on S3 once a file is written under it), so ``isdir`` and ``ls`` see
  it at once, as loggers expect;
* ``open`` reads, writes (one PUT on close), appends (read, then one PUT of the whole
  file on close: meant for small files such as ``metrics.csv``) and ``x`` (refused when
  the object exists), in binary and text modes;
* ``rm_file`` deletes one plain object. A checkpoint (a folder), and any object inside a
  committed s3ckpt checkpoint, is refused: checkpoints are deleted through
  :func:`s3ckpt.retention.delete_checkpoint`, which keeps the commit protocol's promises.

It is not registered when s3fs is installed, nor over a file system someone else
registered for ``s3://`` (``S3CheckpointIO(register_filesystem=True)`` replaces either).
Registering is :func:`install_filesystem`; nothing here runs at import. Stores
are opened with the settings :mod:`s3ckpt.lightning._stores` gives for the bucket (a
plug-in's, else the environment's).
"""

from __future__ import annotations

import io
import threading
from datetime import UTC, datetime
from typing import Any

import fsspec
from fsspec import AbstractFileSystem, register_implementation

from s3ckpt.errors import ObjectNotFoundError
from s3ckpt.format import MANIFEST_NAME
from s3ckpt.lightning._last import checkpoint_mtime
from s3ckpt.lightning._stores import location_for
from s3ckpt.store import Location, ObjectStore
from s3ckpt.uri import StoreURL

__all__ = ["_S3CkptFileSystem", "install_filesystem"]

_PROTOCOLS = ("s3", "s3a")

# Folders made in this process ((bucket, key) pairs): they exist before anything is in them.
_MADE: set[tuple[str, str]] = set()
_FS_LOCK = threading.Lock()


def _s3fs_installed() -> bool:
    try:
        import s3fs  # noqa: F401
    except ImportError:
        return False
    return True


def _owned_by_another() -> bool:
    """Whether a file system other than ours and s3fs's is registered for ``s3://``."""
    current = fsspec.registry.get("s3")
    if current is None or current is _S3CkptFileSystem:
        return False
    return not str(getattr(current, "__module__", "")).startswith("s3fs")


def install_filesystem(register: bool | None) -> None:
    """Register the file system for ``s3://`` and ``s3a://`` (``register=None``: when s3fs
    is missing and no other file system is registered for it; ``True``: in any case;
    ``False``: never). Idempotent.

    Called by :class:`~s3ckpt.lightning.S3ModelCheckpoint` (a ``ModelCheckpoint`` is
    usually built before the Trainer and its plug-in, and needs a file system then),
    :func:`s3ckpt.lightning.install`, and each :class:`S3CheckpointIO` with its
    ``register_filesystem``."""
    if register is None:
        register = not _s3fs_installed() and not _owned_by_another()
    if not register:
        return
    for protocol in _PROTOCOLS:
        register_implementation(protocol, _S3CkptFileSystem, clobber=True)


def _fs_store(bucket: str) -> ObjectStore:
    return location_for(f"s3://{bucket}/").store


def _made(bucket: str, key: str) -> bool:
    with _FS_LOCK:
        return (bucket, key) in _MADE


class _S3CkptFileSystem(AbstractFileSystem):
    """An fsspec file system for ``s3://`` over s3ckpt's store: what Lightning's
    ``ModelCheckpoint`` and loggers use (see the module)."""

    protocol = _PROTOCOLS
    root_marker = ""

    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        text = str(path)
        for p in ("s3://", "s3a://"):
            if text.startswith(p):
                text = text[len(p) :]
        return text.rstrip("/")

    def _split(self, path: Any) -> tuple[ObjectStore, str, str]:
        bucket, _, key = self._strip_protocol(path).partition("/")
        return _fs_store(bucket), bucket, key

    def info(self, path: Any, **kwargs: Any) -> dict[str, Any]:
        store, bucket, key = self._split(path)
        if not key:
            return {"name": bucket, "size": 0, "type": "directory"}
        head = store.head(key)
        if head is not None:
            return {
                "name": f"{bucket}/{key}",
                "size": head.size,
                "type": "file",
                "mtime": head.last_modified,
            }
        for _ in store.list(key + "/"):
            return {"name": f"{bucket}/{key}", "size": 0, "type": "directory"}
        if _made(bucket, key):
            return {"name": f"{bucket}/{key}", "size": 0, "type": "directory"}
        raise FileNotFoundError(str(path))

    def ls(self, path: Any, detail: bool = True, **kwargs: Any) -> list[Any]:
        store, bucket, key = self._split(path)
        prefix = key + "/" if key else ""
        found: dict[str, dict[str, Any]] = {}
        for p in store.list_prefixes(prefix):
            name = f"{bucket}/{p.rstrip('/')}"
            found[name] = {"name": name, "size": 0, "type": "directory"}
        for obj in store.list(prefix):
            if "/" not in obj.key[len(prefix) :]:
                name = f"{bucket}/{obj.key}"
                found[name] = {
                    "name": name,
                    "size": obj.size,
                    "type": "file",
                    "mtime": obj.last_modified,
                }
        with _FS_LOCK:
            made = [k for b, k in _MADE if b == bucket and k.rpartition("/")[0] == key]
        for k in made:
            found.setdefault(
                f"{bucket}/{k}", {"name": f"{bucket}/{k}", "size": 0, "type": "directory"}
            )
        entries = sorted(found.values(), key=lambda e: e["name"])
        if not entries:
            entries = [self.info(path)]  # a file, or FileNotFoundError
            if entries[0]["type"] == "directory":
                entries = []  # a folder made here, still empty
        return entries if detail else [e["name"] for e in entries]

    def modified(self, path: Any) -> datetime:
        """A checkpoint's time as ``ckpt_path="last"`` judges it
        (:func:`~s3ckpt.lightning._last.checkpoint_mtime`); any other folder's, its newest
        object's."""
        store, bucket, key = self._split(path)
        here = Location(StoreURL(store.url_scheme, bucket, key + "/"), store)
        stamp = checkpoint_mtime(here) if key else None
        if stamp is None:
            known = [o.last_modified for o in store.list(key + "/" if key else "")]
            stamps = [s for s in known if s is not None]
            if not stamps:
                raise FileNotFoundError(str(path))
            stamp = max(stamps)
        return datetime.fromtimestamp(stamp, UTC)

    def makedirs(self, path: Any, exist_ok: bool = False) -> None:
        """Remember the folder (and its parents) in this process: see the module."""
        store, bucket, key = self._split(path)
        if key and store.head(key) is not None:
            raise FileExistsError(f"{path} is a file")
        with _FS_LOCK:
            parts = key.split("/") if key else []
            for i in range(1, len(parts) + 1):
                _MADE.add((bucket, "/".join(parts[:i])))

    def mkdir(self, path: Any, create_parents: bool = True, **kwargs: Any) -> None:
        """Remember the folder in this process: see the module."""
        self.makedirs(path, exist_ok=True)

    def rmdir(self, path: Any) -> None:
        """Forget a folder made in this process (objects under it stay)."""
        _, bucket, key = self._split(path)
        with _FS_LOCK:
            _MADE.discard((bucket, key))

    def rm_file(self, path: Any) -> None:
        """Delete one plain object; a checkpoint, or a file inside one, is refused."""
        store, bucket, key = self._split(path)
        if not key or store.head(key) is None:
            if key and _made(bucket, key):
                self.rmdir(path)
                return
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

    def _rm(self, path: Any) -> None:
        self.rm_file(path)

    def _open(self, path: Any, mode: str = "rb", **kwargs: Any) -> Any:
        store, bucket, key = self._split(path)
        if "r" in mode:
            try:
                return io.BytesIO(store.get(key))
            except ObjectNotFoundError as exc:
                raise FileNotFoundError(f"s3://{bucket}/{key}") from exc
        if "x" in mode and store.head(key) is not None:
            raise FileExistsError(f"s3://{bucket}/{key}")
        start = b""
        if "a" in mode:
            try:
                start = store.get(key)
            except ObjectNotFoundError:
                pass
        return _PutOnClose(store, key, start)


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
