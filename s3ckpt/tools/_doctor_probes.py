"""The doctor's probes of what saves and scans rely on beyond single requests: another
process's open upload listed, a run listed folder by folder with paging, and the bucket's
versioning (see :mod:`s3ckpt.tools._doctor` for the order and cost).

Decisions: the other process is a real one (``python -c``, the store pickled to it), since
a registry of uploads inside one process (or one module) would pass a second client in the
same process; a store that lives in one process only (``memory://``) gets a second copy of
itself instead, and the row says so. The listing probe lists through s3ckpt's own requests
(:func:`s3ckpt.store.folder.list_folder`, :meth:`~s3ckpt.store.ObjectStore.list_prefixes`)
with two keys a page, so it sees what ``ls``, ``load(step="latest")``, prune and gc see.
"""

from __future__ import annotations

import base64
import copy
import os
import pickle
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from s3ckpt.errors import AccessDeniedError, S3CkptError, StoreError
from s3ckpt.store import ObjectStore, VersionedStore, bucket_versioning, is_unsupported
from s3ckpt.tools._doctor_checks import Scratch
from s3ckpt.tools._doctor_report import Check, CheckStatus

__all__ = ["LISTING_PAGE", "listing_row", "other_upload_row", "versioning_row"]

LISTING_PAGE = 2
"""Keys per LIST page in the listing probe: every folder listed spans several pages."""

_LIFECYCLE = (
    "a bucket lifecycle rule with AbortIncompleteMultipartUpload removes them (terraform/ sets one)"
)

# -- another process's upload ----------------------------------------------------------------
_CHILD = """
import base64, pickle, sys
store = pickle.loads(base64.b64decode(sys.stdin.readline()))
key = sys.stdin.readline().strip()
upload_id = store.create_multipart(key)
print(upload_id, flush=True)
sys.stdin.readline()  # the doctor has listed
store.abort_multipart(key, upload_id)
"""


def _other_process(store: ObjectStore, key: str) -> tuple[Any, str] | None:
    """Open an upload of ``key`` from another process: ``(process, upload id)``; None for a
    store that cannot leave this process (then the caller uses a second copy)."""
    if store.url_scheme == "memory":
        return None
    try:
        blob = base64.b64encode(pickle.dumps(store)).decode("ascii")
    except Exception:  # a store that lives in this process only (a test's wrapper)
        return None
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(f"{blob}\n{key}\n")
    proc.stdin.flush()
    upload_id = proc.stdout.readline().strip()
    if not upload_id:
        _, err = proc.communicate(timeout=60)
        last = (err.strip().splitlines() or ["it exited"])[-1]
        raise RuntimeError(f"the other process could not open an upload: {last}")
    return proc, upload_id


def other_upload_row(work: Scratch) -> Check:
    """``list uploads``: ✔ only when an upload another process opened is listed (gc finds
    the uploads of saves that died elsewhere this way). Cost: a process start, a
    CreateMultipartUpload, a ListMultipartUploads and an abort."""
    name, store = "list uploads", work.store
    key = work.key("uploads/other-process")
    proc = None
    try:
        started = _other_process(store, key)
        if started is None:
            other = _second_copy(store)
            upload_id, how = other.create_multipart(key), "a second copy of this in-process store"
        else:
            (proc, upload_id), how = started, "another process"
        work.uploads.append((key, upload_id))
        listed = {u.upload_id for u in store.list_multipart_uploads(work.key("uploads/"))}
    except AccessDeniedError as exc:
        return Check(name, CheckStatus.SKIP, f"not probed: {exc.message} (see the permissions)")
    except StoreError as exc:
        if is_unsupported(exc):
            return Check(
                name,
                CheckStatus.WARN,
                f"the store does not support ListMultipartUploads ({exc.code})",
                "gc cannot see open uploads: saves in progress are told by their heartbeats "
                f"alone, and abandoned uploads stay (billed) until {_LIFECYCLE}",
            )
        return Check(name, CheckStatus.FAIL, f"the probe failed: {exc}", "see the error")
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        return Check(name, CheckStatus.SKIP, f"not measured: {exc}")
    finally:
        if proc is not None:
            _finish(proc)
    if upload_id in listed:
        return Check(name, CheckStatus.OK, f"ListMultipartUploads lists an upload {how} opened")
    return Check(
        name,
        CheckStatus.WARN,
        f"ListMultipartUploads does not list an upload {how} opened (only this process's own)",
        "gc cannot see the uploads of saves that died in other processes: they stay "
        f"(billed on S3, partial files elsewhere) until {_LIFECYCLE} or you remove them",
    )


def _second_copy(store: ObjectStore) -> ObjectStore:
    try:
        copied: ObjectStore = pickle.loads(pickle.dumps(store))
    except Exception:  # MemoryStore: the store is the server; it has no second client
        return store
    return copied


