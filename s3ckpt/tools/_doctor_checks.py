"""The doctor's checks that write: permissions, the round trip, and the cleanup.

Everything here writes only under one scratch prefix (:class:`Scratch`), and
:func:`clean_up` removes it all, open multipart uploads included. Part of
:mod:`s3ckpt.tools._doctor`, which says the order and the cost.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from s3ckpt._crc import crc32c
from s3ckpt._units import plural
from s3ckpt.errors import AccessDeniedError, ConditionalWritesError, S3CkptError, find_s3ckpt_error
from s3ckpt.store import Location, ObjectStore
from s3ckpt.store._known import is_unsupported
from s3ckpt.tools._doctor_report import Check, CheckStatus, fail, ok, skip, warn
from s3ckpt.uri import StoreURL

__all__ = ["Scratch", "clean_up", "permission_rows", "round_trip_rows"]


@dataclass
class Scratch:
    """The scratch prefix the checks write under, and the multipart uploads they opened
    and have not finished (aborted at cleanup whatever happens)."""

    location: Location
    uploads: list[tuple[str, str]] = field(default_factory=list)
    #: The store answered an abort 405/501: it cannot abort uploads.
    no_abort: bool = False

    @property
    def store(self) -> ObjectStore:
        """The store the checks write to."""
        return self.location.store

    @property
    def url(self) -> StoreURL:
        """The scratch prefix."""
        return self.location.url

    def key(self, name: str) -> str:
        """The key of ``name`` under the scratch prefix."""
        return self.url.key(name)

    def create_multipart(self, key: str) -> str:
        """Open an upload, registered for cleanup the moment it exists."""
        upload_id = self.store.create_multipart(key)
        self.uploads.append((key, upload_id))
        return upload_id

    def upload(self, key: str, *parts: bytes) -> None:
        """A multipart upload of ``parts``, each sent with its CRC32C, completed."""
        upload_id = self.create_multipart(key)
        sent = [
            self.store.upload_part(key, upload_id, n, d, crc32c=crc32c(d))
            for n, d in enumerate(parts, 1)
        ]
        self.store.complete_multipart(key, upload_id, sent)
        self.uploads.remove((key, upload_id))  # completed: nothing left to abort


# -- permissions -----------------------------------------------------------------------------
# check -> (IAM action, who needs it and for what)
_PERMISSIONS: dict[str, tuple[str, str]] = {
    "put": ("s3:PutObject", "the trainer cannot save and the pruner cannot take its lease"),
    "head": ("s3:GetObject", "the trainer cannot check its objects before committing"),
    "get": ("s3:GetObject", "nobody can load a checkpoint or read its marker"),
    "list": ("s3:ListBucket", "nobody can find checkpoints (resume, ls, prune, gc)"),
    "multipart": ("s3:PutObject", "the trainer cannot upload objects above one part"),
    "list uploads": (
        "s3:ListBucketMultipartUploads",
        "gc cannot find abandoned uploads (billed until a lifecycle rule removes them)",
    ),
    "abort": (
        "s3:AbortMultipartUpload",
        "a failed save leaves its uploads behind (billed) and gc cannot remove them",
    ),
    "delete": ("s3:DeleteObject", "prune, gc and rm cannot delete, nor overwrites clean up"),
}


# check -> the request, as the store's documentation names it
_OPERATIONS = {
    "put": "PutObject",
    "head": "HeadObject",
    "get": "GetObject",
    "list": "ListObjectsV2",
    "multipart": "multipart uploads",
    "list uploads": "ListMultipartUploads",
    "abort": "AbortMultipartUpload",
    "delete": "DeleteObjects",
}
LIFECYCLE = (
    "a bucket lifecycle rule with AbortIncompleteMultipartUpload removes them (terraform/ sets one)"
)
NO_LIST_UPLOADS = (
    "gc cannot see open uploads: saves in progress are told by their heartbeats alone, and "
    f"abandoned uploads stay (billed) until {LIFECYCLE}"
)
# check -> what s3ckpt does on a store without it (the others it cannot do without)
_UNSUPPORTED = {
    "list uploads": NO_LIST_UPLOADS,
    "abort": f"a failed save's uploads cannot be aborted: they stay (billed) until {LIFECYCLE}",
}


def _message(exc: BaseException) -> str:
    inner = find_s3ckpt_error(exc)
    return str(inner) if inner is not None else f"{type(exc).__name__}: {exc}"


def _run(name: str, work: Scratch, fn: Callable[[], str | None], needs: str | None = None) -> Check:
    """The row of one permission: ``fn`` returns ``None`` when the answer was right, else
    what was wrong; ``needs`` names a failed earlier check it depends on (then skipped).
    A denial says what to grant; a request the store does not implement (405/501) is no
    permission, and a warning where s3ckpt can do without it."""
    row, (action, effect) = f"permission {name}", _PERMISSIONS[name]
    if needs is not None:
        return skip(row, f"not tried: needs {needs}")
    try:
        wrong = fn()
    except AccessDeniedError as exc:
        url = work.url
        where = f"arn:aws:s3:::{url.bucket}" + ("" if name == "list" else f"/{url.prefix}*")
        other = "" if work.store.url_scheme == "s3" else " (or the store's equivalent)"
        return fail(row, f"denied ({exc.code})", f"{effect}: grant {action} on {where}{other}")
    except S3CkptError as exc:
        if not is_unsupported(exc):
            return fail(row, _message(exc), effect)
        operation, then = _OPERATIONS[name], _UNSUPPORTED.get(name)
        code = getattr(exc, "code", None) or "501"
        detail = f"the store does not support {operation} ({code}): not a permission"
        if then is None:
            return fail(row, detail, f"s3ckpt needs {operation}: use a store that implements it")
        return warn(row, detail, then)
    if wrong is not None:
        return fail(
            row,
            wrong,
            "the store answered wrongly: s3ckpt cannot rely on it; report it to the "
            "store's operator",
        )
    return ok(row, f"{action}: allowed" if work.store.url_scheme == "s3" else "allowed")


def permission_rows(work: Scratch) -> list[Check]:
    """Exercise each action the trainer and pruner roles need, for real, under the scratch
    prefix: put, head, get, list, multipart (create, upload, complete), list uploads, abort
    and delete. Cost: about 12 requests, a few KiB."""
    store = work.store
    obj, mp_key, ab_key = (work.key(f"perm/{n}") for n in ("object", "multipart", "abort"))
    data = b"s3ckpt doctor: permission check\n" * 32

    def put() -> None:
        store.put(obj, data)

    def head() -> str | None:
        if (info := store.head(obj)) is None:
            return "HEAD of the object just written found nothing"
        return None if info.size == len(data) else f"HEAD says {info.size} bytes, wrote {len(data)}"

    def get() -> str | None:
        return None if store.get(obj) == data else "GET returned other bytes than were written"

    def listed() -> str | None:
        keys = {o.key for o in store.list(work.url.prefix)}
        return None if obj in keys else "LIST does not show the object just written"

    def multipart() -> str | None:
        work.upload(mp_key, data)
        return None if store.get(mp_key) == data else "the completed upload reads back wrong"

    def list_uploads() -> str | None:
        state["abort_upload"] = upload_id = work.create_multipart(ab_key)
        found = {u.upload_id for u in store.list_multipart_uploads(work.url.prefix)}
        return None if upload_id in found else "the upload just opened is not listed"

    def abort() -> None:
        upload_id = state.get("abort_upload") or work.create_multipart(ab_key)
        store.abort_multipart(ab_key, upload_id)
        work.uploads.remove((ab_key, upload_id))

    def delete() -> str | None:
        if failures := store.delete([obj, mp_key]):
            bad = failures[0]
            raise AccessDeniedError(
                f"{bad.code}: {bad.message}", bucket=work.url.bucket, key=bad.key, code=bad.code
            )
        return None if store.head(obj) is None else "the object is still there after DELETE"

    state: dict[str, Any] = {}
    rows = [_run("put", work, put)]
    no_put = None if rows[0].status is CheckStatus.OK else "put"
    rows += [_run("head", work, head, needs=no_put), _run("get", work, get, needs=no_put)]
    rows += [_run("list", work, listed, needs=no_put), _run("multipart", work, multipart)]
    rows += [_run("list uploads", work, list_uploads), _run("abort", work, abort)]
    rows.append(_run("delete", work, delete, needs=no_put))
    return rows


# -- round trip ------------------------------------------------------------------------------
def _torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def round_trip_rows(work: Scratch, *, use_torch: bool | None = None) -> list[Check]:
    """A small save and load, checked bit-exact: through ``dcp.save`` / ``dcp.load`` with
    :class:`~s3ckpt.dcp.S3StorageWriter` / :class:`~s3ckpt.dcp.S3StorageReader` when torch
    is there (``use_torch``), else a put and a two-part multipart upload read back and
    compared by CRC32C (about 5.1 MiB), and a row saying torch is missing."""
    available = _torch_available()
    if available if use_torch is None else use_torch:
        try:
            return [_dcp_round_trip(work)]
        except ImportError as exc:  # torch there but broken (numpy, a bad build)
            row = warn("torch", f"torch cannot be imported ({exc})", _NO_TORCH)
    else:
        why = "not asked for" if available else "not installed"
        row = skip("torch", f"{why}: the dcp.save / dcp.load round trip was skipped")
    return [_raw_round_trip(work), row]


_NO_TORCH = (
    "this image cannot save or load checkpoints (retention and the catalog commands work): "
    'pip install "s3ckpt[torch]" where the trainer runs and run doctor there'
)


def _raw_round_trip(work: Scratch) -> Check:
    small, big = work.key("roundtrip/put"), work.key("roundtrip/multipart")
    # A first part of S3's smallest size for a part but the last.
    one, parts = os.urandom(64 * 1024), [os.urandom(5 * 1024 * 1024), os.urandom(100 * 1024)]
    try:
        work.store.put(small, one, crc32c=crc32c(one))
        work.upload(big, *parts)
        sent = ((small, one), (big, b"".join(parts)))
        wrong = [k for k, want in sent if crc32c(work.store.get(k)) != crc32c(want)]
    except S3CkptError as exc:
        return _round_trip_failed(_message(exc))
    if wrong:
        return _round_trip_failed(f"read back with another CRC32C: {', '.join(wrong)}")
    size = len(one) + sum(map(len, parts))
    return ok(
        "round trip",
        f"put + 2-part multipart ({size / 2**20:.1f} MiB) read back, CRC32C equal",
    )


def _round_trip_failed(detail: str) -> Check:
    return fail(
        "round trip",
        detail,
        "a checkpoint saved here would not load back as saved: see the detail and the rows above",
    )


def _dcp_round_trip(work: Scratch) -> Check:
    import torch
    import torch.distributed.checkpoint as dcp

    from s3ckpt.dcp import S3StorageReader, S3StorageWriter, quiet_dcp

    g = torch.Generator().manual_seed(27)
    tensors = {
        "weight": torch.randn(64, 64, generator=g),
        "half": torch.randn(33, 7, generator=g).to(torch.bfloat16),
        "ints": torch.arange(1000, dtype=torch.int64),
        "mask": torch.rand(17, generator=g) > 0.5,
    }
    saved: dict[str, Any] = {**tensors, "extra": {"step": 27, "name": "s3ckpt doctor"}}
    loaded: dict[str, Any] = {k: torch.zeros_like(v) for k, v in tensors.items()}
    loaded["extra"] = {"step": 0, "name": ""}
    at = work.location.child("roundtrip")
    try:
        # Single-writer mode warns on every save's first probe; the capability rows say it
        # once, in the table.
        with quiet_dcp(), warnings.catch_warnings(action="ignore", category=UserWarning):
            dcp.save(saved, storage_writer=S3StorageWriter(at), no_dist=True)
            dcp.load(loaded, storage_reader=S3StorageReader(at), no_dist=True)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # torch's CheckpointException is one
        if isinstance(find_s3ckpt_error(exc), ConditionalWritesError):
            return fail(
                "round trip",
                "dcp.save refused: the store ignores conditional writes",
                "every save refuses here, as it must without conditional writes: use a "
                "store that enforces them, or single-writer mode (S3Config(single_writer="
                "True)) if only one process at a time ever writes to a prefix",
            )
        return _round_trip_failed(f"dcp: {_message(exc)}")

    def bits(t: Any) -> Any:
        return t.contiguous().view(torch.uint8)

    differ = [k for k, v in tensors.items() if not torch.equal(bits(v), bits(loaded[k]))]
    differ += ["extra"] if loaded["extra"] != saved["extra"] else []
    if differ:
        return _round_trip_failed(f"dcp.load gave other bytes than dcp.save wrote: {differ}")
    size = sum(v.numel() * v.element_size() for v in tensors.values())
    return ok(
        "round trip",
        f"dcp.save + dcp.load of {len(saved)} items ({size / 1024:.0f} KiB), bit-exact",
    )


# -- cleanup ---------------------------------------------------------------------------------
def clean_up(work: Scratch, emit: Callable[[Check], None]) -> tuple[str, ...]:
    """Remove everything under the scratch prefix: the uploads the checks opened (and any
    other open upload listed there), then every object, and ``emit`` the cleanup row. Never
    raises a store error: what could not be removed is the row's detail and the tuple
    returned (keys, and ``upload KEY ID`` for uploads). Interrupted (a second Ctrl-C), the
    row says where the rest is, then the interrupt goes on."""
    store, prefix = work.store, work.url.prefix
    try:
        with contextlib.suppress(S3CkptError):  # no ListMultipartUploads: a row says so
            listed = [(u.key, u.upload_id) for u in store.list_multipart_uploads(prefix)]
            work.uploads = list(dict.fromkeys([*work.uploads, *listed]))
        problems: list[str] = []
        for key, upload_id in list(work.uploads):
            try:
                store.abort_multipart(key, upload_id)
                work.uploads.remove((key, upload_id))
            except S3CkptError as exc:
                work.no_abort = work.no_abort or is_unsupported(exc)
                problems.append(f"abort {key}: {exc.message}")
        try:
            keys = [o.key for o in store.list(prefix)]
            removed = len(keys) - len(store.delete(keys))
            left = sorted({o.key for o in store.list(prefix)})
        except S3CkptError as exc:
            problems.append(exc.message)
            removed, left = 0, [f"{prefix} (could not list it)"]
        left += [f"upload {key} {upload_id}" for key, upload_id in work.uploads]
        if store.url_scheme == "file" and not left:
            # A local scratch prefix is a folder tree once its files are gone: remove the
            # folders that are empty, deepest first (never a file).
            for folder, _, _ in sorted(os.walk("/" + prefix), key=lambda w: -len(w[0])):
                with contextlib.suppress(OSError):  # not empty (someone else's file) or gone
                    os.rmdir(folder)
    except KeyboardInterrupt:
        interrupted = f"interrupted: whatever is left is under {work.url}"
        emit(warn("cleanup", interrupted, _remove_hint(work)))
        raise
    if not left:
        emit(ok("cleanup", f"removed {plural(removed, 'object')} under {work.url}"))
        return ()
    shown = ", ".join(left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
    why = f" ({problems[0]})" if problems else ""
    emit(warn("cleanup", f"left behind: {shown}{why}", _remove_hint(work)))
    return tuple(left)


def _remove_hint(work: Scratch) -> str:
    if work.store.url_scheme == "s3":
        uploads = (
            "the store cannot abort uploads: a lifecycle rule with "
            "AbortIncompleteMultipartUpload removes them"
            if work.no_abort
            else "aws s3api abort-multipart-upload, or a lifecycle rule"
        )
        return f"remove it when you can: aws s3 rm --recursive {work.url} (open uploads: {uploads})"
    return f"remove everything under {work.url} when you can"
