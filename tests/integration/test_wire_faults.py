"""Replies cut inside their headers and request bytes flipped in transit, over HTTP through
a fault proxy to moto (docs/dcp.md, "Replies cut short" and "Checksums on the wire").

* A reply cut inside its headers (``cut_head``: status line, generic headers, then the
  connection closes) is a transport error: retried, decided by reading state back, and the
  save commits a checkpoint that loads bit-exact.
* moto stores whatever bytes reach it (it echoes the CRC32C it is sent without checking
  it): with ``verify_after_write`` a save whose bytes were flipped in transit never commits
  them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch.distributed.checkpoint as dcp

from s3ckpt import S3Config, S3StorageWriter
from s3ckpt.errors import ChecksumMismatchError, CorruptCheckpointError, find_s3ckpt_error
from s3ckpt.format._manifest import Manifest
from s3ckpt.format._names import MANIFEST_NAME
from s3ckpt.store.s3 import S3Store
from tests._helpers import list_keys, open_uploads
from tests.faultproxy import FaultProxy
from tests.integration._faulted_saves import TC, assert_loads, small_state

pytestmark = pytest.mark.integration


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_endpoint, fault_rate=0.0) as p:
        yield p


def _writer(url: str, proxy: FaultProxy, **cfg: object) -> S3StorageWriter:
    return S3StorageWriter(
        url, s3_config=S3Config(endpoint_url=proxy.endpoint_url, **cfg), transfer_config=TC
    )


# Every request type whose reply a save reads a result from.
CUT_CASES = [
    ("UploadPart", "*.distcp", None),
    ("CompleteMultipartUpload", "*.distcp", None),
    ("CreateMultipartUpload", "*.distcp", None),
    ("PutObject", "*.distcp", None),  # a small object in one PUT
    ("PutObject", "*/.metadata.*", None),
    ("PutObject", "*/s3ckpt.json", True),  # the commit point
    ("ListObjectsV2", "*", None),  # the existence check before the marker
    ("HeadObject", "*", None),
    ("GetObject", "*", None),
]


@pytest.mark.parametrize(("op", "glob", "conditional"), CUT_CASES)
def test_reply_cut_inside_its_headers_is_retried_and_commits(
    proxy: FaultProxy,
    moto_endpoint: str,
    bucket: str,
    s3_client,  # type: ignore[no-untyped-def]
    op: str,
    glob: str,
    conditional: bool | None,
) -> None:
    url = f"s3://{bucket}/run/step_1"
    armed = proxy.arm(op, "cut_head", key_glob=glob, conditional=conditional)
    sd = small_state(2)
    writer = _writer(url, proxy)
    dcp.save(sd, storage_writer=writer)
    assert armed.hits == 1, f"no {op} {glob} request was made"
    assert_loads(url, sd, moto_endpoint)
    raw = s3_client.get_object(Bucket=bucket, Key="run/step_1/" + MANIFEST_NAME)["Body"].read()
    assert Manifest.from_json(raw).save_id == writer.save_id
    assert open_uploads(s3_client, bucket) == []


def test_cut_replies_to_listings_and_deletes_are_never_taken_as_empty(
    proxy: FaultProxy,
    bucket: str,
    s3_client,  # type: ignore[no-untyped-def]
) -> None:
    """A cut listing is not an empty one, and a cut DeleteObjects is not "all deleted"."""
    for i in range(3):
        s3_client.put_object(Bucket=bucket, Key=f"p/k{i}", Body=b"x")
    store = S3Store(bucket, S3Config(endpoint_url=proxy.endpoint_url), TC)
    proxy.arm("ListObjectsV2", "cut_head")
    assert [o.key for o in store.list("p/")] == ["p/k0", "p/k1", "p/k2"]
    proxy.arm("ListMultipartUploads", "cut_head")
    s3_client.create_multipart_upload(Bucket=bucket, Key="p/up")
    assert [u.key for u in store.list_multipart_uploads("p/")] == ["p/up"]
    proxy.arm("DeleteObjects", "cut_head")
    assert store.delete(["p/k0", "p/k1"]) == []
    assert list_keys(s3_client, bucket, "p/") == ["p/k2"]
    info = store.head("p/k2")
    assert info is not None and info.size == 1
    assert proxy.stats["cut_head"] == 3


def test_verify_after_write_is_auto_on_against_moto(proxy: FaultProxy, bucket: str) -> None:
    """moto echoes whatever CRC32C it is sent and checks none: a store not known to verify."""
    from s3ckpt._verify import verify_wanted

    store = S3Store(bucket, S3Config(endpoint_url=proxy.endpoint_url), TC)
    store.put("run/probe", b"x")
    assert verify_wanted(store, None, "run/probe") is True
    assert verify_wanted(store, False, "run/probe") is False


# Which request's body gets a byte flipped: a part of the multipart object, a small object
# in one PUT, the .metadata, the marker itself.
FLIPS = [
    ("UploadPart", "*.distcp", 0),
    ("UploadPart", "*.distcp", 1),
    ("PutObject", "*.distcp", 0),
    ("PutObject", "*/.metadata.*", 0),
    ("PutObject", "*/s3ckpt.json", 0),
]


@pytest.mark.parametrize(("op", "glob", "skip"), FLIPS)
def test_a_byte_flipped_in_transit_is_never_committed(
    proxy: FaultProxy,
    moto_endpoint: str,
    bucket: str,
    s3_client,  # type: ignore[no-untyped-def]
    op: str,
    glob: str,
    skip: int,
) -> None:
    url = f"s3://{bucket}/run/step_1"
    before = small_state(1)
    dcp.save(before, storage_writer=_writer(url, proxy))  # the checkpoint to keep
    armed = proxy.arm(op, "flip_byte", key_glob=glob, skip=skip)
    sd = small_state(2)
    try:
        # verify_after_write left to auto: on, since moto verifies no checksum
        dcp.save(
            sd,
            storage_writer=S3StorageWriter(
                url,
                s3_config=S3Config(endpoint_url=proxy.endpoint_url),
                transfer_config=TC,
                overwrite=True,
            ),
        )
    except BaseException as exc:  # DCP wraps the coordinator's error
        err = find_s3ckpt_error(exc)
        assert isinstance(err, ChecksumMismatchError | CorruptCheckpointError), exc
        assert err.key is not None and err.key.startswith("run/step_1/")
        assert_loads(url, before, moto_endpoint)  # the previous checkpoint is intact
    else:
        assert_loads(url, sd, moto_endpoint)  # retried to success: what loads is what was sent
    assert armed.hits == 1
    assert open_uploads(s3_client, bucket) == []


def test_a_save_without_faults_commits_with_verify_on(
    proxy: FaultProxy, moto_endpoint: str, bucket: str
) -> None:
    url = f"s3://{bucket}/run/step_1"
    sd = small_state(3)
    dcp.save(sd, storage_writer=_writer(url, proxy, verify_after_write=True))
    assert_loads(url, sd, moto_endpoint)
    assert proxy.stats["op:GetObject"] >= 2  # the data object and .metadata read back
