"""Check the Markdown docs for placeholders and references to repository files that do not exist.

    python docs/_gen/check_docs.py          check every page; exit 1 listing each problem

The pages: everything under docs/ (except docs/_gen/), README.md, CHANGELOG.md,
CONTRIBUTING.md and benchmarks/README.md. A problem is

- a placeholder: ``TODO``, ``FIXME``, ``XXX`` or ``OUTPUT_<NAME>`` (a slot for output that was
  never pasted), outside code blocks and inside them;
- a relative link (``[text](../terraform/)``) to a file or folder that does not exist;
- a repository path in backticks (```deploy/cron/Dockerfile```, ```tests/unit/x.py```) that
  does not exist. Only paths under the repository's own top-level folders count, and paths
  with wildcards or ``<placeholders>`` are skipped.

``mkdocs build --strict`` checks links between pages inside docs/ as well; links that leave
docs/ (to the terraform module, the benchmarks, ``deploy/``) are checked only here. The site's
hook (``docs/_gen/hooks.py``) runs the same checks on every page it builds.
This file imports nothing outside the standard library.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

__all__ = ["REPO", "check_text", "doc_files", "main", "resolve_link"]

#: Top-level folders whose paths in backticks are checked.
_TREE_ROOTS = (
    "benchmarks",
    "deploy",
    "docs",
    "policies",
    "requirements",
    "s3ckpt",
    "scripts",
    "terraform",
    "tests",
)

_PLACEHOLDER = re.compile(r"\b(TODO|FIXME|XXX)\b|\bOUTPUT_[A-Z0-9_]+\b")
# [text](target) and ![alt](target); the target up to whitespace or ')'.
_LINK = re.compile(r"!?\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
_CODE_PATH = re.compile(r"`(?P<path>(?:" + "|".join(_TREE_ROOTS) + r")/[^`\s]*)`")
_FENCE = re.compile(r"^\s*(```|~~~)")


def doc_files() -> list[Path]:
    """Every Markdown page that is checked."""
    pages = sorted(p for p in (REPO / "docs").rglob("*.md") if "_gen" not in p.parts)
    extra = [REPO / n for n in ("README.md", "CHANGELOG.md", "CONTRIBUTING.md")]
    extra.append(REPO / "benchmarks" / "README.md")
    return pages + [p for p in extra if p.exists()]


def resolve_link(source: Path, target: str) -> Path | None:
    """The repository path a relative link in ``source`` points at, or None for URLs,
    anchors and mail links."""
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith(("#", "/")):
        return None
    path = target.split("#", 1)[0].split("?", 1)[0]
    if not path:
        return None
    return (source.parent / path).resolve()


def _lines_outside_fences(text: str) -> Iterator[tuple[int, str, bool]]:
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            yield number, line, True
            continue
        yield number, line, fenced


def check_text(text: str, source: Path) -> list[str]:
    """Problems in one page's Markdown ``text`` read from ``source``, one line each."""
    rel = source.relative_to(REPO) if source.is_relative_to(REPO) else source
    problems = []
    for number, line, fenced in _lines_outside_fences(text):
        where = f"{rel}:{number}"
        match = _PLACEHOLDER.search(line)
        if match:
            problems.append(f"{where}: placeholder {match.group(0)!r}")
        if fenced:
            continue
        linked = set()
        for link in _LINK.finditer(line):
            path = resolve_link(source, link.group("target"))
            if path is not None and not path.exists():
                problems.append(f"{where}: link to a missing file: {link.group('target')}")
                linked.add(path)
        for code in _CODE_PATH.finditer(line):
            path_text = code.group("path").rstrip(".,:;")
            if any(c in path_text for c in "*<>{}$") or "..." in path_text:
                continue
            path_text = path_text.split("::", 1)[0].split("#", 1)[0]
            if (REPO / path_text).resolve() in linked:
                continue  # reported once, as the link it is the text of
            if not (REPO / path_text).exists():
                problems.append(f"{where}: names a missing repository path: {path_text}")
    return problems


def check_files(files: Iterable[Path]) -> list[str]:
    """Problems in every file of ``files``."""
    problems = []
    for path in files:
        problems.extend(check_text(path.read_text(encoding="utf-8"), path))
    return problems


def main(argv: list[str] | None = None) -> int:
    """Check every page; print each problem and return 1 when there is any."""
    del argv
    problems = check_files(doc_files())
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"check_docs: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
