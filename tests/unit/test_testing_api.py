"""s3ckpt.testing without a server: its public names, what importing it costs, and the
assertion helpers on a MemoryStore (``store=``)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import s3ckpt.testing
from s3ckpt import Checkpointer
from s3ckpt.store import MemoryStore
from s3ckpt.testing import assert_clean, assert_committed, committed_steps


def test_every_public_name_resolves_and_is_listed() -> None:
    names = set(s3ckpt.testing.__all__)
    assert names == set(s3ckpt.testing._HOME) and names <= set(dir(s3ckpt.testing))
    for name in names:
        assert getattr(s3ckpt.testing, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        s3ckpt.testing.nothing  # noqa: B018


def test_importing_the_package_imports_neither_moto_nor_torch() -> None:
    code = (
        "import sys, s3ckpt.testing; print(sorted({'moto', 'torch', 'boto3'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_assertions_on_a_memory_store() -> None:
    store = MemoryStore()
    url = "s3://bucket/run"
    with Checkpointer(url, store=store) as ckpt:
        ckpt.save(3, torch.nn.Linear(4, 4))
    assert committed_steps(url, store=store) == [3]
    assert assert_committed(url, step=3, store=store).step == 3
    assert [c.step for c in assert_clean(url, store=store)] == [3]
    with pytest.raises(AssertionError, match=r"no committed checkpoint of step 4 .*steps: \[3\]"):
        assert_committed(url, step=4, store=store)
