"""``torch.distributed.checkpoint`` storage for S3: :class:`S3StorageWriter` and
:class:`S3StorageReader` (the writer's opt-in layout for saves of many ranks is
:class:`s3ckpt.HashedPrefixes`); :data:`SAFE_GLOBALS`, the value types non-tensor items
may rebuild on load."""

from s3ckpt.dcp._quiet import quiet_dcp
from s3ckpt.dcp._safe import SAFE_GLOBALS, SafeGlobal
from s3ckpt.dcp.reader import S3StorageReader
from s3ckpt.dcp.writer import S3StorageWriter

__all__ = [
    "SAFE_GLOBALS",
    "S3StorageReader",
    "S3StorageWriter",
    "SafeGlobal",
    "quiet_dcp",
]
