"""The fenced code blocks of the docs, as tests/packaging/test_docs.py runs them.

A page is README.md or a Markdown file under docs/ (not docs/_gen/). A page that is only
``<!-- s3ckpt:include PATH -->`` (docs/contributing.md, docs/changelog.md) stands for the file
it includes, as on the site, so its blocks are read from that file, under that file's name.

A block is a fenced block (```` ``` ```` or ``~~~``, indented inside a list or not; its
indentation is removed). The line right before its opening fence (blank lines aside) may be
``<!-- doctest: skip: REASON -->``: the block is then not run, and the test lists it with its
reason. This module imports only the standard library.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "RUN",
    "CHECK",
    "NOT_CODE",
    "SHELLS",
    "Block",
    "blocks",
    "buckets",
    "pages",
    "pip_extras",
    "strip_pip_lines",
]

ROOT = Path(__file__).resolve().parents[2]

#: Languages that run: python in the page's interpreter, the shells in bash.
SHELLS = frozenset({"bash", "sh", "shell", "console"})
RUN = frozenset({"python", *SHELLS})
#: Languages that are parsed (toml: a retention policy is loaded with the policy loader).
CHECK = frozenset({"toml", "yaml", "json"})
#: Languages that are not code to run here: output, and terraform (checked by make
#: check-terraform against the module itself).
NOT_CODE = frozenset({"text", "hcl"})

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)\s*$")
_SKIP = re.compile(r"^\s*<!--\s*doctest:\s*skip:\s*(?P<reason>.+?)\s*-->\s*$")
_INCLUDE = re.compile(r"^\s*<!--\s*s3ckpt:include\s+(?P<path>\S+)\s*-->\s*$")
# A bucket in an s3:// URL (S3's naming rules: 3-63 of a-z 0-9 . -, alphanumeric at both ends).
_BUCKET = re.compile(r"s3://(?P<name>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?=/|[\s\"'`)]|$)")
_PIP = re.compile(r"^\s*(?:\$\s+)?(?:python\d?(?:\.\d+)?\s+-m\s+)?pip3?\s+install\b")
_EXTRA = re.compile(r"\bs3ckpt\[(?P<extras>[^\]]*)\]")


@dataclass(frozen=True)
class Block:
    """One fenced block: the file it is in, the line of its opening fence (1-based), its
    language (``""`` when the fence names none), its code, and the skip reason, if marked."""

    path: str
    line: int
    lang: str
    code: str
    skip: str | None

    @property
    def where(self) -> str:
        """``README.md:56 (python)``: what a failure names."""
        return f"{self.path}:{self.line} ({self.lang or 'no language'})"


def _dedent(line: str, indent: int) -> str:
    """``line`` without the fence's indentation (fewer spaces where it has fewer)."""
    return line[min(indent, len(line) - len(line.lstrip())) :]


def pages(root: Path = ROOT) -> list[str]:
    """The pages whose blocks are tested, relative to ``root``: README.md, then docs/**.md
    (not docs/_gen/), each include page replaced by the file it includes."""
    found = ["README.md"]
    for page in sorted((root / "docs").rglob("*.md")):
        if "_gen" in page.relative_to(root).parts:
            continue
        text = page.read_text(encoding="utf-8").strip()
        match = _INCLUDE.match(text) if "\n" not in text else None
        target = (page.parent / match.group("path")).resolve() if match else page
        found.append(target.relative_to(root).as_posix())
    return list(dict.fromkeys(found))


def blocks(page: str, root: Path = ROOT) -> list[Block]:
    """The fenced blocks of ``page`` (a path relative to ``root``), in order."""
    lines = (root / page).read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, indent = opening.group("fence"), len(opening.group("indent"))
        end = i + 1
        while end < len(lines) and not (
            lines[end].strip().startswith(fence) and not lines[end].strip().strip(fence[0])
        ):
            end += 1
        body = [_dedent(line, indent) for line in lines[i + 1 : end]]
        before = i - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        marker = _SKIP.match(lines[before]) if before >= 0 else None
        out.append(
            Block(
                path=page,
                line=i + 1,
                lang=opening.group("lang").lower(),
                code="\n".join(body) + "\n",
                skip=marker.group("reason") if marker else None,
            )
        )
        i = end + 1
    return out


def buckets(all_blocks: list[Block]) -> set[str]:
    """The buckets the blocks name in s3:// URLs (and ``--bucket NAME``)."""
    names: set[str] = set()
    for block in all_blocks:
        names.update(m.group("name") for m in _BUCKET.finditer(block.code))
        names.update(re.findall(r"--bucket\s+([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])\b", block.code))
    return names


def pip_extras(code: str) -> list[tuple[int, str]]:
    """``(line offset, extra)`` for every ``s3ckpt[extra]`` a ``pip install`` line names."""
    found = []
    for offset, line in enumerate(code.splitlines()):
        if _PIP.match(line):
            for match in _EXTRA.finditer(line):
                found += [
                    (offset, e.strip()) for e in match.group("extras").split(",") if e.strip()
                ]
    return found


def strip_pip_lines(code: str) -> tuple[str, int]:
    """``code`` with its ``pip install`` lines commented out (they would reach the package
    index), and how many there were."""
    out, count = [], 0
    for line in code.splitlines():
        if _PIP.match(line):
            out.append("# (not run: pip install) " + line.strip())
            count += 1
        else:
            out.append(line)
    return "\n".join(out) + "\n", count


def shell_script(block: Block) -> str:
    """A bash script that runs ``block``, and names the page's line of a failing command.

    ``bash``/``sh``/``shell``: the block as written, under ``set -eo pipefail``. ``console``:
    the ``$ `` lines are the commands (a line ending in ``\\`` continues on the next); other
    lines are output and are not run. Each command must exit 0, unless the block shows its
    status, by ``$ echo $?`` and the number under it, or by ``[exit N]``: then exactly that.
    ``pip install`` lines are not run in either (see :func:`strip_pip_lines`).
    """
    code, _ = strip_pip_lines(block.code)
    if block.lang != "console":
        where = f"{block.path}:$((LINENO + {block.line - 1}))"
        trap = f"trap 'echo \"doctest: {where}: exit $? from: $BASH_COMMAND\" >&2' ERR"
        return f"set -eo pipefail; {trap}\n{code}"
    lines = code.splitlines()
    commands: list[list[object]] = []  # [doc line, command, expected status]
    i = 0
    while i < len(lines):
        line = lines[i]
        status = re.fullmatch(r"\s*\[exit (\d+)\]\s*", line)
        if status and commands:
            commands[-1][2] = int(status.group(1))
        if not line.startswith("$ "):
            i += 1
            continue
        command, i = line[2:], i + 1
        while command.rstrip().endswith("\\") and i < len(lines):
            command, i = command + "\n" + lines[i], i + 1
        if command.strip() == "echo $?":
            shown = lines[i].strip() if i < len(lines) else ""
            if commands and shown.isdigit():
                commands[-1][2] = int(shown)
            continue
        commands.append([block.line + i - command.count("\n"), command, 0])
    out = []
    for doc_line, command, expected in commands:
        said = str(command).splitlines()[0].replace("'", "")[:80]
        out.append(str(command))
        out.append(
            f"rc=$?; if [ $rc -ne {expected} ]; then echo 'doctest: {block.path}:{doc_line}: "
            f"exit '$rc', the page shows {expected}: {said}' >&2; exit 1; fi"
        )
    return "\n".join(out) + "\n"
