"""How :class:`~s3ckpt.store.fsspec_store.FsspecStore` changes a key, per backend: with the
backend's own atomic primitive where it has one, and saying which conditions it enforces.

A conditional write is a compare-and-swap only if the compare and the write are one step
that no other writer can come between. Per fsspec protocol:

- ``file://`` (:class:`_Local`): every change of a key (put, completed upload, delete) takes
  an exclusive ``flock`` on the key's folder, so one host's processes and threads take turns;
  a create-if-absent is ``os.link(temp, final)``, which fails where ``final`` exists whoever
  wrote it, and a replace is ``os.replace`` (atomic) of a temp file written outside the lock.
  Not guaranteed: ``flock`` across hosts on NFS, or any network file system whose locks and
  hard links are not coherent across clients (use one host per folder there, or S3).
- ``memory://`` (:class:`_Memory`): fsspec's ``MemoryFileSystem`` is one dict per process; a
  process-wide lock makes check-and-write one step for threads. Single-process by nature.
- ``az://`` / ``abfs://`` (:class:`_Azure`, adlfs): Put Blob with ``If-None-Match: *``
  (``overwrite=False``) or ``If-Match: <ETag>``, Delete Blob with ``If-Match``: the service
  decides. ETags are Azure's own.
- ``gs://`` / ``gcs://`` (:class:`_Gcs`, gcsfs): uploads and deletes with
  ``ifGenerationMatch`` (0 for create-if-absent); the ETag s3ckpt hands out is the object's
  generation. From GCS's and gcsfs's documentation, not measured here.
- anything else (:class:`Committer`): no atomic primitive, so a check followed by a write,
  and :attr:`Committer.enforces` is empty: the store reports it ignores conditional writes,
  and saves are refused unless single-writer mode is chosen, as on an S3 store without them.

:data:`RACE_PAUSE` (seconds, 0 normally) is slept between a check and the write it allows,
where the backend has such a gap: tests set it to force the race, and an atomic backend
must still let only one writer win.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

__all__ = ["CONDITIONS", "RACE_PAUSE", "Committer", "Conflict", "committer_for", "md5_etag"]

#: Conditional create (If-None-Match), replace (If-Match) and delete (If-Match).
CONDITIONS = frozenset({"create", "replace", "delete"})

#: Seconds slept between a check and its write (tests force races with it).
RACE_PAUSE = 0.0


class Conflict(Exception):
    """The condition did not hold (what S3 answers with 412)."""


def md5_etag(data: bytes) -> str:
    """The quoted MD5 of ``data``: the ETag where the backend has none of its own."""
    return '"' + hashlib.md5(data, usedforsecurity=False).hexdigest() + '"'


class Committer:
    """No atomic primitive: check, then write. Enforces nothing (:attr:`enforces` empty);
    the subclasses override what their backend does atomically."""

    #: The conditions this backend enforces atomically (a subset of :data:`CONDITIONS`).
    enforces: frozenset[str] = frozenset()

    def __init__(self, fs: Any) -> None:
        self.fs = fs

    def _guard(self, path: str) -> contextlib.AbstractContextManager[object]:
        return contextlib.nullcontext()

    def etag(self, info: dict[str, Any]) -> str | None:
        """The backend's own ETag in a listing or info entry (None: use the MD5)."""
        value = info.get("ETag")
        return str(value) if value else None

    def _check(self, path: str, if_none_match: bool, if_match: str | None) -> None:
        if if_none_match and self.fs.exists(path):
            raise Conflict(path)
        if if_match is not None and md5_etag(self.fs.cat_file(path)) != if_match:
            raise Conflict(path)  # (cat_file raises FileNotFoundError where it is gone)
        time.sleep(RACE_PAUSE)

    def write(
        self, path: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        """Write ``data`` at ``path`` if the condition holds; its ETag."""
        with self._guard(path):
            self._check(path, if_none_match, if_match)
            self.fs.pipe_file(path, data)
        return md5_etag(data)

    def commit_file(self, tmp: str, path: str, *, if_none_match: bool = False) -> None:
        """Move a completed upload's file ``tmp`` to ``path`` (if absent, when asked)."""
        with self._guard(path):
            self._check(path, if_none_match, None)
            self.fs.mv(tmp, path)

    def delete(self, path: str) -> None:
        """Delete ``path`` (FileNotFoundError where it is not there)."""
        with self._guard(path):
            self.fs.rm_file(path)

    def delete_if_match(self, path: str, etag: str) -> None:
        """Delete ``path`` if its ETag is ``etag``."""
        with self._guard(path):
            self._check(path, False, etag)
            self.fs.rm_file(path)


_PROCESS_LOCK = threading.Lock()


class _Memory(Committer):
    """fsspec's in-process memory file system: one lock for the whole process."""

    enforces = CONDITIONS

    def _guard(self, path: str) -> contextlib.AbstractContextManager[object]:
        return _PROCESS_LOCK


class _Local(Committer):
    """A local folder: an exclusive ``flock`` on the key's folder around every change; a
    create is a hard link, which no other writer can come between."""

    enforces = CONDITIONS

    @contextlib.contextmanager
    def _guard(self, path: str) -> Iterator[object]:
        import fcntl

        folder = os.path.dirname(path) or "/"
        os.makedirs(folder, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            os.close(fd)  # releases the lock

    def write(
        self, path: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex}.s3ckpt-partial"
        with open(tmp, "xb") as f:
            f.write(data)
            if if_none_match or if_match is not None:
                os.fsync(f.fileno())  # a marker or a lease outlives a crash of the host
        self.commit_file(tmp, path, if_none_match=if_none_match, if_match=if_match)
        return md5_etag(data)

    def commit_file(
        self, tmp: str, path: str, *, if_none_match: bool = False, if_match: str | None = None
    ) -> None:
        """Move ``tmp`` to ``path`` under the condition; ``tmp`` is gone after, whatever
        happened (what a link left behind, or a file that lost)."""
        try:
            with self._guard(path):
                if if_none_match:
                    time.sleep(RACE_PAUSE)
                    try:
                        os.link(tmp, path)
                    except FileExistsError:
                        raise Conflict(path) from None
                    return
                if if_match is not None:
                    self._check(path, False, if_match)  # (then the race pause)
                os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def _quoted(etag: object) -> str:
    return '"' + str(etag).strip('"') + '"'


@contextlib.contextmanager
def _by_status(path: str) -> Iterator[None]:
    """An azure-core / gcsfs error by its HTTP status: 412 and 409 a Conflict, 404 gone."""
    try:
        yield
    except Exception as exc:
        status = getattr(exc, "status_code", None) or getattr(exc, "code", None)
        if status in (409, 412) or isinstance(exc, FileExistsError):
            raise Conflict(path) from exc
        if status == 404:
            raise FileNotFoundError(path) from exc
        raise


class _Remote(Committer):
    """A service that decides the conditions itself (adlfs, gcsfs)."""

    enforces = CONDITIONS

    def commit_file(self, tmp: str, path: str, *, if_none_match: bool = False) -> None:
        """Move a completed upload into place: the server-side copy takes no If-None-Match
        or generation condition, so a conditional one would not be atomic."""
        if if_none_match:
            raise NotImplementedError(f"a conditional CompleteMultipartUpload on {path}")
        self.fs.mv(tmp, path)


class _Azure(_Remote):
    """adlfs: Put Blob and Delete Blob with Azure's own ``If-None-Match`` / ``If-Match``."""

    def etag(self, info: dict[str, Any]) -> str | None:
        value = info.get("etag") or info.get("ETag")
        return _quoted(value) if value else None

    def write(
        self, path: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        kwargs: dict[str, Any] = {"overwrite": not if_none_match}
        if if_match is not None:
            from azure.core import MatchConditions

            kwargs.update(etag=if_match, match_condition=MatchConditions.IfNotModified)
        with _by_status(path):
            result = self.fs.pipe_file(path, data, **kwargs)
        return _quoted(result["etag"])

    def delete_if_match(self, path: str, etag: str) -> None:
        from azure.core import MatchConditions
        from fsspec.asyn import sync

        container, blob, _ = self.fs.split_path(path)

        async def delete() -> None:
            async with self.fs.service_client.get_blob_client(container, blob) as client:
                await client.delete_blob(etag=etag, match_condition=MatchConditions.IfNotModified)

        with _by_status(path):
            sync(self.fs.loop, delete)
        self.fs.invalidate_cache(path)


class _Gcs(_Remote):
    """gcsfs: uploads and deletes with ``ifGenerationMatch``; the ETag is the generation."""

    def etag(self, info: dict[str, Any]) -> str | None:
        generation = info.get("generation")
        return _quoted(generation) if generation else None

    def _send(self, path: str, *args: Any, **kwargs: Any) -> Any:
        """One gcsfs request about ``path`` (errors by their status); the cache forgets it."""
        from fsspec.asyn import sync

        with _by_status(path):
            out = sync(self.fs.loop, self.fs._call, *args, **kwargs)
        self.fs.invalidate_cache(path)
        return out

    def write(
        self, path: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        bucket, key, _ = self.fs.split_path(path)
        params: dict[str, str] = {}
        if if_none_match:
            params["ifGenerationMatch"] = "0"
        elif if_match is not None:
            params["ifGenerationMatch"] = if_match.strip('"')
        part = "--==0==\nContent-Type: application/{}\n\n"
        head = part.format("json; charset=UTF-8") + json.dumps({"name": key}) + "\n"
        body = (head + part.format("octet-stream")).encode() + data + b"\n--==0==--"
        out = self._send(
            path,
            "POST",
            f"{self.fs._location}/upload/storage/v1/b/{quote(bucket)}/o",
            uploadType="multipart",
            headers={"Content-Type": 'multipart/related; boundary="==0=="'},
            data=body,
            json_out=True,
            **params,
        )
        return _quoted(out["generation"])

    def delete_if_match(self, path: str, etag: str) -> None:
        bucket, key, _ = self.fs.split_path(path)
        self._send(path, "DELETE", "b/{}/o/{}", bucket, key, ifGenerationMatch=etag.strip('"'))


def committer_for(protocol: str, fs: Any) -> Committer:
    """The committer for ``fs`` (an fsspec file system opened for ``protocol``)."""
    package = type(fs).__module__.split(".", 1)[0]
    if protocol in ("file", "local") and package == "fsspec" and os.name == "posix":
        return _Local(fs)
    if protocol == "memory" and package == "fsspec":
        return _Memory(fs)
    if protocol in ("az", "abfs", "abfss") and package == "adlfs":
        return _Azure(fs)
    if protocol in ("gs", "gcs") and package == "gcsfs":
        return _Gcs(fs)
    return Committer(fs)
