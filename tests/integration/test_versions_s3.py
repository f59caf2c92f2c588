"""Versioned buckets on the moto S3 server: what ``prune``, ``ls`` and ``report`` say stays
behind as noncurrent versions (issue 37 item 9), checked against ListObjectVersions itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from s3ckpt import Checkpointer
from s3ckpt.cli import main
from s3ckpt.store._versions import noncurrent_versions
from s3ckpt.store.s3 import S3Store

pytestmark = pytest.mark.integration


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out


def noncurrent_bytes(client: Any, bucket: str, prefix: str) -> tuple[int, int]:
    """(noncurrent versions, their bytes) under ``prefix``, from boto3 directly."""
    n = size = 0
    for page in client.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=prefix):
        for v in page.get("Versions", []):
            if not v["IsLatest"]:
                n += 1
                size += v["Size"]
    return n, size


def save_three(url: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 32)
    with Checkpointer(url) as ckpt:
        for step in (1, 2, 3):
            ckpt.save(step, model)


@pytest.fixture
def keep_last_1(tmp_path: Path) -> str:
    path = tmp_path / "keep-last-1.toml"
    path.write_text('description = "last 1"\n[keep]\nlast = 1\n')
    return str(path)


def test_prune_ls_and_report_count_what_a_versioned_bucket_keeps(
    bucket: str,
    s3_client: Any,
    keep_last_1: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    s3_client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    s3_client.put_bucket_lifecycle_configuration(
        Bucket=bucket,
        LifecycleConfiguration={
            "Rules": [
                {
                    "ID": "expire-noncurrent-versions",
                    "Status": "Enabled",
                    "Filter": {"Prefix": ""},
                    "NoncurrentVersionExpiration": {"NoncurrentDays": 7},
                }
            ]
        },
    )
    url = f"s3://{bucket}/run/"
    save_three(url)

    code, out = cli(capsys, "prune", url, "--policy", keep_last_1, "--apply", "--json")
    assert code == 0, out
    (run,) = json.loads(out)["runs"]
    assert len(run["deleted"]) == 2
    n, size = noncurrent_bytes(s3_client, bucket, "run/")
    assert size > run["bytes_freed"] > 0  # the deleted checkpoints' bytes, and overwrites
    assert run["versioning"] == "Enabled"
    assert (run["noncurrent_versions"], run["noncurrent_bytes"]) == (n, size)
    assert run["delete_markers"] > 0 and run["noncurrent_expiration_days"] == 7

    code, out = cli(capsys, "ls", url, "--json")
    (listed,) = json.loads(out)["runs"]
    assert (listed["versioning"], listed["noncurrent_bytes"]) == ("Enabled", size)

    html = tmp_path / "report.html"
    code, out = cli(capsys, "report", url, "--html", str(html), "--json")
    doc = json.loads(out)
    assert doc["noncurrent_bytes"] == doc["per_run"][0]["noncurrent_bytes"] == size
    assert f'data-field="noncurrent_bytes" data-value="{size}"' in html.read_text()

    code, out = cli(capsys, "prune", url, "--policy", keep_last_1, "--apply")
    assert "the bucket is versioned (Enabled)" in out
    assert "until the lifecycle rule expires them (7 days)" in out, out


def test_an_unversioned_bucket_reports_nothing_left_behind(
    bucket: str, keep_last_1: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"s3://{bucket}/run/"
    save_three(url)
    code, out = cli(capsys, "prune", url, "--policy", keep_last_1, "--apply", "--json")
    (run,) = json.loads(out)["runs"]
    assert (run["versioning"], run["noncurrent_bytes"], run["delete_markers"]) == ("off", 0, 0)
    code, out = cli(capsys, "prune", url, "--policy", keep_last_1, "--apply")
    assert code == 0 and "versioned" not in out and "noncurrent" not in out


def test_noncurrent_versions_are_paged_and_suspended_buckets_still_count(
    bucket: str, s3_client: Any
) -> None:
    s3_client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    for i in range(5):
        s3_client.put_object(Bucket=bucket, Key=f"r/k{i}", Body=b"a" * (i + 1))
        s3_client.put_object(Bucket=bucket, Key=f"r/k{i}", Body=b"b")  # k{i}'s first: noncurrent
    s3_client.delete_object(Bucket=bucket, Key="r/k0")
    s3_client.put_object(Bucket=bucket, Key="other/x", Body=b"c")
    s3_client.put_object(Bucket=bucket, Key="other/x", Body=b"d")
    s3_client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Suspended"})
    store = S3Store(bucket, page_size=2)  # 11 entries under r/: six pages
    v = noncurrent_versions(store, ["r/"])
    n = v.of("r/")
    assert v.status == "Suspended" and n is not None
    assert (n.versions, n.bytes, n.delete_markers) == (6, 1 + 2 + 3 + 4 + 5 + 1, 1)
    # No lifecycle configuration: nothing expires them, and the sentence says so.
    assert v.expire_days is None and "until deleted" in v.sentence("r/")
