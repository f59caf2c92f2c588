"""The names s3ckpt writes on the bucket (and so the only ones it may ever delete).

Under a checkpoint prefix:

=================================  ===========================================================
``__{rank}_{i}.{tag}.distcp``      data objects of the save whose tag is ``{tag}``
``.metadata.{tag}``                that save's pickled DCP ``Metadata`` (what the marker commits)
``s3ckpt.items.{tag}``             that save's item records: where each item lies and its
                                   CRC32C (format 4: the marker commits it by size and CRC32C)
``s3ckpt.alive.{tag}.{rank}``      that save's heartbeat (rank ``rank`` is still writing)
``s3ckpt.failed.{tag}.{rank}``     that save failed on rank ``rank`` (written best effort by
                                   the rank that saw it fail: the save is dead at once)
``s3ckpt.json``                    the commit marker (names the committed save's tag)
``.metadata``                      a copy of the committed ``.metadata.{tag}``, written after
                                   the marker, for stock DCP readers
=================================  ===========================================================

A *run* is a prefix whose checkpoints are its immediate sub-prefixes, named
``step_{step:09d}`` by the Checkpointer (:func:`checkpoint_name`); the names frameworks give
parse too (``s3ckpt._step_names``). Its control objects are never checkpoints and never
deleted by retention: ``s3ckpt.latest.json`` (:data:`LATEST_NAME`, the Checkpointer's
pointer to the latest checkpoint), ``s3ckpt.lease`` (:data:`LEASE_NAME`, the pruner's
lease) and ``s3ckpt.check.json`` (:data:`CHECK_NAME`, what ``s3ckpt check`` last found) in the
run, and ``s3ckpt.pin.json`` (:data:`PIN_NAME`, a pin set by ``s3ckpt pin``)
in a checkpoint.

``{tag}`` is the first 8 hex digits of the save's id (:func:`save_tag`). Every per-save name
carries it, so a save's own objects and uploads can always be found, and no save ever
writes (or deletes) under another save's names. :func:`owned_tag` recognises these names;
anything else under a checkpoint prefix was not written by s3ckpt and is never deleted by
gc. (Hashed-prefix data names live in the run's shard folder: ``_hashed.py``.)

Also here: the format's clock (how often a writing rank proves it is alive, and the shortest
grace retention accepts), and the checks on the values a commit marker carries: anyone with
write access to the bucket chooses them, so every number is bounded, every name is one plain
path segment, and every error message is cut short. A value that fails raises ``ValueError``
or ``TypeError``; :class:`~s3ckpt.format.Manifest` turns them into a
:class:`~s3ckpt.errors.CorruptCheckpointError` naming the marker.
"""

from __future__ import annotations

import re
from typing import Any

from s3ckpt._step_names import MAX_STEP_DIGITS
from s3ckpt.errors import ConfigError

MANIFEST_NAME = "s3ckpt.json"
"""The commit marker: a checkpoint prefix is committed iff it holds this object."""
METADATA_NAME = ".metadata"
"""DCP's metadata object (a save writes ``.metadata.{tag}``, then this copy for stock readers)."""
HEARTBEAT_PREFIX = "s3ckpt.alive."
"""Start of a heartbeat's name, ``s3ckpt.alive.{tag}.{rank}`` (:func:`heartbeat_name`)."""
FAILED_PREFIX = "s3ckpt.failed."
"""Start of a failure record's name, ``s3ckpt.failed.{tag}.{rank}`` (:func:`failure_name`)."""
ITEMS_PREFIX = "s3ckpt.items."
"""Start of a save's item records' name, ``s3ckpt.items.{tag}`` (:func:`items_name`)."""

LATEST_NAME = "s3ckpt.latest.json"
"""Run-level pointer to the latest checkpoint (written by the Checkpointer)."""
LEASE_NAME = "s3ckpt.lease"
"""Run-level pruner lease."""
LEASE_PROBE = re.compile(re.escape(LEASE_NAME) + r"\.probe-[0-9a-f]{12}")
"""The name of a capability probe made beside a run's lease (``s3ckpt.lease.probe-<id>``,
:func:`s3ckpt.store._capabilities.probe_capabilities`), removed by the probe; one a
silent store kept is gc's once older than the grace period."""
CHECK_NAME = "s3ckpt.check.json"
"""Run-level record of what ``s3ckpt check`` found, per checkpoint (``ls`` reads it)."""
PIN_NAME = "s3ckpt.pin.json"
"""Per-checkpoint pin: ``{"reason": ..., "pinned_at": ..., "by": ...}``."""

