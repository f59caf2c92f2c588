"""Replies cut short and checksums on the wire, without a server: the reply checks of
store/_reply.py under the store's retry policy, and verify-after-write over MemoryStore."""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from s3ckpt import _crc
from s3ckpt._verify import verify_objects, verify_wanted
from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.errors import ChecksumMismatchError, ConfigError, TransientStoreError
from s3ckpt.format._manifest import Manifest
from s3ckpt.store import MemoryStore, _reply
from s3ckpt.store._errors import is_transient, timeout_kind
from s3ckpt.store._request import call
from s3ckpt.store.retry import RetryPolicy
from s3ckpt.uri import parse_url
from tests.unit._memory_dcp import URL, make_state, save

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
TC = TransferConfig(retry_initial_delay=0.001, retry_max_delay=0.002)

# A complete reply of each kind, and its check.
GOOD: list[tuple[str, dict[str, Any], Any]] = [
    (
        "put",
        {"ETag": '"e"', "ChecksumCRC32C": "AAAAAA=="},
        lambda r: _reply.check_written(
            r, operation="put", bucket="b", key="k", sent_crc32c="AAAAAA=="
        ),
    ),
    ("create", {"UploadId": "u"}, lambda r: _reply.check_create(r, bucket="b", key="k")),
    (
        "complete",
        {"ETag": '"e-2"'},
        lambda r: _reply.check_complete(r, bucket="b", key="k", part_checksums=None),
    ),
    (
        "head",
        {"ContentLength": 3, "LastModified": NOW, "ETag": '"e"'},
        lambda r: _reply.check_head(r, bucket="b", key="k"),
    ),
    (
        "get",
        {"Body": object(), "ContentLength": 3},
        lambda r: _reply.check_body(r, bucket="b", key="k"),
    ),
    (
        "list",
        {
            "IsTruncated": True,
            "NextContinuationToken": "t",
            "KeyCount": 2,
            "Contents": [{"Key": "p/a", "Size": 1, "LastModified": NOW}],
            "CommonPrefixes": [{"Prefix": "p/d/"}],
        },
        lambda r: _reply.check_list_page(r, bucket="b", prefix="p/"),
    ),
    (
        "uploads",
        {"IsTruncated": False, "Uploads": [{"Key": "p/a", "UploadId": "u"}]},
        lambda r: _reply.check_uploads_page(r, bucket="b", prefix="p/"),
    ),
    (
        "delete",
        {"Deleted": [{"Key": "a"}], "Errors": [{"Key": "b", "Code": "AccessDenied"}]},
        lambda r: _reply.check_deleted(r, bucket="b", keys=["a", "b"]),
    ),
]


@pytest.mark.parametrize(("name", "reply", "check"), GOOD, ids=[g[0] for g in GOOD])
def test_a_complete_reply_passes(name: str, reply: dict[str, Any], check: Any) -> None:
    check(reply)


@pytest.mark.parametrize(("name", "reply", "check"), GOOD, ids=[g[0] for g in GOOD])
def test_a_reply_cut_inside_its_headers_is_a_transient_error(
    name: str, reply: dict[str, Any], check: Any
) -> None:
    """What botocore makes of a reply cut inside its headers: a dict without the fields."""
    with pytest.raises(_reply.IncompleteReplyError) as info:
        check({"ResponseMetadata": {"HTTPStatusCode": 200}})
    assert is_transient(info.value)
    assert isinstance(info.value, TransientStoreError)
    assert "cut short" in str(info.value) and "s3://b/" in str(info.value)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_dropping_or_garbling_any_field_of_a_listing_is_caught(data: st.DataObject) -> None:
    reply: dict[str, Any] = {
        "IsTruncated": True,
        "NextContinuationToken": "t",
        "KeyCount": 2,
        "Contents": [{"Key": "p/a", "Size": 1, "LastModified": NOW}],
        "CommonPrefixes": [{"Prefix": "p/d/"}],
    }
    paths = [
        ("IsTruncated",),
        ("NextContinuationToken",),
        ("KeyCount",),
        ("CommonPrefixes", 0, "Prefix"),
    ]
    paths += [("Contents", 0, f) for f in ("Key", "Size", "LastModified")]
    path = data.draw(st.sampled_from(paths))
    garbage_for = {
        "IsTruncated": [None, "true", 1],
        "KeyCount": [None, 99, "x"],
        "Size": [None, -1, "x", 3.5, True],
        "LastModified": [None, "x", 1],
    }
    garbage = data.draw(st.sampled_from(garbage_for.get(path[-1], [None, "", 1, []])))
    node: Any = reply
    for step in path[:-1]:
        node = node[step]
    if garbage is None:
        del node[path[-1]]
    else:
        node[path[-1]] = garbage
    if path == ("KeyCount",) and garbage is None:
        _reply.check_list_page(reply, bucket="b", prefix="p/")  # KeyCount is optional
        return
    with pytest.raises(_reply.IncompleteReplyError):
        _reply.check_list_page(reply, bucket="b", prefix="p/")


