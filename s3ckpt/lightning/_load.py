"""Reading a whole Lightning checkpoint in one process: what ``S3CheckpointIO.load_checkpoint``
returns, and what ``MyModule.load_from_checkpoint("s3://...")`` gets.

What is at a checkpoint path decides how it is read (:func:`load_remote`):

1. a committed s3ckpt checkpoint (the prefix ``path/`` holds ``s3ckpt.json``): a DCP load
   of every item, full tensors (no process group; a sharded checkpoint's shards are
   assembled), then the dict Lightning saved (:func:`rebuild`);
2. else an object at ``path`` (stock Lightning's ``torch.save`` file, say one s3fs wrote
   before the move to s3ckpt): :func:`s3ckpt.lightning._legacy.load_object`, streamed;
3. else the prefix as a DCP checkpoint (a stock DCP ``.metadata`` without a marker), or
   the reader's error: :class:`~s3ckpt.errors.CheckpointNotFoundError` (also a
   ``FileNotFoundError``) or :class:`~s3ckpt.errors.UncommittedCheckpointError`.

So when both an object ``last.ckpt`` and a committed prefix ``last.ckpt/`` exist (a run
that moved to s3ckpt and kept its old checkpoint), the committed s3ckpt checkpoint wins.

The dict comes back in Lightning's normal shape whichever writer made it:

* :class:`S3CheckpointIO` (one process): exactly as saved (packed,
  :mod:`s3ckpt.tools.packing`: the schema records container and key types; ``state_dict``
  is the ``OrderedDict`` it was, with its ``_metadata``);
* :class:`S3ModelParallelStrategy` (sharded): ``state_dict`` maps the model's parameter
  names to full tensors, ``optimizer_states`` is the list of optimizer state dicts as
  torch's ``get_optimizer_state_dict`` gives them (keyed by parameter name), and the rest
  of what Lightning saved (``epoch``, ``global_step``, ``hyper_parameters``, loops,
  callbacks...) is at the top level, as in a checkpoint Lightning saved in one file.

:func:`install_load_hook` makes ``LightningModule.load_from_checkpoint`` and
``LightningDataModule.load_from_checkpoint`` use this (see its docstring).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import torch.distributed.checkpoint as dcp
from fsspec.core import split_protocol
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata

from s3ckpt.dcp import S3StorageReader, SafeGlobal
from s3ckpt.errors import CheckpointNotFoundError, S3CkptError, StoreError
from s3ckpt.format import MANIFEST_NAME, METADATA_NAME
from s3ckpt.lightning._common import _REST, _dcp_call, _is_remote, _to_device, log
from s3ckpt.lightning._legacy import load_object
from s3ckpt.lightning._stores import location_for
from s3ckpt.store import Location
from s3ckpt.tools.packing import is_packed, item_destinations, unpack_state

__all__ = ["LoadSettings", "install_load_hook", "load_remote", "open_reader", "rebuild"]


@dataclass(frozen=True)
class LoadSettings:
    """How a plug-in reads, besides its store (which holds the S3 and transfer settings):
    extra safe globals and checksums."""

    safe_globals: tuple[SafeGlobal, ...] = ()
    verify_checksums: bool = True


def open_reader(
    location: Location, settings: LoadSettings, weights_only: bool | None
) -> S3StorageReader:
    """A reader of the checkpoint at ``location``; ``weights_only=False`` is full pickle."""
    return S3StorageReader(
        location.url,
        s3_config=location.s3_config,
        transfer_config=location.transfer_config,
        verify_checksums=settings.verify_checksums,
        allow_unsafe_pickle=weights_only is False,
        safe_globals=settings.safe_globals,
        store=location.store,
    )


def load_remote(
    location: Location,
    settings: LoadSettings,
    *,
    map_location: Any = None,
    weights_only: bool | None = None,
) -> dict[str, Any]:
    """The checkpoint at ``url``, as Lightning's ``CheckpointIO.load_checkpoint`` returns
    it (see the module for what is read and in which order).

    Cost: one HEAD of the marker, one of the object (two more when an object is read:
    its HEAD again after the read, to see it did not change), then the load.
    """
    url, store = location.url, location.store
    committed = store.head(url.key(MANIFEST_NAME)) is not None
    object_key = url.prefix.rstrip("/")
    obj = store.head(object_key) if object_key else None
    if obj is not None and committed:
        log.warning(
            "s3ckpt: %s is both an s3ckpt checkpoint (committed) and a single object (a "
            "stock Lightning checkpoint): loading the s3ckpt checkpoint. Delete the old "
            "object once nothing needs it (docs/frameworks/lightning.md, migrating)",
            url,
        )
    elif obj is not None:
        if store.head(url.key(METADATA_NAME)) is not None:
            log.warning(
                "s3ckpt: %s holds a single object and an uncommitted DCP checkpoint under "
                "the prefix: loading the object",
                url,
            )
        return load_object(
            store,
            obj,
            map_location=map_location,
            weights_only=weights_only,
            safe_globals=settings.safe_globals,
            block=location.transfer_config.part_size,
        )
    try:
        reader = open_reader(location, settings, weights_only)
    except CheckpointNotFoundError as exc:
        if type(exc) is not CheckpointNotFoundError:
            raise  # an uncommitted s3ckpt save: its own message says what to do
        raise CheckpointNotFoundError(
            f"no checkpoint at {url}: neither an s3ckpt checkpoint under the prefix "
            f"({MANIFEST_NAME} or {METADATA_NAME}) nor an object of that name; check the "
            "path (s3ckpt ls lists a run's checkpoints)",
            bucket=store.bucket,
            key=url.prefix,
        ) from exc
    flat = item_destinations(reader.metadata)
    with _dcp_call():
        dcp.load(flat, storage_reader=reader, planner=DefaultLoadPlanner(), no_dist=True)
    return _to_device(rebuild(flat, reader.metadata), map_location)


def rebuild(flat: Mapping[str, Any], metadata: Metadata) -> dict[str, Any]:
    """The checkpoint dict from the loaded items of a DCP checkpoint (keys as saved).

    One-process saves hold the packed dict at the top level (:mod:`s3ckpt.tools.packing`):
    unpacked exactly. Sharded saves hold ``state_dict`` and ``optimizer_N`` as DCP nested
    them, and the rest packed under ``lightning``: each item goes back to its place by the path
    DCP recorded for it (``planner_data``; names with dots stay whole), the rest is
    unflattened to the top level and the optimizers become ``optimizer_states``. Another
    DCP checkpoint comes back nested by those paths.
    """
    if is_packed(flat):
        out: dict[str, Any] = unpack_state(flat)
        return out
    paths: Mapping[str, Any] = metadata.planner_data or {}
    nested: dict[str, Any] = {}
    for fqn, value in flat.items():
        path = paths.get(fqn)
        _set_path(nested, tuple(path) if path else (fqn,), value)
    rest = nested.pop(_REST, None)
    if not is_packed(rest):
        if rest is not None:
            nested[_REST] = rest
        return nested
    ckpt: dict[str, Any] = unpack_state(rest)
    optimizers = sorted(
        (int(k.split("_", 1)[1]), k)
        for k in nested
        if k.startswith("optimizer_") and k.split("_", 1)[1].isdigit()
    )
    if "state_dict" in nested:
        ckpt["state_dict"] = nested.pop("state_dict")
    if optimizers:
        ckpt["optimizer_states"] = [nested.pop(k) for _, k in optimizers]
    ckpt.update(nested)
    return ckpt


def _set_path(root: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    """``root[path[0]][path[1]]... = value``, creating dicts (str keys) and lists (int
    indices, padded with None until every index is set) on the way."""
    node: Any = root
    for here, nxt in itertools.pairwise(path):
        empty: Any = [] if isinstance(nxt, int) else {}
        if isinstance(node, list):
            while len(node) <= here:
                node.append(None)
            if node[here] is None:
                node[here] = empty
            node = node[here]
        else:
            node = node.setdefault(here, empty)
    last = path[-1]
    if isinstance(node, list):
        while len(node) <= last:
            node.append(None)
    node[last] = value


# -- load_from_checkpoint -------------------------------------------------------------------


def _fsspec_reads(protocol: str) -> bool:
    """Whether an fsspec file system other than s3ckpt's own can open ``protocol`` here
    (s3fs for ``s3://``)."""
    try:
        cls = fsspec.get_filesystem_class(protocol)
    except (ImportError, ValueError):
        return False
    return not cls.__module__.startswith("s3ckpt.")


def _divert(path: str) -> Location | None:
    """Where s3ckpt reads ``path`` instead of Lightning's ``pl_load``: a checkpoint s3ckpt
    finds there (an s3ckpt or DCP prefix, or a single object), or any path of a scheme no
    other fsspec file system reads (no s3fs). Where the store cannot be asked and another
    file system can read the scheme, that one is left to (an s3fs set-up of its own)."""
    protocol, _ = split_protocol(path)
    native = _fsspec_reads(protocol or "")
    try:
        here = location_for(path)
        object_key = here.url.prefix.rstrip("/")
        keys = [
            here.key(MANIFEST_NAME),
            here.key(METADATA_NAME),
            *([object_key] * bool(object_key)),
        ]
        found = any(here.store.head(k) is not None for k in keys)
    except StoreError:
        if native:
            log.debug("s3ckpt: cannot probe %s; leaving it to fsspec", path, exc_info=True)
            return None
        raise
    except S3CkptError:  # not a URL s3ckpt reads (InvalidURLError and friends)
        return None
    return here if found or not native else None


def install_load_hook() -> None:
    """Route ``load_from_checkpoint`` of checkpoints on S3 through s3ckpt (idempotent).

    ``LightningModule.load_from_checkpoint`` and ``LightningDataModule.load_from_checkpoint``
    read the file with ``lightning.pytorch.core.saving.pl_load`` (fabric's ``cloud_io._load``:
    fsspec and ``torch.load``), which cannot read a checkpoint that is a prefix. The hook
    wraps that one name: a remote path (``s3://``, ...) where s3ckpt finds a checkpoint (an
    s3ckpt or DCP prefix, or a stock Lightning object) is read by :func:`load_remote`, as
    ``S3CheckpointIO.load_checkpoint`` reads it (``map_location`` and ``weights_only``
    honoured, :data:`s3ckpt.dcp.SAFE_GLOBALS` allowed, the store configured as
    :mod:`s3ckpt.lightning._stores` says: a plug-in's settings for the bucket, else the
    environment's: ``AWS_ENDPOINT_URL``, profile, region); so is a missing one on a scheme no
    other fsspec file system reads (``CheckpointNotFoundError``, a ``FileNotFoundError``).
    Everything else, local files and file objects above all, goes to Lightning's own
    function unchanged, and so does a path the store cannot be asked about when s3fs (or
    another file system for the scheme) is installed. Called by
    :func:`s3ckpt.lightning.install`.
    """
    from lightning.pytorch.core import saving

    original = saving.pl_load
    if getattr(original, "_s3ckpt_hook", False):
        return

    @functools.wraps(original)
    def pl_load(
        path_or_url: Any, map_location: Any = None, weights_only: bool | None = None
    ) -> Any:
        if isinstance(path_or_url, (str, Path)) and _is_remote(path_or_url):
            found = _divert(str(path_or_url))
            if found is not None:
                return load_remote(
                    found, LoadSettings(), map_location=map_location, weights_only=weights_only
                )
        return original(path_or_url, map_location=map_location, weights_only=weights_only)

    pl_load._s3ckpt_hook = True  # type: ignore[attr-defined]
    saving.pl_load = pl_load
