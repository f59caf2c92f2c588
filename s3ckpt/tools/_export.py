"""Export a DCP checkpoint as full (unsharded) Hugging Face safetensors shards, or one
``torch.save`` file, streamed to any store.

How safetensors export stays within bounded memory:

1. Plan. Every selected tensor (and the converter's outputs for it) is laid out from
   ``.metadata`` alone: the converter is run on ``meta`` tensors (shape and dtype, no
   data), so names, shapes, dtypes, the shard split and every shard's header are known
   before a byte is read. A converter that cannot run on ``meta`` tensors is planned on
   real values instead (the checkpoint is then read twice).
2. Stream. Tensors are loaded a window at a time (full tensors assembled from any number
   of saved chunks, see :func:`~s3ckpt.tools._common.iter_loaded`), converted, cast and
   written into the open shard's multipart upload, then dropped. Memory: two read windows
   (or the two largest tensors) plus the upload buffers (``TransferConfig.max_inflight_bytes
   + part_size``), independent of the shard size and of the model size.
3. Commit. Shards first, ``model.safetensors.index.json`` last. On failure every upload of
   this export is aborted and completed shards are deleted.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import math
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

import torch

from s3ckpt._transfer import Uploader, format_leftovers
from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.dcp.reader import S3StorageReader
from s3ckpt.errors import CheckpointExistsError, ConfigError
from s3ckpt.store import Location, ObjectStore
from s3ckpt.store._location import LocationLike
from s3ckpt.tools._common import (
    Entry,
    NameFilter,
    batches,
    dtype_name,
    index_checkpoint,
    iter_loaded,
    open_reader,
    parse_dtype,
    parse_size,
)
from s3ckpt.tools._open import as_location
from s3ckpt.tools._safetensors import TORCH_TO_ST, build_header, tensor_bytes

__all__ = [
    "INDEX_NAME",
    "Converter",
    "ExportResult",
    "ExportedFile",
    "SkippedItem",
    "export_checkpoint",
    "load_converter",
]

# -- planning: converters, and what each source tensor becomes ---------------------------
Converter = Callable[[str, torch.Tensor], Iterable[tuple[str, torch.Tensor]]]
"""``(name, tensor) -> iterable of (new_name, new_tensor)``: rename (yield one pair with a
new name), reshape or transpose, split (yield several), or drop (yield nothing). Called
once per tensor, after ``only`` stripped the prefix and before the dtype cast. It should
work on ``meta`` tensors (shape and dtype only) so the export can be planned without
reading data; plain renames, views, ``chunk``/``split`` and ``transpose`` all do."""


class Out(NamedTuple):
    """One tensor the export writes: its name, dtype and shape."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]


@dataclass
class Group:
    """One source tensor and the outputs the converter makes of it."""

    entry: Entry
    name: str
    """The source name after ``only`` stripped its prefix."""
    outs: list[Out] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(math.prod(o.shape) * o.dtype.itemsize for o in self.outs)


def load_converter(spec: str | Converter | None) -> Converter | None:
    """A converter from ``"package.module:function"`` (or ``"path/file.py:function"``)."""
    if spec is None or callable(spec):
        return spec
    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise ConfigError(f"converter {spec!r}: expected MODULE:FUNCTION, e.g. mypkg.convert:to_hf")
    try:
        if mod_name.endswith(".py"):
            path = Path(mod_name).expanduser().resolve()
            loaded = importlib.util.spec_from_file_location(path.stem, path)
            if loaded is None or loaded.loader is None:
                raise ImportError(f"cannot load {path}")
            module: Any = importlib.util.module_from_spec(loaded)
            loaded.loader.exec_module(module)
        else:
            module = importlib.import_module(mod_name)
    except (ImportError, OSError) as exc:
        raise ConfigError(f"converter {spec!r}: cannot import {mod_name!r}: {exc}") from exc
    obj = functools.reduce(lambda o, part: getattr(o, part, None), attr.split("."), module)
    if obj is None:
        raise ConfigError(f"converter {spec!r}: {mod_name!r} has no attribute {attr!r}")
    if not callable(obj):
        raise ConfigError(f"converter {spec!r} is not callable")
    return obj


