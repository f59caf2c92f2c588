"""Hostile commit markers (issue 27, item 8): a marker that cannot be parsed is one damaged row,
never a crashed scan; retention never deletes it and never takes it for the newest
checkpoint; huge durations are one-line errors, not OverflowError tracebacks."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import s3ckpt.format._manifest
from s3ckpt._time import utc
from s3ckpt._tombstone import Tombstone
from s3ckpt.cli import main
from s3ckpt.errors import CorruptCheckpointError, DeleteRefusedError, PolicyError
from s3ckpt.format._manifest import Manifest, manifest_digest
from s3ckpt.format._names import MANIFEST_NAME, MAX_INT
from s3ckpt.retention import (
    KeepLast,
    KeepWithin,
    RetentionOptions,
    delete_checkpoint,
    gc,
    list_checkpoints,
    parse_policy,
    plan,
    prune,
)
from s3ckpt.retention._duration import parse_duration
from s3ckpt.retention._scan import scan
from s3ckpt.store import Location, MemoryStore
from s3ckpt.uri import StoreURL
from tests._retention_util import write_checkpoint

T0 = datetime(2025, 1, 1, tzinfo=UTC)
ROOT = StoreURL("memory", "b", "root/")
RUN_A = ROOT.child("a")
RUN_B = ROOT.child("b")
BAD = "step_000000003"  # the newest step of run a, its marker damaged


def _store() -> MemoryStore:
    """Runs a (steps 1-3) and b (steps 1-2), every marker good."""
    store = MemoryStore("b", clock=lambda: T0.timestamp())
    for run, steps in ((RUN_A, (1, 2, 3)), (RUN_B, (1, 2))):
        for s in steps:
            write_checkpoint(store, run, s, created=T0.timestamp() - 3600 + s)
    return store


def _marker_key(run: StoreURL = RUN_A, name: str = BAD) -> str:
    return run.child(name).key(MANIFEST_NAME)


def _good_doc() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(_store().get(_marker_key()))
    return doc


def _sealed(doc: Any) -> bytes:
    """``doc`` as JSON with its digest recomputed, so the parser gets past the digest check
    (a hostile writer can do the same: the digest is no signature)."""
    if isinstance(doc, dict):
        try:
            doc = {**doc, "digest": manifest_digest(doc)}
        except (ValueError, TypeError, RecursionError):
            pass  # NaN or the like: the digest check refuses it first
    return json.dumps(doc).encode()


def _damage(store: MemoryStore, body: bytes, key: str | None = None) -> None:
    store.put(key or _marker_key(), body)


def _with(field: str, value: Any) -> bytes:
    return _sealed({**_good_doc(), field: value})


HOSTILE = {
    "created 1e20": _with("created", 1e20),
    "created NaN": _with("created", float("nan")),
    "created negative": _with("created", -1.0),
    "created a string": _with("created", "yesterday"),
    "created a bool": _with("created", True),
    "a huge step": _with("step", 10**30),
    "a step past 2**63": _with("step", MAX_INT + 1),
    "a negative world size": _with("world_size", -1),
    "format_version a string": _with("format_version", "2"),
    "metrics a list": _with("metrics", [1, 2]),
    "metrics too large for a float": _with("metrics", {"loss": 10**400}),
    "user a string": _with("user", "abc"),
    "objects a dict": _with("objects", {"a": 1}),
    "non-dict JSON (list)": b"[1, 2, 3]",
    "non-dict JSON (string)": b'"s3ckpt"',
    "JSON null": b"null",
    "empty": b"",
    "bad UTF-8": b'{"format": "\xff\xfe"}',
    "deep nesting": b"[" * 100_000 + b"]" * 100_000,
    "a 5000-digit number": b'{"format": "s3ckpt", "format_version": ' + b"9" * 5000 + b"}",
    "not JSON": b"<html>oops</html>",
}


@pytest.mark.parametrize("body", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_marker_bodies_are_corrupt_checkpoint_errors(body: bytes) -> None:
    with pytest.raises(CorruptCheckpointError) as info:
        Manifest.from_json(body, where="run/step_3/s3ckpt.json")
    message = str(info.value)
    assert "run/step_3/s3ckpt.json" in message and len(message) < 1000, message


def test_a_good_marker_still_parses() -> None:
    m = Manifest.from_json(_sealed(_good_doc()))
    assert m.step == 3 and utc(m.created) < T0


def test_a_marker_over_the_size_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    body = _sealed(_good_doc())
    monkeypatch.setattr(s3ckpt.format._manifest, "MAX_MANIFEST_BYTES", len(body) - 1)
    with pytest.raises(CorruptCheckpointError, match="more than the"):
        Manifest.from_json(body)


def test_the_scan_does_not_read_a_marker_over_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 100 MB marker is never read: the listing's size says it is too large."""
    store = _store()
    _damage(store, b" " * 4096)
    monkeypatch.setattr("s3ckpt.retention._scan.MAX_MANIFEST_BYTES", 1024)
    reads: list[str] = []
    real_get, real_range = store.get, store.open_range
    monkeypatch.setattr(store, "get", lambda k: reads.append(k) or real_get(k))
    monkeypatch.setattr(
        store, "open_range", lambda k, s=0, n=None: reads.append(k) or real_range(k, s, n)
    )
    by_name = {
        c.name: c
        for c in list_checkpoints(Location.of(RUN_A, store=store), options=RetentionOptions(now=T0))
    }
    assert by_name[BAD].damaged and "4096 bytes" in (by_name[BAD].error or "")
    assert _marker_key() not in reads
    assert not by_name["step_000000002"].damaged


