"""The commit marker ``s3ckpt.json``: what a committed checkpoint contains.

A checkpoint is a prefix holding torch's DCP layout (``__{rank}_{i}.<tag>.distcp`` data
objects and the pickled ``.metadata``) plus this marker, written last with a conditional
PUT. A prefix is *committed* iff the marker exists. The marker names the metadata object it
commits and its CRC32C, lists every data object with its size, and records a CRC32C for
every item, so a reader can verify every byte without trusting anything else.

Names on the bucket (what s3ckpt writes, and so what it may ever delete):

=================================  ===========================================================
``__{rank}_{i}.{tag}.distcp``      data objects of the save whose tag is ``{tag}``
``.metadata.{tag}``                that save's pickled DCP ``Metadata`` (what the marker commits)
``s3ckpt.alive.{tag}.{rank}``      that save's heartbeat (rank ``rank`` is still writing)
``s3ckpt.failed.{tag}.{rank}``     that save failed on rank ``rank`` (written best effort by
                                   the rank that saw it fail: the save is dead at once)
``s3ckpt.json``                    the commit marker (names the committed save's tag)
``.metadata``                      a copy of the committed ``.metadata.{tag}``, written after
                                   the marker, for stock DCP readers
=================================  ===========================================================

A save with hashed prefixes (:class:`HashedPrefixes`, opt-in) writes its data objects
outside the checkpoint prefix, in the run's reserved shard folder :data:`SHARDS_DIR`, and
records that layout in its marker (which is then ``format_version`` 3)::

    {run}/{ckpt}/.metadata.{tag}, s3ckpt.json, .metadata, heartbeats      (as above)
    {run}/s3ckpt-shards/{h}/{ckpt}/__{rank}_{i}.{tag}.shard               (data objects)

``{h}`` is the object's shard, fixed-width lowercase hex (:meth:`HashedPrefixes.shard`).
The data names end in ``.shard``, not ``.distcp``: s3ckpt before format 3 takes the folder
of any ``*.distcp`` (and any ``__{rank}_{i}.{tag}.distcp``) for a checkpoint of its own, so
its gc would delete a committed save's data as an abandoned save's; names it does not know
it never lists or deletes. :func:`shard_owner` maps a key in the shard folder back to its
checkpoint; ``s3ckpt-shards`` is never a run or a checkpoint, and no checkpoint may be
saved under a folder of that name.

A *run* is a prefix whose checkpoints are its immediate sub-prefixes, named
``step_{step:09d}`` by the Checkpointer (:func:`checkpoint_name`, :data:`STEP_NAME`); the
names frameworks give (``step-4``, ``epoch=0-step=4.ckpt``, ``global_step4``,
``checkpoint-4``) parse too (:func:`checkpoint_step`, or a pattern of the run's own,
:func:`compile_step_pattern`). Its
control objects are never checkpoints and never deleted by retention: ``s3ckpt.latest.json``
(:data:`LATEST_NAME`, the Checkpointer's pointer to the latest checkpoint) and
``s3ckpt.lease`` (:data:`LEASE_NAME`, the pruner's lease) in the run, and
``s3ckpt.pin.json`` (:data:`PIN_NAME`, a pin set by ``s3ckpt pin``) in a checkpoint.

``{tag}`` is the first 8 hex digits of the save's id (:func:`save_tag`). Every per-save name
carries it, so a save's own objects and uploads can always be found, and no save ever
writes (or deletes) under another save's names. :func:`owned_tag` recognises these names;
anything else under a checkpoint prefix was not written by s3ckpt and is never deleted by
gc.

This module needs neither torch nor boto3 (the retention cron imports it).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from s3ckpt import _crc
from s3ckpt._gc import gc_paused
from s3ckpt._scalars import metric_scalar
from s3ckpt._step_names import (
    MAX_STEP_DIGITS,
    STEP_NAME,
    StepMatcher,
    checkpoint_step,
    compile_step_pattern,
)
from s3ckpt.errors import ConfigError, CorruptCheckpointError

__all__ = [
    "HEARTBEAT_INTERVAL",
    "LATEST_NAME",
    "LEASE_NAME",
    "PIN_NAME",
    "MAX_STEP_DIGITS",
    "STEP_NAME",
    "StepMatcher",
    "checkpoint_name",
    "checkpoint_step",
    "compile_step_pattern",
    "check_metrics",
    "tensor_framing_error",
    "MIN_GRACE_SECONDS",
    "MAX_MANIFEST_BYTES",
    "data_name",
    "heartbeat_name",
    "failure_name",
    "FAILED_PREFIX",
    "metadata_name",
    "owned_tag",
    "save_tag",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "METADATA_NAME",
    "ItemRecord",
    "Manifest",
    "ObjectRecord",
    # hashed prefixes
    "LAYOUT_FORMAT_VERSION",
    "MAX_FORMAT_VERSION",
    "SHARDS_DIR",
    "SHARD_SUFFIX",
    "HashedPrefixes",
    "ShardOwner",
    "check_checkpoint_prefix",
    "check_prefix_strategy",
    "in_shard_tree",
    "object_key",
    "shard_name",
    "shard_owner",
    "shard_tag",
]

FORMAT_NAME = "s3ckpt"
FORMAT_VERSION = 2
"""The version of a save in the default layout. 2: the manifest carries ``digest`` (SHA-256
of its canonical content); 1 had none."""
LAYOUT_FORMAT_VERSION = 3
"""The version of a save whose data objects are placed by a ``layout`` (:class:`HashedPrefixes`):
an s3ckpt that reads format 2 at most refuses it ("newer than this s3ckpt understands;
upgrade s3ckpt") instead of looking for the objects under the checkpoint prefix."""
MAX_FORMAT_VERSION = LAYOUT_FORMAT_VERSION
"""The newest ``format_version`` this s3ckpt reads."""
MANIFEST_NAME = "s3ckpt.json"
METADATA_NAME = ".metadata"
HEARTBEAT_PREFIX = "s3ckpt.alive."
FAILED_PREFIX = "s3ckpt.failed."
"""Start of a failure record's name, ``s3ckpt.failed.{tag}.{rank}`` (:func:`failure_name`)."""

LATEST_NAME = "s3ckpt.latest.json"
"""Run-level pointer to the latest checkpoint (written by the Checkpointer)."""
LEASE_NAME = "s3ckpt.lease"
"""Run-level pruner lease."""
PIN_NAME = "s3ckpt.pin.json"
"""Per-checkpoint pin: ``{"reason": ..., "pinned_at": ..., "by": ...}``."""
SHARDS_DIR = "s3ckpt-shards"
"""Reserved folder of a run: the data objects of its hashed-prefix saves
(:class:`HashedPrefixes`). Never a run or a checkpoint, never inside a checkpoint's URL."""

MAX_MANIFEST_BYTES = 512 * 1024 * 1024
"""The largest commit marker s3ckpt reads (512 MiB, some five million item rows: a save of
thousands of ranks with FSDP-sharded optimizer state stays well under it). A larger one is
not read at all (the catalog lists it as damaged), so a hostile object cannot exhaust the
memory of a scan."""
MAX_CREATED = 32503680000.0
"""3000-01-01T00:00:00Z: a marker's ``created`` must lie from the epoch to this."""
MAX_INT = 2**63 - 1
"""The largest size, offset, rank, step or version a marker may record (S3's own limits are
far below; a larger number is a hostile or corrupt marker, not a checkpoint)."""

HEARTBEAT_INTERVAL = 15.0
"""Seconds between a writing rank's heartbeats (``s3ckpt.alive.{tag}.{rank}``)."""
MIN_GRACE_SECONDS = 4 * HEARTBEAT_INTERVAL
"""The shortest grace period prune and gc accept: four missed heartbeats. A shorter one
could take a live save (one rank uploading a single large object) for a dead one."""

TAG_LEN = 8
_TAG = r"([0-9a-f]{8})"
_OWNED = (
    re.compile(r"__\d+_\d+\." + _TAG + r"\.distcp"),
    re.compile(re.escape(METADATA_NAME) + r"\." + _TAG),
    re.compile(re.escape(HEARTBEAT_PREFIX) + _TAG + r"\.\d+"),
    re.compile(re.escape(FAILED_PREFIX) + _TAG + r"\.\d+"),
)
_SEGMENT = re.compile(r"[^/\\\x00]+")
SHARD_SUFFIX = ".shard"
_SHARD_NAME = re.compile(r"(__\d+_\d+)\." + _TAG + re.escape(SHARD_SUFFIX))
_SHARD_HEX = re.compile(r"[0-9a-f]{1,3}")
_SHARDS_SEGMENT = SHARDS_DIR + "/"


def save_tag(save_id: str) -> str:
    """The 8-hex-digit tag every object of the save ``save_id`` carries in its name."""
    tag = save_id[:TAG_LEN].lower()
    if not re.fullmatch(_TAG, tag):
        raise ValueError(f"save id {save_id!r} does not start with {TAG_LEN} hex digits")
    return tag


def data_name(rank: int, index: int, tag: str) -> str:
    """Name of data object ``index`` of ``rank`` in the save tagged ``tag``."""
    return f"__{rank}_{index}.{tag}.distcp"


def metadata_name(tag: str) -> str:
    """Name of the ``.metadata`` the save tagged ``tag`` writes (and its marker commits)."""
    return f"{METADATA_NAME}.{tag}"


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
    for pattern in _OWNED:
        m = pattern.fullmatch(name)
        if m is not None:
            return m.group(1)
    return None


def shard_name(rank: int, index: int, tag: str) -> str:
    """Name of data object ``index`` of ``rank`` in the hashed-prefix save tagged ``tag``
    (it lives in the run's shard folder, see :class:`HashedPrefixes`)."""
    return f"__{rank}_{index}.{tag}{SHARD_SUFFIX}"


def shard_tag(name: str) -> str | None:
    """The save tag of a hashed-prefix data name (:func:`shard_name`), else None."""
    m = _SHARD_NAME.fullmatch(name)
    return m.group(2) if m else None


MIN_FANOUT = 2
MAX_FANOUT = 4096


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
        if (
            isinstance(f, bool)
            or not isinstance(f, int)
            or not MIN_FANOUT <= f <= MAX_FANOUT
            or f & (f - 1)
        ):
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
        return cls(_nonneg(doc.get("fanout")))


def _split_checkpoint(prefix: str) -> tuple[str, str]:
    """``runs/a/step_1/`` -> (``runs/a/``, ``step_1``); ``step_1/`` -> (``""``, ``step_1``).

    One trailing ``/`` is dropped, as :func:`s3ckpt.uri.split_prefix` does (``uri`` is this
    module's sibling layer, so the two lines are repeated here): ``run/step_1//`` names no
    checkpoint folder, and :func:`shard_owner` reads keys back the same way."""
    head, sep, ckpt = (prefix[:-1] if prefix.endswith("/") else prefix).rpartition("/")
    run = head + sep
    if not ckpt:
        raise ConfigError(
            "hashed prefixes need a checkpoint prefix under a run (the shard folder is placed "
            f"in the run); '{prefix}' names no checkpoint folder (the bucket's root, or a "
            "prefix ending in an empty segment)"
        )
    return run, ckpt


def object_key(prefix: str, name: str, layout: HashedPrefixes | None) -> str:
    """The key of data object ``name`` of the checkpoint at ``prefix`` in ``layout``
    (``None``: the default, directly under the prefix)."""
    return prefix + name if layout is None else layout.key(prefix, name)


def in_shard_tree(key: str) -> bool:
    """Whether a folder on ``key``'s path is named :data:`SHARDS_DIR`."""
    return key.startswith(_SHARDS_SEGMENT) or ("/" + _SHARDS_SEGMENT) in key


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
    parts = key.rsplit("/", 4)
    if len(parts) == 4:
        run, (shards, h, ckpt, name) = "", parts
    elif len(parts) == 5:
        run, shards, h, ckpt, name = parts[0] + "/", *parts[1:]
    else:
        return None
    if shards != SHARDS_DIR or not _SHARD_HEX.fullmatch(h):
        return None
    tag = shard_tag(name)
    if tag is None or not _SEGMENT.fullmatch(ckpt) or ckpt in (".", "..", SHARDS_DIR):
        return None
    if in_shard_tree(run):
        return None
    return ShardOwner(f"{run}{ckpt}/", name, tag)


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


def checkpoint_name(step: int) -> str:
    """The sub-prefix of a run that holds ``step``'s checkpoint: ``step_000001000``.

    Nine digits sort correctly up to a billion steps; larger steps still parse, up to
    :data:`MAX_STEP_DIGITS` digits (a longer name would not read back as a step).
    """
    if step < 0 or step >= 10**MAX_STEP_DIGITS:
        raise ConfigError(f"step must be from 0 to 10**{MAX_STEP_DIGITS} - 1, got {step}")
    return f"step_{step:09d}"


def check_metrics(metrics: Mapping[str, Any] | None) -> dict[str, float]:
    """Metrics as the manifest records them: string names, float values.

    NaN and +-inf are kept (a diverging run needs exactly that checkpoint, and retention
    ranks NaN worst); anything that is not a real number is a :class:`ConfigError`. A
    one-element tensor or numpy value is read with ``.item()`` (:func:`metric_scalar`).
    """
    out: dict[str, float] = {}
    for name, value in (metrics or {}).items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"metric names must be non-empty strings, got {name!r}")
        value = metric_scalar(name, value)
        if isinstance(value, bool):
            raise ConfigError(f"metric {name!r} must be a number, got a bool")
        try:
            out[name] = float(value)
        except (TypeError, ValueError):
            raise ConfigError(
                f"metric {name!r} must be a number, got {type(value).__name__} {value!r}"
            ) from None
    return out


