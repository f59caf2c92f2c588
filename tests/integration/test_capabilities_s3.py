"""Stores that ignore conditional writes, lack conditional deletes or ListMultipartUploads,
over HTTP to moto through a fault proxy (issue 27 items 4, 5 and 11; docs/compatibility.md).

* ``strip_conditions`` removes ``If-None-Match`` / ``If-Match`` on the way to moto, which then
  behaves as s3rver: saves and the retention lease refuse with one error naming conditional
  writes and the endpoint, unless single-writer mode is on (one warning per process).
* An overwrite that commits between a deleter's listing and its marker delete survives rm
  and prune, with ``DeleteObject If-Match`` and with the tombstone swap used where the store
  has no conditional deletes (``strip_conditions`` on ``DeleteObject`` only).
* ``not_implemented`` answers ``ListMultipartUploads`` with 501: read-only commands, prune,
  gc and ``Checkpointer.load`` degrade with one warning naming the operation.
"""

from __future__ import annotations

import json
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from s3ckpt import S3Config, S3StorageReader, S3StorageWriter
from s3ckpt.cli import main
from s3ckpt.errors import ConditionalWritesError, DeleteRefusedError, find_s3ckpt_error
from s3ckpt.format._names import LATEST_NAME, LEASE_NAME, MANIFEST_NAME
from s3ckpt.retention import KeepLast, RetentionOptions, delete_checkpoint, prune
from s3ckpt.store import Location
from s3ckpt.store._capabilities import cached_capabilities, clear_capabilities_cache
from s3ckpt.store.s3 import S3Store
from s3ckpt.uri import StoreURL
from tests._helpers import SMALL, list_keys
from tests.faultproxy import FaultProxy

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _fresh_probe() -> Iterator[None]:
    clear_capabilities_cache()
    yield
    clear_capabilities_cache()


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_endpoint, fault_rate=0.0) as p:
        yield p


def _state(v: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((256,), v), "b": torch.arange(7) + int(v)}


def _save(url: str, endpoint: str, v: float, **kw: Any) -> None:
    single = kw.pop("single_writer", False)
    cfg = S3Config(endpoint_url=endpoint, single_writer=single)
    dcp.save(
        _state(v), storage_writer=S3StorageWriter(url, s3_config=cfg, transfer_config=SMALL, **kw)
    )


def _load(url: str, endpoint: str) -> dict[str, torch.Tensor]:
    out = {k: torch.zeros_like(t) for k, t in _state(0).items()}
    reader = S3StorageReader(url, s3_config=S3Config(endpoint_url=endpoint))
    dcp.load(out, storage_reader=reader)
    return out


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def _strip(proxy: FaultProxy, op: str = "*") -> None:
    proxy.arm(op, "strip_conditions", conditional=True, times=10**9)


def _written(s3_client: Any, bucket: str, prefix: str) -> list[str]:
    """What a refused save left: anything but its heartbeats (the probe's own object)."""
    return [k for k in list_keys(s3_client, bucket, prefix) if "s3ckpt.alive." not in k]


