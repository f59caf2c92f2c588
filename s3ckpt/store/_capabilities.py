"""What a store enforces, probed once per (endpoint, bucket) and process.

s3ckpt's commit (``PUT s3ckpt.json If-None-Match: *`` / ``If-Match: <replaced ETag>``),
the retention lease and the marker deletes of rm and prune are compare-and-swaps. A store
that accepts the conditional headers and ignores them (s3rver, old MinIO, some gateways)
turns every one of them into a blind write: two saves of one prefix both report success,
two pruners both hold the lease. :func:`probe_capabilities` asks the store once, with
requests on a key the caller already owns (the save's coordinator heartbeat, the run's
lease), so no new kind of object appears and a least-privilege role suffices:

1. the key exists (else it is created with ``If-None-Match: *``: the caller's own write);
2. ``PUT If-None-Match: *`` of its current body must answer 412;
3. ``PUT If-Match: <an ETag it cannot have>`` must answer 412;
4. (pruners only: trainers may not delete) ``DeleteObject If-Match: <wrong ETag>`` must
   answer 412 and leave the object (where the store deleted it, it is put back);
5. ``ListMultipartUploads`` on the key's folder: 501 ``NotImplemented`` means the store has
   none (liveness then comes from heartbeats and object times alone);
6. every PUT of the probe that succeeded tells whether the store echoes the CRC32C it was
   sent (S3 stores with checksums on only);
7. races (:mod:`s3ckpt.store._race`), only when asked (``race_pairs``: ``s3ckpt doctor``):
   pairs of creates, replaces and deletes sent at once on keys next to its scratch key;
   two winners mean the store's condition is a check then a write (not atomic). The
   answer is cached for the process, so a save after doctor agrees with it. A save's own
   probe does not race: a test server whose check is not atomic under load (moto) would
   refuse saves at random.

Where a store fails 2 or 3 it only rewrote the caller's own object with the body it
already held. :func:`require_conditional_writes` turns the answer into one
:class:`~s3ckpt.errors.ConditionalWritesError`, unless ``S3Config.single_writer`` opts in
(then one warning per process and endpoint).

Request cost: HEAD + (GET or 2 racing create PUTs + GET) + 2 PUTs + LIST (+ DELETE [+ PUT])
the first time per (endpoint, bucket) and process; nothing afterwards.
"""

from __future__ import annotations

import base64
import logging
import threading
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from s3ckpt import _crc
from s3ckpt.errors import (
    AccessDeniedError,
    ConditionalWritesError,
    ObjectNotFoundError,
    PreconditionFailedError,
    StoreError,
    UnsupportedOperationError,
)
from s3ckpt.metrics.instrument import expecting
from s3ckpt.store._race import RaceKind, RaceResult, race
from s3ckpt.store.base import ObjectStore, UploadInfo

__all__ = [
    "Capabilities",
    "cached_capabilities",
    "clear_capabilities_cache",
    "is_unsupported",
    "list_open_uploads",
    "lists_uploads",
    "note_no_list_uploads",
    "probe_capabilities",
    "require_conditional_writes",
    "store_endpoint",
]

log = logging.getLogger(__name__)

WRONG_ETAG = '"00000000000000000000000000000000"'
"""An ETag no object has (the MD5 of no body is all zeros): the If-Match of the probe."""

AWS_ENDPOINT = "https://s3.amazonaws.com"
"""How the cache and messages name AWS (an S3 store without an endpoint URL)."""


@dataclass(frozen=True)
class Capabilities:
    """What a store enforced when probed.

    Attributes:
        conditional_create: ``PUT If-None-Match: *`` on an existing object answers 412.
        conditional_replace: ``PUT If-Match`` with a wrong ETag answers 412.
        conditional_delete: ``DeleteObject If-Match`` with a wrong ETag answers 412 and
            leaves the object (False also where it was not probed: a trainer may not
            delete, see :attr:`delete_probed`).
        checksum_echo: A PUT's reply carries back the CRC32C it was sent; None when no PUT
            of the probe succeeded or checksums are off (unknown).
        list_uploads: ``ListMultipartUploads`` works; False when the store answers 501
            ``NotImplemented``, None when it was not allowed (unknown).
        endpoint: The endpoint probed (``https://s3.amazonaws.com`` for AWS).
        bucket: The bucket probed.
        delete_probed: Whether :attr:`conditional_delete` was probed.
        races: The races run (:mod:`s3ckpt.store._race`); a kind whose race was not
            atomic is False above.
    """

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
        runs = [r for r in self.races if r.kind == kind]
        return max(runs, key=lambda r: r.pairs) if runs else None

    @property
    def conditional_writes(self) -> bool:
        """Both conditional puts are enforced (what commits and leases need)."""
        return self.conditional_create and self.conditional_replace


