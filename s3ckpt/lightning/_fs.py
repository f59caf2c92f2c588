"""fsspec: ModelCheckpoint's view of an s3:// folder without s3fs, and ckpt_path="last"."""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from fsspec import AbstractFileSystem, register_implementation
from fsspec.core import split_protocol
from lightning.pytorch.callbacks.model_checkpoint import ModelCheckpoint

from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.format import MANIFEST_NAME
from s3ckpt.store import ObjectStore, open_store

# The configuration the file system opens stores with: the environment's until an
# S3CheckpointIO names its own (the last one constructed wins), and the stores opened.
_FS_CONFIG: dict[str, Any] = {}
_FS_STORES: dict[tuple[str, int], ObjectStore] = {}
_FS_LOCK = threading.Lock()


def _s3fs_installed() -> bool:
    try:
        import s3fs  # noqa: F401
    except ImportError:
        return False
    return True


def _install_filesystem(
    s3_config: S3Config | None, transfer_config: TransferConfig | None, register: bool | None
) -> None:
    """Register the file system for ``s3://`` (``register=None``: when s3fs is missing).

    Done once when this module is imported, since a ``ModelCheckpoint`` is usually built
    before the Trainer and its plug-in, and again by each :class:`S3CheckpointIO` to pass
    its configuration on."""
    if register is None:
        register = not _s3fs_installed()
    if not register:
        return
    with _FS_LOCK:
        if s3_config is not None:
            _FS_CONFIG.update(s3_config=s3_config, transfer_config=transfer_config)
    for protocol in ("s3", "s3a"):
        register_implementation(protocol, _S3CkptFileSystem, clobber=True)


def _fs_store(bucket: str) -> ObjectStore:
    with _FS_LOCK:
        s3_config = _FS_CONFIG.get("s3_config")
        cache_key = (bucket, id(s3_config))
        store = _FS_STORES.get(cache_key)
        if store is None:
            store, _ = open_store(
                f"s3://{bucket}/",
                s3_config=s3_config,
                transfer_config=_FS_CONFIG.get("transfer_config"),
            )
            _FS_STORES[cache_key] = store
        return store


class _S3CkptFileSystem(AbstractFileSystem):
    """The part of an fsspec file system Lightning's ModelCheckpoint uses (exists, ls,
    isdir, modified, small files), over s3ckpt's store. A checkpoint is a directory; its
    modification time is its commit marker's. Deleting is not offered here: checkpoints
    are removed through :func:`s3ckpt.retention.delete_checkpoint`."""

    protocol = ("s3", "s3a")
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
        raise FileNotFoundError(str(path))

    def ls(self, path: Any, detail: bool = True, **kwargs: Any) -> list[Any]:
        store, bucket, key = self._split(path)
        prefix = key + "/" if key else ""
        entries: list[dict[str, Any]] = [
            {"name": f"{bucket}/{p.rstrip('/')}", "size": 0, "type": "directory"}
            for p in store.list_prefixes(prefix)
        ]
        for obj in store.list(prefix):
            if "/" not in obj.key[len(prefix) :]:
                entries.append(
                    {
                        "name": f"{bucket}/{obj.key}",
                        "size": obj.size,
                        "type": "file",
                        "mtime": obj.last_modified,
                    }
                )
        if not entries:
            entries = [self.info(path)]  # a file, or FileNotFoundError
        entries.sort(key=lambda e: e["name"])
        return entries if detail else [e["name"] for e in entries]

    def modified(self, path: Any) -> datetime:
        store, _, key = self._split(path)
        marker = store.head(f"{key}/{MANIFEST_NAME}") if key else None
        head = marker or (store.head(key) if key else None)
        stamps: Iterable[float | None]
        if head is not None:
            stamps = [head.last_modified]
        else:
            stamps = [o.last_modified for o in store.list(key + "/" if key else "")]
        known = [s for s in stamps if s is not None]
        if not known:
            raise FileNotFoundError(str(path))
        return datetime.fromtimestamp(max(known), UTC)

    def makedirs(self, path: Any, exist_ok: bool = False) -> None:
        """Nothing to do: prefixes exist once an object is written under them."""

    def mkdir(self, path: Any, create_parents: bool = True, **kwargs: Any) -> None:
        """Nothing to do: prefixes exist once an object is written under them."""

    def _open(self, path: Any, mode: str = "rb", **kwargs: Any) -> Any:
        store, _, key = self._split(path)
        if "r" in mode:
            return io.BytesIO(store.get(key))
        return _PutOnClose(store, key)


class _PutOnClose(io.BytesIO):
    """A small file written with one PUT when closed (best_k_models.yaml, hparams)."""

    def __init__(self, store: ObjectStore, key: str) -> None:
        super().__init__()
        self._store, self._key = store, key

    def close(self) -> None:
        if not self.closed:
            self._store.put(self._key, self.getvalue())
        super().close()


# -- ckpt_path="last" on an object store --------------------------------------------------------


def _fix_find_last_checkpoints() -> None:
    """Give ``ModelCheckpoint._find_last_checkpoints`` back its URL scheme for remote
    folders: upstream passes fsspec's scheme-less names through ``os.path.normpath``, so
    ``s3://b/run/last.ckpt`` becomes ``b/run/last.ckpt`` (a local path) and
    ``ckpt_path="last"`` finds nothing on S3."""
    original = ModelCheckpoint._find_last_checkpoints
    if getattr(original, "_s3ckpt_fixed", False):
        return

    def _find_last_checkpoints(self: ModelCheckpoint, trainer: Any) -> set[str]:
        found: set[str] = original(self, trainer)
        protocol, _ = split_protocol(str(self.dirpath or ""))
        if protocol in (None, "file", "local"):
            return found
        prefix = f"{protocol}://"
        return {p if p.startswith(prefix) else prefix + p.replace(os.sep, "/") for p in found}

    _find_last_checkpoints._s3ckpt_fixed = True  # type: ignore[attr-defined]
    ModelCheckpoint._find_last_checkpoints = _find_last_checkpoints
