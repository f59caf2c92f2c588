"""Steps from checkpoint names: the frameworks' forms, a run's own pattern (policy files, the
CLI), and the marker's step winning over both."""

from __future__ import annotations

import re
import warnings
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from s3ckpt._step_names import MAX_STEP_DIGITS, checkpoint_step, compile_step_pattern
from s3ckpt.cli import main
from s3ckpt.errors import ConfigError, PolicyError
from s3ckpt.format._names import checkpoint_name
from s3ckpt.retention import (
    KeepEvery,
    KeepLast,
    PolicyFile,
    RetentionOptions,
    list_checkpoints,
    load_policy,
    parse_policy,
    prune,
)
from s3ckpt.store import Location, MemoryStore, open_store
from s3ckpt.uri import StoreURL, parse_location
from tests._retention_util import write_checkpoint

RUN = StoreURL("memory", "b", "runs/a/")
T0 = datetime(2025, 1, 1, tzinfo=UTC)
PATTERN = r"ckpt_e\d+_s(\d+)"
steps = st.integers(0, 10**MAX_STEP_DIGITS - 1)
PROPS = settings(max_examples=200, deadline=None)


@pytest.mark.parametrize(
    "name,step",
    [
        ("step_000000100", 100),  # the Checkpointer
        ("step_4", 4),
        ("step-4", 4),  # torchtitan
        ("step=4.ckpt", 4),  # Lightning
        ("step=4", 4),
        ("epoch=0-step=4.ckpt", 4),
        ("epoch=1-step=200-v1.ckpt", 200),  # Lightning's version suffix
        ("epoch=0-step=4-val_loss=-0.53.ckpt", 4),  # a metric (negative) in the name
        ("global_step4", 4),  # DeepSpeed
        ("global_step=4", 4),  # Lightning, a metric named global_step
        ("checkpoint-4", 4),  # Hugging Face Trainer
        ("step_4.pt", 4),
        ("step_4-global_step4", 4),  # the same number twice
        ("last.ckpt", None),
        ("last", None),
        ("epoch=3.ckpt", None),
        ("checkpoint_4", None),  # accelerate counts saves, not steps
        ("checkpoint-4-best", None),
        ("step_4-step_8", None),  # two different steps: ambiguous
        ("epoch=0-step=4-warmup_step=10", None),
        ("restep_4", None),  # glued to a word
        ("steps_4", None),
        ("step_4a", None),
        ("step=4.5", None),
        ("Step_4", None),
        ("step4", None),
        ("step_", None),
        ("step_" + "1" * (MAX_STEP_DIGITS + 1), None),  # no step is that long
        ("step_\u0664", None),  # an Arabic-Indic four is no ASCII digit
        ("", None),
    ],
)
def test_framework_names(name: str, step: int | None) -> None:
    assert checkpoint_step(name) == step


FORMS = [
    "step_{s:09d}",
    "step_{s}",
    "step-{s}",
    "step={s}.ckpt",
    "epoch={e}-step={s}.ckpt",
    "epoch={e}-step={s}-v{e}.ckpt",
    "epoch={e}-step={s}-val_loss=0.{e}.ckpt",
    "global_step{s}",
    "checkpoint-{s}",
]


@PROPS
@given(st.sampled_from(FORMS), steps, st.integers(0, 10**6))
def test_every_form_gives_back_its_step(form: str, step: int, epoch: int) -> None:
    assert checkpoint_step(form.format(s=step, e=epoch)) == step


@PROPS
@given(steps)
def test_checkpoint_name_round_trips(step: int) -> None:
    assert checkpoint_step(checkpoint_name(step)) == step


@PROPS
@given(steps, steps, st.sampled_from(["step_{}", "step={}", "global_step{}"]))
def test_two_different_steps_are_ambiguous(a: int, b: int, second: str) -> None:
    name = f"step-{a}_{second.format(b)}"
    assert checkpoint_step(name) == (a if a == b else None)


@PROPS
@given(st.text(min_size=1, max_size=4).filter(lambda t: t[-1].isascii() and t[-1].isalnum()))
def test_a_step_word_glued_to_a_word_is_no_step(head: str) -> None:
    assert checkpoint_step(f"{head}step_4") is None


@PROPS
@given(st.text(max_size=40))
def test_any_name_gives_none_or_a_number_written_in_it(name: str) -> None:
    step = checkpoint_step(name)
    assert step is None or (step >= 0 and str(step) in name)


@PROPS
@given(steps, st.integers(0, 999))
def test_a_pattern_reads_what_the_forms_do_not(step: int, epoch: int) -> None:
    name = f"ckpt_e{epoch}_s{step}"
    assert checkpoint_step(name) is None
    assert checkpoint_step(name, PATTERN) == step
    assert checkpoint_step(name, re.compile(PATTERN)) == step
    # a pattern is matched against the whole name, and only the pattern is tried
    assert checkpoint_step("x" + name, PATTERN) is None
    assert checkpoint_step(f"step_{step}", PATTERN) is None


