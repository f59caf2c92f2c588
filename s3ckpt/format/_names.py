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

Hashed prefixes: a save's data objects spread over a run's reserved shard folder.

A save with hashed prefixes (:class:`HashedPrefixes`, opt-in) writes its data objects
outside the checkpoint prefix, in the run's reserved shard folder :data:`SHARDS_DIR`, and
records that layout in its marker (which is then ``format_version`` 3)::

    {run}/{ckpt}/.metadata.{tag}, s3ckpt.json, .metadata, heartbeats      (as usual)
    {run}/s3ckpt-shards/{h}/{ckpt}/__{rank}_{i}.{tag}.shard               (data objects)

``{h}`` is the object's shard, fixed-width lowercase hex (:meth:`HashedPrefixes.shard`).
The data names end in ``.shard``, not ``.distcp``: s3ckpt before format 3 takes the folder
of any ``*.distcp`` (and any ``__{rank}_{i}.{tag}.distcp``) for a checkpoint of its own, so
its gc would delete a committed save's data as an abandoned save's; names it does not know
it never lists or deletes. :func:`shard_owner` maps a key in the shard folder back to its
checkpoint; ``s3ckpt-shards`` is never a run or a checkpoint, and no checkpoint may be
saved under a folder of that name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from s3ckpt import _crc
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


SHARDS_DIR = "s3ckpt-shards"
"""Reserved folder of a run: the data objects of its hashed-prefix saves
(:class:`HashedPrefixes`). Never a run or a checkpoint, never inside a checkpoint's URL."""
SHARD_SUFFIX = ".shard"
"""The end of a hashed-prefix data name (:func:`shard_name`)."""
_SHARD_NAME = re.compile(r"(__\d+_\d+)\." + TAG_PATTERN + re.escape(SHARD_SUFFIX))
_SHARD_KEY = re.compile(r"(.*/)?" + SHARDS_DIR + r"/[0-9a-f]{1,3}/([^/]*)/([^/]*)", re.DOTALL)
"""``{run}/s3ckpt-shards/{h}/{ckpt}/{name}``: groups ``{run}/`` (None at the root), ckpt, name."""


def shard_name(rank: int, index: int, tag: str) -> str:
    """Name of data object ``index`` of ``rank`` in the hashed-prefix save tagged ``tag``
    (it lives in the run's shard folder, see :class:`HashedPrefixes`)."""
    return f"__{rank}_{index}.{tag}{SHARD_SUFFIX}"


def shard_tag(name: str) -> str | None:
    """The save tag of a hashed-prefix data name (:func:`shard_name`), else None."""
    m = _SHARD_NAME.fullmatch(name)
    return m.group(2) if m else None


MIN_FANOUT = 2
"""The fewest shard folders a :class:`HashedPrefixes` may have."""
MAX_FANOUT = 4096
"""The most shard folders a :class:`HashedPrefixes` may have."""


@dataclass(frozen=True)
class HashedPrefixes:
    """Put a save's data objects under ``fanout`` hashed prefixes of the run, so that S3
    spreads them over that many partitions (opt-in; the default layout is ``None``).

    S3 throttles each partitioned key range (about 3,500 writes and 5,500 reads per
    second) and splits a busy range only after minutes of sustained load. Every object of
    a checkpoint shares its prefix, so a save of thousands of ranks starts in one
    partition; and since each new ``step_*`` folder sorts after the previous one's split
    points, hashing inside the checkpoint folder would not help the next save. The shard
    is therefore placed right after the run, where the key ranges stay the same from save
    to save and a split made during one save serves every later one::

        {run}/{ckpt}/.metadata.{tag}, s3ckpt.json, .metadata, heartbeats   (unchanged)
        {run}/s3ckpt-shards/{h}/{ckpt}/__{rank}_{i}.{tag}.shard             (data)

    ``{h}`` is ``crc32c(b"__{rank}_{i}") % fanout`` in fixed-width lowercase hex (one digit
    up to 16, two up to 256, three up to 4096), so a rank's objects land in the same shard
    folder every save. The DCP ``.metadata`` names objects by their plain names; the
    layout is recorded in ``s3ckpt.json`` (``format_version`` 3), which is how every s3ckpt
    reader, retention and the tools find the objects. Stock DCP readers cannot read such a
    checkpoint, and neither can s3ckpt without its ``s3ckpt.json``.

    Attributes:
        fanout: Shard folders, a power of two from 2 to 4096 (default 16). Choose it by
            the request rate a save needs, about one folder per 3,500 PUTs per second (a
            save sends one per part of every object, plus a create and a complete per
            object): once S3 has split them, its PUTs and a load's GETs spread over
            ``fanout`` partitions.

    Raises:
        ConfigError: ``fanout`` is not a power of two in ``2..4096``.
    """

    fanout: int = 16

    def __post_init__(self) -> None:
        f = self.fanout
        ok = isinstance(f, int) and not isinstance(f, bool) and MIN_FANOUT <= f <= MAX_FANOUT
        if not ok or f & (f - 1):
            raise ConfigError(
                f"HashedPrefixes fanout must be a power of two from {MIN_FANOUT} to "
                f"{MAX_FANOUT} (2, 4, 8, 16, ...), got {f!r}"
            )

    @property
    def width(self) -> int:
        """Hex digits of a shard folder's name."""
        return (self.fanout.bit_length() + 2) // 4

    def shard(self, name: str) -> str:
        """The shard folder (``{h}``) of data object ``name``: a hash of the name without its
        tag, so the same rank's object lands in the same folder every save."""
        stem = name.partition(".")[0]
        return format(_crc.crc32c(stem.encode("utf-8")) % self.fanout, f"0{self.width}x")

    def folder(self, prefix: str, name: str) -> str:
        """The folder (ending in ``/``) holding data object ``name`` of the checkpoint at
        ``prefix``: ``{run}/s3ckpt-shards/{h}/{ckpt}/``."""
        run, ckpt = _split_checkpoint(prefix)
        return f"{run}{SHARDS_DIR}/{self.shard(name)}/{ckpt}/"

    def key(self, prefix: str, name: str) -> str:
        """The key of data object ``name`` of the checkpoint at ``prefix``."""
        return self.folder(prefix, name) + name

    def to_doc(self) -> dict[str, Any]:
        """What ``s3ckpt.json`` records under ``layout``."""
        return {
            "prefix_strategy": "hashed",
            "fanout": self.fanout,
            "dir": SHARDS_DIR,
            "hash": "crc32c",
        }

    @classmethod
    def from_doc(cls, doc: Any) -> HashedPrefixes:
        """The layout ``s3ckpt.json`` records (ValueError for one this s3ckpt does not know)."""
        if not isinstance(doc, dict):
            raise TypeError(f"layout must be an object, got {type(doc).__name__}")
        known = cls().to_doc()
        for field_name in ("prefix_strategy", "dir", "hash"):
            if doc.get(field_name) != known[field_name]:
                raise ValueError(
                    f"layout {field_name} {doc.get(field_name)!r} is not one this s3ckpt "
                    f"knows ({known[field_name]!r}); upgrade s3ckpt"
                )
        return cls(nonneg(doc.get("fanout")))