def _check_scan(store: MemoryStore) -> None:
    """The scan of a root with one hostile marker: every row there, run b untouched, the
    damaged row committed with its error, JSON-ready, and never deleted or kept as newest."""
    cats = {
        c.run.prefix: c
        for c in scan(Location.of(ROOT, store=store), options=RetentionOptions(now=T0))
    }
    assert [c.name for c in cats[RUN_B.prefix].checkpoints] == ["step_000000001", "step_000000002"]
    assert not any(c.damaged for c in cats[RUN_B.prefix].checkpoints)
    rows = cats[RUN_A.prefix].checkpoints
    assert len(rows) == 3
    json.dumps([c.to_dict() for c in rows], allow_nan=False, default=str)
    bad = {c.name: c for c in rows}[BAD]
    if not bad.damaged:  # the fuzzer wrote a marker that parses: a committed checkpoint
        return
    assert bad.is_committed and bad.error and bad.committed_at is None
    p = plan(rows, KeepLast(1), T0, run=RUN_A)
    actions = {d.checkpoint.name: d for d in p.decisions}
    assert actions[BAD].action == "skip" and "damaged" in actions[BAD].reasons[0]
    # The newest readable checkpoint is the newest, not the damaged one above it.
    assert actions["step_000000002"].action == "keep"
    assert "newest committed" in actions["step_000000002"].reasons
    assert actions["step_000000001"].action == "delete"


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**62, max_value=2**70)
    | st.floats()
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)
FIELDS = [
    "format",
    "format_version",
    "save_id",
    "created",
    "step",
    "world_size",
    "byteorder",
    "layout",
    "versions",
    "metrics",
    "user",
    "metadata",
    "objects",
    "object_fields",
    "item_fields",
    "items",
    "total_bytes",
    "digest",
]


@st.composite
def marker_bodies(draw: st.DrawFn) -> bytes:
    """Raw bytes, or a good marker with fields replaced (or removed) and resealed."""
    kind = draw(st.sampled_from(["bytes", "fields", "nested"]))
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    doc = _GOOD
    doc = dict(doc)
    for name in draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=3)):
        if draw(st.booleans()):
            doc.pop(name, None)
        else:
            doc[name] = draw(json_values)
    if kind == "nested":
        meta = dict(_GOOD["metadata"])
        meta[draw(st.sampled_from(["key", "crc32c", "size"]))] = draw(json_values)
        doc["metadata"] = meta
        objects = [list(o) for o in _GOOD["objects"]]
        objects[0][draw(st.integers(0, 2))] = draw(json_values)
        doc["objects"] = objects
    return _sealed(doc)


