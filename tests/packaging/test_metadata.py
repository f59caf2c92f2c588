"""What pyproject.toml declares is true of the source tree: every package is listed, one
version source, the dependencies the torch-free parts import, and the built-in policies."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from importlib import resources
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from s3ckpt._version import __version__
from s3ckpt.cli import main
from s3ckpt.errors import PolicyError
from s3ckpt.retention import KeepLast, load_policy
from s3ckpt.retention._toml import builtin_policies

ROOT = Path(__file__).resolve().parents[2]
POLICIES = ROOT / "policies"


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_every_package_is_listed_and_policies_map_to_the_top_level_directory() -> None:
    st = _pyproject()["tool"]["setuptools"]
    on_disk = {
        ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "s3ckpt").rglob("__init__.py")
    }
    listed = set(st["packages"])
    assert on_disk <= listed, f"packages missing from pyproject.toml: {sorted(on_disk - listed)}"
    assert listed - on_disk == {"s3ckpt.policies"}
    assert st["package-dir"] == {"s3ckpt.policies": "policies"}
    assert st["package-data"]["s3ckpt.policies"] == ["*.toml"]
    assert (ROOT / "s3ckpt" / "py.typed").is_file()
    assert "Apache License" in (ROOT / "LICENSE").read_text(encoding="utf-8")


def test_one_version_source() -> None:
    declared = _pyproject()["project"]["version"]
    assert version("s3ckpt") == declared == __version__
    literal = re.compile(rf"""["']{re.escape(declared)}["']""")
    copies = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "s3ckpt").rglob("*.py")
        if literal.search(p.read_text(encoding="utf-8"))
    ]
    assert not copies, f"the version is hard-coded in {copies}; read s3ckpt._version instead"


def test_dependencies_say_what_is_true() -> None:
    project = _pyproject()["project"]
    base = " ".join(project["dependencies"])
    assert "torch" not in base and "numpy" not in base
    extras = project["optional-dependencies"]
    assert "torch>=2.13" in extras["torch"] and any(d.startswith("numpy") for d in extras["torch"])
    assert "s3ckpt[torch]" in extras["demo"] and any(
        d.startswith("moto[server]") for d in extras["demo"]
    )
    assert project["requires-python"] == ">=3.11"


# The packages that need torch (the `torch` extra), and the framework glue, which needs its
# framework too (the `lightning` / `accelerate` extras, torchtitan); every other module
# imports without torch.
_TORCH_PACKAGES = (
    "s3ckpt.dcp",
    "s3ckpt.checkpointer",
    "s3ckpt.tools",
    "s3ckpt.lightning",
    "s3ckpt.accelerate",
    "s3ckpt.torchtitan",
    "s3ckpt._plugin_common",  # what the framework plug-ins share (torch.distributed)
)


def test_everything_but_dcp_checkpointer_and_tools_imports_without_numpy_or_torch() -> None:
    names = sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in (ROOT / "s3ckpt").rglob("*.py")
    )
    names = [n for n in names if not n.startswith(_TORCH_PACKAGES)]
    assert "s3ckpt._transfer._upload" in names and "s3ckpt._cli.retention" in names, names
    code = f"""
import importlib, sys
for name in {names!r}:
    importlib.import_module(name)
from s3ckpt.retention import load_policy
load_policy("pretraining")
bad = sorted(m for m in ("torch", "numpy") if m in sys.modules)
assert not bad, f"imported {{bad}} outside {_TORCH_PACKAGES}"
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


# -- built-in policy names ----------------------------------------------------------------------
def test_every_ready_made_file_is_a_builtin_name() -> None:
    assert builtin_policies() == sorted(p.stem for p in POLICIES.glob("*.toml"))
    for name in builtin_policies():
        assert load_policy(name) == load_policy(POLICIES / f"{name}.toml")


def test_the_editable_install_reads_the_top_level_policies_directory() -> None:
    import s3ckpt

    if Path(s3ckpt.__file__).resolve().parent != ROOT / "s3ckpt":
        pytest.skip("s3ckpt is not installed from this checkout (editable)")
    # One copy: the installed s3ckpt.policies is the repository's policies/ itself.
    assert Path(str(resources.files("s3ckpt.policies"))).resolve() == POLICIES


def test_checkpointer_takes_a_builtin_name() -> None:
    from s3ckpt.checkpointer import Checkpointer
    from s3ckpt.store.memory import MemoryStore

    with Checkpointer("s3://bucket/runs/a", policy="keep-last-3", store=MemoryStore()) as ckpt:
        assert ckpt.policy == KeepLast(3)


def test_a_file_that_exists_wins_over_a_builtin_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pretraining").write_text("[keep]\nlast = 1\n", encoding="utf-8")
    assert load_policy("pretraining") == KeepLast(1)
    # A directory of that name is no policy file: the name is the built-in one.
    (tmp_path / "keep-last-3").mkdir()
    assert load_policy("keep-last-3") == KeepLast(3)


def test_paths_are_files_never_builtin_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for path in ("pretraining.toml", "./pretraining", "policies/pretraining.toml"):
        with pytest.raises(PolicyError, match="cannot read the policy file"):
            load_policy(path)
    with pytest.raises(PolicyError, match="cannot read the policy file"):
        load_policy(Path("pretraining"))  # a Path is always a file


def test_an_unknown_name_lists_the_builtin_names() -> None:
    with pytest.raises(PolicyError) as info:
        load_policy("pretrainig")
    message = str(info.value)
    assert message.startswith("pretrainig: no such policy file and no built-in policy")
    assert "built-in: archive, finetuning, keep-last-3, pretraining" in message


def test_cli_prune_with_an_unknown_name_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The policy is read before any request, so no endpoint is needed.
    monkeypatch.setitem(os.environ, "AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    assert main(["prune", "s3://bucket/runs/", "--policy", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "built-in: archive, finetuning" in err, err


def test_a_missing_file_named_after_a_builtin_says_to_use_the_name(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # As from a wheel: the working directory has no policies/ folder.
    monkeypatch.chdir(tmp_path)
    hint = 'the built-in policy "pretraining" ships with s3ckpt: use policy="pretraining"'
    for path in ("policies/pretraining.toml", Path("policies/pretraining.toml")):
        with pytest.raises(PolicyError, match="no such file") as info:
            load_policy(path)
        assert hint in str(info.value)
    with pytest.raises(PolicyError) as info:
        load_policy("policies/nope.toml")  # not a built-in's name: the names are listed
    assert "no such file; built-in policies: archive, finetuning" in str(info.value)
    # Never the built-in silently in place of a missing file.
    from s3ckpt.checkpointer import Checkpointer
    from s3ckpt.store.memory import MemoryStore

    with pytest.raises(PolicyError, match="no such file"):
        Checkpointer("s3://bucket/runs/a", policy="policies/archive.toml", store=MemoryStore())
    monkeypatch.setitem(os.environ, "AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    argv = ["prune", "s3://bucket/runs/", "--policy", "policies/keep-last-3.toml"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert 'no such file; the built-in policy "keep-last-3" ships with s3ckpt' in err
    assert "--policy keep-last-3" in err
