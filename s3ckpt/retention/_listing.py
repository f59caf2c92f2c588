"""Grouping one listing into checkpoint prefixes: which keys and open uploads belong to which
checkpoint, and what each prefix holds (its marker, metadata, pins, heartbeats, failure
records, and the newest activity of each save tag). :mod:`s3ckpt.retention._scan` decides
states from the groups; the layout rules are in its docstring.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from s3ckpt.format._names import (
    FAILED_PREFIX,
    HEARTBEAT_PREFIX,
    LEASE_NAME,
    LEASE_PROBE,
    MANIFEST_NAME,
    METADATA_NAME,
    PIN_NAME,
    in_shard_tree,
    owned_tag,
    shard_owner,
)
from s3ckpt.retention._catalog import DEFAULT_STORAGE_CLASS
from s3ckpt.store.base import ObjectInfo, UploadInfo
from s3ckpt.uri import StoreURL

__all__ = ["Group", "ckpt_dir", "group_listing"]


@dataclass
class Group:
    """Objects of one checkpoint prefix while scanning."""

    keys: list[str] = field(default_factory=list)
    size: int = 0
    by_class: dict[str, int] = field(default_factory=dict)
    """``size`` per storage class (an object the listing gives no class bills as STANDARD)."""
    count: int = 0
    newest: float | None = None
    marker: ObjectInfo | None = None
    metadata: ObjectInfo | None = None
    saved_metadata: dict[str, float] = field(default_factory=dict)
    """LastModified of each per-save ``.metadata.{tag}`` (the commit time, store's clock)."""
    pin: bool = False
    tags: dict[str, float] = field(default_factory=dict)
    """Newest activity per save tag (objects, heartbeats and uploads directly under it, and
    its data objects and uploads in the run's shard folder)."""
    untagged: float | None = None
    """Newest activity of everything else (stock DCP names, foreign files, nested keys)."""
    heartbeats: dict[str, list[str]] = field(default_factory=dict)
    """Heartbeat keys per tag."""
    dead: set[str] = field(default_factory=set)
    """Tags whose writing process is provably gone (see s3ckpt._commit.writer_gone), or
    that recorded their failure."""
    failed: dict[str, list[tuple[str, float | None]]] = field(default_factory=dict)
    """Failure records per tag (``s3ckpt.failed.{tag}.{rank}``): key and LastModified."""
    uploads: list[UploadInfo] = field(default_factory=list)

    def touch(self, when: float | None, tag: str | None = None) -> None:
        if when is None:
            return
        self.newest = when if self.newest is None else max(self.newest, when)
        if tag is not None:
            self.tags[tag] = max(self.tags.get(tag, when), when)
        else:
            self.untagged = when if self.untagged is None else max(self.untagged, when)


def ckpt_dir(key: str) -> str | None:
    """The checkpoint prefix (ending in ``/``) a key declares: only a name s3ckpt or DCP
    writes does (a folder's name never does); in a shard folder, only a hashed-prefix data
    name, which declares its checkpoint outside the shard folder."""
    if in_shard_tree(key):
        owner = shard_owner(key)
        return owner.checkpoint if owner is not None else None
    head, sep, base = key.rpartition("/")
    own = base in (MANIFEST_NAME, METADATA_NAME, PIN_NAME) or base.endswith(".distcp")
    return head + "/" if sep and (own or owned_tag(base) is not None) else None


def group_listing(
    root: StoreURL, objects: Sequence[ObjectInfo], uploads: Sequence[UploadInfo]
) -> tuple[dict[str, Group], dict[str, float | None], dict[str, list[ObjectInfo]]]:
    """The checkpoint prefixes under ``root`` with what each holds, the runs holding a
    lease (their prefixes, with the lease's LastModified), and the capability probes left
    beside a run's lease (:data:`~s3ckpt.format._names.LEASE_PROBE`), by run."""
    dirs = (ckpt_dir(k) for k in [*(o.key for o in objects), *(u.key for u in uploads)])
    groups = {d: Group() for d in dirs if d is not None and d.startswith(root.prefix)}
    runs_with_lease: dict[str, float | None] = {}
    probes: dict[str, list[ObjectInfo]] = {}
    for obj in objects:
        base = obj.key.rpartition("/")[2]
        if base == LEASE_NAME and not in_shard_tree(obj.key):
            runs_with_lease[obj.key[: -len(base)]] = obj.last_modified
        elif LEASE_PROBE.fullmatch(base) and not in_shard_tree(obj.key):
            probes.setdefault(obj.key[: -len(base)], []).append(obj)
        g, name, tag = _place(groups, obj.key)
        if g is None:
            continue
        g.keys.append(obj.key)
        if name == PIN_NAME:
            g.pin = True
            continue
        g.size += obj.size
        sc = obj.storage_class or DEFAULT_STORAGE_CLASS
        g.by_class[sc] = g.by_class.get(sc, 0) + obj.size
        g.count += 1
        g.touch(obj.last_modified, tag)
        if name == MANIFEST_NAME:
            g.marker = obj
        elif name == METADATA_NAME:
            g.metadata = obj
        elif tag is None or name is None:
            continue
        elif name.startswith(HEARTBEAT_PREFIX):
            g.heartbeats.setdefault(tag, []).append(obj.key)
        elif name.startswith(FAILED_PREFIX):
            g.failed.setdefault(tag, []).append((obj.key, obj.last_modified))
        elif name.startswith(METADATA_NAME + ".") and obj.last_modified is not None:
            g.saved_metadata[name] = obj.last_modified
    for up in uploads:
        g, _, tag = _place(groups, up.key)
        if g is not None:
            g.uploads.append(up)
            g.touch(up.initiated, tag)
    return groups, runs_with_lease, probes


def _place(groups: Mapping[str, Group], key: str) -> tuple[Group | None, str | None, str | None]:
    """The checkpoint group holding ``key`` (the innermost whose prefix holds it); the key's
    name in it when it is one of the checkpoint's own (directly under its prefix, or one of
    its data objects in the run's shard folder), else None (a nested key); and the save tag
    that name carries, if any."""
    if in_shard_tree(key):  # no owner: in a shard folder, but no checkpoint's (nobody's)
        o = shard_owner(key)
        return (groups.get(o.checkpoint), o.name, o.tag) if o is not None else (None, None, None)
    head, name = key, key.rpartition("/")[2]
    while "/" in head:
        head = head.rpartition("/")[0]
        g = groups.get(head + "/")
        if g is not None:
            direct = key == f"{head}/{name}"
            return g, name if direct else None, owned_tag(name) if direct else None
    return None, None, None
