"""What is committed at a checkpoint prefix: the marker and the ``.metadata`` it commits.

:func:`locate` is how :class:`~s3ckpt.dcp.S3StorageReader` opens a checkpoint: it reads
``s3ckpt.json``, the ``.metadata`` bytes and the item records the marker commits (each checked
against it), or,
without a marker, the ``.metadata`` of a stock DCP checkpoint, refusing an s3ckpt save
that never committed unless asked.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from functools import partial

from s3ckpt._commit import (
    at_once,
    check_metadata,
    get_or_none,
    metadata_matches,
    read_items,
    read_marker,
)
from s3ckpt._tombstone import Tombstone, deleted_error
from s3ckpt.errors import (
    CheckpointNotFoundError,
    S3CkptError,
    UncommittedCheckpointError,
)
from s3ckpt.format._manifest import Manifest
from s3ckpt.format._names import MANIFEST_NAME, METADATA_NAME, SHARDS_DIR, owned_tag, shard_tag
from s3ckpt.metrics.instrument import expecting
from s3ckpt.store import ObjectStore
from s3ckpt.uri import StoreURL

__all__ = ["locate", "object_keys"]

log = logging.getLogger(__name__)


def locate(
    store: ObjectStore, url: StoreURL, *, allow_uncommitted: bool, roll_forward: bool
) -> tuple[Manifest | None, str, bytes]:
    """The marker (None without one) with its item records, and the key and bytes of the
    ``.metadata`` to load.

    Cost: one GET of the marker, then one or two GETs of ``.metadata`` copies (plus a GET
    and a PUT when rolling forward) beside one GET of the item records (format 4); without
    a marker, one LIST of the prefix first.

    Raises:
        CheckpointNotFoundError: neither a marker nor a ``.metadata`` at ``url``, or the
            marker key holds a tombstone (the step was deleted, or is being deleted:
            :mod:`s3ckpt._tombstone`).
        UncommittedCheckpointError: an s3ckpt save without its marker is at ``url`` and
            not ``allow_uncommitted``.
        CorruptCheckpointError: the marker is malformed, no ``.metadata`` copy is the
            one it commits, or its item records are missing or damaged.
    """
    marker_key = url.key(MANIFEST_NAME)
    with expecting("not_found"):
        raw_marker = get_or_none(store, marker_key)
    if raw_marker is None:  # no marker: a stock DCP checkpoint, or uncommitted
        return (None, *_uncommitted_metadata(store, url, allow_uncommitted))
    # A tombstone: pruned, gc'd or removed (deleted, not damaged).
    if (tomb := Tombstone.parse(raw_marker)) is not None:
        raise deleted_error(url, tomb, bucket=store.bucket, key=marker_key)
    manifest = Manifest.from_json(raw_marker, where=marker_key)
    manifest, (key, raw) = at_once(
        lambda: read_items(store, url, manifest),
        lambda: _committed_metadata(store, url, manifest, roll_forward),
    )
    return manifest, key, raw


def _committed_metadata(
    store: ObjectStore, url: StoreURL, manifest: Manifest, roll_forward: bool
) -> tuple[str, bytes]:
    """The committed ``.metadata`` bytes, checked against the manifest.

    The plain ``.metadata`` is read first (one GET, as for any DCP checkpoint). If it
    is not the committed one (a commit interrupted after its marker, or an overwrite
    whose copy did not land), the committed ``.metadata.{tag}`` is read instead and
    the plain copy rolled forward, so stock DCP readers see the committed state too.
    """
    plain_key = url.key(METADATA_NAME)
    raw = get_or_none(store, plain_key)
    if raw is not None and metadata_matches(raw, manifest):
        return plain_key, raw
    meta_key = url.key(manifest.metadata_key)
    if manifest.metadata_key == METADATA_NAME:  # format 1: the plain one is the committed one
        return meta_key, check_metadata(raw, manifest, bucket=store.bucket, key=meta_key)
    raw = check_metadata(get_or_none(store, meta_key), manifest, bucket=store.bucket, key=meta_key)
    if roll_forward:
        _roll_forward(store, url, manifest, raw)
    return meta_key, raw


def _roll_forward(store: ObjectStore, url: StoreURL, manifest: Manifest, raw: bytes) -> None:
    """Best effort: publish the committed metadata as the plain ``.metadata``.

    Only while the marker still names this save (a newer overwrite publishes its own),
    and never fatal to the load (a read-only role cannot write; gc does it too).
    """
    try:
        again = read_marker(store, url)
        if again is None or again[0].save_id != manifest.save_id:
            return
        store.put(url.key(METADATA_NAME), raw)
        log.info("s3ckpt: rolled %s forward: .metadata is the committed one again", url)
    except S3CkptError as exc:
        log.info("s3ckpt: could not roll %s forward (%s); gc will", url, exc)


def _uncommitted_metadata(
    store: ObjectStore, url: StoreURL, allow_uncommitted: bool
) -> tuple[str, bytes]:
    """``.metadata`` of a prefix without a commit marker: a stock DCP checkpoint, or an
    s3ckpt save that never committed, which is refused unless ``allow_uncommitted``."""
    marker_key = url.key(MANIFEST_NAME)
    names = (info.key[len(url.prefix) :] for info in store.list(url.prefix))
    owned = [name for name in names if "/" not in name and owned_tag(name) is not None]
    if owned and not allow_uncommitted:
        raise UncommittedCheckpointError(
            f"{url} holds an s3ckpt save that never committed (no {MANIFEST_NAME}): "
            "it is still being written, or it was killed or failed. Load a committed "
            "checkpoint (`s3ckpt ls` lists them), wait for the save to finish, or pass "
            "allow_uncommitted=True to load it anyway, without any checksum",
            bucket=store.bucket,
            key=marker_key,
        )
    tagged = sorted(url.key(name) for name in owned if name.startswith(METADATA_NAME + "."))
    for key in [url.key(METADATA_NAME), *tagged]:
        raw = get_or_none(store, key)
        if raw is not None:
            return key, raw
    raise CheckpointNotFoundError(
        f"no checkpoint at {url}: neither {MANIFEST_NAME} nor {METADATA_NAME} "
        "exists; check the URL, or the save did not finish",
        bucket=store.bucket,
        key=marker_key,
    )


def object_keys(
    store: ObjectStore, url: StoreURL, manifest: Manifest | None, names: Iterable[str]
) -> Callable[[str], str]:
    """The key of each data object of the checkpoint at ``url``, by its name in
    ``.metadata`` (``names``: those names): where the marker's layout puts it, else
    directly under the prefix.

    Raises:
        UncommittedCheckpointError: there is no marker and ``names`` are data names of a
            hashed-prefix save: only its ``s3ckpt.json`` says where they are.
    """
    if manifest is not None:
        return partial(manifest.object_key, url.prefix) if manifest.layout else url.key
    for name in set(names):
        if shard_tag(name) is not None:
            raise UncommittedCheckpointError(
                f"{url} is a save with hashed prefixes (its data objects, such as {name}, "
                f"are in the run's {SHARDS_DIR}/ folder) and has no {MANIFEST_NAME}: only "
                "the commit marker records where they are, so it cannot be loaded. Load a "
                "committed checkpoint (`s3ckpt ls` lists them); if this save never "
                "committed, `s3ckpt gc` removes it once its grace period is over",
                bucket=store.bucket,
                key=url.key(MANIFEST_NAME),
            )
    return url.key
