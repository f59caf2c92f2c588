"""The shallow scan's walk: find runs and checkpoint prefixes with delimited listings, and
read each committed checkpoint's marker (one GET) instead of listing its keys.

A deep scan (:mod:`s3ckpt.retention._scan`) lists every key under the prefix: at 1,000
runs x 100 checkpoints x 4,096 ranks that is 6.6 M LIST requests (docs/scale.md). The
shallow walk visits folders instead:

1. A folder is listed with ``Delimiter="/"`` (:func:`s3ckpt.store.folder.list_folder`):
   its direct objects and its sub-folders, one page per 1,000.
2. A sub-folder whose name gives a step (:func:`s3ckpt._step_names.checkpoint_step`, or the
   run's ``step_pattern``) is probed: one GET of its ``s3ckpt.json``, which also returns the
   marker's size, ETag and LastModified. Found: a committed checkpoint, never listed;
   what the marker records (step, metrics, objects and sizes, shard keys of hashed
   prefixes) describes it. Absent: the sub-folder is walked like any other.
3. A folder whose direct objects declare a checkpoint (:func:`~s3ckpt.retention._listing.
   ckpt_dir`: a marker, a ``.metadata``, per-save names...) is a checkpoint the probe did
   not prove committed (being written, abandoned, foreign, failed, or not step-named): it
   is listed deeply, exactly as a deep scan sees it. Only those.
4. ``s3ckpt-shards/`` is never walked (its keys are in the markers), nor is anything inside
   a committed checkpoint.

Decisions. A name decides only whether a folder is *probed*, never what it is: a committed
checkpoint with an odd name is listed and recognised by its marker, at the deep
cost. What the walk cannot know (pins, an overwrite in progress, failure records, storage
classes, nested keys, the shards of an uncommitted hashed save) is left unknown on the
record (:attr:`~s3ckpt.retention.CheckpointInfo.shallow`); a prune lists what it would
delete before deleting it (:mod:`s3ckpt.retention._recheck`), and gc and rm always list
deeply. Markers are read 16 at a time (``READ_WORKERS``), like a deep scan's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from s3ckpt._step_names import checkpoint_step
from s3ckpt._tombstone import Tombstone
from s3ckpt.errors import CorruptCheckpointError, ObjectNotFoundError
from s3ckpt.format._manifest import MAX_MANIFEST_BYTES, Manifest
from s3ckpt.format._names import LEASE_NAME, MANIFEST_NAME, SHARDS_DIR
from s3ckpt.metrics.instrument import expecting
from s3ckpt.retention._check_record import read_each
from s3ckpt.retention._listing import ckpt_dir
from s3ckpt.retention._options import StepPatternLike
from s3ckpt.store.base import ObjectInfo, ObjectStore
from s3ckpt.store.folder import get_info, list_folder
from s3ckpt.uri import StoreURL, split_prefix

__all__ = ["Marker", "committed_keys", "find_runs", "parse_marker", "probe", "walk"]


@dataclass(frozen=True)
class Marker:
    """A commit marker read by the walk: what it says (or why it cannot be read) and the
    object as the GET saw it (size, ETag, LastModified)."""

    manifest: Manifest | str
    info: ObjectInfo


def probe(store: ObjectStore, folder: str) -> Marker | None:
    """The marker of ``folder`` (one GET), or None when it has none."""
    key = folder + MANIFEST_NAME
    try:
        with expecting("not_found"):  # most probes of a run's folders find none
            raw, info = get_info(store, key, MAX_MANIFEST_BYTES)
    except ObjectNotFoundError:
        return None
    found = parse_marker(key, raw, info.size)
    # A tombstone: fenced, listed like an uncommitted prefix (being deleted, or gone).
    return None if isinstance(found, Tombstone) else Marker(found, info)


def parse_marker(key: str, raw: bytes | None, size: int) -> Manifest | Tombstone | str:
    """The commit marker at ``key`` (``raw``: its body, None when not read for its
    ``size``), the tombstone there, or why it cannot be read (damaged, too large)."""
    if raw is None or size > MAX_MANIFEST_BYTES:
        return (
            f"{key} is {size} bytes, more than the {MAX_MANIFEST_BYTES} a commit marker may "
            "have; not read"
        )
    try:
        return Tombstone.parse(raw) or Manifest.from_json(raw, where=key)
    except CorruptCheckpointError as exc:
        return exc.message


def _visit(store: ObjectStore, folder: str) -> tuple[list[ObjectInfo], list[str], bool]:
    """``folder``'s direct objects, its sub-folders, and whether its objects declare it a
    checkpoint."""
    entries = list(list_folder(store, folder))
    objs = [e for e in entries if not isinstance(e, str)]
    subs = [e for e in entries if isinstance(e, str)]
    return objs, subs, any(ckpt_dir(o.key) == folder for o in objs)


def walk(
    store: ObjectStore, root: StoreURL, pattern: StepPatternLike | None
) -> tuple[list[ObjectInfo], dict[str, Marker]]:
    """Walk ``root`` (see the module docstring): every object it listed (direct objects of
    the folders it visited, and every key of the checkpoints it listed deeply), and the
    markers of the committed checkpoints it did not list, by checkpoint prefix.

    Request cost: one delimited LIST per 1,000 entries of every folder visited (the root,
    runs, grouping folders, uncommitted checkpoints), one GET per step-named sub-folder (a
    committed checkpoint's marker, or a 404), and a full listing of each checkpoint found
    uncommitted (its keys, as a deep scan lists them).
    """
    objects: list[ObjectInfo] = []
    markers: dict[str, Marker] = {}
    queue: deque[str] = deque([root.prefix])
    while queue:
        folder = queue.popleft()
        objs, subs, is_checkpoint = _visit(store, folder)
        objects.extend(objs)
        if is_checkpoint:
            for sub in subs:  # nested keys of an uncommitted checkpoint: as deep
                objects.extend(store.list(sub))
            continue
        subs = [s for s in subs if split_prefix(s)[1] != SHARDS_DIR]
        stepped = [s for s in subs if checkpoint_step(split_prefix(s)[1], pattern) is not None]
        probed = dict(zip(stepped, read_each(lambda d: probe(store, d), stepped), strict=True))
        markers.update((s, m) for s, m in probed.items() if m is not None)
        queue.extend(s for s in stepped if probed[s] is None)  # not committed: walked
        queue.extend(s for s in subs if s not in probed)
    return objects, markers


def find_runs(store: ObjectStore, root: StoreURL, pattern: StepPatternLike | None) -> list[str]:
    """The run prefixes under ``root`` (itself included), found by delimited listings
    alone: a folder is a run when it holds a lease, a sub-folder whose name gives a step, or
    a sub-folder whose own objects declare a checkpoint. Step-named sub-folders are taken
    for checkpoints without a request (each run's prune probes them); any other folder is
    walked. A run nested under a step-named folder is found only by a deep scan.

    Request cost: one delimited LIST per 1,000 entries of the root, of every run and of
    every other folder above the checkpoints.
    """
    runs: set[str] = set()
    queue: deque[str] = deque([root.prefix])
    while queue:
        folder = queue.popleft()
        objs, subs, is_checkpoint = _visit(store, folder)
        if is_checkpoint:
            parent = folder[:-1].rpartition("/")[0]
            if parent and (parent + "/").startswith(root.prefix):
                runs.add(parent + "/")
            continue
        if any(o.key == folder + LEASE_NAME for o in objs):
            runs.add(folder)
        for sub in subs:
            name = split_prefix(sub)[1]
            if name == SHARDS_DIR or checkpoint_step(name, pattern) is not None:
                runs.add(folder)
            else:
                queue.append(sub)
    return sorted(runs)


def committed_keys(prefix: str, manifest: Manifest) -> Iterator[tuple[str, int]]:
    """The keys a marker commits (the marker aside) with their sizes."""
    for name, size, _ in manifest.controls:
        yield prefix + name, size
    for o in manifest.objects:
        yield manifest.object_key(prefix, o.name), o.size
