"""``{run}/s3ckpt.check.json``: what ``s3ckpt check`` found in a run, part of each
checkpoint's state.

One control object per run (:data:`~s3ckpt.format.CHECK_NAME`), written by the check
(:mod:`s3ckpt.tools._check`) when it has checked the run's checkpoints (``--no-record``
writes none) and read by the catalog (:func:`s3ckpt.retention._scan.catalogs`: one GET per
run with a committed checkpoint): a checkpoint whose entry is damaged, for the marker it
has now, is *damaged* (:attr:`~s3ckpt.retention.CheckpointInfo.damaged`) for every command
that reads the catalog (``ls``, ``prune``, ``gc``, ``rm``, ``report``, tiers, ``check``,
``Checkpointer.latest()`` and ``load()``). Retention never takes the record for a
checkpoint nor deletes it: it lies beside the run's checkpoints, as the lease does, and is
no name a checkpoint is declared by.

Document (JSON, ``format`` ``s3ckpt-check``, ``version`` 1)::

    {"format": "s3ckpt-check", "version": 1, "checked_at": "2025-03-01T12:00:00Z",
     "read_data": "5%",
     "checkpoints": [{"name": "step_000000100", "checked_at": "...", "damaged": false,
                      "marker_digest": "sha256:...", "marker_etag": "\\"...\\"",
                      "tag": "0a1b2c3d"}, ...],
     "damaged": [{"name": "step_000000200", "checked_at": "...", "marker_digest": ...,
                  "marker_etag": ..., "tag": ..., "problems": [{"kind": "checksum",
                  "object": "__0_0.0a1b2c3d.distcp", "item": "model.w", "expected": ...,
                  "found": ..., "message": ...}], "more_problems": 0}, ...]}

Decisions:

* **Merge, never replace.** A check updates the entries of the checkpoints it checked: a
  damaged one gets (or replaces) its ``damaged`` entry; one that passed loses it. A check that
  could not finish a checkpoint (a read error, skipped) leaves its entries as they were. A
  check of a whole run (its URL is the run or above) also drops the entries of checkpoints
  the run no longer holds; a check of one checkpoint touches only that one.
* **Stale marks do not count.** A checkpoint is damaged by the record only while its commit
  marker is the one the check read: same ETag in the listing (an ETag changes with every
  rewrite of the marker: a re-save into the prefix, ``attach_metrics``), or, where a store
  gives no ETags, the same save tag. The marker's digest is recorded too, for people.
* **Bounded.** At most :data:`MAX_PROBLEMS` problems per checkpoint (the rest counted); a
  record over :data:`MAX_RECORD_BYTES` or malformed is read as no record (a bucket's
  contents are not trusted) and the next check rewrites it. A record that cannot be read
  (a store error) is noted on the run's catalog (:attr:`~s3ckpt.retention.RunCatalog.check_error`).
* **Last writer wins.** Two checks of one run at once each write what they found; no lock
  is taken. The record only ever *protects*: a damaged entry keeps a checkpoint from plans
  and from ``latest``; nothing is deleted on its strength.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypeVar

from s3ckpt.errors import ObjectNotFoundError, StoreError
from s3ckpt.format._names import CHECK_NAME
from s3ckpt.metrics.instrument import expecting, in_context
from s3ckpt.store.base import ObjectStore
from s3ckpt.uri import StoreURL

__all__ = [
    "MAX_PROBLEMS",
    "MAX_RECORD_BYTES",
    "READ_WORKERS",
    "CheckEntry",
    "CheckRecord",
    "read_check_record",
    "read_check_records",
    "read_each",
]

RECORD_FORMAT = "s3ckpt-check"
RECORD_VERSION = 1
MAX_PROBLEMS = 20
"""Problems a record keeps per damaged checkpoint (``more_problems`` counts the rest)."""
MAX_RECORD_BYTES = 8 * 1024 * 1024
"""The largest record read; a larger one is ignored (and rewritten by the next check)."""
READ_WORKERS = 16
"""GETs (markers, pins, heartbeats, records) and listings sent in parallel by retention."""

T = TypeVar("T")
R = TypeVar("R")


def read_each(read: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``read`` of each item, :data:`READ_WORKERS` at a time; the requests count for the
    caller's operation (:func:`~s3ckpt.metrics.instrument.in_context`)."""
    with ThreadPoolExecutor(max_workers=min(READ_WORKERS, len(items)) or 1) as pool:
        return list(pool.map(in_context(read), items))


