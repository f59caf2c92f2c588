"""``s3ckpt doctor`` against MemoryStore and local folders: every row, what fails it, the
exit codes, the cleanup (also after a failure and Ctrl-C), and that it runs without torch.

Against moto over HTTP (credentials, endpoint, a store that strips conditional headers):
tests/integration/test_doctor_s3.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from s3ckpt.cli import main
from s3ckpt.errors import AccessDeniedError, NoSuchBucketError, StoreError
from s3ckpt.retention._liveness import MIN_GRACE
from s3ckpt.store import Location, MemoryStore
from s3ckpt.tools import run_doctor
from s3ckpt.tools._doctor_report import Check, CheckStatus, DoctorReport
from s3ckpt.tools._doctor_store import WARN_SKEW
from s3ckpt.uri import parse_url

ROOT = Path(__file__).resolve().parents[2]
URL = parse_url("s3://bkt/runs/")

OK, FAIL, WARN, SKIP = CheckStatus.OK, CheckStatus.FAIL, CheckStatus.WARN, CheckStatus.SKIP

ROWS = [
    "credentials",
    "endpoint",
    "clock skew",
    "conditional create",
    "conditional replace",
    "conditional delete",
    "checksum echo",
    "checksum verification",
    "list uploads",
    "listing",
    "versioning",
    "permission put",
    "permission head",
    "permission get",
    "permission list",
    "permission multipart",
    "permission list uploads",
    "permission abort",
    "permission delete",
    "round trip",
    "torch",
    "cleanup",
]


def doctor(store: MemoryStore, **kw: object) -> DoctorReport:
    """The raw round trip (no torch import: these tests stay fast)."""
    return run_doctor(Location.of(URL, store=store), use_torch=False, **kw)


def status(report: DoctorReport) -> dict[str, CheckStatus]:
    return {c.name: c.status for c in report.checks}


def empty(store: MemoryStore) -> bool:
    return not store.objects and not store.uploads


def test_a_store_that_keeps_its_promises_passes_every_check_and_keeps_nothing() -> None:
    store = MemoryStore("bkt")
    store.objects.clear()
    seen: list[Check] = []
    report = doctor(store, on_check=seen.append)
    assert [c.name for c in report.checks] == ROWS
    assert seen == list(report.checks)  # each row reached the caller as it completed
    assert report.ok and report.verdict == "ok" and report.left_behind == ()
    skipped = {c.name: c.detail for c in report.checks if c.status is not OK}
    # A memory store has no credentials, endpoint or checksum headers; torch not asked.
    assert set(skipped) == {
        "credentials",
        "endpoint",
        "checksum echo",
        "checksum verification",
        "versioning",
        "torch",
    }, skipped
    assert all("not" in d for d in skipped.values()), skipped
    assert report.scratch.startswith("s3://bkt/runs/s3ckpt-doctor-")
    assert empty(store)


def test_a_location_is_the_one_argument_the_doctor_needs() -> None:
    store = MemoryStore("bkt")
    store.objects.clear()
    report = run_doctor(Location.of(URL, store=store), use_torch=False)
    assert [c.name for c in report.checks] == ROWS and report.ok
    assert report.url == str(URL) and report.scratch.startswith(f"{URL}s3ckpt-doctor-")
    assert empty(store)


def test_a_store_that_ignores_conditional_writes_fails_and_says_what_it_means() -> None:
    store = MemoryStore("bkt-ignores", ignore_conditions=True)
    report = doctor(store)
    rows = {c.name: c for c in report.checks}
    assert rows["conditional create"].status is FAIL
    assert rows["conditional replace"].status is FAIL
    assert "single" in rows["conditional create"].meaning  # the opt-in is named
    assert not report.ok and {c.name for c in report.failed} >= {
        "conditional create",
        "conditional replace",
    }
    assert empty(store)


def test_missing_conditional_deletes_and_list_uploads_are_warnings_not_failures() -> None:
    store = MemoryStore("bkt-old", conditional_deletes=False, list_uploads=False)
    report = doctor(store)
    got = status(report)
    assert got["conditional delete"] is WARN
    assert got["list uploads"] is WARN
    assert got["permission list uploads"] is WARN  # 501, not a denial
    assert got["permission abort"] is OK
    assert report.ok, report.failed
    assert empty(store)


def denied(key: str) -> BaseException:
    return AccessDeniedError("denied", bucket="bkt", key=key, code="AccessDenied")


def test_a_denied_delete_fails_its_row_and_cleanup_says_what_is_left() -> None:
    store = MemoryStore("bkt-nodelete")
    store.inject("delete_key", denied, times=1000)
    report = doctor(store)
    rows = {c.name: c for c in report.checks}
    assert rows["permission delete"].status is FAIL
    assert "s3:DeleteObject" in rows["permission delete"].meaning
    assert "prune" in rows["permission delete"].meaning  # who is hurt
    assert rows["cleanup"].status is WARN
    assert set(report.left_behind) == set(store.objects) != set()
    assert "remove everything under s3://bkt/runs/s3ckpt-doctor-" in rows["cleanup"].meaning
    assert not store.uploads  # uploads are aborted whatever else fails


def test_a_denied_put_skips_what_depends_on_it() -> None:
    store = MemoryStore("bkt-noput")
    store.inject("put", denied, key_glob="*/perm/*", times=1000)
    got = status(doctor(store))
    assert got["permission put"] is FAIL
    assert [got[f"permission {n}"] for n in ("head", "get", "list", "delete")] == [SKIP] * 4
    assert got["permission multipart"] is OK
    assert empty(store)


def test_interrupted_the_scratch_prefix_is_still_removed() -> None:
    store = MemoryStore("bkt-interrupt")

    def interrupt(key: str) -> BaseException:
        return KeyboardInterrupt()

    # Ctrl-C in the middle of the round trip's multipart upload: one upload is open.
    store.inject("upload_part", interrupt, key_glob="*/roundtrip/*")
    seen: list[Check] = []
    with pytest.raises(KeyboardInterrupt):
        doctor(store, on_check=seen.append)
    assert seen[-1].name == "cleanup" and seen[-1].status is OK, seen[-1]
    assert empty(store)


def test_a_second_interrupt_during_cleanup_says_where_the_rest_is() -> None:
    store = MemoryStore("bkt-interrupt-twice")

    def interrupt(key: str) -> BaseException:
        return KeyboardInterrupt()

    store.inject("upload_part", interrupt, key_glob="*/roundtrip/*")
    store.inject("abort_multipart", interrupt, key_glob="*/roundtrip/*")  # in the cleanup
    seen: list[Check] = []
    with pytest.raises(KeyboardInterrupt):
        doctor(store, on_check=seen.append)
    last = seen[-1]
    assert last.name == "cleanup" and last.status is WARN, last
    assert "interrupted" in last.detail and "s3://bkt/runs/s3ckpt-doctor-" in last.detail


def test_a_failed_request_is_a_failed_row_and_cleanup_still_runs() -> None:
    store = MemoryStore("bkt-dies")
    store.inject("get", lambda key: StoreError("boom", code="InternalError"), key_glob="*/perm/*")
    report = doctor(store)  # a failed GET is a failed row, not a crash
    assert status(report)["permission get"] is FAIL
    assert empty(store)


def test_a_missing_bucket_raises_before_anything_is_written_or_reported() -> None:
    store = MemoryStore("nosuch")
    store.inject("list", lambda key: NoSuchBucketError("no bucket", code="NoSuchBucket"))
    seen: list[Check] = []
    with pytest.raises(NoSuchBucketError):
        doctor(store, on_check=seen.append)
    assert seen == [] and empty(store)


def skewed(seconds: float) -> MemoryStore:
    """A store whose clock is ``seconds`` behind this host's (a host ``seconds`` fast)."""
    return MemoryStore(f"bkt-skew-{seconds}", clock=lambda: time.time() - seconds)


