"""Export a DCP checkpoint as full (unsharded) Hugging Face safetensors shards, or one
``torch.save`` file, streamed to any store.

How safetensors export stays within bounded memory:

1. Plan. Every selected tensor (and the converter's outputs for it) is laid out from
   ``.metadata`` alone: the converter is run on ``meta`` tensors (shape and dtype, no
   data), so names, shapes, dtypes, the shard split and every shard's header are known
   before a byte is read. A converter that cannot run on ``meta`` tensors is planned on
   real values instead (the checkpoint is then read twice).
2. Stream. Tensors are loaded a window at a time (full tensors assembled from any number
   of saved chunks, see :mod:`s3ckpt.tools._load`), converted, cast and written into the
   open shard's multipart upload, then dropped. Memory: two read windows (or the two
   largest tensors) plus the upload buffers (``TransferConfig.max_inflight_bytes +
   part_size``), independent of the shard size and of the model size.
3. Commit. Shards first, ``model.safetensors.index.json`` last. On failure every upload of
   this export is aborted and completed shards are deleted.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.dcp.reader import S3StorageReader
from s3ckpt.errors import CheckpointExistsError, ConfigError
from s3ckpt.store import Location, LocationLike, ObjectStore
from s3ckpt.tools._common import (
    Entry,
    NameFilter,
    dtype_name,
    index_checkpoint,
    open_reader,
    parse_dtype,
    parse_size,
)
from s3ckpt.tools._convert import (
    Converter,
    check_converted,
    convert,
    load_converter,
    plan_export,
    split_shards,
)
from s3ckpt.tools._load import iter_loaded
from s3ckpt.tools._open import as_location_among
from s3ckpt.tools._safetensors import TORCH_TO_ST, build_header, tensor_bytes
from s3ckpt.transfer import Uploader, format_leftovers

__all__ = [
    "INDEX_NAME",
    "ExportResult",
    "ExportedFile",
    "SkippedItem",
    "export_checkpoint",
]

INDEX_NAME = "model.safetensors.index.json"
TORCH_NAME = "model.pt"

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class ExportedFile:
    """One file the export wrote."""

    name: str
    size: int
    tensors: int


@dataclass(frozen=True)
class SkippedItem:
    """A checkpoint entry the export left out, and why."""

    name: str
    reason: str


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_checkpoint` wrote."""

    source: str
    dest: str
    format: str
    files: tuple[ExportedFile, ...]
    tensors: int
    """Tensors written (after the converter)."""
    tensor_bytes: int
    skipped: tuple[SkippedItem, ...] = ()
    notes: tuple[str, ...] = ()
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (stable keys)."""
        return asdict(self)


def _select(
    entries: Mapping[str, Entry], only: str | None, names: NameFilter
) -> list[tuple[Entry, str]]:
    chosen: list[tuple[Entry, str]] = []
    prefix = f"{only.rstrip('.')}." if only else ""
    for fqn, entry in entries.items():
        if prefix and not fqn.startswith(prefix):
            continue
        name = fqn[len(prefix) :]
        if names(name):
            chosen.append((entry, name))
    if only and not chosen:
        tops = sorted({k.split(".", 1)[0] for k in entries})
        raise ConfigError(
            f"nothing selected under {only!r}; the checkpoint's top-level keys are "
            f"{', '.join(tops)}"
        )
    return chosen


def export_checkpoint(
    checkpoint: LocationLike | S3StorageReader,
    dest: LocationLike,
    *,
    format: str = "safetensors",
    dtype: str | torch.dtype | None = None,
    max_shard_size: str | int = "5GB",
    only: str | None = None,
    include: Iterable[str] | str | None = None,
    exclude: Iterable[str] | str | None = None,
    converter: str | Converter | None = None,
    metadata: Mapping[str, str] | None = None,
    overwrite: bool = False,
    read_window: int = 64 * 2**20,
    s3_config: S3Config | None = None,
    transfer_config: TransferConfig | None = None,
    store: ObjectStore | None = None,
    dest_store: ObjectStore | None = None,
    progress: Progress | None = None,
) -> ExportResult:
    """Write the full (unsharded) state dict of ``checkpoint`` to ``dest``.

    ``format="safetensors"``: ``model-00001-of-0000N.safetensors`` shards plus
    ``model.safetensors.index.json`` under the prefix ``dest`` (an index is written even
    for one shard). Memory stays bounded by two read windows plus the upload buffers (see
    the module docs); nothing is staged on local disk. Non-tensor entries are skipped
    (listed in ``ExportResult.skipped``).

    ``format="torch"``: one ``torch.save`` file of the flat ``{name: value}`` dict
    (non-tensor values included): ``dest`` itself when it ends in ``.pt``, ``.pth`` or
    ``.bin``, else ``dest/model.pt``. This one holds the whole state dict in memory.

    Args:
        checkpoint: Checkpoint URL (``s3://...``, any fsspec URL, a local path), a
            :class:`~s3ckpt.store.Location` or an open :class:`~s3ckpt.S3StorageReader`.
        dest: Where to write (``s3://bucket/prefix``, any fsspec URL, a local directory or a
            Location); a URL in the checkpoint's bucket is written through its store.
        dtype: Cast floating-point tensors to this (``bf16``, ``fp16``, ``fp32``, ...);
            integer and bool tensors keep theirs.
        max_shard_size: Largest shard (``"5GB"``, ``"500MiB"``, bytes). A tensor larger
            than this gets a shard of its own.
        only: Keep the subtree under this top-level key and strip it from names
            (``only="model"``: ``model.layers.0.w`` becomes ``layers.0.w``).
        include / exclude: Glob filters on names (after ``only`` stripped the prefix,
            before the converter).
        converter: A :data:`Converter` or ``"module:function"`` naming one.
        metadata: Extra ``__metadata__`` strings for every shard (``format: pt`` is always
            there).
        overwrite: Replace an earlier export at ``dest``; otherwise refuse.
        read_window: Bytes of tensors loaded per DCP load (prefetched one ahead).
        s3_config / transfer_config: How to open URL arguments (a Location carries its own).
        store / dest_store: Stores for URL arguments, instead of ones built from them (tests).
        progress: Called with ``(bytes_done, bytes_total)`` of tensor data written.

    Raises:
        CheckpointExistsError: ``dest`` holds an export and ``overwrite`` is off.
        ConfigError: bad format, dtype, size, converter, or a converter whose real outputs
            differ from its planned (meta) outputs.
    """
    t0 = time.perf_counter()
    if format not in ("safetensors", "torch"):
        raise ConfigError(f"unknown export format {format!r}; expected safetensors or torch")
    cast = parse_dtype(dtype)
    shard_limit = parse_size(max_shard_size)
    conv = load_converter(converter)
    settings: dict[str, Any] = {"s3_config": s3_config, "transfer_config": transfer_config}
    if not isinstance(checkpoint, S3StorageReader):
        checkpoint = as_location_among(checkpoint, store=store, **settings)
    reader = open_reader(checkpoint)
    entries = index_checkpoint(reader)
    chosen = _select(entries, only, NameFilter.of(include, exclude))
    near = reader.location if store is None else None
    out = as_location_among(dest, near=near, store=dest_store, **settings)
    tc = transfer_config or out.transfer_config
    if format == "torch":
        return _export_torch(
            reader, chosen, out, cast, conv, overwrite, read_window, tc, t0, progress
        )
    out_store, url = out.store, out.url

    tensors = [(e, n) for e, n in chosen if e.kind == "tensor"]
    skipped = [
        SkippedItem(n, "not a tensor (safetensors holds tensors only; use --format torch)")
        for e, n in chosen
        if e.kind != "tensor"
    ]
    if not overwrite and out_store.head(url.key(INDEX_NAME)) is not None:
        raise CheckpointExistsError(
            f"an export already exists at {url} ({INDEX_NAME}); pass overwrite=True "
            "(--overwrite) to replace it, or pick another destination",
            bucket=out_store.bucket,
            key=url.key(INDEX_NAME),
        )
    notes: list[str] = []
    groups = plan_export(reader, tensors, conv, cast, read_window, notes)
    for g in groups:
        bad = [o for o in g.outs if o.dtype not in TORCH_TO_ST]
        if bad:
            g.outs = [o for o in g.outs if o.dtype in TORCH_TO_ST]
            skipped += [
                SkippedItem(o.name, f"dtype {dtype_name(o.dtype)} has no safetensors code")
                for o in bad
            ]
    groups = [g for g in groups if g.outs]
    shards = split_shards(groups, shard_limit)
    n = len(shards)
    names = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    meta = {"format": "pt", **{str(k): str(v) for k, v in (metadata or {}).items()}}
    total = sum(g.nbytes for g in groups)
    weight_map = {o.name: names[i] for i, shard in enumerate(shards) for g in shard for o in g.outs}

    biggest = max((sum(g.nbytes for g in s) for s in shards), default=0)
    part_size = tc.part_size_for(biggest + 2**20)
    uploader = Uploader(
        out_store,
        part_size=part_size,
        n_buffers=tc.upload_buffers(part_size),
        max_concurrency=tc.max_concurrency,
    )
    files: list[ExportedFile] = []
    done = 0
    try:
        loaded = iter_loaded(reader, [g.entry for g in groups], window=read_window)
        for i, shard in enumerate(shards):
            header, data_size = build_header(
                [(o.name, o.dtype, o.shape) for g in shard for o in g.outs], meta
            )
            sink = uploader.sink(url.key(names[i]))
            sink.write(header)
            for g in shard:
                entry, value = next(loaded)
                assert entry is g.entry
                outs = convert(conv, g.name, value, cast)
                del value
                check_converted(g, outs)
                for _name, t in outs:
                    sink.write(tensor_bytes(t))
                    done += t.numel() * t.element_size()
                del outs
                if progress is not None:
                    progress(done, total)
            files.append(
                ExportedFile(names[i], len(header) + data_size, sum(len(g.outs) for g in shard))
            )
            sink.close()
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        raw = json.dumps(index, indent=2).encode("utf-8") + b"\n"
        uploader.finish()
        out_store.put(url.key(INDEX_NAME), raw)
        files.append(ExportedFile(INDEX_NAME, len(raw), 0))
        _remove_stale_shards(out, set(names), notes)
    except BaseException:
        leftovers = uploader.abort()
        if leftovers:
            notes.append(format_leftovers(leftovers))
        raise
    return ExportResult(
        source=reader.checkpoint_id,
        dest=str(url),
        format="safetensors",
        files=tuple(files),
        tensors=sum(len(g.outs) for g in groups),
        tensor_bytes=total,
        skipped=tuple(skipped),
        notes=tuple(notes),
        seconds=round(time.perf_counter() - t0, 3),
    )


_SHARD_RE = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")


def _remove_stale_shards(out: Location, keep: set[str], notes: list[str]) -> None:
    """After an overwrite, delete shards of the earlier export the new index no longer names."""
    store, url = out.store, out.url
    stale = [
        o.key
        for o in store.list(url.prefix)
        if _SHARD_RE.match(o.key[len(url.prefix) :]) and o.key[len(url.prefix) :] not in keep
    ]
    if stale:
        failures = store.delete(stale)
        notes.append(f"removed {len(stale) - len(failures)} shard(s) of the earlier export")
        if failures:
            notes.append(format_leftovers([f.key for f in failures]))


def _export_torch(
    reader: S3StorageReader,
    chosen: Sequence[tuple[Entry, str]],
    out: Location,
    cast: torch.dtype | None,
    conv: Converter | None,
    overwrite: bool,
    read_window: int,
    tc: TransferConfig,
    t0: float,
    progress: Progress | None,
) -> ExportResult:
    out_store, url = out.store, out.url
    prefix = url.prefix.rstrip("/")
    if prefix.endswith((".pt", ".pth", ".bin")):
        key, shown = prefix, f"{url.scheme}://{url.bucket}/{prefix}"
    else:
        key, shown = url.key(TORCH_NAME), str(url) + TORCH_NAME
    if not overwrite and out_store.head(key) is not None:
        raise CheckpointExistsError(
            f"{shown} already exists; pass overwrite=True (--overwrite) to replace it",
            bucket=out_store.bucket,
            key=key,
        )
    names = {id(e): n for e, n in chosen}
    state: dict[str, Any] = {}
    total = sum(e.nbytes for e, _ in chosen)
    done = 0
    for entry, value in iter_loaded(reader, [e for e, _ in chosen], window=read_window):
        name = names[id(entry)]
        if isinstance(value, torch.Tensor):
            pairs = convert(conv, name, value, cast)
            done += entry.nbytes
        else:
            pairs = [(name, value)]
        for n, v in pairs:
            if n in state:
                raise ConfigError(f"two entries would be exported as {n!r}; fix the converter")
            state[n] = v
        if progress is not None:
            progress(done, total)
    uploader = Uploader(
        out_store,
        part_size=tc.part_size,
        n_buffers=tc.upload_buffers(tc.part_size),
        max_concurrency=tc.max_concurrency,
    )
    try:
        sink = uploader.sink(key)
        torch.save(state, sink)
        size = sink.tell()
        sink.close()
        uploader.finish()
    except BaseException:
        uploader.abort()
        raise
    tensors = [v for v in state.values() if isinstance(v, torch.Tensor)]
    return ExportResult(
        source=reader.checkpoint_id,
        dest=shown,
        format="torch",
        files=(ExportedFile(key.rsplit("/", 1)[-1], size, len(tensors)),),
        tensors=len(tensors),
        tensor_bytes=sum(t.numel() * t.element_size() for t in tensors),
        seconds=round(time.perf_counter() - t0, 3),
    )
