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

import contextlib
import json
import mmap
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.dcp import quiet_dcp
from s3ckpt.dcp.writer import S3StorageWriter
from s3ckpt.errors import CheckpointNotFoundError, ConfigError, CorruptCheckpointError
from s3ckpt.store import Location, ObjectStore
from s3ckpt.store._location import LocationLike
from s3ckpt.tools._export import INDEX_NAME
from s3ckpt.tools._open import as_location
from s3ckpt.tools._safetensors import HeaderEntry, header_length, parse_header

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


@dataclass
class _Source:
    """One safetensors file or object, and how to read a range of it."""

    name: str
    read: Callable[[int, int], Any]
    """``read(start, length)``: a writable buffer of exactly those bytes."""
    close: Callable[[], None]
    size: int | None = None
    """Known for a local file (its truncation is found before anything is written)."""
    entries: list[HeaderEntry] = field(default_factory=list)
    data_start: int = 0

    def tensor(self, entry: HeaderEntry) -> torch.Tensor:
        if entry.nbytes == 0:
            return torch.empty(entry.shape, dtype=entry.dtype)
        buf = self.read(self.data_start + entry.begin, entry.nbytes)
        return torch.frombuffer(buf, dtype=torch.uint8).view(entry.dtype).reshape(entry.shape)


def _open_source(src: Location, key: str) -> _Source:
    """A local file memory-mapped (a private, copy-on-write map: writable for
    ``torch.frombuffer``, never written back), an object read by ranged GETs."""
    local = src.url.scheme == "file"  # shown as the path it is
    store, shown = src.store, "/" + key if local else f"{src.url.scheme}://{src.url.bucket}/{key}"

    def truncated(start: int, length: int, got: int) -> CorruptCheckpointError:
        return CorruptCheckpointError(
            f"{shown} is truncated ({length - got} bytes missing at offset {start + got})",
            bucket=store.bucket,
            key=key,
        )

    if local:
        try:
            with open(shown, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size else b""
        except FileNotFoundError:
            raise CheckpointNotFoundError(f"no safetensors file or folder at {shown}") from None

        def read(start: int, length: int) -> Any:
            if start + length > size:
                raise truncated(start, length, max(size - start, 0))
            return memoryview(mapped)[start : start + length]

        def close() -> None:
            with contextlib.suppress(BufferError):  # a tensor still views it: goes with it
                if isinstance(mapped, mmap.mmap):
                    mapped.close()

        source = _Source(shown, read, close, size)
    else:

        def fetch(start: int, length: int) -> bytearray:
            buf, got = bytearray(length), 0
            with contextlib.closing(store.open_range(key, start, length)) as stream:
                while got < length and (n := stream.readinto(memoryview(buf)[got:])) > 0:
                    got += n
            if got < length:
                raise truncated(start, length, got)
            return buf

        source = _Source(shown, fetch, lambda: None)
    n = header_length(source.read(0, 8), where=shown)
    source.entries, source.data_start = parse_header(bytes(source.read(8, n)), where=shown)
    need = source.data_start + (source.entries[-1].end if source.entries else 0)
    if source.size is not None and need > source.size:
        raise truncated(0, need, source.size)
    return source


def _index_files(raw: bytes, where: str) -> list[str]:
    try:
        files = sorted(set(json.loads(raw.decode("utf-8"))["weight_map"].values()))
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptCheckpointError(f"{where} is not a safetensors index: {exc}") from exc
    for f in files:
        if not isinstance(f, str) or "/" in f or f.startswith(".."):
            raise CorruptCheckpointError(f"{where} names a file outside its folder: {f!r}")
    return files


def _sources(src: Location) -> list[_Source]:
    """The safetensors files ``src`` names: one file, an index, or a folder / prefix (its
    index, else every ``*.safetensors`` directly in it)."""
    st, url = src.store, src.url
    whole = url.prefix.rstrip("/")
    index = whole if whole.endswith(".index.json") else url.key(INDEX_NAME)
    if whole.endswith(".safetensors"):
        keys = [whole]
    elif index == whole or st.head(index) is not None:  # (a named index is not HEADed)
        files = _index_files(st.get(index), f"{url.scheme}://{url.bucket}/{index}")
        keys = [index[: index.rfind("/") + 1] + n for n in files]
    else:
        names = (o.key[len(url.prefix) :] for o in st.list(url.prefix))
        keys = sorted(url.key(n) for n in names if n.endswith(".safetensors") and "/" not in n)
    if not keys and index != whole:
        raise CheckpointNotFoundError(
            f"no *.safetensors objects or {INDEX_NAME} under {url}",
            bucket=st.bucket,
            key=url.prefix,
        )
    return [_open_source(src, k) for k in keys]


#: fqn -> the file holding the tensor, and where in it.
_Fetch = dict[str, tuple[_Source, HeaderEntry]]


class _LazySavePlanner(DefaultSavePlanner):
    """Hands the writer each tensor's real bytes only when it asks for that item (and
    reports the bytes handed over to ``progress``)."""

    def __init__(self, fetch: _Fetch, progress: Callable[[int, int], None] | None) -> None:
        super().__init__()
        self._fetch, self._progress, self._lock = fetch, progress, threading.Lock()
        self._total, self._done = sum(e.nbytes for _, e in fetch.values()), 0

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
    t0, prefix = time.perf_counter(), prefix or None
    # A file URL's trailing "/" matters, so the text is shown (and recorded) as given.
    text = os.fspath(src) if isinstance(src, (str, os.PathLike)) else str(src)
    settings: dict[str, Any] = {"s3_config": s3_config, "transfer_config": transfer_config}
    source_at = as_location(src, among=True, store=src_store, **settings)
    sources = _sources(source_at)
    try:
        fetch: _Fetch = {}
        flat: dict[str, torch.Tensor] = {}
        for source in sources:
            for entry in source.entries:
                fqn = f"{prefix}.{entry.name}" if prefix else entry.name
                if entry.name in flat:
                    raise ConfigError(
                        f"tensor {entry.name!r} is in both {fetch[fqn][0].name} and {source.name}"
                    )
                flat[entry.name] = torch.empty(entry.shape, dtype=entry.dtype, device="meta")
                fetch[fqn] = (source, entry)
        state: dict[str, Any] = {prefix: flat} if prefix else dict(flat)
        out = as_location(dest, among=True, near=source_at, store=store, **settings)
        meta = {"imported_from": text, "prefix": prefix}
        writer = S3StorageWriter(
            out, overwrite=overwrite, step=step, metrics=metrics, user_metadata=meta
        )
        planner = _LazySavePlanner(fetch, progress)
        with quiet_dcp():
            dcp.save(state, storage_writer=writer, planner=planner, no_dist=True)
    finally:
        for source in sources:
            source.close()
    files, nbytes = tuple(s.name for s in sources), sum(e.nbytes for _, e in fetch.values())
    took = round(time.perf_counter() - t0, 3)
    return ImportResult(text, writer.checkpoint_id, files, len(fetch), nbytes, prefix, step, took)