_GOOD = _good_doc()
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(marker_bodies())
def test_fuzzed_markers_parse_or_raise_corrupt_checkpoint_error(body: bytes) -> None:
    try:
        m = Manifest.from_json(body)
    except CorruptCheckpointError:
        return
    # Whatever parses is usable: a time datetime holds, steps and sizes in range.
    assert utc(m.created) < datetime(3000, 1, 1, tzinfo=UTC)
    assert m.step is None or 0 <= m.step <= MAX_INT
    assert all(math.isfinite(v) or math.isnan(v) or math.isinf(v) for v in m.metrics.values())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(marker_bodies())
def test_a_fuzzed_marker_is_one_row_of_a_scan_that_goes_on(body: bytes) -> None:
    store = _store()
    _damage(store, body)
    _check_scan(store)


@pytest.mark.parametrize("body", HOSTILE.values(), ids=HOSTILE.keys())
def test_each_hostile_marker_is_one_damaged_row(body: bytes) -> None:
    store = _store()
    _damage(store, body)
    _check_scan(store)
    bad = {
        c.name: c
        for c in list_checkpoints(Location.of(RUN_A, store=store), options=RetentionOptions(now=T0))
    }[BAD]
    assert bad.damaged and bad.to_dict()["damaged"] is True


def test_prune_apply_never_deletes_the_damaged_one_nor_the_real_newest() -> None:
    store = _store()
    _damage(store, HOSTILE["created 1e20"])
    result = prune(
        Location.of(RUN_A, store=store), KeepLast(1), apply=True, options=RetentionOptions(now=T0)
    )
    assert result.deleted == ("step_000000001",), result.deleted
    left = {
        c.name: c
        for c in list_checkpoints(Location.of(RUN_A, store=store), options=RetentionOptions(now=T0))
    }
    assert set(left) == {"step_000000002", BAD} and left[BAD].damaged
    assert store.head(_marker_key()) is not None


def test_a_damaged_checkpoint_is_no_newest_for_rm_either() -> None:
    """rm refuses the newest readable checkpoint without allow_newest, and deletes the
    damaged one when asked for it by name."""
    store = _store()
    _damage(store, HOSTILE["non-dict JSON (list)"])
    later = T0 + timedelta(days=1)  # past the grace period: no save is live
    with pytest.raises(DeleteRefusedError, match="newest"):
        delete_checkpoint(
            Location.of(RUN_A.child("step_000000002"), store=store),
            options=RetentionOptions(now=later),
        )
    result = delete_checkpoint(
        Location.of(RUN_A.child(BAD), store=store), options=RetentionOptions(now=later)
    )
    # A damaged marker names no committed save: every save's names there were reaped, so its
    # fence stays, finished (gone: not listed)
    tomb = Tombstone.parse(store.get(_marker_key()))
    assert result.deleted and tomb is not None and tomb.done
    assert BAD not in {
        c.name
        for c in list_checkpoints(
            Location.of(RUN_A, store=store), options=RetentionOptions(now=later)
        )
    }


def test_gc_deletes_nothing_of_a_damaged_checkpoint_and_reports_it() -> None:
    store = _store()
    _damage(store, HOSTILE["bad UTF-8"])
    before = {o.key for o in store.list(RUN_A.child(BAD).prefix)}
    result = gc(
        Location.of(ROOT, store=store),
        apply=True,
        options=RetentionOptions(now=T0 + timedelta(days=30)),
    )
    assert [str(c.url) for c in result.damaged] == [str(RUN_A.child(BAD))]
    assert {o.key for o in store.list(RUN_A.child(BAD).prefix)} == before
    assert result.to_dict()["damaged"][0]["url"] == str(RUN_A.child(BAD))


