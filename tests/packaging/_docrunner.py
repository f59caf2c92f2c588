"""Run one page's blocks, in order, in the interpreter of the venv that holds the wheel.

    python _docrunner.py SPEC.json RESULTS.json

tests/packaging/test_docs.py copies this file into the page's fresh working directory and
runs it there with the wheel venv's python, so neither the checkout nor tests/ is on
``sys.path``. It first proves that: ``s3ckpt`` is imported from the wheel venv's
site-packages. Then the page's preamble and its python blocks run with ``exec`` in one
namespace (as in a notebook: a block sees the names of the blocks before it), its shell blocks
run in bash between them (the wheel venv's ``bin`` first on ``PATH``), a retention policy in
TOML is loaded with the wheel's policy loader, and other TOML, YAML and JSON is parsed.

A failing block does not stop the page: each block's outcome is written to RESULTS.json as
``{"where", "ok", "error", "seconds"}``. Only the standard library, the wheel and what the
wheel venv reaches are imported here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tomllib
import traceback
from pathlib import Path
from typing import Any


def _check_the_wheel(spec: dict[str, Any]) -> None:
    import s3ckpt

    where = Path(s3ckpt.__file__).resolve()
    site = Path(spec["site"]).resolve()
    assert where.is_relative_to(site), f"s3ckpt imported from {where}, not the wheel in {site}"
    root = Path(spec["root"]).resolve()
    on_path = [p for p in sys.path if p and Path(p).resolve() in (root, root / "tests")]
    assert not on_path, f"the checkout is on sys.path: {on_path}"


def _run_python(block: dict[str, Any], ns: dict[str, Any]) -> None:
    exec(compile(block["code"], block["where"], "exec"), ns)


def _run_shell(block: dict[str, Any], env: dict[str, str]) -> None:
    proc = subprocess.run(
        ["bash", "-c", block["script"]],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    sys.stdout.write(proc.stdout)
    sys.stdout.write(proc.stderr)
    if proc.returncode != 0:
        tail = (proc.stdout[-1500:] + "\n" + proc.stderr[-2500:]).strip()
        raise AssertionError(f"exit {proc.returncode}\n{tail}")


def _check_data(block: dict[str, Any]) -> None:
    lang, code = block["lang"], block["code"]
    if lang == "toml":
        doc = tomllib.loads(code)
        if "keep" in doc:  # a retention policy: the loader of the wheel, which checks each key
            from s3ckpt.retention import parse_policy

            print(f"policy: {parse_policy(code, block['where'])}")
    elif lang == "yaml":
        import yaml

        list(yaml.safe_load_all(code))
    elif lang == "json":
        json.loads(code)
    else:
        raise AssertionError(f"no rule for language {lang!r}")


def main(spec_path: str, results_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    env = dict(os.environ)
    # The fork server's `s3ckpt` (tests/packaging/_zygote.py) first, then the wheel venv's.
    env["PATH"] = os.pathsep.join([*spec.get("path_first", []), spec["bin"], env.get("PATH", "")])
    os.environ["PATH"] = env["PATH"]  # for the subprocesses python blocks start
    results = []
    ns: dict[str, Any] = {"__name__": "__main__"}
    steps = [{"where": f"{spec['page']} (preamble)", "kind": "python", "code": spec["preamble"]}]
    steps += spec["blocks"]
    for i, block in enumerate(steps):
        print(f"\n----- {block['where']}", flush=True)
        t0 = time.perf_counter()
        error = None
        try:
            if i == 0:
                _check_the_wheel(spec)
            if block["kind"] == "python":
                _run_python(block, ns)
            elif block["kind"] == "shell":
                _run_shell(block, env)
            else:
                _check_data(block)
        except BaseException as exc:  # a block's SystemExit is a failure too
            error = "".join(traceback.format_exception(exc))[-4000:]
            print(error)
        sys.stdout.flush()
        sys.stderr.flush()
        took = time.perf_counter() - t0
        results.append(
            {"where": block["where"], "ok": error is None, "error": error, "seconds": took}
        )
        Path(results_path).write_text(json.dumps(results), encoding="utf-8")
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1], sys.argv[2])
    sys.stdout.flush()
    sys.stderr.flush()
    # Without waiting for what the blocks left running (a Checkpointer never closed, a fault
    # proxy): the results are written, and the page is done.
    os._exit(code)