def convert(
    converter: Converter | None, name: str, tensor: torch.Tensor, dtype: torch.dtype | None
) -> list[tuple[str, torch.Tensor]]:
    pairs = [(name, tensor)] if converter is None else list(converter(name, tensor))
    for new_name, t in pairs:
        if not isinstance(new_name, str) or not isinstance(t, torch.Tensor):
            raise ConfigError(
                f"converter output for {name!r} must be (str, Tensor) pairs, got "
                f"({type(new_name).__name__}, {type(t).__name__})"
            )
    return [
        (n, t.to(dtype) if dtype is not None and t.is_floating_point() else t) for n, t in pairs
    ]


def plan_export(
    reader: S3StorageReader,
    tensors: Sequence[tuple[Entry, str]],
    conv: Converter | None,
    cast: torch.dtype | None,
    read_window: int,
    notes: list[str],
) -> list[Group]:
    groups = [Group(e, n) for e, n in tensors]

    def plan(g: Group, value: torch.Tensor) -> None:
        g.outs = [Out(n, t.dtype, tuple(t.shape)) for n, t in convert(conv, g.name, value, cast)]

    try:
        for g in groups:
            plan(g, torch.empty(g.entry.shape or (), dtype=g.entry.dtype, device="meta"))
    except ConfigError:
        raise
    except Exception as exc:
        notes.append(
            f"the converter does not run on meta tensors ({type(exc).__name__}: {exc}); "
            "planned on real values, so the checkpoint was read twice"
        )
        loaded = iter_loaded(reader, [g.entry for g in groups], window=read_window)
        for g, (_, value) in zip(groups, loaded, strict=True):
            plan(g, value)
    seen: dict[str, str] = {}
    for g in groups:
        for o in g.outs:
            if o.name in seen:
                raise ConfigError(
                    f"two tensors would be exported as {o.name!r} (from {seen[o.name]!r} and "
                    f"{g.name!r}); fix the converter or the name filters"
                )
            seen[o.name] = g.name
    return groups


def check_converted(group: Group, outs: Sequence[tuple[str, torch.Tensor]]) -> None:
    if (got := [Out(n, t.dtype, tuple(t.shape)) for n, t in outs]) != group.outs:
        raise ConfigError(
            f"the converter turned {group.name!r} into {got}, but planning (on its shape "
            f"alone) gave {group.outs}; a converter must decide names, shapes and dtypes from "
            "the name, shape and dtype, not from the values"
        )