_lock = threading.Lock()
_by_endpoint: dict[tuple[str, str], Capabilities] = {}
"""S3 stores: by (endpoint, bucket)."""
_by_store: weakref.WeakKeyDictionary[Any, Capabilities] = weakref.WeakKeyDictionary()
"""Other stores (memory, fsspec): by the store object, whose identity is its endpoint."""
_warned: set[tuple[str, str]] = set()


def store_endpoint(store: ObjectStore) -> str:
    """The endpoint a store talks to, as the cache and messages name it."""
    url = getattr(store, "endpoint_url", None)
    if isinstance(url, str) and url:
        return url
    scheme = getattr(store, "url_scheme", "")
    return AWS_ENDPOINT if scheme == "s3" else f"{scheme}://"


def _is_s3(store: ObjectStore) -> bool:
    return getattr(store, "url_scheme", None) == "s3"


def _cache_get(store: ObjectStore) -> Capabilities | None:
    with _lock:
        if _is_s3(store):
            return _by_endpoint.get((store_endpoint(store), store.bucket))
        try:
            return _by_store.get(store)
        except TypeError:  # not weak-referenceable
            return None


def _cache_put(store: ObjectStore, caps: Capabilities) -> None:
    with _lock:
        if _is_s3(store):
            _by_endpoint[(caps.endpoint, caps.bucket)] = caps
            return
        try:
            _by_store[store] = caps
        except TypeError:
            pass


def cached_capabilities(store: ObjectStore) -> Capabilities | None:
    """What this process already probed for ``store``'s endpoint and bucket, if anything
    (no request)."""
    return _cache_get(store)


def clear_capabilities_cache() -> None:
    """Forget every probe (tests; a store reconfigured in place)."""
    with _lock:
        _by_endpoint.clear()
        _by_store.clear()
        _warned.clear()
        _no_uploads.clear()


def note_no_list_uploads(store: ObjectStore) -> None:
    """Record that ``store`` answered ``ListMultipartUploads`` with 501 (the scan learns it
    without a probe)."""
    caps = _cache_get(store)
    if caps is not None and caps.list_uploads is not False:
        _cache_put(store, replace(caps, list_uploads=False))


_no_uploads: set[tuple[str, str]] = set()
"""(endpoint, bucket) of S3 stores, and ids of other stores, that answered
``ListMultipartUploads`` with 501 in this process."""


