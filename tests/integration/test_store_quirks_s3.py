"""Other stores' quirks over real HTTP (issue 38): ``s3ckpt doctor``, ``ls`` and ``prune`` through
a loopback endpoint (tests/_quirky_s3.py) that relays to moto but answers AbortMultipartUpload
with 405 (as s3rver), DeleteObject If-Match with 501 (as LocalStack), and counts only objects
in a delimited listing's KeyCount (as s3rver).

- doctor: the abort row says the store does not support it (not a permission, no
  ``aws s3api abort-multipart-upload`` hint anywhere), the conditional-delete row says it is
  unsupported and that rm and prune then use tombstones, the listing probe passes;
- ``ls`` and ``prune --apply`` work, prune through tombstones (no conditional delete).

tests/integration/test_npm_stores.py shows the listing on real s3rver 3.7.1 (load latest and
prune in single-writer mode); the 405 and the 501 are shown only here.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import torch

from s3ckpt import Checkpointer
from s3ckpt.cli import main
from s3ckpt.config import S3Config
from s3ckpt.store._capabilities import clear_capabilities_cache
from tests._helpers import list_keys
from tests._quirky_s3 import quirky_s3

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _fresh_capabilities() -> Any:
    """Each test probes its own endpoint afresh (the probe's answers are cached per store)."""
    clear_capabilities_cache()
    yield
    clear_capabilities_cache()


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_doctor_tells_unsupported_from_denied_and_lists_with_object_only_key_counts(
    moto_endpoint: str, bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with quirky_s3(moto_endpoint) as store:
        url = f"s3://{bucket}/runs/"
        code, out, err = _cli(capsys, "doctor", url, "--endpoint-url", store.endpoint_url, "--json")
        text_code, text, _ = _cli(capsys, "doctor", url, "--endpoint-url", store.endpoint_url)
    assert set(store.hits) == {"abort_405", "conditional_delete_501", "object_key_count"}
    doc = json.loads(out)
    rows = {c["name"]: c for c in doc["checks"]}
    # No failure: each missing operation is a caveat with what s3ckpt then does.
    assert code == text_code == 0 and doc["verdict"] != "fail", (err, doc["failed"])

    abort = rows["permission abort"]
    assert abort["status"] == "warn", abort
    assert "does not support AbortMultipartUpload (MethodNotAllowed)" in abort["detail"], abort
    assert "not a permission" in abort["detail"] and "s3:AbortMultipartUpload" not in str(abort)
    assert "lifecycle rule" in abort["meaning"], abort
    # The uploads doctor could not abort stay: its cleanup hint says why, not a CLI command.
    assert "aws s3api abort-multipart-upload" not in out + text
    assert "the store cannot abort uploads" in rows["cleanup"]["meaning"], rows["cleanup"]

    delete = rows["conditional delete"]
    assert delete["status"] == "warn", delete
    assert "not supported" in delete["detail"], delete
    assert "tombstone" in delete["meaning"], delete

    assert rows["listing"]["status"] == "ok", rows["listing"]
    for name in ("conditional create", "conditional replace"):
        assert rows[name]["status"] == "ok", rows[name]


def test_ls_and_prune_work_through_tombstones_and_object_only_key_counts(
    moto_endpoint: str, bucket: str, s3_client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"s3://{bucket}/runs/{uuid.uuid4().hex[:8]}/"
    model = torch.nn.Linear(4, 4)
    with quirky_s3(moto_endpoint) as store:
        config = S3Config(endpoint_url=store.endpoint_url)
        with Checkpointer(url, s3_config=config) as ckpt:
            for step in (1, 2, 3, 4):
                ckpt.save(step, model)
        endpoint = ("--endpoint-url", store.endpoint_url)
        code, out, err = _cli(capsys, "ls", url, *endpoint)
        assert code == 0, err
        assert all(f"step_00000000{n}" in out for n in (1, 2, 3, 4)), out

        code, out, err = _cli(capsys, "prune", url, "--policy", "keep-last-3", "--apply", *endpoint)
        assert code == 0, err
        assert "deleted 1 of 1" in out, out
        assert store.hits["object_key_count"] > 0
        assert store.hits["conditional_delete_501"] > 0  # the probe met the 501 ...

        code, out, err = _cli(capsys, "ls", url, *endpoint)
        assert code == 0, err
        assert "step_000000001" not in out and "step_000000004" in out, out
        with Checkpointer(url, s3_config=config) as ckpt:
            assert ckpt.load(torch.nn.Linear(4, 4)) == 4
    # ... and prune went on with tombstones: nothing of step 1 is left, not even a .metadata.
    left = list_keys(s3_client, bucket, url.split(bucket + "/", 1)[1])
    assert not [k for k in left if "step_000000001" in k], left
