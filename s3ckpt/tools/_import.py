"""Import Hugging Face safetensors into an s3ckpt DCP checkpoint.

The checkpoint is written by :class:`~s3ckpt.S3StorageWriter` through a normal
``dcp.save(..., no_dist=True)`` whose state dict holds ``meta`` tensors (shape and dtype
only, from the safetensors headers). A save planner hands the writer each tensor's real
bytes only when the writer asks for that item: from a memory map for local files, from one
ranged GET for remote ones. Memory therefore stays at about one tensor plus the writer's
upload buffers, whatever the model size, and nothing is staged on local disk.

The result is an ordinary DCP checkpoint: ``dcp.load`` (or ``Checkpointer.load``) at any
world size reshards it into FSDP2 / DTensor / plain state dicts.
"""

from __future__ import annotations

import json
import mmap
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.dcp import quiet_dcp
from s3ckpt.dcp.writer import S3StorageWriter
from s3ckpt.errors import CheckpointNotFoundError, ConfigError, CorruptCheckpointError
from s3ckpt.store import Location, LocationLike, ObjectStore
from s3ckpt.tools._export import INDEX_NAME
from s3ckpt.tools._open import as_location_among
from s3ckpt.tools._safetensors import HeaderEntry, header_length, parse_header
from s3ckpt.uri import StoreURL

__all__ = ["ImportResult", "import_safetensors"]


