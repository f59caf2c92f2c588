"""Races of conditional requests: does a store let exactly one of two writers win?

A store can answer 412 to a conditional request sent alone and still let two concurrent
ones both succeed, when its condition is a check followed by a write (a gateway, an
fsspec backend without an atomic primitive). :func:`race` sends pairs of conditional
requests on one key at the same instant, from two threads (on an S3 store each request
of a pair is on its own connection of the client's pool), and counts the winners. Each
pair then reads the key back: the winner's bytes must be what the key holds. Kinds:

``create``
    two ``PUT If-None-Match: *`` of an absent key, each with its own bytes.
``replace``
    two ``PUT If-Match: <ETag>`` of the key's current version, each with its own bytes.
``delete``
    ``DeleteObject If-Match: <ETag>`` against ``PUT If-Match: <the same ETag>``: rm racing
    an overwrite. Exactly one may win: the key is then gone, or holds the overwrite.

A pair is sound when exactly one request won (the loser answered 412, or 404 for a
request on a key the winner deleted) and the key reads back as the winner left it.
:mod:`s3ckpt.store._capabilities` races every save's first probe (one ``create`` pair,
the creation of the caller's own heartbeat) and, for ``s3ckpt doctor``, a few pairs of
each kind on keys of its scratch prefix.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Literal

from s3ckpt.errors import ObjectNotFoundError, PreconditionFailedError
from s3ckpt.metrics.instrument import expecting, in_context
from s3ckpt.store.base import ObjectStore

__all__ = ["RaceKind", "RaceResult", "race"]

RaceKind = Literal["create", "replace", "delete"]

_REQUESTS = {
    "create": "two conditional creates (PUT If-None-Match: *)",
    "replace": "two conditional replaces (PUT If-Match)",
    "delete": "a conditional delete against an overwrite (DELETE If-Match vs PUT If-Match)",
}


@dataclass(frozen=True)
class RaceResult:
    """How :func:`race` came out.

    Attributes:
        kind: ``create``, ``replace`` or ``delete``.
        pairs: How many pairs raced.
        both_won: Pairs in which both requests succeeded.
        none_won: Pairs in which neither did.
        wrong_bytes: Pairs with one winner after which the key did not read back as the
            winner left it.
    """

    kind: RaceKind
    pairs: int
    both_won: int = 0
    none_won: int = 0
    wrong_bytes: int = 0

    @property
    def atomic(self) -> bool:
        """Exactly one request won every pair, and the key held its result."""
        return not (self.both_won or self.none_won or self.wrong_bytes)

    def describe(self) -> str:
        """One line: what was raced and what was seen."""
        what = f"{self.pairs} race{'s' if self.pairs != 1 else ''} of {_REQUESTS[self.kind]}"
        if self.atomic:
            return f"{what}: exactly one won each time"
        seen = []
        if self.both_won:
            seen.append(f"{self.both_won} of {self.pairs} had two winners")
        if self.none_won:
            seen.append(f"{self.none_won} of {self.pairs} had none")
        if self.wrong_bytes:
            seen.append(f"{self.wrong_bytes} of {self.pairs} left other bytes than the winner's")
        return f"{what}: {', '.join(seen)}"


def _won(request: Callable[[], object]) -> bool | BaseException:
    """Run one request of a pair: True (won), False (412, or 404: the other won first),
    or the error it raised otherwise."""
    try:
        with expecting("precondition_failed", "not_found"):  # the loser's answers
            request()
    except (PreconditionFailedError, ObjectNotFoundError):
        return False
    except Exception as exc:  # reported by the caller after the pair
        return exc
    return True


def race(
    store: ObjectStore,
    key: str,
    kind: RaceKind,
    *,
    pairs: int = 1,
    body: bytes | None = None,
    put: Callable[..., str] | None = None,
    tag: str = "s3ckpt race",
) -> RaceResult:
    """Race ``pairs`` pairs of ``kind`` on the keys ``key.0``, ``key.1`` ... (``create``:
    absent keys; the others create each one first). What the pairs leave stays there.

    Args:
        body: (``create``, one pair) Race two creates of ``key`` itself, both with these
            bytes: how a caller creates its own object and learns the answer on the way.
        put: Sends the PUTs (``store.put``'s signature; default ``store.put``).

    Request cost per pair: 2 conditional requests and a GET (a HEAD after a delete); and a
    PUT first for ``replace`` and ``delete``.

    Raises:
        StoreError: A request failed otherwise than by losing (access denied, not
            implemented, a transient error through every retry): the first such error.
    """
    put = put or store.put
    both = none = wrong = 0
    start = threading.Barrier(2)

    def at_once(request: Callable[[], object]) -> bool | BaseException:
        start.wait(timeout=60)
        return _won(request)

    with ThreadPoolExecutor(2, thread_name_prefix="s3ckpt-race") as pool:
        for i in range(pairs):
            k = f"{key}.{i}" if body is None else key
            mine = [body, body] if body is not None else [_bytes(tag, kind, i, s) for s in "ab"]
            requests = _requests(store, put, kind, k, mine, _bytes(tag, kind, i, "first"))
            outcome = list(pool.map(in_context(at_once), requests))
            for got in outcome:
                if isinstance(got, BaseException):
                    raise got
            winners = [n for n, won in enumerate(outcome) if won]
            if len(winners) == 2:
                both += 1
            elif not winners:
                none += 1
            elif _read(store, k) != mine[winners[0]]:
                wrong += 1
    return RaceResult(kind, pairs, both, none, wrong)


def _bytes(tag: str, kind: str, i: int, side: str) -> bytes:
    return f"{tag} {kind} {i} {side}\n".encode()


def _requests(
    store: ObjectStore,
    put: Callable[..., str],
    kind: RaceKind,
    key: str,
    mine: list[bytes],
    first: bytes,
) -> list[Callable[[], object]]:
    """The pair's two requests (after creating ``key`` with ``first`` where the kind needs
    it); ``mine[n]`` becomes what request ``n`` leaves when it wins."""
    if kind == "create":
        return [partial(put, key, b, if_none_match=True) for b in mine]
    etag = put(key, first) or _etag(store, key)
    if kind == "replace":
        return [partial(put, key, b, if_match=etag) for b in mine]
    mine[0] = b""  # the deleter's result: the key is gone
    return [partial(store.delete_if_match, key, etag), partial(put, key, mine[1], if_match=etag)]


def _etag(store: ObjectStore, key: str) -> str:
    info = store.head(key)
    if info is None or not info.etag:
        raise ObjectNotFoundError(
            "the race's key vanished or has no ETag", bucket=store.bucket, key=key
        )
    return info.etag


def _read(store: ObjectStore, key: str) -> bytes:
    """The key's bytes; ``b""`` when it is gone."""
    try:
        with expecting("not_found"):
            return store.get(key)
    except ObjectNotFoundError:
        return b""
