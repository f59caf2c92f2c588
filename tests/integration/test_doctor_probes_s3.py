"""``s3ckpt doctor`` on moto (issue 38 item 2, issue 37 item 9): the conditional rows race
and pass, another process's upload is listed, the delimited listing comes back whole, and
the versioning row says what prune frees with versioning off, Enabled and Suspended."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from s3ckpt.cli import main
from s3ckpt.store._versions import clear_versioning_cache

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _fresh_versioning() -> Iterator[None]:
    clear_versioning_cache()
    yield
    clear_versioning_cache()


def doctor_rows(capsys: pytest.CaptureFixture[str], url: str) -> tuple[int, dict[str, Any]]:
    code = main(["doctor", url, "--json"])
    doc = json.loads(capsys.readouterr().out)
    return code, {c["name"]: c for c in doc["checks"]}


def test_the_races_listing_and_other_process_upload_pass_on_moto(
    bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, rows = doctor_rows(capsys, f"s3://{bucket}/runs/")
    assert code == 0
    for name in ("conditional create", "conditional replace", "conditional delete"):
        assert rows[name]["status"] == "ok" and "each of 8 races" in rows[name]["detail"]
    assert rows["list uploads"]["status"] == "ok", rows["list uploads"]
    assert "another process" in rows["list uploads"]["detail"]
    assert rows["listing"]["status"] == "ok", rows["listing"]
    assert rows["versioning"]["status"] == "ok" and "never enabled" in rows["versioning"]["detail"]


@pytest.mark.parametrize("status", ["Enabled", "Suspended"])
def test_a_versioned_bucket_warns_what_prune_leaves(
    status: str, bucket: str, s3_client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    s3_client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": status})
    code, rows = doctor_rows(capsys, f"s3://{bucket}/runs/")
    row = rows["versioning"]
    assert code == 0 and row["status"] == "warn", row
    assert row["detail"].startswith(f"{status}:") and "noncurrent versions" in row["detail"]
    assert "lifecycle rule" in row["meaning"] and "operations.md" in row["meaning"]
