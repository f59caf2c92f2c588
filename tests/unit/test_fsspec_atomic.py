"""Issue 38 item 1: FsspecStore's conditional writes are atomic or refused.

Races are forced with ``_fsspec_commit.RACE_PAUSE`` (a sleep between a check and the write
it allows): ``file://`` with separate processes (spawn) meeting at a barrier, ``memory://``
with threads. Each round has at most one winner, always; a backend without an atomic
primitive lets several win, and is therefore reported as ignoring conditional writes and
refused unless single-writer mode is chosen."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
import torch
from fsspec.implementations.memory import MemoryFileSystem

from s3ckpt.config import S3Config
from s3ckpt.errors import ConditionalWritesError, PreconditionFailedError, find_s3ckpt_error
from s3ckpt.format._names import MANIFEST_NAME
from s3ckpt.store import _fsspec_commit
from s3ckpt.store._capabilities import (
    clear_capabilities_cache,
    probe_capabilities,
    require_conditional_writes,
)
from s3ckpt.store.fsspec_store import FsspecStore
from tests.unit._fsspec_racer import attempt, one_winner, prepare, race_processes, rounds
from tests.unit._memory_dcp import save

N = 4
PAUSE = 0.2


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    clear_capabilities_cache()
    yield
    clear_capabilities_cache()


@pytest.mark.multiprocess
def test_file_races_between_processes_have_one_winner(tmp_path: Path) -> None:
    root = str(tmp_path).lstrip("/") + "/run"
    store = FsspecStore("file", "")
    assert store.enforces == _fsspec_commit.CONDITIONS
    results = race_processes(store, root, N, PAUSE)
    one_winner(store, root, N, results)
    assert not list(tmp_path.rglob("*.s3ckpt-partial")), "no temp file is left behind"


def _thread_race(store: FsspecStore, base: str, etags: dict[str, str]) -> dict[int, list[str]]:
    barrier = threading.Barrier(N)
    results: dict[int, list[str]] = {}

    def racer(i: int) -> None:
        got = []
        for op, key in rounds(i, base):
            barrier.wait(timeout=60)
            got.append(attempt(store, op, key, b"racer %d" % i, etags.get(key, "")))
        results[i] = got

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(N)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


def test_memory_races_between_threads_have_one_winner(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_fsspec_commit, "RACE_PAUSE", PAUSE)
    store = FsspecStore("memory", "race-bucket")
    assert store.enforces == _fsspec_commit.CONDITIONS
    base = "run-mem"
    results = _thread_race(store, base, prepare(store, base))
    one_winner(store, base, N, results)
    store.fs.rm("race-bucket", recursive=True)


class PlainMemory(MemoryFileSystem):
    """An fsspec backend s3ckpt knows no atomic primitive of (it is not fsspec's own)."""

    protocol = ("plainmem",)
    store: dict[str, Any] = {}  # noqa: RUF012  (fsspec's class-level state)
    pseudo_dirs = [""]  # noqa: RUF012


fsspec.register_implementation("plainmem", PlainMemory, clobber=True)


def test_a_backend_without_an_atomic_primitive_lets_several_win(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Why it is refused: its check-then-write is no compare-and-swap."""
    monkeypatch.setattr(_fsspec_commit, "RACE_PAUSE", PAUSE)
    store = FsspecStore("plainmem", "b")
    assert store.enforces == frozenset()
    base = "run-plain"
    results = _thread_race(store, base, prepare(store, base))
    assert [r[0] for r in results.values()].count("won") > 1


def test_a_backend_without_an_atomic_primitive_is_reported_and_refused() -> None:
    store = FsspecStore("plainmem", "b")
    caps = probe_capabilities(store, "run/hb", body=b"x", probe_delete=True)
    assert not caps.conditional_create and not caps.conditional_replace
    assert not caps.conditional_delete
    with pytest.raises(ConditionalWritesError, match="If-None-Match and If-Match") as err:
        require_conditional_writes(store, "run/hb", what="a test")
    assert "single-writer" in str(err.value) and err.value.endpoint == "plainmem://"
    with pytest.raises(BaseException) as saved:  # DCP wraps what a storage layer raises
        save(store, {"t": torch.ones(4)}, url="plainmem://b/run/step_1")  # type: ignore[arg-type]
    assert isinstance(find_s3ckpt_error(saved.value), ConditionalWritesError)
    assert not any(MANIFEST_NAME in k for k in store.fs.find("b"))


def test_single_writer_mode_saves_on_such_a_backend_with_the_warning() -> None:
    store = FsspecStore("plainmem", "sw")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        save(  # type: ignore[arg-type]
            store,
            {"t": torch.ones(4)},
            url="plainmem://sw/run/step_1",
            s3_config=S3Config(single_writer=True),
        )
    assert any("single-writer mode is on" in str(w.message) for w in caught)
    assert store.head(f"run/step_1/{MANIFEST_NAME}") is not None


@pytest.mark.parametrize("scheme", ["file", "memory"])
def test_atomic_backends_pass_the_probe(scheme: str, tmp_path: Path) -> None:
    store = FsspecStore(scheme, "" if scheme == "file" else "probe")
    key = (str(tmp_path).lstrip("/") + "/hb") if scheme == "file" else "run/hb"
    caps = probe_capabilities(store, key, body=b"x", probe_delete=True)
    assert caps.conditional_writes and caps.conditional_delete
    assert store.get(key) == b"x"


def test_a_conditional_complete_is_atomic_on_a_local_folder(tmp_path: Path) -> None:
    store = FsspecStore("file", "")
    key = str(tmp_path).lstrip("/") + "/big"
    first, second = store.create_multipart(key), store.create_multipart(key)
    parts: dict[str, Callable[[], Any]] = {}
    for uid, body in ((first, b"one"), (second, b"two")):
        parts[uid] = lambda uid=uid, body=body: [store.upload_part(key, uid, 1, body)]
    store.complete_multipart(key, first, parts[first](), if_none_match=True)
    with pytest.raises(PreconditionFailedError):
        store.complete_multipart(key, second, parts[second](), if_none_match=True)
    assert store.get(key) == b"one"
    assert [p.name for p in tmp_path.iterdir()] == ["big"]
