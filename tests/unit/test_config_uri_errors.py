from __future__ import annotations

import pickle
import types

import pytest

import s3ckpt
from s3ckpt.config import MiB, S3Config, TransferConfig
from s3ckpt.errors import (
    ChecksumMismatchError,
    ConfigError,
    InvalidURLError,
    NoSuchBucketError,
    S3CkptError,
    find_s3ckpt_error,
)
from s3ckpt.uri import parse_url


def test_public_api_is_exactly_all() -> None:
    # Submodules show up as attributes once imported (other tests import them); they are not
    # API names. The DCP pair and the Checkpointer are loaded lazily, so name them explicitly.
    public = {
        n
        for n in dir(s3ckpt)
        if not n.startswith("_") and not isinstance(getattr(s3ckpt, n), types.ModuleType)
    } | {"S3StorageWriter", "S3StorageReader", "Checkpointer", "SaveHandle", "__version__"}
    assert set(s3ckpt.__all__) == public
    for name in s3ckpt.__all__:
        assert getattr(s3ckpt, name) is not None


@pytest.mark.parametrize(
    "url,bucket,prefix",
    [
        ("s3://bkt/run/step_1", "bkt", "run/step_1/"),
        ("s3://bkt/run/step_1/", "bkt", "run/step_1/"),
        ("s3://my.bucket-1", "my.bucket-1", ""),
        ("s3a://bkt/x", "bkt", "x/"),
    ],
)
def test_parse_url(url: str, bucket: str, prefix: str) -> None:
    parsed = parse_url(url)
    assert (parsed.scheme, parsed.bucket, parsed.prefix) == ("s3", bucket, prefix)
    assert parsed.key("s3ckpt.json") == prefix + "s3ckpt.json"


@pytest.mark.parametrize(
    "url",
    [
        "bkt/run",
        "s3://",
        "s3:///run",
        "s3://Bad_Bucket/x",
        "s3://ab/x",
        "s3://bkt/a//b",
        "s3://bkt/x?y=1",
    ],
)
def test_bad_urls_name_the_problem(url: str) -> None:
    with pytest.raises(InvalidURLError) as info:
        parse_url(url)
    assert "s3://" in str(info.value) or "bucket" in str(info.value)


def test_transfer_config_limits() -> None:
    with pytest.raises(ConfigError, match="5 MiB"):
        TransferConfig(part_size=MiB)
    with pytest.raises(ConfigError, match="max_inflight_bytes"):
        TransferConfig(part_size=16 * MiB, max_inflight_bytes=8 * MiB)
    tc = TransferConfig(part_size=8 * MiB, max_inflight_bytes=64 * MiB)
    assert tc.max_inflight_parts == 8
    # Objects past 10,000 parts get a bigger part size.
    assert tc.part_size_for(8 * MiB * 10_000) == 8 * MiB
    assert tc.part_size_for(8 * MiB * 10_000 + 1) == 16 * MiB


def test_s3_config_validation_and_secret_not_in_repr() -> None:
    with pytest.raises(ConfigError):
        S3Config(addressing_style="sideways")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="32 bytes"):
        S3Config(sse_customer_key=b"short")
    with pytest.raises(ConfigError, match="http"):
        S3Config(endpoint_url="localhost:9000")
    cfg = S3Config(sse_customer_key=b"k" * 32)
    assert "kkkk" not in repr(cfg)


def test_endpoint_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    assert S3Config().resolved_endpoint_url() == "http://127.0.0.1:1"
    assert S3Config(endpoint_url="http://x:2").resolved_endpoint_url() == "http://x:2"


def test_errors_pickle_with_attributes() -> None:
    err = ChecksumMismatchError("bad", bucket="b", key="k", rank=3, item="model.w")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is ChecksumMismatchError
    assert (back.bucket, back.key, back.rank, back.item) == ("b", "k", 3, "model.w")
    assert str(back) == str(err)
    assert "s3://b/k" in str(err) and "rank 3" in str(err)
    nsb = pickle.loads(
        pickle.dumps(NoSuchBucketError("x", bucket="b", operation="put", code="NoSuchBucket"))
    )
    assert nsb.code == "NoSuchBucket" and nsb.operation == "put"


def test_find_error_inside_dcp_wrapper() -> None:
    from torch.distributed.checkpoint.api import CheckpointException

    inner = S3CkptError("boom", rank=1)
    wrapped = CheckpointException("write", {0: (ValueError("x"), None), 1: (inner, None)})
    assert find_s3ckpt_error(wrapped) is inner
    assert find_s3ckpt_error(ValueError("plain")) is None


def test_sse_args_put_each_setting_on_the_requests_it_belongs_to() -> None:
    assert S3Config().sse_args(upload=True) == {}
    kms = S3Config(sse_kms_key_id="alias/ckpt", storage_class="STANDARD_IA")
    assert kms.sse_args(upload=True) == {
        "ServerSideEncryption": "aws:kms",
        "SSEKMSKeyId": "alias/ckpt",
        "StorageClass": "STANDARD_IA",
    }
    assert kms.sse_args(upload=False) == {}  # reads and listings carry neither
    key = bytes(range(32))
    sse_c = S3Config(sse_customer_key=key).sse_args(upload=False)  # SSE-C: every request
    assert sse_c == {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": key}
