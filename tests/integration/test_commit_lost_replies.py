"""Lost replies on every request a save makes, over HTTP through a fault proxy to moto.

A "lost reply" is the worst ambiguity S3 hands a client: the server applied the request,
the client saw a reset. Each case here loses the reply of one request type once; the save
must still commit a checkpoint that loads bit-exact, with no open upload and no object
outside what the commit names (docs/dcp.md, "The commit protocol").
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch.distributed.checkpoint as dcp

from s3ckpt import HashedPrefixes, S3Config, S3StorageWriter
from s3ckpt.format._manifest import Manifest
from s3ckpt.format._names import MANIFEST_NAME, METADATA_NAME
from tests._helpers import list_keys, open_uploads
from tests.faultproxy import FaultProxy
from tests.integration._faulted_saves import TC, assert_loads, small_state

pytestmark = pytest.mark.integration


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_endpoint, fault_rate=0.0) as p:
        yield p


def _save(url: str, sd: dict, proxy: FaultProxy, **kw: object) -> S3StorageWriter:
    writer = S3StorageWriter(
        url, s3_config=S3Config(endpoint_url=proxy.endpoint_url), transfer_config=TC, **kw
    )
    dcp.save(sd, storage_writer=writer)
    return writer


def _committed_keys(s3_client, bucket: str, prefix: str) -> set[str]:  # type: ignore[no-untyped-def]
    raw = s3_client.get_object(Bucket=bucket, Key=prefix + MANIFEST_NAME)["Body"].read()
    m = Manifest.from_json(raw)
    names = {METADATA_NAME, MANIFEST_NAME, *(n for n, _, _ in m.controls)}
    return {prefix + n for n in names} | {m.object_key(prefix, o.name) for o in m.objects}


# (operation, key glob, conditional): every request type a save makes. An overwrite adds
# the If-Match marker PUT and the removal of the replaced save, so the requests around the
# commit point run both ways.
AROUND_COMMIT = [
    ("PutObject", "*/s3ckpt.json", True),  # the commit point
    ("PutObject", "*/.metadata", None),  # the stock copy after the marker
    ("DeleteObjects", "*", None),  # heartbeats / replaced objects
    ("ListObjectsV2", "*", None),  # the existence check before the marker
]
CASES = [
    (*case, False)
    for case in [
        ("PutObject", "*s3ckpt.alive.*", None),  # heartbeat
        ("CreateMultipartUpload", "*.distcp", None),
        ("UploadPart", "*.distcp", None),
        ("CompleteMultipartUpload", "*.distcp", None),
        ("PutObject", "*.distcp", None),  # a small object in one PUT
        ("PutObject", "*/.metadata.*", None),
        ("PutObject", "*/s3ckpt.items.*", None),  # the item records, beside .metadata.{tag}
        *AROUND_COMMIT,
    ]
] + [(*case, True) for case in AROUND_COMMIT]


@pytest.mark.parametrize(("op", "glob", "conditional", "overwrite"), CASES)
def test_lost_reply_on_each_request_type_still_commits_cleanly(
    proxy: FaultProxy,
    moto_endpoint: str,
    bucket: str,
    s3_client,  # type: ignore[no-untyped-def]
    op: str,
    glob: str,
    conditional: bool | None,
    overwrite: bool,
) -> None:
    url = f"s3://{bucket}/run/step_1"
    if overwrite:
        _save(url, small_state(1), proxy)
    armed = proxy.arm(op, "lost_reply", key_glob=glob, conditional=conditional)
    sd = small_state(2)
    writer = _save(url, sd, proxy, overwrite=overwrite)
    assert armed.hits == 1, f"no {op} {glob} request was made"
    assert_loads(url, sd, moto_endpoint)
    raw = s3_client.get_object(Bucket=bucket, Key="run/step_1/" + MANIFEST_NAME)["Body"].read()
    assert Manifest.from_json(raw).save_id == writer.save_id
    assert set(list_keys(s3_client, bucket)) == _committed_keys(s3_client, bucket, "run/step_1/")
    assert open_uploads(s3_client, bucket) == []


# A hashed-prefix save (data objects in the run's shard folder; the commit's existence check
# lists the shard folders it used): the same guarantees, on the requests the layout moves.
HASHED_CASES = [
    ("CreateMultipartUpload", "*.shard", None, False),
    ("UploadPart", "*.shard", None, False),
    ("CompleteMultipartUpload", "*.shard", None, False),
    ("ListObjectsV2", "*", None, False),  # a shard folder's listing before the marker
    ("PutObject", "*/s3ckpt.json", True, True),  # the commit point of an overwrite
    ("DeleteObjects", "*", None, True),  # the replaced save's shards
]


@pytest.mark.parametrize(("op", "glob", "conditional", "overwrite"), HASHED_CASES)
def test_lost_reply_in_a_hashed_prefix_save_still_commits_cleanly(
    proxy: FaultProxy,
    moto_endpoint: str,
    bucket: str,
    s3_client,  # type: ignore[no-untyped-def]
    op: str,
    glob: str,
    conditional: bool | None,
    overwrite: bool,
) -> None:
    url = f"s3://{bucket}/run/step_1"
    layout = HashedPrefixes(4)
    if overwrite:
        _save(url, small_state(1), proxy, prefix_strategy=layout)
    armed = proxy.arm(op, "lost_reply", key_glob=glob, conditional=conditional)
    sd = small_state(2)
    writer = _save(url, sd, proxy, overwrite=overwrite, prefix_strategy=layout)
    assert armed.hits == 1, f"no {op} {glob} request was made"
    assert_loads(url, sd, moto_endpoint)
    raw = s3_client.get_object(Bucket=bucket, Key="run/step_1/" + MANIFEST_NAME)["Body"].read()
    assert Manifest.from_json(raw).save_id == writer.save_id
    keys = set(list_keys(s3_client, bucket))
    assert keys == _committed_keys(s3_client, bucket, "run/step_1/")
    assert any(k.startswith("run/s3ckpt-shards/") for k in keys)
    assert open_uploads(s3_client, bucket) == []
