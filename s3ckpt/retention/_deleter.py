"""Which keys may go, and the batched deleter that removes them.

Only names s3ckpt (or, for an uncommitted prefix, stock DCP) wrote are ever selected:
:func:`checkpoint_keys` for a prune or an rm, :func:`leftover_keys` for gc. :class:`Deleter`
sends them in ``DeleteObjects`` batches of the run's ``batch_size``, checks every per-key
error, retries transient ones (the run's ``retries`` rounds) and renews the lease before
every request.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from tenacity import retry_if_result

from s3ckpt._tombstone import Tombstone, read_tombstone
from s3ckpt.errors import (
    ObjectNotFoundError,
    PreconditionFailedError,
    S3CkptError,
    StoreError,
    TransientStoreError,
    UnsupportedOperationError,
)
from s3ckpt.format._names import (
    HEARTBEAT_PREFIX,
    MANIFEST_NAME,
    METADATA_NAME,
    owned_tag,
    shard_owner,
)
from s3ckpt.metrics.instrument import expecting
from s3ckpt.retention._catalog import CheckpointInfo
from s3ckpt.retention._lease import Lease
from s3ckpt.retention._options import RetentionOptions
from s3ckpt.store._known import cached_capabilities
from s3ckpt.store.base import DeleteFailure, ObjectStore, UploadInfo
from s3ckpt.store.retry import TRANSIENT_CODES, RetryPolicy

__all__ = [
    "Deleter",
    "checkpoint_keys",
    "checkpoint_uploads",
    "direct_name",
    "leftover_keys",
    "failure",
    "leftover_uploads",
    "tag_of",
]

_BACKOFF = RetryPolicy(attempts=1, initial_delay=0.1, max_delay=5.0, deadline=None)
"""Back-off between rounds of per-key retries: 0.1 s doubling up to 5 s, full jitter, no
deadline (the run's ``retries`` set the attempts)."""

_DCP_DATA = re.compile(r"__\d+_\d+\.distcp")
"""Stock DCP data names (``FileSystemWriter``); deleted only with ``include_foreign``."""


# -- what may be deleted -----------------------------------------------------------------------
def direct_name(c: CheckpointInfo, key: str) -> str | None:
    """``key``'s name relative to the checkpoint prefix when it lies directly under it."""
    prefix = c.url.prefix
    name = key[len(prefix) :]
    return name if key.startswith(prefix) and name and "/" not in name else None


def _own_name(c: CheckpointInfo, key: str) -> tuple[str, str | None, bool] | None:
    """``key``'s name in checkpoint ``c``, the save tag the name carries (None for names
    without one), and whether it is one of ``c``'s data objects in the run's shard folder
    (hashed prefixes, :func:`s3ckpt.format.shard_owner`); None for any other key (nested
    under the prefix, or not ``c``'s)."""
    name = direct_name(c, key)
    if name is not None:
        return name, owned_tag(name), False
    owner = shard_owner(key)
    if owner is not None and owner.checkpoint == c.url.prefix:
        return owner.name, owner.tag, True
    return None


def tag_of(c: CheckpointInfo, key: str) -> str | None:
    """The save tag ``key`` carries as a name of checkpoint ``c`` (a shard in the run's
    shard folder included); None for untagged names and keys that are not ``c``'s."""
    own = _own_name(c, key)
    return own[1] if own is not None else None


def failure(key: str, exc: S3CkptError) -> DeleteFailure:
    """``key``'s failure as a result reports it: the store's code (else the error's class)."""
    return DeleteFailure(key, getattr(exc, "code", None) or type(exc).__name__, str(exc))


def _other_live(c: CheckpointInfo) -> set[str]:
    return {t for t in c.live_tags if t != c.tag}


def checkpoint_keys(c: CheckpointInfo) -> list[str]:
    """The keys deleting checkpoint ``c`` removes: the marker, the plain ``.metadata``, what
    the marker commits, and every per-save name of a tag that is not live (a save in
    progress in the same prefix, an overwrite, is left alone); for an uncommitted
    checkpoint also stock DCP data names. Never a file s3ckpt or DCP did not write. The data
    objects of hashed-prefix saves in the run's shard folder count as the checkpoint's own
    per-save names. Behind a tombstone (being deleted) the untagged names are only those the
    tombstone planned (:attr:`s3ckpt._tombstone.Tombstone.names`)."""
    live, tomb = _other_live(c), c.tombstone

    def deletable(k: str, n: str, t: str | None, _sharded: bool) -> bool:
        if k in c.committed_keys or n == MANIFEST_NAME:
            return True
        if t is not None:
            return t not in live
        if tomb is not None:
            return n in tomb.names
        return n == METADATA_NAME or (not c.is_committed and bool(_DCP_DATA.fullmatch(n)))

    return [k for k in c.keys if (own := _own_name(c, k)) and deletable(k, *own)]


def checkpoint_uploads(c: CheckpointInfo) -> list[UploadInfo]:
    """Open uploads of per-save names of tags that are not live (other than committed)."""
    live = _other_live(c)
    return [u for u in c.uploads if (t := tag_of(c, u.key)) is not None and t not in live]


def leftover_keys(c: CheckpointInfo) -> list[str]:
    """What gc may delete under ``c``: per-save names of dead tags, never what a readable
    marker commits; in a committed prefix also the committed save's heartbeats. Nothing in
    a pinned prefix, nothing in a committed one whose marker cannot be read, and no data
    object of the committed save in the shard folder (even one the marker does not list)."""
    if c.pinned or (c.is_committed and c.tag is None):
        return []
    owned = [(k, *own) for k in c.keys if (own := _own_name(c, k)) and k not in c.committed_keys]
    return [
        k
        for k, n, t, sharded in owned
        if t is not None
        and not (sharded and t == c.tag)
        and (t not in c.live_tags or (t == c.tag and n.startswith(HEARTBEAT_PREFIX)))
    ]


def leftover_uploads(c: CheckpointInfo, cutoff: float) -> list[UploadInfo]:
    """Open uploads of per-save names whose tag is dead and that started before ``cutoff``
    (a dead tag's upload can never become committed data). None in a pinned prefix."""
    return [
        u
        for u in c.uploads
        if not c.pinned
        and (t := tag_of(c, u.key)) is not None
        and t not in c.live_tags
        and u.initiated is not None
        and u.initiated < cutoff
    ]


def _is_first_metadata(c: CheckpointInfo, key: str) -> bool:
    """The plain ``.metadata`` or the committed metadata (deleted right after the marker)."""
    n = direct_name(c, key) or ""
    return n == METADATA_NAME or (n.startswith(METADATA_NAME + ".") and key in c.committed_keys)


@dataclass
class Deleter:
    """Batched deletes with per-key checks, retries of transient per-key errors, lease
    renewal before every request, and a request counter.

    Attributes:
        store: The store.
        lease: The run's lease, renewed before every request (None: no lease, as in tests).
        options: The run's ``batch_size``, ``retries``, ``sleep`` and ``on_progress``.
    """

    store: ObjectStore
    lease: Lease | None
    options: RetentionOptions
    by: str = "prune"
    """Who fences (``prune``, ``gc`` or ``rm``): named in the tombstone, for the writer."""
    requests: int = 0
    deleted_keys: int = 0
    aborted: int = 0
    failures: list[DeleteFailure] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    """Checkpoints skipped because their marker changed after the scan."""
    _fences: dict[str, tuple[Tombstone, str | None] | None] = field(
        default_factory=dict, repr=False
    )
    """Each fenced checkpoint's tombstone and its ETag (None: no fence was needed)."""

    def delete(self, keys: Sequence[str], phase: str) -> set[str]:
        """Delete ``keys``; return the keys that failed for good.

        Keys that failed with a transient code (:data:`~s3ckpt.store.TRANSIENT_CODES`)
        are sent again in up to ``retries`` more rounds, backing off between rounds as
        s3ckpt's one retry policy does (:class:`~s3ckpt.store.retry.RetryPolicy`), without a
        deadline: one ``Retrying`` whose attempts are the rounds.
        """
        failed: dict[str, DeleteFailure] = {}
        policy = replace(_BACKOFF, attempts=self.options.retries + 1, sleep=self.options.sleep)
        rounds = policy.retrying(retry=retry_if_result(bool))
        # Keys still pending after the last round stay in ``failed``: no RetryError.
        rounds.copy(retry_error_callback=lambda state: None)(self._round, list(keys), failed, phase)
        self.failures.extend(failed.values())
        return set(failed)

    def _round(self, pending: list[str], failed: dict[str, DeleteFailure], phase: str) -> list[str]:
        """Send ``pending`` in batches; record failures in ``failed``; leave in ``pending``
        (and return) the keys worth another round."""
        retry: list[str] = []
        size = self.options.batch_size
        for i in range(0, len(pending), size):
            chunk = pending[i : i + size]
            if self.lease is not None:
                self.lease.renew_if_due()
            try:
                errs = self.store.delete(chunk)
            except StoreError as exc:  # the whole request failed (after S3Store retries)
                errs = [failure(k, exc) for k in chunk]
            self.requests += 1
            bad = {e.key for e in errs}
            self.deleted_keys += sum(1 for k in chunk if k not in bad)
            for k in chunk:
                failed.pop(k, None)
            failed.update((e.key, e) for e in errs)
            retry += [e.key for e in errs if e.code in TRANSIENT_CODES]
            self.options.progress("delete", phase=phase, keys=len(chunk))
        pending[:] = retry
        return pending

    def fence(self, c: CheckpointInfo, keys: Sequence[str]) -> bool:
        """Claim ``c``'s prefix before deleting any of it: ONE conditional PUT of a
        tombstone on its marker key (:mod:`s3ckpt._tombstone`), replacing only the ETag
        planned on (a committed marker, a finished tombstone) or created only if absent.
        True: fenced (an unfinished tombstone already there is finished as it is); False:
        the marker changed since it was listed (an overwrite committed, a save of a gone
        step committed): nothing of ``c`` may be deleted. A 412 or a lost reply is decided
        by reading the tombstone back. No fence at all where every name to delete is of a
        save proven gone (:attr:`CheckpointInfo.dead_tags`: a failure record, a vanished
        pid) in an uncommitted prefix: such a writer never reaches its marker PUT."""
        key = c.url.key(MANIFEST_NAME)
        if c.tombstone is not None and not c.tombstone.done:
            self._fences[c.name] = (c.tombstone, c.marker_etag)
            return True
        tags = {tag_of(c, k) for k in keys}
        if not c.is_committed and tags and tags <= c.dead_tags:
            self._fences[c.name] = None  # only saves proven gone: no claim left to end
            return True
        reaped = sorted(t for t in tags if t is not None and t != c.tag)
        names = {n for k in keys if (n := direct_name(c, k)) and owned_tag(n) is None}
        tomb = Tombstone(
            self.lease.owner if self.lease is not None else uuid.uuid4().hex,
            by=self.by,
            reaped=tuple(reaped),
            names=tuple(sorted(names - {MANIFEST_NAME})),
            keep=bool(set(reaped) - c.dead_tags or c.reaped),
            tag=c.tag,
        )
        planned = c.marker_etag
        if planned is None and key in c.keys:  # a store whose listings carry no ETags
            info = self.store.head(key)
            planned = info.etag if info is not None else None
        self._count("marker")
        try:
            with expecting("not_found", "precondition_failed"):
                etag = self.store.put(
                    key, tomb.to_json(), if_match=planned, if_none_match=not planned
                )
        except ObjectNotFoundError:
            return False  # If-Match on a marker gone since the listing
        except (PreconditionFailedError, TransientStoreError) as exc:
            found = read_tombstone(self.store, key)  # our PUT, its reply lost?
            if found is None or found[0] != tomb:
                if isinstance(exc, TransientStoreError):
                    raise
                return False
            etag = found[1] or ""
        self._fences[c.name] = (tomb, etag)
        return True

    def unfence(self, c: CheckpointInfo) -> None:
        """After every key of ``c`` is gone: delete its tombstone (only while it is still
        ours, where the store has ``DeleteObject If-Match``), or, when it must stay (a
        reaped save may be paused: ``keep``), rewrite it ``done``: the prefix is gone."""
        fence = self._fences.pop(c.name)
        if fence is None:
            return
        tomb, etag = fence
        key = c.url.key(MANIFEST_NAME)
        self._count("marker")
        if tomb.keep:
            done = tomb.finished()
            try:
                with expecting("precondition_failed"):
                    self.store.put(key, done.to_json(), if_match=etag or None)
            except (PreconditionFailedError, TransientStoreError):
                found = read_tombstone(self.store, key)
                if found is None or found[0] != done:
                    raise
            return
        if etag and self._conditional_delete:
            try:
                with expecting("not_found", "precondition_failed"):
                    self.store.delete_if_match(key, etag)
            except UnsupportedOperationError:  # not enforced after all: a plain delete below
                self._conditional_delete = False
            except (PreconditionFailedError, ObjectNotFoundError, TransientStoreError):
                if self.store.head(key) is not None:  # else ours, its reply lost: gone
                    raise
        if not etag or not self._conditional_delete:
            errs = self.store.delete([key])
            if errs:
                raise StoreError(errs[0].message, key=key, code=errs[0].code, operation="delete")
        self.deleted_keys += 1

    def _count(self, phase: str) -> None:
        if self.lease is not None:
            self.lease.renew_if_due()
        self.requests += 1
        self.options.progress("delete", phase=phase, keys=1)

    def counts(self) -> dict[str, Any]:
        """What a result reports of the deletions: ``failures``, ``delete_requests``,
        ``keys_deleted`` and ``aborted``."""
        return {
            "failures": tuple(self.failures),
            "delete_requests": self.requests,
            "keys_deleted": self.deleted_keys,
            "aborted": self.aborted,
        }

    def changed_notes(self) -> tuple[str, ...]:
        """One note per checkpoint skipped because it changed after the scan."""
        return tuple(
            f"{name} changed after it was planned (an overwrite committed a new marker): "
            "skipped, nothing of it deleted"
            for name in self.changed
        )

    @cached_property
    def _conditional_delete(self) -> bool:
        """Whether the store enforces ``DeleteObject If-Match`` (probed, and cached, when the
        lease was taken: :meth:`~s3ckpt.retention.Lease.acquire`); False once it refused."""
        caps = cached_capabilities(self.store)
        return bool(caps is not None and caps.conditional_delete)

    def abort(self, uploads: Sequence[UploadInfo]) -> set[str]:
        """Abort ``uploads``; return the upload ids that could not be aborted."""
        bad: set[str] = set()
        for u in uploads:
            if self.lease is not None:
                self.lease.renew_if_due()
            try:
                self.store.abort_multipart(u.key, u.upload_id)
                self.aborted += 1
            except StoreError as exc:
                bad.add(u.upload_id)
                self.failures.append(failure(u.key, exc))
        return bad

    def delete_checkpoints(
        self,
        targets: Sequence[CheckpointInfo],
        keys_of: Callable[[CheckpointInfo], list[str]] = checkpoint_keys,
        uploads_of: Callable[[CheckpointInfo], list[UploadInfo]] = checkpoint_uploads,
    ) -> tuple[str, ...]:
        """Fence every target first (:meth:`fence`), then delete the plain and committed
        ``.metadata``, then the rest and the uploads, then lift or finish each fence
        (:meth:`unfence`); return the names fully deleted (every key s3ckpt may delete is
        gone). A checkpoint whose marker changed since the scan goes to :attr:`changed`,
        and nothing of it is deleted; one whose keys could not all be deleted keeps its
        unfinished tombstone (being deleted: the next prune, gc or rm finishes it). gc passes
        its own ``keys_of`` and ``uploads_of`` (what it may delete of a dead save)."""
        keys = {c.name: keys_of(c) for c in targets}
        markers = {c.name: c.url.key(MANIFEST_NAME) for c in targets}
        alive: list[CheckpointInfo] = []
        bad: set[str] = set()
        for c in targets:
            try:
                if self.fence(c, keys[c.name]):
                    alive.append(c)
                else:
                    self.changed.append(c.name)
            except StoreError as exc:  # nothing of c deleted: its keys stay out of ``bad``
                self.failures.append(failure(markers[c.name], exc))
        metas = [k for c in alive for k in keys[c.name] if _is_first_metadata(c, k)]
        bad |= self.delete(metas, "metadata")
        first = {markers[c.name] for c in targets} | set(metas)
        data = [k for c in alive for k in keys[c.name] if k not in first]
        bad |= self.delete(data, "data")
        ups = {c.name: uploads_of(c) for c in alive}
        bad_ups = self.abort([u for c in alive for u in ups[c.name]])
        done = []
        for c in alive:
            if not bad.isdisjoint(keys[c.name]) or any(u.upload_id in bad_ups for u in ups[c.name]):
                continue
            try:
                self.unfence(c)
            except StoreError as exc:
                self.failures.append(failure(markers[c.name], exc))
                continue
            done.append(c.name)
        return tuple(done)
