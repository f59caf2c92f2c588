"""``s3ckpt check``: the scrub. Proves that the committed checkpoints under a URL still load.

Call sequence::

    result = check("s3://bucket/runs/", read_data="5%")     # every run under the prefix
    result.damaged      # [CheckpointCheck(...)], each with its findings
    result.skipped      # [SkippedCheckpoint(..., reason="in_progress"), ...]

The URL is a bucket prefix (every run under it), a run, or one checkpoint. The retention
catalog (:func:`s3ckpt.retention.scan`) says which checkpoints are committed; each is then
checked as :mod:`s3ckpt.tools._check_one` describes: the marker's digest, every object's
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
GETs (:mod:`s3ckpt.tools._check_one`); per run one GET and one PUT of its record. Checkpoints
are checked one at a time, the reads of each on ``TransferConfig.concurrency`` threads.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime

from s3ckpt._time import iso_z
from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.errors import ConfigError, S3CkptError
from s3ckpt.format import CHECK_NAME
from s3ckpt.retention import (
    CheckpointInfo,
    CheckpointState,
    CheckRecord,
    RetentionOptions,
    RunCatalog,
    read_check_record,
    scan,
)
from s3ckpt.store import LocationLike, ObjectStore
from s3ckpt.tools._check_one import check_checkpoint
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
        "no s3ckpt.json: a stock DCP checkpoint has no checksums to check "
        "(s3ckpt verify checks its structure)",
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
    value: float | None = None
    if text in ("all", "100%"):
        value = 1.0
    elif text.endswith("%"):
        try:
            value = float(text[:-1]) / 100
        except ValueError:
            value = None
    elif not isinstance(spec, str) or text == "0":
        try:
            value = float(spec)
        except (TypeError, ValueError):
            value = None
    if value is None or not math.isfinite(value) or not 0 <= value <= 1:
        raise ConfigError(
            f"read_data must be 0, a percentage such as 5% (up to 100%) or all, got {spec!r}"
        )
    if value == 0:
        return 0.0, "0"
    if value == 1:
        return 1.0, "all"
    return value, f"{value * 100:g}%"


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
    if seed is None:
        seed = random.SystemRandom().randrange(2**32)
    location = as_location(url, s3_config=s3_config, transfer_config=transfer_config, store=store)
    t0 = time.monotonic()
    catalogs = scan(location, options=options or RetentionOptions())
    tc = location.transfer_config
    checked: list[CheckpointCheck] = []
    skipped: list[SkippedCheckpoint] = []
    records: list[str] = []
    failures: list[str] = []
    for cat in catalogs:
        run = str(cat.run)
        mine: list[CheckpointCheck] = []
        for c in cat.checkpoints:
            rng = random.Random(f"{seed}:{c.url}")
            outcome = _one(location.store, c, run, fraction, rng, tc, on_bytes)
            if isinstance(outcome, CheckpointCheck):
                mine.append(outcome)
            else:
                skipped.append(outcome)
            if on_checkpoint is not None:
                on_checkpoint(outcome)
        checked += mine
        if record and mine:
            whole = cat.run.prefix.startswith(location.url.prefix)
            failure = _write_record(location.store, cat, mine, spec, whole)
            if failure is None:
                records.append(cat.run.key(CHECK_NAME))
            else:
                failures.append(failure)
    return CheckResult(
        url=str(location.url),
        read_data=spec,
        seed=seed,
        checked=tuple(checked),
        skipped=tuple(skipped),
        records=tuple(records),
        record_failures=tuple(failures),
        seconds=round(time.monotonic() - t0, 3),
    )


def _one(
    store: ObjectStore,
    c: CheckpointInfo,
    run: str,
    fraction: float,
    rng: random.Random,
    tc: TransferConfig,
    on_bytes: Callable[[int], None] | None,
) -> Outcome:
    """One checkpoint of the catalog: checked, or skipped with the reason."""
    if c.state in _NOT_COMMITTED:
        reason, detail = _NOT_COMMITTED[c.state]
        return SkippedCheckpoint(str(c.url), run, c.name, reason, detail)
    if c.overwrite_in_progress and c.error is None:  # (an unreadable marker names no tag)
        return SkippedCheckpoint(
            str(c.url),
            run,
            c.name,
            "being_written",
            "a new save is writing into this checkpoint's prefix; the next check reads it",
        )
    try:
        return check_checkpoint(
            store, c, run, fraction=fraction, rng=rng, config=tc, on_bytes=on_bytes
        )
    except S3CkptError as exc:  # this one cannot be checked now; the others still can
        return CheckpointCheck(
            str(c.url),
            run,
            c.name,
            c.step,
            c.tag,
            iso_z(datetime.now(UTC)),
            marker_etag=c.marker_etag,
            findings=(Finding("read_error", None, None, None, None, f"not checked: {exc}"),),
        )


def _write_record(
    store: ObjectStore,
    cat: RunCatalog,
    checks: list[CheckpointCheck],
    spec: str,
    whole_run: bool,
) -> str | None:
    """Merge ``checks`` into the run's record and write it; None, or why it failed."""
    key = cat.run.key(CHECK_NAME)
    now = iso_z(datetime.now(UTC))
    try:
        old = read_check_record(store, cat.run) or CheckRecord(now)
        new = old.merge(
            [c.entry() for c in checks if not c.incomplete],
            checked_at=now,
            read_data=spec,
            present=[c.name for c in cat.checkpoints] if whole_run else None,
        )
        store.put(key, new.to_json())
    except S3CkptError as exc:
        return (
            f"could not write {store.bucket}/{key}: {exc} (the findings are in this output; "
            "give the role s3:PutObject on it, or pass --no-record)"
        )
    return None
