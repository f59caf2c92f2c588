"""``s3ckpt restore`` as a library: :func:`restore_checkpoint` asks S3 for a temporary copy
of every archived object (``GLACIER``, ``DEEP_ARCHIVE``) of a checkpoint, or of every
committed checkpoint of a run, and can wait until each copy is readable.

Decisions:

* **Which objects.** A committed checkpoint's objects are the ones its marker names, and
  its ``.metadata`` copies (plain and per-save); a checkpoint without a marker (stock DCP)
  is its listing. The marker itself and the control objects are never archived by a tier,
  so they are read at once. A URL with neither a marker nor a ``.metadata`` is a run:
  every committed checkpoint under it with archived bytes
  (:func:`~s3ckpt.retention.list_checkpoints`).
* **Which requests.** One LIST of the checkpoint's prefix gives the classes of what lies
  under it; an object elsewhere (a hashed-prefix shard) costs a HEAD. RestoreObject goes
  to every archived object, several at a time; each answer is a
  :class:`~s3ckpt.store.base.RestoreState` (asking again is harmless: S3 answers "in
  progress", or extends a finished copy to ``days`` from now). ``wait`` then HEADs the
  objects still being restored every ``poll_seconds`` until each says
  ``ongoing-request="false"``.
* **Failures are per object.** A refused restore (a tier the class does not offer, ...) is
  recorded on its object and the rest go on (``s3ckpt restore`` exits 1); a store that
  refuses everything (credentials, bucket, endpoint) ends the call.

No torch: the retention image runs it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from typing import Any

from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.errors import (
    AccessDeniedError,
    CheckpointNotFoundError,
    EndpointError,
    NoSuchBucketError,
    StoreError,
)
from s3ckpt.format._manifest import Manifest
from s3ckpt.format._names import MANIFEST_NAME, METADATA_NAME
from s3ckpt.metrics.instrument import in_context
from s3ckpt.retention import list_checkpoints
from s3ckpt.retention._catalog import CheckpointState
from s3ckpt.store import Location, ObjectStore
from s3ckpt.store._location import LocationLike
from s3ckpt.store.base import (
    ARCHIVE_CLASSES,
    RestoreState,
    archive_store,
    check_restore_args,
    restore_state,
)
from s3ckpt.tools._open import as_location
from s3ckpt.uri import StoreURL

__all__ = ["CheckpointRestore", "ObjectRestore", "RestoreResult", "restore_checkpoint"]

_PENDING = (RestoreState.STARTED, RestoreState.IN_PROGRESS, RestoreState.ARCHIVED)
_WORKERS = 8


@dataclass(frozen=True)
class ObjectRestore:
    """One object of a checkpoint and where its restore stands."""

    key: str
    size: int
    storage_class: str | None
    """As the listing or a HEAD said (None: ``STANDARD``)."""
    state: RestoreState
    error: str | None = None
    """Why the restore request failed (``state`` is then ``ARCHIVED``)."""

    def to_dict(self) -> dict[str, Any]:
        """Stable JSON keys."""
        cls = self.storage_class or "STANDARD"
        return {**asdict(self), "storage_class": cls, "state": self.state.value}


@dataclass(frozen=True)
class CheckpointRestore:
    """One checkpoint's objects."""

    url: str
    objects: tuple[ObjectRestore, ...]

    def to_dict(self) -> dict[str, Any]:
        """Stable JSON keys."""
        return {"url": self.url, "objects": [o.to_dict() for o in self.objects]}


@dataclass(frozen=True)
class RestoreResult:
    """What :func:`restore_checkpoint` asked for and where each object stands."""

    url: str
    days: int
    tier: str
    checkpoints: tuple[CheckpointRestore, ...]
    waited: bool
    seconds: float

    @property
    def objects(self) -> list[ObjectRestore]:
        """Every object of every checkpoint."""
        return [o for c in self.checkpoints for o in c.objects]

    @property
    def counts(self) -> dict[str, int]:
        """Objects per state (``started``, ``in_progress``, ``restored``, ``not_archived``,
        ``archived``: a request that failed)."""
        return {s.value: sum(o.state is s for o in self.objects) for s in RestoreState}

    @property
    def bytes(self) -> dict[str, int]:
        """Bytes per state, as :attr:`counts`."""
        return {s.value: sum(o.size for o in self.objects if o.state is s) for s in RestoreState}

    @property
    def failed(self) -> list[ObjectRestore]:
        """The objects whose restore request failed."""
        return [o for o in self.objects if o.error is not None]

    @property
    def readable(self) -> bool:
        """Whether every object reads now (restored or never archived)."""
        ready = (RestoreState.RESTORED, RestoreState.NOT_ARCHIVED)
        return all(o.state in ready for o in self.objects)

    def to_dict(self) -> dict[str, Any]:
        """Stable JSON keys (``s3ckpt restore --json``)."""
        return {
            "url": self.url,
            "days": self.days,
            "tier": self.tier,
            "waited": self.waited,
            "seconds": round(self.seconds, 3),
            "readable": self.readable,
            "counts": self.counts,
            "bytes": self.bytes,
            "failed": [o.to_dict() for o in self.failed],
            "checkpoints": [c.to_dict() for c in self.checkpoints],
        }


