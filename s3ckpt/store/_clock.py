"""The store's clock: what time it is *on the store*, and how far this host's clock is off.

Every age s3ckpt judges -- a save's grace period, a lease's expiry, ``within`` and the
calendar rules -- compares times the store wrote (LastModified, an upload's Initiated) with
"now". Hosts' clocks drift (a missing NTP daemon, a hardware clock kept in local time: hours),
so "now" is the store's own time too: :func:`store_time` asks for it with one cheap request,
and :func:`check_skew` refuses to act when this host's clock is further off than the grace
period (the host is misconfigured, and so may be the writers on it).

Where the time comes from:

* :class:`~s3ckpt.store.s3.S3Store`: the ``Date`` header of one ``ListObjectsV2`` of the
  given prefix with ``MaxKeys=1`` (the permission every role that lists checkpoints has;
  ``HeadBucket`` would need ``s3:ListBucket`` on the whole bucket). The header has whole
  seconds and is written while the request is served: the store's time is taken as the
  header plus half a second, and this host's as the midpoint of the attempt's send and
  receive. The error is at most about a second plus half the round trip.
* :class:`~s3ckpt.store.memory.MemoryStore`: its injected clock (the one its objects'
  times come from) against :func:`time.time`.
* Anything else (:class:`~s3ckpt.store.fsspec_store.FsspecStore`, a store without a
  ``Date``): this host's clock, with a skew of zero. A local file system shares this host's
  clock, so that is exact; for remote fsspec stores (gs://, az://) the skew is not
  measured -- :attr:`StoreTime.source` says so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime

from s3ckpt._time import iso_z_seconds, utc
from s3ckpt.errors import ClockSkewError
from s3ckpt.store.base import ObjectStore

__all__ = ["StoreTime", "check_skew", "skew_note", "store_time"]

LOCAL_SOURCE = "this host's clock (the store's is not measured)"


@dataclass(frozen=True)
class StoreTime:
    """The store's clock and this host's at the same moment.

    Attributes:
        store: The store's time (UTC).
        local: This host's clock at the same moment (UTC).
        source: Where ``store`` came from (for messages).
        where: The store (``s3://bucket``), for messages.
    """

    store: datetime
    local: datetime
    source: str = "the store's Date header"
    where: str = ""

    @property
    def skew(self) -> timedelta:
        """``local - store``: positive when this host's clock is ahead of the store's."""
        return self.local - self.store

    @property
    def measured(self) -> bool:
        """Whether the store's clock was actually read (not this host's clock again)."""
        return self.source != LOCAL_SOURCE


def store_time(store: ObjectStore, prefix: str = "") -> StoreTime:
    """The store's time now, and this host's.

    Args:
        store: The store.
        prefix: A prefix the caller may list (S3 stores list it, one key at most); the
            root or run being worked on.

    Request cost: one ListObjectsV2 on S3 stores; none otherwise.
    """
    where = f"{store.url_scheme}://{store.bucket}"
    dated = getattr(store, "dated_list", None)
    if callable(dated):
        header, sent, received = dated(prefix)
        local = utc((sent + received) / 2)
        when = _parse_date(header)
        if when is None:
            return StoreTime(local, local, LOCAL_SOURCE + "; it sent no Date header", where)
        return StoreTime(when + timedelta(seconds=0.5), local, where=where)
    clock = getattr(store, "now", None)
    local = utc(time.time())
    if callable(clock):
        return StoreTime(utc(float(clock())), local, "the store's clock", where)
    return StoreTime(local, local, LOCAL_SOURCE, where)


def check_skew(t: StoreTime, limit: timedelta, *, action: str) -> None:
    """Refuse to ``action`` when this host's clock is further than ``limit`` from the store's.

    Args:
        t: From :func:`store_time`.
        limit: The largest skew accepted: the grace period in use (after its floor).
        action: What is refused (``"gc"``, ``"prune"``, ``"delete ckpt"``), for the message.

    Raises:
        ClockSkewError: one line naming both clocks, the skew, and that NTP should be fixed.
    """
    if (note := skew_note(t, limit)) is not None:
        raise ClockSkewError(
            f"refusing to {action}: {note}; fix this host's clock (NTP) and run again",
            local=t.local.timestamp(),
            store=t.store.timestamp(),
            skew=t.skew.total_seconds(),
            limit=limit.total_seconds(),
        )


def skew_note(t: StoreTime, limit: timedelta) -> str | None:
    """One line about a skew larger than ``limit`` (for ``ls`` and ``report``, which only
    warn), or None when the clocks agree well enough."""
    skew = t.skew
    if abs(skew) <= limit:
        return None
    way = "ahead of" if skew > timedelta(0) else "behind"
    store = f" of {t.where}" if t.where else ""
    local, theirs = (iso_z_seconds(d.timestamp()) for d in (t.local, t.store))
    return (
        f"this host's clock ({local}) is {_fmt_span(abs(skew))} {way} the store's{store} "
        f"({theirs}, from {t.source}), more than the grace period of {_fmt_span(limit)}"
    )


def _parse_date(header: str | None) -> datetime | None:
    try:
        when = parsedate_to_datetime(header or "")
    except (TypeError, ValueError, IndexError):  # none, empty or not a date
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _fmt_span(value: timedelta) -> str:
    """``1d2h3m4s``, whole seconds (a store leaf cannot use the retention's formatter)."""
    total, out = round(value.total_seconds()), ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        n, total = divmod(total, size)
        out += f"{n}{unit}" if n else ""
    return out or "0s"
