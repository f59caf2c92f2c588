"""The ``s3ckpt`` command follows the AWS CLI's conventions: the region and retry settings
come from where the AWS CLI v2 reads them, and every error a user meets is one line with
its documented exit code (``s3ckpt._cli``), never a traceback.

No S3 server is needed: clients are built without a request, the retry tests talk to a
loopback server that answers 503, and the retention commands run on local folders.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import pytest

from s3ckpt._cli import s3_config_from_args, transfer_config_from_args
from s3ckpt.cli import build_parser, main
from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.errors import ConfigError, TransientStoreError
from s3ckpt.store import open_store
from s3ckpt.store.s3 import S3Store
from s3ckpt.uri import StoreURL, parse_location
from tests._http import serve
from tests._retention_util import write_checkpoint

ROOT = Path(__file__).resolve().parents[2]
DAY = 86400.0


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def one_error_line(err: str) -> str:
    """The single ``s3ckpt: error: ...`` line ``err`` must be."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("s3ckpt: error: "), err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No region, attempts or profile from the environment; an empty AWS config file
    (returned: tests write into it)."""
    for var in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE"):
        monkeypatch.delenv(var, raising=False)
    for var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    config = tmp_path / "aws_config"
    config.write_text("")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    return config


def region_of(s3_config: S3Config | None = None) -> str:
    return str(S3Store("bkt", s3_config).client.meta.region_name)


# -- region ------------------------------------------------------------------------------------
def test_aws_region_alone_selects_the_region(
    aws_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    assert region_of() == "eu-west-3"


def test_region_precedence_is_the_aws_cli_v2s(
    aws_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert region_of() == "us-east-1"  # nothing set
    aws_env.write_text("[default]\nregion = ap-south-1\n")
    assert region_of() == "ap-south-1"  # the profile
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
    assert region_of() == "us-west-2"  # AWS_DEFAULT_REGION over the profile
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    assert region_of() == "eu-west-3"  # AWS_REGION over AWS_DEFAULT_REGION
    assert region_of(S3Config(region="eu-north-1")) == "eu-north-1"  # explicit over all
    args = build_parser().parse_args(["ls", "s3://bkt/x", "--region", "ca-central-1"])
    assert region_of(s3_config_from_args(args)) == "ca-central-1"


class _EmptyBucket(BaseHTTPRequestHandler):
    """ListObjectsV2 of an empty bucket; keeps each request's Authorization header."""

    authorizations: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        type(self).authorizations.append(self.headers.get("Authorization", ""))
        body = (
            b'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult>'
            b"<Name>bkt</Name><Prefix>run/</Prefix><KeyCount>0</KeyCount><MaxKeys>1000</MaxKeys>"
            b"<IsTruncated>false</IsTruncated></ListBucketResult>"
        )
        self.send_response(200)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_aws_region_alone_signs_the_cli_requests(
    aws_env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    handler: Any = type("EmptyBucket", (_EmptyBucket,), {"authorizations": []})
    with serve(handler) as url:
        code, out, err = cli(capsys, "ls", "s3://bkt/run/", "--endpoint-url", url)
    assert code == 0 and "no checkpoints" in out, err
    assert handler.authorizations and all(
        "/eu-west-3/s3/aws4_request" in a for a in handler.authorizations
    ), handler.authorizations


# -- addressing style --------------------------------------------------------------------------
def test_addressing_style_from_the_cli_else_the_profile(aws_env: Path) -> None:
    def style(argv: list[str]) -> str | None:
        args = build_parser().parse_args(["ls", "s3://bkt/x", *argv])
        return S3Store("bkt", s3_config_from_args(args)).client.meta.config.s3.get(
            "addressing_style"
        )

    assert style([]) is None  # botocore's auto
    assert style(["--addressing-style", "path"]) == "path"
    aws_env.write_text("[default]\ns3 =\n    addressing_style = path\n")
    assert style([]) == "path"  # the profile's, when the caller leaves it at auto
    assert style(["--addressing-style", "virtual"]) == "virtual"


# -- retries -----------------------------------------------------------------------------------
class _SlowDown(BaseHTTPRequestHandler):
    """Every request: 503 (throttled). Counts the requests it answered."""

    requests = 0

    def do_HEAD(self) -> None:
        type(self).requests += 1
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        type(self).requests += 1
        body = b"<Error><Code>SlowDown</Code><Message>slow down</Message></Error>"
        self.send_response(503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def throttling() -> Iterator[type[_SlowDown]]:
    handler = type("SlowDown", (_SlowDown,), {"requests": 0})
    with serve(handler) as url:
        handler.url = url  # type: ignore[attr-defined]
        yield handler


def attempts(handler: type[_SlowDown], transfer_config: TransferConfig | None = None) -> int:
    """How many requests one HEAD takes against the throttling server."""
    store = S3Store(
        "bkt",
        S3Config(endpoint_url=handler.url),  # type: ignore[attr-defined]
        transfer_config,
        sleep=lambda s: None,
    )
    handler.requests = 0
    with pytest.raises(TransientStoreError):
        store.head("k")
    return handler.requests


def test_attempts_come_from_the_caller_env_or_profile_and_botocore_never_adds_its_own(
    aws_env: Path, monkeypatch: pytest.MonkeyPatch, throttling: type[_SlowDown]
) -> None:
    assert attempts(throttling) == 8  # the default
    aws_env.write_text("[default]\nmax_attempts = 4\nretry_mode = adaptive\n")
    assert attempts(throttling) == 4  # the profile's
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "3")
    assert attempts(throttling) == 3  # the environment over the profile
    assert attempts(throttling, TransferConfig(max_attempts=2)) == 2  # the caller over both
    assert attempts(throttling, TransferConfig(max_attempts=8)) == 8  # even the default value
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "many")
    with pytest.raises(ConfigError, match="AWS_MAX_ATTEMPTS='many'"):
        TransferConfig()


