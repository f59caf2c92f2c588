"""Interoperability with the other DCP storage backends, on one moto S3 server.

s3ckpt keeps torch's file-style DCP layout (``__{rank}_{i}*.distcp`` objects plus a pickled
``.metadata`` whose storage_data points into them), so checkpoints move freely between:

- s3ckpt's ``S3StorageWriter`` / ``S3StorageReader``,
- torch's own ``FsspecWriter`` / ``FsspecReader`` over s3fs,
- ``s3torchconnector.dcp.S3StorageWriter`` / ``S3StorageReader`` (AWS CRT / mountpoint client).

Every test compares every loaded value exactly (dtype, shape and bits).

Pointing the foreign clients at moto:

- s3fs takes the endpoint through fsspec storage options, which both ``FsspecWriter`` and
  ``FsspecReader`` forward: ``client_kwargs={"endpoint_url": ...}``.
- s3torchconnector's DCP classes take no endpoint argument; its native (mountpoint) client
  honours the ``AWS_ENDPOINT_URL`` environment variable, which the ``moto_endpoint`` fixture
  sets. 127.0.0.1 has no virtual-host form, so ``S3ClientConfig(force_path_style=True)``.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner
from torch.distributed.checkpoint.api import CheckpointException

from s3ckpt import S3Config, S3StorageReader, S3StorageWriter
from tests._helpers import list_keys

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


# -- state dicts ----------------------------------------------------------------------------


def _source() -> dict[str, Any]:
    """A small state dict with every kind of value DCP handles (about 1.3 MB)."""
    g = torch.Generator().manual_seed(1234)
    base = torch.randn(96, 160, generator=g)
    return {
        "model": {
            "fp32": torch.randn(256, 512, generator=g),
            "bf16": torch.randn(128, 300, generator=g).to(torch.bfloat16),
            "i64": torch.randint(-(2**62), 2**62, (1000,), dtype=torch.int64, generator=g),
            # A transposed view: strides (1, 160), shares storage with ``base``.
            "noncontig": base.t(),
            # A column slice: non-contiguous and its storage is larger than the tensor.
            "slice": base[:, 10:50],
            "empty": torch.empty(0, 7),
            "scalar": torch.tensor(3.5, dtype=torch.float64),
        },
        "train_state": {
            "step": 1234,
            "name": "run-π",  # non-ASCII on purpose
            "lr": 3.0e-4,
            "nested": {"flags": [1, 2, 3], "done": False},
        },
    }


def _blank_like(value: Any) -> Any:
    """A destination of the same structure: tensors zeroed (same shape, dtype and layout
    kind: a non-contiguous source gets a non-contiguous destination), other values
    replaced by placeholders DCP must overwrite."""
    if isinstance(value, dict):
        return {k: _blank_like(v) for k, v in value.items()}
    if isinstance(value, torch.Tensor):
        if value.dim() == 2 and not value.is_contiguous():
            return torch.zeros(value.shape[1], value.shape[0], dtype=value.dtype).t()
        return torch.zeros_like(value, memory_format=torch.contiguous_format)
    return None


def _assert_same(expected: Any, actual: Any, path: str = "") -> None:
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{path}: expected a dict, got {type(actual)}"
        assert set(actual) == set(expected), f"{path}: keys {set(actual)} != {set(expected)}"
        for k in expected:
            _assert_same(expected[k], actual[k], f"{path}.{k}" if path else k)
        return
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: expected a tensor, got {type(actual)}"
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{path}: shape {actual.shape} != {expected.shape}"
        assert torch.equal(actual, expected), f"{path}: values differ"
        return
    assert type(actual) is type(expected) and actual == expected, (
        f"{path}: {actual!r} != {expected!r}"
    )


# -- backends -------------------------------------------------------------------------------


def _url(bucket: str, name: str) -> str:
    return f"s3://{bucket}/interop/{name}-{uuid.uuid4().hex[:8]}"


def _s3ckpt_writer(url: str, endpoint: str) -> S3StorageWriter:
    return S3StorageWriter(url, s3_config=S3Config(endpoint_url=endpoint))


def _s3ckpt_reader(url: str, endpoint: str) -> S3StorageReader:
    return S3StorageReader(url, s3_config=S3Config(endpoint_url=endpoint))


def _fsspec_writer(url: str, endpoint: str) -> Any:
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    return FsspecWriter(url, client_kwargs={"endpoint_url": endpoint})


def _fsspec_reader(url: str, endpoint: str) -> Any:
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    return FsspecReader(url, client_kwargs={"endpoint_url": endpoint})


def _s3tc_config() -> Any:
    from s3torchconnector import S3ClientConfig

    return S3ClientConfig(force_path_style=True)


def _s3tc_writer(url: str, endpoint: str) -> Any:
    from s3torchconnector.dcp import S3StorageWriter as S3tcWriter

    # The endpoint reaches the native client through AWS_ENDPOINT_URL (see module docs).
    return S3tcWriter("us-east-1", url, s3client_config=_s3tc_config())


def _s3tc_reader(url: str, endpoint: str) -> Any:
    from s3torchconnector.dcp import S3StorageReader as S3tcReader

    return S3tcReader("us-east-1", url, s3client_config=_s3tc_config())


@pytest.fixture
def endpoint(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    # The fixture already exports it; be explicit because s3torchconnector depends on it.
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    return moto_endpoint


# -- s3ckpt writes, others read -----------------------------------------------------------


def test_fsspec_reader_loads_s3ckpt_checkpoint(endpoint: str, bucket: str, s3_client: Any) -> None:
    src = _source()
    url = _url(bucket, "s3ckpt")
    dcp.save(src, storage_writer=_s3ckpt_writer(url, endpoint))
    prefix = url.split("/", 3)[3] + "/"
    keys = list_keys(s3_client, bucket, prefix)
    assert prefix + ".metadata" in keys and prefix + "s3ckpt.json" in keys

    out = _blank_like(src)
    dcp.load(out, storage_reader=_fsspec_reader(url, endpoint))
    _assert_same(src, out)


def test_s3torchconnector_reader_loads_s3ckpt_checkpoint(endpoint: str, bucket: str) -> None:
    src = _source()
    url = _url(bucket, "s3ckpt")
    dcp.save(src, storage_writer=_s3ckpt_writer(url, endpoint))

    out = _blank_like(src)
    dcp.load(out, storage_reader=_s3tc_reader(url, endpoint))
    _assert_same(src, out)


# -- others write, s3ckpt reads -----------------------------------------------------------


@pytest.mark.parametrize(
    "writer",
    [
        pytest.param(_fsspec_writer, id="fsspec-s3fs"),
        pytest.param(_s3tc_writer, id="s3torchconnector"),
    ],
)
def test_s3ckpt_reader_loads_foreign_checkpoint(
    writer: Any, endpoint: str, bucket: str, s3_client: Any
) -> None:
    src = _source()
    url = _url(bucket, writer.__name__)
    dcp.save(src, storage_writer=writer(url, endpoint))
    prefix = url.split("/", 3)[3] + "/"
    keys = list_keys(s3_client, bucket, prefix)
    assert prefix + ".metadata" in keys
    assert prefix + "s3ckpt.json" not in keys  # a foreign checkpoint has no s3ckpt marker

    reader = _s3ckpt_reader(url, endpoint)
    out = _blank_like(src)
    dcp.load(out, storage_reader=reader)
    _assert_same(src, out)
    assert reader.bytes_read > 0


# -- partial loads (the resharding building block) ---------------------------------------


@pytest.mark.parametrize(
    ("writer", "reader"),
    [
        pytest.param(_s3ckpt_writer, _s3ckpt_reader, id="s3ckpt-to-s3ckpt"),
        pytest.param(_s3ckpt_writer, _fsspec_reader, id="s3ckpt-to-fsspec"),
        pytest.param(_fsspec_writer, _s3ckpt_reader, id="fsspec-to-s3ckpt"),
    ],
)
def test_partial_load_of_a_subset_of_keys(
    writer: Any, reader: Any, endpoint: str, bucket: str
) -> None:
    g = torch.Generator().manual_seed(7)
    src = {
        "encoder": {"w": torch.randn(256, 512, generator=g), "b": torch.randn(512, generator=g)},
        "decoder": {"w": torch.randn(512, 256, generator=g).to(torch.bfloat16)},
        "head": torch.randn(64, 512, generator=g)[:, ::2],  # non-contiguous
        "step": 99,
        "note": "partial",
    }
    url = _url(bucket, "partial")
    dcp.save(src, storage_writer=writer(url, endpoint))

    # Only some keys, and one of them a tensor nested in a dict whose sibling is skipped.
    out: dict[str, Any] = {
        "encoder": {"w": torch.zeros(256, 512)},
        "head": torch.zeros(64, 256),
        "step": 0,
    }
    dcp.load(
        out,
        storage_reader=reader(url, endpoint),
        planner=DefaultLoadPlanner(allow_partial_load=True),
    )
    _assert_same({"encoder": {"w": src["encoder"]["w"]}, "head": src["head"], "step": 99}, out)

    # Without allow_partial_load a missing key in the checkpoint is an error, as in torch.
    with pytest.raises(CheckpointException) as info:
        dcp.load({"not_saved": torch.zeros(3)}, storage_reader=reader(url, endpoint))
    assert "Missing key" in str(info.value.failures[0])
