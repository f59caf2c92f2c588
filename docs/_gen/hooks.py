"""mkdocs hooks for s3ckpt's site (named in mkdocs.yml; run inside the docs venv).

- A page whose Markdown is ``<!-- s3ckpt:include PATH -->`` (a path relative to the page) is
  replaced by that file, with its links rewritten to work from the page: this is how
  CHANGELOG.md and CONTRIBUTING.md, which live at the repository root, become pages.
- Links that leave docs/ (``../terraform/``, ``../deploy/cron/Dockerfile``) point at the
  repository: they become links to GitHub when ``pyproject.toml`` names a GitHub repository
  (``[project.urls]`` Source or Repository), else the path as code.
- Every page is checked by ``check_docs.check_text`` (placeholders, missing repository files);
  each problem is a warning, so ``mkdocs build --strict`` fails on it.
- The docstrings mix in Sphinx roles (``:class:`X```); in the API pages they are shown as the
  plain code they name (``~a.b.C`` as ``C``).
"""

from __future__ import annotations

import logging
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from check_docs import REPO, check_text, resolve_link

log = logging.getLogger("mkdocs.plugins.s3ckpt")

_INCLUDE = re.compile(r"^\s*<!--\s*s3ckpt:include\s+(?P<path>\S+)\s*-->\s*$")
_LINK = re.compile(r"(?P<bang>!?)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)\)")
_ROLE = re.compile(
    r":(?:class|func|meth|attr|data|mod|exc|obj):<code>(?P<tilde>~?)(?P<name>[^<]*)</code>"
)
DOCS = REPO / "docs"


def _repo_url() -> str | None:
    try:
        urls = tomllib.loads((REPO / "pyproject.toml").read_text())["project"].get("urls", {})
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return None
    for key in ("Source", "Repository", "source", "repository"):
        url = urls.get(key)
        if isinstance(url, str) and url.startswith("https://github.com/"):
            return url.rstrip("/")
    return None


def _rewrite_links(markdown: str, source: Path, page: Path) -> str:
    """Links written relative to ``source``, rewritten for the page at ``page``."""
    base = _repo_url()

    def fix(match: re.Match[str]) -> str:
        target = match.group("target")
        path = resolve_link(source, target)
        if path is None:
            return match.group(0)
        anchor = "#" + target.split("#", 1)[1] if "#" in target else ""
        if path.is_relative_to(DOCS):
            rel = Path(*([".."] * len(page.parent.relative_to(DOCS).parts)), path.relative_to(DOCS))
            return f"{match.group('bang')}[{match.group('text')}]({rel.as_posix()}{anchor})"
        if not path.is_relative_to(REPO):
            return match.group(0)
        rel_repo = path.relative_to(REPO).as_posix()
        if base:
            kind = "tree" if path.is_dir() else "blob"
            return f"[{match.group('text')}]({base}/{kind}/main/{rel_repo}{anchor})"
        text = match.group("text")
        return text if rel_repo in text else f"{text} (`{rel_repo}`)"

    return _LINK.sub(fix, markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Include, check and rewrite one page's Markdown."""
    page_path = DOCS / page.file.src_uri
    source = page_path
    match = _INCLUDE.match(markdown.strip()) if markdown.strip().count("\n") == 0 else None
    if match:
        source = (page_path.parent / match.group("path")).resolve()
        if not source.exists():
            log.warning("%s: included file %s does not exist", page.file.src_uri, source)
            return markdown
        markdown = source.read_text(encoding="utf-8")
    for problem in check_text(markdown, source):
        log.warning(problem)
    return _rewrite_links(markdown, source, page_path)


def _strip_role(match: re.Match[str]) -> str:
    name = match.group("name")
    return f"<code>{name.rsplit('.', 1)[-1] if match.group('tilde') else name}</code>"


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """Sphinx roles left in rendered docstrings become plain code."""
    return _ROLE.sub(_strip_role, html)
