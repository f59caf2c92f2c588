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
from collections.abc import Sequence
from dataclasses import dataclass, field

from tenacity import retry_if_result

from s3ckpt._tombstone import tombstone_body
from s3ckpt.config import TransferConfig
from s3ckpt.errors import (
    ObjectNotFoundError,
    PreconditionFailedError,
    StoreError,
    TransientStoreError,
    UnsupportedOperationError,
)
from s3ckpt.format import HEARTBEAT_PREFIX, MANIFEST_NAME, METADATA_NAME, owned_tag, shard_owner
from s3ckpt.metrics.instrument import expecting
from s3ckpt.retention._catalog import CheckpointInfo
from s3ckpt.retention._lease import Lease
from s3ckpt.retention._options import RetentionOptions
from s3ckpt.store import TRANSIENT_CODES, cached_capabilities, probe_capabilities, retrying
from s3ckpt.store.base import DeleteFailure, ObjectStore, UploadInfo

__all__ = [
    "Deleter",
    "checkpoint_keys",
    "checkpoint_uploads",
    "leftover_keys",
    "leftover_uploads",
]

_BACKOFF = TransferConfig(retry_initial_delay=0.1, retry_max_delay=5.0)
"""Back-off between rounds of per-key retries: 0.1 s doubling up to 5 s, full jitter."""

_DCP_DATA = re.compile(r"__\d+_\d+\.distcp")
"""Stock DCP data names (``FileSystemWriter``); deleted only with ``include_foreign``."""


# -- what may be deleted -----------------------------------------------------------------------
def _direct_name(c: CheckpointInfo, key: str) -> str | None:
    """``key``'s name relative to the checkpoint prefix when it lies directly under it."""
    prefix = c.url.prefix
    if not key.startswith(prefix):
        return None
    name = key[len(prefix) :]
    return name if name and "/" not in name else None


def _own_name(c: CheckpointInfo, key: str) -> tuple[str, str | None, bool] | None:
    """``key``'s name in checkpoint ``c``, the save tag the name carries (None for names
    without one), and whether it is one of ``c``'s data objects in the run's shard folder
    (hashed prefixes, :func:`s3ckpt.format.shard_owner`); None for any other key (nested
    under the prefix, or not ``c``'s)."""
    name = _direct_name(c, key)
    if name is not None:
        return name, owned_tag(name), False
    owner = shard_owner(key)
    if owner is not None and owner.checkpoint == c.url.prefix:
        return owner.name, owner.tag, True
    return None


def _other_live(c: CheckpointInfo) -> set[str]:
    return {t for t in c.live_tags if t != c.tag}


def checkpoint_keys(c: CheckpointInfo) -> list[str]:
    """The keys deleting checkpoint ``c`` removes: the marker, the plain ``.metadata``, what
    the marker commits, and every per-save name of a tag that is not live (a save in
    progress in the same prefix, an overwrite, is left alone); for an uncommitted
    checkpoint also stock DCP data names. Never a file s3ckpt or DCP did not write. The data
    objects of hashed-prefix saves in the run's shard folder count as the checkpoint's own
    per-save names."""
    live = _other_live(c)
    out: list[str] = []
    for k in c.keys:
        own = _own_name(c, k)
        if own is None:
            continue
        n, t, _ = own
        if k in c.committed_keys or n in (MANIFEST_NAME, METADATA_NAME):
            out.append(k)
            continue
        if t is not None:
            if t not in live:
                out.append(k)
        elif not c.is_committed and _DCP_DATA.fullmatch(n):
            out.append(k)
    return out


def checkpoint_uploads(c: CheckpointInfo) -> list[UploadInfo]:
    """Open uploads of per-save names of tags that are not live (other than committed)."""
    live = _other_live(c)
    out = []
    for u in c.uploads:
        own = _own_name(c, u.key)
        t = own[1] if own is not None else None
        if t is not None and t not in live:
            out.append(u)
    return out


