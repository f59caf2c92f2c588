"""The docs hold no placeholders, name no repository file that does not exist, and the pages
generated from the code (CLI reference, troubleshooting) are current.

These run without the docs venv (``scripts/build-docs.sh`` builds the site itself); the
checker and the generator are the ones the site build runs (``docs/_gen/``).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
GEN = REPO / "docs" / "_gen"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_s3ckpt_docs_{name}", GEN / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_have_no_placeholders_or_missing_repository_files() -> None:
    check_docs = _load("check_docs")
    problems = check_docs.check_files(check_docs.doc_files())
    assert problems == []


def test_checker_reports_placeholders_missing_links_and_missing_paths() -> None:
    check_docs = _load("check_docs")
    page = REPO / "docs" / "example.md"  # need not exist: links resolve from its folder
    text = "\n".join(
        [
            "# Example",
            "OUTPUT_BENCH",
            "A TODO left behind.",
            "See [the image](../deploy/nowhere/Dockerfile) and [ok](../README.md).",
            "Run `scripts/no-such-script.sh`, not `scripts/build-docs.sh`.",
            "Globs are skipped: `tests/unit/test_*.py`.",
            "```",
            "OUTPUT_IN_A_CODE_BLOCK",
            "[not a link in code](../missing.md) `scripts/missing-in-code.sh`",
            "```",
        ]
    )
    problems = check_docs.check_text(text, page)
    assert problems == [
        "docs/example.md:2: placeholder 'OUTPUT_BENCH'",
        "docs/example.md:3: placeholder 'TODO'",
        "docs/example.md:4: link to a missing file: ../deploy/nowhere/Dockerfile",
        "docs/example.md:5: names a missing repository path: scripts/no-such-script.sh",
        "docs/example.md:8: placeholder 'OUTPUT_IN_A_CODE_BLOCK'",
    ]


def test_generated_pages_are_current() -> None:
    # A subprocess: the generator fixes COLUMNS for argparse, which must not leak into
    # this process's other tests.
    proc = subprocess.run(
        [sys.executable, str(GEN / "gen_pages.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr


def test_troubleshooting_lists_every_error_class_and_s3_code() -> None:
    import s3ckpt.errors as errors
    from s3ckpt.store import _errors as store_errors

    page = (REPO / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
    classes = [
        n
        for n in errors.__all__
        if isinstance(getattr(errors, n), type) and issubclass(getattr(errors, n), Exception)
    ]
    assert classes
    for name in classes:
        assert f"\n## {name}\n" in page, name
    for code in store_errors._ERROR_TABLE:
        assert f"| `{code}`" in page, code