# -- the export ---------------------------------------------------------------------------------
INDEX_NAME = "model.safetensors.index.json"


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
    prefix = f"{only.rstrip('.')}." if only else ""
    stripped = ((e, fqn[len(prefix) :]) for fqn, e in entries.items() if fqn.startswith(prefix))
    chosen = [(e, name) for e, name in stripped if names(name)]
    if only and not chosen:
        raise ConfigError(
            f"nothing selected under {only!r}; the checkpoint's top-level keys are "
            f"{', '.join(sorted({k.split('.', 1)[0] for k in entries}))}"
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
    progress: Callable[[int, int], None] | None = None,
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
    reader = open_reader(checkpoint, among=True, store=store, **settings)
    chosen = _select(index_checkpoint(reader), only, NameFilter.of(include, exclude))
    near = reader.location if store is None else None
    out = as_location(dest, among=True, near=near, store=dest_store, **settings)
    out_store, url = out.store, out.url
    tc = transfer_config or out.transfer_config
    key = url.key(INDEX_NAME)
    if format == "torch":
        whole = url.prefix.rstrip("/")
        key = whole if whole.endswith((".pt", ".pth", ".bin")) else url.key("model.pt")
    shown = f"{url.scheme}://{url.bucket}/{key}"
    if not overwrite and out_store.head(key) is not None:
        raise CheckpointExistsError(
            f"an export already exists at {shown}; pass overwrite=True (--overwrite) to "
            "replace it, or pick another destination",
            bucket=out_store.bucket,
            key=key,
        )
    if format == "torch":
        state: dict[str, Any] = {}
        total = sum(e.nbytes for e, _ in chosen)
        done = 0
        loaded = iter_loaded(reader, [e for e, _ in chosen], window=read_window)
        for (entry, name), (_, value) in zip(chosen, loaded, strict=True):
            pairs = convert(conv, name, value, cast) if entry.kind == "tensor" else [(name, value)]
            done += entry.nbytes  # (0 for a non-tensor item)
            for k, v in pairs:
                if k in state:
                    raise ConfigError(f"two entries would be exported as {k!r}; fix the converter")
                state[k] = v
            if progress is not None:
                progress(done, total)
        with _uploading(out_store, tc, tc.part_size) as uploader:
            sink = uploader.sink(key)
            torch.save(state, sink)
            size = sink.tell()
            sink.close()
            uploader.finish()
        saved = [v for v in state.values() if isinstance(v, torch.Tensor)]
        file = ExportedFile(key.rsplit("/", 1)[-1], size, len(saved))
        nbytes = sum(t.numel() * t.element_size() for t in saved)
        seconds = round(time.perf_counter() - t0, 3)
        return ExportResult(
            reader.checkpoint_id, shown, "torch", (file,), len(saved), nbytes, seconds=seconds
        )
    tensors = [(e, n) for e, n in chosen if e.kind == "tensor"]
    why = "not a tensor (safetensors holds tensors only; use --format torch)"
    skipped = [SkippedItem(n, why) for e, n in chosen if e.kind != "tensor"]
    notes: list[str] = []
    groups = plan_export(reader, tensors, conv, cast, read_window, notes)
    for g in groups:
        skipped += [
            SkippedItem(o.name, f"dtype {dtype_name(o.dtype)} has no safetensors code")
            for o in g.outs
            if o.dtype not in TORCH_TO_ST
        ]
        g.outs = [o for o in g.outs if o.dtype in TORCH_TO_ST]
    groups = [g for g in groups if g.outs]
    shards = list(batches(groups, shard_limit, lambda g: g.nbytes)) or [[]]
    names = [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    meta = {"format": "pt", **{str(k): str(v) for k, v in (metadata or {}).items()}}
    total = sum(g.nbytes for g in groups)
    weight_map = {o.name: names[i] for i, shard in enumerate(shards) for g in shard for o in g.outs}
    biggest = max((sum(g.nbytes for g in s) for s in shards), default=0)
    files: list[ExportedFile] = []
    done = 0
    with _uploading(out_store, tc, tc.part_size_for(biggest + 2**20)) as uploader:
        loaded = iter_loaded(reader, [g.entry for g in groups], window=read_window)
        for i, shard in enumerate(shards):
            header_items = [o for g in shard for o in g.outs]
            header, data_size = build_header(header_items, meta)
            sink = uploader.sink(url.key(names[i]))
            sink.write(header)
            for g in shard:
                outs = convert(conv, g.name, next(loaded)[1], cast)  # g.entry's value
                check_converted(g, outs)
                for _name, t in outs:
                    sink.write(tensor_bytes(t))
                    done += t.numel() * t.element_size()
                del outs
                if progress is not None:
                    progress(done, total)
            sink.close()
            files.append(ExportedFile(names[i], len(header) + data_size, len(header_items)))
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        raw = json.dumps(index, indent=2).encode("utf-8") + b"\n"
        uploader.finish()
        out_store.put(key, raw)
        files.append(ExportedFile(INDEX_NAME, len(raw), 0))
        _remove_stale_shards(out, set(names), notes)
    count, seconds = sum(len(g.outs) for g in groups), round(time.perf_counter() - t0, 3)
    result = ExportResult(reader.checkpoint_id, str(url), "safetensors", tuple(files), count, total)
    return replace(result, skipped=tuple(skipped), notes=tuple(notes), seconds=seconds)


@contextlib.contextmanager
def _uploading(store: ObjectStore, tc: TransferConfig, part_size: int) -> Iterator[Uploader]:
    """An :class:`Uploader` whose uploads are aborted if the block raises (the notes go
    with the exception)."""
    n_buffers = tc.upload_buffers(part_size)
    up = Uploader(
        store, part_size=part_size, n_buffers=n_buffers, max_concurrency=tc.read_concurrency
    )
    try:
        yield up
    except BaseException:
        up.abort()
        raise


_SHARD_RE = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")


def _remove_stale_shards(out: Location, keep: set[str], notes: list[str]) -> None:
    """After an overwrite, delete shards of the earlier export the new index no longer names."""
    store, url = out.store, out.url
    names = (o.key[len(url.prefix) :] for o in store.list(url.prefix))
    if stale := [url.key(n) for n in names if _SHARD_RE.match(n) and n not in keep]:
        failures = store.delete(stale)
        notes.append(f"removed {len(stale) - len(failures)} shard(s) of the earlier export")
        if failures:
            notes.append(format_leftovers([f.key for f in failures]))
