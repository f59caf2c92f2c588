"""s3ckpt.testing in process: ``local_s3`` and its environment, the repository's fault proxy
(``tests.faultproxy.fault_proxy``) in front of it, Checkpointer saves and loads under lost
replies and 503s, and the assertion helpers on good, uncommitted, wrong-step, corrupted and
untidy prefixes.

The pytest plugin and the docs page are tested through a pytest subprocess in
``test_testing_docs.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import boto3
import pytest
import torch

from s3ckpt import Checkpointer, TransferConfig
from s3ckpt.config import MiB
from s3ckpt.format._names import MANIFEST_NAME
from s3ckpt.retention._catalog import CheckpointState
from s3ckpt.store import open_store
from s3ckpt.testing import (
    LocalS3,
    assert_clean,
    assert_committed,
    assert_no_partial_uploads,
    committed_steps,
    local_s3,
)
from tests._helpers import list_keys, open_uploads
from tests.faultproxy import fault_proxy

pytestmark = pytest.mark.integration

# Small parts (a few MiB of weights make a multipart upload) and quick retries.
TC = TransferConfig(part_size=5 * MiB, retry_initial_delay=0.01, retry_max_delay=0.05)


@pytest.fixture(scope="module")
def server() -> Iterator[LocalS3]:
    with local_s3() as s3:
        yield s3


@pytest.fixture
def s3(server: LocalS3) -> LocalS3:
    """A fresh bucket on the module's server (whose environment is in force)."""
    return server.new_bucket()


def _model(seed: int, rows: int = 64) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Linear(1024, rows)


def _save(url: str, *steps: int, rows: int = 64) -> dict[int, torch.nn.Module]:
    models = {s: _model(s, rows) for s in steps}
    with Checkpointer(url, transfer_config=TC) as ckpt:
        for s, m in models.items():
            ckpt.save(s, m)
    return models


def _load(url: str, rows: int = 64) -> tuple[int | None, torch.nn.Module]:
    out = torch.nn.Linear(1024, rows)
    with Checkpointer(url, transfer_config=TC) as ckpt:
        got = ckpt.load(out)
    return got, out


def _equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


# -- local_s3 and the environment --------------------------------------------------------------


def test_local_s3_sets_the_environment_and_restores_it_exactly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A developer's shell: a profile, a real-looking token, an S3-only endpoint, own files.
    monkeypatch.setenv("AWS_PROFILE", "production")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "real-token")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/home/dev/.aws/config")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAREALKEY")
    monkeypatch.delenv("AWS_REGION", raising=False)
    before = dict(os.environ)

    with local_s3(region="eu-west-1") as s3:
        env = dict(os.environ)
        assert env["AWS_ENDPOINT_URL"] == s3.endpoint_url
        assert s3.endpoint_url.startswith("http://127.0.0.1:")
        assert env["AWS_ACCESS_KEY_ID"] == env["AWS_SECRET_ACCESS_KEY"] == "testing"
        assert env["AWS_REGION"] == env["AWS_DEFAULT_REGION"] == "eu-west-1"
        assert env["AWS_CONFIG_FILE"] == env["AWS_SHARED_CREDENTIALS_FILE"] == os.devnull
        for gone in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
            assert gone not in env
        assert s3.env == {k: env[k] for k in s3.env}
        assert s3.url == f"s3://{s3.bucket}"
        assert s3.url_for("runs", "a/") == f"s3://{s3.bucket}/runs/a"
        # Any client that follows the environment reaches the server and its bucket...
        boto3.client("s3").head_bucket(Bucket=s3.bucket)
        # ...and so does a child process.
        out = subprocess.run(
            [sys.executable, "-c", "import os; print(os.environ['AWS_ENDPOINT_URL'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert out == s3.endpoint_url

    assert dict(os.environ) == before


def test_fault_proxy_points_the_environment_at_it_and_back(s3: LocalS3) -> None:
    url = s3.url_for("run")
    with fault_proxy(s3) as proxy:
        assert os.environ["AWS_ENDPOINT_URL"] == proxy.endpoint_url != s3.endpoint_url
        store, parsed = open_store(url)
        store.put(parsed.key("through-proxy"), b"x")
        assert proxy.stats["op:PutObject"] == 1
        assert proxy.stats["faults"] == 0  # fault_rate 0 unless asked
        child = "import os; print(os.environ['AWS_ENDPOINT_URL'])"
        out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True)
        assert out.stdout.strip() == proxy.endpoint_url  # children go through it too
    assert os.environ["AWS_ENDPOINT_URL"] == s3.endpoint_url
    # A store opened now gets a client on the server (the cached one is keyed by endpoint):
    # the proxy is gone, so a request through it would fail.
    store, parsed = open_store(url)
    assert store.get(parsed.key("through-proxy")) == b"x"


def test_new_bucket_is_empty_and_on_the_same_server(s3: LocalS3) -> None:
    s3.client().put_object(Bucket=s3.bucket, Key="a", Body=b"1")
    other = s3.new_bucket()
    assert other.endpoint_url == s3.endpoint_url and other.bucket != s3.bucket
    assert list_keys(other.client(), other.bucket) == []


# -- Checkpointer under faults -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "glob"),
    [("CompleteMultipartUpload", "*.distcp"), ("PutObject", "*/" + MANIFEST_NAME)],
)
def test_save_under_a_lost_reply_commits_and_loads_equal(s3: LocalS3, op: str, glob: str) -> None:
    url = s3.url_for("run")
    with fault_proxy(s3) as proxy:
        armed = proxy.arm(op, "lost_reply", key_glob=glob)
        models = _save(url, 3, rows=2048)  # 8 MiB: two parts
        assert armed.hits == 1
        step, loaded = _load(url, rows=2048)
    assert step == 3 and _equal(loaded, models[3])
    assert_committed(url, step=3)
    assert_clean(url)


