"""Reading a whole Lightning checkpoint in one process: what ``S3CheckpointIO.load_checkpoint``
returns, and what ``MyModule.load_from_checkpoint("s3://...")`` gets.

What is at a checkpoint path decides how it is read (:func:`load_remote`):

1. a committed s3ckpt checkpoint (the prefix ``path/`` holds ``s3ckpt.json``): a DCP load
   of every item, full tensors (no process group; a sharded checkpoint's shards are
   assembled), then the dict Lightning saved (:func:`rebuild`);
2. else an object at ``path`` (stock Lightning's ``torch.save`` file, say one s3fs wrote
   before the move to s3ckpt): :func:`s3ckpt.lightning._load.load_object`, streamed;
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

A stock Lightning checkpoint (one ``torch.save`` object, as s3fs wrote it before the move)
is read by :func:`load_object`: streamed (an object up to ``block`` bytes with one GET, a
larger one through a seekable file over ranged GETs, :class:`_RangeFile`, nothing on local
disk), with the plug-in's ``weights_only`` rules (``True``/``None``: torch's safe loader
with :data:`s3ckpt.dcp.SAFE_GLOBALS` and the plug-in's ``safe_globals`` added for the
duration of the load, under a lock, and exactly those removed after; ``False``: full
pickle), failures as s3ckpt errors naming the object and its size (a refused global:
:class:`~s3ckpt.errors.UnsafeCheckpointError`; unreadable bytes or an object changed while
read: :class:`~s3ckpt.errors.CorruptCheckpointError`; deleted meanwhile:
:class:`~s3ckpt.errors.CheckpointNotFoundError`).
"""

from __future__ import annotations

import contextlib
import pickle
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import fsspec
import torch
import torch.distributed.checkpoint as dcp
from fsspec.core import split_protocol
from fsspec.spec import AbstractBufferedFile
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.metadata import Metadata

from s3ckpt._plugin_common import dcp_errors, open_reader, patch_once
from s3ckpt._units import format_bytes
from s3ckpt.dcp import SAFE_GLOBALS, SafeGlobal
from s3ckpt.dcp._safe import _torch_globals, global_name, reason
from s3ckpt.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    ObjectNotFoundError,
    S3CkptError,
    StoreError,
    UnsafeCheckpointError,
)
from s3ckpt.format._names import MANIFEST_NAME, METADATA_NAME
from s3ckpt.lightning._async import _REST, _is_remote, _to_device, location_for, log
from s3ckpt.lightning._last import checkpoint_mtime
from s3ckpt.store import Location, ObjectInfo, ObjectStore
from s3ckpt.tools.packing import is_packed, item_destinations, unpack_state


def load_remote(
    location: Location,
    map_location: Any = None,
    weights_only: bool | None = None,
    plugin: Any = None,
) -> dict[str, Any]:
    """The checkpoint at ``url``, as Lightning's ``CheckpointIO.load_checkpoint`` returns
    it (see the module for what is read and in which order), read with the
    ``verify_checksums`` and ``safe_globals`` of ``plugin`` (``None``: the defaults).

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
        part, safe = location.transfer_config.part_size, getattr(plugin, "safe_globals", ())
        return load_object(store, obj, map_location, weights_only, safe, part)
    try:
        reader = open_reader(location, plugin, allow_unsafe_pickle=weights_only is False)
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
    with dcp_errors("a checkpoint save or load"):
        dcp.load(flat, storage_reader=reader, no_dist=True)
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
        return cast(dict[str, Any], unpack_state(flat))
    paths: Mapping[str, Any] = metadata.planner_data or {}
    nested: dict[str, Any] = {}
    for fqn, value in flat.items():
        set_element(nested, tuple(paths.get(fqn) or (fqn,)), value)
    if not is_packed(nested.get(_REST)):
        return nested
    ckpt: dict[str, Any] = unpack_state(nested.pop(_REST))
    opts = sorted((int(m[1]), k) for k in nested if (m := re.fullmatch(r"optimizer_(\d+)", k)))
    if "state_dict" in nested:
        ckpt["state_dict"] = nested.pop("state_dict")
    if opts:
        ckpt["optimizer_states"] = [nested.pop(k) for _, k in opts]
    ckpt.update(nested)
    return ckpt


# -- load_from_checkpoint -------------------------------------------------------------------


def _divert(path: str) -> Location | None:
    """Where s3ckpt reads ``path`` instead of Lightning's ``pl_load``: a checkpoint s3ckpt
    finds there (an s3ckpt or DCP prefix, or a single object), or any path of a scheme no
    other fsspec file system reads (no s3fs). Where the store cannot be asked and another
    file system can read the scheme, that one is left to (an s3fs set-up of its own)."""
    try:  # whether an fsspec file system other than s3ckpt's own reads it (s3fs)
        cls = fsspec.get_filesystem_class(split_protocol(path)[0] or "")
        native = not cls.__module__.startswith("s3ckpt.")
    except (ImportError, ValueError):
        native = False
    try:
        here = location_for(path)
        found = checkpoint_mtime(here) is not None  # a marker, a .metadata or an object
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
    :mod:`s3ckpt.lightning._async` says: a plug-in's settings for the bucket, else the
    environment's: ``AWS_ENDPOINT_URL``, profile, region); so is a missing one on a scheme no
    other fsspec file system reads (``CheckpointNotFoundError``, a ``FileNotFoundError``).
    Everything else, local files and file objects above all, goes to Lightning's own
    function unchanged, and so does a path the store cannot be asked about when s3fs (or
    another file system for the scheme) is installed. Called by
    :func:`s3ckpt.lightning.install`.
    """
    from lightning.pytorch.core import saving

    @patch_once(saving, "pl_load")
    def pl_load(
        original: Any, path_or_url: Any, map_location: Any = None, weights_only: bool | None = None
    ) -> Any:
        if isinstance(path_or_url, (str, Path)) and _is_remote(path_or_url):
            found = _divert(str(path_or_url))
            if found is not None:
                return load_remote(found, map_location=map_location, weights_only=weights_only)
        return original(path_or_url, map_location=map_location, weights_only=weights_only)


