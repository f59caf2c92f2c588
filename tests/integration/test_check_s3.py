"""``s3ckpt check`` over HTTP against the moto S3 server, on checkpoints DCP saved through
s3ckpt: a clean bucket passes; one flipped byte, a truncated object, a missing object and a
``.metadata`` that differs are each named (object, item, expected and found); ``ls`` marks
them from the run's ``s3ckpt.check.json`` until a check passes them; GLACIER objects are not
read; the JSON document and the metrics file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from s3ckpt import S3StorageWriter
from s3ckpt.cli import main
from s3ckpt.format._manifest import Manifest
from s3ckpt.format._names import CHECK_NAME, METADATA_NAME
from tests._helpers import boto_get, committed_manifest, list_keys

pytestmark = pytest.mark.integration


def save(url: str, step: int) -> None:
    g = torch.Generator().manual_seed(step)
    sd = {
        "model": {"w": torch.randn(64, 64, generator=g), "b": torch.randn(64, generator=g)},
        "optim": {"exp_avg": torch.randn(64, 64, generator=g)},
        "train_state": {"step": step},
    }
    dcp.save(sd, storage_writer=S3StorageWriter(url, step=step), no_dist=True)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def manifest(s3: Any, bucket: str, ckpt: str) -> Manifest:
    return committed_manifest(boto_get(s3, bucket), f"{ckpt}/")


def body(s3: Any, bucket: str, key: str) -> bytes:
    return s3.get_object(Bucket=bucket, Key=key)["Body"].read()  # type: ignore[no-any-return]


@pytest.fixture
def run(bucket: str) -> str:
    """``run/`` with steps 1 to 5, committed."""
    for step in range(1, 6):
        save(f"s3://{bucket}/run/step_{step:09d}", step)
    return f"s3://{bucket}/run/"


def test_check_names_each_damage_and_ls_marks_it_until_a_check_passes(
    run: str, bucket: str, s3_client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = cli(capsys, "check", f"s3://{bucket}/", "--read-data", "all", "--json")
    clean = json.loads(out)
    assert code == 0 and clean["ok"] and clean["checked"] == 5 and clean["damaged"] == 0
    assert clean["records"] == ["run/" + CHECK_NAME] and clean["exit_code"] == 0
    assert clean["items_read"] == sum(c["items"] for c in clean["checkpoints"]) > 0
    assert set(clean["checkpoints"][0]) >= {
        "url", "name", "status", "marker_digest", "marker_etag", "findings", "bytes_read",
    }  # fmt: skip

    # 2: one flipped byte; 3: an object cut short; 4: an object gone; 5: .metadata differs
    m2 = manifest(s3_client, bucket, "run/step_000000002")
    item = next(i for i in m2.records if i.fqn == "model.w")
    k2 = f"run/step_000000002/{item.object}"
    good = body(s3_client, bucket, k2)
    flipped = bytearray(good)
    flipped[item.start + item.length - 100] ^= 0x01
    s3_client.put_object(Bucket=bucket, Key=k2, Body=bytes(flipped))
    obj3 = manifest(s3_client, bucket, "run/step_000000003").objects[0]
    k3 = f"run/step_000000003/{obj3.name}"
    s3_client.put_object(Bucket=bucket, Key=k3, Body=body(s3_client, bucket, k3)[:-8])
    obj4 = manifest(s3_client, bucket, "run/step_000000004").objects[0]
    s3_client.delete_object(Bucket=bucket, Key=f"run/step_000000004/{obj4.name}")
    k5 = f"run/step_000000005/{METADATA_NAME}"
    meta = bytearray(body(s3_client, bucket, k5))
    meta[-1] ^= 0xFF
    s3_client.put_object(Bucket=bucket, Key=k5, Body=bytes(meta))

    code, out, _ = cli(capsys, "check", run, "--read-data", "all", "--json")
    doc = json.loads(out)
    assert code == 1 and not doc["ok"] and doc["damaged"] == 4 and doc["exit_code"] == 1
    found = {c["name"]: c["findings"] for c in doc["checkpoints"] if c["status"] == "damaged"}
    assert [(f["kind"], f["object"], f["item"]) for f in found["step_000000002"]] == [
        ("checksum", item.object, "model.w")
    ]
    f2 = found["step_000000002"][0]
    assert f2["expected"] == f"crc32c {item.crc32c:08x}" and f2["found"].startswith("crc32c ")
    assert f2["found"] != f2["expected"]
    assert [(f["kind"], f["object"]) for f in found["step_000000003"]] == [
        ("object_size", obj3.name)
    ]
    assert found["step_000000003"][0]["found"] == f"{obj3.size - 8} bytes"
    assert [(f["kind"], f["object"]) for f in found["step_000000004"]] == [
        ("missing_object", obj4.name)
    ]
    assert [(f["kind"], f["object"]) for f in found["step_000000005"]] == [
        ("stale_metadata", METADATA_NAME)
    ]
    assert "step_000000001" not in found

    code, out, err = cli(capsys, "ls", run, "--json")
    listed = {c["name"]: c for c in json.loads(out)["runs"][0]["checkpoints"]}
    assert code == 1 and "Traceback" not in err
    assert {n for n, c in listed.items() if c["damaged"]} == set(found)
    assert listed["step_000000002"]["check"]["problems"][0]["kind"] == "checksum"
    assert err.count("warning: damaged checkpoint") == 4
    code, out, _ = cli(capsys, "ls", run, "--no-progress")
    states = {ln.split()[0]: ln.split()[2] for ln in out.splitlines() if "step_0" in ln[:20]}
    assert (
        code == 1
        and states["step_000000002"] == "damaged"
        and states["step_000000001"] != ("damaged")
    )
    assert "step_000000002: damaged (s3ckpt check at" in out

    # repaired: a check of that checkpoint alone passes it, and ls stops marking it
    s3_client.put_object(Bucket=bucket, Key=k2, Body=good)
    code, out, _ = cli(capsys, "check", run + "step_000000002/", "--read-data", "all")
    assert code == 0 and "OK: nothing damaged" in out
    code, out, err = cli(capsys, "ls", run, "--json")
    listed = {c["name"]: c for c in json.loads(out)["runs"][0]["checkpoints"]}
    assert not listed["step_000000002"]["damaged"] and listed["step_000000002"]["check"] is None
    assert listed["step_000000003"]["damaged"] and err.count("damaged checkpoint") == 3


def test_a_clean_check_prints_ok_and_writes_its_metrics(
    bucket: str, s3_client: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = f"s3://{bucket}/run/"
    for step in (1, 2):
        save(f"{run}step_{step:09d}", step)
    before = list_keys(s3_client, bucket)
    code, _, _ = cli(capsys, "check", run, "--no-record")
    assert code == 0 and list_keys(s3_client, bucket) == before  # read only
    code, _, err = cli(capsys, "check", run, "--read-data", "5")
    assert code == 2 and "read_data must be" in err

    prom = tmp_path / "check.prom"
    argv = ["check", run, "--read-data", "5%", "--seed", "3", "--metrics-file", str(prom)]
    code, out, err = cli(capsys, *argv)
    assert code == 0 and err == "", err
    assert "checked 2 committed checkpoints, read 5% of their data" in out and "seed 3" in out
    assert out.rstrip().endswith("OK: nothing damaged")
    lines = prom.read_text().splitlines()
    for line in (
        "s3ckpt_check_success 1.0",
        "s3ckpt_check_checked_checkpoints 2.0",
        "s3ckpt_check_damaged_checkpoints 0.0",
        "s3ckpt_check_read_fraction 0.05",
    ):
        assert line in lines, lines
    assert any(ln.startswith("s3ckpt_check_last_success_timestamp_seconds ") for ln in lines)
    read = next(float(ln.split()[1]) for ln in lines if ln.startswith("s3ckpt_check_read_bytes"))
    assert read > 0

    # an archived checkpoint is skipped, not read (nor reported damaged)
    obj = manifest(s3_client, bucket, "run/step_000000001").objects[0]
    k = f"run/step_000000001/{obj.name}"
    s3_client.copy_object(
        Bucket=bucket, Key=k, CopySource={"Bucket": bucket, "Key": k}, StorageClass="GLACIER"
    )
    code, out, _ = cli(capsys, "check", run, "--read-data", "all", "--json", "--no-record")
    doc = json.loads(out)
    assert code == 0 and doc["checked"] == 1 and doc["skipped"]["archived"] == 1
    (skipped,) = doc["skipped_checkpoints"]
    assert skipped["name"] == "step_000000001" and "GLACIER" in skipped["detail"]
    assert doc["records"] == []
