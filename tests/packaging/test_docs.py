"""Every fenced code block of the README and the docs runs, or is checked, against the wheel.

A new user reads README.md and the pages under docs/ and copies their blocks after
``pip install``. This test does the same with the wheel built from the checkout, so the docs
and the program cannot drift apart. One test per page (``test_page[docs/tools.md]``); a
failure names each failing block by page and line. The pages and blocks are read by
tests/packaging/_docblocks.py, and each page runs in tests/packaging/_docrunner.py.

Where a block runs:

- **The interpreter.** A second venv holds the wheel, installed with ``--no-deps``, and a
  ``.pth`` file that appends the development venv's site-packages *after* its own, so torch,
  lightning, accelerate and moto come from there without a second install, while ``import
  s3ckpt`` is the wheel's copy (the runner asserts on ``s3ckpt.__file__``, and that the
  checkout is not on ``sys.path``; a ``.pth`` path line does not run the development venv's
  own ``.pth`` files, so the editable install's finder is not loaded). Each page runs in a
  fresh interpreter, in a fresh empty directory as its working directory.
- **The store.** The session's moto server on 127.0.0.1 (tests/conftest.py), with
  ``AWS_ENDPOINT_URL`` and dummy credentials in the environment, and the buckets the blocks
  name (``s3://bucket/...``, ``my-bucket``, ``ml-checkpoints``, ...) created, and emptied
  before each page. No other network: instance metadata is off, and a block that would reach
  anything else carries a skip marker.

What each language gets:

- ``python``: the page's blocks run in order in one namespace, after the page's preamble
  (:data:`PREAMBLES`: a tiny ``model``, ``optimizer``, ``train_state`` and the like, where the
  page assumes them). A block sees the names the blocks before it defined.
- ``bash`` / ``sh`` / ``shell``: the block under ``set -eo pipefail`` with the wheel venv's
  ``bin`` first on ``PATH`` (so ``s3ckpt ...`` is the wheel's command). ``console``: the ``$ ``
  lines run, other lines are output; each command must exit 0, or with the status the block
  shows (``$ echo $?`` and the number under it, or ``[exit N]``). Python and shell blocks of a
  page run in page order, so a command sees the checkpoints an earlier block saved.
- ``pip install`` lines are never run (they would reach the package index); every extra they
  name (``pip install "s3ckpt[otel]"``) must be a ``Provides-Extra`` of the wheel.
- ``toml``: a retention policy (it has ``keep``) is loaded by the wheel's policy loader;
  other TOML, and ``yaml`` and ``json``, must parse.
- ``text`` (output, layouts, usage lines) and ``hcl`` (terraform: make check-terraform checks
  the module) are not code and are only counted. A block with no language fails: a reader
  cannot tell whether to type it.
- Any block is skipped by ``<!-- doctest: skip: REASON -->`` on the line before its fence,
  and only so: for what cannot run here (a real AWS account, a GPU cluster, a command that
  needs a checkout, ``make demo``, which tests/integration/test_demo.py covers). The run lists
  every skipped block with its reason in pytest's terminal summary.

Cost: one venv with the wheel and no dependencies (a few seconds), then one interpreter per
page. The ``s3ckpt`` commands run in children forked from one interpreter that imported the
wheel's ``s3ckpt.cli`` and torch once (:mod:`tests.packaging._zygote`, ``cli_shim``): the same
``main`` the console script calls, with the command's argv, environment, working directory
and standard streams, without a torch import per command (which made this test 4 minutes
on a 2-core host). Byte-code is cached in one folder for the run (``_page_env``).
Marked ``packaging``: ``make check-wheel`` (``-m packaging tests/packaging``) runs it, and so
does ``make test`` in that phase.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from pathlib import Path
from typing import Any

import pytest

from tests.packaging import _docblocks as docblocks
from tests.packaging import _zygote as zygote
from tests.packaging._docblocks import CHECK, NOT_CODE, RUN, Block

pytestmark = [pytest.mark.packaging, pytest.mark.integration]

ROOT = docblocks.ROOT
PAGES = docblocks.pages()
ALL_BLOCKS = {page: docblocks.blocks(page) for page in PAGES}
# A page's limit, and pytest-timeout's for its test: generous, for a loaded CI machine, where
# each `s3ckpt inspect`-like command imports torch anew.
PAGE_TIMEOUT = 900

# The names a page's blocks assume. Minimal on purpose: what a reader of that page already has
# (a model, an optimizer, a training loop's step), never a fix for a block that is wrong.
_MODEL = """\
import torch

torch.manual_seed(0)
model = torch.nn.Linear(8, 8)
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)