TAG_LEN = 8
"""Hex digits of a save tag."""
TAG_PATTERN = r"([0-9a-f]{8})"
"""A save tag as a regular expression with one group (for names that carry it)."""
_OWNED = (
    re.compile(r"__\d+_\d+\." + TAG_PATTERN + r"\.distcp"),
    re.compile(re.escape(METADATA_NAME) + r"\." + TAG_PATTERN),
    re.compile(re.escape(HEARTBEAT_PREFIX) + TAG_PATTERN + r"\.\d+"),
    re.compile(re.escape(FAILED_PREFIX) + TAG_PATTERN + r"\.\d+"),
    re.compile(re.escape(ITEMS_PREFIX) + TAG_PATTERN),
)


def save_tag(save_id: str) -> str:
    """The 8-hex-digit tag every object of the save ``save_id`` carries in its name."""
    tag = save_id[:TAG_LEN].lower()
    if not re.fullmatch(TAG_PATTERN, tag):
        raise ValueError(f"save id {save_id!r} does not start with {TAG_LEN} hex digits")
    return tag


def data_name(rank: int, index: int, tag: str) -> str:
    """Name of data object ``index`` of ``rank`` in the save tagged ``tag``."""
    return f"__{rank}_{index}.{tag}.distcp"


def metadata_name(tag: str) -> str:
    """Name of the ``.metadata`` the save tagged ``tag`` writes (and its marker commits)."""
    return f"{METADATA_NAME}.{tag}"


def items_name(tag: str) -> str:
    """Name of the item records the save tagged ``tag`` writes (its marker commits them)."""
    return f"{ITEMS_PREFIX}{tag}"


def heartbeat_name(tag: str, rank: int) -> str:
    """Name of rank ``rank``'s heartbeat object for the save tagged ``tag``."""
    return f"{HEARTBEAT_PREFIX}{tag}.{rank}"


def failure_name(tag: str, rank: int) -> str:
    """Name of the record that the save tagged ``tag`` failed on rank ``rank``."""
    return f"{FAILED_PREFIX}{tag}.{rank}"


def owned_tag(name: str) -> str | None:
    """The save tag of a per-save name s3ckpt writes (see the module docs), else None.

    ``name`` is relative to the checkpoint prefix (no ``/``). Stock DCP names
    (``__0_0.distcp``), the plain ``.metadata``, the marker and foreign files give None.
    """
    return next((m.group(1) for p in _OWNED if (m := p.fullmatch(name))), None)


def checkpoint_name(step: int) -> str:
    """The sub-prefix of a run that holds ``step``'s checkpoint: ``step_000001000``.

    Nine digits sort correctly up to a billion steps; larger steps still parse, up to
    ``MAX_STEP_DIGITS`` (18) digits (a longer name would not read back as a step).
    """
    if step < 0 or step >= 10**MAX_STEP_DIGITS:
        raise ConfigError(f"step must be from 0 to 10**{MAX_STEP_DIGITS} - 1, got {step}")
    return f"step_{step:09d}"


HEARTBEAT_INTERVAL = 15.0
"""Seconds between a writing rank's heartbeats (``s3ckpt.alive.{tag}.{rank}``)."""
MIN_GRACE_SECONDS = 4 * HEARTBEAT_INTERVAL
"""The shortest grace period prune and gc accept: four missed heartbeats. A shorter one
could take a live save (one rank uploading a single large object) for a dead one."""


MAX_CREATED = 32503680000.0
"""3000-01-01T00:00:00Z: a marker's ``created`` must lie from the epoch to this."""
MAX_INT = 2**63 - 1
"""The largest size, offset, rank, step or version a marker may record (S3's own limits are
far below; a larger number is a hostile or corrupt marker, not a checkpoint)."""
SEGMENT = re.compile(r"[^/\\\x00]+")
"""One path segment: no ``/``, ``\\`` or NUL."""


def short(value: Any, limit: int = 200) -> str:
    """``repr(value)`` (for an exception, its message) cut to ``limit`` characters: a hostile
    marker must not make an error line megabytes long."""
    text = str(value) if isinstance(value, BaseException) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def as_str(value: Any) -> str:
    """``value`` if it is a string, else a ``TypeError``."""
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def nonneg(value: Any) -> int:
    """``value`` if it is an integer from 0 to :data:`MAX_INT` (never a bool), else a
    ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INT:
        raise ValueError(f"expected an integer from 0 to 2**63-1, got {short(value)}")
    return value


def created_time(value: Any) -> float:
    """A commit time: a number of seconds since the epoch that a datetime can hold."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"created must be a number, got {type(value).__name__}")
    if not 0 <= value < MAX_CREATED:  # NaN fails this too
        raise ValueError(
            f"created {short(value)} is not a time from 1970 to 3000 (seconds since the epoch)"
        )
    return float(value)


def check_name(value: Any, what: str) -> str:
    """A name relative to the checkpoint prefix: one path segment, never ``.``/``..``."""
    name = as_str(value)
    if not SEGMENT.fullmatch(name) or name in (".", ".."):
        raise ValueError(f"{what} {name!r} is not a plain name inside the checkpoint prefix")
    return name