def _split_checkpoint(prefix: str) -> tuple[str, str]:
    """``runs/a/step_1/`` -> (``runs/a/``, ``step_1``); ``step_1/`` -> (``""``, ``step_1``).

    One trailing ``/`` is dropped, as :func:`s3ckpt.uri.split_prefix` does (``uri`` is this
    module's sibling layer, so the two lines are repeated here): ``run/step_1//`` names no
    checkpoint folder, and :func:`shard_owner` reads keys back the same way."""
    head, sep, ckpt = (prefix[:-1] if prefix.endswith("/") else prefix).rpartition("/")
    if not ckpt:
        raise ConfigError(
            "hashed prefixes need a checkpoint prefix under a run (the shard folder is placed "
            f"in the run); '{prefix}' names no checkpoint folder (the bucket's root, or a "
            "prefix ending in an empty segment)"
        )
    return head + sep, ckpt


def object_key(prefix: str, name: str, layout: HashedPrefixes | None) -> str:
    """The key of data object ``name`` of the checkpoint at ``prefix`` in ``layout``
    (``None``: the default, directly under the prefix)."""
    return prefix + name if layout is None else layout.key(prefix, name)


def in_shard_tree(key: str) -> bool:
    """Whether a folder on ``key``'s path is named :data:`SHARDS_DIR`."""
    return key.startswith(SHARDS_DIR + "/") or f"/{SHARDS_DIR}/" in key


@dataclass(frozen=True)
class ShardOwner:
    """Whose a key in a run's shard folder is (see :func:`shard_owner`)."""

    checkpoint: str
    """The checkpoint's prefix, ``{run}/{ckpt}/``."""
    name: str
    """The data object's name (as ``.metadata`` and ``s3ckpt.json`` name it)."""
    tag: str
    """The save tag the name carries."""


def shard_owner(key: str) -> ShardOwner | None:
    """The checkpoint a key of the form ``{run}/s3ckpt-shards/{h}/{ckpt}/{name}`` belongs
    to, when ``{name}`` is a hashed-prefix data name (:func:`shard_name`); else None.

    ``{run}`` must not itself lie in a shard folder and ``{ckpt}`` must not be named
    :data:`SHARDS_DIR`: nothing in a shard folder is ever a run or a checkpoint. Any other
    key in a shard folder (a foreign file, a deeper path) belongs to no checkpoint, so no
    retention ever deletes it.
    """
    m = _SHARD_KEY.fullmatch(key)
    if m is None:
        return None
    run, ckpt, name = m.group(1) or "", m.group(2), m.group(3)
    tag = shard_tag(name)
    if tag is None or not SEGMENT.fullmatch(ckpt) or ckpt in (".", "..", SHARDS_DIR):
        return None
    return None if in_shard_tree(run) else ShardOwner(f"{run}{ckpt}/", name, tag)


def check_prefix_strategy(value: Any) -> HashedPrefixes | None:
    """``value`` if it is a prefix strategy (:class:`HashedPrefixes` or ``None``), else a
    :class:`ConfigError`."""
    if value is None or isinstance(value, HashedPrefixes):
        return value
    raise ConfigError(
        f"prefix_strategy must be None (the default layout) or HashedPrefixes(fanout), got "
        f"{type(value).__name__} {value!r}"
    )


def check_checkpoint_prefix(prefix: str, layout: HashedPrefixes | None) -> None:
    """Refuse a checkpoint prefix no save may use: one inside a folder named
    :data:`SHARDS_DIR` (reserved), and, for hashed prefixes, the bucket's root."""
    if in_shard_tree(prefix if prefix.endswith("/") else prefix + "/"):
        raise ConfigError(
            f"'{prefix}' lies in a folder named {SHARDS_DIR}, which s3ckpt reserves for the "
            "data objects of hashed-prefix saves; save the checkpoint elsewhere"
        )
    if layout is not None:
        _split_checkpoint(prefix)
