"""Planning an export: converters, and what each source tensor becomes.

A :data:`Converter` maps ``(name, tensor)`` to the tensors to write. :func:`plan_export`
runs it on ``meta`` tensors (shape and dtype, no data) so names, shapes, dtypes and the
shard split are known before a byte is read, falling back to real values for a converter
that cannot run on ``meta``; :func:`split_shards` cuts the plan into shards of bounded size.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from s3ckpt.dcp.reader import S3StorageReader
from s3ckpt.errors import ConfigError
from s3ckpt.tools._common import Entry
from s3ckpt.tools._load import iter_loaded

__all__ = [
    "Converter",
    "Group",
    "check_converted",
    "convert",
    "load_converter",
    "plan_export",
    "split_shards",
]

Converter = Callable[[str, torch.Tensor], Iterable[tuple[str, torch.Tensor]]]
"""``(name, tensor) -> iterable of (new_name, new_tensor)``: rename (yield one pair with a
new name), reshape or transpose, split (yield several), or drop (yield nothing). Called
once per tensor, after ``only`` stripped the prefix and before the dtype cast. It should
work on ``meta`` tensors (shape and dtype only) so the export can be planned without
reading data; plain renames, views, ``chunk``/``split`` and ``transpose`` all do."""


@dataclass
class Out:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * torch.empty((), dtype=self.dtype).element_size()


@dataclass
class Group:
    """One source tensor and the outputs the converter makes of it."""

    entry: Entry
    name: str
    """The source name after ``only`` stripped its prefix."""
    outs: list[Out] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(o.nbytes for o in self.outs)


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
            module = importlib.util.module_from_spec(loaded)
            loaded.loader.exec_module(module)
        else:
            module = importlib.import_module(mod_name)
    except (ImportError, OSError) as exc:
        raise ConfigError(f"converter {spec!r}: cannot import {mod_name!r}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ConfigError(f"converter {spec!r}: {mod_name!r} has no attribute {attr!r}")
    if not callable(obj):
        raise ConfigError(f"converter {spec!r} is not callable")
    return obj


def convert(
    converter: Converter | None, name: str, tensor: torch.Tensor, dtype: torch.dtype | None
) -> list[tuple[str, torch.Tensor]]:
    pairs = [(name, tensor)] if converter is None else list(converter(name, tensor))
    out = []
    for new_name, t in pairs:
        if not isinstance(new_name, str) or not isinstance(t, torch.Tensor):
            raise ConfigError(
                f"converter output for {name!r} must be (str, Tensor) pairs, got "
                f"({type(new_name).__name__}, {type(t).__name__})"
            )
        if dtype is not None and t.is_floating_point() and t.dtype != dtype:
            t = t.to(dtype)
        out.append((new_name, t))
    return out


def plan_export(
    reader: S3StorageReader,
    tensors: Sequence[tuple[Entry, str]],
    conv: Converter | None,
    cast: torch.dtype | None,
    read_window: int,
    notes: list[str],
) -> list[Group]:
    groups = [Group(e, n) for e, n in tensors]
    try:
        for g in groups:
            assert g.entry.shape is not None and g.entry.dtype is not None
            meta = torch.empty(g.entry.shape, dtype=g.entry.dtype, device="meta")
            g.outs = [Out(n, t.dtype, tuple(t.shape)) for n, t in convert(conv, g.name, meta, cast)]
    except ConfigError:
        raise
    except Exception as exc:
        notes.append(
            f"the converter does not run on meta tensors ({type(exc).__name__}: {exc}); "
            "planned on real values, so the checkpoint was read twice"
        )
        by_entry = {id(g.entry): g for g in groups}
        for entry, value in iter_loaded(reader, [g.entry for g in groups], window=read_window):
            g = by_entry[id(entry)]
            g.outs = [
                Out(n, t.dtype, tuple(t.shape)) for n, t in convert(conv, g.name, value, cast)
            ]
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
    got = [(n, t.dtype, tuple(t.shape)) for n, t in outs]
    want = [(o.name, o.dtype, o.shape) for o in group.outs]
    if got != want:
        raise ConfigError(
            f"the converter turned {group.name!r} into {got}, but planning (on its shape "
            f"alone) gave {want}; a converter must decide names, shapes and dtypes from "
            "the name, shape and dtype, not from the values"
        )


def split_shards(groups: Sequence[Group], limit: int) -> list[list[Group]]:
    shards: list[list[Group]] = []
    size = 0
    for g in groups:
        if not shards or (size + g.nbytes > limit and shards[-1]):
            shards.append([])
            size = 0
        shards[-1].append(g)
        size += g.nbytes
    return shards or [[]]
