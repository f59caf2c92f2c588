"""The catalog: which checkpoints a run holds, and in what state.

Layout (decided with the Checkpointer): a *run* is a prefix, and every checkpoint is an
immediate sub-prefix of it (``{run}/step_000001000/``). Besides checkpoints a run holds
*control objects*, which are never checkpoints and never deleted by retention:

* ``{run}/s3ckpt.latest.json`` — the Checkpointer's pointer to the latest checkpoint;
* ``{run}/s3ckpt.lease`` — the pruner's lease (:mod:`s3ckpt.retention._lease`);
* ``{ckpt}/s3ckpt.pin.json`` — a pin on one checkpoint (``s3ckpt pin``).

A sub-prefix counts as a checkpoint when it holds (as an object or as an open multipart
upload) a commit marker (``s3ckpt.json``), a DCP ``.metadata``, a ``*.distcp`` data object,
one of s3ckpt's per-save names (:func:`s3ckpt.format.owned_tag`: ``.metadata.{tag}``,
heartbeats ``s3ckpt.alive.{tag}.{rank}``) or a pin. Its name alone never makes it one: a
``step_<digits>/`` folder holding only foreign files (TensorBoard events, a safetensors
export) is not retention's business, and neither is any other folder under a run
(``tensorboard/``, ``logs/``); they are never listed, planned or deleted.

Saves and liveness. Every object and upload a save creates carries the save's 8-hex *tag*
(see :mod:`s3ckpt.format`). A tag is *live* while any of its objects (heartbeats included:
each writing rank rewrites one every ``HEARTBEAT_INTERVAL``) or open uploads is younger than
the grace period; a save uploading one large object for hours stays live through its
heartbeats. ``live_tags`` lists them; a live tag other than the committed one is a save in
progress (``live_saves``), in a committed prefix an overwrite.

States:

* ``COMMITTED`` — the commit marker is present.
* ``IN_PROGRESS`` — no marker, and a tag is live or the newest sign of activity (an
  object's mtime, or an open multipart upload's start) is younger than the grace period.
* ``FOREIGN`` — no marker but a DCP ``.metadata``, and older than the grace period: a
  checkpoint written by stock DCP or another tool. Never deleted unless asked
  (``include_foreign``), never removed by ``gc`` (which only reclaims s3ckpt's per-save
  names of dead tags in it).
* ``ABANDONED`` — no marker, no ``.metadata``, nothing live: a save that died. Only ``gc``
  removes these, and only the names s3ckpt wrote.

Order is by step, then commit time, then name; never by object mtime (a copied or restored
bucket rewrites every mtime).
"""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from s3ckpt.errors import CorruptCheckpointError, ObjectNotFoundError, StoreError
from s3ckpt.format import (
    HEARTBEAT_PREFIX,
    MANIFEST_NAME,
    METADATA_NAME,
    MIN_GRACE_SECONDS,
    Manifest,
    owned_tag,
)
from s3ckpt.retention._duration import format_duration
from s3ckpt.store.base import ObjectInfo, ObjectStore, UploadInfo
from s3ckpt.uri import StoreURL

__all__ = [
    "DEFAULT_GRACE",
    "LATEST_NAME",
    "LEASE_NAME",
    "MIN_GRACE",
    "PIN_NAME",
    "CheckpointInfo",
    "CheckpointState",
    "RunCatalog",
    "list_checkpoints",
    "list_runs",
    "scan",
]

LATEST_NAME = "s3ckpt.latest.json"
"""Run-level pointer to the latest checkpoint (written by the Checkpointer)."""
LEASE_NAME = "s3ckpt.lease"
"""Run-level pruner lease."""
PIN_NAME = "s3ckpt.pin.json"
"""Per-checkpoint pin: ``{"reason": ..., "pinned_at": ..., "by": ...}``."""

DEFAULT_GRACE = timedelta(hours=2)
"""How long a save (a tag) counts as in progress after its last activity."""
MIN_GRACE = timedelta(seconds=MIN_GRACE_SECONDS)
"""The floor prune and gc raise a shorter grace period to (four missed heartbeats)."""

RUN_CONTROL_NAMES = frozenset({LATEST_NAME, LEASE_NAME})
_CKPT_CONTROL_NAMES = frozenset({PIN_NAME})
_STEP_RE = re.compile(r"step_(\d+)")
_MARKER_WORKERS = 16


