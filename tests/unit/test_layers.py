"""The house drawn from the imports (docs/architecture.md): every import of an s3ckpt module
inside the package, at any depth (lazy and ``TYPE_CHECKING`` imports included), runs down a
layer or stays inside its own package, and never imports the package face
``s3ckpt/__init__.py``. A lower package's private modules may be imported: a package's face
(its ``__all__``, pinned by test_public_faces.py) is what users get, not what the house shares
inside (issue 39: small faces)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "s3ckpt"

# Bottom to top. A module may import any module of a lower layer, and modules of its own
# package (``s3ckpt.dcp.*`` inside ``s3ckpt/dcp/``); nothing of its own layer elsewhere and
# nothing above it.
LAYERS: list[set[str]] = [
    {"errors", "_version", "_time", "_units", "_crc", "_gc_pause", "metrics"},  # leaves
    {"_step_names", "_scalars"},  # steps from checkpoint names (RE2); metric values as floats
    {"config", "uri", "format"},  # configuration, URLs, the names and manifest on the bucket
    {"store"},  # ObjectStore: S3Store, FsspecStore, MemoryStore, retry policy
    {"_transfer", "_commit", "_tombstone"},  # part pool, uploads, read walk; commit protocol
    {"_verify"},  # the one read-back verifier (commit-time check, verify, check)
    {"dcp", "retention"},  # torch's StorageWriter/Reader; catalog -> policy -> plan -> apply
    {"checkpointer", "tools"},  # siblings: the training loop's API and the people's tools
    {"_plugin_common"},  # what the framework plug-ins share (DCP errors, one decision per load)
    {"lightning", "accelerate", "torchtitan", "testing"},  # framework glue; the testing kit
    {"demo"},  # the main job: a small training run on the Checkpointer
    {"_cli"},  # the command line (``cli.py`` is its entry point, ``__main__.py`` runs it)
]
RANK = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def _unit(module: str) -> str:
    """``s3ckpt.dcp.reader`` -> ``dcp``; ``s3ckpt`` -> ``""`` (the package face)."""
    parts = module.split(".")
    unit = parts[1] if len(parts) > 1 else ""
    return "_cli" if unit in ("cli", "__main__") else unit


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out.append((".".join(parts), path))
    return out


def _imports(module: str, path: Path) -> list[tuple[int, str]]:
    """``(line, imported module)`` for every s3ckpt import in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    found: set[tuple[int, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {(node.lineno, a.name) for a in node.names if a.name.startswith("s3ckpt")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_pkg else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("s3ckpt"):
                continue
            # ``from s3ckpt import dcp`` imports the submodule, not the face.
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if (PACKAGE.parent / sub.replace(".", "/")).with_suffix(".py").exists() or (
                    PACKAGE.parent / sub.replace(".", "/") / "__init__.py"
                ).exists():
                    found.add((node.lineno, sub))
                else:
                    found.add((node.lineno, target))
    return sorted(found)


def _violations() -> list[str]:
    bad = []
    for module, path in _modules():
        unit = _unit(module)
        if unit == "":
            continue  # the face imports everything it re-exports
        if unit not in RANK:
            bad.append(f"{module}: not placed in any layer of LAYERS (add it)")
            continue
        for line, target in _imports(module, path):
            where = f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}"
            tunit = _unit(target)
            if tunit == "":
                bad.append(f"{where}: the package face; import the defining module")
                continue
            if tunit == unit:
                continue
            if tunit not in RANK:
                bad.append(f"{where}: {tunit} is in no layer")
            elif RANK[tunit] >= RANK[unit]:
                bad.append(f"{where}: runs {'across' if RANK[tunit] == RANK[unit] else 'up'}")
    return bad


def test_every_import_runs_down_a_layer() -> None:
    assert _violations() == []


def test_the_check_sees_a_violation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checker itself can fail: a store module importing dcp is an arrow up; a tool
    importing a private dcp module (a lower layer) is not."""
    pkg = tmp_path / "s3ckpt"
    for sub in ("store", "dcp", "tools"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "dcp" / "_upload.py").write_text("")
    (pkg / "store" / "bad.py").write_text("from s3ckpt.dcp import _upload\n")
    (pkg / "tools" / "bad.py").write_text("import s3ckpt.dcp._upload\nfrom s3ckpt import tools\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["PACKAGE"]), "PACKAGE", pkg)
    found = _violations()
    assert any("store/bad.py:1 imports s3ckpt.dcp._upload: runs up" in v for v in found), found
    assert not any("tools/bad.py:1" in v for v in found), found
    assert not any("tools/bad.py:2" in v for v in found), found
