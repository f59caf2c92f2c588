"""docs/architecture.md stays true to the package: its "What lives where" table names every
module and package of ``s3ckpt/`` by file name, and names nothing that does not exist.

A row's first cell lists modules as backticked paths relative to ``s3ckpt/``; a bare name
(`` `_scan.py` ``) is in the folder of the path before it in the same cell
(`` `retention/_catalog.py`, `_scan.py` ``), and a folder (`` `tools/_report/` ``) stands for
its ``__init__.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "s3ckpt"
DOC = REPO / "docs" / "architecture.md"
_TOKEN = re.compile(r"`([^`]+)`")


def _named_in_table() -> set[str]:
    """Paths (relative to s3ckpt/) the first cells of the table name."""
    named: set[str] = set()
    for line in DOC.read_text().splitlines():
        if not line.startswith("| `"):
            continue
        cell = line.split("|")[1]
        folder = ""
        for token in _TOKEN.findall(cell):
            token = token.strip()
            if not (token.endswith(".py") or token.endswith("/")):
                continue
            if "/" in token.rstrip("/"):
                folder = token.rstrip("/").rsplit("/", 1)[0] + "/"
                path = token
            elif token.endswith("/"):
                folder, path = "", token
            else:
                path = folder + token
            named.add(path + "__init__.py" if path.endswith("/") else path)
    return named


def _modules() -> set[str]:
    return {
        p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*.py")
        if "__pycache__" not in p.parts
    }


def test_every_module_is_in_the_architecture_table() -> None:
    missing = sorted(_modules() - _named_in_table())
    assert not missing, (
        "docs/architecture.md's 'What lives where' table does not name these modules (add a "
        f"row, or the file name to a row of its package): {missing}"
    )


def test_the_architecture_table_names_only_modules_that_exist() -> None:
    stale = sorted(_named_in_table() - _modules())
    assert not stale, f"docs/architecture.md names modules that do not exist: {stale}"
