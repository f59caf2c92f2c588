"""s3ckpt: S3 as a first-class home for PyTorch training checkpoints.

Public API::

    from s3ckpt import Checkpointer                       # what a training loop uses
    from s3ckpt import S3StorageWriter, S3StorageReader   # torch.distributed.checkpoint
    from s3ckpt import S3Config, TransferConfig
    from s3ckpt import Location                           # a URL opened once, with its store
    from s3ckpt import HashedPrefixes                     # opt-in layout for many-rank saves

The torch-dependent names (Checkpointer, the DCP writer and reader) are imported lazily,
so the parts that need no torch (configuration, errors, the store, retention) import without it.
"""

import typing as _typing

from s3ckpt._version import __version__
from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.errors import (
    AccessDeniedError,
    CheckpointError,
    CheckpointExistsError,
    CheckpointNotFoundError,
    ChecksumMismatchError,
    ConfigError,
    CorruptCheckpointError,
    EndpointError,
    InvalidURLError,
    NoSuchBucketError,
    ObjectNotFoundError,
    PreconditionFailedError,
    S3CkptError,
    SaveInProgressError,
    StateMismatchError,
    StoreError,
    TransientStoreError,
    UncommittedCheckpointError,
    UnsafeCheckpointError,
)
from s3ckpt.format import HashedPrefixes
from s3ckpt.store import Location

if _typing.TYPE_CHECKING:
    from s3ckpt.checkpointer import Checkpointer, SaveHandle
    from s3ckpt.dcp import S3StorageReader, S3StorageWriter

__all__ = [
    "AccessDeniedError",
    "CheckpointError",
    "Checkpointer",
    "CheckpointExistsError",
    "CheckpointNotFoundError",
    "ChecksumMismatchError",
    "ConfigError",
    "CorruptCheckpointError",
    "EndpointError",
    "HashedPrefixes",
    "InvalidURLError",
    "NoSuchBucketError",
    "ObjectNotFoundError",
    "PreconditionFailedError",
    "S3CkptError",
    "Location",
    "S3Config",
    "S3StorageReader",
    "S3StorageWriter",
    "SaveHandle",
    "SaveInProgressError",
    "StateMismatchError",
    "StoreError",
    "TransferConfig",
    "TransientStoreError",
    "UncommittedCheckpointError",
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
