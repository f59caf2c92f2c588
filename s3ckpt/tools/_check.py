"""``s3ckpt check``: the scrub. Proves that the committed checkpoints under a URL still load.

Call sequence::

    result = check("s3://bucket/runs/", read_data="5%")     # every run under the prefix
    result.damaged      # [CheckpointCheck(...)], each with its findings
    result.skipped      # [SkippedCheckpoint(..., reason="in_progress"), ...]

The URL is a bucket prefix (every run under it), a run, or one checkpoint. The retention
catalog (:func:`s3ckpt.retention.scan`) says which checkpoints are committed; each is then
checked as described below: the marker's digest, every object's
existence and size (from a listing), both ``.metadata`` copies against the marker, and a
sample of items re-read against their CRC32C. The others are skipped and counted, with the
reason: saves in progress or dead (uncommitted), stock-DCP checkpoints (no checksums to
check), a committed checkpoint a new save is writing into, and checkpoints with objects in
an archive class (GLACIER, DEEP_ARCHIVE: a read would need a restore).

Decisions:

* **How much data is read.** ``read_data`` is a share of each checkpoint's item *bytes*
  (``"5%"``), ``"all"`` or ``"0"``, the default: like restic's ``check``, which reads no
  data unless ``--read-data`` or ``--read-data-subset`` asks, a check by default costs a few
  requests per checkpoint and no data transfer. Every checkpoint gets its own sample (at
  least one item when the share is above 0), so each is touched by every check; a weekly
  ``5%`` reads each byte once in 20 weeks on average (a flipped byte is found with a chance
  of 5% a week; a missing or cut object by every check, data or not). The items are drawn
  at random from ``seed`` and the checkpoint's URL: the same seed draws the same items again
  (reproducing a finding), the default seed is new each time.
* **Findings are recorded** per run in ``{run}/s3ckpt.check.json``
  (:mod:`s3ckpt.retention._check_record`), part of each checkpoint's state in the
  catalog; ``record=False`` makes the check read-only.
* **No torch.** The check reads the marker, never the ``.metadata`` pickle, so it runs in
  the retention cron's image.

Request cost: the catalog's (:func:`~s3ckpt.retention.scan`), then per committed checkpoint
one LIST, one GET of the marker, one or two GETs of ``.metadata`` and the sample's ranged
GETs (below); per run one GET and one PUT of its record. Checkpoints
are checked one at a time, the reads of each on ``TransferConfig.concurrency`` threads.

One committed checkpoint, in order:

1. **Listing** (one LIST of its prefix): the marker is still there, and no object is in an
   archive class (:data:`~s3ckpt.store.base.ARCHIVE_CLASSES`: such a checkpoint is skipped,
   not read).
2. **Marker**: ``s3ckpt.json`` parses and matches its own ``digest``
   (:meth:`~s3ckpt.format.Manifest.from_json`).
3. **Objects**: every data object the marker names exists with the recorded size, from the
   listing; a HEAD only for an object the listing does not show (hashed-prefix saves keep
   their objects in the run's shard folder: one HEAD each there).
4. **Metadata**: the ``.metadata.{tag}`` the marker commits and the plain ``.metadata`` copy
   for stock DCP readers both have the recorded size and CRC32C (one GET each).
5. **Data** (``fraction > 0``): a random sample of items (:func:`~s3ckpt._verify.sample_items`)
   is read back and each item's CRC32C compared with the marker's. Memory: one
   ``read_chunk_size`` buffer per reading thread.

Steps 3 to 5 are the one verifier's (:class:`s3ckpt._verify.Verifier`, shared with
``s3ckpt verify`` and the commit-time check).

A finding other than a read error is damage. Before a checkpoint with findings is reported,
its marker is HEADed again: a marker deleted or rewritten meanwhile (a prune, a re-save,
``attach_metrics``) makes it *skipped*, not damaged, so a check racing a job never reports
damage that is not there.

No torch: the check runs in the retention cron's image. Unlike ``verify`` it reads no
``.metadata`` pickle and so checks no tensor framing; ``s3ckpt verify`` does that too.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime

from s3ckpt._commit import read_items
from s3ckpt._time import iso_z
from s3ckpt._verify import Fault, Verifier, manifest_items, sample_items
from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.errors import ConfigError, CorruptCheckpointError, S3CkptError
from s3ckpt.format._manifest import MAX_MANIFEST_BYTES, Manifest, manifest_digest
from s3ckpt.format._names import CHECK_NAME, MANIFEST_NAME
from s3ckpt.retention import CheckpointInfo, RetentionOptions
from s3ckpt.retention._catalog import CheckpointState
from s3ckpt.retention._check_record import CheckRecord, read_check_record
from s3ckpt.retention._scan import scan
from s3ckpt.store import ObjectStore
from s3ckpt.store._location import LocationLike
from s3ckpt.store.base import ARCHIVE_CLASSES, if_found
from s3ckpt.tools._check_result import CheckpointCheck, CheckResult, Finding, SkippedCheckpoint
from s3ckpt.tools._open import as_location

__all__ = ["check", "parse_read_data"]

Outcome = CheckpointCheck | SkippedCheckpoint

_NOT_COMMITTED = {
    CheckpointState.IN_PROGRESS: ("in_progress", "a save is writing it (not committed yet)"),
    CheckpointState.BEING_DELETED: ("being_deleted", "fenced by a deleter (prune/gc/rm finish it)"),
    CheckpointState.ABANDONED: (
        "uncommitted",
        "no commit marker: what a dead save left (s3ckpt gc removes it)",
    ),
    CheckpointState.FOREIGN: (
        "foreign",
        "no s3ckpt.json: a stock DCP checkpoint has no checksums "
        "to check (s3ckpt verify checks its structure)",
    ),
}


def parse_read_data(spec: str | float) -> tuple[float, str]:
    """``read_data`` as (a share of item bytes from 0 to 1, its canonical spelling).

    Accepts ``"0"`` (no data), ``"N%"`` (0 < N <= 100, decimals allowed), ``"all"``, or a
    number from 0 to 1.

    Raises:
        ConfigError: Anything else.
    """
    text = str(spec).strip().lower()
    value = 1.0 if text == "all" else math.nan
    with contextlib.suppress(TypeError, ValueError):
        if text.endswith("%"):
            value = float(text[:-1]) / 100
        elif not isinstance(spec, str) or text == "0":
            value = float(spec)
    if not 0 <= value <= 1:  # (NaN is not)
        raise ConfigError(
            f"read_data must be 0, a percentage such as 5% (up to 100%) or all, got {spec!r}"
        )
    return value, "0" if value == 0 else "all" if value == 1 else f"{value * 100:g}%"


def check(
    url: LocationLike,
    *,
    read_data: str | float = "0",
    seed: int | None = None,
    record: bool = True,
    options: RetentionOptions | None = None,
    on_checkpoint: Callable[[Outcome], None] | None = None,
    on_bytes: Callable[[int], None] | None = None,
    s3_config: S3Config | None = None,
    transfer_config: TransferConfig | None = None,
    store: ObjectStore | None = None,
) -> CheckResult:
    """Check every committed checkpoint under ``url``; see the module docs.

    Args:
        url: A bucket prefix, a run or one checkpoint: a URL, a local path or a
            :class:`~s3ckpt.store.Location`.
        read_data: The share of each checkpoint's item bytes read back and compared with
            the recorded CRC32C: ``"0"`` (the default: none), ``"5%"``, ``"all"``, or a
            number from 0 to 1.
        seed: Draws the samples (default: a new one, reported in the result).
        record: Write each run's findings to ``{run}/s3ckpt.check.json`` (``ls`` shows them).
        options: The catalog's settings (``grace``: how long a save without a marker counts
            as in progress; ``now``).
        on_checkpoint: Called with each checkpoint's outcome as it is known.
        on_bytes: Called with the size of every piece read (from reading threads).
        s3_config / transfer_config / store: How to open a URL (a Location carries its own).

    Raises:
        ConfigError: A bad ``read_data``, before any request.
        StoreError: The catalog's listing failed (a failure inside one checkpoint makes
            that checkpoint incomplete instead, and the check goes on).
    """
    fraction, spec = parse_read_data(read_data)
    seed = random.SystemRandom().randrange(2**32) if seed is None else seed
    location = as_location(url, s3_config=s3_config, transfer_config=transfer_config, store=store)
    t0 = time.monotonic()
    tc = location.transfer_config
    checked: list[CheckpointCheck] = []
    skipped: list[SkippedCheckpoint] = []
    records: list[str] = []
    failures: list[str] = []
    for cat in scan(location, options=options or RetentionOptions()):
        run = str(cat.run)
        mine: list[CheckpointCheck] = []
        for c in cat.checkpoints:
            rng = random.Random(f"{seed}:{c.url}")
            try:
                outcome = check_checkpoint(location.store, c, run, fraction, rng, tc, on_bytes)
            except S3CkptError as exc:  # this one cannot be checked now; the others still can
                why = (Finding("read_error", None, None, None, None, f"not checked: {exc}"),)
                outcome = CheckpointCheck(*_head(c, run), marker_etag=c.marker_etag, findings=why)
            if isinstance(outcome, CheckpointCheck):
                mine.append(outcome)
            else:
                skipped.append(outcome)
            if on_checkpoint is not None:
                on_checkpoint(outcome)
        checked += mine
        if record and mine:  # merge them into the run's record
            key, now = cat.run.key(CHECK_NAME), iso_z(datetime.now(UTC))
            whole = cat.run.prefix.startswith(location.url.prefix)
            try:
                old = read_check_record(location.store, cat.run) or CheckRecord(now)
                new = old.merge(
                    [c.entry() for c in mine if not c.incomplete],
                    checked_at=now,
                    read_data=spec,
                    present=[c.name for c in cat.checkpoints] if whole else None,
                )
                location.store.put(key, new.to_json())
                records.append(key)
            except S3CkptError as exc:
                failures.append(
                    f"could not write {location.store.bucket}/{key}: {exc} (the findings are in "
                    "this output; give the role s3:PutObject on it, or pass --no-record)"
                )
    return CheckResult(
        str(location.url),
        spec,
        seed,
        tuple(checked),
        tuple(skipped),
        tuple(records),
        tuple(failures),
        round(time.monotonic() - t0, 3),
    )


# -- one checkpoint ---------------------------------------------------------------------------
_ORDER = {
    k: n for n, k in enumerate(("marker", "missing_object", "object_size", "metadata", "items"))
}
"""Findings sort by kind (these first, the rest after), then object and item."""


def _head(c: CheckpointInfo, run: str) -> tuple[str, str, str, int | None, str | None, str]:
    """The fields that name a :class:`CheckpointCheck`'s checkpoint, checked now."""
    return str(c.url), run, c.name, c.step, c.tag, iso_z(datetime.now(UTC))


