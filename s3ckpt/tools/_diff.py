"""``s3ckpt diff A B``: which tensors differ between two checkpoints, and by how much.

A key saved with the same chunk layout in two s3ckpt checkpoints whose items' CRC32Cs all
match is *identical* without downloading a byte. Everything else present in both is
downloaded, a window of tensors at a time from each side, and compared in slices of
``_SLICE`` elements, so memory stays at two windows (or two tensors) plus one slice in
float64, however large the checkpoints.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.dcp.reader import S3StorageReader
from s3ckpt.store import ObjectStore
from s3ckpt.store._location import LocationLike
from s3ckpt.tools._common import (
    Entry,
    NameFilter,
    batches,
    dtype_name,
    index_checkpoint,
    load_entries,
    open_reader,
)

__all__ = ["DiffResult", "TensorDiff", "diff_checkpoints"]

_SLICE = 1 << 22  # elements compared at once (32 MiB per float64 temporary)

STATUSES = (
    "identical",
    "changed",
    "shape_changed",
    "dtype_changed",
    "kind_changed",
    "only_in_a",
    "only_in_b",
)


@dataclass(frozen=True)
class TensorDiff:
    """How one state-dict key differs between A and B."""

    name: str
    status: str
    """One of ``identical``, ``changed``, ``shape_changed``, ``dtype_changed``,
    ``kind_changed`` (tensor in one, non-tensor value in the other), ``only_in_a``,
    ``only_in_b``."""
    method: str | None = None
    """How ``identical`` / ``changed`` was decided: ``checksum`` (nothing downloaded) or
    ``values``."""
    dtype_a: str | None = None
    dtype_b: str | None = None
    shape_a: tuple[int, ...] | None = None
    shape_b: tuple[int, ...] | None = None
    changed_elements: int | None = None
    """Elements that differ (NaN equals NaN)."""
    max_abs_diff: float | None = None
    mean_abs_diff: float | None = None
    """Mean over all elements (unchanged ones count as 0)."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        stats = ("max_abs_diff", "mean_abs_diff")  # "nan" / "inf" as text: the JSON standard
        return d | {k: str(d[k]) for k in stats if d[k] is not None and not math.isfinite(d[k])}