def test_cli_max_attempts_and_read_timeout(
    aws_env: Path,
    monkeypatch: pytest.MonkeyPatch,
    throttling: type[_SlowDown],
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "5")
    url = throttling.url  # type: ignore[attr-defined]
    code, _, err = cli(capsys, "ls", "s3://bkt/run/", "--endpoint-url", url, "--max-attempts", "2")
    assert code == 3 and throttling.requests == 2, err
    one_error_line(err)
    args = build_parser().parse_args(["ls", "s3://b/x", "--read-timeout", "120"])
    tc = transfer_config_from_args(args)
    assert tc is not None and tc.read_timeout == 120 and tc.request_deadline == 300
    assert transfer_config_from_args(build_parser().parse_args(["ls", "s3://b/x"])) is None
    code, _, err = cli(capsys, "ls", "s3://b/x", "--max-attempts", "0")
    assert code == 2 and "--max-attempts" in err
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "0")
    code, _, err = cli(capsys, "ls", "s3://bkt/x", "--endpoint-url", url)
    assert code == 2 and "AWS_MAX_ATTEMPTS" in one_error_line(err)


# -- errors are one line with their exit code --------------------------------------------------
def test_unknown_profile_is_one_line_exit_2(
    aws_env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(capsys, "ls", "s3://bkt/x", "--profile", "nope")
    line = one_error_line(err)
    assert code == 2 and "'nope'" in line and "--profile" in line and str(aws_env) in line
    monkeypatch.setenv("AWS_PROFILE", "gone")
    code, _, err = cli(capsys, "gc", "s3://bkt/x")
    line = one_error_line(err)
    assert code == 2 and "'gone'" in line and "AWS_PROFILE" in line


@pytest.mark.parametrize("command", ["ls", "prune", "gc", "pin", "inspect", "verify"])
@pytest.mark.parametrize("url", ["https://bkt.s3.amazonaws.com/run/", "foo://bkt/run/"])
def test_web_and_unknown_urls_are_bad_input(
    command: str, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = {"prune": ["--policy", "keep-last-3"], "pin": ["--reason", "r"]}.get(command, [])
    code, _, err = cli(capsys, command, url, *extra)
    line = one_error_line(err)
    assert code == 2 and url in line and "s3://BUCKET/PREFIX" in line


def run_s3ckpt(*argv: str, prelude: str = "", **kwargs: object) -> subprocess.CompletedProcess[str]:
    """``s3ckpt ARGV`` in a fresh interpreter, after ``prelude`` (Python) ran in it."""
    code = f"{prelude}\nimport sys\nfrom s3ckpt.cli import main\nsys.exit(main(sys.argv[1:]))"
    streams: dict[str, Any] = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **kwargs}
    return subprocess.run(
        [sys.executable, "-c", code, *argv], text=True, timeout=300, cwd=ROOT, **streams
    )


@pytest.mark.parametrize("command", ["inspect", "verify", "diff", "export", "import"])
def test_a_tool_without_torch_says_how_to_install_it(command: str, tmp_path: Path) -> None:
    args = {"diff": [str(tmp_path), str(tmp_path)], "export": [str(tmp_path), "out"]}
    argv = args.get(command, [str(tmp_path)] * (2 if command == "import" else 1))
    out = run_s3ckpt(command, *argv, prelude='import sys\nsys.modules["torch"] = None')
    line = one_error_line(out.stderr)
    assert out.returncode == 2 and 'pip install "s3ckpt[torch]"' in line, out.stderr
    assert f"s3ckpt {command}" in line and "torch is not installed" in line


def local_runs(root: Path, steps: tuple[int, ...] = (1, 2, 3, 4)) -> StoreURL:
    """Committed checkpoints of run ``a`` in the local folder ``root/runs``."""
    store, run = open_store(parse_location(root / "runs" / "a"))
    for step in steps:
        write_checkpoint(store, run, step, created=time.time() - 30 * DAY + step)
    return run


def test_closed_stdout_ends_quietly_with_141(tmp_path: Path) -> None:
    local_runs(tmp_path)
    for argv in (["ls", str(tmp_path)], ["ls", str(tmp_path), "--json"]):
        code = "import sys\nfrom s3ckpt.cli import main\nsys.exit(main(sys.argv[1:]))"
        proc = subprocess.Popen(
            [sys.executable, "-c", code, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=ROOT,
        )
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # the reader is gone before the first byte: `| head -0`
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=300) == 141 and err == "", err


def test_retention_commands_take_local_folders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local_runs(tmp_path)
    code, out, err = cli(capsys, "ls", str(tmp_path), "--json")
    assert code == 0, err
    (listed,) = json.loads(out)["runs"]
    assert [c["step"] for c in listed["checkpoints"]] == [1, 2, 3, 4]
    code, out, err = cli(capsys, "prune", str(tmp_path), "--policy", "keep-last-3", "--apply")
    assert code == 0 and "deleted 1 of 1" in out, err
    assert not [p for p in (tmp_path / "runs" / "a" / "step_000000001").rglob("*") if p.is_file()]
    ckpt = tmp_path / "runs" / "a" / "step_000000002"
    code, out, err = cli(capsys, "pin", str(ckpt), "--reason", "release", "--json")
    assert code == 0 and json.loads(out) == {
        "checkpoint": f"file://{ckpt}/",
        "pinned": True,
        "reason": "release",
    }, err
    code, out, _ = cli(capsys, "ls", str(tmp_path / "runs" / "a"))
    assert code == 0 and "release" in out
    code, out, _ = cli(capsys, "unpin", str(ckpt), "--json")
    assert code == 0 and json.loads(out)["was_pinned"] is True
    code, out, _ = cli(capsys, "gc", str(tmp_path), "--json")
    assert code == 0 and json.loads(out)["exit_code"] == 0
    for command in ("ls", "gc"):
        code, _, err = cli(capsys, command, str(tmp_path / "typo"))
        assert code == 2 and "no such folder" in one_error_line(err)


def test_pin_of_nothing_or_of_a_run_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local_runs(tmp_path, (1, 2))
    missing = tmp_path / "runs" / "a" / "step_000000009"
    missing.mkdir()
    code, _, err = cli(capsys, "pin", str(missing), "--reason", "r")
    line = one_error_line(err)
    assert code == 2 and "no checkpoint at" in line and "s3:///" not in line
    assert f"file://{missing}/" in line
    code, _, err = cli(capsys, "pin", str(tmp_path / "runs" / "a"), "--reason", "r")
    line = one_error_line(err)
    assert code == 2 and "is a run holding checkpoints (step_000000001, step_000000002)" in line
    assert "pin one of them" in line


def test_errors_about_a_local_path_name_it_as_a_file_url(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(capsys, "inspect", str(tmp_path / "nothing"))
    line = one_error_line(err)
    assert code == 2 and "s3:///" not in line
    assert f"[file://{tmp_path}/nothing/s3ckpt.json]" in line


# -- --json and progress -----------------------------------------------------------------------
def test_every_command_that_prints_results_has_json_and_long_ones_no_progress() -> None:
    parser = build_parser()
    sub: Any = next(a for a in parser._actions if a.dest == "command")
    long_running = {"ls", "prune", "gc", "verify", "diff", "export", "import", "report", "restore"}
    long_running.add("check")
    for name, p in sub.choices.items():
        if name == "demo":
            continue
        options = {o for a in p._actions for o in a.option_strings}
        assert "--json" in options, name
        assert ("--no-progress" in options) == (name in long_running), name
        assert {"--max-attempts", "--addressing-style", "--read-timeout"} <= options, name


def run_on_a_terminal(*argv: str) -> tuple[int, str, str]:
    """``s3ckpt ARGV`` with stderr on a pseudo-terminal; (exit code, stdout, stderr)."""
    main_fd, term = pty.openpty()
    try:
        out = run_s3ckpt(*argv, stderr=term)
    finally:
        os.close(term)
    chunks = []
    while True:
        try:
            chunk = os.read(main_fd, 65536)
        except OSError:  # EIO: the terminal's other end is closed and drained
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main_fd)
    return out.returncode, out.stdout, b"".join(chunks).decode()


def test_progress_on_a_terminal_only_and_never_with_json(tmp_path: Path) -> None:
    local_runs(tmp_path)
    code, out, err = run_on_a_terminal("ls", str(tmp_path))
    assert code == 0 and "step_000000004" in out
    assert "ls: " in err and "objects listed" in err and err.endswith("\r\x1b[K"), repr(err)
    for argv in (["ls", str(tmp_path), "--json"], ["ls", str(tmp_path), "--no-progress"]):
        code, out, err = run_on_a_terminal(*argv)
        assert code == 0 and err == "", repr(err)
    done = run_s3ckpt("prune", str(tmp_path), "--policy", "keep-last-3", "--apply")
    assert done.returncode == 0 and done.stderr == "", done.stderr  # stderr not a terminal
    code, out, err = run_on_a_terminal("gc", str(tmp_path), "--apply")
    assert code == 0 and "gc: " in err and "objects listed" in err, repr(err)


def test_diff_and_import_report_progress(tmp_path: Path) -> None:
    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file

    from s3ckpt.dcp import quiet_dcp
    from s3ckpt.tools import diff_checkpoints, import_safetensors

    tensors = {"w": torch.arange(4096.0), "b": torch.ones(1000)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    seen: list[tuple[int, int]] = []
    import_safetensors(
        tmp_path / "model.safetensors", tmp_path / "a", progress=lambda d, t: seen.append((d, t))
    )
    total = 4096 * 4 + 1000 * 4
    assert seen and seen[-1] == (total, total) and all(t == total for _, t in seen)
    with quiet_dcp():
        dcp.save(
            {"model": {"w": torch.zeros(4096), "b": torch.ones(1000)}},
            checkpoint_id=str(tmp_path / "b"),
            no_dist=True,
        )
    seen.clear()
    res = diff_checkpoints(
        tmp_path / "a", tmp_path / "b", progress=lambda d, t: seen.append((d, t))
    )
    assert [e.name for e in res.entries if e.status == "changed"] == ["model.w"]
    assert seen[0][0] == 0 and seen[-1][0] == seen[-1][1] > 0
    code, out, err = run_on_a_terminal("diff", str(tmp_path / "a"), str(tmp_path / "b"))
    assert code == 0 and "changed" in out and "diff [" in err, repr(err)
