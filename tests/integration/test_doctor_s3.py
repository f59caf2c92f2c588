"""``s3ckpt doctor`` against the moto S3 server over HTTP: every row passes (or says why
not), secrets never show, nothing is left under the prefix; through a FaultProxy that
strips conditional headers the conditional-write rows fail with exit 1; a missing bucket
is exit 3 with one line."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from s3ckpt.cli import main
from tests._helpers import list_keys, open_uploads
from tests.faultproxy import FaultProxy

pytestmark = pytest.mark.integration

# What moto honestly cannot do, with the reason the row gives.
MOTO_CAVEATS: dict[str, str] = {
    # moto stores an upload whose CRC32C is wrong (and echoes the wrong value back).
    "checksum verification": "accepted an upload whose CRC32C was wrong",
}


def doctor_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any], str]:
    code = main(["doctor", *argv, "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out else {}, err


def test_moto_passes_every_check_and_nothing_is_left(
    bucket: str, s3_client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    s3_client.put_object(Bucket=bucket, Key="runs/keep-me", Body=b"the user's own object")
    code, doc, _ = doctor_json(capsys, f"s3://{bucket}/runs/")
    rows = {c["name"]: c for c in doc["checks"]}
    not_ok = {n: c for n, c in rows.items() if c["status"] != "ok"}
    assert code == 0 and doc["verdict"] == "ok" and doc["exit_code"] == 0, not_ok
    assert set(not_ok) <= set(MOTO_CAVEATS), not_ok
    for name, why in MOTO_CAVEATS.items():
        assert rows[name]["status"] == "warn" and why in rows[name]["detail"], rows[name]
    assert rows["credentials"]["detail"].startswith("from env")
    assert "STS not asked (custom endpoint)" in rows["credentials"]["detail"]
    assert "path-style" in rows["endpoint"]["detail"] and "us-east-1" in rows["endpoint"]["detail"]
    assert "bit-exact" in rows["round trip"]["detail"]  # torch is installed here: dcp
    assert "torch" not in rows
    # Everything the checks wrote is gone; the user's object is untouched.
    assert list_keys(s3_client, bucket) == ["runs/keep-me"]
    assert open_uploads(s3_client, bucket) == []
    assert doc["left_behind"] == []


def test_secrets_never_show_and_the_key_id_at_most_its_last_four(
    bucket: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    key_id, secret = "AKIADOCTORTEST0WXYZ", "doctor/secret+Key0123456789abcdefghijk"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    code = main(["doctor", f"s3://{bucket}/"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "…WXYZ" in out
    assert key_id[:-4] not in out + err and secret not in out + err
    for part in (secret[:8], secret[-8:]):
        assert part not in out + err
    assert out.splitlines()[-1].startswith("verdict: this store will keep checkpoints safe")


def test_a_missing_bucket_is_exit_3_with_one_line(
    moto_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["doctor", "s3://no-such-bucket-doctor/runs/"])
    out, err = capsys.readouterr()
    assert code == 3 and out == "", out
    assert err.count("\n") == 1 and "NoSuchBucket" in err and err.startswith("s3ckpt: error: ")


def test_an_endpoint_that_is_down_is_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["doctor", "s3://bucket/runs/", "--endpoint-url", "http://127.0.0.1:9"])
    out, err = capsys.readouterr()
    assert code == 3 and out == "" and err.count("\n") == 1, err


def test_a_store_that_drops_conditional_headers_fails_with_exit_1(
    moto_endpoint: str, bucket: str, s3_client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    with FaultProxy(moto_endpoint, faults=["strip_conditions"], fault_rate=1.0) as proxy:
        code, doc, err = doctor_json(
            capsys, f"s3://{bucket}/runs/", "--endpoint-url", proxy.endpoint_url
        )
        assert proxy.stats["strip_conditions"] > 0
    rows = {c["name"]: c for c in doc["checks"]}
    assert code == 1 and doc["exit_code"] == 1 and doc["verdict"] == "fail", err
    assert rows["conditional create"]["status"] == "fail"
    assert rows["conditional replace"]["status"] == "fail"
    assert rows["conditional delete"]["status"] == "warn"
    assert {"conditional create", "conditional replace"} <= set(doc["failed"])
    assert "single" in rows["conditional create"]["meaning"]
    # A save through such a store refuses (naming conditional writes): the round trip says so.
    assert rows["round trip"]["status"] == "fail"
    assert rows["round trip"]["detail"] == "dcp.save refused: the store ignores conditional writes"
    assert list_keys(s3_client, bucket) == [] and open_uploads(s3_client, bucket) == []


def test_single_writer_mode_turns_the_missing_conditions_into_warnings(
    moto_endpoint: str, bucket: str, s3_client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    with FaultProxy(moto_endpoint, faults=["strip_conditions"], fault_rate=1.0) as proxy:
        code, doc, err = doctor_json(
            capsys, f"s3://{bucket}/runs/", "--endpoint-url", proxy.endpoint_url, "--single-writer"
        )
    rows = {c["name"]: c for c in doc["checks"]}
    assert code == 0 and doc["verdict"] == "ok", (err, doc["failed"])
    for name in ("conditional create", "conditional replace"):
        assert (
            rows[name]["status"] == "warn" and "single-writer mode is on" in rows[name]["meaning"]
        )
    assert rows["round trip"]["status"] == "ok"
    assert list_keys(s3_client, bucket) == [] and open_uploads(s3_client, bucket) == []


def test_a_store_without_list_multipart_uploads_warns_and_passes(
    moto_endpoint: str, bucket: str, s3_client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    with FaultProxy(moto_endpoint, fault_rate=0.0) as proxy:
        proxy.arm("ListMultipartUploads", "not_implemented", times=1000)
        code, doc, err = doctor_json(
            capsys, f"s3://{bucket}/runs/", "--endpoint-url", proxy.endpoint_url
        )
    rows = {c["name"]: c for c in doc["checks"]}
    assert code == 0 and doc["verdict"] == "ok", (err, doc["failed"])
    assert (
        rows["list uploads"]["status"] == "warn" and "lifecycle" in rows["list uploads"]["meaning"]
    )
    assert rows["permission list uploads"]["status"] == "warn"
    assert rows["permission abort"]["status"] == "ok"
    assert list_keys(s3_client, bucket) == [] and open_uploads(s3_client, bucket) == []


def test_the_addressing_style_is_the_one_really_used(
    bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert os.environ.get("AWS_ENDPOINT_URL")
    code, doc, _ = doctor_json(capsys, f"s3://{bucket}/", "--addressing-style", "path")
    endpoint = next(c for c in doc["checks"] if c["name"] == "endpoint")
    assert code == 0 and "path-style" in endpoint["detail"], endpoint
