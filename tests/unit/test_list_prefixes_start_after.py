"""``list_prefixes(start_after=...)`` on the in-memory and fsspec stores (S3: integration)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from s3ckpt.store.base import ObjectStore
from s3ckpt.store.fsspec_store import FsspecStore
from s3ckpt.store.memory import MemoryStore

KEYS = ("run/step-001/a", "run/step-002/a", "run/step-002/b", "run/step-010/a", "run/x")
ALL = ["run/step-001/", "run/step-002/", "run/step-010/"]


def _stores(tmp_path: Path) -> list[ObjectStore]:
    return [
        MemoryStore(),
        FsspecStore("memory", f"b-{uuid.uuid4().hex[:8]}"),
        FsspecStore("file", str(tmp_path)),
    ]


@pytest.mark.parametrize("which", [0, 1, 2], ids=["memory", "fsspec-memory", "fsspec-file"])
def test_start_after(tmp_path: Path, which: int) -> None:
    store = _stores(tmp_path)[which]
    for key in KEYS:
        store.put(key, b"")
    assert list(store.list_prefixes("run/")) == ALL
    assert list(store.list_prefixes("run/", start_after=None)) == ALL
    assert list(store.list_prefixes("run/", start_after="run/step-001/")) == ALL[1:]
    assert list(store.list_prefixes("run/", start_after="run/step-002/a")) == ALL[2:]
    assert list(store.list_prefixes("run/", start_after="run/step-0")) == ALL
    assert list(store.list_prefixes("run/", start_after="run/z")) == []