class CheckpointState(str, enum.Enum):
    """What a checkpoint prefix is; see the module docstring."""

    COMMITTED = "committed"
    IN_PROGRESS = "in_progress"
    ABANDONED = "abandoned"
    FOREIGN = "foreign"

    def __str__(self) -> str:
        return self.value


_NO_TIME = datetime.min.replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint prefix of a run, as the catalog sees it.

    Attributes:
        url: The checkpoint's prefix (``s3://bucket/run/step_000001000/``).
        name: The sub-prefix name under the run, without the slash (unique in a run).
        step: From the commit marker when there is one, else parsed from ``step_<n>``.
        state: See :class:`CheckpointState`.
        committed_at: The marker's ``created`` time (UTC); for ``FOREIGN`` checkpoints the
            ``.metadata`` object's mtime (the only commit time stock DCP leaves); else None.
        size: Bytes under the prefix (control objects excluded).
        num_objects: Objects under the prefix (control objects excluded).
        metrics: From the marker (empty without one).
        pinned: The pin's reason, or None if not pinned.
        last_activity: Newest object mtime or open-upload start under the prefix (UTC);
            used only to tell IN_PROGRESS from ABANDONED, never to order.
        error: Why the marker could not be read, when it could not (still COMMITTED).
        keys: Every key under the prefix (control objects and foreign files included). Retention
            deletes only the ones s3ckpt (or, with ``include_foreign``, DCP) wrote.
        tag: The committed save's tag (from the marker), else None.
        live_tags: Tags with an object, heartbeat or open upload younger than the grace period.
        uploads: Open multipart uploads under the prefix.
        committed_keys: Keys the marker commits (the marker, its metadata, its objects).
        metadata_stale: Committed with a per-save metadata, and the plain ``.metadata`` (the
            copy for stock DCP readers) is missing, of the wrong size or older than the marker.
    """

    url: StoreURL
    name: str
    step: int | None
    state: CheckpointState
    committed_at: datetime | None
    size: int
    num_objects: int
    metrics: Mapping[str, float] = field(default_factory=dict)
    pinned: str | None = None
    last_activity: datetime | None = None
    error: str | None = None
    keys: tuple[str, ...] = field(default=(), repr=False, compare=False)
    tag: str | None = None
    live_tags: tuple[str, ...] = ()
    uploads: tuple[UploadInfo, ...] = field(default=(), repr=False, compare=False)
    committed_keys: frozenset[str] = field(default=frozenset(), repr=False, compare=False)
    metadata_stale: bool = False

    @property
    def is_committed(self) -> bool:
        """Whether the commit marker is present."""
        return self.state is CheckpointState.COMMITTED

    @property
    def live_saves(self) -> int:
        """Saves in progress under the prefix: live tags other than the committed one."""
        return sum(1 for t in self.live_tags if t != self.tag)

    @property
    def overwrite_in_progress(self) -> bool:
        """Committed, and another save is writing into the same prefix."""
        return self.is_committed and self.live_saves > 0

    def sort_key(self) -> tuple[int, int, datetime, str]:
        """(has a step, step, commit time, name): the catalog's order, oldest first.

        Commit times are timezone-aware (UTC) everywhere in s3ckpt; a missing one sorts first.
        """
        at = self.committed_at if self.committed_at is not None else _NO_TIME
        return (0 if self.step is None else 1, self.step or 0, at, self.name)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (used by ``s3ckpt ls --json``)."""
        return {
            "url": str(self.url),
            "name": self.name,
            "step": self.step,
            "state": self.state.value,
            "committed_at": _iso(self.committed_at),
            "size": self.size,
            "num_objects": self.num_objects,
            "metrics": {k: _json_float(v) for k, v in self.metrics.items()},
            "pinned": self.pinned,
            "last_activity": _iso(self.last_activity),
            "error": self.error,
            "tag": self.tag,
            "live_saves": self.live_saves,
            "overwrite_in_progress": self.overwrite_in_progress,
            "open_uploads": len(self.uploads),
        }


@dataclass(frozen=True)
class RunCatalog:
    """The checkpoints of one run, oldest first."""

    run: StoreURL
    checkpoints: tuple[CheckpointInfo, ...]
    has_lease: bool = False

    def by_name(self) -> dict[str, CheckpointInfo]:
        """Checkpoints by name."""
        return {c.name: c for c in self.checkpoints}


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat().replace("+00:00", "Z")


def _json_float(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)


def _utc(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, tz=timezone.utc)


def _check_now(now: datetime | None) -> datetime:
    if now is None:
        return datetime.now(timezone.utc)
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware (e.g. datetime.now(timezone.utc))")
    return now


