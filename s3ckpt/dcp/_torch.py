"""The private torch APIs s3ckpt uses, each probed once behind a stable name.

``torch.distributed.checkpoint`` keeps several names s3ckpt needs private. Every use
goes through this module, which checks that the name still exists and has the shape
s3ckpt relies on, and otherwise falls back to its own implementation or raises an error
that names the torch version and what to do. ``dcp/_serialize.py`` guards its two
private names (the zip writer without CRC-32) the same way.

- ``StorageInfo``: ``filesystem._StorageInfo``; without it, an own dataclass that
  pickles under the same name.
- ``flatten_state_dict``: ``_nested_dict.flatten_state_dict``; without it, an own walk.
- ``local_chunks``: ``DTensor.__create_chunk_list__``; without it, an own computation
  from the DTensor's public mesh and placements.
- ``transform_load_stream``: ``_extension.ExtensionRegistry`` and
  ``filesystem._StorageReaderTransforms`` (over the reader's ``_extension_registry``, or
  torch's default one); without them, an error, raised only for an item saved with stream
  transforms (an item without needs neither). The writer's side needs no private name: it
  only calls the user's extensions (``dcp/_serialize.py``).

The pinned torch (see ``pyproject.toml``) has all four; the fallbacks serve other
versions and are tested by taking the private names away (``tests/unit/test_torch_compat.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any

import torch
from torch.distributed.checkpoint import filesystem
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata
from torch.distributed.checkpoint.planner import ReadItem

from s3ckpt.errors import S3CkptError

__all__ = ["StorageInfo", "flatten_state_dict", "local_chunks", "transform_load_stream"]

_TESTED = "2.13"  # the torch that constraints.txt pins and the suite runs on

# --- StorageInfo: the per-item record in .metadata's storage_data -----------------------

_STORAGE_INFO_FIELDS = ("relative_path", "offset", "length", "transform_descriptors")


def _own_storage_info() -> type:
    """A dataclass that pickles exactly as torch 2.13's ``_StorageInfo``, under its name."""

    @dataclasses.dataclass
    class _StorageInfo:
        relative_path: str
        offset: int
        length: int
        transform_descriptors: Sequence[str] | None = None

        def __getstate__(self) -> dict[str, Any]:
            return {k: v for k, v in self.__dict__.items() if v is not None}

    _StorageInfo.__module__ = filesystem.__name__
    _StorageInfo.__qualname__ = "_StorageInfo"
    _StorageInfo.__doc__ = "This is the per entry storage info."
    return _StorageInfo