FRAMING_HEAD = 512
"""Bytes before a tensor's data that hold its zip local file header (30 bytes, the record
name, and torch's alignment padding of at most 64 bytes)."""
FRAMING_TAIL = 24
"""Bytes after a tensor's data that hold its zip data descriptor (ZIP64: 24 bytes)."""


def tensor_framing_error(
    head: bytes | bytearray | memoryview, tail: bytes | bytearray | memoryview, nbytes: int
) -> str | None:
    """Why ``data_offset`` does not point at a tensor's data inside its item, or None.

    An item is ``torch.save``'s zip archive; the tensor's bytes are the data of one record:
    a local file header ends exactly where they begin, and a data descriptor carrying their
    size follows them. Checking both pins ``data_offset`` and the length independently of
    the manifest, so even a manifest re-sealed with a valid digest cannot make a reader take
    other bytes for the tensor. ``head`` ends at ``data_offset`` (at least
    :data:`FRAMING_HEAD` bytes of it, or all there is); ``tail`` starts right after the data.
    """
    head = bytes(head[-FRAMING_HEAD:])
    at = head.rfind(b"PK\x03\x04")
    if at < 0 or len(head) - at < 30:
        return "no zip record header ends where the tensor data is said to begin"
    name_len = int.from_bytes(head[at + 26 : at + 28], "little")
    extra_len = int.from_bytes(head[at + 28 : at + 30], "little")
    if at + 30 + name_len + extra_len != len(head):
        return "the zip record header before the tensor data does not end at data_offset"
    if b"/data/" not in head[at + 30 : at + 30 + name_len]:
        return "the zip record before the tensor data is not a tensor storage"
    tail = bytes(tail[:FRAMING_TAIL])
    if tail[:4] != b"PK\x07\x08" or len(tail) < 16:
        return "no zip data descriptor follows the tensor data"
    small = (int.from_bytes(tail[8:12], "little"), int.from_bytes(tail[12:16], "little"))
    large = (
        (int.from_bytes(tail[8:16], "little"), int.from_bytes(tail[16:24], "little"))
        if len(tail) >= 24
        else None
    )
    if small != (nbytes, nbytes) and large != (nbytes, nbytes):
        return f"the zip record of the tensor data is not {nbytes} bytes long"
    return None


