"""Storage tiers chosen by policy (issue 31), over HTTP to moto: a tiered prune leaves the
selected checkpoints' objects in their classes (HeadObject), loads stay bit-exact, a
transition killed half-way converges on the next run, the CLI explains and applies, and the
report's costs move as the plan says."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from s3ckpt import S3Config, S3StorageReader, S3StorageWriter
from s3ckpt.cli import main
from s3ckpt.config import MiB
from s3ckpt.format._names import ITEMS_PREFIX, MANIFEST_NAME, METADATA_NAME
from s3ckpt.retention import KeepEvery, KeepLast, RetentionOptions, Tier, list_checkpoints, prune
from s3ckpt.store import Location
from s3ckpt.store.s3 import S3Store
from s3ckpt.tools._report import PriceTable, collect_report
from s3ckpt.uri import StoreURL
from tests import _helpers
from tests._helpers import assert_same, zeros_like_state

pytestmark = pytest.mark.integration

SMALL = dataclasses.replace(_helpers.SMALL, target_object_size=1 * MiB)
STEPS = (1000, 1500, 2000)


def _state(step: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(step)
    return {"w": torch.randn(256, 1024, generator=g), "b": torch.randn(64, generator=g)}


def _save_run(bucket: str) -> dict[int, dict[str, Any]]:
    out = {}
    for step in STEPS:
        sd = _state(step)
        url = f"s3://{bucket}/run/step_{step:09d}"
        dcp.save(sd, storage_writer=S3StorageWriter(url, transfer_config=SMALL))
        out[step] = sd
    return out


def _classes(client: Any, bucket: str, prefix: str) -> dict[str, str]:
    """Every object's class by HeadObject (STANDARD when the header is absent)."""
    keys = [
        o["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for o in page.get("Contents", ())
    ]
    return {
        k[len(prefix) :]: client.head_object(Bucket=bucket, Key=k).get("StorageClass", "STANDARD")
        for k in keys
    }


def _later(days: float) -> datetime:
    return datetime.now(UTC) + timedelta(days=days)


def _moved_right(got: dict[str, str], cls: str) -> None:
    for name, c in got.items():
        stays = name == MANIFEST_NAME or name.startswith((METADATA_NAME + ".", ITEMS_PREFIX))
        assert c == ("STANDARD" if stays else cls), (name, c)
    assert METADATA_NAME in got and got[METADATA_NAME] == cls


@pytest.mark.parametrize("cls", ["GLACIER_IR", "STANDARD_IA"])
def test_a_tiered_prune_moves_the_selected_and_loads_stay_bit_exact(
    bucket: str, s3_client: Any, moto_endpoint: str, cls: str
) -> None:
    states = _save_run(bucket)
    store = S3Store(bucket, S3Config(endpoint_url=moto_endpoint))
    run = StoreURL("s3", bucket, "run/")
    tiers = (Tier(KeepEvery(1000), cls, after=timedelta(days=7)),)
    # Not old enough yet: nothing moves.
    r = prune(
        Location.of(run, store=store),
        KeepLast(5),
        apply=True,
        options=RetentionOptions(now=_later(1), tiers=tiers),
    )
    assert r.plan.transitions == () and r.transition_requests == 0
    r = prune(
        Location.of(run, store=store),
        KeepLast(5),
        apply=True,
        options=RetentionOptions(now=_later(8), tiers=tiers),
    )
    assert r.ok and set(r.transitioned) == {"step_000001000", "step_000002000"}
    for step in (1000, 2000):
        _moved_right(_classes(s3_client, bucket, f"run/step_{step:09d}/"), cls)
    assert set(_classes(s3_client, bucket, "run/step_000001500/").values()) == {"STANDARD"}
    for step, sd in states.items():
        out = zeros_like_state(sd)
        url = f"s3://{bucket}/run/step_{step:09d}"
        dcp.load(out, storage_reader=S3StorageReader(url, transfer_config=SMALL))
        assert_same(sd, out)
    # ls shows the class; a converged run sends no copy.
    (c1000,) = [
        c for c in list_checkpoints(Location.of(run, store=store)) if c.name == "step_000001000"
    ]
    assert max(c1000.bytes_by_class, key=lambda k: c1000.bytes_by_class[k]) == cls
    again = prune(
        Location.of(run, store=store),
        KeepLast(5),
        apply=True,
        options=RetentionOptions(now=_later(9), tiers=tiers),
    )
    assert again.transition_requests == 0 and again.objects_moved == 0


class Killed(Exception):
    pass


def test_a_transition_killed_half_way_converges_on_the_next_run(
    bucket: str, s3_client: Any, moto_endpoint: str
) -> None:
    _save_run(bucket)
    store = S3Store(bucket, S3Config(endpoint_url=moto_endpoint))
    run = StoreURL("s3", bucket, "run/")
    calls = 0
    copy = store.set_storage_class

    def copy_then_die(key: str, cls: str, **kw: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls > 3:  # the 4th copy never happens: the process "dies" there
            raise Killed
        return copy(key, cls, **kw)

    store.set_storage_class = copy_then_die  # type: ignore[method-assign]
    tiers = (Tier(KeepLast(5), "STANDARD_IA"),)
    with pytest.raises(Killed):
        prune(
            Location.of(run, store=store),
            KeepLast(5),
            apply=True,
            options=RetentionOptions(tiers=tiers),
        )
    store.set_storage_class = copy  # type: ignore[method-assign]
    half = _classes(s3_client, bucket, "run/")
    movable = [
        k
        for k in half
        if "/" in k
        and not k.endswith(MANIFEST_NAME)
        and "/.metadata." not in k
        and "/" + ITEMS_PREFIX not in k
    ]
    done = [k for k in movable if half[k] == "STANDARD_IA"]
    assert 3 <= len(done) < len(movable)
    r = prune(
        Location.of(run, store=store),
        KeepLast(5),
        apply=True,
        options=RetentionOptions(tiers=tiers),
    )
    assert r.ok and r.objects_moved == len(movable) - len(done)
    for step in STEPS:
        _moved_right(_classes(s3_client, bucket, f"run/step_{step:09d}/"), "STANDARD_IA")


def test_cli_explains_applies_and_the_report_costs_move_as_planned(
    bucket: str,
    s3_client: Any,
    moto_endpoint: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _save_run(bucket)
    policy = tmp_path / "tiered.toml"
    policy.write_text(
        '[keep]\nlast = 5\n\n[[tier]]\nrule = { every = 1000 }\nstorage_class = "GLACIER_IR"\n'
    )
    url = f"s3://{bucket}/run/"
    store = S3Store(bucket, S3Config(endpoint_url=moto_endpoint))
    prices = PriceTable()
    before = collect_report(
        Location.of(StoreURL("s3", bucket, "run/"), store=store), policy=_load(policy)
    )
    (rr,) = before.runs
    assert rr.cost_after < rr.cost and rr.bytes_to_move > 0
    assert main(["prune", url, "--policy", str(policy), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    moves = doc["transitions"] if "transitions" in doc else doc["runs"][0]["transitions"]
    assert {m["checkpoint"] for m in moves} == {"step_000001000", "step_000002000"}
    assert all(m["storage_class"] == "GLACIER_IR" and m["objects"] > 0 for m in moves)
    assert main(["prune", url, "--policy", str(policy)]) == 0
    text = capsys.readouterr().out
    assert "step_000001000: tier 0: STANDARD" in text and "-> GLACIER_IR" in text
    assert main(["prune", url, "--policy", str(policy), "--apply"]) == 0
    assert "moved 2 checkpoints" in capsys.readouterr().out
    assert main(["ls", url]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[2:]}
    assert "GLACIER_IR" in rows["step_000001000"] and "STANDARD" in rows["step_000001500"]
    # The report after the move costs what the plan said it would.
    after = collect_report(Location.of(StoreURL("s3", bucket, "run/"), store=store), prices=prices)
    assert after.runs[0].cost == pytest.approx(rr.cost_after, rel=1e-9)


def _load(path: Path) -> Any:
    from s3ckpt.retention import PolicyFile

    return PolicyFile.load(path)