def expected_skew_status(seconds: float) -> CheckStatus:
    if abs(seconds) > MIN_GRACE.total_seconds():
        return FAIL
    return WARN if abs(seconds) > WARN_SKEW.total_seconds() else OK


@settings(max_examples=25, deadline=None)
@given(
    st.floats(min_value=-7200, max_value=7200).filter(
        lambda s: all(abs(abs(s) - edge) > 0.5 for edge in (5, MIN_GRACE.total_seconds()))
    )
)
def test_clock_skew_is_ok_a_warning_or_a_failure_by_its_size(seconds: float) -> None:
    from s3ckpt.tools._doctor_store import clock_row

    row = clock_row(skewed(seconds), "runs/")
    assert row.status is expected_skew_status(seconds), (seconds, row)
    if row.status is FAIL:
        assert "NTP" in row.meaning and "refuse" in row.meaning
    if abs(seconds) >= 1:
        assert ("ahead of" if seconds > 0 else "behind") in row.detail


def test_a_host_two_hours_fast_fails_the_run() -> None:
    report = doctor(skewed(7200))
    assert [c.name for c in report.failed] == ["clock skew"]


def test_report_json_has_one_object_per_check_and_the_verdict() -> None:
    report = doctor(MemoryStore("bkt-json", ignore_conditions=True))
    doc = json.loads(json.dumps(report.to_dict()))
    assert doc["verdict"] == "fail" and "conditional create" in doc["failed"]
    assert [c["name"] for c in doc["checks"]] == ROWS
    for c in doc["checks"]:
        assert set(c) == {"name", "status", "detail", "meaning"}
        assert c["status"] in {"ok", "fail", "warn", "skip"}
        assert (c["meaning"] != "") == (c["status"] in {"fail", "warn"}), c