def _finding(f: Fault) -> Finding:
    item = None if f.item is None else f.item.name
    return Finding(f.kind, f.object, item, f.expected, f.found, f.message)


def check_checkpoint(
    store: ObjectStore,
    info: CheckpointInfo,
    run: str,
    fraction: float,
    rng: random.Random,
    config: TransferConfig,
    on_bytes: Callable[[int], None] | None = None,
) -> CheckpointCheck | SkippedCheckpoint:
    """Check one checkpoint of the catalog if it is committed, else skip it with the reason
    (see the module docs); never raises for damage.

    Raises:
        StoreError: A listing, HEAD or metadata GET failed after its retries (the check of
            the rest cannot be trusted to be complete).

    Request cost: one LIST, one GET of the marker, one of its item records (format 4), one or
    two GETs of ``.metadata``, a HEAD
    per object the listing does not show, the ranged GETs of the sample, and one HEAD of the
    marker when anything was found.
    """
    url, prefix, marker_key = str(info.url), info.url.prefix, info.url.key(MANIFEST_NAME)
    head = _head(info, run)

    def skipped(reason: str, detail: str) -> SkippedCheckpoint:
        return SkippedCheckpoint(url, run, info.name, reason, detail)

    if info.state in _NOT_COMMITTED:
        return skipped(*_NOT_COMMITTED[info.state])
    if info.overwrite_in_progress and info.error is None:  # (an unreadable marker: no tag)
        return skipped(
            "being_written",
            "a new save is writing into this checkpoint's prefix; the next check reads it",
        )

    if info.error is not None:  # the marker cannot be read: nothing else can be checked
        bad = Finding("marker", MANIFEST_NAME, None, "a readable marker", "unreadable", info.error)
        return CheckpointCheck(*head, marker_etag=info.marker_etag, findings=(bad,))
    listing = {o.key: o for o in store.list(prefix)}
    marker = listing.get(marker_key)
    if marker is None:
        return skipped("changed", "its commit marker was deleted since the scan (a prune or rm)")

    def confirmed(result: CheckpointCheck) -> CheckpointCheck | SkippedCheckpoint:
        """``result`` if the marker is still the one listed, else skipped (see the module
        docs)."""
        now = store.head(marker_key)
        if now is None:
            return skipped("changed", "its commit marker was deleted while it was checked")
        if now.etag is not None and marker.etag is not None and now.etag != marker.etag:
            return skipped(
                "changed",
                "its commit marker was rewritten while it was checked (a new save or "
                "attach_metrics); the next check reads the new one",
            )
        return result

    archived = [o for o in listing.values() if o.storage_class in ARCHIVE_CLASSES]
    if archived:
        classes = ", ".join(sorted({str(o.storage_class) for o in archived}))
        return skipped(
            "archived",
            f"{len(archived)} of its objects are in {classes}: not read (restore them first, "
            f"s3ckpt restore {url})",
        )
    v = Verifier(store, prefix.__add__, config, on_bytes=on_bytes)

    def bad_marker(expected: str, found: str, message: str) -> Outcome:
        bad = Finding("marker", MANIFEST_NAME, None, expected, found, message)
        etag, n = marker.etag, v.bytes_read
        return confirmed(CheckpointCheck(*head, marker_etag=etag, bytes_read=n, findings=(bad,)))

    if marker.size > MAX_MANIFEST_BYTES:
        what = f"{marker_key} is larger than a commit marker may be; not read"
        return bad_marker(f"at most {MAX_MANIFEST_BYTES} bytes", f"{marker.size} bytes", what)
    if (raw := if_found(lambda: store.get(marker_key))) is None:
        return skipped("changed", "its commit marker was deleted while it was checked")
    v.count(len(raw))
    try:
        manifest = Manifest.from_json(raw, where=marker_key)
    except CorruptCheckpointError as exc:
        return bad_marker("a valid marker", "damaged", exc.message)
    digest = manifest_digest(json.loads(raw))
    v.key_of = functools.partial(manifest.object_key, prefix)
    extra: list[Finding] = []
    if (ref := manifest.items_ref) is not None:
        try:
            manifest = read_items(store, info.url, manifest)
            v.count(ref.size)
        except CorruptCheckpointError as exc:
            want = f"{ref.size} bytes, crc32c {ref.crc32c:08x}"
            extra.append(Finding("items", ref.name, None, want, "missing or damaged", exc.message))
    items = manifest_items(manifest) if manifest.items is not None else []
    sizes = v.sizes([o.name for o in manifest.objects], listing)
    readable = set(v.objects(items, sizes, {o.name: o.size for o in manifest.objects}))
    v.metadata(prefix, manifest, listing)
    sample = [i for i in sample_items(items, fraction, rng) if i in readable]
    v.read(sample, thread_name="s3ckpt-check")
    findings = sorted(
        [*extra, *map(_finding, v.faults)],
        key=lambda f: (_ORDER.get(f.kind, 9), f.object or "", f.item or ""),
    )
    result = CheckpointCheck(
        *head,
        digest,
        marker.etag,
        len(manifest.objects),
        ref.count if ref is not None else len(items),
        v.items_read,
        v.bytes_read,
        tuple(findings),
    )
    return confirmed(result) if findings else result
