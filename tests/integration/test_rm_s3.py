"""``s3ckpt rm`` against the moto S3 server over HTTP: deletes what s3ckpt wrote, marker
first, refuses what it must (exit 2, nothing deleted), and reports in JSON."""

from __future__ import annotations

import json
import time

import pytest

from s3ckpt.cli import main
from s3ckpt.format._names import LATEST_NAME, LEASE_NAME, MANIFEST_NAME
from s3ckpt.store.s3 import S3Store
from s3ckpt.uri import StoreURL
from tests._helpers import list_keys
from tests._retention_util import write_checkpoint

pytestmark = pytest.mark.integration

# Lightning's names (the marker records no step: the name gives it).
NAMES = ["epoch=0-step=100.ckpt", "epoch=0-step=200.ckpt", "epoch=1-step=300.ckpt"]


def lightning_run(bucket: str) -> tuple[S3Store, StoreURL]:
    store = S3Store(bucket)
    run = StoreURL("s3", bucket, "runs/lit/")
    for i, name in enumerate(NAMES):
        write_checkpoint(
            store, run, 0, created=time.time() - 86400 + i, name=name, record_step=False
        )
    store.put(run.key(LATEST_NAME), b'{"step": 300}')
    store.put(run.child(NAMES[0]).key("hparams.yaml"), b"lr: 0.1")  # not s3ckpt's
    return store, run


def test_rm_deletes_refuses_and_reports(
    bucket: str,
    s3_client,
    capsys: pytest.CaptureFixture[str],  # type: ignore[no-untyped-def]
) -> None:
    store, run = lightning_run(bucket)
    first, second, newest = (str(run.child(n)) for n in NAMES)

    # a dry run lists and changes nothing
    before = list_keys(s3_client, bucket, run.prefix)
    assert main(["rm", first, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"would delete {first} (step 100, committed, 6 keys" in out, out
    assert "hparams.yaml" in out  # kept: not s3ckpt's
    assert list_keys(s3_client, bucket, run.prefix) == before

    # the newest is refused (exit 2, one error line, nothing deleted, no lease written)
    assert main(["rm", newest]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"s3ckpt: error: refusing to delete {newest}")
    assert "--allow-newest" in err
    assert list_keys(s3_client, bucket, run.prefix) == before

    # several at once: every one is tried, the exit code is the first failure's
    code = main(["rm", first, newest, second, "--json"])
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert code == 2 and doc["exit_code"] == 2 and not doc["dry_run"]
    done, refused, also = doc["checkpoints"]
    # the fence (tombstone PUT), .metadata, the data, the tombstone's delete
    assert done["deleted"] and done["step"] == 100 and done["delete_requests"] == 4
    assert done["kept"] == [run.child(NAMES[0]).key("hparams.yaml")]
    assert refused["exit_code"] == 2 and "newest" in refused["error"]
    assert also["deleted"] and also["step"] == 200
    assert captured.err.count("s3ckpt: error:") == 1
    expected = {k for k in before if k.startswith(run.child(NAMES[2]).prefix)} | {
        run.child(NAMES[0]).key("hparams.yaml"),
        run.key(LATEST_NAME),
        run.key(LEASE_NAME),
    }
    assert set(list_keys(s3_client, bucket, run.prefix)) == expected

    # the newest, when asked; ls then shows nothing left
    assert main(["rm", newest, "--allow-newest"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"deleted {newest} (step 300") and "note: it was the run's newest" in out
    assert store.head(run.child(NAMES[2]).key(MANIFEST_NAME)) is None
    assert main(["ls", str(run), "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [(r["run"], r["checkpoints"]) for r in runs] == [(str(run), [])]


def test_rm_of_a_pinned_checkpoint_a_run_and_nothing_is_exit_2(
    bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    store, run = lightning_run(bucket)
    assert main(["pin", str(run.child(NAMES[0])), "--reason", "paper"]) == 0
    capsys.readouterr()
    for url, text in [
        (str(run.child(NAMES[0])), "it is pinned (paper)"),
        (str(run), "is a run holding checkpoints"),
        (f"s3://{bucket}/runs/lit/nothing", "no checkpoint at"),
    ]:
        assert main(["rm", url]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and text in err, err
    assert store.head(run.key(LEASE_NAME)) is None, "a refusal writes nothing, not even a lease"