def _identity(store: ObjectStore) -> tuple[str, str]:
    if _is_s3(store):
        return (store_endpoint(store), store.bucket)
    return (f"{store_endpoint(store)}#{id(store)}", store.bucket)


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
    implement ``ListMultipartUploads`` (501 ``NotImplemented``, as s3rver): then one
    warning per process and store, and liveness comes from heartbeats and object times."""
    try:
        return list(store.list_multipart_uploads(prefix))
    except UnsupportedOperationError as exc:
        note_no_list_uploads(store)
        _warn_once(
            _no_uploads,
            _identity(store),
            f"s3ckpt: the store at {store_endpoint(store)} does not implement "
            f"ListMultipartUploads ({exc.code}): open multipart uploads are invisible, so "
            "saves in progress are told by their heartbeats and object times alone, and "
            "gc aborts no uploads (set a lifecycle rule that aborts incomplete uploads)",
        )
        return None


def _warn_once(seen: set[tuple[str, str]], key: tuple[str, str], msg: str) -> None:
    """Log and ``warnings.warn`` ``msg`` the first time ``key`` enters ``seen`` (once per
    process and store); record ``key`` either way."""
    with _lock:
        first = key not in seen
        seen.add(key)
    if first:
        log.warning("%s", msg)
        warnings.warn(msg, UserWarning, stacklevel=3)


def lists_uploads(store: ObjectStore) -> bool:
    """False once ``store`` answered ``ListMultipartUploads`` with 501 in this process."""
    with _lock:
        return _identity(store) not in _no_uploads


# -- the probe -------------------------------------------------------------------------------
def _put(
    store: ObjectStore,
    key: str,
    body: bytes,
    echo: list[bool],
    *,
    if_none_match: bool = False,
    if_match: str | None = None,
) -> str:
    """One PUT of the probe; on an S3 store with checksums on, its reply's CRC32C (echoed
    or not) is appended to ``echo``."""
    cfg = getattr(store, "s3_config", None)
    call: Callable[..., Any] | None = getattr(store, "_call", None)
    if not _is_s3(store) or cfg is None or call is None or cfg.checksum_algorithm != "CRC32C":
        return store.put(key, body, if_none_match=if_none_match, if_match=if_match)
    from s3ckpt.store._body import BufferBody
    from s3ckpt.store._request import checksum_args, sse_args

    crc = base64.b64encode(_crc.crc32c(body).to_bytes(4, "big")).decode("ascii")
    args: dict[str, Any] = {
        "Bucket": store.bucket,
        "Key": key,
        **sse_args(cfg, upload=True),
        **checksum_args(cfg, body, None),
    }
    if if_none_match:
        args["IfNoneMatch"] = "*"
    if if_match is not None:
        args["IfMatch"] = if_match
    client = store.client  # type: ignore[attr-defined]
    resp = call("put", key, lambda: client.put_object(Body=BufferBody(body), **args))
    echo.append(resp.get("ChecksumCRC32C") == crc)
    return str(resp.get("ETag", ""))


def _putter(store: ObjectStore, echo: list[bool]) -> Callable[..., str]:
    """:func:`_put` as the races send it."""
    return lambda key, body, **kw: _put(store, key, body, echo, **kw)


def _refused(action: Callable[[], object]) -> bool:
    """Whether ``action`` (a conditional request that must fail) answered 412."""
    try:
        with expecting("precondition_failed"):  # what the probe asks for: not a failure
            action()
    except PreconditionFailedError:
        return True
    except ObjectNotFoundError:
        return False  # If-Match on an object that is there: the store lost track of it
    return False


def _probe_delete(store: ObjectStore, key: str, body: bytes, echo: list[bool]) -> bool:
    delete_if_match = getattr(store, "delete_if_match", None)
    if delete_if_match is None:
        return False
    try:
        with expecting("precondition_failed"):  # the answer a conforming store gives
            delete_if_match(key, WRONG_ETAG)
    except PreconditionFailedError:
        return store.head(key) is not None
    except (UnsupportedOperationError, AccessDeniedError, ObjectNotFoundError):
        return False
    except StoreError as exc:  # InvalidArgument, NotImplemented under another code ...
        log.debug("s3ckpt: conditional DeleteObject probe failed: %s", exc)
        return False
    if store.head(key) is None:  # the store deleted it: put the caller's object back
        try:
            with expecting("precondition_failed"):
                _put(store, key, body, echo, if_none_match=True)
        except PreconditionFailedError:
            pass  # someone wrote it meanwhile: theirs stays
    return False


def _probe_list_uploads(store: ObjectStore, key: str) -> bool | None:
    folder = key.rpartition("/")[0]
    try:
        next(iter(store.list_multipart_uploads(folder + "/" if folder else "")), None)
    except UnsupportedOperationError:
        return False
    except AccessDeniedError:
        return None
    return True


def probe_capabilities(
    store: ObjectStore,
    key: str,
    *,
    body: bytes | None = None,
    probe_delete: bool = True,
    race_pairs: int = 0,
) -> Capabilities:
    """What ``store`` enforces, probed with requests on ``key`` (see the module docs);
    cached per (endpoint, bucket) and process.

    Args:
        store: The store.
        key: An object the caller owns and may rewrite with its own body: the save's
            coordinator heartbeat, the run's lease.
        body: What to create ``key`` with if it does not exist yet (with
            ``If-None-Match: *``); an existing object is re-sent with the body read back.
        probe_delete: Also probe conditional deletes (pruners; a trainer's role may not
            delete). A cached answer without it is completed when it is asked for.
        race_pairs: Also race this many pairs of each conditional request on the keys
            ``{key}.race-create.0`` ... (left there: for a caller that removes its scratch
            prefix, as doctor). Never answered from the cache; the answer is cached.

    Raises:
        ValueError: ``key`` does not exist and no ``body`` was given.
        StoreError: A request of the probe failed otherwise (access denied, endpoint).

    Request cost: see the module docs; none when cached.
    """
    cached = None if race_pairs else _cache_get(store)
    if cached is not None and (cached.delete_probed or not probe_delete):
        return cached
    echo: list[bool] = []
    races: list[RaceResult] = list(cached.races) if cached is not None else []
    info = store.head(key)
    if info is None:
        if body is None:
            raise ValueError(f"cannot probe {key!r}: it does not exist and no body was given")
        if race_pairs:  # doctor: the key is created by a race of its own
            created = race(store, key, "create", body=body, put=_putter(store, echo))
            if not created.none_won:  # none: created meanwhile (a retry, another process)
                races.append(created)
        else:  # a save: one create; the races are doctor's (cached: a save then agrees)
            try:
                with expecting("precondition_failed"):
                    _put(store, key, body, echo, if_none_match=True)
            except PreconditionFailedError:
                pass  # created meanwhile (a retry of ours, another process)
    if info is not None or body is None:
        try:
            body = store.get(key)
        except ObjectNotFoundError:
            if body is None:
                raise ValueError(f"cannot probe {key!r}: it vanished") from None
    current: bytes = body
    if cached is not None:
        create, replace_ = cached.conditional_create, cached.conditional_replace
        list_uploads = cached.list_uploads
    else:
        create = _refused(lambda: _put(store, key, current, echo, if_none_match=True))
        replace_ = _refused(lambda: _put(store, key, current, echo, if_match=WRONG_ETAG))
        list_uploads = _probe_list_uploads(store, key)
    delete = _probe_delete(store, key, current, echo) if probe_delete else False
    for kind, alone in (("create", create), ("replace", replace_), ("delete", delete)):
        if race_pairs and alone:  # a condition ignored alone needs no race to fail
            at = f"{key}.race-{kind}"
            races.append(race(store, at, kind, pairs=race_pairs, put=_putter(store, echo)))  # type: ignore[arg-type]
    atomic = {k: all(r.atomic for r in races if r.kind == k) for k in ("create", "replace")}
    atomic["delete"] = all(r.atomic for r in races if r.kind == "delete")
    enforces = getattr(store, "enforces", None)  # a store that knows its checks are not
    if isinstance(enforces, frozenset):  # atomic (FsspecStore) says so: a 412 seen is no proof
        create, replace_ = create and "create" in enforces, replace_ and "replace" in enforces
        delete = delete and "delete" in enforces
    if cached is not None and cached.checksum_echo is not None:
        checksum_echo: bool | None = cached.checksum_echo
    else:
        checksum_echo = all(echo) if echo else None
    caps = Capabilities(
        conditional_create=create and atomic["create"],
        conditional_replace=replace_ and atomic["replace"],
        conditional_delete=delete and atomic["delete"],
        checksum_echo=checksum_echo,
        list_uploads=list_uploads,
        endpoint=store_endpoint(store),
        bucket=store.bucket,
        delete_probed=probe_delete,
        races=tuple(races),
    )
    _cache_put(store, caps)
    log.debug("s3ckpt: probed %s bucket %s: %s", caps.endpoint, caps.bucket, caps)
    return caps


def _single_writer(store: ObjectStore) -> bool:
    cfg = getattr(store, "s3_config", None)
    return bool(getattr(cfg, "single_writer", False))


def require_conditional_writes(
    store: ObjectStore,
    key: str,
    *,
    what: str,
    body: bytes | None = None,
    single_writer: bool | None = None,
    probe_delete: bool = False,
) -> Capabilities:
    """Probe (once) and refuse ``what`` on a store that ignores conditional writes.

    Args:
        store: The store.
        key: The caller's own object to probe with (see :func:`probe_capabilities`).
        what: What is refused, for the message (``"a save to s3://b/run/step_1"``).
        body: See :func:`probe_capabilities`.
        single_writer: Opt in to going on with a warning (once per process and endpoint);
            None reads ``S3Config.single_writer`` from the store.
        probe_delete: See :func:`probe_capabilities`.

    Raises:
        ConditionalWritesError: The store ignores ``If-None-Match`` or ``If-Match`` and
            single-writer mode is off.
    """
    caps = probe_capabilities(store, key, body=body, probe_delete=probe_delete)
    if caps.conditional_writes:
        return caps
    ignored = " and ".join(
        name
        for name, ok in (
            ("If-None-Match", caps.conditional_create),
            ("If-Match", caps.conditional_replace),
        )
        if not ok
    )
    if single_writer is None:
        single_writer = _single_writer(store)
    if single_writer:
        _warn_once(
            _warned,
            (caps.endpoint, caps.bucket),
            f"s3ckpt: the store at {caps.endpoint} (bucket {caps.bucket}) ignores "
            f"conditional writes ({ignored}); single-writer mode is on, so commits, "
            "overwrites and leases are not protected: make sure only one process at a "
            "time saves to or prunes a prefix",
        )
        return caps
    raise ConditionalWritesError(
        f"refusing {what}: the store at {caps.endpoint} ignores conditional writes "
        f"({ignored} were accepted where they must answer 412), which s3ckpt's commits, "
        "overwrites and retention leases rely on. Use a store that supports conditional "
        "writes (AWS S3, recent MinIO, Ceph RGW ...), or opt in to single-writer mode "
        "(S3Config(single_writer=True), --single-writer) if only one process at a time "
        "writes to or prunes this prefix",
        bucket=store.bucket or None,
        key=key,
        endpoint=caps.endpoint,
        what=what,
    )