def test_a_pattern_whose_group_is_not_digits_gives_none() -> None:
    assert checkpoint_step("run-abc", r"run-(.*)") is None
    assert checkpoint_step("run-12", r"run-(.*)") == 12


@pytest.mark.parametrize(
    "pattern,message",
    [
        ("ckpt_(\\d+", "not a valid regular expression"),
        ("ckpt_\\d+", "has 0 capture groups; it needs exactly one"),
        ("(e\\d+)_(\\d+)", "has 2 capture groups"),
        (3, "must be a regular expression"),
    ],
)
def test_bad_patterns_are_refused(pattern: object, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        compile_step_pattern(pattern)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=re.escape(message)):
        checkpoint_step("x", pattern)  # type: ignore[arg-type]
    assert compile_step_pattern("(?:e\\d+)_(\\d+)").groups == 1


# -- policy files ------------------------------------------------------------------------------
def test_policy_file_step_pattern_is_a_setting_of_the_run(tmp_path: Path) -> None:
    text = f"step_pattern = '{PATTERN}'\n[keep]\nlast = 2\nevery = 500\n"
    f = tmp_path / "p.toml"
    f.write_text(text)
    source = PolicyFile.load(f)
    assert source.policy.rules() == (KeepLast(2), KeepEvery(500))
    assert source.step_pattern is not None and source.step_pattern.pattern == PATTERN
    assert source == PolicyFile.parse(text, source=str(f))
    assert f"(step_pattern {PATTERN})" in source.describe()
    assert source.options().step_pattern is source.step_pattern  # compiled once, handed on
    mine = RetentionOptions(step_pattern=r"ckpt_e(\d+)_s\d+")
    assert source.options(mine) is mine, "a pattern the run names wins over the file's"
    assert PolicyFile.parse("[keep]\nlast = 2\n").step_pattern is None


def test_load_policy_of_a_file_with_a_pattern_still_carries_it(tmp_path: Path) -> None:
    """Callers that hand load_policy's Policy to prune (the Checkpointer, the plug-ins) keep
    the file's pattern."""
    text = f"step_pattern = '{PATTERN}'\n[keep]\nlast = 2\nevery = 500\n"
    f = tmp_path / "p.toml"
    f.write_text(text)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        policy = load_policy(f)
        assert parse_policy(text) == policy
    assert policy.rules() == (KeepLast(2), KeepEvery(500))
    assert f"(step_pattern {PATTERN})" in policy.describe()
    assert PolicyFile.of(policy) == PolicyFile(KeepLast(2) | KeepEvery(500), PATTERN, "<policy>")
    assert parse_policy("[keep]\nlast = 2\n") == KeepLast(2)