@dataclass
class _Group:
    """Objects of one checkpoint prefix while scanning."""

    keys: list[str] = field(default_factory=list)
    size: int = 0
    count: int = 0
    newest: float | None = None
    marker: ObjectInfo | None = None
    metadata: ObjectInfo | None = None
    pin: bool = False
    tags: dict[str, float] = field(default_factory=dict)
    """Newest activity per save tag (objects, heartbeats and uploads directly under it)."""
    untagged: float | None = None
    """Newest activity of everything else (stock DCP names, foreign files, nested keys)."""
    heartbeats: dict[str, list[str]] = field(default_factory=dict)
    """Heartbeat keys per tag."""
    dead: set[str] = field(default_factory=set)
    """Tags whose writing process is provably gone (see s3ckpt._commit.writer_gone)."""
    uploads: list[UploadInfo] = field(default_factory=list)

    def touch(self, when: float | None, tag: str | None = None) -> None:
        if when is None:
            return
        self.newest = when if self.newest is None else max(self.newest, when)
        if tag is not None:
            self.tags[tag] = max(self.tags.get(tag, when), when)
        else:
            self.untagged = when if self.untagged is None else max(self.untagged, when)


def _ckpt_dir(key: str) -> str | None:
    """The checkpoint prefix (ending in ``/``) a key declares: only a name s3ckpt or DCP
    writes does (a folder's name never does)."""
    head, sep, base = key.rpartition("/")
    if not sep:
        return None
    if (
        base in (MANIFEST_NAME, METADATA_NAME, PIN_NAME)
        or base.endswith(".distcp")
        or owned_tag(base) is not None
    ):
        return head + "/"
    return None


def effective_grace(grace: timedelta) -> tuple[timedelta, str | None]:
    """``grace`` raised to :data:`MIN_GRACE`, and a note saying so when it was."""
    if grace >= MIN_GRACE:
        return grace, None
    return MIN_GRACE, (
        f"grace {_fmt(grace)} is below the floor of {_fmt(MIN_GRACE)} (four missed "
        f"heartbeats); used {_fmt(MIN_GRACE)}, so no setting can delete a running save"
    )


def _fmt(d: timedelta) -> str:
    return format_duration(d) if d > timedelta(0) else format_duration(timedelta(0))


def _parent(prefix: str) -> str:
    """``a/b/c/`` -> ``a/b/``; ``c/`` -> ``""``."""
    return prefix[:-1].rpartition("/")[0] + "/" if "/" in prefix[:-1] else ""


def scan(
    store: ObjectStore,
    root: StoreURL,
    *,
    grace: timedelta = DEFAULT_GRACE,
    now: datetime | None = None,
    include_uploads: bool = True,
) -> list[RunCatalog]:
    """Every run under ``root`` (``root`` itself included when it is a run), with its
    checkpoints, from one paged listing.

    Open uploads count as activity (of their tag) and declare checkpoints too: a save that
    has only started multipart uploads lists as in progress.

    Request cost: ``ceil(objects / 1000)`` LIST requests for everything under ``root``,
    ``ceil(open uploads / 1000)`` LIST-uploads requests (``include_uploads``), and one GET
    per commit marker and per pin (16 in parallel). Nothing is HEADed.
    """
    now = _check_now(now)
    objects = list(store.list(root.prefix))
    uploads = list(store.list_multipart_uploads(root.prefix)) if include_uploads else []
    groups: dict[str, _Group] = {}
    for key in [o.key for o in objects] + [u.key for u in uploads]:
        d = _ckpt_dir(key)
        if d is not None and d.startswith(root.prefix):
            groups.setdefault(d, _Group())
    runs_with_lease: set[str] = set()
    for obj in objects:
        base = obj.key.rpartition("/")[2]
        if base == LEASE_NAME:
            runs_with_lease.add(obj.key[: -len(base)])
        g = _owner(groups, obj.key)
        if g is None:
            continue
        g.keys.append(obj.key)
        if base == PIN_NAME and _is_direct(obj.key, groups):
            g.pin = True
            continue
        g.size += obj.size
        g.count += 1
        direct = _is_direct(obj.key, groups)
        tag = owned_tag(base) if direct else None
        g.touch(obj.last_modified, tag)
        if tag is not None and base.startswith(HEARTBEAT_PREFIX):
            g.heartbeats.setdefault(tag, []).append(obj.key)
        if base == MANIFEST_NAME and direct:
            g.marker = obj
        if base == METADATA_NAME and direct:
            g.metadata = obj
    for up in uploads:
        g = _owner(groups, up.key)
        if g is not None:
            g.uploads.append(up)
            direct = _is_direct(up.key, groups)
            g.touch(up.initiated, owned_tag(up.key.rpartition("/")[2]) if direct else None)

    _find_dead_writers(store, groups, (now - grace).timestamp())
    markers = [d for d, g in groups.items() if g.marker]
    pins = [d for d, g in groups.items() if g.pin]
    manifests: dict[str, Manifest | str] = {}
    reasons: dict[str, str] = {}
    if markers or pins:
        with ThreadPoolExecutor(max_workers=_MARKER_WORKERS) as pool:
            for d, m in zip(
                markers, pool.map(lambda d: _read_manifest(store, d), markers), strict=True
            ):
                manifests[d] = m
            for d, r in zip(pins, pool.map(lambda d: _read_pin(store, d), pins), strict=True):
                if r is not None:
                    reasons[d] = r

    by_run: dict[str, list[CheckpointInfo]] = {}
    for d, g in groups.items():
        run = _parent(d)
        info = _info(root, run, d, g, manifests.get(d), reasons.get(d), grace, now)
        by_run.setdefault(run, []).append(info)
    for run_prefix in runs_with_lease:
        if run_prefix.startswith(root.prefix):
            by_run.setdefault(run_prefix, [])
    out = []
    for run_prefix in sorted(by_run):
        ckpts = sorted(by_run[run_prefix], key=CheckpointInfo.sort_key)
        out.append(
            RunCatalog(
                StoreURL(root.scheme, root.bucket, run_prefix),
                tuple(ckpts),
                has_lease=run_prefix in runs_with_lease,
            )
        )
    return out


