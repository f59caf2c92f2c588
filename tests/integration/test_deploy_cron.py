"""The retention cron's entry point (deploy/cron/s3ckpt-cron, the image's ENTRYPOINT) with
the real ``s3ckpt`` against the moto server: the dry run deletes nothing, APPLY=1 prunes
by a built-in policy, then gc runs, and stdout is two JSON documents."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from s3ckpt.store.s3 import S3Store
from s3ckpt.uri import StoreURL
from tests._helpers import list_keys
from tests._retention_util import ckpt_name, write_checkpoint

pytestmark = pytest.mark.integration

ENTRYPOINT = Path(__file__).resolve().parents[2] / "deploy" / "cron" / "s3ckpt-cron"
T0 = datetime(2025, 1, 1, tzinfo=UTC)


def cron(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # The venv's bin holds the s3ckpt console script, as /usr/local/bin does in the image.
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    return subprocess.run(
        ["sh", str(ENTRYPOINT)],
        env={**os.environ, "PATH": path, **env},
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_the_cron_prunes_and_gcs_a_bucket(moto_endpoint: str, bucket: str, s3_client) -> None:  # type: ignore[no-untyped-def]
    store = S3Store(bucket)
    run = StoreURL("s3", bucket, "checkpoints/run-a/")
    for step in range(1, 6):
        write_checkpoint(store, run, step, created=(T0 + timedelta(hours=step)).timestamp())
    # A save without its commit marker: neither prune's nor (being recent on moto's clock,
    # so within gc's grace period) gc's to delete.
    write_checkpoint(store, run, 6, created=(T0 + timedelta(hours=6)).timestamp(), commit=False)
    env = {"S3CKPT_URL": f"s3://{bucket}/checkpoints/", "POLICY": "keep-last-3"}

    dry = cron(env)
    assert dry.returncode == 0, dry.stderr
    before = list_keys(s3_client, bucket)
    assert {k.split("/")[2] for k in before} >= {ckpt_name(s) for s in range(1, 7)}

    done = cron({**env, "APPLY": "1"})
    assert done.returncode == 0, done.stderr
    prune_doc, gc_doc = (json.loads(doc) for doc in split_documents(done.stdout))
    assert prune_doc["exit_code"] == 0
    assert prune_doc["runs"][0]["deleted"] == [ckpt_name(1), ckpt_name(2)]
    assert gc_doc["applied"] is True and gc_doc["exit_code"] == 0
    assert gc_doc["root"] == env["S3CKPT_URL"] and gc_doc["removed"] == []
    left = {k.split("/")[2] for k in list_keys(s3_client, bucket, "checkpoints/run-a/")}
    assert {ckpt_name(s) for s in (3, 4, 5, 6)} <= left
    assert not left & {ckpt_name(1), ckpt_name(2)}
    assert "prune exit 0, gc exit 0" in done.stderr


def split_documents(out: str) -> list[str]:
    """The JSON documents in ``out``, one per command (each may span lines)."""
    decoder = json.JSONDecoder()
    docs, i = [], 0
    while i < len(out):
        if out[i].isspace():
            i += 1
            continue
        _, end = decoder.raw_decode(out, i)
        docs.append(out[i:end])
        i = end
    return docs
