"""Whether a save is still running: the grace period, its floor, and writers proven gone.

A save (a tag) is live while any of its objects, heartbeats or open uploads is younger than
the grace period (:data:`DEFAULT_GRACE`). prune and gc never accept a grace period below
:data:`MIN_GRACE` (four missed heartbeats), so no setting can take a running save for a dead
one. A heartbeat also names the host, boot, PID namespace, pid and process start time of its
writer: on that same boot of that same host a pid that no longer exists (or now belongs to
another process) proves the save dead before the grace period runs out (:func:`dead_saves`).
A save that s3ckpt saw fail recorded so (``s3ckpt.failed.{tag}.{rank}``,
:func:`s3ckpt._commit.record_failure`): it is dead at once, whatever its other objects'
ages, and only it: another save of the same prefix stays live by its own activity, and a
commit marker, when there is one, wins over any record (:func:`newest_failure`).

Every age is measured in the store's time (:func:`judge_time`): LastModified against the
store's ``Date``, never against this host's clock, so a gc host whose clock is hours off
neither deletes a live save nor keeps a dead one for ever. A host whose clock is further
from the store's than the grace period is refused (:class:`~s3ckpt.errors.ClockSkewError`)
before it deletes anything.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TypeVar

from s3ckpt._commit import failure_reason, writer_gone
from s3ckpt.errors import ObjectNotFoundError, StoreError
from s3ckpt.format._names import MIN_GRACE_SECONDS
from s3ckpt.metrics.instrument import expecting
from s3ckpt.retention._check_record import read_each
from s3ckpt.store._clock import check_skew, skew_note, store_time
from s3ckpt.store.base import ObjectStore
from s3ckpt.uri import StoreURL

__all__ = [
    "DEFAULT_GRACE",
    "MIN_GRACE",
    "dead_saves",
    "failure_reasons",
    "judge_time",
    "newest_failure",
]

DEFAULT_GRACE = timedelta(hours=2)
"""How long a save (a tag) counts as in progress after its last activity."""
MIN_GRACE = timedelta(seconds=MIN_GRACE_SECONDS)
"""The floor prune and gc raise a shorter grace period to (four missed heartbeats)."""

K = TypeVar("K", bound=Hashable)


def judge_time(
    store: ObjectStore, url: StoreURL, now: datetime | None, grace: timedelta, *, refuse: str | None
) -> tuple[datetime, tuple[str, ...]]:
    """The "now" ages are judged against, and notes for the result.

    An explicit ``now`` (timezone-aware) is used as given: the caller chose the time, and
    nothing is asked of the store. Otherwise it is the store's time
    (:func:`~s3ckpt.store._clock.store_time`, one request), and this host's clock is
    compared with it: further apart than ``grace`` (the grace period in use, after its
    floor) raises :class:`~s3ckpt.errors.ClockSkewError` when ``refuse`` names the action
    about to delete (gc, prune or rm applying), and is a note otherwise (dry runs).

    Raises:
        ClockSkewError: see above.
    """
    if now is not None:  # timezone-aware: RetentionOptions checked it
        return now, ()
    t = store_time(store, url.prefix)
    if refuse is not None:
        check_skew(t, grace, action=refuse)
    note = skew_note(t, grace)
    return t.store, (() if note is None else (note + "; fix this host's clock (NTP)",))


def dead_saves(store: ObjectStore, heartbeats: Mapping[K, Sequence[str]]) -> set[K]:
    """The saves among ``heartbeats`` (heartbeat keys of each live-looking save, by any key
    the caller names a save with) whose writer process is provably gone.

    Only the coordinator's heartbeat (rank 0: DCP's coordinator) can prove it: a save whose
    coordinator process is gone on this host commits nothing more, while one that lost
    another rank after the gather of the write results may still be committed by its
    coordinator (a paused one included). Elsewhere nothing is provable and the grace period
    decides.

    Request cost: one GET per save (16 in parallel).
    """
    todo = [(save, key) for save, keys in heartbeats.items() for key in keys if _rank_of(key) == 0]

    def gone(item: tuple[K, str]) -> bool:
        try:
            with expecting("not_found"):  # a heartbeat its save removed at commit: a race
                return writer_gone(store.get(item[1]))
        except StoreError:
            return False  # vanished (its save committed) or unreadable: proves nothing

    return {save for (save, _), dead in zip(todo, read_each(gone, todo), strict=True) if dead}


def _rank_of(key: str) -> int:
    tail = key.rpartition(".")[2]
    return int(tail) if tail.isdigit() else 0


def newest_failure(
    failed: Mapping[str, Sequence[tuple[str, float | None]]], committed: str | None
) -> tuple[str, float | None] | None:
    """The failure to report for a prefix: of the save whose record is newest among the
    failed saves in ``failed`` (``{tag: [(record key, LastModified), ...]}``) other than the
    ``committed`` one (a marker wins: its save is committed, whatever it recorded). Returns
    that save's lowest rank's record key and its newest record's time, or None."""
    found = [
        (
            min((k for k, _ in rs), key=_rank_of),
            max((t for _, t in rs if t is not None), default=None),
        )
        for tag, rs in failed.items()
        if tag != committed and rs
    ]
    return max(found, key=lambda f: f[1] or 0.0, default=None)


def failure_reasons(store: ObjectStore, keys: Mapping[K, str]) -> dict[K, str]:
    """What each failure record in ``keys`` (by any key the caller names a prefix with)
    says went wrong (:func:`s3ckpt._commit.failure_reason`).

    Request cost: one GET per record (16 in parallel); only prefixes with a failed save
    have one.
    """

    def read(key: str) -> str:
        try:
            with expecting("not_found"):  # removed since the listing (gc): a race
                return failure_reason(store.get(key))
        except ObjectNotFoundError:
            return "(failure record removed while listing)"
        except StoreError as exc:
            return f"(failure record unreadable: {exc})"

    return dict(zip(keys, read_each(read, list(keys.values())), strict=True))