class TrainState:  # torch's Stateful: what a training loop keeps besides the model
    step = 0

    def state_dict(self):
        return {"step": self.step}

    def load_state_dict(self, state):
        self.step = state["step"]


train_state = TrainState()
"""

_SAVE = """\
from s3ckpt import Checkpointer


def save(run, *steps):  # committed checkpoints of the run, as a training job left them
    with Checkpointer(run) as c:
        for step in steps:
            c.save(step, model, optimizer, train_state)
"""

_LIGHTNING = """\
import lightning.pytorch as pl
import torch


class LitModel(pl.LightningModule):  # logs val_loss; stops after two epochs
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, _):
        return self.layer(batch).square().mean()

    def validation_step(self, batch, _):
        self.log("val_loss", self.layer(batch).square().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.ones(8, 4), batch_size=4)

    val_dataloader = train_dataloader

    def on_train_epoch_end(self):
        self.trainer.should_stop = self.current_epoch >= 1


model = LitModel()
"""

#: Per page: Python run before its first block (see the module docstring).
PREAMBLES: dict[str, str] = {
    "README.md": _MODEL
    + _SAVE
    + """
save("s3://bucket/runs/llama", 9000)  # the run's checkpoint before (s3ckpt diff's A)
step, loss = 10000, model(torch.ones(8)).square().mean()  # the loop, at its next save
""",
    "docs/index.md": _MODEL
    + _SAVE
    + """
save("s3://bucket/runs/llama", 9000)
total_steps = 10000
train_step = lambda *batch: 0.5  # noqa: E731
""",
    "docs/checkpointer.md": _MODEL
    + """
import types


class Model(torch.nn.Linear):  # an output with .loss, as Hugging Face models return
    def forward(self, batch):
        return types.SimpleNamespace(loss=super().forward(batch).square().mean())


model = Model(8, 8)
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
data = iter(lambda: torch.ones(8), None)
total_steps = 1000
evaluate = lambda model: 0.5  # noqa: E731
""",
    "docs/dcp.md": _MODEL
    + """
state_dict = {"model": model.state_dict(), "optim": optimizer.state_dict()}


class MyConfig:  # a value class of the user's own
    pass
""",
    "docs/metrics.md": _MODEL
    + """
from s3ckpt import Checkpointer

ckpt = Checkpointer("s3://bucket/runs/metrics")
""",
    "docs/frameworks/lightning.md": _LIGHTNING
    + """
import os
import tempfile

import boto3

# What stock Lightning with s3fs left: one torch.save object at s3://my-bucket/runs/exp0/last.ckpt
with tempfile.TemporaryDirectory() as tmp:
    stock = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False,
                       enable_progress_bar=False, enable_model_summary=False,
                       default_root_dir=tmp)
    stock.fit(LitModel())
    stock.save_checkpoint(os.path.join(tmp, "last.ckpt"))
    s3 = boto3.client("s3")
    s3.upload_file(os.path.join(tmp, "last.ckpt"), "my-bucket", "runs/exp0/last.ckpt")
""",
    "docs/frameworks/accelerate.md": _MODEL
    + """
loader = torch.utils.data.DataLoader(torch.ones(1000, 8), batch_size=1)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100)
""",
    "docs/operations.md": """\
import argparse
import os

args = argparse.Namespace(run="llama-8b")  # train.py's arguments
os.environ["S3CKPT_URL"] = "s3://acme-ml-checkpoints/checkpoints/"  # as the Job sets it
""",
    "docs/retention.md": _MODEL
    + _SAVE
    + """
save("s3://ml-checkpoints/runs/llama-8b", 2500, 5000, 7500, 10000)
import torch.distributed.checkpoint

import s3ckpt

for step, name in [(100, "epoch=0-step=100"), (200, "epoch=0-step=200"), (300, "epoch=1-step=300"),
                   (400, "epoch=2-step=400")]:  # a Lightning run's checkpoints
    url = f"s3://ml-checkpoints/runs/lit/{name}.ckpt"
    torch.distributed.checkpoint.save(
        {"model": model.state_dict()}, storage_writer=s3ckpt.S3StorageWriter(url, step=step)
    )
""",
    "docs/tools.md": """\
import torch

from s3ckpt import Checkpointer

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Embedding(100, 16), torch.nn.Linear(16, 32), torch.nn.ReLU())
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
with Checkpointer("s3://ml-checkpoints/run") as c:  # the two checkpoints the page looks at
    c.save(100, model, opt)
    model[1].weight.data += 0.001
    c.save(200, model, opt)
