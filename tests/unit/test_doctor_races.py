"""``s3ckpt doctor`` proves rather than recites (issue 38 items 2, 5; issue 37 item 9): the
conditional rows race pairs of requests (a check-then-write store fails them, an atomic one
passes, and the save path's probe agrees), ListMultipartUploads counts only another
process's upload, the delimited listing probe catches a dropped folder, and a store without
versions skips the versioning row. Against moto: tests/integration/test_doctor_probes_s3.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from s3ckpt.errors import ConditionalWritesError, ObjectNotFoundError, PreconditionFailedError
from s3ckpt.store import Location, MemoryStore, ObjectInfo
from s3ckpt.store._capabilities import clear_capabilities_cache, race, require_conditional_writes
from s3ckpt.store._known import cached_capabilities
from s3ckpt.tools import run_doctor
from s3ckpt.tools._doctor_report import CheckStatus, DoctorReport
from s3ckpt.tools._doctor_store import RACE_PAIRS
from s3ckpt.uri import parse_url

URL = parse_url("s3://bkt/runs/")
CONDITIONAL = ("conditional create", "conditional replace", "conditional delete")


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    clear_capabilities_cache()
    yield
    clear_capabilities_cache()


class CheckThenWrite(MemoryStore):
    """A deliberately non-atomic store: a conditional PUT checks, waits, then writes (as
    FsspecStore did before issue 38). Alone it answers 412 as it must."""

    def put(  # type: ignore[override]
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
        crc32c: int | None = None,
    ) -> str:
        info = self.head(key)
        if if_none_match and info is not None:
            raise PreconditionFailedError("exists", bucket=self.bucket, key=key)
        if if_match is not None:
            if info is None:
                raise ObjectNotFoundError("gone", bucket=self.bucket, key=key)
            if info.etag != if_match:
                raise PreconditionFailedError("changed", bucket=self.bucket, key=key)
        if if_none_match or if_match is not None:
            time.sleep(0.02)  # the gap between the check and the write
        return super().put(key, data, crc32c=crc32c)


def doctor(store: MemoryStore) -> DoctorReport:
    return run_doctor(Location.of(URL, store=store), use_torch=False)


def rows(report: DoctorReport) -> dict[str, tuple[CheckStatus, str]]:
    return {c.name: (c.status, c.detail) for c in report.checks}


def test_a_check_then_write_store_fails_every_race_and_saves_refuse_too() -> None:
    store = CheckThenWrite("bkt-racy")
    got = rows(doctor(store))
    for name in CONDITIONAL:
        status, detail = got[name]
        want = CheckStatus.WARN if name == "conditional delete" else CheckStatus.FAIL
        assert status is want, (name, detail)
        assert f"of {RACE_PAIRS} had two winners" in detail and "check then a write" in detail
    # The save path agrees: after doctor the process knows (the verdict is cached), and a
    # save on this store is refused.
    caps = cached_capabilities(store)
    assert caps is not None and not caps.conditional_writes
    with pytest.raises(ConditionalWritesError):
        require_conditional_writes(store, "runs/step_1/s3ckpt.alive.x.0", what="a save", body=b"x")
    assert not store.uploads


def test_a_save_pays_for_no_race() -> None:
    """A save's own probe sends one create, not a race: two concurrent creates on a test
    server whose conditional check is not atomic under load (moto) would refuse saves at
    random; doctor races, and its verdict is cached for the saves of its process."""
    store = MemoryStore("bkt-cost")
    require_conditional_writes(store, "runs/step_1/hb", what="a save", body=b"hb")
    # HEAD, the create, If-None-Match again (412), If-Match with a wrong ETag (412), LIST
    assert store.calls.get("put") == 3, store.calls
    caps = cached_capabilities(store)
    assert caps is not None and caps.conditional_writes and caps.race("create") is None


def test_an_atomic_store_passes_every_race() -> None:
    store = MemoryStore("bkt-atomic")
    report = doctor(store)
    for name in CONDITIONAL:
        status, detail = rows(report)[name]
        assert status is CheckStatus.OK and f"each of {RACE_PAIRS} races" in detail, detail
    assert not store.objects and not store.uploads  # the race keys are cleaned up too


@pytest.mark.parametrize("scheme", ["file", "memory"])
def test_fsspec_stores_pass_the_races_even_when_forced(
    scheme: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """file:// and memory:// commit atomically (issue 38 item 1): a pause between the
    check and the write (forcing the race) still lets one writer win."""
    from s3ckpt.store import _fsspec_commit

    monkeypatch.setattr(_fsspec_commit, "RACE_PAUSE", 0.01)
    url = tmp_path.as_uri() + "/" if scheme == "file" else f"memory://bkt-{tmp_path.name}/runs/"
    report = run_doctor(Location.of(url), use_torch=False)
    for name in CONDITIONAL:
        status, detail = rows(report)[name]
        assert status is CheckStatus.OK, (name, detail)


def test_a_race_counts_what_it_sees() -> None:
    result = race(CheckThenWrite("bkt-count"), "k", "create", pairs=3)
    assert (result.both_won, result.none_won, result.atomic) == (3, 0, False)
    assert result.describe().endswith("3 of 3 had two winners")
    assert race(MemoryStore("bkt-count2"), "k", "replace", pairs=3).atomic


def test_list_uploads_needs_another_processs_upload(tmp_path: Path) -> None:
    """A registry of uploads inside one process does not count (FsspecStore's): the row
    opens the upload from a real second process."""
    report = run_doctor(Location.of(tmp_path.as_uri() + "/"), use_torch=False)
    status, detail = rows(report)["list uploads"]
    assert status is CheckStatus.WARN and "another process" in detail, detail
    assert list(tmp_path.iterdir()) == []  # the other process aborted its upload
    # MemoryStore is the server itself: its one registry is every client's.
    assert rows(doctor(MemoryStore("bkt-up")))["list uploads"][0] is CheckStatus.OK


class DropsAFolder(MemoryStore):
    """A listing that loses a run's second checkpoint (a store's listing defect)."""

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        for obj in super().list(prefix):
            if not (prefix.endswith("/listing/") and "/step_000000200/" in obj.key):
                yield obj


def test_the_listing_probe_catches_a_dropped_folder() -> None:
    status, detail = rows(doctor(DropsAFolder("bkt-drop")))["listing"]
    assert status is CheckStatus.FAIL and "missing" in detail and "step_000000200/" in detail
    assert rows(doctor(MemoryStore("bkt-list")))["listing"][0] is CheckStatus.OK


def test_versioning_is_skipped_where_the_store_keeps_no_versions() -> None:
    status, detail = rows(doctor(MemoryStore("bkt-ver")))["versioning"]
    assert status is CheckStatus.SKIP and "no object versions" in detail


def test_a_405_on_abort_says_unsupported_not_a_permission() -> None:
    """s3rver answers AbortMultipartUpload 405 MethodNotAllowed (S3Store keeps the code)."""
    from s3ckpt.errors import StoreError

    store = MemoryStore("bkt-405")
    store.inject(
        "abort_multipart",
        lambda key: StoreError("Method Not Allowed", key=key, code="MethodNotAllowed"),
        times=1000,
    )
    report = doctor(store)
    row = next(c for c in report.checks if c.name == "permission abort")
    assert row.status is CheckStatus.WARN, row
    assert (
        "does not support AbortMultipartUpload" in row.detail and "not a permission" in row.detail
    )
    assert "lifecycle rule" in row.meaning and "grant" not in row.meaning
    cleanup = next(c for c in report.checks if c.name == "cleanup")
    assert "abort-multipart-upload" not in cleanup.meaning, cleanup
