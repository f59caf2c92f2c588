"""Hashed prefixes: a save's data objects spread over a run's reserved shard folder.

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
from s3ckpt.errors import ConfigError
from s3ckpt.format._names import SEGMENT, TAG_PATTERN, nonneg

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
