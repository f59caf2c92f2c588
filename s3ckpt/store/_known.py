"""What this process knows of each store: the capabilities probed
(:mod:`s3ckpt.store._capabilities`, cached per (endpoint, bucket) and process), which
stores answered ``ListMultipartUploads`` with 501, and the warnings already given."""

from __future__ import annotations

import contextlib
import logging
import threading
import warnings
import weakref
from dataclasses import dataclass, replace
from typing import Any, Literal

from s3ckpt.errors import StoreError, UnsupportedOperationError
from s3ckpt.store.base import ObjectStore, UploadInfo

__all__ = [
    "Capabilities",
    "RaceKind",
    "RaceResult",
    "cached_capabilities",
    "clear_capabilities_cache",
    "is_unsupported",
    "list_open_uploads",
    "lists_uploads",
    "store_endpoint",
]

log = logging.getLogger(__name__)

#: How the cache and messages name AWS (an S3 store without an endpoint URL).
AWS_ENDPOINT = "https://s3.amazonaws.com"

RaceKind = Literal["create", "replace", "delete"]

RACED = {
    "create": "two conditional creates (PUT If-None-Match: *)",
    "replace": "two conditional replaces (PUT If-Match)",
    "delete": "a conditional delete against an overwrite (DELETE If-Match vs PUT If-Match)",
}

_SEEN = ("had two winners", "had none", "left other bytes than the winner's")


@dataclass(frozen=True)
class RaceResult:
    """How :func:`race` came out: pairs raced, and those two or no requests won, or whose
    winner's bytes the key did not hold."""

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
        what = f"{self.pairs} race{'s' if self.pairs != 1 else ''} of {RACED[self.kind]}"
        if self.atomic:
            return f"{what}: exactly one won each time"
        counts = (self.both_won, self.none_won, self.wrong_bytes)
        seen = [f"{n} of {self.pairs} {text}" for n, text in zip(counts, _SEEN, strict=True) if n]
        return f"{what}: {', '.join(seen)}"


@dataclass(frozen=True)
class Capabilities:
    """What a store enforced when probed: each conditional request answered 412 alone and
    won exactly once in every race run (``conditional_delete`` False also where not
    probed, :attr:`delete_probed`); ``checksum_echo`` (None: unknown); ``list_uploads``
    (False: 501, None: denied); the ``endpoint`` and ``bucket`` probed; the ``races``."""

    conditional_create: bool
    conditional_replace: bool
    conditional_delete: bool
    checksum_echo: bool | None
    list_uploads: bool | None
    endpoint: str
    bucket: str
    delete_probed: bool = True
    races: tuple[RaceResult, ...] = ()

    def race(self, kind: RaceKind) -> RaceResult | None:
        """The race of ``kind`` that was run, if any (the largest)."""
        return max((r for r in self.races if r.kind == kind), key=lambda r: r.pairs, default=None)

    @property
    def conditional_writes(self) -> bool:
        """Both conditional puts are enforced (what commits and leases need)."""
        return self.conditional_create and self.conditional_replace


_lock = threading.Lock()
_by_endpoint: dict[tuple[str, str], Capabilities] = {}  # S3 stores: by (endpoint, bucket)
_by_store: weakref.WeakKeyDictionary[Any, Capabilities] = weakref.WeakKeyDictionary()
warned: set[tuple[str, str]] = set()
no_uploads: set[tuple[str, str]] = set()  # stores that answered ListMultipartUploads 501


def store_endpoint(store: ObjectStore) -> str:
    """The endpoint a store talks to, as the cache and messages name it."""
    url = getattr(store, "endpoint_url", None)
    if isinstance(url, str) and url:
        return url
    scheme = getattr(store, "url_scheme", "")
    return AWS_ENDPOINT if scheme == "s3" else f"{scheme}://"


def is_s3(store: ObjectStore) -> bool:
    return getattr(store, "url_scheme", None) == "s3"


def identity(store: ObjectStore) -> tuple[str, str]:
    where = store_endpoint(store) if is_s3(store) else f"{store_endpoint(store)}#{id(store)}"
    return (where, store.bucket)


def _slot(store: ObjectStore) -> tuple[Any, Any]:
    """The cache that holds ``store``'s probe and its key there."""
    return (_by_endpoint, identity(store)) if is_s3(store) else (_by_store, store)


def cached_capabilities(store: ObjectStore) -> Capabilities | None:
    """What this process already probed for ``store``'s endpoint and bucket (no request)."""
    cache, key = _slot(store)
    with _lock, contextlib.suppress(TypeError):  # not weak-referenceable
        return cache.get(key)
    return None


def cache_put(store: ObjectStore, caps: Capabilities) -> None:
    cache, key = _slot(store)
    with _lock, contextlib.suppress(TypeError):
        cache[key] = caps


def clear_capabilities_cache() -> None:
    """Forget every probe (tests; a store reconfigured in place)."""
    with _lock:
        for cache in (_by_endpoint, _by_store, warned, no_uploads):
            cache.clear()


def warn_once(seen: set[tuple[str, str]], key: tuple[str, str], msg: str) -> None:
    with _lock:
        first = key not in seen
        seen.add(key)
    if first:
        log.warning("%s", msg)
        warnings.warn(msg, UserWarning, stacklevel=3)


_UNSUPPORTED_CODES = frozenset({"NotImplemented", "501", "MethodNotAllowed", "405"})


def is_unsupported(exc: BaseException) -> bool:
    """Whether ``exc`` says the store does not implement the request (501 ``NotImplemented``,
    405 ``MethodNotAllowed``, as s3rver answers AbortMultipartUpload), not that the caller
    may not send it (403)."""
    return isinstance(exc, UnsupportedOperationError) or (
        isinstance(exc, StoreError) and exc.code in _UNSUPPORTED_CODES
    )


def list_open_uploads(store: ObjectStore, prefix: str) -> list[UploadInfo] | None:
    """The open multipart uploads under ``prefix``, or None where the store does not
    implement ``ListMultipartUploads`` (501, as s3rver): then one warning per process and
    store, and liveness comes from heartbeats and object times."""
    try:
        return list(store.list_multipart_uploads(prefix))
    except UnsupportedOperationError as exc:
        caps = cached_capabilities(store)
        if caps is not None and caps.list_uploads is not False:
            cache_put(store, replace(caps, list_uploads=False))
        warn_once(
            no_uploads,
            identity(store),
            f"s3ckpt: the store at {store_endpoint(store)} does not implement "
            f"ListMultipartUploads ({exc.code}): open multipart uploads are invisible, so "
            "saves in progress are told by their heartbeats and object times alone, and "
            "gc aborts no uploads (set a lifecycle rule that aborts incomplete uploads)",
        )
        return None


def lists_uploads(store: ObjectStore) -> bool:
    """False once ``store`` answered ``ListMultipartUploads`` with 501 in this process."""
    return identity(store) not in no_uploads