@dataclass(frozen=True)
class CheckEntry:
    """What a check found about one checkpoint.

    Attributes:
        name: The checkpoint's name in its run (``step_000000100``).
        checked_at: When the check read it (ISO-8601, ``Z``).
        marker_digest: The commit marker's ``digest`` (``sha256:...``); None when the marker
            itself could not be read.
        marker_etag: The marker's ETag in the listing the check made (None: the store gives
            none).
        tag: The committed save's tag (None: the marker could not be read).
        damaged: Whether it found damage.
        problems: What is wrong (``kind``, ``object``, ``item``, ``expected``, ``found``,
            ``message``), at most :data:`MAX_PROBLEMS`.
        more_problems: Problems found beyond those.
    """

    name: str
    checked_at: str
    marker_digest: str | None
    marker_etag: str | None
    tag: str | None
    damaged: bool
    problems: tuple[Mapping[str, Any], ...] = ()
    more_problems: int = 0

    def applies(self, marker_etag: str | None, tag: str | None) -> bool:
        """Whether this entry makes damaged a checkpoint whose commit marker now has
        ``marker_etag`` (from a listing) and commits the save ``tag``: it found damage, in
        the marker the checkpoint has now (same ETag when both sides have one, else the
        same save tag)."""
        if self.marker_etag is not None and marker_etag is not None:
            return self.damaged and self.marker_etag == marker_etag
        return self.damaged and self.tag is not None and self.tag == tag

    @classmethod
    def of(
        cls,
        name: str,
        checked_at: str,
        marker_digest: str | None,
        marker_etag: str | None,
        tag: str | None,
        problems: Sequence[Mapping[str, Any]],
    ) -> CheckEntry:
        """A check's verdict: damaged when it found ``problems`` (at most
        :data:`MAX_PROBLEMS` kept, the rest counted)."""
        kept, more = tuple(problems[:MAX_PROBLEMS]), max(0, len(problems) - MAX_PROBLEMS)
        return cls(name, checked_at, marker_digest, marker_etag, tag, bool(problems), kept, more)

    @property
    def reason(self) -> str:
        """The first problem's message, and how many more there are."""
        if not self.problems:
            return "damaged"
        more = len(self.problems) - 1 + self.more_problems
        return str(self.problems[0].get("message", "")) + (f" (+{more} more)" if more else "")

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (as in the record; ``problems`` only where there are some)."""
        d = asdict(self)
        d["problems"] = list(d["problems"])
        if not (self.problems or self.more_problems):
            del d["problems"], d["more_problems"]
        return d

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> CheckEntry:
        """Parse one entry (raises KeyError, TypeError or ValueError on a malformed one)."""
        name, at = doc["name"], doc["checked_at"]
        digest, etag, tag = texts = [doc.get(k) for k in ("marker_digest", "marker_etag", "tag")]
        if not isinstance(name, str) or not isinstance(at, str) or "/" in name:
            raise ValueError("name and checked_at must be strings, name one segment")
        if not all(isinstance(v, str | None) for v in texts):
            raise TypeError("marker_digest, marker_etag and tag must be strings")
        problems = [
            {k: (v if isinstance(v, str | int | None) else str(v)) for k, v in p.items()}
            for p in doc.get("problems") or ()
            if isinstance(p, dict)
        ]
        entry = cls.of(name, at, digest, etag, tag, problems)
        more = entry.more_problems + int(doc.get("more_problems") or 0)
        return replace(entry, damaged=bool(doc.get("damaged", bool(problems))), more_problems=more)


@dataclass(frozen=True)
class CheckRecord:
    """One run's ``s3ckpt.check.json`` (see the module docs).

    Attributes:
        checked_at: When the check that wrote it finished.
        read_data: That check's ``--read-data`` (``0``, ``5%``, ``all``).
        checkpoints: The last verdict on each checkpoint checked, by name.
        damaged: The damaged ones (with their problems), by name.
    """

    checked_at: str
    read_data: str = "0"
    checkpoints: Mapping[str, CheckEntry] = field(default_factory=dict)
    damaged: Mapping[str, CheckEntry] = field(default_factory=dict)

    def merge(
        self,
        found: Iterable[CheckEntry],
        *,
        checked_at: str,
        read_data: str,
        present: Collection[str] | None = None,
    ) -> CheckRecord:
        """This record updated with a later check's ``found`` entries.

        Args:
            found: The checkpoints that check finished (clean or damaged).
            checked_at: When it finished.
            read_data: Its ``--read-data``.
            present: The run's checkpoint names, when that check covered the whole run:
                entries of any other name are dropped. None keeps them.
        """
        keep = {*self.checkpoints, *self.damaged} if present is None else set(present)
        checkpoints = {k: v for k, v in self.checkpoints.items() if k in keep}
        damaged = {k: v for k, v in self.damaged.items() if k in keep}
        for e in found:
            checkpoints[e.name] = replace(e, problems=(), more_problems=0)
            if e.damaged:
                damaged[e.name] = e
            else:
                damaged.pop(e.name, None)
        return CheckRecord(checked_at, read_data, checkpoints, damaged)

    def to_json(self) -> bytes:
        """The document (sorted by name)."""
        doc = {
            "format": RECORD_FORMAT,
            "version": RECORD_VERSION,
            "checked_at": self.checked_at,
            "read_data": self.read_data,
            "checkpoints": [self.checkpoints[k].to_dict() for k in sorted(self.checkpoints)],
            "damaged": [self.damaged[k].to_dict() for k in sorted(self.damaged)],
        }
        return json.dumps(doc, indent=1, sort_keys=True).encode("utf-8")

    @classmethod
    def from_json(cls, raw: bytes) -> CheckRecord | None:
        """Parse a record; None for anything that is not one (too large, not JSON, another
        format or version, malformed entries)."""
        if len(raw) > MAX_RECORD_BYTES:
            return None
        try:
            doc = json.loads(raw.decode("utf-8"))
            if doc.get("format") != RECORD_FORMAT or doc.get("version") != RECORD_VERSION:
                return None
            checkpoints = [CheckEntry.from_dict(d) for d in doc.get("checkpoints") or ()]
            damaged = [CheckEntry.from_dict(d) for d in doc.get("damaged") or ()]
            return cls(
                checked_at=str(doc["checked_at"]),
                read_data=str(doc.get("read_data", "0")),
                checkpoints={e.name: e for e in checkpoints},
                damaged={e.name: replace(e, damaged=True) for e in damaged},
            )
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            return None


def read_check_record(store: ObjectStore, run: StoreURL) -> CheckRecord | None:
    """The run's record, or None (none written, or unreadable: see the module docs).

    Raises:
        StoreError: The GET failed for another reason than a missing object.

    Request cost: one GET.
    """
    try:
        with expecting("not_found"):
            return CheckRecord.from_json(store.get(run.key(CHECK_NAME)))
    except ObjectNotFoundError:
        return None


def read_check_records(
    store: ObjectStore, root: StoreURL, runs: Sequence[str]
) -> dict[str, CheckRecord | str | None]:
    """Each run's record (``runs``: run prefixes in ``root``'s bucket), None where it has
    none, or why it could not be read (a store error).

    Request cost: one GET per run, 16 at a time.
    """

    def read(run: str) -> CheckRecord | str | None:
        try:
            return read_check_record(store, StoreURL(root.scheme, root.bucket, run))
        except StoreError as exc:
            return f"could not read {run}{CHECK_NAME}: {exc}"

    return dict(zip(runs, read_each(read, runs), strict=True))