# -- the command -------------------------------------------------------------------------------
def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def no_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command as the cron image runs it: no torch to round-trip through."""
    from s3ckpt.tools import _doctor_checks

    monkeypatch.setattr(_doctor_checks, "_torch_available", lambda: False)


def test_cli_on_a_local_folder_json_exit_0_and_nothing_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_torch: None
) -> None:
    code, out, _ = run_cli(capsys, "doctor", str(tmp_path), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["exit_code"] == 0 and doc["verdict"] == "ok", out
    torch_row = next(c for c in doc["checks"] if c["name"] == "torch")
    assert torch_row["status"] == "skip" and "not installed" in torch_row["detail"]
    assert list(tmp_path.iterdir()) == []  # files and the scratch folders are gone


def test_cli_table_marks_rows_and_explains_failures(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, no_torch: None
) -> None:
    store = MemoryStore("bkt-cli", ignore_conditions=True)
    _serve(monkeypatch, store)
    code, out, err = run_cli(capsys, "doctor", "s3://bkt-cli/runs/")
    assert code == 1 and err == "", err
    lines = out.splitlines()
    assert lines[0] == "s3ckpt doctor s3://bkt-cli/runs/"
    create = next(i for i, line in enumerate(lines) if "conditional create" in line)
    assert lines[create].startswith("✘ ")
    assert lines[create + 1].lstrip().startswith("-> ") and "single" in lines[create + 1]
    assert any(line.startswith("✔ permission put") for line in lines)
    assert any(line.startswith("\u2013 torch") for line in lines)
    assert lines[-1].startswith("verdict: NOT SAFE") and "conditional create" in lines[-1]
    assert empty(store)


def test_cli_missing_bucket_is_exit_3_with_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = MemoryStore("nosuch")
    store.inject("list", lambda key: NoSuchBucketError("no such bucket", code="NoSuchBucket"))
    _serve(monkeypatch, store)
    code, out, err = run_cli(capsys, "doctor", "s3://nosuch/runs/", "--json")
    assert code == 3 and out == "" and err.count("\n") == 1 and "no such bucket" in err


def test_cli_bad_input_is_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for argv in (
        ["doctor", "http://host/x"],
        ["doctor", str(tmp_path / "missing")],
        ["doctor"],
        ["doctor", "s3://bucket/runs/", "--profile", "no-such-profile"],
    ):
        code, out, _ = run_cli(capsys, *argv)
        assert code == 2 and out == "", (argv, out)


def test_cli_help_documents_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "doctor", "--help")
    text = " ".join(out.split())
    assert code == 0
    for item in ("0 every check passed", "1 a check failed", "2 bad input", "3 the store"):
        assert item in text, item


def _serve(monkeypatch: pytest.MonkeyPatch, store: MemoryStore) -> None:
    """Make the command open ``store`` for any URL."""
    from s3ckpt._cli import doctor as cli_doctor

    def opened(args: object, location: str, **_: object) -> Location:
        return Location.of(parse_url(location), store=store)

    monkeypatch.setattr(cli_doctor, "open_location", opened)


def test_the_command_runs_without_torch(tmp_path: Path) -> None:
    """The cron image has no torch: the command imports and runs without it."""
    code = (
        "import sys\n"
        "sys.modules['torch'] = None  # import torch raises ImportError\n"
        "from s3ckpt.cli import main\n"
        "code = main(['doctor', sys.argv[1], '--json'])\n"
        "assert not [m for m in sys.modules if m.startswith('torch') and sys.modules[m]]\n"
        "sys.exit(code)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    rows = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert rows["round trip"]["status"] == "ok" and "CRC32C" in rows["round trip"]["detail"]
    assert rows["torch"]["detail"].startswith("not installed")
