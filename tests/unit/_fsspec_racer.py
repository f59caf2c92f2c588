"""The racer of tests/unit/test_fsspec_atomic.py, run in spawned processes: a module that
imports only s3ckpt's store (no torch), so each process starts in about a second."""

from __future__ import annotations

from typing import Any

from s3ckpt.errors import ObjectNotFoundError, PreconditionFailedError
from s3ckpt.store import _fsspec_commit
from s3ckpt.store.fsspec_store import FsspecStore


def attempt(store: FsspecStore, op: str, key: str, body: bytes, etag: str) -> str:
    """One conditional request: ``won``, or ``lost`` (412, or 404 where the winner
    deleted the object)."""
    try:
        if op == "create":
            store.put(key, body, if_none_match=True)
        elif op == "replace":
            store.put(key, body, if_match=etag)
        else:
            store.delete_if_match(key, etag)
    except (PreconditionFailedError, ObjectNotFoundError):
        return "lost"
    return "won"


def rounds(i: int, base: str) -> list[tuple[str, str]]:
    """(operation, key) of racer ``i`` in each round: all create; all replace; half
    replace and half delete the same object."""
    mixed = "delete" if i % 2 else "replace"
    return [("create", f"{base}/create"), ("replace", f"{base}/replace"), (mixed, f"{base}/mix")]


def racer(
    where: tuple[str, str, dict[str, Any]],
    root: str,
    i: int,
    etags: dict[str, str],
    pause: float,
    barrier: Any,
    out: Any,
) -> None:
    """A process racing the others on the keys under ``root`` of the store ``where``
    (scheme, bucket, storage options), round by round."""
    _fsspec_commit.RACE_PAUSE = pause
    store = FsspecStore(where[0], where[1], **where[2])
    got = []
    try:
        for op, key in rounds(i, root):
            barrier.wait(timeout=60)
            got.append(attempt(store, op, key, b"racer %d" % i, etags.get(key, "")))
    except BaseException as exc:  # reported, so the parent never waits out its timeout
        got.append(repr(exc))
    out.put((i, got))


def race_processes(store: FsspecStore, root: str, n: int, pause: float) -> dict[int, list[str]]:
    """Prepare the keys under ``root``, then race ``n`` spawned processes on them; each
    racer's outcomes, round by round."""
    import multiprocessing as mp

    etags = prepare(store, root)
    where = (store.url_scheme, store.bucket, store._options)
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(n), ctx.Queue()
    procs = [
        ctx.Process(target=racer, args=(where, root, i, etags, pause, barrier, out))
        for i in range(n)
    ]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=90) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


def prepare(store: FsspecStore, base: str) -> dict[str, str]:
    """The objects the replace and mixed rounds race on: their ETags by key."""
    keys = (f"{base}/replace", f"{base}/mix")
    return {key: store.put(key, b"base", if_none_match=True) for key in keys}


def one_winner(store: FsspecStore, base: str, n: int, results: dict[int, list[str]]) -> None:
    """Each round had exactly one winner, and the store holds what it wrote."""
    for r, (_, key) in enumerate(rounds(0, base)):
        winners = [i for i in range(n) if results[i][r] == "won"]
        assert len(winners) == 1, f"round {key}: winners {winners} ({results})"
        if rounds(winners[0], base)[r][0] == "delete":
            assert store.head(key) is None
        else:
            assert store.get(key) == b"racer %d" % winners[0]