def _storage_info() -> type:
    """torch's ``_StorageInfo`` where it has the fields s3ckpt writes; else the own one.

    Every ``.metadata`` ever written names ``torch.distributed.checkpoint.filesystem.
    _StorageInfo``, so the own class is registered there: ``.metadata`` written with it
    pickles under that name, byte for byte as torch's would, and stays readable by any
    torch that reads older checkpoints and by s3ckpt's restricted unpickler.
    """
    if (cls := getattr(filesystem, "_StorageInfo", None)) is None:
        filesystem._StorageInfo = cls = _own_storage_info()
        return cls
    names = tuple(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else ()
    if names != _STORAGE_INFO_FIELDS:
        raise ImportError(
            f"torch {torch.__version__}: torch.distributed.checkpoint.filesystem._StorageInfo "
            f"has fields {names or 'unknown'}, not {_STORAGE_INFO_FIELDS}; s3ckpt cannot write "
            f"a .metadata this torch reads. s3ckpt is tested with torch {_TESTED}"
        )
    return cls


if TYPE_CHECKING:
    from torch.distributed.checkpoint._extension import (
        ExtensionRegistry as ExtensionRegistry,
    )
    from torch.distributed.checkpoint._extension import (
        StreamTransformExtension as StreamTransformExtension,
    )
    from torch.distributed.checkpoint.filesystem import _StorageInfo as StorageInfo
else:
    StorageInfo = _storage_info()


# --- flatten_state_dict: DCP's flattened keys ("model.layers.0.weight") ------------------


def _own_flatten(
    state_dict: Mapping[Any, Any],
) -> tuple[dict[str, Any], dict[str, tuple[Any, ...]]]:
    """DCP's flattening as torch 2.13 does it (``_traverse.traverse_state_dict``): mappings
    are walked, lists only when they hold a tensor, a mapping or such a list; tuples and
    everything else are leaves."""
    flat: dict[str, Any] = {}
    mapping: dict[str, tuple[Any, ...]] = {}

    def leaf(value: Any) -> bool:
        if not isinstance(value, list):
            return not isinstance(value, Mapping)
        return not any(
            isinstance(v, torch.Tensor) or (isinstance(v, (Mapping, list)) and not leaf(v))
            for v in value
        )

    def walk(path: tuple[Any, ...], value: Any) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk((*path, str(k)), v)
        elif leaf(value):
            fqn = ".".join(map(str, path))
            if fqn in flat:
                raise ValueError(f"duplicated flatten key {fqn}")
            flat[fqn], mapping[fqn] = value, path
        else:
            for i, v in enumerate(value):
                walk((*path, i), v)

    walk((), state_dict)
    return flat, mapping


def _flatten_impl() -> Any:
    """torch's ``flatten_state_dict`` if it imports and flattens a sample; else the own."""
    with contextlib.suppress(Exception):  # any change in the private API: use the own walk
        from torch.distributed.checkpoint._nested_dict import flatten_state_dict as theirs

        flat, mapping = theirs({"a": {"b": 1}})
        if flat == {"a.b": 1} and mapping == {"a.b": ("a", "b")}:
            return theirs
    return _own_flatten


_flatten = _flatten_impl()


def flatten_state_dict(state_dict: Mapping[Any, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(flat, mapping)``: ``state_dict`` keyed by DCP's dotted names, and each name's
    path of keys and list indices in the nested dict."""
    return _flatten(state_dict)


# --- local_chunks: where this rank's part of a tensor sits in the global tensor ---------


def _shard_chunk(
    global_shape: Sequence[int],
    mesh_shape: Sequence[int],
    coordinate: Sequence[int],
    placements: Sequence[Any],
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(sizes, offsets)`` of the local shard at ``coordinate`` of the mesh, split as
    ``torch.chunk`` splits (DTensor's ``Shard``), mesh dimensions left to right."""
    from torch.distributed.tensor import Replicate, Shard

    sizes, offsets = list(global_shape), [0] * len(global_shape)
    for mesh_dim, placement in enumerate(placements):
        if isinstance(placement, Replicate):
            continue
        if type(placement) is not Shard:
            raise S3CkptError(
                f"torch {torch.__version__}: DTensor has no __create_chunk_list__ and s3ckpt "
                f"cannot place a {placement} shard itself; s3ckpt is tested with torch {_TESTED}"
            )
        d, n = placement.dim, mesh_shape[mesh_dim]
        full = -(-sizes[d] // n)
        start = min(full * coordinate[mesh_dim], sizes[d])
        size = max(0, min(sizes[d], start + full) - start)
        offsets[d] = offsets[d] + start if size else global_shape[d]
        sizes[d] = size
    return tuple(sizes), tuple(offsets)


def local_chunks(tensor: torch.Tensor) -> list[ChunkStorageMetadata]:
    """The chunks of the global tensor that ``tensor`` holds on this rank, as DCP plans
    them: a DTensor's local shard, a plain tensor whole at offset 0."""
    if callable(create := getattr(tensor, "__create_chunk_list__", None)):
        return list(create())
    from torch.distributed.tensor import DTensor

    if not isinstance(tensor, DTensor):
        return [ChunkStorageMetadata(offsets=torch.Size([0] * tensor.dim()), sizes=tensor.size())]
    mesh = tensor.device_mesh
    # A rank not in the mesh holds nothing.
    if (coordinate := mesh.get_coordinate()) is None:
        return [ChunkStorageMetadata(offsets=torch.Size([]), sizes=torch.Size([0]))]
    sizes, offsets = _shard_chunk(tensor.shape, mesh.shape, coordinate, tensor.placements)
    return [ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes))]


# --- transform_load_stream: undo an item's stream transforms (DCP extensions) -----------


@functools.cache
def _reader_transforms() -> Any:
    """torch's ``_StorageReaderTransforms``, or the exception that stopped it (probed once,
    when an item first needs it)."""
    try:
        from torch.distributed.checkpoint._extension import ExtensionRegistry
        from torch.distributed.checkpoint.filesystem import _StorageReaderTransforms

        transforms = _StorageReaderTransforms(ExtensionRegistry())
        if not callable(getattr(transforms, "transform_load_stream", None)):
            raise AttributeError("_StorageReaderTransforms has no transform_load_stream")
        return transforms
    except Exception as exc:
        return exc


def transform_load_stream(
    read_item: ReadItem,
    transform_descriptors: Sequence[str] | None,
    stream: IO[bytes],
    registry: ExtensionRegistry | None = None,
) -> IO[bytes]:
    """``stream`` with the item's stream transforms (e.g. compression) undone, each looked
    up in ``registry`` (``None``: torch's default one, which knows ``ZStandard``);
    ``stream`` itself when the item has none, which needs no private torch API at all.

    Raises:
        S3CkptError: the item has transforms and this torch lacks the private API that
            undoes them.
        ValueError: a descriptor the registry does not know (torch's own error).
    """
    if not transform_descriptors:
        return stream
    transforms = _reader_transforms()
    if isinstance(transforms, Exception):
        raise S3CkptError(
            f"{read_item.storage_index.fqn}: saved with stream transforms "
            f"{list(transform_descriptors)}, and torch {torch.__version__} lacks the private "
            "API s3ckpt undoes them with (torch.distributed.checkpoint._extension."
            "ExtensionRegistry, filesystem._StorageReaderTransforms: "
            f"{type(transforms).__name__}: {transforms}); load this checkpoint with torch's "
            f"own FileSystemReader, or use torch {_TESTED} (the version s3ckpt is tested with)"
        ) from transforms
    if registry is not None:
        transforms = type(transforms)(registry)
    return transforms.transform_load_stream(read_item, transform_descriptors, stream)