def load_object(
    store: ObjectStore,
    info: ObjectInfo,
    map_location: Any,
    weights_only: bool | None,
    safe_globals: Sequence[SafeGlobal],
    block: int,
) -> Any:
    """``torch.load`` of the object ``info`` (a HEAD of it), streamed; see the module.

    Raises:
        UnsafeCheckpointError: ``weights_only`` is not False and the pickle asks for a
            global outside the allow-list (the message names it, as torch does).
        CorruptCheckpointError: empty, unreadable, or changed while it was read.
        CheckpointNotFoundError: deleted while it was read.
    """
    where, size = f"{store.url_scheme}://{store.bucket}/{info.key}", format_bytes(info.size)
    ctx = {"bucket": store.bucket, "key": info.key}
    gone = CheckpointNotFoundError("the checkpoint object was deleted while it was read", **ctx)
    if info.size == 0:
        raise CorruptCheckpointError(
            f"{where} is an empty object (0 bytes), not a torch.save checkpoint", **ctx
        )
    log.info("s3ckpt: loading %s, one torch.save object of %s (stock Lightning)", where, size)
    f = _RangeFile(store, info, block, where)

    def unchanged() -> None:
        now = store.head(info.key) if info.etag is not None else info
        if now is None:
            raise gone
        if now.etag is not None and now.etag != info.etag:
            raise CorruptCheckpointError(
                f"{where} was rewritten while it was read (ETag {info.etag} -> {now.etag}); "
                "load it again",
                **ctx,
            )

    safe = weights_only is not False
    try:
        with contextlib.ExitStack() as allowed:
            if safe:  # torch's allow-list is process-wide: s3ckpt's readers share its lock
                allowed.enter_context(_torch_globals)
                allowed.enter_context(
                    torch.serialization.safe_globals([*SAFE_GLOBALS, *safe_globals])
                )
            obj = torch.load(f, map_location=map_location, weights_only=safe)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        failed = exc if isinstance(exc, S3CkptError) else f.error  # torch may wrap it
        if failed is not None:
            raise (gone if isinstance(failed, ObjectNotFoundError) else failed) from exc
        unchanged()
        why = reason(exc)
        if safe and isinstance(exc, pickle.UnpicklingError):
            names = ", ".join(map(global_name, safe_globals))
            listed = f", safe_globals {names}" if names else ""
            raise UnsafeCheckpointError(
                f"{where} ({size}) does not load with torch.load(weights_only=True): "
                f"{why} (torch's weights_only defaults, s3ckpt.dcp.SAFE_GLOBALS{listed}). "
                "If the types it holds are plain values, pass them as "
                "S3CheckpointIO(safe_globals=[...]) (or torch.serialization.add_safe_globals); "
                "if you trust this bucket, load with weights_only=False",
                **ctx,
            ) from exc
        raise CorruptCheckpointError(
            f"{where} ({size}) is not a checkpoint torch.load can read: "
            f"{type(exc).__name__}: {why}",
            **ctx,
        ) from exc
    unchanged()
    return obj


class _RangeFile(AbstractBufferedFile):
    """A read-only, seekable file over one object, read ``block`` bytes ahead: each read
    past what is held is one ranged GET (resumed by the store on a transient failure
    mid-body); an object up to ``block`` bytes is one GET."""

    def __init__(self, store: ObjectStore, info: ObjectInfo, block: int, where: str) -> None:
        self._store, self._where = store, where
        self.error: S3CkptError | None = None
        super().__init__(None, info.key, block_size=block, size=info.size)

    def _fetch_range(self, start: int, end: int) -> bytes:
        buf = bytearray(end - start)
        view, got = memoryview(buf), 0
        try:
            with contextlib.closing(self._store.open_range(self.path, start, len(buf))) as r:
                while got < len(buf) and (n := r.readinto(view[got:])):
                    got += n
            if got < len(buf):
                raise CorruptCheckpointError(
                    f"{self._where} ended at byte {start + got}, before the {self.size} "
                    "bytes its HEAD reported (rewritten or truncated while it was read)",
                    bucket=self._store.bucket,
                    key=self.path,
                )
        except S3CkptError as exc:
            self.error = exc
            raise
        return bytes(buf)