_HEARTBEATS_CHECKED = 4
"""Heartbeats read per live-looking save (its lowest ranks, the coordinator among them)."""


def _find_dead_writers(store: ObjectStore, groups: Mapping[str, _Group], cutoff: float) -> None:
    """Mark tags that look live but whose writer process is provably gone (``_Group.dead``).

    A heartbeat names the host, PID namespace and pid that wrote it; on that same host a
    pid that no longer exists proves the save dead (a save that lost a rank never commits),
    so gc need not wait out the grace period after a kill. Elsewhere nothing is provable
    and the grace period decides. Request cost: one GET for each of at most
    :data:`_HEARTBEATS_CHECKED` heartbeats per live-looking save (16 in parallel).
    """
    todo: list[tuple[_Group, str, str]] = []
    for g in groups.values():
        for tag, keys in g.heartbeats.items():
            if g.tags.get(tag, 0.0) > cutoff:
                todo += [(g, tag, k) for k in sorted(keys, key=_rank_of)[:_HEARTBEATS_CHECKED]]
    if not todo:
        return
    from s3ckpt._commit import writer_gone

    def gone(key: str) -> bool:
        try:
            return writer_gone(store.get(key))
        except StoreError:
            return False  # vanished (its save committed) or unreadable: proves nothing

    with ThreadPoolExecutor(max_workers=_MARKER_WORKERS) as pool:
        for (g, tag, _), dead in zip(todo, pool.map(lambda t: gone(t[2]), todo), strict=True):
            if dead:
                g.dead.add(tag)


def _rank_of(key: str) -> int:
    tail = key.rpartition(".")[2]
    return int(tail) if tail.isdigit() else 0


def _owner(groups: Mapping[str, _Group], key: str) -> _Group | None:
    """The innermost checkpoint group whose prefix holds ``key``."""
    head = key
    while "/" in head:
        head = head.rpartition("/")[0]
        g = groups.get(head + "/")
        if g is not None:
            return g
    return None


def _is_direct(key: str, groups: Mapping[str, _Group]) -> bool:
    return key.rpartition("/")[0] + "/" in groups


def _read_manifest(store: ObjectStore, prefix: str) -> Manifest | str:
    key = prefix + MANIFEST_NAME
    try:
        return Manifest.from_json(store.get(key), where=key)
    except CorruptCheckpointError as exc:
        return exc.message
    except ObjectNotFoundError:
        return "commit marker vanished while listing"


def _read_pin(store: ObjectStore, prefix: str) -> str | None:
    try:
        raw = store.get(prefix + PIN_NAME)
    except StoreError:
        return None
    try:
        doc = json.loads(raw.decode("utf-8"))
        reason = str(doc.get("reason") or "").strip()
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        reason = ""
    # A pin that cannot be read still pins: failing safe means keeping the checkpoint.
    return reason or "(unreadable pin)"