def test_save_and_resume_under_503s(s3: LocalS3) -> None:
    url = s3.url_for("run")
    with fault_proxy(s3, fault_rate=0.3, faults=("slowdown",), seed=2) as proxy:
        models = _save(url, 1, 2)
        step, loaded = _load(url)
    assert proxy.stats["slowdown"] > 0
    assert step == 2 and _equal(loaded, models[2])
    assert committed_steps(url) == [1, 2]
    assert_clean(url)


# -- assertions ----------------------------------------------------------------------------------


def test_assert_committed_passes_on_a_good_checkpoint(s3: LocalS3) -> None:
    url = s3.url_for("run")
    _save(url, 2, 4)
    assert assert_committed(url).step == 4  # the newest committed
    info = assert_committed(url, step=2)
    assert info.step == 2 and info.state is CheckpointState.COMMITTED
    assert assert_committed(str(info.url), step=2).url == info.url  # a checkpoint prefix
    assert assert_committed(url.rstrip("/") + "/step_000000004/", verify=False).step == 4
    assert committed_steps(url) == [2, 4]


def test_assert_committed_names_what_is_there_instead(s3: LocalS3) -> None:
    url = s3.url_for("run")
    _save(url, 2, 4)
    # Step 6 in progress: its objects without a commit marker.
    _save(s3.url_for("tmp"), 6)
    client = s3.client()
    for key in list_keys(client, s3.bucket, "tmp/step_000000006/"):
        if not key.endswith(MANIFEST_NAME):
            client.copy_object(
                Bucket=s3.bucket,
                Key=key.replace("tmp/", "run/", 1),
                CopySource={"Bucket": s3.bucket, "Key": key},
            )

    with pytest.raises(AssertionError) as e:
        assert_committed(url, step=6)
    msg = str(e.value)
    assert "no committed checkpoint of step 6" in msg and "committed steps: [2, 4]" in msg
    assert "step_000000006 (step 6): in_progress, no commit marker (s3ckpt.json)" in msg
    assert "step_000000002 (step 2): committed" in msg

    with pytest.raises(AssertionError, match=r"step_000000006/ is not a committed checkpoint"):
        assert_committed(url + "/step_000000006")
    with pytest.raises(AssertionError, match=r"is committed at step 4, not at step 5"):
        assert_committed(url + "/step_000000004", step=5)
    with pytest.raises(AssertionError, match=r"no committed checkpoint under .*/nothing/: nothing"):
        assert_committed(s3.url_for("nothing"))
    assert committed_steps(url) == [2, 4]


def test_assert_committed_fails_on_a_corrupted_object(s3: LocalS3) -> None:
    url = s3.url_for("run")
    _save(url, 2)
    client = s3.client()
    (shard,) = [k for k in list_keys(client, s3.bucket, "run/") if k.endswith(".distcp")]
    body = bytearray(client.get_object(Bucket=s3.bucket, Key=shard)["Body"].read())
    body[len(body) // 2] ^= 0xFF  # one flipped byte inside the weight's bytes
    client.put_object(Bucket=s3.bucket, Key=shard, Body=bytes(body))

    assert_committed(url, step=2, verify=False)  # the commit itself is intact
    with pytest.raises(AssertionError) as e:
        assert_committed(url, step=2)
    msg = str(e.value)
    name = shard.rpartition("/")[2]
    assert "is committed but does not verify: 1 problem(s)" in msg
    assert "checksum: 'model.weight'" in msg
    assert f"bad objects: {name}" in msg

    client.put_object(Bucket=s3.bucket, Key=shard, Body=bytes(body[:100]))  # truncated
    with pytest.raises(AssertionError, match=r"object_size: object .* was truncated"):
        assert_committed(url, step=2)


def test_assert_clean_and_partial_uploads(s3: LocalS3) -> None:
    url = s3.url_for("run")
    _save(url, 2)
    client = s3.client()
    # Files s3ckpt does not write are not its business.
    client.put_object(Bucket=s3.bucket, Key="run/tensorboard/events.out", Body=b"e")
    client.put_object(Bucket=s3.bucket, Key="run/step_000000002/notes.txt", Body=b"n")
    assert [c.step for c in assert_clean(url)] == [2]
    assert_no_partial_uploads(url)

    # A half-uploaded object of another save in the committed prefix.
    key = "run/step_000000002/__0_0.deadbeef.distcp"
    client.create_multipart_upload(Bucket=s3.bucket, Key=key)
    assert open_uploads(client, s3.bucket) == [key]
    with pytest.raises(AssertionError, match=r"(?s)1 multipart upload\(s\) open under .*deadbeef"):
        assert_no_partial_uploads(url)
    with pytest.raises(AssertionError, match=r"open multipart upload: " + key):
        assert_clean(url)

    # An object the marker does not commit (another save's data).
    client.put_object(Bucket=s3.bucket, Key="run/step_000000002/__0_1.deadbeef.distcp", Body=b"")
    with pytest.raises(AssertionError) as e:
        assert_clean(url)
    assert "not committed by step_000000002's marker: run/step_000000002/__0_1.deadbeef" in str(
        e.value
    )
