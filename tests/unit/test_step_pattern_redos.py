"""Step patterns run on RE2 (issue 27, item 10): checkpoint names are chosen by anyone who can
write to the bucket, so ``(?:a+)+(\\d+)`` over a long run of ``a`` must answer at once (on
Python's ``re`` it never returns), through the API and ``s3ckpt ls --step-pattern``; what
RE2 cannot run (backreferences, lookarounds) is refused naming RE2."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from s3ckpt._step_names import checkpoint_step, compile_step_pattern
from s3ckpt.cli import main
from s3ckpt.errors import ConfigError, PolicyError
from s3ckpt.retention import RetentionOptions, list_checkpoints, parse_policy
from s3ckpt.store import Location, MemoryStore
from s3ckpt.uri import StoreURL
from tests._retention_util import write_checkpoint

EVIL = r"(?:a+)+(\d+)"
JOIN_TIMEOUT = 60.0  # generous: RE2 answers in microseconds, backtracking re in ~forever


def _returns(fn: Callable[[], Any]) -> Any:
    """``fn()`` run in a daemon thread: its result, or a failure (not a hang) when it has
    not returned within :data:`JOIN_TIMEOUT`."""
    out: list[Any] = []
    worker = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    worker.start()
    worker.join(JOIN_TIMEOUT)
    assert not worker.is_alive(), (
        f"did not return in {JOIN_TIMEOUT:.0f} s: catastrophic backtracking"
    )
    assert out, "raised in the worker (see the thread's traceback above)"
    return out[0]


@pytest.mark.parametrize("n", [40, 1000])
def test_the_redos_pattern_answers_at_once(n: int) -> None:
    name = "a" * n + "!"  # no digits: a backtracking engine tries every split of the a's
    assert _returns(lambda: checkpoint_step(name, EVIL)) is None
    assert _returns(lambda: checkpoint_step("a" * n + "42", EVIL)) == 42


def test_a_precompiled_python_pattern_is_run_on_re2() -> None:
    evil = re.compile(EVIL)
    assert _returns(lambda: checkpoint_step("a" * 1000 + "!", evil)) is None
    with pytest.raises(ConfigError, match="flags inline"):
        compile_step_pattern(re.compile(r"s(\d+)", re.IGNORECASE))
    assert checkpoint_step("S7", "(?i)s(\\d+)") == 7


def test_the_catalog_with_a_hostile_name_answers_at_once() -> None:
    run = StoreURL("memory", "b", "runs/a/")
    store = MemoryStore("b")
    write_checkpoint(store, run, 7, created=1.7e9, name="a" * 1000 + "!", record_step=False)
    rows = _returns(
        lambda: list_checkpoints(
            Location.of(run, store=store), options=RetentionOptions(step_pattern=EVIL)
        )
    )
    assert [c.step for c in rows] == [None]


def test_ls_step_pattern_over_a_hostile_name_answers_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from s3ckpt.store import open_store
    from s3ckpt.uri import parse_location

    store, root = open_store(parse_location(tmp_path))
    write_checkpoint(store, root, 1, created=1.7e9, name="a" * 200 + "!", record_step=False)
    write_checkpoint(store, root, 2, created=1.7e9, name="a" * 40 + "12", record_step=False)
    code = _returns(lambda: main(["ls", str(tmp_path), "--step-pattern", EVIL, "--json"]))
    assert code == 0
    out = capsys.readouterr().out
    assert '"step": 12' in out and '"step": null' in out


@pytest.mark.parametrize(
    "pattern",
    [r"(\d+)_\1", r"(?=step)step_(\d+)", r"(?<!x)step_(\d+)", r"(?!x)(\d+)", r"(\d+)\Z"],
)
def test_what_re2_cannot_run_is_refused_naming_re2(
    pattern: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match="RE2") as info:
        compile_step_pattern(pattern)
    assert "backreferences" in str(info.value) and "lookarounds" in str(info.value)
    with pytest.raises(PolicyError, match="RE2"):
        parse_policy(f"step_pattern = '{pattern}'\n[keep]\nlast = 1\n")
    assert main(["ls", "memory://b/x", "--step-pattern", pattern]) == 2
    err = capsys.readouterr().err
    assert "RE2" in err and "Traceback" not in err
    assert "re2.cc" not in err  # RE2's own logging is off


def test_re2_digits_are_ascii_only() -> None:
    arabic_indic = "s\u0661\u0662"  # Arabic-Indic one, two: digits to Python, not to RE2
    assert checkpoint_step(arabic_indic, r"s(\d+)") is None
    assert checkpoint_step("s12", r"s(\d+)") == 12
