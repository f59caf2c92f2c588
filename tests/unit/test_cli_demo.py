"""``s3ckpt demo`` hands every argument after it to the demo, options included."""

from __future__ import annotations

import pytest

from s3ckpt.cli import main


def test_demo_help_reaches_the_demo(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: s3ckpt demo" in out and "--steps" in out and "--kill-at" in out


def test_demo_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--no-such-option"]) == 2
    assert "unrecognized arguments: --no-such-option" in capsys.readouterr().err


def test_demo_is_listed_in_the_top_level_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "demo" in capsys.readouterr().out
