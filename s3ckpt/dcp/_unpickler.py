"""A restricted unpickler for DCP's ``.metadata``.

``.metadata`` is a pickle, and a pickle can run any code. A checkpoint may come from a
bucket other people can write to, so s3ckpt loads it with an unpickler that admits only
the types DCP's metadata is made of (its dataclasses, ``torch.Size``, dtypes, layouts,
memory formats, a few containers and paths). Anything else is refused, naming the global
it asked for.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch

from s3ckpt._gc_pause import gc_paused
from s3ckpt.errors import CorruptCheckpointError, UnsafeCheckpointError

__all__ = ["load_metadata", "ALLOWED_GLOBALS"]

_DCP = "torch.distributed.checkpoint"

ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {
        (f"{_DCP}.metadata", "Metadata"),
        (f"{_DCP}.metadata", "TensorStorageMetadata"),
        (f"{_DCP}.metadata", "BytesStorageMetadata"),
        (f"{_DCP}.metadata", "ChunkStorageMetadata"),
        (f"{_DCP}.metadata", "TensorProperties"),
        (f"{_DCP}.metadata", "MetadataIndex"),
        (f"{_DCP}.metadata", "StorageMeta"),
        (f"{_DCP}.metadata", "_MEM_FORMAT_ENCODING"),
        (f"{_DCP}.filesystem", "_StorageInfo"),
        (f"{_DCP}.planner", "WriteItemType"),
        (f"{_DCP}.planner", "LoadItemType"),
        ("torch", "Size"),
        # torch.layout pickles as a call of this by name (it only looks the name up).
        ("torch.serialization", "_get_layout"),
        ("collections", "OrderedDict"),
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("builtins", "object"),
        ("copyreg", "_reconstructor"),
        ("pathlib", "PosixPath"),
        ("pathlib", "PurePosixPath"),
        ("pathlib", "WindowsPath"),
        ("pathlib", "PureWindowsPath"),
        ("pathlib", "Path"),
        ("pathlib._local", "PosixPath"),
        ("pathlib._local", "PurePosixPath"),
    }
)

_TORCH_CONSTANT_TYPES = (torch.dtype, torch.layout, torch.memory_format)


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, bucket: str | None, key: str) -> None:
        super().__init__(io.BytesIO(data))
        self._bucket = bucket
        self._key = key

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), _TORCH_CONSTANT_TYPES):
            return getattr(torch, name)
        raise UnsafeCheckpointError(
            f"the metadata pickle asks to load {module}.{name}, which is not a DCP metadata "
            "type; refusing to unpickle it. Only load checkpoints from buckets you trust; if "
            "this one is trusted and the type legitimate, read it with a stock torch reader",
            bucket=self._bucket,
            key=self._key,
        )

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeCheckpointError(
            "the metadata pickle uses persistent ids, which DCP metadata never does; refusing",
            bucket=self._bucket,
            key=self._key,
        )


def load_metadata(data: bytes, *, bucket: str | None = None, key: str = ".metadata") -> Any:
    """Unpickle DCP metadata allowing only DCP's own types.

    Raises:
        UnsafeCheckpointError: the pickle asked for any other global.
        CorruptCheckpointError: the bytes are not a valid pickle / not DCP ``Metadata``.
    """
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        # Thousands of small objects, no cycles: pause the collector (see s3ckpt._gc_pause).
        with gc_paused():
            obj = _RestrictedUnpickler(data, bucket, key).load()
    except UnsafeCheckpointError:
        raise
    except Exception as exc:
        raise CorruptCheckpointError(
            f"not a readable DCP metadata pickle ({type(exc).__name__}: {exc}); the object is "
            "truncated or was not written by torch.distributed.checkpoint",
            bucket=bucket,
            key=key,
        ) from exc
    if not isinstance(obj, Metadata):
        raise CorruptCheckpointError(
            f"holds a {type(obj).__name__}, not DCP Metadata", bucket=bucket, key=key
        )
    return obj