def _finish(proc: Any) -> None:
    """Let the other process abort its upload and end (killed after 60 s)."""
    try:
        proc.communicate("done\n", timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


# -- a run listed folder by folder -----------------------------------------------------------
_RUN_OBJECTS = ("s3ckpt.latest.json",)
_CHECKPOINT = ("__0_0.0a1b2c3d.distcp", ".metadata.0a1b2c3d", ".metadata", "s3ckpt.json")
_FOLDERS = ("step_000000100/", "step_000000200/", "s3ckpt-shards/")


def _layout(run: str) -> list[str]:
    """A run as s3ckpt lays it out: two checkpoint folders with data, metadata and a
    marker, a hashed-prefix shard folder, and the run's latest pointer."""
    keys = [run + k for k in _RUN_OBJECTS]
    keys += [run + f + k for f in _FOLDERS[:2] for k in _CHECKPOINT]
    keys += [run + "s3ckpt-shards/0a/step_000000200/__1_0.0a1b2c3d.distcp"]
    return keys


def _paged(store: ObjectStore) -> ObjectStore:
    """``store`` listing :data:`LISTING_PAGE` keys a page (an S3 store; others list whole)."""
    inner: Any = store
    while getattr(inner, "wrapped", None) is not None:
        inner = inner.wrapped
    if not hasattr(inner, "page_size"):
        return store
    paged = copy.copy(inner)
    paged.page_size = LISTING_PAGE
    return paged


def _compare(where: str, got: Iterable[str], want: set[str]) -> list[str]:
    seen = Counter(got)
    wrong = [f"{where}: missing {k}" for k in sorted(want - set(seen))]
    wrong += [f"{where}: {k} {n} times" for k, n in sorted(seen.items()) if k in want and n > 1]
    wrong += [f"{where}: unexpected {k}" for k in sorted(set(seen) - want)]
    return wrong


def listing_row(work: Scratch) -> Check:
    """``listing``: a run laid out as s3ckpt writes it, listed with ``Delimiter="/"`` at the
    run and at a checkpoint, two keys a page: every folder and object comes back exactly
    once. Cost: 11 PUTs and about 10 LISTs."""
    from s3ckpt.store.folder import list_folder

    name, store = "listing", work.store
    run = work.key("listing/")
    try:
        for key in _layout(run):
            store.put(key, b"s3ckpt doctor: listing probe\n")
        paged = _paged(store)
        ckpt = run + _FOLDERS[1]

        def names(entries: Iterable[Any]) -> list[str]:
            return [e if isinstance(e, str) else e.key for e in entries]

        want_run = {run + f for f in _FOLDERS} | {run + k for k in _RUN_OBJECTS}
        wrong = _compare("run", names(list_folder(paged, run)), want_run)
        wrong += _compare("run folders", paged.list_prefixes(run), {run + f for f in _FOLDERS})
        wrong += _compare(
            "checkpoint", names(list_folder(paged, ckpt)), {ckpt + k for k in _CHECKPOINT}
        )
    except AccessDeniedError as exc:
        return Check(name, CheckStatus.SKIP, f"not probed: {exc.message} (see the permissions)")
    except S3CkptError as exc:
        return Check(
            name,
            CheckStatus.FAIL,
            f"listing a run with Delimiter=/ failed: {exc}",
            "ls, load(step='latest'), prune and gc list runs this way and would fail here: "
            "report it to the store's operator",
        )
    if wrong:
        shown = "; ".join(wrong[:3]) + (f" and {len(wrong) - 3} more" if len(wrong) > 3 else "")
        return Check(
            name,
            CheckStatus.FAIL,
            f"a delimited listing, {LISTING_PAGE} keys a page, came back wrong: {shown}",
            "ls, load(step='latest'), prune and gc would miss or double-count checkpoints: "
            "report it to the store's operator",
        )
    return Check(
        name,
        CheckStatus.OK,
        f"a run and a checkpoint listed with Delimiter=/, {LISTING_PAGE} keys a page: every "
        "folder and object exactly once",
    )


# -- versioning ------------------------------------------------------------------------------
_VERSIONS_DOC = "docs/operations.md, 'Versioned buckets'"


def versioning_row(store: ObjectStore) -> Check:
    """``versioning``: GetBucketVersioning, and what prune then frees."""
    name = "versioning"
    if not isinstance(store, VersionedStore):
        return Check(
            name,
            CheckStatus.SKIP,
            f"not an S3 store ({store.url_scheme}://): no object versions; deletes free bytes",
        )
    try:
        status = bucket_versioning(store)
    except AccessDeniedError as exc:
        return Check(
            name,
            CheckStatus.WARN,
            f"could not read it: {exc.code or 'AccessDenied'} (s3:GetBucketVersioning)",
            "on a versioned bucket prune's deletes leave noncurrent versions (billed); "
            f"grant s3:GetBucketVersioning to know, and see {_VERSIONS_DOC}",
        )
    except StoreError as exc:
        if is_unsupported(exc):
            why = f"the store does not support GetBucketVersioning ({exc.code})"
            return Check(name, CheckStatus.SKIP, why)
        return Check(name, CheckStatus.WARN, f"could not read it: {exc}", f"see {_VERSIONS_DOC}")
    if status is None:
        return Check(name, CheckStatus.OK, "never enabled: prune, gc and rm free what they delete")
    kept = (
        "a deleted checkpoint stays as noncurrent versions (billed)"
        if status == "Enabled"
        else "versions made while it was enabled stay as noncurrent versions (billed)"
    )
    return Check(
        name,
        CheckStatus.WARN,
        f"{status}: {kept} until a lifecycle rule expires them",
        "prune reports the noncurrent bytes it leaves; expire them with a "
        "NoncurrentVersionExpiration lifecycle rule (terraform/ sets one): see " + _VERSIONS_DOC,
    )