state_dict = {"model": model.state_dict()}
""",
}


SUMMARY = pytest.StashKey[list[str]]()


def _summary(config: pytest.Config) -> list[str]:
    return config.stash.setdefault(SUMMARY, [])


@pytest.fixture(scope="module")
def docs_venv(dists: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with the wheel (``--no-deps``) that reaches the development venv's packages
    after its own: its ``bin`` directory."""
    where = tmp_path_factory.mktemp("docs-venv") / "v"
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120
    )
    python = where / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q"]
    pip += ["--disable-pip-version-check", "--no-deps", "--no-compile", "--no-index"]
    proc = subprocess.run([*pip, str(dists[1])], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    dev = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (Path(site) / "zz_dev_site_packages.pth").write_text("\n".join(dev) + "\n")
    print(f"\ndocs venv (the wheel, no deps) in {time.perf_counter() - t0:.1f}s")
    return where / "bin"


@pytest.fixture(scope="module")
def wheel_extras(dists: tuple[Path, Path]) -> set[str]:
    """The extras the wheel's METADATA provides."""
    wheel = zipfile.ZipFile(dists[1])
    (meta,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    return set(Parser().parsestr(wheel.read(meta).decode()).get_all("Provides-Extra") or [])


@pytest.fixture(scope="module")
def doc_buckets(moto_endpoint: str) -> Iterator[tuple[Any, set[str]]]:
    """A boto3 client of the moto server and the buckets the docs name, created."""
    import boto3

    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    names = docblocks.buckets([b for page in ALL_BLOCKS.values() for b in page])
    for name in sorted(names):
        client.create_bucket(Bucket=name)
    yield client, names


def _empty(client: Any, bucket: str) -> None:
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
    for up in client.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
        client.abort_multipart_upload(Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"])


def _plan(page: str) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """(what the runner does, in order; the skipped and not-code blocks, for the summary;
    the blocks that fail before anything runs)."""
    steps: list[dict[str, Any]] = []
    listed: list[str] = []
    problems: list[str] = []
    for block in ALL_BLOCKS[page]:
        if block.skip is not None:
            listed.append(f"skipped  {block.where}: {block.skip}")
        elif block.lang in NOT_CODE:
            listed.append(f"not code {block.where}")
        elif not block.lang:
            problems.append(
                f"{block.where}: a block with no language: name one (```text for output), so "
                "a reader knows whether to type it"
            )
        elif block.lang == "python":
            steps.append({"where": block.where, "kind": "python", "code": block.code})
        elif block.lang in RUN:
            script = docblocks.shell_script(block)
            steps.append({"where": block.where, "kind": "shell", "script": script})
        elif block.lang in CHECK:
            steps.append(
                {"where": block.where, "kind": "data", "lang": block.lang, "code": block.code}
            )
        else:
            problems.append(f"{block.where}: no rule for the language {block.lang!r}")
    return steps, listed, problems


def _extras_problems(blocks: list[Block], extras: set[str]) -> list[str]:
    return [
        f'{b.path}:{b.line + 1 + offset}: pip install "s3ckpt[{extra}]": the wheel has no '
        f"extra {extra!r} (it has {', '.join(sorted(extras))})"
        for b in blocks
        if b.skip is None
        for offset, extra in docblocks.pip_extras(b.code)
        if extra not in extras
    ]


def _page_env(pycache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONPATH"))}
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    # Byte-code cached in one folder for the whole run, even where the environment says not to
    # write it (PYTHONDONTWRITEBYTECODE): else each `s3ckpt` command compiles torch anew.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


@pytest.fixture(scope="module")
def cli_shim(docs_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A folder whose ``s3ckpt`` runs each command in a child forked from one interpreter
    that imported the wheel's ``s3ckpt.cli`` and torch once (tests/packaging/_zygote.py)."""
    where = tmp_path_factory.mktemp("cli-shim")
    sock = where / "s3ckpt.sock"
    pycache = tmp_path_factory.getbasetemp() / "docs-pycache"
    server = subprocess.Popen(
        [str(docs_venv / "python"), str(Path(__file__).with_name("_zygote.py")), str(sock)],
        cwd=where,
        env=_page_env(pycache),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        ready = server.stdout.readline().split()
        assert ready[:1] == ["ready"], f"the fork server did not start (exit {server.poll()})"
        # The server's s3ckpt is the wheel's, not the checkout's.
        assert Path(ready[1]).resolve().is_relative_to(docs_venv.parent.resolve()), ready
        shim = where / "bin"
        shim.mkdir()
        client = shim / "s3ckpt"
        client.write_text(
            zygote.CLIENT.format(
                python=docs_venv / "python", real=str(docs_venv / "s3ckpt"), sock=str(sock)
            )
        )
        client.chmod(0o755)
        yield shim
    finally:
        server.kill()
        server.wait(timeout=30)


def _run_page(
    page: str,
    steps: list[dict[str, Any]],
    bin_dir: Path,
    cwd: Path,
    pycache: Path,
    shim: Path | None = None,
) -> list[dict[str, Any]]:
    runner = cwd / "_docrunner.py"
    shutil.copy(Path(__file__).with_name("_docrunner.py"), runner)
    python = bin_dir / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    spec = {
        "page": page,
        "bin": str(bin_dir),
        "path_first": [str(shim)] if shim is not None else [],
        "site": site,
        "root": str(ROOT),
        "preamble": PREAMBLES.get(page, ""),
        "blocks": steps,
    }
    (cwd / "_spec.json").write_text(json.dumps(spec), encoding="utf-8")
    env = _page_env(pycache)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [str(python), "_docrunner.py", "_spec.json", "_results.json"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=PAGE_TIMEOUT,
    )
    print(proc.stdout[-20000:] + proc.stderr[-5000:])
    print(f"{page}: {len(steps)} block(s) in {time.perf_counter() - t0:.1f}s")
    results_file = cwd / "_results.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else []
    for r in results:
        print(f"  {r['seconds']:6.1f}s  {'ok  ' if r['ok'] else 'FAIL'}  {r['where']}")
    if len(results) != len(steps) + 1:
        results.append(
            {
                "where": page,
                "ok": False,
                "error": f"the runner stopped (exit {proc.returncode}) after "
                f"{len(results)} of {len(steps) + 1} steps:\n{proc.stderr[-3000:]}",
            }
        )
    return results


PAGES_WITH_BLOCKS = [page for page in PAGES if ALL_BLOCKS[page]]


@pytest.mark.timeout(PAGE_TIMEOUT + 60)
@pytest.mark.parametrize("page", PAGES_WITH_BLOCKS)
def test_page(
    page: str,
    docs_venv: Path,
    cli_shim: Path,
    wheel_extras: set[str],
    doc_buckets: tuple[Any, set[str]],
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> None:
    client, names = doc_buckets
    for name in sorted(names):
        _empty(client, name)
    steps, listed, problems = _plan(page)
    problems += _extras_problems(ALL_BLOCKS[page], wheel_extras)
    ran = 0
    if steps or PREAMBLES.get(page):
        pycache = tmp_path_factory.getbasetemp() / "docs-pycache"
        results = _run_page(page, steps, docs_venv, tmp_path, pycache, cli_shim)
        ran = len(steps)
        problems += [f"{r['where']}:\n{r['error']}" for r in results if not r["ok"]]
    summary = _summary(request.config)
    summary.append(f"{page}: {ran} run or checked, {len(listed)} not run")
    summary += [f"    {line}" for line in listed]
    assert not problems, f"{len(problems)} block(s) of {page} fail:\n\n" + "\n\n".join(problems)


def test_every_page_is_covered_and_markers_name_a_reason() -> None:
    assert "README.md" in PAGES and "CONTRIBUTING.md" in PAGES  # docs/contributing.md's include
    assert not [p for p in PAGES if p.startswith("docs/_gen/")]
    for page, blocks in ALL_BLOCKS.items():
        lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
        markers = [n for n, line in enumerate(lines, 1) if line.lstrip().startswith("<!-- doctest")]
        assert len(markers) == sum(b.skip is not None for b in blocks), (
            f"{page}:{markers}: a doctest marker that is not right before a code block, or "
            "that does not read <!-- doctest: skip: REASON -->"
        )


def test_the_harness_reads_markers_and_checks_console_status(tmp_path: Path) -> None:
    (tmp_path / "p.md").write_text(
        "<!-- doctest: skip: needs a real AWS account -->\n```bash\naws s3 ls\n```\n\n"
        "- a list item:\n\n  ```console\n  $ false\n  $ echo $?\n  1\n  $ true\n  output\n  ```\n\n"
        "```console\n$ true\n$ (exit 3)\n[exit 2]\n```\n\n"
        '```bash\npip install "s3ckpt[nope]"\nfalse\n```\n'
    )
    skipped, shown, wrong, plain = docblocks.blocks("p.md", root=tmp_path)
    assert (skipped.skip, skipped.line, shown.skip) == ("needs a real AWS account", 2, None)
    assert shown.code == "$ false\n$ echo $?\n1\n$ true\noutput\n"
    assert docblocks.pip_extras(plain.code) == [(0, "nope")]

    def run(block: Block) -> subprocess.CompletedProcess[str]:
        script = docblocks.shell_script(block)
        return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)

    assert run(shown).returncode == 0
    out = run(wrong)
    assert out.returncode == 1 and "p.md:18: exit 3, the page shows 2" in out.stderr, out.stderr
    out = run(plain)
    assert out.returncode != 0 and "p.md:24: exit 1 from: false" in out.stderr, out.stderr