# -- item 4: a store that ignores conditional writes -------------------------------------------
def test_two_concurrent_saves_never_both_succeed(
    proxy: FaultProxy, bucket: str, s3_client: Any
) -> None:
    _strip(proxy)
    url = f"s3://{bucket}/run/step_000000001"
    barrier = threading.Barrier(2)
    outcomes: list[BaseException | None] = [None, None]

    def saver(i: int) -> None:
        barrier.wait()
        try:
            _save(url, proxy.endpoint_url, float(i + 1))
        except BaseException as exc:  # DCP wraps what the writer raises
            outcomes[i] = exc

    threads = [threading.Thread(target=saver, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sum(o is None for o in outcomes) <= 1, "two saves of one prefix both succeeded"
    for exc in outcomes:
        assert exc is not None  # a store that fails the probe refuses every save
        err = find_s3ckpt_error(exc)
        assert isinstance(err, ConditionalWritesError), repr(exc)
        assert "conditional writes" in str(err) and proxy.endpoint_url in str(err)
    assert proxy.stats["strip_conditions"] >= 2
    assert _written(s3_client, bucket, "run/") == []  # refused before any data or marker


def test_the_lease_refuses_and_single_writer_opts_in(
    proxy: FaultProxy,
    moto_endpoint: str,
    bucket: str,
    s3_client: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = f"s3://{bucket}/run"
    for step in (1, 2):  # committed on the honest endpoint
        _save(f"{run}/step_{step:09d}", moto_endpoint, float(step))
    capsys.readouterr()
    _strip(proxy)
    policy = tmp_path / "keep1.toml"
    policy.write_text("[keep]\nlast = 1\n")
    argv = ["prune", run, "--policy", str(policy), "--apply", "--no-progress"]
    argv += ["--endpoint-url", proxy.endpoint_url]
    code = main(argv)
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "conditional writes" in lines[0], err
    assert proxy.endpoint_url in lines[0]
    assert f"run/step_{1:09d}/{MANIFEST_NAME}" in list_keys(s3_client, bucket, "run/")

    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert main([*argv, "--single-writer"]) == 0
    capsys.readouterr()
    markers = [k for k in list_keys(s3_client, bucket, "run/") if k.endswith(MANIFEST_NAME)]
    assert markers == [f"run/step_{2:09d}/{MANIFEST_NAME}"]


def test_single_writer_saves_and_warns_once_per_process(
    proxy: FaultProxy, moto_endpoint: str, bucket: str
) -> None:
    _strip(proxy)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in (1, 2):
            url = f"s3://{bucket}/run/step_{step:09d}"
            _save(url, proxy.endpoint_url, float(step), single_writer=True)
    ours = [w for w in caught if "conditional writes" in str(w.message)]
    assert len(ours) == 1 and "single-writer" in str(ours[0].message)
    for step in (1, 2):
        got = _load(f"s3://{bucket}/run/step_{step:09d}", moto_endpoint)
        assert _equal(got, _state(float(step)))


# -- item 5: deleters racing an overwrite ------------------------------------------------------
def _racing_overwrite(
    proxy: FaultProxy,
    moto_endpoint: str,
    bucket: str,
    command: str,
    *,
    conditional_delete: bool,
) -> None:
    """Steps 1..3 committed; the deleter (``command``) plans to delete step 1, and an
    overwrite of step 1 commits right after its listing. It survives and loads."""
    if not conditional_delete:
        _strip(proxy, "DeleteObject")  # the probe finds no conditional delete: tombstones
    base = f"s3://{bucket}/run"
    for step in (1, 2, 3):
        _save(f"{base}/step_{step:09d}", moto_endpoint, float(step))
    target = f"{base}/step_{1:09d}"
    store = S3Store(bucket, s3_config=S3Config(endpoint_url=proxy.endpoint_url))
    run = StoreURL("s3", bucket, "run/")
    done: list[str] = []

    def hook(event: str, details: dict[str, Any]) -> None:
        if event == "intent" and not done:  # planned and logged; no delete sent yet
            _save(target, moto_endpoint, 99.0, overwrite=True)
            done.append(event)

    if command == "prune":
        r = prune(
            Location.of(run, store=store),
            KeepLast(2),
            apply=True,
            options=RetentionOptions(on_progress=hook),
        )
        assert r.deleted == () and any("changed after it was planned" in n for n in r.notes)
    else:
        res = delete_checkpoint(
            Location.of(run.child(f"step_{1:09d}"), store=store),
            options=RetentionOptions(on_progress=hook),
        )
        assert not res.deleted and any("changed after it was planned" in n for n in res.notes)
    assert done
    caps = cached_capabilities(store)
    assert caps is not None and caps.conditional_delete is conditional_delete
    assert _equal(_load(target, moto_endpoint), _state(99.0))
    lease = json.loads(store.get(run.key(LEASE_NAME)))
    assert lease["released"] and lease["deleting"] == []


@pytest.mark.parametrize("command", ["prune", "rm"])
def test_an_overwrite_racing_a_deleter_survives(
    proxy: FaultProxy, moto_endpoint: str, bucket: str, command: str
) -> None:
    _racing_overwrite(proxy, moto_endpoint, bucket, command, conditional_delete=True)


@pytest.mark.parametrize("command", ["prune", "rm"])
def test_an_overwrite_racing_a_tombstoning_deleter_survives(
    proxy: FaultProxy, moto_endpoint: str, bucket: str, command: str
) -> None:
    _racing_overwrite(proxy, moto_endpoint, bucket, command, conditional_delete=False)
    assert proxy.stats["strip_conditions"] >= 1  # the probe's DeleteObject If-Match


@pytest.mark.parametrize("command", ["prune", "rm"])
@pytest.mark.parametrize("held", ["probe", "marker"])
def test_an_overwrite_committed_while_a_deleters_request_is_held_survives(
    moto_endpoint: str, bucket: str, command: str, held: str
) -> None:
    """Chaos class 12's interleaving, at the HTTP request: the deleter's request is held at
    the proxy while an overwrite of step 1 commits. ``marker``: the fence (the tombstone's
    conditional PUT), sent after the listing under the lease (412: skipped as changed).
    ``probe``: the capability probe's DeleteObject on its own key beside the lease, sent inside
    ``Lease.acquire`` before that listing, so the deleter plans with the overwrite
    committed: it is the run's most recently committed checkpoint, kept by prune and
    refused by rm (without ``allow_newest``)."""
    base = f"s3://{bucket}/run"
    for step in (1, 2, 3):
        _save(f"{base}/step_{step:09d}", moto_endpoint, float(step))
    target = f"{base}/step_{1:09d}"
    seen: list[str] = []

    def hook(op: str, key: str, phase: str) -> None:
        # ``marker``: the deleter's fence, the tombstone PUT If-Match (its first request on
        # the marker key); ``probe``: the probe's DeleteObject on its key beside the lease.
        at = f"{LEASE_NAME}.probe-" in key if held == "probe" else key.endswith(MANIFEST_NAME)
        want = "DeleteObject" if held == "probe" else "PutObject"
        if op == want and phase == "before" and at and not seen:
            seen.append(key)
            # The store's clock has whole seconds: commit the overwrite in a later second than
            # step 3, so it is the run's most recently committed checkpoint by the store's time.
            time.sleep(1.1)
            _save(target, moto_endpoint, 99.0, overwrite=True)  # blocks the held request

    with FaultProxy(moto_endpoint, fault_rate=0.0, hook=hook) as proxy:
        store = S3Store(bucket, s3_config=S3Config(endpoint_url=proxy.endpoint_url))
        run = StoreURL("s3", bucket, "run/")
        if command == "prune":
            r = prune(Location.of(run, store=store), KeepLast(2), apply=True)
            assert ("step_000000001" in r.plan.keep) if held == "probe" else r.deleted == ()
        elif held == "probe":
            with pytest.raises(DeleteRefusedError) as ei:
                delete_checkpoint(Location.of(run.child(f"step_{1:09d}"), store=store))
            assert ei.value.reason == "newest"
        else:
            res = delete_checkpoint(Location.of(run.child(f"step_{1:09d}"), store=store))
            assert not res.deleted and any("changed after it was planned" in n for n in res.notes)
        lease = json.loads(store.get(run.key(LEASE_NAME)))
    assert seen and lease["released"] and lease["deleting"] == []
    assert _equal(_load(target, moto_endpoint), _state(99.0))


# -- item 11: no ListMultipartUploads ----------------------------------------------------------
def test_a_store_without_list_multipart_uploads(
    proxy: FaultProxy,
    moto_endpoint: str,
    bucket: str,
    s3_client: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from s3ckpt import Checkpointer

    for step in (1, 2, 3):
        _save(f"s3://{bucket}/run/step_{step:09d}", moto_endpoint, float(step))
    ck = f"s3://{bucket}/ck"
    model = torch.nn.Linear(4, 2)
    with Checkpointer(ck, s3_config=S3Config(endpoint_url=moto_endpoint)) as ckpt:
        ckpt.save(4, model)
        ckpt.wait()
    s3_client.delete_object(Bucket=bucket, Key=f"ck/{LATEST_NAME}")  # a run without a pointer
    proxy.arm("ListMultipartUploads", "not_implemented", times=10**9)
    ep = ["--endpoint-url", proxy.endpoint_url, "--no-progress"]
    run = f"s3://{bucket}/run"
    policy = tmp_path / "keep2.toml"
    policy.write_text("[keep]\nlast = 2\n")
    outs: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for argv in (
            ["ls", run],
            ["prune", run, "--policy", str(policy)],
            ["prune", run, "--policy", str(policy), "--apply"],
            ["gc", run, "--apply"],
            ["report", run, "--html", str(tmp_path / "r.html")],
        ):
            code = main([*argv, *ep])
            out, err = capsys.readouterr()
            assert code == 0 and "Traceback" not in err, (argv, out, err)
            assert "unexpected error" not in err, err
            outs.append(out + err)
        loaded = torch.nn.Linear(4, 2)
        with Checkpointer(ck, s3_config=S3Config(endpoint_url=proxy.endpoint_url)) as ckpt:
            assert ckpt.load(loaded, step="latest") == 4
        assert torch.equal(loaded.weight, model.weight)
    assert proxy.stats["not_implemented"] >= 1
    assert "cannot see open" in outs[3], outs[3]  # gc says what it could not do
    named = [w for w in caught if "ListMultipartUploads" in str(w.message)]
    assert len(named) == 1, [str(w.message) for w in caught]


def test_rm_deletes_only_the_version_it_first_listed(moto_endpoint: str, bucket: str) -> None:
    """An overwrite that commits after ``rm`` listed the checkpoint (here: while rm's lease
    PUT is held, before it lists again under the lease) stays, even with ``allow_newest``:
    rm deletes the marker only with the ETag of its first listing (412: reported as
    changed, nothing deleted)."""
    base = f"s3://{bucket}/run"
    for step in (1, 2):
        _save(f"{base}/step_{step:09d}", moto_endpoint, float(step))
    target = f"{base}/step_{1:09d}"
    held: list[str] = []

    def hook(op: str, key: str, phase: str) -> None:
        if op == "PutObject" and key.endswith(LEASE_NAME) and phase == "before" and not held:
            held.append(key)
            _save(target, moto_endpoint, 99.0, overwrite=True)  # blocks the lease PUT

    with FaultProxy(moto_endpoint, fault_rate=0.0, hook=hook) as proxy:
        store = S3Store(bucket, s3_config=S3Config(endpoint_url=proxy.endpoint_url))
        run = StoreURL("s3", bucket, "run/")
        res = delete_checkpoint(
            Location.of(run.child(f"step_{1:09d}"), store=store), allow_newest=True
        )
        lease = json.loads(store.get(run.key(LEASE_NAME)))
    assert held and not res.deleted
    assert any("changed after it was planned" in n for n in res.notes), res.notes
    assert lease["released"] and lease["deleting"] == []
    assert _equal(_load(target, moto_endpoint), _state(99.0))
