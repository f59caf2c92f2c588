"""ZStandard-compressed checkpoints cross between torch's stock DCP backends and s3ckpt, both
ways, on one moto S3 server, with every value equal (issue 38, item 4).

torch's ``FsspecWriter`` / ``FsspecReader`` over s3fs are pointed at moto as in
tests/integration/test_interop.py (``client_kwargs={"endpoint_url": ...}``). The state dicts
are that module's: every dtype and layout DCP stores, and non-tensor items (which s3ckpt's
reader did not decompress before: ``UnsafeCheckpointError ... Unsupported operand 181``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._extension import ZStandard
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

from s3ckpt import S3Config, S3StorageReader, S3StorageWriter
from s3ckpt.tools import verify_checkpoint
from tests._helpers import list_keys
from tests.integration.test_interop import _assert_same, _blank_like, _source, _url

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.skipif(not ZStandard.is_available(), reason="no zstandard (the test extra)"),
]


def test_stock_fsspec_writer_zstandard_loads_with_s3ckpt_reader(
    moto_endpoint: str, bucket: str, s3_client: Any
) -> None:
    src = _source()
    url = _url(bucket, "fsspec-zstd")
    writer = FsspecWriter(
        url, _extensions=[ZStandard()], client_kwargs={"endpoint_url": moto_endpoint}
    )
    dcp.save(src, storage_writer=writer)
    prefix = url.split("/", 3)[3] + "/"
    assert prefix + "s3ckpt.json" not in list_keys(s3_client, bucket, prefix)

    reader = S3StorageReader(url, s3_config=S3Config(endpoint_url=moto_endpoint))
    infos = reader.metadata.storage_data.values()
    assert infos and all(i.transform_descriptors == ["stream.zstd/1"] for i in infos)
    out = _blank_like(src)
    dcp.load(out, storage_reader=reader)
    _assert_same(src, out)


def test_s3ckpt_writer_zstandard_loads_with_stock_fsspec_reader(
    moto_endpoint: str, bucket: str
) -> None:
    src = _source()
    url = _url(bucket, "s3ckpt-zstd")
    config = S3Config(endpoint_url=moto_endpoint)
    dcp.save(src, storage_writer=S3StorageWriter(url, s3_config=config, _extensions=[ZStandard()]))
    # s3ckpt's own checks hold over the compressed bytes (CRC32C of what is stored).
    result = verify_checkpoint(url, s3_config=config)
    assert result.ok and result.checksums and result.items_read == result.items

    out = _blank_like(src)
    dcp.load(out, storage_reader=FsspecReader(url, client_kwargs={"endpoint_url": moto_endpoint}))
    _assert_same(src, out)
    back = _blank_like(src)
    dcp.load(back, storage_reader=S3StorageReader(url, s3_config=config))
    _assert_same(src, back)
