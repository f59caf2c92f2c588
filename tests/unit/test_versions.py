"""Noncurrent versions where they cannot be counted: a memory or file store (no versions), a
role without the permission, a store that does not implement the request; and which
lifecycle rules expire them (tests/integration/test_versions_s3.py counts them on moto)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import pytest

from s3ckpt.cli import main
from s3ckpt.errors import AccessDeniedError, UnsupportedOperationError
from s3ckpt.store import open_store
from s3ckpt.store._versions import (
    Status,
    VersionedStore,
    _expiry_rules,
    bucket_versioning,
    noncurrent_versions,
)
from tests._retention_util import write_checkpoint


class FakeVersioned:
    """A versioned bucket with one noncurrent version under ``r/``, whose requests may fail."""

    bucket = "b"

    def __init__(self, fail: dict[str, Exception] | None = None) -> None:
        self.fail = fail or {}

    def _maybe(self, op: str) -> None:
        if op in self.fail:
            raise self.fail[op]

    def versioning_status(self) -> Status | None:
        self._maybe("get_bucket_versioning")
        return "Enabled"

    def list_noncurrent(self, prefix: str) -> Iterator[tuple[str, int | None]]:
        self._maybe("list_object_versions")
        yield f"{prefix}k", 100
        yield f"{prefix}k", None

    def noncurrent_expiry_days(self, prefix: str) -> int | None:
        self._maybe("get_bucket_lifecycle_configuration")
        return 7


def denied(op: str) -> AccessDeniedError:
    return AccessDeniedError("denied", bucket="b", operation=op, code="AccessDenied")


def test_a_memory_store_says_it_keeps_no_versions(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"memory://versions-{uuid.uuid4().hex[:8]}/run/"
    store, run = open_store(url)
    write_checkpoint(store, run, 1, created=time.time(), data_objects=1)
    assert not isinstance(store, VersionedStore) and bucket_versioning(store) is None
    v = noncurrent_versions(store, [run.prefix])
    assert (v.status, v.of(run.prefix), v.sentence()) == ("none", None, "")
    assert main(["ls", url, "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)["runs"]
    assert listed["versioning"] == "none" and listed["noncurrent_bytes"] is None
    assert "memory:// stores keep no object versions" in listed["versions_note"]


def test_counted_on_a_versioned_store() -> None:
    v = noncurrent_versions(FakeVersioned(), ["r/"])
    assert v.to_dict("r/") == {
        "versioning": "Enabled",
        "noncurrent_versions": 1,
        "noncurrent_bytes": 100,
        "delete_markers": 1,
        "noncurrent_expiration_days": 7,
        "versions_note": "",
    }
    assert "100 B stays as 1 noncurrent version until the lifecycle rule" in v.sentence("r/")


@pytest.mark.parametrize(
    ("op", "action"),
    [
        ("get_bucket_versioning", "s3:GetBucketVersioning"),
        ("list_object_versions", "s3:ListBucketVersions"),
    ],
)
def test_a_role_without_the_permission_is_told_not_counted(op: str, action: str) -> None:
    store = FakeVersioned({op: denied(op)})
    v = noncurrent_versions(store, ["r/"])
    assert v.status == "unknown" and v.to_dict("r/")["noncurrent_bytes"] is None
    assert v.sentence("r/").startswith("noncurrent versions not counted: permission denied")
    assert action in v.sentence("r/")


def test_bucket_versioning_raises_on_a_permission_error() -> None:
    with pytest.raises(AccessDeniedError):
        bucket_versioning(FakeVersioned({"get_bucket_versioning": denied("x")}))  # type: ignore[arg-type]
    assert bucket_versioning(FakeVersioned()) == "Enabled"  # type: ignore[arg-type]


def test_a_store_without_the_request_and_unreadable_rules() -> None:
    nope = UnsupportedOperationError("501", bucket="b", operation="list_object_versions")
    v = noncurrent_versions(FakeVersioned({"list_object_versions": nope}), ["r/"])
    assert v.status == "unsupported" and "does not implement list_object_versions" in v.reason
    # Counted, but the lifecycle rules could not be read: the bytes, and why no end is known.
    store = FakeVersioned({"get_bucket_lifecycle_configuration": denied("x")})
    v = noncurrent_versions(store, ["r/"])
    assert v.to_dict("r/")["noncurrent_bytes"] == 100 and v.expire_days is None
    assert "until deleted (lifecycle rules: permission denied" in v.sentence("r/")


def test_which_lifecycle_rules_expire_noncurrent_versions() -> None:
    expire = {"NoncurrentVersionExpiration": {"NoncurrentDays": 3}, "Status": "Enabled"}
    rules = [
        {**expire, "Filter": {"Prefix": "runs/"}},
        {**expire, "Prefix": "old/"},  # the rule-level prefix of the first API version
        {**expire, "Filter": {"Tag": {"Key": "k", "Value": "v"}}},  # not every object
        {**expire, "Filter": {"And": {"Prefix": "", "Tags": []}}},
        {**expire, "Status": "Disabled", "Filter": {"Prefix": ""}},
        {"Status": "Enabled", "Filter": {"Prefix": ""}, "Expiration": {"Days": 1}},
    ]
    assert _expiry_rules({"Rules": rules}) == (("runs/", 3), ("old/", 3))


def test_ls_says_once_that_it_could_not_count(capsys: pytest.CaptureFixture[str]) -> None:
    from s3ckpt._cli._retention_output import print_ls
    from s3ckpt.retention._catalog import RunCatalog
    from s3ckpt.uri import StoreURL

    runs = [RunCatalog(StoreURL("s3", "b", f"runs/{r}/"), ()) for r in "ab"]
    counted = noncurrent_versions(FakeVersioned(), [c.run.prefix for c in runs])
    print_ls(runs[0].run.parent, runs, counted)
    out = capsys.readouterr().out
    assert out.count("100 B stays as 1 noncurrent version") == 2, out  # one per run
    refused = noncurrent_versions(FakeVersioned({"get_bucket_versioning": denied("x")}), ["a/"])
    print_ls(runs[0].run.parent, runs, refused)
    out = capsys.readouterr().out
    assert out.count("noncurrent versions not counted: permission denied") == 1, out