@pytest.mark.parametrize(
    "value,message",
    [
        ("'ckpt_(\\d+'", "not a valid regular expression"),
        ("'ckpt_\\d+'", "has 0 capture groups"),
        ("3", "must be a regular expression with one capture group"),
    ],
)
def test_policy_file_bad_step_pattern_names_file_and_key(value: str, message: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(f"step_pattern = {value}\n[keep]\nlast = 1\n", source="pol.toml")
    assert info.value.field == "step_pattern" and info.value.source == "pol.toml"
    assert str(info.value).startswith("pol.toml: step_pattern: ") and message in str(info.value)


# -- the catalog -------------------------------------------------------------------------------
def lightning_run(store: MemoryStore, names: list[tuple[str, int]]) -> None:
    for i, (name, step) in enumerate(names):
        write_checkpoint(
            store, RUN, step, created=T0.timestamp() + i * 60, name=name, record_step=False
        )


def test_the_marker_step_wins_over_the_name() -> None:
    store = MemoryStore("b")
    write_checkpoint(store, RUN, 7, created=T0.timestamp(), name="epoch=0-step=4.ckpt")
    write_checkpoint(store, RUN, 9, created=T0.timestamp(), name="ckpt_e0_s1")
    lightning_run(store, [("epoch=0-step=5.ckpt", 5)])
    by_name = {
        c.name: c.step
        for c in list_checkpoints(Location.of(RUN, store=store), options=RetentionOptions(now=T0))
    }
    assert by_name == {"epoch=0-step=4.ckpt": 7, "ckpt_e0_s1": 9, "epoch=0-step=5.ckpt": 5}
    by_name = {
        c.name: c.step
        for c in list_checkpoints(
            Location.of(RUN, store=store), options=RetentionOptions(now=T0, step_pattern=PATTERN)
        )
    }
    assert by_name == {"epoch=0-step=4.ckpt": 7, "ckpt_e0_s1": 9, "epoch=0-step=5.ckpt": None}
    with pytest.raises(ConfigError):
        list_checkpoints(
            Location.of(RUN, store=store), options=RetentionOptions(now=T0, step_pattern="nogroup")
        )


def test_keep_every_and_keep_last_see_framework_steps() -> None:
    store = MemoryStore("b")
    # Saved out of step order (a rollback re-saved step 300 last): time would pick it.
    lightning_run(
        store,
        [(f"epoch={s // 500}-step={s}.ckpt", s) for s in (100, 200, 400, 500, 1000)]
        + [("epoch=0-step=300.ckpt", 300)],
    )
    now = T0 + timedelta(days=1)
    r = prune(
        Location.of(RUN, store=store),
        KeepEvery(500) | KeepLast(2),
        options=RetentionOptions(now=now),
    )
    keep = r.plan.keep
    assert "every 500 steps (step 500)" in keep["epoch=1-step=500.ckpt"]
    assert "last 2" in keep["epoch=2-step=1000.ckpt"] and "last 2" in keep["epoch=1-step=500.ckpt"]
    assert "epoch=0-step=300.ckpt" in keep  # the most recently committed (an invariant)
    assert {c.name for c in r.plan.delete} == {
        "epoch=0-step=100.ckpt",
        "epoch=0-step=200.ckpt",
        "epoch=0-step=400.ckpt",
    }


def test_prune_takes_the_policy_files_pattern_and_an_explicit_one_wins() -> None:
    store = MemoryStore("b")
    lightning_run(store, [(f"ckpt_e0_s{s}", s) for s in (100, 500, 700, 1000)])
    now = T0 + timedelta(days=1)
    policy = parse_policy(f"step_pattern = '{PATTERN}'\n[keep]\nevery = 500\n")
    r = prune(Location.of(RUN, store=store), policy, options=RetentionOptions(now=now))
    assert set(r.plan.keep) == {"ckpt_e0_s500", "ckpt_e0_s1000"}
    assert [d.checkpoint.step for d in r.plan.decisions] == [100, 500, 700, 1000]
    r = prune(
        Location.of(RUN, store=store),
        policy,
        options=RetentionOptions(now=now, step_pattern=r"ckpt_e(\d+)_s\d+"),
    )
    assert all(d.checkpoint.step == 0 for d in r.plan.decisions)
    r = prune(
        Location.of(RUN, store=store), KeepEvery(500), options=RetentionOptions(now=now)
    )  # no pattern: no steps, KeepEvery keeps none
    assert list(r.plan.keep) == ["ckpt_e0_s1000"]  # the newest committed (by time) only
    r = prune(Location.of(RUN, store=store), policy, apply=True, options=RetentionOptions(now=now))
    assert set(r.deleted) == {"ckpt_e0_s100", "ckpt_e0_s700"}


def test_prune_takes_a_policy_file_and_options() -> None:
    store = MemoryStore("b")
    lightning_run(store, [(f"ckpt_e0_s{s}", s) for s in (100, 500, 700, 1000)])
    now = T0 + timedelta(days=1)
    source = PolicyFile.parse(f"step_pattern = '{PATTERN}'\n[keep]\nevery = 500\n")
    r = prune(Location.of(RUN, store=store), source, options=RetentionOptions(now=now))
    assert set(r.plan.keep) == {"ckpt_e0_s500", "ckpt_e0_s1000"}
    assert r.plan.policy == f"every 500 steps (step_pattern {PATTERN})"
    other = RetentionOptions(now=now, step_pattern=r"ckpt_e(\d+)_s\d+")
    r = prune(Location.of(RUN, store=store), source, options=other)
    assert all(d.checkpoint.step == 0 for d in r.plan.decisions)


def test_cli_ls_and_prune_take_a_step_pattern(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store, run = open_store(parse_location(tmp_path / "runs" / "a"))
    for s in (100, 500, 700):
        write_checkpoint(
            store, run, s, created=T0.timestamp() + s, name=f"ckpt_e0_s{s}", record_step=False
        )
    assert main(["ls", str(tmp_path), "--step-pattern", PATTERN, "--json"]) == 0
    out = capsys.readouterr().out
    assert '"step": 500' in out and '"step": null' not in out
    assert main(["ls", str(tmp_path), "--json"]) == 0
    assert '"step": 500' not in capsys.readouterr().out
    assert main(["ls", str(tmp_path), "--step-pattern", "no-group"]) == 2
    assert "has 0 capture groups" in capsys.readouterr().err
    policy = tmp_path / "p.toml"
    policy.write_text("[keep]\nevery = 500\n")
    code = main(["prune", str(tmp_path), "--policy", str(policy), "--step-pattern", PATTERN])
    out = capsys.readouterr().out
    assert code == 0 and "every 500 steps (step 500)" in out, out
