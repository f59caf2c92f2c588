"""``torch.distributed.checkpoint`` storage for S3: :class:`S3StorageWriter` and
:class:`S3StorageReader`."""

from s3ckpt.dcp._quiet import quiet_dcp
from s3ckpt.dcp.reader import S3StorageReader
from s3ckpt.dcp.writer import S3StorageWriter

__all__ = ["S3StorageReader", "S3StorageWriter", "quiet_dcp"]
