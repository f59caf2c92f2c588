"""docs/testing.md is the contract of ``s3ckpt.testing``: its examples run as a user's tests.

The blocks marked ``<!-- docs-test: FILE -->`` are written, in order, into FILE in a fresh
directory, beside a test of the fixtures' contract that uses only names the page
documents, and run by ``python -m pytest`` in a subprocess with no ``conftest.py``: the
fixtures come from s3ckpt's ``pytest11`` entry point, or the run fails. The subprocess
starts with an environment that points elsewhere (a dead endpoint, a profile that does not
exist, no credentials), so the fixtures must set it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.multiprocess]

PAGE = Path(__file__).resolve().parents[2] / "docs" / "testing.md"
_MARKED = re.compile(r"<!-- docs-test: (\S+) -->\n```python\n(.*?)\n```", re.S)
_PYTHON = re.compile(r"```python\n(.*?)\n```", re.S)

# Names from the page only: the fixtures, LocalS3's members, the helpers.
CONTRACT = """
import os

import boto3
from s3ckpt.testing import assert_no_partial_uploads, committed_steps


def test_s3_fixtures_set_the_environment_and_a_fresh_bucket(s3ckpt_server, s3ckpt_s3, s3ckpt_url):
    assert os.environ["AWS_ENDPOINT_URL"] == s3ckpt_s3.endpoint_url
    assert s3ckpt_s3.endpoint_url == s3ckpt_server.endpoint_url
    assert s3ckpt_url == s3ckpt_s3.url_for("run") == f"s3://{s3ckpt_s3.bucket}/run"
    assert s3ckpt_s3.bucket != s3ckpt_server.bucket
    assert "AWS_PROFILE" not in os.environ
    assert os.environ["AWS_CONFIG_FILE"] == os.devnull
    assert os.environ["AWS_SHARED_CREDENTIALS_FILE"] == os.devnull
    boto3.client("s3").put_object(Bucket=s3ckpt_s3.bucket, Key="run/notes.txt", Body=b"1")
    assert committed_steps(s3ckpt_url) == []
    assert_no_partial_uploads(s3ckpt_url)
    os.environ["AWS_ENDPOINT_URL"] = "http://127.0.0.1:9"  # a test that spoils the environment


def test_the_next_test_gets_the_environment_back_and_an_empty_bucket(s3ckpt_s3):
    assert os.environ["AWS_ENDPOINT_URL"] == s3ckpt_s3.endpoint_url
    assert "Contents" not in s3ckpt_s3.client().list_objects_v2(Bucket=s3ckpt_s3.bucket)
"""


def _marked() -> dict[str, list[str]]:
    files: dict[str, list[str]] = {}
    for name, code in _MARKED.findall(PAGE.read_text()):
        files.setdefault(name, []).append(code)
    return files


def _user_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PYTEST_"))}
    env["AWS_ENDPOINT_URL"] = "http://127.0.0.1:9"  # nothing listens there
    env["AWS_PROFILE"] = "no-such-profile"  # s3ckpt refuses an unknown profile
    return env


def test_page_marks_the_examples_and_every_python_block_compiles() -> None:
    files = _marked()
    assert sorted(files) == ["test_resume.py"]
    for i, code in enumerate(_PYTHON.findall(PAGE.read_text())):
        compile(code, f"docs/testing.md block {i}", "exec")


def test_headline_example_is_under_30_lines() -> None:
    headline = _marked()["test_resume.py"][0]
    assert "def test_resume_after_kill(s3ckpt_url)" in headline
    assert len([line for line in headline.splitlines() if line.strip()]) < 30


def test_docs_examples_pass_with_the_entry_point_fixtures(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # rootdir here: no conftest above
    for name, blocks in _marked().items():
        (tmp_path / name).write_text("\n\n".join(blocks) + "\n")
    (tmp_path / "test_fixture_contract.py").write_text(CONTRACT.lstrip())
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA"],
        cwd=tmp_path,
        env=_user_env(),
        capture_output=True,
        text=True,
        timeout=280,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert re.search(r"\b3 passed\b", out), out


def test_the_plugin_is_off_with_p_no_s3ckpt(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_x.py").write_text("def test_x(s3ckpt_url):\n    pass\n")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    off = subprocess.run(
        [*cmd, "-p", "no:s3ckpt", "--fixtures"], cwd=tmp_path, capture_output=True, text=True
    )
    on = subprocess.run([*cmd, "--fixtures"], cwd=tmp_path, capture_output=True, text=True)
    assert on.returncode == 0 and off.returncode == 0, on.stdout + off.stdout
    for name in ("s3ckpt_server", "s3ckpt_s3", "s3ckpt_url"):
        assert name in on.stdout and name not in off.stdout


def test_loading_the_plugin_imports_neither_moto_nor_torch_nor_boto3() -> None:
    code = (
        "import sys, s3ckpt.testing.pytest_plugin; "
        "print(sorted({'moto', 'torch', 'boto3', 'botocore'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
