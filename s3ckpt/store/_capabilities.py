"""What a store enforces, probed once per (endpoint, bucket) and process: the one
capability-probe module (``s3ckpt doctor`` renders its answers as rows).

s3ckpt's commits, leases and marker deletes are compare-and-swaps; a store that accepts
the conditional headers and ignores them (s3rver, old MinIO, some gateways) turns each into
a blind write. :func:`probe_capabilities` asks once, on a key the caller owns (the save's
coordinator heartbeat, the run's lease): the key exists (else it is created with
``If-None-Match: *``); ``PUT If-None-Match: *`` and ``PUT If-Match: <wrong ETag>`` of its
body must answer 412; (pruners only) ``DeleteObject If-Match: <wrong ETag>`` must answer
412 and leave it (a deleted one is put back); ``ListMultipartUploads`` answers 501 or not;
every PUT tells whether the store echoes the CRC32C it was sent. Races (:func:`race`),
only for ``s3ckpt doctor`` (``race_pairs``), send pairs of conditional requests at once:
two winners mean a check then a write. The answer is cached for the process, so a save
after doctor agrees with it; a save's own probe does not race (a test server not atomic
under load, moto, would refuse saves at random). :func:`require_conditional_writes` turns
it into a :class:`~s3ckpt.errors.ConditionalWritesError` unless single-writer mode is on.
Doctor's other probes are here too: :func:`checksum_verified`, :func:`other_process_upload`
and :func:`listing_mistakes`.

Request cost: HEAD + (GET or 2 racing create PUTs + GET) + 2 PUTs + LIST (+ DELETE [+ PUT])
the first time per (endpoint, bucket) and process; nothing afterwards.
"""

from __future__ import annotations

import base64
import copy
import logging
import os
import pickle
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
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
from s3ckpt.metrics.instrument import expecting, in_context
from s3ckpt.store._known import (
    RACED,
    Capabilities,
    RaceKind,
    RaceResult,
    cache_put,
    cached_capabilities,
    clear_capabilities_cache,
    store_endpoint,
    warn_once,
    warned,
)
from s3ckpt.store.base import ObjectStore, if_found
from s3ckpt.store.retry import cleanup

__all__ = [
    "cached_capabilities",
    "checksum_verified",
    "clear_capabilities_cache",
    "listing_mistakes",
    "other_process_upload",
    "probe_capabilities",
    "race",
    "require_conditional_writes",
]

log = logging.getLogger(__name__)

#: An ETag no object has (the MD5 of no body is all zeros): the If-Match of the probe.
WRONG_ETAG = '"00000000000000000000000000000000"'


# -- the probe -------------------------------------------------------------------------------
def _put(store: ObjectStore, key: str, body: bytes, echo: list[bool], **cond: Any) -> str:
    """One PUT of the probe (``cond``: ``if_none_match`` / ``if_match``); on an S3 store
    with checksums on, whether its reply echoed the CRC32C is appended to ``echo``."""
    put_echoed = getattr(store, "put_echoed", None)
    if put_echoed is None:
        return store.put(key, body, **cond)
    etag, echoed = put_echoed(key, body, **cond)
    if echoed is not None:
        echo.append(echoed)
    return str(etag)


def _lost(request: Callable[[], object], *also: type[Exception]) -> bool | BaseException:
    """A conditional request that may lose: False (412, or ``also``), True, or the error."""
    lost: tuple[type[Exception], ...] = (PreconditionFailedError, *also)
    try:
        with expecting("precondition_failed", "not_found"):
            request()
    except lost:
        return False
    except Exception as exc:
        return exc
    return True


def _refused(action: Callable[[], object]) -> bool:
    """Whether ``action`` (a conditional request that must fail) answered 412 (a 404 to an
    If-Match on an object that is there: the store lost track of it, not refused)."""
    lost = _lost(action)
    if isinstance(lost, BaseException) and not isinstance(lost, ObjectNotFoundError):
        raise lost
    return lost is False


def _probe_delete(store: ObjectStore, key: str, put: Callable[..., str], body: bytes) -> bool:
    """``DeleteObject If-Match: <wrong ETag>`` answered 412 and left ``key``; a store that
    deleted it gets it back. Not implemented, denied, InvalidArgument ...: not enforced."""
    lost = _lost(partial(store.delete_if_match, key, WRONG_ETAG))
    if isinstance(lost, BaseException) and not isinstance(lost, StoreError):
        raise lost
    if lost is False:
        return store.head(key) is not None
    if lost is True and store.head(key) is None:
        _lost(partial(put, key, body, if_none_match=True))
    return False


