"""Importing s3ckpt, s3ckpt.lightning and s3ckpt.accelerate changes nothing in Lightning,
accelerate, fsspec or torch (issue 39 item 8): every patch is made by a plug-in when it is
constructed, by :class:`~s3ckpt.lightning.S3ModelCheckpoint`, or by an explicit
:func:`s3ckpt.lightning.install`. Each check runs in a fresh interpreter, with s3fs
installed and with it hidden (the file system was registered at import only without it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("lightning")  # the `lightning` extra; the test extra installs it
pytest.importorskip("accelerate")

_SNAPSHOT = """
import sys
if {hide_s3fs}:
    sys.modules["s3fs"] = None
import importlib, fsspec, torch, torch.serialization
import accelerate, accelerate.checkpointing
from accelerate import Accelerator
from lightning.fabric.utilities import cloud_io
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.core import saving
from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO
from lightning.pytorch.trainer.connectors.checkpoint_connector import _CheckpointConnector

WATCHED = {{
    "fsspec registry": importlib.import_module("fsspec.registry")._registry,
    "torch": vars(torch), "torch.serialization": vars(torch.serialization),
    "accelerate": vars(accelerate), "accelerate.checkpointing": vars(accelerate.checkpointing),
    "lightning cloud_io": vars(cloud_io), "lightning saving": vars(saving),
}}
for cls in (Accelerator, LightningModule, LightningDataModule, ModelCheckpoint,
            AsyncCheckpointIO, TorchCheckpointIO, _CheckpointConnector):
    WATCHED[cls.__name__] = vars(cls)

def snapshot():
    return {{(w, name): v for w, d in WATCHED.items() for name, v in dict(d).items()}}

named = {{
    "ModelCheckpoint._find_last_checkpoints": lambda: ModelCheckpoint._find_last_checkpoints,
    "AsyncCheckpointIO.teardown": lambda: AsyncCheckpointIO.teardown,
    "LightningModule.load_from_checkpoint": lambda: vars(LightningModule)["load_from_checkpoint"],
    "saving.pl_load": lambda: saving.pl_load,
    "fsspec s3": lambda: fsspec.registry.get("s3"),
    "torch.load": lambda: torch.load,
}}
before, before_named = snapshot(), {{k: f() for k, f in named.items()}}
{action}
after, after_named = snapshot(), {{k: f() for k, f in named.items()}}
changed = sorted(str(k) for k, v in before.items() if after.get(k, object()) is not v)
changed += sorted(k for k, v in before_named.items() if after_named[k] is not v)
print("CHANGED", changed)
"""


def _changed(action: str, *, hide_s3fs: bool) -> str:
    code = _SNAPSHOT.format(hide_s3fs=hide_s3fs, action=textwrap.dedent(action))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("hide_s3fs", [False, True], ids=["s3fs", "no-s3fs"])
def test_importing_the_package_patches_nothing(hide_s3fs: bool) -> None:
    imports = "import s3ckpt, s3ckpt.lightning, s3ckpt.accelerate"
    assert _changed(imports, hide_s3fs=hide_s3fs) == "CHANGED []"


def test_install_is_explicit_and_does_what_it_says() -> None:
    # The same check can fail: install() is the opt-in that patches (and only it, here).
    line = _changed(
        "import s3ckpt.lightning\ns3ckpt.lightning.install()\ns3ckpt.lightning.install()",
        hide_s3fs=True,
    )
    for name in ("saving.pl_load", "AsyncCheckpointIO.teardown", "fsspec s3"):
        assert name in line


def test_s3_model_checkpoint_keeps_model_checkpoints_state_key(tmp_path: object) -> None:
    # A run started with a stock ModelCheckpoint resumes its best_k_models into the subclass.
    from lightning.pytorch.callbacks import ModelCheckpoint

    from s3ckpt.lightning import S3ModelCheckpoint

    kwargs = {"dirpath": str(tmp_path), "monitor": "val_loss", "save_top_k": 2}
    assert S3ModelCheckpoint(**kwargs).state_key == ModelCheckpoint(**kwargs).state_key