@dataclass(frozen=True)
class ImportResult:
    """What :func:`import_safetensors` wrote."""

    source: str
    dest: str
    files: tuple[str, ...]
    """The safetensors files read."""
    tensors: int
    tensor_bytes: int
    prefix: str | None
    """The top-level key the tensors were saved under (``None``: at the top level)."""
    step: int | None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (stable keys)."""
        return asdict(self)


class _Source:
    """One safetensors file and how to get a tensor's bytes out of it."""

    def __init__(self, name: str, entries: list[HeaderEntry], data_start: int) -> None:
        self.name = name
        self.entries = entries
        self.data_start = data_start

    def tensor(self, entry: HeaderEntry) -> torch.Tensor:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _LocalSource(_Source):
    def __init__(self, path: Path) -> None:
        self._file = open(path, "rb")  # noqa: SIM115 - closed in close()
        size = os.fstat(self._file.fileno()).st_size
        first = self._file.read(8)
        n = header_length(first, where=str(path))
        raw = self._file.read(n)
        if len(raw) != n:
            raise CorruptCheckpointError(f"{path} ends inside its safetensors header")
        entries, _meta, start = parse_header(raw, where=str(path))
        if entries and start + entries[-1].end > size:
            raise CorruptCheckpointError(
                f"{path} is truncated: its header needs {start + entries[-1].end} bytes, "
                f"the file has {size}"
            )
        super().__init__(str(path), entries, start)
        # A private (copy-on-write) map: writable for torch.frombuffer, never written back.
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_COPY) if size else None

    def tensor(self, entry: HeaderEntry) -> torch.Tensor:
        if entry.nbytes == 0 or self._map is None:
            return torch.empty(entry.shape, dtype=entry.dtype)
        flat = torch.frombuffer(
            self._map, dtype=torch.uint8, count=entry.nbytes, offset=self.data_start + entry.begin
        )
        return flat.view(entry.dtype).reshape(entry.shape)

    def close(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass  # a tensor still views it; the map goes with the last one
        self._file.close()


class _RemoteSource(_Source):
    def __init__(self, store: ObjectStore, key: str, shown: str) -> None:
        self._store = store
        self._key = key
        self._shown = shown
        n = header_length(self._read(0, 8), where=shown)
        entries, _meta, start = parse_header(self._read(8, n), where=shown)
        super().__init__(shown, entries, start)

    def _read(self, start: int, length: int) -> bytearray:
        buf = bytearray(length)
        view = memoryview(buf)
        stream = self._store.open_range(self._key, start, length)
        try:
            got = 0
            while got < length:
                n = stream.readinto(view[got:])
                if n <= 0:
                    raise CorruptCheckpointError(
                        f"{self._shown} is truncated "
                        f"({length - got} bytes missing at offset {start + got})",
                        bucket=self._store.bucket,
                        key=self._key,
                    )
                got += n
        finally:
            stream.close()
        return buf

    def tensor(self, entry: HeaderEntry) -> torch.Tensor:
        if entry.nbytes == 0:
            return torch.empty(entry.shape, dtype=entry.dtype)
        buf = self._read(self.data_start + entry.begin, entry.nbytes)
        return torch.frombuffer(buf, dtype=torch.uint8).view(entry.dtype).reshape(entry.shape)


def _index_files(raw: bytes, where: str) -> list[str]:
    try:
        doc = json.loads(raw.decode("utf-8"))
        files = sorted(set(doc["weight_map"].values()))
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptCheckpointError(f"{where} is not a safetensors index: {exc}") from exc
    for f in files:
        if not isinstance(f, str) or "/" in f or f.startswith(".."):
            raise CorruptCheckpointError(f"{where} names a file outside its folder: {f!r}")
    return files


def _is_local(src: str) -> bool:
    """A local path or ``file://`` URL: read through a memory map, not a store."""
    return "://" not in src or src.startswith("file://")


def _local_sources(src: str) -> list[_Source]:
    """The safetensors files a local ``src`` names (a file, an index, or a folder)."""
    path = Path(src.removeprefix("file://")).expanduser()
    if path.is_dir():
        index = path / INDEX_NAME
        if index.exists():
            names = _index_files(index.read_bytes(), str(index))
            files = [path / n for n in names]
        else:
            files = sorted(path.glob("*.safetensors"))
    elif path.name.endswith(".index.json"):
        files = [path.parent / n for n in _index_files(path.read_bytes(), str(path))]
    elif path.exists():
        files = [path]
    else:
        raise CheckpointNotFoundError(f"no safetensors file or folder at {path}")
    if not files:
        raise CheckpointNotFoundError(f"no *.safetensors files in {path}")
    return [_LocalSource(f) for f in files]


def _remote_sources(src: Location) -> list[_Source]:
    """The safetensors objects ``src`` names: one object, an index, or a prefix."""
    st, url = src.store, src.url
    whole = url.prefix.rstrip("/")
    base = StoreURL(url.scheme, url.bucket, whole.rsplit("/", 1)[0] + "/" if "/" in whole else "")
    shown = f"{url.scheme}://{url.bucket}/"
    if whole.endswith(".safetensors"):
        keys = [whole]
    elif whole.endswith(".index.json"):
        keys = [base.key(n) for n in _index_files(st.get(whole), shown + whole)]
    else:
        index_info = st.head(url.key(INDEX_NAME))
        if index_info is not None:
            names = _index_files(st.get(url.key(INDEX_NAME)), shown + url.key(INDEX_NAME))
            keys = [url.key(n) for n in names]
        else:
            keys = sorted(
                o.key
                for o in st.list(url.prefix)
                if o.key.endswith(".safetensors") and "/" not in o.key[len(url.prefix) :]
            )
        if not keys:
            raise CheckpointNotFoundError(
                f"no *.safetensors objects or {INDEX_NAME} under {url}",
                bucket=st.bucket,
                key=url.prefix,
            )
    return [_RemoteSource(st, k, shown + k) for k in keys]


class _LazySavePlanner(DefaultSavePlanner):
    """Hands the writer each tensor's real bytes only when it asks for that item (and
    reports the bytes handed over to ``progress``)."""

    def __init__(
        self,
        fetch: dict[str, tuple[_Source, HeaderEntry]],
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        super().__init__()
        self._fetch = fetch
        self._progress = progress
        self._total = sum(e.nbytes for _, e in fetch.values())
        self._done = 0
        self._lock = threading.Lock()

    def resolve_data(self, write_item: Any) -> Any:
        source, entry = self._fetch[write_item.index.fqn]
        tensor = source.tensor(entry)
        if self._progress is not None:
            with self._lock:
                self._done += entry.nbytes
                done = self._done
            self._progress(done, self._total)
        return tensor


def import_safetensors(
    src: LocationLike,
    dest: LocationLike,
    *,
    prefix: str | None = "model",
    step: int | None = None,
    metrics: dict[str, float] | None = None,
    overwrite: bool = False,
    s3_config: S3Config | None = None,
    transfer_config: TransferConfig | None = None,
    src_store: ObjectStore | None = None,
    store: ObjectStore | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ImportResult:
    """Turn Hugging Face safetensors into an s3ckpt DCP checkpoint at ``dest``.

    Args:
        src: A ``.safetensors`` file, a ``model.safetensors.index.json``, or a folder /
            prefix holding either (the index wins; else every ``*.safetensors`` in it).
            Local paths are memory-mapped; URLs (``s3://``, fsspec) and Locations (a
            prefix) are read with one ranged GET per tensor.
        dest: Checkpoint prefix to write (``s3://...``, fsspec URL, local path or a
            Location); a URL in the source's bucket is written through its store.
        prefix: Save tensors under this top-level key, so ``{"model": model.state_dict()}``
            (the ``Checkpointer``'s layout) loads them: ``layers.0.w`` is stored as
            ``model.layers.0.w``. ``None`` or ``""`` keeps the names as they are.
        step / metrics: Recorded in ``s3ckpt.json``.
        overwrite: Replace a committed checkpoint at ``dest`` (safely).
        s3_config / transfer_config: How to open URL arguments (a Location carries its own).
        src_store / store: Stores for URL arguments, instead of ones built from them (tests).
        progress: Called with ``(bytes_done, bytes_total)`` of tensor data as each tensor
            is read from its source and handed to the writer (from the writer's threads).

    Raises:
        CheckpointNotFoundError: no safetensors at ``src``.
        CorruptCheckpointError: a file or index is malformed or truncated.
        CheckpointExistsError: ``dest`` is committed and ``overwrite`` is off.
    """
    t0 = time.perf_counter()
    # A file URL's trailing "/" matters, so the text is shown (and recorded) as given.
    text = os.fspath(src) if isinstance(src, (str, os.PathLike)) else str(src)
    settings: dict[str, Any] = {"s3_config": s3_config, "transfer_config": transfer_config}
    source_at: Location | None = None
    if isinstance(src, (str, os.PathLike)) and _is_local(text):
        sources = _local_sources(text)
    else:
        source_at = as_location_among(src, store=src_store, **settings)
        sources = _remote_sources(source_at)
    try:
        fetch: dict[str, tuple[_Source, HeaderEntry]] = {}
        flat: dict[str, torch.Tensor] = {}
        where: dict[str, str] = {}
        for source in sources:
            for entry in source.entries:
                if entry.name in where:
                    raise ConfigError(
                        f"tensor {entry.name!r} is in both {where[entry.name]} and {source.name}"
                    )
                where[entry.name] = source.name
                flat[entry.name] = torch.empty(entry.shape, dtype=entry.dtype, device="meta")
                fqn = f"{prefix}.{entry.name}" if prefix else entry.name
                fetch[fqn] = (source, entry)
        state: dict[str, Any] = {prefix: flat} if prefix else dict(flat)
        out = as_location_among(dest, near=source_at, store=store, **settings)
        writer = S3StorageWriter(
            out,
            overwrite=overwrite,
            step=step,
            metrics=metrics,
            user_metadata={"imported_from": text, "prefix": prefix or None},
        )
        with quiet_dcp():
            dcp.save(
                state,
                storage_writer=writer,
                planner=_LazySavePlanner(fetch, progress),
                no_dist=True,
            )
    finally:
        for source in sources:
            source.close()
    return ImportResult(
        source=text,
        dest=writer.checkpoint_id,
        files=tuple(s.name for s in sources),
        tensors=len(fetch),
        tensor_bytes=sum(e.nbytes for _, e in fetch.values()),
        prefix=prefix or None,
        step=step,
        seconds=round(time.perf_counter() - t0, 3),
    )