def test_a_reply_echoing_another_checksum_is_retried() -> None:
    """The store computed another CRC32C than the one sent: the body was corrupted on the
    way; the request is sent again and succeeds once the echo matches."""
    sent = base64.b64encode(_crc.crc32c(b"body").to_bytes(4, "big")).decode()
    replies = iter(
        [{"ETag": '"1"', "ChecksumCRC32C": "AAAAAA=="}, {"ETag": '"2"', "ChecksumCRC32C": sent}]
    )

    def attempt() -> str:
        return _reply.check_written(
            next(replies), operation="put", bucket="b", key="k", sent_crc32c=sent
        )

    etag, attempts = call(
        attempt,
        operation="put",
        bucket="b",
        key="k",
        endpoint=None,
        config=TC,
        policy=RetryPolicy.of(TC, timeout_kind=timeout_kind, sleep=lambda s: None),
    )
    assert (etag, attempts) == ('"2"', 2)


def test_a_checksum_echo_that_never_matches_fails_transient() -> None:
    def attempt() -> str:
        return _reply.check_written(
            {"ETag": '"1"', "ChecksumCRC32C": "AAAAAA=="},
            operation="upload_part",
            bucket="b",
            key="k",
            sent_crc32c="AQIDBA==",
        )

    with pytest.raises(_reply.WireChecksumError, match="corrupted in transit"):
        call(
            attempt,
            operation="upload_part",
            bucket="b",
            key="k",
            endpoint=None,
            config=TC,
            policy=RetryPolicy.of(TC, timeout_kind=timeout_kind, sleep=lambda s: None),
        )


def test_composite_checksum_of_parts() -> None:
    parts = [base64.b64encode(_crc.crc32c(p).to_bytes(4, "big")).decode() for p in (b"a", b"b")]
    raw = b"".join(base64.b64decode(p) for p in parts)
    want = base64.b64encode(_crc.crc32c(raw).to_bytes(4, "big")).decode() + "-2"
    assert _reply.composite_crc32c(parts) == want
    ok = {"ETag": '"e-2"', "ChecksumCRC32C": want}
    _reply.check_complete(ok, bucket="b", key="k", part_checksums=parts)
    with pytest.raises(_reply.WireChecksumError):
        _reply.check_complete(
            {**ok, "ChecksumCRC32C": "AAAAAA==-2"}, bucket="b", key="k", part_checksums=parts
        )


def test_verify_after_write_setting() -> None:
    assert S3Config().verify_after_write is None
    with pytest.raises(ConfigError):
        S3Config(verify_after_write="yes")  # type: ignore[arg-type]
    store = MemoryStore()
    assert verify_wanted(store, None, "k") is False  # no S3 wire
    assert verify_wanted(store, True, "k") is True


def _saved() -> tuple[MemoryStore, Manifest]:
    store = MemoryStore()
    writer = save(store, make_state())
    assert writer.last_manifest is not None
    return store, writer.last_manifest


def test_verify_objects_passes_a_sound_save() -> None:
    store, manifest = _saved()
    verify_objects(store, parse_url(URL), manifest)


@pytest.mark.parametrize("where", ["first", "middle", "last", "metadata"])
def test_verify_objects_names_the_object_item_and_rank_of_a_flipped_byte(where: str) -> None:
    store, manifest = _saved()
    url = parse_url(URL)
    if where == "metadata":
        key, at = url.key(manifest.metadata_key), manifest.metadata_size // 2
    else:
        item = max(manifest.items, key=lambda i: i.length)
        key = manifest.object_key(url.prefix, item.object)
        at = {"first": item.start, "middle": item.start + item.length // 2}.get(
            where, item.start + item.length - 1
        )
    data = bytearray(store.get(key))
    data[at] ^= 0xFF
    store.put(key, bytes(data))
    with pytest.raises(ChecksumMismatchError) as info:
        verify_objects(store, url, manifest)
    assert info.value.key == key
    assert "was sent" in str(info.value) and "previous checkpoint is intact" in str(info.value)
    if where != "metadata":
        assert info.value.rank == 0 and info.value.item == repr(item.fqn)


def test_a_save_with_verify_on_reads_everything_back_and_commits() -> None:
    reads = []
    for verify in (False, True):
        store = MemoryStore()
        writer = save(store, make_state(), s3_config=S3Config(verify_after_write=verify))
        assert writer.last_manifest is not None
        reads.append(store.calls.get("get", 0))
    assert reads[1] >= reads[0] + len(writer.last_manifest.objects) + 1
