"""Issue 38 items 1 and 3 on stores from npm: Azurite (``az://`` through adlfs) and s3rver.

- ``az://``: processes racing conditional creates, replaces and deletes of one blob meet
  at a barrier: exactly one wins each round (Azure's own If-None-Match / If-Match), and the
  capability probe says conditional writes are enforced.
- s3rver 3.7.1 (ignores conditional writes, and with a delimiter its KeyCount counts only
  objects): in single-writer mode a Checkpointer saves, a fresh process loads latest, and
  ``s3ckpt prune --apply`` deletes what the policy says, each exit 0.

Run with ``pytest -m "azurite or s3rver"``; ``make test`` runs them (tests/_npm.py installs
the servers; without node/npm they skip, and fail under CI)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator

import pytest

from s3ckpt.store._capabilities import clear_capabilities_cache, probe_capabilities
from s3ckpt.store.fsspec_store import FsspecStore
from tests._npm import AZURITE_KEY, NodeServer
from tests.unit._fsspec_racer import one_winner, race_processes

pytest.importorskip("adlfs", reason="adlfs (the test extra) is needed for az://")
N = 4


@pytest.fixture(scope="module")
def azurite() -> Iterator[NodeServer]:
    with NodeServer("azurite") as server:
        yield server


@pytest.fixture(scope="module")
def s3rver() -> Iterator[NodeServer]:
    with NodeServer("s3rver") as server:
        yield server


def _az_store(server: NodeServer, container: str) -> FsspecStore:
    conn = (
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
        f"AccountKey={AZURITE_KEY};BlobEndpoint={server.url}/devstoreaccount1;"
    )
    store = FsspecStore("az", container, connection_string=conn)
    store.fs.mkdir(container)
    return store


@pytest.mark.azurite
@pytest.mark.multiprocess
def test_az_races_between_processes_have_one_winner(azurite: NodeServer) -> None:
    store = _az_store(azurite, f"race{uuid.uuid4().hex[:8]}")
    for trial in range(3):
        root = f"run/t{trial}"
        one_winner(store, root, N, race_processes(store, root, N, 0.0))


@pytest.mark.azurite
def test_az_is_probed_as_enforcing_conditional_writes(azurite: NodeServer) -> None:
    clear_capabilities_cache()
    store = _az_store(azurite, f"probe{uuid.uuid4().hex[:8]}")
    caps = probe_capabilities(store, "run/hb", body=b"x", probe_delete=True)
    assert caps.conditional_writes and caps.conditional_delete
    etag = store.put("run/lease", b"a", if_none_match=True)
    info = store.head("run/lease")
    assert info is not None and info.etag == etag, "head gives the ETag If-Match compares"
    clear_capabilities_cache()


SAVE = """
import sys, torch
from s3ckpt import Checkpointer
from s3ckpt.config import S3Config
torch.manual_seed(0)
model = torch.nn.Linear(8, 8)
with Checkpointer(sys.argv[1], s3_config=S3Config(single_writer=True)) as ckpt:
    for step in (1, 2, 3, 4):
        ckpt.save(step, model)
torch.save(model.state_dict(), sys.argv[2])
"""
LOAD = """
import sys, torch
from s3ckpt import Checkpointer
from s3ckpt.config import S3Config
model = torch.nn.Linear(8, 8)
with Checkpointer(sys.argv[1], s3_config=S3Config(single_writer=True)) as ckpt:
    step = ckpt.load(model)
want = torch.load(sys.argv[2])
assert all(torch.equal(want[k], v) for k, v in model.state_dict().items())
print("loaded", step)
"""


def _run(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, f"{argv[:3]} exited {done.returncode}: {done.stderr[-3000:]}"
    return done


@pytest.mark.s3rver
def test_s3rver_single_writer_save_load_latest_and_prune(s3rver: NodeServer, tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": s3rver.url,
        "AWS_ACCESS_KEY_ID": "S3RVER",
        "AWS_SECRET_ACCESS_KEY": "S3RVER",
    }
    url = f"s3://ckpt/runs/{uuid.uuid4().hex[:8]}/"
    want = str(tmp_path / "model.pt")
    _run(env, sys.executable, "-c", textwrap.dedent(SAVE), url, want)
    assert "loaded 4" in _run(env, sys.executable, "-c", textwrap.dedent(LOAD), url, want).stdout
    cli = [sys.executable, "-m", "s3ckpt"]
    pruned = _run(env, *cli, "prune", url, "--policy", "keep-last-3", "--apply", "--single-writer")
    assert "deleted 1 of 1" in pruned.stdout, pruned.stdout
    listed = _run(env, *cli, "ls", url, "--single-writer").stdout
    assert "step_000000001" not in listed and "step_000000004" in listed, listed
