"""The cron image's scrub job (``s3ckpt-cron check``, deploy/cron/s3ckpt-cron): with its
settings from the environment it runs one ``s3ckpt check`` of ``S3CKPT_URL`` that parses as an
``s3ckpt`` invocation; with arguments, ``check`` is passed to ``s3ckpt`` as it is. Run with the
stand-in ``s3ckpt`` of tests/unit/test_deploy.py, which records its arguments."""

from __future__ import annotations

from pathlib import Path

import pytest

from s3ckpt.cli import build_parser
from tests.unit.test_deploy import URL, run_entrypoint


def test_the_check_job_reads_5_percent_with_json_and_records_by_default(tmp_path: Path) -> None:
    code, calls, _, err = run_entrypoint(tmp_path, {"S3CKPT_URL": URL}, "check")
    assert code == 0 and calls == [["check", URL, "--read-data", "5%", "--json"]], (calls, err)
    args = build_parser().parse_args(calls[0])
    assert args.read_data == "5%" and args.json and not args.no_record
    assert f"check {URL} (read data: 5%)" in err


def test_the_check_job_takes_its_settings_from_the_environment(tmp_path: Path) -> None:
    env = {
        "S3CKPT_URL": URL,
        "READ_DATA": "all",
        "JSON": "0",
        "GRACE": "2h",
        "RECORD": "0",
        "METRICS_DIR": "/metrics",
    }
    code, calls, _, _ = run_entrypoint(tmp_path, env, "check", exits={"check": 1})
    assert code == 1  # the check's own exit code (1: damaged)
    assert calls == [
        ["check", URL, "--read-data", "all", "--grace", "2h", "--no-record", "--metrics-file",
         "/metrics/s3ckpt-check.prom"],
    ]  # fmt: skip
    args = build_parser().parse_args(calls[0][:-2])  # (the folder must exist to parse it)
    assert args.no_record and args.read_data == "all" and not args.json


@pytest.mark.parametrize(
    ("env", "message"),
    [({}, "S3CKPT_URL is not set"), ({"S3CKPT_URL": URL, "RECORD": "maybe"}, "RECORD=maybe")],
)
def test_bad_check_settings_are_one_line_exit_2(
    tmp_path: Path, env: dict[str, str], message: str
) -> None:
    code, calls, _, err = run_entrypoint(tmp_path, env, "check")
    assert code == 2 and calls == [] and len(err.strip().splitlines()) == 1 and message in err


def test_check_with_arguments_is_the_command(tmp_path: Path) -> None:
    code, calls, _, _ = run_entrypoint(tmp_path, {}, "check", URL, "--read-data", "all")
    assert (code, calls) == (0, [["check", URL, "--read-data", "all"]])
