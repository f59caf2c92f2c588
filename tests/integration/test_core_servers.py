"""The integration core on S3 servers other than moto: SeaweedFS (``weed mini``) by default.

moto is what the rest of tests/integration talks to; it answers much as AWS does, but it is
one implementation. The commit protocol leans on a store's guarantees (conditional PUT and
CompleteMultipartUpload, ListMultipartUploads, DeleteObjects, ranged GET), so the core runs
here on an independent server too: DCP save/load, the Checkpointer with retention, racing
commits of one step, the retention lease, ``prune --apply`` and ``gc --apply`` through the
CLI, and lost replies through :class:`~s3ckpt.testing.FaultProxy` on the commit's requests.

``S3CKPT_CORE_SERVERS`` (comma-separated; default ``seaweedfs``) names the servers; each is
a session fixture ``<name>_endpoint`` in tests/conftest.py (``moto`` runs these checks too,
as a cross-check of the tests themselves; CI leaves it out since the modules named in each
test cover moto already). What each server does with the raw requests:
docs/compatibility.md and ``scripts/store_capabilities.py``.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from s3ckpt import Checkpointer, S3Config, S3StorageReader, S3StorageWriter
from s3ckpt._commit import heartbeat_body
from s3ckpt.cli import main as cli_main
from s3ckpt.config import MiB
from s3ckpt.errors import CheckpointExistsError, LeaseHeldError, find_s3ckpt_error
from s3ckpt.format._manifest import Manifest
from s3ckpt.format._names import MANIFEST_NAME, data_name, heartbeat_name
from s3ckpt.retention import KeepLast, list_checkpoints
from s3ckpt.retention._lease import Lease
from s3ckpt.store import Location
from s3ckpt.store.s3 import S3Store
from s3ckpt.uri import StoreURL
from tests._helpers import SMALL, assert_same, list_keys, open_uploads, zeros_like_state
from tests._retention_util import ckpt_name, keys_under, write_checkpoint
from tests.faultproxy import FaultProxy

pytestmark = pytest.mark.integration

SERVERS = [s for s in os.environ.get("S3CKPT_CORE_SERVERS", "seaweedfs").split(",") if s]
FAST = dataclasses.replace(
    SMALL, target_object_size=4 * MiB, retry_initial_delay=0.01, retry_max_delay=0.05
)


@dataclasses.dataclass
class Server:
    """One S3 server under test: its endpoint, a fresh bucket and a plain boto3 client."""

    name: str
    endpoint: str
    bucket: str
    client: Any

    @property
    def config(self) -> S3Config:
        return S3Config(endpoint_url=self.endpoint)

    def url(self, path: str) -> str:
        return f"s3://{self.bucket}/{path}"

    def store(self) -> S3Store:
        return S3Store(self.bucket, self.config, FAST)


@pytest.fixture(params=SERVERS)
def server(request: pytest.FixtureRequest) -> Server:
    import boto3

    endpoint = request.getfixturevalue(f"{request.param}_endpoint")
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    bucket = f"core-{uuid.uuid4().hex[:16]}"
    client.create_bucket(Bucket=bucket)
    return Server(request.param, endpoint, bucket, client)


@pytest.fixture
def proxy(server: Server) -> Iterator[FaultProxy]:
    with FaultProxy(server.endpoint, fault_rate=0.0) as p:
        yield p


def _state(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {
        "big": torch.randn(1536 * 1024, generator=g),  # 6 MiB: a two-part upload
        "w": torch.randn(256, 1024, generator=g).to(torch.bfloat16),
        "step": seed,
    }


def _save(url: str, sd: dict[str, Any], cfg: S3Config, **kw: Any) -> S3StorageWriter:
    writer = S3StorageWriter(url, s3_config=cfg, transfer_config=FAST, **kw)
    dcp.save(sd, storage_writer=writer)
    return writer


def _load(url: str, like: dict[str, Any], cfg: S3Config) -> dict[str, Any]:
    out = zeros_like_state(like)
    dcp.load(out, storage_reader=S3StorageReader(url, s3_config=cfg, transfer_config=FAST))
    return out


def _cli(server: Server, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli_main([*argv, "--endpoint-url", server.endpoint])
    out = capsys.readouterr()
    return code, out.out + out.err


# -- save and load -----------------------------------------------------------------------------
def test_dcp_save_load_and_a_second_save_is_refused(server: Server) -> None:
    """As test_dcp_s3.test_save_load_over_http: several objects, one of them multipart."""
    url = server.url("run/step_1")
    sd = _state(1)
    _save(url, sd, server.config)
    keys = list_keys(server.client, server.bucket)
    assert keys[-1] == "run/step_1/" + MANIFEST_NAME and len(keys) >= 4
    assert_same(sd, _load(url, sd, server.config))
    with pytest.raises(CheckpointExistsError):
        S3StorageWriter(url, s3_config=server.config)
    assert open_uploads(server.client, server.bucket) == []


def test_checkpointer_saves_loads_and_prunes(server: Server) -> None:
    """As test_checkpointer / test_metrics_s3: the training loop's API, retention after
    each commit (KeepLast(2)), resume from the newest."""
    model = torch.nn.Linear(64, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Checkpointer(
        server.url("ck"), policy=KeepLast(2), s3_config=server.config, transfer_config=FAST
    ) as ckpt:
        for step in (1, 2, 3):
            with torch.no_grad():
                model.weight.add_(1.0)
            ckpt.save(step, model, opt)
        ckpt.wait()
        assert [c.step for c in ckpt.list()] == [2, 3]
        history = ckpt.retention_history
        assert history and all(r.error is None for r in history), history
    fresh = torch.nn.Linear(64, 32)
    with Checkpointer(server.url("ck"), s3_config=server.config, transfer_config=FAST) as ck2:
        assert ck2.load(fresh, torch.optim.SGD(fresh.parameters(), lr=0.1)) == 3
    assert torch.equal(fresh.weight, model.weight)


# -- concurrency -------------------------------------------------------------------------------
def test_racing_saves_of_one_step_commit_exactly_once(server: Server) -> None:
    """Two writers of one step at once: one commits, the other is refused (never two
    successes, never a mix), and what loads is the winner's state."""
    url = server.url("race/step_7")
    states = [_state(10), _state(20)]
    barrier = threading.Barrier(2)
    outcome: dict[int, BaseException | None] = {}

    def save(i: int) -> None:
        try:
            barrier.wait()
            _save(url, states[i], server.config)
            outcome[i] = None
        except BaseException as exc:
            outcome[i] = exc

    threads = [threading.Thread(target=save, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    won = [i for i, exc in outcome.items() if exc is None]
    assert len(won) == 1, outcome
    (lost,) = (exc for exc in outcome.values() if exc is not None)
    assert isinstance(find_s3ckpt_error(lost), CheckpointExistsError), repr(lost)
    assert_same(states[won[0]], _load(url, states[0], server.config))
    assert open_uploads(server.client, server.bucket) == []


def test_two_pruners_exactly_one_takes_the_lease(server: Server) -> None:
    run = StoreURL("s3", server.bucket, "runs/lease/")
    barrier = threading.Barrier(2)
    won: list[int] = []
    held: list[int] = []

    def contender(i: int) -> None:
        store = server.store()
        barrier.wait()
        try:
            Lease(store, run, owner=f"p{i}").acquire()
            won.append(i)
        except LeaseHeldError:
            held.append(i)

    threads = [threading.Thread(target=contender, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(won) == 1 and len(held) == 1


# -- the CLI's prune and gc --------------------------------------------------------------------
def test_cli_prune_and_gc_apply(
    server: Server, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``prune --apply`` deletes what the policy does not keep; ``gc --apply`` removes a
    killed save's objects and aborts its upload (its writer's pid is gone on this boot of
    this host: dead at once, whatever the grace) and leaves a live save's alone."""
    store = server.store()
    run = StoreURL("s3", server.bucket, "runs/cli/")
    for step in (1, 2, 3, 4):
        write_checkpoint(store, run, step, created=time.time() - 3600 + step, data_objects=1)
    policy = tmp_path / "keep-2.toml"
    policy.write_text("[keep]\nlast = 2\n")
    code, out = _cli(server, capsys, "prune", str(run), "--policy", str(policy), "--apply")
    assert code == 0, out
    assert [c.step for c in list_checkpoints(Location.of(run, store=store)) if c.is_committed] == [
        3,
        4,
    ]

    # step 9: a save whose writer was killed (its heartbeat names a process that has exited)
    dead = write_checkpoint(
        store, run, 9, created=time.time(), commit=False, metadata=False, tag="dead0009"
    )
    store.put(dead.key(heartbeat_name("dead0009", 0)), _heartbeat_of_an_exited_process())
    store.create_multipart(dead.key(data_name(1, 0, "dead0009")))
    # step 10: a live save (this process's heartbeat) with an open upload
    live = run.child(ckpt_name(10))
    live_beat = live.key(heartbeat_name("11ae0010", 0))
    store.put(live_beat, heartbeat_body("11ae0010", 0, 10))
    live_upload = live.key(data_name(0, 0, "11ae0010"))
    store.create_multipart(live_upload)

    code, out = _cli(server, capsys, "gc", str(run), "--apply", "--json")
    assert code == 0, out
    assert keys_under(store, dead.prefix) == set(), out
    assert open_uploads(server.client, server.bucket, run.prefix) == [live_upload]
    assert keys_under(store, live.prefix) == {live_beat}


def _heartbeat_of_an_exited_process() -> bytes:
    """A heartbeat written by another process of this host, which has exited since."""
    code = (
        "import sys; from s3ckpt._commit import heartbeat_body; "
        "sys.stdout.buffer.write(heartbeat_body('dead0009', 0, 9))"
    )
    return subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, timeout=120
    ).stdout


# -- lost replies through a fault proxy --------------------------------------------------------
@pytest.mark.parametrize(
    ("op", "glob", "conditional"),
    [
        ("PutObject", "*/s3ckpt.json", True),  # the commit point
        ("CompleteMultipartUpload", "*.distcp", None),
    ],
)
def test_lost_reply_still_commits_once(
    server: Server, proxy: FaultProxy, op: str, glob: str, conditional: bool | None
) -> None:
    """As test_commit_lost_replies: the server applied the request, the client saw a reset;
    the retry decides by reading state back and the save commits exactly once."""
    url = server.url("lost/step_1")
    armed = proxy.arm(op, "lost_reply", key_glob=glob, conditional=conditional)
    sd = _state(3)
    writer = _save(url, sd, S3Config(endpoint_url=proxy.endpoint_url))
    assert armed.hits == 1, f"no {op} {glob} request was made"
    assert_same(sd, _load(url, sd, server.config))
    raw = server.client.get_object(Bucket=server.bucket, Key="lost/step_1/" + MANIFEST_NAME)
    assert Manifest.from_json(raw["Body"].read()).save_id == writer.save_id
    assert open_uploads(server.client, server.bucket) == []