def leftover_keys(c: CheckpointInfo) -> list[str]:
    """What gc may delete under ``c``: per-save names of dead tags, never what a readable
    marker commits; in a committed prefix also the committed save's heartbeats. Nothing in
    a pinned prefix, nothing in a committed one whose marker cannot be read, and no data
    object of the committed save in the shard folder (even one the marker does not list)."""
    if c.pinned or (c.is_committed and c.tag is None):
        return []
    live = set(c.live_tags)
    out: list[str] = []
    for k in c.keys:
        own = _own_name(c, k)
        if own is None or own[1] is None or k in c.committed_keys:
            continue
        n, t, sharded = own
        if sharded and t == c.tag:
            continue
        if t not in live or (t == c.tag and n.startswith(HEARTBEAT_PREFIX)):
            out.append(k)
    return out


def leftover_uploads(c: CheckpointInfo, cutoff: float) -> list[UploadInfo]:
    """Open uploads of per-save names whose tag is dead and that started before ``cutoff``
    (a dead tag's upload can never become committed data). None in a pinned prefix."""
    if c.pinned:
        return []
    live = set(c.live_tags)
    out = []
    for u in c.uploads:
        own = _own_name(c, u.key)
        t = own[1] if own is not None else None
        if t is not None and t not in live and u.initiated is not None and u.initiated < cutoff:
            out.append(u)
    return out