def _probe_list_uploads(store: ObjectStore, key: str) -> bool | None:
    try:  # the uploads in the key's folder
        next(iter(store.list_multipart_uploads(key[: key.rfind("/") + 1])), None)
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
    beside: bool = False,
) -> Capabilities:
    """What ``store`` enforces, probed on ``key``, an object the caller owns (see the
    module docs); cached per (endpoint, bucket) and process. ``body`` creates a missing
    ``key``; ``probe_delete`` adds the conditional delete (pruners: a trainer may not
    delete; a cached answer without it is probed again whole); ``race_pairs`` races that
    many pairs of each kind on ``{key}.race-KIND.N``
    (left there for the caller to remove; never answered from the cache). ``beside``: the
    caller does not own ``key`` (a lease another process may hold, which a store ignoring
    ``If-Match`` would let the probe overwrite or delete): probe a new
    ``{key}.probe-<id>`` made from ``body`` instead, removed after.

    Raises:
        ValueError: ``key`` does not exist and no ``body`` was given.
        StoreError: A request of the probe failed otherwise (access denied, endpoint).
    """
    cached = None if race_pairs else cached_capabilities(store)
    if cached is not None and (cached.delete_probed or not probe_delete):
        return cached
    if beside:
        own = f"{key}.probe-{uuid.uuid4().hex[:12]}"
        try:
            return probe_capabilities(
                store, own, body=body, probe_delete=probe_delete, race_pairs=race_pairs
            )
        finally:
            try:
                with cleanup():  # a short budget: a silent store is not waited for again
                    store.delete([own])
            except StoreError as exc:  # a leftover probe object is harmless
                log.debug("s3ckpt: could not remove the probe object %s: %s", own, exc)
    echo: list[bool] = []
    put = partial(_put, store, echo=echo)
    races: list[RaceResult] = []
    info = store.head(key)
    if info is None:
        if body is None:
            raise ValueError(f"cannot probe {key!r}: it does not exist and no body was given")
        if race_pairs:  # doctor: the key is created by a race of its own
            created = race(store, key, "create", body=body, put=put)
            if not created.none_won:  # none: created meanwhile (a retry, another process)
                races.append(created)
        else:  # a save: one create (created meanwhile: a retry of ours, another process)
            _lost(partial(put, key, body, if_none_match=True))
    if info is not None or body is None:
        try:
            body = store.get(key)
        except ObjectNotFoundError:
            if body is None:
                raise ValueError(f"cannot probe {key!r}: it vanished") from None
    current: bytes = body
    create = _refused(lambda: put(key, current, if_none_match=True))
    replace_ = _refused(lambda: put(key, current, if_match=WRONG_ETAG))
    list_uploads = _probe_list_uploads(store, key)
    delete = _probe_delete(store, key, put, current) if probe_delete else False
    for kind, alone in (("create", create), ("replace", replace_), ("delete", delete)):
        if race_pairs and alone:  # a condition ignored alone needs no race to fail
            races.append(race(store, f"{key}.race-{kind}", kind, pairs=race_pairs, put=put))  # type: ignore[arg-type]
    # A store that knows its checks are not atomic (FsspecStore) says which are: a 412 seen
    # is no proof for the others.
    enforces = getattr(store, "enforces", None)
    held = enforces if isinstance(enforces, frozenset) else RACED
    atomic = {k: k in held and all(r.atomic for r in races if r.kind == k) for k in RACED}
    caps = Capabilities(
        conditional_create=create and atomic["create"],
        conditional_replace=replace_ and atomic["replace"],
        conditional_delete=delete and atomic["delete"],
        checksum_echo=all(echo) if echo else None,
        list_uploads=list_uploads,
        endpoint=store_endpoint(store),
        bucket=store.bucket,
        delete_probed=probe_delete,
        races=tuple(races),
    )
    cache_put(store, caps)
    log.debug("s3ckpt: probed %s bucket %s: %s", caps.endpoint, caps.bucket, caps)
    return caps