def _check_name(value: Any, what: str) -> str:
    """A name relative to the checkpoint prefix: one path segment, never ``.``/``..``."""
    name = _str(value)
    if not _SEGMENT.fullmatch(name) or name in (".", ".."):
        raise ValueError(f"{what} {name!r} is not a plain name inside the checkpoint prefix")
    return name


def _canonical(doc: Mapping[str, Any]) -> bytes:
    body = {k: v for k, v in doc.items() if k != "digest"}
    return json.dumps(
        body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode("ascii")


def _digest(doc: Mapping[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(_canonical(doc)).hexdigest()


def _metric_json(value: float) -> float | str:
    """Finite metrics as JSON numbers; NaN and +-inf as the strings float() reads back."""
    value = float(value)
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


_ITEM_FIELDS = ["fqn", "offset", "object", "start", "length", "crc32c", "data_offset"]


@dataclass(frozen=True)
class ObjectRecord:
    """One data object of the checkpoint."""

    name: str
    """Object name relative to the checkpoint prefix."""
    size: int
    rank: int


@dataclass(frozen=True)
class ItemRecord:
    """Where one saved item lives and its checksum.

    ``fqn`` and ``offset`` identify the item as DCP's ``MetadataIndex`` does (the
    state-dict key and, for a tensor shard, the shard's offsets in the full tensor).
    """

    fqn: str
    offset: tuple[int, ...] | None
    object: str
    start: int
    length: int
    crc32c: int
    data_offset: int | None = None
    """For tensors: where the raw tensor bytes begin inside the item (``torch.save``
    framing precedes them); lets a reader stream them straight into the destination."""

    @property
    def key(self) -> tuple[str, tuple[int, ...] | None]:
        """Lookup key matching a DCP ``MetadataIndex`` (fqn, offset)."""
        return (self.fqn, self.offset)


@dataclass(frozen=True)
class Manifest:
    """Contents of ``s3ckpt.json``."""

    save_id: str
    created: float
    world_size: int
    metadata_key: str
    metadata_crc32c: int
    metadata_size: int
    objects: tuple[ObjectRecord, ...]
    items: tuple[ItemRecord, ...]
    step: int | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    user: Mapping[str, Any] = field(default_factory=dict)
    versions: Mapping[str, str] = field(default_factory=dict)
    byteorder: str = sys.byteorder
    format_version: int = FORMAT_VERSION
    layout: HashedPrefixes | None = None
    """Where the data objects are (``None``: directly under the checkpoint prefix); needs
    ``format_version`` :data:`LAYOUT_FORMAT_VERSION`, so older readers refuse the manifest
    instead of looking for the objects in the wrong place."""

    def __post_init__(self) -> None:
        if (self.layout is not None) != (self.format_version >= LAYOUT_FORMAT_VERSION):
            raise ValueError(
                f"a manifest has a layout iff it is format_version {LAYOUT_FORMAT_VERSION} or "
                f"newer (format_version {self.format_version}, layout {self.layout})"
            )

    def object_key(self, prefix: str, name: str) -> str:
        """The key of data object ``name`` of this save, checkpoint prefix ``prefix``."""
        return object_key(prefix, name, self.layout)

    @property
    def total_bytes(self) -> int:
        """Bytes in data objects plus metadata."""
        return sum(o.size for o in self.objects) + self.metadata_size

    def to_json(self) -> bytes:
        """Serialise (compact item rows, stable key order)."""
        with gc_paused():  # a list per item, no cycles (see s3ckpt._gc)
            return self._to_json()

    @property
    def tag(self) -> str:
        """The save tag every object of this save carries (see :func:`save_tag`)."""
        return self.save_id[:TAG_LEN]

    def _to_json(self) -> bytes:
        doc: dict[str, Any] = {
            "format": FORMAT_NAME,
            "format_version": self.format_version,
            "save_id": self.save_id,
            "created": self.created,
            "step": self.step,
            "world_size": self.world_size,
            "byteorder": self.byteorder,
            **({"layout": self.layout.to_doc()} if self.layout is not None else {}),
            "versions": dict(self.versions),
            "metrics": {str(k): _metric_json(v) for k, v in self.metrics.items()},
            "user": dict(self.user),
            "metadata": {
                "key": self.metadata_key,
                "crc32c": f"{self.metadata_crc32c:08x}",
                "size": self.metadata_size,
            },
            "total_bytes": self.total_bytes,
            "objects": [[o.name, o.size, o.rank] for o in self.objects],
            "object_fields": ["name", "size", "rank"],
            "item_fields": _ITEM_FIELDS,
            "items": [
                [
                    i.fqn,
                    list(i.offset) if i.offset is not None else None,
                    i.object,
                    i.start,
                    i.length,
                    f"{i.crc32c:08x}",
                    i.data_offset,
                ]
                for i in self.items
            ],
        }
        if self.format_version >= 2:
            doc["digest"] = _digest(doc)
        return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode("utf-8")

    @classmethod
    def from_json(cls, raw: bytes, *, where: str = MANIFEST_NAME) -> Manifest:
        """Parse and validate; anything malformed raises :class:`CorruptCheckpointError`
        naming ``where``.

        Format 2 manifests must carry a ``digest`` matching their canonical content, so a
        changed offset, length, dtype-bearing field, checksum or object name is refused
        rather than read as wrong bytes. Every record is also checked for consistency
        (items inside their objects, names inside the prefix).
        """
        with gc_paused():  # a list and a record per item, no cycles (see s3ckpt._gc)
            if len(raw) > MAX_MANIFEST_BYTES:
                raise CorruptCheckpointError(
                    f"{where} is {len(raw)} bytes, more than the {MAX_MANIFEST_BYTES} a commit "
                    "marker may have; it was not written by s3ckpt",
                    key=where,
                )
            try:
                doc = json.loads(raw.decode("utf-8"))
            except (ValueError, RecursionError) as exc:  # bad UTF-8 and JSON are ValueErrors
                raise CorruptCheckpointError(
                    f"{where} is not valid JSON ({_short(exc)})", key=where
                ) from None
            try:
                return cls._from_doc(doc)
            except _NewerFormat as exc:
                raise CorruptCheckpointError(
                    f"{where} was written by a newer s3ckpt: {exc} to read it",
                    key=where,
                ) from None
            except _DigestMismatch as exc:
                raise CorruptCheckpointError(
                    f"{where} does not match its own digest ({exc}): it was changed or "
                    "corrupted after it was written; do not load it (restore the object, or "
                    "load an earlier checkpoint)",
                    key=where,
                ) from None
            except _MALFORMED as exc:
                raise CorruptCheckpointError(
                    f"{where} is malformed ({type(exc).__name__}: {_short(exc)}); it was not "
                    "written by a compatible s3ckpt, or it was modified",
                    key=where,
                ) from None

    @classmethod
    def _from_doc(cls, doc: Any) -> Manifest:
        if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
            raise ValueError("missing 'format': 's3ckpt'")
        version = _nonneg(doc["format_version"])
        if version > MAX_FORMAT_VERSION:
            raise _NewerFormat(
                f"format_version {version} is newer than this s3ckpt understands "
                f"({MAX_FORMAT_VERSION}); upgrade s3ckpt"
            )
        if version >= 2:
            recorded = doc.get("digest")
            if not isinstance(recorded, str):
                raise ValueError(f"format_version {version} needs a 'digest'")
            actual = _digest(doc)
            if recorded != actual:
                raise _DigestMismatch(f"recorded {recorded}, content hashes to {actual}")
        if doc["item_fields"] != _ITEM_FIELDS:
            raise ValueError(f"item_fields {doc['item_fields']!r} != {_ITEM_FIELDS!r}")
        meta = doc["metadata"]
        objects = tuple(
            ObjectRecord(_check_name(n, "object name"), _nonneg(s), _nonneg(r))
            for n, s, r in doc["objects"]
        )
        items = tuple(_item(row) for row in doc["items"])
        sizes = {o.name: o.size for o in objects}
        for item in items:
            size = sizes.get(item.object)
            if size is None:
                raise ValueError(f"item {item.fqn!r} names object {item.object!r}, not listed")
            if item.start + item.length > size:
                raise ValueError(
                    f"item {item.fqn!r} ends at byte {item.start + item.length}, past the end "
                    f"of {item.object!r} ({size} bytes)"
                )
            if item.data_offset is not None and item.data_offset > item.length:
                raise ValueError(f"item {item.fqn!r} has data_offset past its end")
        meta_key = _check_name(meta["key"], "metadata key")
        if meta_key != METADATA_NAME and not meta_key.startswith(METADATA_NAME + "."):
            raise ValueError(f"metadata key {meta_key!r} is not a .metadata object")
        layout = None
        if version >= LAYOUT_FORMAT_VERSION:
            layout = HashedPrefixes.from_doc(doc["layout"])
            for o in objects:
                if shard_tag(o.name) is None:
                    raise ValueError(f"object {o.name!r} is no hashed-prefix data name")
        elif "layout" in doc:
            raise ValueError(f"a layout needs format_version {LAYOUT_FORMAT_VERSION}")
        step = doc.get("step")
        return cls(
            save_id=_str(doc["save_id"]),
            created=_created(doc["created"]),
            world_size=_nonneg(doc["world_size"]),
            metadata_key=meta_key,
            metadata_crc32c=int(meta["crc32c"], 16),
            metadata_size=_nonneg(meta["size"]),
            objects=objects,
            items=items,
            step=None if step is None else _nonneg(step),
            metrics={str(k): _metric(v) for k, v in (doc.get("metrics") or {}).items()},
            user=dict(doc.get("user") or {}),
            versions={str(k): str(v) for k, v in (doc.get("versions") or {}).items()},
            byteorder=_str(doc.get("byteorder", "little")),
            format_version=version,
            layout=layout,
        )

    def item_index(self) -> dict[tuple[str, tuple[int, ...] | None], ItemRecord]:
        """Items by (fqn, offset)."""
        with gc_paused():
            return {i.key: i for i in self.items}


# Whatever a hostile document can make the parser raise: wrong types (TypeError,
# AttributeError), missing keys, bad values, too large a number for a float (OverflowError)
# or too deep a nesting (RecursionError). Each is a damaged marker, never a crash.
_MALFORMED = (
    KeyError,
    TypeError,
    ValueError,
    IndexError,
    AttributeError,
    OverflowError,
    RecursionError,
)


class _DigestMismatch(ValueError):
    """The manifest's content does not hash to its recorded digest."""


class _NewerFormat(ValueError):
    """The manifest's ``format_version`` is newer than this s3ckpt reads."""


def _metric(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(f"metric must be a number, got {type(value).__name__}")
    if isinstance(value, str) and value not in ("NaN", "Infinity", "-Infinity"):
        raise ValueError(f"metric {value!r} is not a number")
    return float(value)


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _nonneg(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INT:
        raise ValueError(f"expected an integer from 0 to 2**63-1, got {_short(value)}")
    return value


def _created(value: Any) -> float:
    """A commit time: a number of seconds since the epoch that a datetime can hold."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"created must be a number, got {type(value).__name__}")
    if not 0 <= value < MAX_CREATED:  # NaN fails this too
        raise ValueError(
            f"created {_short(value)} is not a time from 1970 to 3000 (seconds since the epoch)"
        )
    return float(value)


def _short(value: Any, limit: int = 200) -> str:
    """``repr(value)`` (for an exception, its message) cut to ``limit`` characters: a hostile
    marker must not make an error line megabytes long."""
    text = str(value) if isinstance(value, BaseException) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _item(row: Sequence[Any]) -> ItemRecord:
    fqn, offset, obj, start, length, crc, data_offset = row
    if offset is not None:
        offset = tuple(_nonneg(x) for x in offset)
    if data_offset is not None:
        data_offset = _nonneg(data_offset)
    name = _check_name(obj, "object name")
    return ItemRecord(
        fqn=_str(fqn),
        offset=offset,
        object=name,
        start=_nonneg(start),
        length=_nonneg(length),
        crc32c=int(_str(crc), 16),
        data_offset=data_offset,
    )