def restore_checkpoint(
    target: LocationLike,
    *,
    days: int = 7,
    tier: str = "Standard",
    wait: bool = False,
    poll_seconds: float = 300.0,
    progress: Callable[[int, int], None] | None = None,
    s3_config: S3Config | None = None,
    transfer_config: TransferConfig | None = None,
    store: ObjectStore | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> RestoreResult:
    """Restore every archived object of the checkpoint (or run) at ``target`` for
    ``days`` days, at retrieval ``tier`` (``Standard``, ``Bulk``, ``Expedited``).

    Args:
        wait: Poll (HEAD) the objects being restored every ``poll_seconds`` until each is
            readable (S3 Standard takes hours; Ctrl-C stops waiting, the restores go on).
        progress: ``progress(done, total)`` in bytes of archived objects: asked for, then
            (``wait``) restored.

    Raises:
        ConfigError: ``days`` < 1 or an unknown ``tier`` (before any request), or a store
            without storage classes.
        CheckpointNotFoundError: Nothing at ``target``: no checkpoint, no run.
        StoreError: The store refused (credentials, bucket, endpoint).

    Request cost: a GET of the marker, a HEAD of ``.metadata``, a LIST per checkpoint (a run:
    its listing and a GET per marker first), a HEAD per object outside the checkpoint's prefix,
    one RestoreObject per archived object, and with ``wait`` a HEAD per object being restored
    per poll.
    """
    check_restore_args(days, tier)
    if not poll_seconds > 0:
        raise ValueError(f"poll_seconds must be > 0, got {poll_seconds!r}")
    started = time.monotonic()
    how: dict[str, Any] = dict(s3_config=s3_config, transfer_config=transfer_config, store=store)
    location = as_location(target, **how)
    checkpoints = [_objects(location.at(u)) for u in _checkpoints(location)]
    objects = [o for c in checkpoints for o in c.objects]
    total = sum(o.size for o in objects if o.state is not RestoreState.NOT_ARCHIVED)
    done = [0]

    def ask(obj: ObjectRestore) -> ObjectRestore:
        if obj.state is RestoreState.NOT_ARCHIVED:  # (a listed or HEADed class, no error yet)
            return obj
        try:
            archive = archive_store(location.store, obj.key, "restore_object")
            out = replace(obj, state=archive.restore_object(obj.key, days=days, tier=tier))
        except (AccessDeniedError, NoSuchBucketError, EndpointError):  # the whole store refuses
            raise
        except StoreError as exc:
            out = replace(obj, error=str(exc))
        done[0] += obj.size
        if progress is not None:
            progress(done[0], total)
        return out

    def poll(obj: ObjectRestore) -> ObjectRestore:
        info = location.store.head(obj.key)
        return obj if info is None else replace(obj, state=restore_state(info))

    with ThreadPoolExecutor(_WORKERS, thread_name_prefix="s3ckpt-restore") as pool:
        states = {o.key: o for o in pool.map(in_context(ask), objects)}
        # With wait, HEAD the objects still being restored every poll_seconds until none is
        asked = [o for o in states.values() if o.state is not RestoreState.NOT_ARCHIVED]
        total = sum(o.size for o in asked if o.error is None)
        while wait:
            pending = [o for o in states.values() if o.error is None and o.state in _PENDING]
            if progress is not None:
                progress(total - sum(o.size for o in pending), total)
            if not pending:
                break
            sleep(poll_seconds)
            states.update((o.key, o) for o in pool.map(in_context(poll), pending))
    checkpoints = [replace(c, objects=tuple(states[o.key] for o in c.objects)) for c in checkpoints]
    elapsed = time.monotonic() - started
    return RestoreResult(str(location.url), days, tier, tuple(checkpoints), wait, elapsed)


def _checkpoints(location: Location) -> list[StoreURL]:
    """The checkpoint URLs at ``location``: itself when it holds a marker or a
    ``.metadata``, else every committed checkpoint of the run with archived bytes."""
    store, url = location.store, location.url
    if any(store.head(url.key(name)) is not None for name in (MANIFEST_NAME, METADATA_NAME)):
        return [url]
    found = list_checkpoints(location)
    if not found:
        raise CheckpointNotFoundError(
            f"nothing to restore at {url}: no checkpoint (no {MANIFEST_NAME} or "
            f"{METADATA_NAME}) and no run with checkpoints; check the URL (`s3ckpt ls` lists "
            "runs and checkpoints)",
            bucket=store.bucket,
            key=url.prefix,
        )
    return [
        c.url
        for c in found
        if c.state is CheckpointState.COMMITTED
        and any(cls in ARCHIVE_CLASSES for cls, n in c.bytes_by_class.items() if n)
    ]


def _objects(location: Location) -> CheckpointRestore:
    """The checkpoint's objects, each with its class (listing, or HEAD outside it)."""
    store, url = location.store, location.url
    listed = {i.key: i for i in store.list(url.prefix)}
    marker = listed.get(url.key(MANIFEST_NAME))
    keys: Iterable[str] = sorted(listed)
    if marker is not None:
        manifest = Manifest.from_json(store.get(marker.key), where=marker.key)
        names = {url.key(n) for n, _, _ in manifest.controls} | {url.key(METADATA_NAME)}
        keys = sorted(names | {manifest.object_key(url.prefix, o.name) for o in manifest.objects})
    infos = ((key, listed.get(key) or store.head(key)) for key in keys)  # a shard: a HEAD
    # (None: a .metadata copy that is not there, the plain one of an old save)
    objects = [ObjectRestore(k, i.size, i.storage_class, restore_state(i)) for k, i in infos if i]
    return CheckpointRestore(str(url), tuple(objects))