def require_conditional_writes(
    store: ObjectStore,
    key: str,
    *,
    what: str,
    body: bytes | None = None,
    single_writer: bool | None = None,
    probe_delete: bool = False,
    beside: bool = False,
) -> Capabilities:
    """Probe (once) and refuse ``what`` on a store that ignores conditional writes;
    ``single_writer`` (None: the store's ``S3Config.single_writer``) warns instead, once
    per process and endpoint. ``beside``: see :func:`probe_capabilities`.

    Raises:
        ConditionalWritesError: ``If-None-Match`` or ``If-Match`` is ignored.
    """
    caps = probe_capabilities(store, key, body=body, probe_delete=probe_delete, beside=beside)
    if caps.conditional_writes:
        return caps
    pairs = (("If-None-Match", caps.conditional_create), ("If-Match", caps.conditional_replace))
    ignored = " and ".join(name for name, ok in pairs if not ok)
    if single_writer is None:
        single_writer = bool(getattr(getattr(store, "s3_config", None), "single_writer", False))
    if single_writer:
        warn_once(
            warned,
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


# -- checksum verification -----------------------------------------------------------------
_REFUSALS = frozenset(
    {"BadDigest", "InvalidRequest", "XAmzContentChecksumMismatch", "InvalidDigest"}
)
_verified: dict[tuple[str | None, str], bool] = {}


def checksum_verified(store: Any, key: str) -> bool:
    """Whether the S3 ``store`` refuses an upload with a wrong CRC32C (an echo proves
    nothing: moto echoes whatever it is sent), once per (endpoint, bucket) and process: one
    PUT of ``key`` (the caller's own object, its own body) with a wrong CRC32C, a request of
    the store's own. Refused (``BadDigest`` ...): verified; accepted, or a 400 for another
    reason: not, and the object is put back. Raises StoreError when a request fails."""
    import botocore.exceptions as bce

    from s3ckpt.store._body import BufferBody

    where = (store.endpoint_url, store.bucket)
    if (known := _verified.get(where)) is not None:  # one dict get / set: atomic
        return known
    body = store.get(key)
    wrong = (_crc.crc32c(body) ^ 0xFFFFFFFF).to_bytes(4, "big")
    crc = base64.b64encode(wrong).decode("ascii")
    args = store._args(key, upload=True, ChecksumAlgorithm="CRC32C", ChecksumCRC32C=crc)

    def send() -> bool:
        try:
            store.client.put_object(Body=BufferBody(body), **args)
        except bce.ClientError as exc:
            if (exc.response.get("Error") or {}).get("Code") in _REFUSALS:
                return True
            if int((exc.response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or 0) == 400:
                return False
            raise
        return False

    verified = bool(store._call("put", key, send))
    if not verified:
        store.put(key, body)  # the object back with its right checksum
    _verified[where] = verified
    return verified


# -- races -----------------------------------------------------------------------------------
def race(
    store: ObjectStore,
    key: str,
    kind: RaceKind,
    *,
    pairs: int = 1,
    body: bytes | None = None,
    put: Callable[..., str] | None = None,
) -> RaceResult:
    """Race ``pairs`` pairs of ``kind`` on ``key.0``, ``key.1`` ... (``body``: one pair of
    creates of ``key`` itself with these bytes), the two requests of a pair sent at once
    from two threads: ``create`` two ``PUT If-None-Match: *``; ``replace`` two ``PUT
    If-Match``; ``delete`` ``DeleteObject If-Match`` against ``PUT If-Match`` (rm racing an
    overwrite). Sound: exactly one won (the loser got 412 or 404) and the key reads back as
    it left it. ``put`` sends the PUTs (default ``store.put``). Cost per pair: 2
    conditional requests and a GET (and a PUT first for ``replace`` and ``delete``).

    Raises:
        StoreError: A request failed otherwise than by losing: the first such error.
    """
    put = put or store.put
    counts = [0, 0, 0]  # both won, none won, wrong bytes
    start = threading.Barrier(2)

    def at_once(request: Callable[[], object]) -> bool | BaseException:
        start.wait(timeout=60)
        return _lost(request, ObjectNotFoundError)

    with ThreadPoolExecutor(2, thread_name_prefix="s3ckpt-race") as pool:
        for i in range(pairs):
            if body is None:
                k, mine = f"{key}.{i}", [f"s3ckpt race {kind} {i} {s}\n".encode() for s in "ab"]
            else:
                k, mine = key, [body, body]
            requests: list[Callable[[], object]]
            if kind == "create":
                requests = [partial(put, k, b, if_none_match=True) for b in mine]
            else:
                etag = put(k, f"s3ckpt race {kind} {i} first\n".encode()) or _etag(store, k)
                requests = [partial(put, k, b, if_match=etag) for b in mine]
                if kind == "delete":
                    mine[0] = b""  # the deleter's result: the key is gone
                    requests[0] = partial(store.delete_if_match, k, etag)
            outcome = list(pool.map(in_context(at_once), requests))
            if errors := [got for got in outcome if isinstance(got, BaseException)]:
                raise errors[0]
            winners = [n for n, won in enumerate(outcome) if won]
            if len(winners) != 1:
                counts[0 if winners else 1] += 1
            elif (if_found(partial(store.get, k)) or b"") != mine[winners[0]]:  # b"": gone
                counts[2] += 1
    return RaceResult(kind, pairs, *counts)


def _etag(store: ObjectStore, key: str) -> str:
    info = store.head(key)
    if info is None or not info.etag:
        raise ObjectNotFoundError(
            "the race's key vanished or has no ETag", bucket=store.bucket, key=key
        )
    return info.etag


# -- doctor's probes of uploads and listings -------------------------------------------------
_CHILD = """
import base64, pickle, sys
store = pickle.loads(base64.b64decode(sys.stdin.readline()))
key = sys.stdin.readline().strip()
upload_id = store.create_multipart(key)
print(upload_id, flush=True)
sys.stdin.readline()  # the doctor has listed
store.abort_multipart(key, upload_id)
"""


def other_process_upload(
    store: ObjectStore, key: str, prefix: str, opened: Callable[[tuple[str, str]], None]
) -> tuple[bool, str]:
    """Whether ``ListMultipartUploads`` of ``prefix`` lists an upload of ``key`` another
    process opened (``python -c``, the store pickled to it: a registry in one process would
    pass a second client; a store that cannot be pickled, ``memory://``, opens it itself),
    and how it was opened. ``opened((key, upload_id))`` is told the upload at once (for
    cleanup)."""

    def listed(upload_id: str, how: str) -> tuple[bool, str]:
        opened((key, upload_id))
        return upload_id in {u.upload_id for u in store.list_multipart_uploads(prefix)}, how

    try:
        blob = base64.b64encode(pickle.dumps(store)).decode("ascii")
    except Exception:  # a store that lives in this process only (memory://, a test's wrapper)
        return listed(store.create_multipart(key), "a second copy of this in-process store")
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    pipe = subprocess.PIPE
    with subprocess.Popen(
        [sys.executable, "-c", _CHILD], stdin=pipe, stdout=pipe, stderr=pipe, text=True, env=env
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(f"{blob}\n{key}\n")
        proc.stdin.flush()
        try:
            upload_id = proc.stdout.readline().strip()
            if not upload_id:
                last = (proc.communicate(timeout=60)[1].strip().splitlines() or ["it exited"])[-1]
                raise RuntimeError(f"the other process could not open an upload: {last}")
            return listed(upload_id, "another process")
        finally:
            if proc.returncode is None:  # let it abort its upload and end (killed after 60 s)
                try:
                    proc.communicate("done\n", timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()


_RUN_OBJECTS = ("s3ckpt.latest.json",)
_CHECKPOINT = ("__0_0.0a1b2c3d.distcp", ".metadata.0a1b2c3d", ".metadata", "s3ckpt.json")
_FOLDERS = ("step_000000100/", "step_000000200/", "s3ckpt-shards/")


def listing_mistakes(store: ObjectStore, run: str, page: int) -> list[str]:
    """A run laid out under ``run`` as s3ckpt writes it (11 PUTs), listed with ``/`` at the
    run and a checkpoint, ``page`` keys a page: what came back missing, twice or unexpected."""
    from s3ckpt.store.folder import _s3, list_folder

    shard = "s3ckpt-shards/0a/step_000000200/__1_0.0a1b2c3d.distcp"
    for name in [*_RUN_OBJECTS, *(f + k for f in _FOLDERS[:2] for k in _CHECKPOINT), shard]:
        store.put(run + name, b"s3ckpt doctor: listing probe\n")
    s3 = _s3(store)  # an S3 store (or the one a wrapper holds) pages; others list whole
    paged: Any = store if s3 is None else copy.copy(s3)
    if s3 is not None:
        paged.page_size = page
    ckpt = run + _FOLDERS[1]

    folders = {run + f for f in _FOLDERS}
    wrong = _compare("run", list_folder(paged, run), folders | {run + _RUN_OBJECTS[0]})
    wrong += _compare("run folders", paged.list_prefixes(run), folders)
    return wrong + _compare("checkpoint", list_folder(paged, ckpt), {ckpt + k for k in _CHECKPOINT})


def _compare(where: str, got: Iterable[Any], want: set[str]) -> list[str]:
    """What of ``want`` ``got`` (keys, or entries with a ``key``) lacks, has twice or more."""
    seen = Counter(e if isinstance(e, str) else e.key for e in got)
    wrong = [f"{where}: missing {k}" for k in sorted(want - set(seen))]
    wrong += [f"{where}: {k} {n} times" for k, n in sorted(seen.items()) if k in want and n > 1]
    return wrong + [f"{where}: unexpected {k}" for k in sorted(set(seen) - want)]