def _info(
    root: StoreURL,
    run: str,
    d: str,
    g: _Group,
    manifest: Manifest | str | None,
    pin: str | None,
    grace: timedelta,
    now: datetime,
) -> CheckpointInfo:
    name = d[len(run) : -1]
    m = _STEP_RE.fullmatch(name)
    step = int(m.group(1)) if m else None
    url = StoreURL(root.scheme, root.bucket, d)
    last = _utc(g.newest)
    cutoff = (now - grace).timestamp()
    live = tuple(sorted(t for t, when in g.tags.items() if when > cutoff and t not in g.dead))
    common = dict(
        url=url,
        name=name,
        size=g.size,
        num_objects=g.count,
        pinned=pin,
        last_activity=last,
        keys=tuple(g.keys),
        live_tags=live,
        uploads=tuple(g.uploads),
    )
    if g.marker is not None:
        if isinstance(manifest, Manifest):
            committed = frozenset(
                [d + MANIFEST_NAME, d + manifest.metadata_key]
                + [d + o.name for o in manifest.objects]
            )
            return CheckpointInfo(
                step=manifest.step if manifest.step is not None else step,
                state=CheckpointState.COMMITTED,
                committed_at=_utc(manifest.created),
                metrics=dict(manifest.metrics),
                tag=manifest.tag,
                committed_keys=committed,
                metadata_stale=_metadata_stale(g, manifest),
                **common,  # type: ignore[arg-type]
            )
        return CheckpointInfo(
            step=step,
            state=CheckpointState.COMMITTED,
            committed_at=None,
            error=manifest if isinstance(manifest, str) else "commit marker unreadable",
            **common,  # type: ignore[arg-type]
        )
    # Activity of a save proven dead does not count; anything untagged still does.
    young = bool(live) or (g.untagged is not None and g.untagged > cutoff)
    if young:
        state = CheckpointState.IN_PROGRESS
    elif g.metadata is not None:
        state = CheckpointState.FOREIGN
    else:
        state = CheckpointState.ABANDONED
    committed_at = (
        _utc(g.metadata.last_modified) if state is CheckpointState.FOREIGN and g.metadata else None
    )
    return CheckpointInfo(
        step=step,
        state=state,
        committed_at=committed_at,
        **common,  # type: ignore[arg-type]
    )


def _metadata_stale(g: _Group, manifest: Manifest) -> bool:
    """Whether the plain ``.metadata`` copy needs rewriting (a cheap signal from the listing;
    the rewrite verifies the source against the marker)."""
    if manifest.metadata_key == METADATA_NAME:
        return False  # the plain .metadata is itself the committed one
    plain = g.metadata
    if plain is None or plain.size != manifest.metadata_size:
        return True
    marker = g.marker
    return (
        marker is not None
        and marker.last_modified is not None
        and plain.last_modified is not None
        and plain.last_modified < marker.last_modified
    )


def list_checkpoints(
    store: ObjectStore,
    run: StoreURL,
    *,
    grace: timedelta = DEFAULT_GRACE,
    now: datetime | None = None,
) -> list[CheckpointInfo]:
    """The checkpoints directly under ``run``, oldest first (by step, then commit time).

    Args:
        store: The store holding the run.
        run: The run prefix.
        grace: How long after its last activity (an object, a heartbeat, an upload's start)
            a save is still in progress.
        now: The time to judge ``grace`` against (default: the wall clock).

    Request cost: ``ceil(objects under run / 1000)`` LIST requests, one LIST of open
    multipart uploads per 1000 uploads, and one GET per committed checkpoint (its marker)
    and per pin, 16 at a time.
    """
    for cat in scan(store, run, grace=grace, now=now):
        if cat.run.prefix == run.prefix:
            return list(cat.checkpoints)
    return []


def list_runs(
    store: ObjectStore,
    root: StoreURL,
    *,
    grace: timedelta = DEFAULT_GRACE,
    now: datetime | None = None,
) -> list[StoreURL]:
    """The runs (prefixes holding checkpoints or a lease) under ``root``, ``root`` included.

    Same request cost as :func:`scan` over ``root``.
    """
    return [cat.run for cat in scan(store, root, grace=grace, now=now)]


def iter_keys(checkpoints: Iterable[CheckpointInfo]) -> Iterator[str]:
    """Every key of the given checkpoints."""
    for c in checkpoints:
        yield from c.keys
