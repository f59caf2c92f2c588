"""s3ckpt: S3 as a first-class home for PyTorch training checkpoints.

Public API::

    from s3ckpt import Checkpointer                       # what a training loop uses
    from s3ckpt import S3StorageWriter, S3StorageReader   # torch.distributed.checkpoint
    from s3ckpt import S3Config, TransferConfig
    from s3ckpt import Location                           # a URL opened once, with its store
    from s3ckpt import HashedPrefixes                     # opt-in layout for many-rank saves
    from s3ckpt import KeepLast, KeepEvery, KeepBest      # retention rules (and the others)
    from s3ckpt import S3CkptError, CheckpointNotFoundError  # the errors a loop catches

The torch-dependent names (Checkpointer, the DCP writer and reader) are imported lazily,
so the parts that need no torch (configuration, errors, the store, retention) import without it.
"""

import typing as _typing

from s3ckpt._version import __version__
from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    ChecksumMismatchError,
    ConfigError,
    CorruptCheckpointError,
    S3CkptError,
    SaveInProgressError,
    StoreError,
    UnsafeCheckpointError,
)
from s3ckpt.format import HashedPrefixes
from s3ckpt.retention import (
    AllOf,
    AnyOf,
    KeepBest,
    KeepCalendar,
    KeepEvery,
    KeepLast,
    KeepPinned,
    KeepWithin,
)
from s3ckpt.store import Location

if _typing.TYPE_CHECKING:
    from s3ckpt.checkpointer import Checkpointer, SaveHandle
    from s3ckpt.dcp import S3StorageReader, S3StorageWriter

__all__ = [
    # what a training loop uses
    "Checkpointer",
    "SaveHandle",
    "S3StorageWriter",
    "S3StorageReader",
    "S3Config",
    "TransferConfig",
    "Location",
    "HashedPrefixes",
    # the retention rules a user names (Checkpointer(policy=...)); the rest: s3ckpt.retention
    "KeepLast",
    "KeepEvery",
    "KeepBest",
    "KeepWithin",
    "KeepCalendar",
    "KeepPinned",
    "AllOf",
    "AnyOf",
    # the errors a training loop catches; every error class: s3ckpt.errors
    "S3CkptError",
    "CheckpointError",
    "CheckpointNotFoundError",
    "CorruptCheckpointError",
    "ChecksumMismatchError",
    "ConfigError",
    "StoreError",
    "SaveInProgressError",
    "UnsafeCheckpointError",
    "__version__",
]


def __getattr__(name: str) -> _typing.Any:
    if name in ("S3StorageWriter", "S3StorageReader"):
        from s3ckpt import dcp

        return getattr(dcp, name)
    if name in ("Checkpointer", "SaveHandle"):
        from s3ckpt import checkpointer

        return getattr(checkpointer, name)
    raise AttributeError(f"module 's3ckpt' has no attribute {name!r}")