def _is_first_metadata(c: CheckpointInfo, key: str) -> bool:
    """The plain ``.metadata`` or the committed metadata (deleted right after the marker)."""
    n = _direct_name(c, key)
    if n == METADATA_NAME:
        return True
    return n is not None and n.startswith(METADATA_NAME + ".") and key in c.committed_keys


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
    requests: int = 0
    deleted_keys: int = 0
    aborted: int = 0
    failures: list[DeleteFailure] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    """Checkpoints skipped because their marker changed after the scan."""
    _conditional: bool | None = field(default=None, repr=False)

    def delete(self, keys: Sequence[str], phase: str) -> set[str]:
        """Delete ``keys``; return the keys that failed for good.

        Keys that failed with a transient code (:data:`~s3ckpt.store.TRANSIENT_CODES`)
        are sent again in up to ``retries`` more rounds, backing off between rounds as
        s3ckpt's one retry policy does (:func:`~s3ckpt.store.retrying`), without a deadline.
        """
        pending = list(keys)
        failed: dict[str, DeleteFailure] = {}

        def one_round() -> list[str]:
            nonlocal pending
            pending = self._round(pending, failed, phase)
            return pending

        rounds = retrying(
            _BACKOFF,
            retry=retry_if_result(bool),
            sleep=self.options.sleep,
            attempts=self.options.retries + 1,
            deadline=False,
        )
        # Keys still pending after the last round stay in ``failed``: no RetryError.
        rounds.copy(retry_error_callback=lambda state: None)(one_round)
        self.failures.extend(failed.values())
        return set(failed)

    def _round(self, pending: list[str], failed: dict[str, DeleteFailure], phase: str) -> list[str]:
        """Send ``pending`` in batches; record failures in ``failed``; return the keys worth
        another round."""
        retry: list[str] = []
        size = self.options.batch_size
        for i in range(0, len(pending), size):
            chunk = pending[i : i + size]
            if self.lease is not None:
                self.lease.renew_if_due()
            try:
                errs = self.store.delete(chunk)
            except StoreError as exc:  # the whole request failed (after S3Store retries)
                errs = [DeleteFailure(k, exc.code or type(exc).__name__, str(exc)) for k in chunk]
            self.requests += 1
            bad = {e.key for e in errs}
            self.deleted_keys += sum(1 for k in chunk if k not in bad)
            for e in errs:
                failed[e.key] = e
                if e.code in TRANSIENT_CODES:
                    retry.append(e.key)
            for k in chunk:
                if k not in bad:
                    failed.pop(k, None)
            if self.options.on_progress is not None:
                self.options.on_progress("delete", {"phase": phase, "keys": len(chunk)})
        return retry

    def _delete_marker(self, key: str, etag: str) -> bool:
        """Delete the marker ``key`` if its ETag is still ``etag``: True when it is gone,
        False when it changed (an overwrite committed after the scan).

        ``DeleteObject If-Match`` where the store enforces it; elsewhere a tombstone is
        swapped in first (``PUT If-Match``, :mod:`s3ckpt._tombstone`), which no overwrite
        replaces, and then deleted. A 404 or 412 (a retry of our own applied request
        among them) is decided by reading the marker back.
        """
        if self.lease is not None:
            self.lease.renew_if_due()
        self.requests += 1
        if self.options.on_progress is not None:
            self.options.on_progress("delete", {"phase": "marker", "keys": 1})
        # A 404 or 412 is the marker changed or gone since the scan, decided below.
        if self._conditional_delete():
            try:
                with expecting("not_found", "precondition_failed"):
                    self.store.delete_if_match(key, etag)
                self.deleted_keys += 1
                return True
            except UnsupportedOperationError:
                self._conditional = False  # fall back to the tombstone from here on
            except (PreconditionFailedError, ObjectNotFoundError):
                return self._gone(key)
        body = tombstone_body(self.lease.owner if self.lease is not None else uuid.uuid4().hex)
        try:
            with expecting("not_found", "precondition_failed"):
                self.store.put(key, body, if_match=etag)
        except ObjectNotFoundError:
            return self._gone(key)
        except (PreconditionFailedError, TransientStoreError) as exc:
            try:
                ours = self.store.get(key) == body  # our swap, its reply lost?
            except ObjectNotFoundError:
                return True
            if not ours:
                if isinstance(exc, TransientStoreError):
                    raise  # not applied (yet): a failure, not a change
                return False
        self.requests += 1
        errs = self.store.delete([key])
        if errs:
            raise StoreError(errs[0].message, key=key, code=errs[0].code, operation="delete")
        self.deleted_keys += 1
        return True

    def changed_notes(self) -> tuple[str, ...]:
        """One note per checkpoint skipped because it changed after the scan."""
        return tuple(
            f"{name} changed after it was planned (an overwrite committed a new marker): "
            "skipped, nothing of it deleted"
            for name in self.changed
        )

    def _gone(self, key: str) -> bool:
        """After a 404/412 of a conditional request: gone (True) or changed (False)."""
        return self.store.head(key) is None

    def _conditional_delete(self) -> bool:
        """Whether the store enforces ``DeleteObject If-Match`` (probed with the lease)."""
        if self._conditional is None:
            caps = cached_capabilities(self.store)
            if (caps is None or not caps.delete_probed) and self.lease is not None:
                caps = probe_capabilities(self.store, self.lease.key, probe_delete=True)
            self._conditional = bool(caps is not None and caps.conditional_delete)
        return self._conditional

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
                self.failures.append(DeleteFailure(u.key, exc.code or type(exc).__name__, str(exc)))
        return bad

    def delete_checkpoints(self, targets: Sequence[CheckpointInfo]) -> tuple[str, ...]:
        """Marker first (only while it is the one planned: :meth:`_delete_marker`), then
        the plain and committed ``.metadata``, then the rest and the uploads; return the
        names fully deleted (every key s3ckpt may delete is gone). A checkpoint whose
        marker changed since the scan goes to :attr:`changed`, and nothing of it is deleted."""
        keys = {c.name: checkpoint_keys(c) for c in targets}
        markers = {c.name: c.url.key(MANIFEST_NAME) for c in targets}
        present = [c for c in targets if markers[c.name] in keys[c.name]]
        unknown = [markers[c.name] for c in present if c.marker_etag is None]
        bad = self.delete(unknown, "marker")  # a store that lists no ETags: as before
        for c in present:
            if c.marker_etag is None:
                continue
            try:
                if not self._delete_marker(markers[c.name], c.marker_etag):
                    self.changed.append(c.name)
            except StoreError as exc:
                bad.add(markers[c.name])
                code = exc.code or type(exc).__name__
                self.failures.append(DeleteFailure(markers[c.name], code, str(exc)))
        alive = [c for c in targets if markers[c.name] not in bad and c.name not in self.changed]
        metas = [k for c in alive for k in keys[c.name] if _is_first_metadata(c, k)]
        bad |= self.delete(metas, "metadata")
        first = {markers[c.name] for c in present} | set(metas)
        data = [k for c in alive for k in keys[c.name] if k not in first]
        bad |= self.delete(data, "data")
        ups = {c.name: checkpoint_uploads(c) for c in alive}
        bad_ups = self.abort([u for c in alive for u in ups[c.name]])
        return tuple(
            c.name
            for c in alive
            if not any(k in bad for k in keys[c.name])
            and not any(u.upload_id in bad_ups for u in ups[c.name])
        )
