"""Storage classes on S3 (issue 31), over HTTP to moto: moves in place, tags, restores, and
what a read of an archived object raises (the store and the DCP reader).

moto 5 refuses a GET of a GLACIER / DEEP_ARCHIVE object without a restored copy (403
``InvalidObjectState``), as S3 does, so the archived-read tests run end to end. moto ignores
``x-amz-copy-source-if-match``: the precondition on the wire is checked by the request the
client sends, the refusal by the HEAD path (no ``size``) that moto does answer.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from s3ckpt import S3Config, S3StorageReader, S3StorageWriter
from s3ckpt.config import MiB, TransferConfig
from s3ckpt.errors import ArchivedObjectError, PreconditionFailedError, find_s3ckpt_error
from s3ckpt.format._names import MANIFEST_NAME
from s3ckpt.store import _archive
from s3ckpt.store.base import RestoreState, restore_state
from s3ckpt.store.s3 import S3Store
from tests import _helpers
from tests._helpers import assert_same, list_keys, open_uploads, zeros_like_state
from tests.faultproxy import FaultProxy

pytestmark = pytest.mark.integration

SMALL = dataclasses.replace(_helpers.SMALL, target_object_size=1 * MiB)


def _state() -> dict[str, Any]:
    g = torch.Generator().manual_seed(7)
    return {"w": torch.randn(512, 1024, generator=g), "b": torch.randn(64, generator=g), "n": 3}


def _save(bucket: str, name: str = "run/step_3") -> tuple[str, dict[str, Any]]:
    url = f"s3://{bucket}/{name}"
    sd = _state()
    dcp.save(sd, storage_writer=S3StorageWriter(url, transfer_config=SMALL))
    return url, sd


def _store(bucket: str, endpoint: str) -> S3Store:
    return S3Store(bucket, S3Config(endpoint_url=endpoint))


def _crc(client: Any, bucket: str, key: str) -> str | None:
    head = client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    return head.get("ChecksumCRC32C")


def _move_all(store: S3Store, prefix: str, cls: str) -> list[str]:
    """Every object under ``prefix`` but the commit marker, moved to ``cls``."""
    moved = []
    for info in store.list(prefix):
        if info.key.endswith(MANIFEST_NAME):
            continue
        after = store.set_storage_class(info.key, cls, etag=info.etag, size=info.size)
        assert after.storage_class == cls and after.size == info.size
        moved.append(info.key)
    return moved


def test_copy_moves_the_class_and_keeps_bytes_crc_and_a_bit_exact_load(
    bucket: str, s3_client: Any, moto_endpoint: str
) -> None:
    url, sd = _save(bucket)
    store = _store(bucket, moto_endpoint)
    before = {
        k: (s3_client.get_object(Bucket=bucket, Key=k)["Body"].read(), _crc(s3_client, bucket, k))
        for k in list_keys(s3_client, bucket)
    }
    moved = _move_all(store, "run/step_3/", "STANDARD_IA")
    assert len(moved) >= 3
    for key in moved:
        assert s3_client.head_object(Bucket=bucket, Key=key)["StorageClass"] == "STANDARD_IA"
        assert store.head(key).storage_class == "STANDARD_IA"  # type: ignore[union-attr]
        body = s3_client.get_object(Bucket=bucket, Key=key)["Body"].read()
        assert (body, _crc(s3_client, bucket, key)) == before[key]
    marker = s3_client.head_object(Bucket=bucket, Key=f"run/step_3/{MANIFEST_NAME}")
    assert "StorageClass" not in marker  # the marker stays STANDARD
    out = zeros_like_state(sd)
    dcp.load(out, storage_reader=S3StorageReader(url, transfer_config=SMALL))
    assert_same(sd, out)


def test_an_object_already_in_the_class_is_left_alone(bucket: str, moto_endpoint: str) -> None:
    store = _store(bucket, moto_endpoint)
    store.put("k/a", b"abc")
    first = store.set_storage_class("k/a", "GLACIER_IR")
    again = store.set_storage_class("k/a", "GLACIER_IR")  # HEAD only; S3 refuses a no-op copy
    assert again.storage_class == first.storage_class == "GLACIER_IR"
    assert store.set_storage_class("k/a", "STANDARD").storage_class is None


def test_multipart_copy_above_a_lowered_limit_keeps_parts_tags_and_crc(
    bucket: str, s3_client: Any, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_archive, "COPY_PART_LIMIT", 1 * MiB)
    store = _store(bucket, moto_endpoint)
    data = [bytes([i]) * (5 * MiB) for i in (1, 2)] + [b"\x03" * 1000]
    upload = store.create_multipart("big/obj")
    parts = [store.upload_part("big/obj", upload, n, d) for n, d in enumerate(data, 1)]
    store.complete_multipart("big/obj", upload, parts)
    store.put_object_tags("big/obj", {"team": "ml"})
    etag, crc = store.head("big/obj").etag, _crc(s3_client, bucket, "big/obj")  # type: ignore[union-attr]
    info = store.set_storage_class("big/obj", "GLACIER_IR", etag=etag)
    head = s3_client.head_object(Bucket=bucket, Key="big/obj", ChecksumMode="ENABLED")
    assert head["StorageClass"] == "GLACIER_IR" == info.storage_class
    assert head["ETag"].endswith('-3"')  # copied on the source's 3 part boundaries
    assert head.get("ChecksumCRC32C") == crc
    assert s3_client.get_object(Bucket=bucket, Key="big/obj")["Body"].read() == b"".join(data)
    tags = s3_client.get_object_tagging(Bucket=bucket, Key="big/obj")["TagSet"]
    assert tags == [{"Key": "team", "Value": "ml"}]
    assert open_uploads(s3_client, bucket) == []


def test_etag_precondition(bucket: str, moto_endpoint: str) -> None:
    store = _store(bucket, moto_endpoint)
    store.put("k/a", b"version 1")
    stale = store.head("k/a").etag  # type: ignore[union-attr]
    store.put("k/a", b"version 2")
    with pytest.raises(PreconditionFailedError, match="changed"):
        store.set_storage_class("k/a", "STANDARD_IA", etag=stale)
    assert store.head("k/a").storage_class is None  # type: ignore[union-attr]
    # With a size there is no HEAD first: S3 itself refuses (CopySourceIfMatch).
    sent: list[dict[str, Any]] = []

    def capture(params: dict[str, Any], **_: Any) -> None:
        sent.append(dict(params["headers"]))

    events = store.client.meta.events
    events.register("before-call.s3.CopyObject", capture)
    try:
        store.set_storage_class("k/a", "STANDARD_IA", etag=stale, size=9)
    except PreconditionFailedError:
        pass  # S3; moto ignores the header and copies
    finally:
        events.unregister("before-call.s3.CopyObject", capture)
    assert sent and sent[0]["x-amz-copy-source-if-match"] == stale
    assert sent[0]["x-amz-storage-class"] == "STANDARD_IA"
    assert sent[0]["x-amz-metadata-directive"] == "COPY"
    assert "x-amz-checksum-algorithm" not in sent[0]  # S3 keeps the object's CRC32C


def test_a_lost_copy_reply_is_decided_by_reading_back(bucket: str, moto_endpoint: str) -> None:
    with FaultProxy(moto_endpoint, fault_rate=0.0) as proxy:
        store = S3Store(
            bucket,
            S3Config(endpoint_url=proxy.endpoint_url),
            TransferConfig(max_attempts=3),
            sleep=lambda _: None,
        )
        store.put("k/a", b"payload")
        info = store.head("k/a")
        assert info is not None
        armed = proxy.arm("Other", "lost_reply", key_glob="k/a")  # the CopyObject
        after = store.set_storage_class("k/a", "GLACIER", etag=info.etag, size=info.size)
        assert armed.hits == 1
    assert after.storage_class == "GLACIER" and after.size == info.size


def test_a_read_of_an_archived_object_names_the_restore(bucket: str, moto_endpoint: str) -> None:
    store = _store(bucket, moto_endpoint)
    store.put("run/step_9/__0_0.distcp", b"0123456789")
    store.set_storage_class("run/step_9/__0_0.distcp", "DEEP_ARCHIVE")
    for read in (
        lambda: store.get("run/step_9/__0_0.distcp"),
        lambda: store.open_range("run/step_9/__0_0.distcp", 2, 4).readinto(
            memoryview(bytearray(4))
        ),
    ):
        with pytest.raises(ArchivedObjectError) as caught:
            read()
        err = caught.value
        assert err.storage_class == "DEEP_ARCHIVE" and err.key == "run/step_9/__0_0.distcp"
        assert err.checkpoint == f"s3://{bucket}/run/step_9/"
        assert f"`s3ckpt restore s3://{bucket}/run/step_9/`" in str(err)


def test_restore_states_and_a_read_after_the_restore(bucket: str, moto_endpoint: str) -> None:
    store = _store(bucket, moto_endpoint)
    store.put("k/std", b"s")
    store.put("k/ir", b"i")
    store.put("k/gl", b"g")
    store.set_storage_class("k/ir", "GLACIER_IR")
    store.set_storage_class("k/gl", "GLACIER")
    assert store.restore_object("k/std", days=1) is RestoreState.NOT_ARCHIVED
    assert store.restore_object("k/ir", days=1) is RestoreState.NOT_ARCHIVED
    assert restore_state(store.head("k/gl")) is RestoreState.ARCHIVED  # type: ignore[arg-type]
    assert store.restore_object("k/gl", days=2, tier="Bulk") is RestoreState.STARTED
    head = store.head("k/gl")
    assert head is not None and head.restore is not None
    assert restore_state(head) is RestoreState.RESTORED  # moto restores at once
    assert store.restore_object("k/gl", days=2) is RestoreState.RESTORED  # 200: extended
    assert store.get("k/gl") == b"g"


def test_put_object_tags_replaces_the_tag_set(
    bucket: str, s3_client: Any, moto_endpoint: str
) -> None:
    store = _store(bucket, moto_endpoint)
    store.put("k/a", b"x")
    store.put_object_tags("k/a", {"a": "1", "s3ckpt-tier": "GLACIER"})
    store.put_object_tags("k/a", {"s3ckpt-tier": "STANDARD_IA"})
    tags = s3_client.get_object_tagging(Bucket=bucket, Key="k/a")["TagSet"]
    assert tags == [{"Key": "s3ckpt-tier", "Value": "STANDARD_IA"}]


def test_a_load_of_an_archived_checkpoint_fails_at_once_naming_the_restore(
    bucket: str, moto_endpoint: str
) -> None:
    url, sd = _save(bucket)
    store = _store(bucket, moto_endpoint)
    _move_all(store, "run/step_3/", "GLACIER")
    with pytest.raises(ArchivedObjectError) as caught:
        S3StorageReader(url, transfer_config=SMALL)  # .metadata is read here
    assert f"`s3ckpt restore {url}/`" in str(caught.value)
    # Data archived, .metadata restored: the first data read fails, wrapped by DCP.
    assert store.restore_object("run/step_3/.metadata", days=1) is RestoreState.STARTED
    with pytest.raises(BaseException) as wrapped:  # DCP's CheckpointException
        dcp.load(zeros_like_state(sd), storage_reader=S3StorageReader(url, transfer_config=SMALL))
    err = find_s3ckpt_error(wrapped.value)
    assert isinstance(err, ArchivedObjectError), wrapped.value
    assert err.checkpoint == f"{url}/"


def test_the_restore_command_restores_a_run_and_a_load_then_works(
    bucket: str, moto_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from s3ckpt.cli import main

    url, sd = _save(bucket)
    store = _store(bucket, moto_endpoint)
    moved = _move_all(store, "run/step_3/", "GLACIER")
    capsys.readouterr()
    assert main(["restore", f"s3://{bucket}/run/", "--json", "--days", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["counts"]["started"] == len(moved) and doc["failed"] == []
    assert [c["url"] for c in doc["checkpoints"]] == [f"{url}/"]
    assert main(["restore", url, "--wait", "--poll-seconds", "0.01", "--tier", "Bulk"]) == 0
    out = capsys.readouterr().out
    assert "restored" in out and "every object reads now" in out
    loaded = zeros_like_state(sd)
    dcp.load(loaded, storage_reader=S3StorageReader(url, transfer_config=SMALL))
    assert_same(sd, loaded)
    assert main(["restore", f"s3://{bucket}/nothing/"]) == 2
    assert "nothing to restore" in capsys.readouterr().err
