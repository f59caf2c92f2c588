"""Bounded time, always (issue 37, item 7): a reply that drips a byte a second and an
endpoint that goes silent end every command in a clear s3ckpt error within a bound, through
a fault proxy in front of the moto server.

The settings are small (``FAST``: a 1 s read timeout and a 4 s request deadline) so that
the bounds are seconds; one test keeps the defaults for the 60 s claim. Each test carries
a pytest timeout, so a regression (a read timeout that every dripped byte restarts) fails
instead of hanging."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from s3ckpt import Checkpointer, S3Config, TransferConfig
from s3ckpt.cli import main
from s3ckpt.errors import S3CkptError
from s3ckpt.format._names import MANIFEST_NAME
from tests.faultproxy import FaultProxy
from tests.integration._faulted_saves import TC

pytestmark = pytest.mark.integration

FAST = dataclasses.replace(TC, connect_timeout=1.0, read_timeout=1.0, request_deadline=4.0)
"""A 1 s read (and connect) timeout, a 4 s request deadline: a short cleanup budget (1 s)."""

DRIP = dataclasses.replace(FAST, read_timeout=3.0, request_deadline=8.0)
"""A read timeout longer than the drip's one byte a second, so only a total deadline ends
a dripping reply."""

BOUND = 25.0
"""Seconds any command may take with :data:`FAST` once the endpoint misbehaves: one
request's deadline, the short budgets of what follows, and room for a loaded machine."""


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_endpoint, fault_rate=0.0) as p:
        yield p


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Linear(256, 256)


def _saved(proxy: FaultProxy, run: str, tc: TransferConfig = FAST) -> Checkpointer:
    ckpt = Checkpointer(
        run, s3_config=S3Config(endpoint_url=proxy.endpoint_url), transfer_config=tc
    )
    ckpt.save(1, _model(1))
    return ckpt


def _timed_error(fn: object) -> tuple[S3CkptError, float]:
    started = time.monotonic()
    with pytest.raises(S3CkptError) as info:
        fn()  # type: ignore[operator]
    return info.value, time.monotonic() - started


@pytest.mark.timeout(120)
def test_a_dripping_marker_ends_latest_and_load_latest_in_a_clear_error(
    proxy: FaultProxy, bucket: str
) -> None:
    ckpt = _saved(proxy, f"s3://{bucket}/run", DRIP)
    proxy.arm("GetObject", "drip", key_glob=f"*/{MANIFEST_NAME}", times=1000)
    for what in (ckpt.latest, lambda: ckpt.load(_model(2), step="latest")):
        err, took = _timed_error(what)
        assert took < BOUND, (took, err)
        text = str(err)
        assert MANIFEST_NAME in text and "min_rate" in text and " s " in text, text
    assert proxy.stats["drip"] >= 2
    ckpt.close()


@pytest.mark.timeout(120)
def test_a_dripping_data_object_ends_the_load_in_a_clear_error(
    proxy: FaultProxy, bucket: str
) -> None:
    ckpt = _saved(proxy, f"s3://{bucket}/run", DRIP)
    proxy.arm("GetObject", "drip", key_glob="*.distcp", times=1000)
    err, took = _timed_error(lambda: ckpt.load(_model(2), step=1))
    # A resumed GET's deadline counts from its first request: a body that drips gets
    # request_deadline in all, not a fresh one for each resume (236 s with the defaults).
    assert took < BOUND, (took, err)
    assert ".distcp" in str(err) and "min_rate" in str(err), err
    ckpt.close()


@pytest.mark.timeout(120)
def test_a_black_holed_endpoint_ends_save_and_load_in_bounded_time(
    proxy: FaultProxy, bucket: str
) -> None:
    ckpt = _saved(proxy, f"s3://{bucket}/run")
    proxy.arm("*", "stall", times=10**6)  # from here on nothing is answered
    for what in (lambda: ckpt.save(2, _model(2)), lambda: ckpt.load(_model(3), step=1)):
        err, took = _timed_error(what)
        assert took < BOUND, (took, err)
        assert "did not answer" in str(err) or "no complete reply" in str(err), err
    started = time.monotonic()
    try:
        ckpt.close()  # ends soon, or says what it could not do
    except S3CkptError:
        pass
    assert time.monotonic() - started < BOUND


PRUNE = ["prune", "{run}", "--policy", "{policy}", "--apply"]
FAST_FLAGS = ["--read-timeout", "1", "--max-attempts", "2"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("argv", "flags", "bound"),
    [
        (PRUNE, FAST_FLAGS, BOUND),
        (["gc", "{run}", "--apply"], FAST_FLAGS, BOUND),
        (["rm", "{run}step_000000001/"], FAST_FLAGS, BOUND),
        (PRUNE, [], 60.0),  # the defaults: the release gets a short budget, not 50 s more
    ],
    ids=["prune", "gc", "rm", "prune-defaults"],
)
def test_a_black_holed_endpoint_ends_retention_commands_in_bounded_time(
    moto_endpoint: str,
    bucket: str,
    argv: list[str],
    flags: list[str],
    bound: float,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The endpoint goes silent at the command's first delete, with the lease held: the
    delete gives up, the lease release gets the short budget and says when the lease
    expires by itself."""
    policy = tmp_path / "last1.toml"
    policy.write_text('description = "the newest"\n[keep]\nlast = 1\n')
    run = f"s3://{bucket}/run/"
    proxies: list[FaultProxy] = []

    # The first DeleteObjects of prune and rm removes the lease's capability probe object
    # (the save before probed without the delete: the pruner probes again, beside the lease);
    # the endpoint goes silent at the one after it, the checkpoint's, with the lease held.
    skip = 0 if argv[0] == "gc" else 1
    deletes: list[str] = []

    def hook(op: str, key: str, phase: str) -> None:
        if len(proxies) == 2 and op == "DeleteObjects" and phase == "before":
            deletes.append(key)
            if len(deletes) > skip:
                proxies[0].arm("*", "stall", times=10**6)  # everything after this delete

    with FaultProxy(moto_endpoint, fault_rate=0.0, hook=hook) as proxy:
        proxies.append(proxy)
        ckpt = _saved(proxy, run)
        ckpt.save(2, _model(2))
        ckpt.close()
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint_url)
        # prune and rm go silent at their first delete, the lease held; gc (nothing to
        # delete here) at its first request.
        proxy.arm("DeleteObjects" if argv[0] != "gc" else "*", "stall", times=10**6, skip=skip)
        proxies.append(proxy)  # from here on, the first delete silences the endpoint
        args = [a.format(run=run, policy=policy) for a in argv]
        started = time.monotonic()
        code = main([*args, *flags])
        took = time.monotonic() - started
    out = capsys.readouterr()
    assert code != 0 and took < bound, (code, took, out)
    assert "did not answer" in out.out + out.err, out
    if argv[0] != "gc":
        assert "expires by itself at" in caplog.text, caplog.text


@pytest.mark.timeout(150)
def test_with_the_defaults_a_save_ends_within_a_minute_of_the_endpoint_going_silent(
    proxy: FaultProxy, bucket: str
) -> None:
    ckpt = _saved(proxy, f"s3://{bucket}/run", TransferConfig())
    proxy.arm("*", "stall", times=10**6)
    err, took = _timed_error(lambda: ckpt.save(2, _model(2)))
    assert took < 60, (took, err)