@dataclass(frozen=True)
class DiffResult:
    """What :func:`diff_checkpoints` found, in A's key order then B-only keys."""

    a: str
    b: str
    entries: tuple[TensorDiff, ...]
    bytes_compared: int
    """Tensor bytes downloaded and compared (each side)."""

    @property
    def identical(self) -> bool:
        return all(e.status == "identical" for e in self.entries)

    @property
    def counts(self) -> dict[str, int]:
        return {s: sum(1 for e in self.entries if e.status == s) for s in STATUSES}

    @property
    def differences(self) -> list[TensorDiff]:
        return [e for e in self.entries if e.status != "identical"]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (stable keys)."""
        return {
            "a": self.a,
            "b": self.b,
            "identical": self.identical,
            "counts": self.counts,
            "bytes_compared": self.bytes_compared,
            "entries": [e.to_dict() for e in self.entries],
        }


def _same_by_checksum(a: Entry, b: Entry) -> bool:
    """Both sides have the same chunks with the same CRC32Cs (else values decide: maybe
    only the framing differs, another torch)."""

    def layout(e: Entry) -> list[tuple[Any, ...]]:
        return [(c.offsets, c.sizes, c.length, c.record and c.record.crc32c) for c in e.chunks]

    return all(c.record is not None for c in a.chunks) and layout(a) == layout(b)


def compare_tensors(a: torch.Tensor, b: torch.Tensor) -> tuple[int, float, float]:
    """``(changed_elements, max_abs_diff, mean_abs_diff)`` of two same-shape tensors,
    computed in slices (NaN equals NaN; a NaN against a number makes the max NaN)."""
    fa, fb = a.reshape(-1), b.reshape(-1)
    n = fa.numel()  # (0: no slices, nothing changed)
    wide = torch.complex128 if (a.is_complex() or b.is_complex()) else torch.float64
    changed, max_d, total = 0, 0.0, 0.0
    for i in range(0, n, _SLICE):
        xa, xb = fa[i : i + _SLICE].to(wide), fb[i : i + _SLICE].to(wide)
        same = (xa == xb) | (torch.isnan(xa) & torch.isnan(xb))
        if not (k := int((~same).sum())):
            continue
        changed += k
        d = (xa - xb).abs().to(torch.float64)
        d[same] = 0
        m = float(d.max())
        max_d = m if math.isnan(m) else max(max_d, m)
        total += float(d.sum())
    return changed, max_d, (total / n if changed else 0.0)


def _values_equal(x: Any, y: Any) -> bool:
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        both = isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
        return both and x.shape == y.shape and x.dtype == y.dtype and compare_tensors(x, y)[0] == 0
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_values_equal(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
        same = type(x) is type(y) and len(x) == len(y)
        return same and all(_values_equal(p, q) for p, q in zip(x, y, strict=True))
    try:
        return bool(x == y) or (x != x and y != y)  # NaN == NaN here
    except Exception:
        return False


def diff_checkpoints(
    a: LocationLike | S3StorageReader,
    b: LocationLike | S3StorageReader,
    *,
    include: Iterable[str] | str | None = None,
    exclude: Iterable[str] | str | None = None,
    read_window: int = 64 * 2**20,
    s3_config: S3Config | None = None,
    transfer_config: TransferConfig | None = None,
    store_a: ObjectStore | None = None,
    store_b: ObjectStore | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> DiffResult:
    """Compare every key (matching the filters) of checkpoints ``a`` and ``b``.

    Args:
        a / b: URLs (``s3://...``, fsspec URLs, local paths), Locations or open readers;
            a URL ``b`` in ``a``'s bucket is read through ``a``'s store.
        include / exclude: Glob filters on state-dict keys (``"model.*"``).
        read_window: Bytes of tensors downloaded per DCP load on each side.
        s3_config / transfer_config: How to open URL arguments (a Location carries its own).
        store_a / store_b: Stores for URL arguments, instead of ones built from them (tests).
        progress: Called with ``(bytes_done, bytes_total)`` of the tensors compared by
            value (those checksums could not decide), after each window.
    """
    settings: dict[str, Any] = {"s3_config": s3_config, "transfer_config": transfer_config}
    ra = open_reader(a, among=True, store=store_a, **settings)
    near = ra.location if store_a is None else None
    rb = open_reader(b, among=True, near=near, store=store_b, **settings)
    names = NameFilter.of(include, exclude)
    ea = {k: v for k, v in index_checkpoint(ra).items() if names(k)}
    eb = {k: v for k, v in index_checkpoint(rb).items() if names(k)}
    results: dict[str, TensorDiff] = {}
    to_load: dict[str, tuple[Entry, Entry, tuple[Any, ...]]] = {}
    for name, x in ea.items():
        if (y := eb.get(name)) is None:
            results[name] = TensorDiff(name, "only_in_a", None, dtype_name(x.dtype), None, x.shape)
            continue
        both = (dtype_name(x.dtype), dtype_name(y.dtype), x.shape, y.shape)  # a, b, a, b
        if x.kind != y.kind:
            results[name] = TensorDiff(name, "kind_changed", None, *both)
        elif x.kind == "tensor" and x.shape != y.shape:
            results[name] = TensorDiff(name, "shape_changed", None, *both)
        elif x.kind == "tensor" and x.dtype != y.dtype:
            results[name] = TensorDiff(name, "dtype_changed", None, *both)
        elif _same_by_checksum(x, y):
            results[name] = TensorDiff(name, "identical", "checksum", *both)
        else:
            to_load[name] = (x, y, both)
    compared = done = 0
    total = sum(x.load_bytes() for x, _, _ in to_load.values())
    if progress is not None and to_load:
        progress(0, total)
    for batch in batches([x for x, _, _ in to_load.values()], read_window, Entry.load_bytes):
        va = load_entries(ra, batch)
        vb = load_entries(rb, [to_load[x.name][1] for x in batch])
        for x in batch:
            both = to_load[x.name][2]
            p, q = va.pop(x.name), vb.pop(x.name)
            stats: dict[str, Any] = {}
            if x.kind == "tensor":
                changed, mx, mean = compare_tensors(p, q)
                compared += x.nbytes
                stats = {"changed_elements": changed, "max_abs_diff": mx, "mean_abs_diff": mean}
            else:
                changed = not _values_equal(p, q)
            status = "changed" if changed else "identical"
            results[x.name] = TensorDiff(x.name, status, "values", *both, **stats)
        del va, vb
        if progress is not None:
            done += sum(map(Entry.load_bytes, batch))
            progress(done, total)
    ordered = [results[k] for k in ea]
    ordered += [
        TensorDiff(k, "only_in_b", dtype_b=dtype_name(y.dtype), shape_b=y.shape)
        for k, y in eb.items()
        if k not in ea
    ]
    return DiffResult(ra.checkpoint_id, rb.checkpoint_id, tuple(ordered), compared)