# -- the CLI, on a local folder ------------------------------------------------------------------
@pytest.fixture
def folder(tmp_path: Path) -> Path:
    from s3ckpt.store import open_store
    from s3ckpt.uri import parse_location

    store, root = open_store(parse_location(tmp_path))
    now = datetime.now(UTC).timestamp()
    for run, steps in (("a", (1, 2, 3)), ("b", (1, 2))):
        for s in steps:
            write_checkpoint(store, root.child(run), s, created=now - 86400 + s)
    (tmp_path / "a" / BAD / MANIFEST_NAME).write_bytes(HOSTILE["created 1e20"])
    return tmp_path


def _one_warning(err: str, command: str) -> None:
    lines = [ln for ln in err.splitlines() if "warning: damaged checkpoint" in ln]
    assert len(lines) == 1 and f"s3ckpt {command}: warning" in lines[0], err
    assert BAD in lines[0] and "created 1e+20" in lines[0], err
    assert "Traceback" not in err


def test_cli_ls_lists_the_damaged_row_warns_and_exits_1(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["ls", str(folder), "--no-progress"]) == 1
    out, err = capsys.readouterr()
    _one_warning(err, "ls")
    row = [ln for ln in out.splitlines() if ln.split()[:1] == [BAD]]
    assert len(row) == 1 and row[0].split()[2] == "damaged", out
    assert out.count("step_000000001") == 2  # both runs listed
    assert main(["ls", str(folder), "--json"]) == 1
    out, err = capsys.readouterr()
    doc = json.loads(out)
    damaged = [c for r in doc["runs"] for c in r["checkpoints"] if c["damaged"]]
    assert [c["name"] for c in damaged] == [BAD] and damaged[0]["state"] == "committed"
    _one_warning(err, "ls")


def test_cli_prune_and_gc_process_the_rest_and_exit_1(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "keep1.toml"
    policy.write_text("[keep]\nlast = 1\n")
    for apply in ([], ["--apply"]):
        assert main(["prune", str(folder), "--policy", str(policy), "--no-progress", *apply]) == 1
        out, err = capsys.readouterr()
        _one_warning(err, "prune")
        assert "damaged, never deleted by a plan" in out, out
    assert not (folder / "a" / "step_000000001" / MANIFEST_NAME).exists()  # pruned around it
    assert not (folder / "b" / "step_000000001" / MANIFEST_NAME).exists()  # run b as usual
    assert (folder / "a" / BAD / MANIFEST_NAME).exists()
    assert (folder / "a" / "step_000000002" / MANIFEST_NAME).exists()
    assert main(["gc", str(folder), "--apply", "--no-progress"]) == 1
    _one_warning(capsys.readouterr().err, "gc")
    assert (folder / "a" / BAD / MANIFEST_NAME).exists()


# -- durations ----------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["99999999999d", "36501d", "9" * 400 + "s", "100000000w"])
def test_huge_durations_are_value_errors(text: str) -> None:
    with pytest.raises(ValueError, match="longest s3ckpt takes"):
        parse_duration(text)


def test_the_longest_duration_still_parses() -> None:
    assert parse_duration("36500d") == timedelta(days=36500)


def test_a_huge_within_in_a_policy_file_is_a_policy_error() -> None:
    with pytest.raises(PolicyError, match=r"keep\.within.*longest s3ckpt takes"):
        parse_policy("[keep]\nwithin = '99999999999d'\n", source="p.toml")
    with pytest.raises(PolicyError, match="at most 36500 days"):
        KeepWithin(timedelta(days=999_999_999))


@pytest.mark.parametrize(
    "argv",
    [
        ["ls", "{path}", "--grace", "99999999999d"],
        ["gc", "{path}", "--older-than", "99999999999d"],
        ["prune", "{path}", "--policy", "pretraining", "--lease-ttl", "99999999999d"],
        ["prune", "{path}", "--policy", "pretraining", "--now", "0001-01-01T00:00:00Z"],
        ["prune", "{path}", "--policy", "{policy}"],
    ],
)
def test_huge_durations_on_the_command_line_are_one_line_errors(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "p.toml"
    policy.write_text("[keep]\nwithin = '99999999999d'\n")
    args = [a.format(path=tmp_path, policy=policy) for a in argv]
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "OverflowError" not in err, err
    assert len([ln for ln in err.splitlines() if "error:" in ln]) == 1, err
