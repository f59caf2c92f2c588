"""``s3ckpt demo``: every argument after it reaches the demo, and bad usage or a missing
dependency is one line on stderr with exit code 2, before any training process starts."""

from __future__ import annotations

import math
import sys

import pytest

from s3ckpt.cli import main
from s3ckpt.demo._train import TrainLog, resume_proof


@pytest.fixture
def no_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """No endpoint configured: the demo would start its embedded server."""
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("S3CKPT_DEMO_URL", raising=False)


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def usage_error(err: str) -> str:
    """argparse's usage lines, then one error line (as every s3ckpt command does)."""
    assert "Traceback" not in err
    assert err.startswith("usage: s3ckpt demo"), err
    return err.strip().splitlines()[-1]


def test_demo_help_reaches_the_demo(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: s3ckpt demo" in out and "--steps" in out and "--kill-at" in out
    assert "--keep-server" in out and 'pip install "s3ckpt[demo]"' in out


def test_demo_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--no-such-option"]) == 2
    assert "unrecognized arguments: --no-such-option" in capsys.readouterr().err


def test_demo_is_listed_in_the_top_level_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "demo" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--every", "0"], "argument --every: must be 1 or more, got 0"),
        (["--steps", "ten"], "argument --steps: not a whole number: 'ten'"),
        (["--kill-at", "7"], "--kill-at must be a multiple of --every"),
        # the first save: nothing would be committed to resume from
        (["--steps", "10", "--kill-at", "5"], "after the first save"),
        (["--steps", "25"], "below --steps"),
    ],
)
def test_bad_numbers_are_one_line_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], no_endpoint: None
) -> None:
    assert main(["demo", *argv]) == 2
    line = usage_error(capsys.readouterr().err)
    assert line.startswith("s3ckpt demo: error: ") and message in line


def test_keep_server_with_a_configured_endpoint_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    assert main(["demo", "--keep-server"]) == 2
    assert "--keep-server keeps the embedded S3 server" in usage_error(capsys.readouterr().err)


def test_missing_moto_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], no_endpoint: None
) -> None:
    # None in sys.modules makes the import fail as it does where moto is not installed.
    monkeypatch.setitem(sys.modules, "moto", None)
    monkeypatch.setitem(sys.modules, "moto.server", None)
    assert main(["demo", "--steps", "6", "--every", "2", "--kill-at", "4"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "needs moto" in line and 'pip install "s3ckpt[demo]"' in line
    assert "S3CKPT_DEMO_URL" in line


def test_missing_torch_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], no_endpoint: None
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    assert main(["demo"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "torch" in line and 'pip install "s3ckpt[demo]"' in line


def test_a_demo_url_that_is_not_s3_is_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    monkeypatch.setenv("S3CKPT_DEMO_URL", f"file://{tmp_path}")
    assert main(["demo"]) == 2
    assert "S3CKPT_DEMO_URL must be an s3:// URL" in one_error_line(capsys.readouterr().err)


def test_a_web_address_as_demo_url_is_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("S3CKPT_DEMO_URL", "https://example.com/bucket")
    assert main(["demo"]) == 2
    assert "is a web address" in one_error_line(capsys.readouterr().err)


def losses(*pairs: tuple[int, float], resumed: int | None = None) -> TrainLog:
    log = TrainLog()
    log.losses = {step: loss.hex() for step, loss in pairs}
    log.resumed = resumed
    return log


def test_the_resume_proof_compares_the_steps_both_processes_trained() -> None:
    first = losses((1, 7.5), (2, 7.25), (3, 7.125))
    exact, text = resume_proof(first, losses((3, 7.125), (4, 7.0), resumed=2))
    assert exact and "trained step 3 again" in text and "its loss is bit-for-bit" in text
    exact, text = resume_proof(first, losses((2, 7.25), (3, 7.125), resumed=1))
    assert exact and "steps 2-3" in text and "both losses are bit-for-bit the same" in text


def test_the_resume_proof_fails_on_one_ulp() -> None:
    first = losses((1, 7.5), (2, 7.25))
    off = math.nextafter(7.25, 8.0)
    exact, text = resume_proof(first, losses((2, off), resumed=1))
    assert (
        not exact and text.startswith("MISMATCH") and "step 2: 7.25 then 7.250000000000001" in text
    )


def test_the_resume_proof_without_a_resume() -> None:
    assert resume_proof(losses((1, 7.5)), losses((1, 7.5)))[0] is False
    exact, text = resume_proof(losses((1, 7.5)), losses((2, 7.0), resumed=1))
    assert exact and "no losses to compare" in text
