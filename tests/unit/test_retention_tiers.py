"""Storage tiers (issue 31): parsing, planning, apply, crash convergence, on MemoryStore."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from s3ckpt.errors import PolicyError
from s3ckpt.format._names import ITEMS_PREFIX, MANIFEST_NAME, METADATA_NAME, heartbeat_name
from s3ckpt.retention import (
    KeepBest,
    KeepEvery,
    KeepLast,
    PolicyFile,
    RetentionOptions,
    Tier,
    list_checkpoints,
    plan,
    prune,
)
from s3ckpt.retention._lease import Lease
from s3ckpt.retention._tiers import TIER_TAG
from s3ckpt.retention._transition import movable_keys
from s3ckpt.store import Location, MemoryStore
from s3ckpt.uri import StoreURL
from tests._retention_util import Clock, clock_and_store_fixtures, new_tag, write_checkpoint

T0 = datetime(2025, 1, 1, tzinfo=UTC)
RUN = StoreURL("memory", "b", "runs/a/")

clock, store = clock_and_store_fixtures(T0)

TIERED = """
[keep]
last = 2
every = 1000

[[tier]]
rule = { every = 1000 }
storage_class = "GLACIER_IR"
after = "7d"

[[tier]]
rule = { best = { metric = "loss", n = 1 } }
storage_class = "STANDARD_IA"
"""


def fill(store: MemoryStore, clock: Clock, steps: list[int], *, per_save: bool = True) -> None:
    for s in steps:
        clock.t = T0.timestamp() + s * 60
        write_checkpoint(
            store, RUN, s, created=clock.t, metrics={"loss": 1000.0 / s}, per_save_metadata=per_save
        )


def classes(store: MemoryStore, prefix: str) -> dict[str, str]:
    return {o.key[len(prefix) :]: o.storage_class or "STANDARD" for o in store.list(prefix)}


def later(clock: Clock, days: float) -> datetime:
    return datetime.fromtimestamp(clock.t, UTC) + timedelta(days=days)


# -- parsing -----------------------------------------------------------------------------------
def test_tier_tables_parse_into_tiers_in_file_order() -> None:
    f = PolicyFile.parse(TIERED, "tiered.toml")
    assert [t.storage_class for t in f.tiers] == ["GLACIER_IR", "STANDARD_IA"]
    assert f.tiers[0].rule == KeepEvery(1000)
    assert f.tiers[0].after == timedelta(days=7)
    assert f.tiers[1].rule == KeepBest(1, "loss")
    assert f.tiers[1].after is None and f.tiers[1].method == "copy"
    assert f.options().tiers == f.tiers
    # A run's own tiers win over the file's.
    own = (Tier(KeepLast(1), "ONEZONE_IA", method="tag"),)
    assert f.options(RetentionOptions(tiers=own)).tiers == own


@pytest.mark.parametrize(
    ("table", "field", "words"),
    [
        (
            'rule = { every = 10 }\nstorage_class = "GLACIERR"',
            "tier[0].storage_class",
            "GLACIER_IR",
        ),
        ('rule = { every = 10 }\nstorage_class = "STANDARD"', "tier[0].storage_class", "one of"),
        ('rule = { every = 10 }\nstorage_class = "GLACIER"\nafter = "7x"', "tier[0].after", "7x"),
        ('rule = { evry = 10 }\nstorage_class = "GLACIER"', "tier[0].rule.evry", "allowed"),
        ('rule = { pinned = true }\nstorage_class = "GLACIER"', "tier[0].rule", "no rule"),
        ('rule = 5\nstorage_class = "GLACIER"', "tier[0].rule", "inline table"),
        ('storage_class = "GLACIER"', "tier[0].rule", "required"),
        (
            'rule = { last = 1 }\nstorage_class = "GLACIER"\nmethod = "move"',
            "tier[0].method",
            "tag",
        ),
        ('rule = { last = 1 }\nstorage_class = "GLACIER"\ncolour = 1', "tier[0].colour", "allowed"),
    ],
)
def test_a_malformed_tier_names_the_file_table_and_field(
    table: str, field: str, words: str
) -> None:
    with pytest.raises(PolicyError) as info:
        PolicyFile.parse(f"[keep]\nlast = 1\n\n[[tier]]\n{table}\n", "p.toml")
    assert info.value.field == field and info.value.source == "p.toml"
    assert str(info.value).startswith(f"p.toml: {field}: ") and words in str(info.value)


def test_tier_values_are_validated() -> None:
    with pytest.raises(PolicyError, match="storage_class"):
        Tier(KeepLast(1), "GLACIER_FLEXIBLE")
    with pytest.raises(PolicyError, match="rule"):
        Tier("last 1", "GLACIER")  # type: ignore[arg-type]
    with pytest.raises(PolicyError, match="method"):
        Tier(KeepLast(1), "GLACIER", method="move")  # type: ignore[arg-type]
    with pytest.raises(PolicyError, match="after"):
        Tier(KeepLast(1), "GLACIER", after=timedelta(days=-1))
    with pytest.raises(PolicyError, match="Tier"):
        RetentionOptions(tiers=("GLACIER",))  # type: ignore[arg-type]
    assert str(Tier(KeepEvery(10), "GLACIER_IR", timedelta(days=7), "tag")) == (
        "every 10 steps -> GLACIER_IR after 1w (tag)"
    )


# -- planning ----------------------------------------------------------------------------------
def test_plan_picks_the_first_tier_whose_rule_selects_and_whose_after_passed(
    store: MemoryStore, clock: Clock
) -> None:
    fill(store, clock, [1000, 1500, 2000, 2100, 2200])
    cat = list_checkpoints(
        Location.of(RUN, store=store), options=RetentionOptions(now=later(clock, 1))
    )
    f = PolicyFile.parse(TIERED)
    early = plan(cat, f.policy, later(clock, 1), options=f.options())
    # Not 7 days yet: the every-1000 ones are not moved; the best (2200, newest) goes to IA.
    assert {t.name: t.storage_class for t in early.transitions} == {"step_000002200": "STANDARD_IA"}
    late = plan(cat, f.policy, later(clock, 8), options=f.options())
    moves = {t.name: (t.tier, t.storage_class) for t in late.transitions}
    assert moves == {
        "step_000001000": (0, "GLACIER_IR"),
        "step_000002000": (0, "GLACIER_IR"),
        "step_000002200": (1, "STANDARD_IA"),
    }
    why = {t.name: t.reasons for t in late.transitions}["step_000001000"]
    assert why[0] == "every 1000 steps (step 1000)" and "after 1w" in why[1]
    # Never one the plan deletes (1500 is deleted), nor one no tier selects (2100).
    assert {c.name for c in late.delete} == {"step_000001500"}


def test_plan_never_moves_a_checkpoint_being_overwritten(store: MemoryStore, clock: Clock) -> None:
    fill(store, clock, [1000, 2000])
    ckpt = RUN.child("step_000001000")
    store.put(ckpt.key(heartbeat_name(new_tag(), 0)), b"")  # a save writing into it now
    cat = list_checkpoints(
        Location.of(RUN, store=store),
        options=RetentionOptions(now=datetime.fromtimestamp(clock.t + 60, UTC)),
    )
    tiers = (Tier(KeepEvery(1000), "GLACIER_IR"),)
    p = plan(
        cat,
        KeepLast(5),
        datetime.fromtimestamp(clock.t + 60, UTC),
        options=RetentionOptions(tiers=tiers),
    )
    assert [t.name for t in p.transitions] == ["step_000002000"]


# -- apply -------------------------------------------------------------------------------------
def test_apply_moves_data_and_metadata_and_leaves_the_marker_and_controls(
    store: MemoryStore, clock: Clock
) -> None:
    fill(store, clock, [1000, 2000])
    at = {
        c.name: c.committed_at
        for c in list_checkpoints(
            Location.of(RUN, store=store), options=RetentionOptions(now=later(clock, 1))
        )
    }
    clock.t += 3600
    tiers = (Tier(KeepEvery(1000), "GLACIER_IR"),)
    r = prune(
        Location.of(RUN, store=store),
        KeepLast(5),
        apply=True,
        options=RetentionOptions(now=later(clock, 1), tiers=tiers),
    )
    assert r.ok and set(r.transitioned) == {"step_000001000", "step_000002000"}
    got = classes(store, RUN.child("step_000001000").prefix)
    stays = {MANIFEST_NAME} | {n for n in got if n.startswith((METADATA_NAME + ".", ITEMS_PREFIX))}
    assert len(stays) == 3  # the marker, the item records and the per-save metadata (its time)
    for name, cls in got.items():
        assert cls == ("STANDARD" if name in stays else "GLACIER_IR"), name
    assert r.objects_moved == 2 * 4 and r.transition_requests == 8
    assert r.bytes_moved == sum(t.bytes or 0 for t in r.plan.transitions)
    # The commit time did not move: the catalog orders and ages as before.
    assert {
        c.name: c.committed_at
        for c in list_checkpoints(
            Location.of(RUN, store=store), options=RetentionOptions(now=later(clock, 1))
        )
    } == at
    # A converged run sends no copy.
    again = prune(
        Location.of(RUN, store=store),
        KeepLast(5),
        apply=True,
        options=RetentionOptions(now=later(clock, 2), tiers=tiers),
    )
    assert again.transition_requests == 0 and again.plan.objects_to_move == 0


def test_dry_run_explains_each_transition_and_moves_nothing(
    store: MemoryStore, clock: Clock
) -> None:
    fill(store, clock, [1000])
    f = PolicyFile(KeepLast(3), tiers=(Tier(KeepEvery(1000), "GLACIER_IR"),))
    r = prune(Location.of(RUN, store=store), f, options=RetentionOptions(now=later(clock, 1)))
    (t,) = r.plan.transitions
    assert (t.objects, t.from_classes, t.storage_class) == (4, {"STANDARD": t.bytes}, "GLACIER_IR")
    assert r.to_dict()["transitions"][0]["reasons"] == ["every 1000 steps (step 1000)"]
    assert set(classes(store, RUN.prefix).values()) == {"STANDARD"}


def test_tag_method_tags_instead_of_copying(store: MemoryStore, clock: Clock) -> None:
    fill(store, clock, [1000, 2000])  # step 2000, the resume point, stays out of GLACIER
    sent: list[tuple[str, dict[str, str]]] = []
    orig = store.put_object_tags

    def spy(key: str, tags: Any) -> None:
        sent.append((key, dict(tags)))
        orig(key, tags)

    store.put_object_tags = spy  # type: ignore[method-assign]
    tiers = (Tier(KeepEvery(1000), "GLACIER", method="tag"),)
    r = prune(
        Location.of(RUN, store=store),
        KeepLast(3),
        apply=True,
        options=RetentionOptions(now=later(clock, 1), tiers=tiers),
    )
    assert r.ok and r.objects_moved == 4 and len(sent) == 4
    assert all(tags == {TIER_TAG: "GLACIER"} for _, tags in sent)
    assert set(classes(store, RUN.prefix).values()) == {"STANDARD"}  # the lifecycle moves
    assert all("step_000001000/" in key for key, _ in sent)


@pytest.mark.parametrize(("cls", "moved"), [("GLACIER", False), ("GLACIER_IR", True)])
def test_the_resume_point_never_goes_to_an_archive_class(
    store: MemoryStore, clock: Clock, cls: str, moved: bool
) -> None:
    """A restarting job loads the newest checkpoint at once: an archive class would need a
    restore first, a class that reads at once is fine."""
    fill(store, clock, [1000, 2000])
    tiers = (Tier(KeepEvery(1000), cls),)
    r = prune(
        Location.of(RUN, store=store),
        KeepLast(3),
        apply=True,
        options=RetentionOptions(now=later(clock, 1), tiers=tiers),
    )
    assert r.ok
    newest = {k: v for k, v in classes(store, RUN.prefix).items() if "step_000002000/" in k}
    data = [v for k, v in newest.items() if k.endswith(".distcp")]
    assert data and all(v == (cls if moved else "STANDARD") for v in data)
    older = [v for k, v in classes(store, RUN.prefix).items() if "step_000001000/" in k]
    assert cls in older  # the older one moves either way


def test_a_save_starting_between_plan_and_apply_is_skipped(
    store: MemoryStore, clock: Clock
) -> None:
    fill(store, clock, [1000])
    ckpt = RUN.child("step_000001000")

    def on_progress(event: str, details: dict[str, Any]) -> None:
        if event == "plan":  # after the scan and the plan, before anything moves
            store.put(ckpt.key(heartbeat_name(new_tag(), 0)), b"")

    opts = RetentionOptions(
        now=later(clock, 0), tiers=(Tier(KeepEvery(1000), "GLACIER_IR"),), on_progress=on_progress
    )
    # The heartbeat lands after the scan: the survey (listing again) sees it.
    clock.t += 1
    r = prune(Location.of(RUN, store=store), KeepLast(3), apply=True, options=opts)
    assert r.objects_moved == 0 and r.transitioned == ()
    (t,) = r.plan.transitions
    assert t.skipped is not None and "started writing" in t.skipped


class Killed(Exception):
    pass


def test_a_transition_killed_half_way_converges_on_the_next_run(
    store: MemoryStore, clock: Clock
) -> None:
    fill(store, clock, [1000, 2000, 3000])
    calls = 0
    copy = store.set_storage_class

    def copy_then_die(key: str, cls: str, **kw: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls > 5:  # the 6th copy never happens: the process "dies" there
            raise Killed
        return copy(key, cls, **kw)

    store.set_storage_class = copy_then_die  # type: ignore[method-assign]
    tiers = (Tier(KeepEvery(1000), "STANDARD_IA"),)
    with pytest.raises(Killed):
        prune(
            Location.of(RUN, store=store),
            KeepLast(5),
            apply=True,
            options=RetentionOptions(now=later(clock, 1), tiers=tiers),
        )
    store.set_storage_class = copy  # type: ignore[method-assign]
    left = [o for o in store.list(RUN.prefix) if (o.storage_class or "STANDARD") == "STANDARD"]
    done = [o for o in store.list(RUN.prefix) if o.storage_class == "STANDARD_IA"]
    assert 5 <= len(done) < 12 and left  # half-way
    # The released lease keeps the transitions in its intent log.
    lease = Lease(store, RUN).acquire()
    assert lease.previous is not None and set(lease.previous.moving) == {
        "step_000001000",
        "step_000002000",
        "step_000003000",
    }
    lease.release(moving=lease.previous.moving)  # hand the log on, untouched
    # The next run, with no tiers at all, still finishes the recorded transitions.
    r = prune(
        Location.of(RUN, store=store),
        KeepLast(5),
        apply=True,
        options=RetentionOptions(now=later(clock, 1)),
    )
    assert r.ok and set(r.resumed_moves) <= set(r.transitioned)
    assert r.objects_moved == 12 - len(done)
    for c in ("step_000001000", "step_000002000", "step_000003000"):
        got = classes(store, RUN.child(c).prefix)
        assert sorted(got.values()).count("STANDARD_IA") == 4, got
    # And the log is empty now: a third run sends nothing.
    third = prune(
        Location.of(RUN, store=store),
        KeepLast(5),
        apply=True,
        options=RetentionOptions(now=later(clock, 1), tiers=tiers),
    )
    assert third.transition_requests == 0 and third.resumed_moves == ()


def test_movable_keys_exclude_the_marker_and_per_save_metadata(
    store: MemoryStore, clock: Clock
) -> None:
    fill(store, clock, [1000])
    (c,) = list_checkpoints(
        Location.of(RUN, store=store), options=RetentionOptions(now=later(clock, 1))
    )
    names = {k.rpartition("/")[2] for k in movable_keys(c)}
    assert METADATA_NAME in names and MANIFEST_NAME not in names
    assert not any(n.startswith(METADATA_NAME + ".") for n in names)
    assert len(names) == 4


def test_the_ready_made_tiered_policy_loads_with_its_tiers(
    store: MemoryStore, clock: Clock
) -> None:
    from s3ckpt.checkpointer._retention import resolve_policy
    from s3ckpt.retention import load_policy
    from tests.unit.test_retention_policy import POLICIES

    assert (POLICIES / "pretraining-tiered.toml").is_file()  # picked up by the glob test too
    f = PolicyFile.load(POLICIES / "pretraining-tiered.toml")
    assert [(t.storage_class, t.after) for t in f.tiers] == [
        ("GLACIER_IR", timedelta(days=7)),
        ("STANDARD_IA", None),
    ]
    # load_policy / the Checkpointer's policy= keep the tiers: a prune given the Policy moves.
    for policy in (load_policy(POLICIES / "pretraining-tiered.toml"), resolve_policy(f)):
        assert policy is not None and PolicyFile.of(policy).tiers == f.tiers
    fill(store, clock, [10000, 20000])
    policy = resolve_policy(str(POLICIES / "pretraining-tiered.toml"))
    assert policy is not None
    r = prune(
        Location.of(RUN, store=store),
        policy,
        apply=True,
        options=RetentionOptions(now=later(clock, 8)),
    )
    assert set(r.transitioned) == {"step_000010000", "step_000020000"}
    assert {o.storage_class for o in store.list(RUN.child("step_000010000").prefix)} == {
        None,
        "GLACIER_IR",
    }


def test_ls_class_column_names_the_data_class_or_mixed(store: MemoryStore, clock: Clock) -> None:
    import dataclasses

    from s3ckpt._cli._retention_output import class_label

    fill(store, clock, [1000])
    (c,) = list_checkpoints(
        Location.of(RUN, store=store), options=RetentionOptions(now=later(clock, 1))
    )

    def with_classes(by: dict[str, int]) -> str:
        return class_label(dataclasses.replace(c, bytes_by_class=by, size=sum(by.values())))

    assert with_classes({"STANDARD": 1000}) == "STANDARD"
    assert with_classes({"STANDARD": 10, "GLACIER_IR": 990}) == "GLACIER_IR"  # marker stays
    assert with_classes({"STANDARD": 500, "GLACIER_IR": 500}) == "mixed"
    assert with_classes({"STANDARD_IA": 500, "GLACIER_IR": 500}) == "mixed"
    assert with_classes({}) == "-"
