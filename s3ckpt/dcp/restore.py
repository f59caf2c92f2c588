"""Prove a load restored everything: fill with NaN, load, look for what is left.

Building blocks (what ``Checkpointer.load(..., verify_complete=True)`` calls)::

    fill_nan(state_dict)                        # before the load
    dcp.load(state_dict, storage_reader=reader,
             planner=DefaultLoadPlanner(allow_partial_load=True))
    check_restored(state_dict, reader.read_metadata())   # raises IncompleteRestoreError

Before a load, :func:`check_state_dict` compares the destination with the checkpoint's
``.metadata`` (shapes and keys, no data read) and raises
:class:`~s3ckpt.errors.StateMismatchError` while the model is still untouched; torch's own
planner would raise a bare ``ValueError`` / ``RuntimeError`` inside a ``CheckpointException``.

An entry of the destination is *not restored* when its key is missing from the checkpoint,
or when NaN is left in a region of the tensor that no saved chunk covers. NaN inside a
region the checkpoint covers is the saved value (a model can legitimately hold NaN), so it
is never flagged. Integer and bool tensors cannot hold NaN: they are checked by key and
chunk coverage only.

With DTensor (FSDP2, TP) each rank fills and checks its own local shard against the
chunks overlapping it; a rank that finds a gap raises on that rank.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadPlanner
from torch.distributed.checkpoint.storage import StorageReader

from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.dcp._match import Shape, compare, mismatch_error
from s3ckpt.dcp._quiet import quiet_dcp
from s3ckpt.dcp._torch import flatten_state_dict, local_chunks
from s3ckpt.dcp.reader import S3StorageReader
from s3ckpt.errors import IncompleteRestoreError
from s3ckpt.store import Location, ObjectStore
from s3ckpt.store._location import LocationLike
from s3ckpt.uri import StoreURL, as_url

__all__ = ["check_restored", "check_state_dict", "fill_nan", "find_unrestored", "load_verified"]


def _local(t: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    """The local data of ``t`` and its offsets in the global tensor."""
    if not callable(to_local := getattr(t, "to_local", None)):
        return t, (0,) * t.dim()
    chunks = local_chunks(t)  # a DTensor
    return to_local(), tuple(chunks[0].offsets) if chunks else (0,) * t.dim()


def fill_nan(state_dict: Any) -> int:
    """Fill every floating-point tensor in ``state_dict`` (nested dicts, lists, tuples;
    DTensor local shards included) with NaN, in place. Returns how many were filled.

    Tensors of a model's ``state_dict()`` share memory with its parameters, so the model
    itself is filled too: that is the point (a parameter the load misses stays NaN).
    """
    if isinstance(state_dict, torch.Tensor):
        if (local := _local(state_dict)[0]).is_floating_point() or local.is_complex():
            local.detach().fill_(float("nan"))  # detached: no autograd record
            return 1
        return 0
    if isinstance(state_dict, Mapping):
        return sum(fill_nan(v) for v in state_dict.values())
    return sum(fill_nan(v) for v in state_dict) if isinstance(state_dict, (list, tuple)) else 0


def _coverage(
    local_shape: tuple[int, ...], offsets: tuple[int, ...], md: TensorStorageMetadata
) -> torch.Tensor | None:
    """Bool mask over the local shard: True where some saved chunk covers it (None: all)."""
    mask = torch.zeros(local_shape, dtype=torch.bool)  # a scalar: covered by any chunk
    for c in md.chunks:
        dims = zip(offsets, local_shape, c.offsets, c.sizes, strict=False)
        bounds = [(max(lo, co) - lo, min(lo + n, co + cs) - lo) for lo, n, co, cs in dims]
        if all(a < b for a, b in bounds):
            mask[tuple(slice(a, b) for a, b in bounds)] = True
    return None if bool(mask.all()) else mask


def find_unrestored(state_dict: Any, metadata: Metadata) -> dict[str, str]:
    """``{flattened key: reason}`` for every entry of ``state_dict`` a load with
    ``metadata`` did not restore (see the module docs). Empty when all were restored."""
    flat, _ = flatten_state_dict(state_dict)
    saved = metadata.state_dict_metadata
    missing: dict[str, str] = {}
    for fqn, value in flat.items():
        if (md := saved.get(fqn)) is None:
            missing[fqn] = "missing from the checkpoint"
            continue
        if not isinstance(value, torch.Tensor):
            continue
        if not isinstance(md, TensorStorageMetadata):
            missing[fqn] = "saved as a non-tensor value, destination is a tensor"
            continue
        local, offsets = _local(value)
        if (mask := _coverage(tuple(local.shape), offsets, md)) is None:
            continue  # every element covered: NaN there is the saved value
        if local.is_floating_point() or local.is_complex():
            n = int((torch.isnan(local.detach().cpu()) & ~mask).sum())
            why = f"NaN left in {n} element(s) no saved chunk covers"
        else:
            n = int((~mask).sum())
            why = f"{n} element(s) not covered by any saved chunk"
        if n:
            missing[fqn] = why
    return missing


def check_restored(state_dict: Any, metadata: Metadata) -> None:
    """Raise :class:`~s3ckpt.errors.IncompleteRestoreError` naming every entry of
    ``state_dict`` (loaded from a checkpoint with ``metadata``) that was not restored."""
    if not (missing := find_unrestored(state_dict, metadata)):
        return
    listed = "; ".join(f"{k} ({why})" for k, why in missing.items())
    raise IncompleteRestoreError(
        f"{len(missing)} entr{'y was' if len(missing) == 1 else 'ies were'} not restored: "
        f"{listed}. The checkpoint does not hold them: load one saved from this model, or "
        "drop these keys from the state dict (a partial load) on purpose",
        items=list(missing),
        reasons=missing,
    )


def check_state_dict(
    state_dict: Any,
    metadata: Metadata,
    *,
    strict: bool = True,
    unexpected_under: Sequence[str] = (),
    process_group: Any = None,
    url: StoreURL | None = None,
) -> None:
    """Raise :class:`~s3ckpt.errors.StateMismatchError` if ``state_dict`` cannot be loaded
    from a checkpoint with ``metadata``; reads no data and changes nothing.

    Checked: every tensor has the shape it was saved with (always: no load can fill a
    tensor of another shape), and with ``strict`` every key of ``state_dict`` is in the
    checkpoint (missing keys) and every key the checkpoint holds under the top-level
    entries ``unexpected_under`` (``("model",)`` for a Checkpointer) is in ``state_dict``
    (unexpected keys: a checkpoint of another architecture). Other keys of the checkpoint
    are not checked: loading a part of a checkpoint (the model without the optimizer) is
    normal. ``strict=False`` is torch's partial load: missing keys keep their values.

    A collective call when ``torch.distributed`` is initialised (as ``dcp.load`` is): the
    ranks' findings are gathered (one ``all_gather_object`` over ``process_group``) and
    every rank raises the same error, so no rank goes on into ``dcp.load`` alone. A key
    is unexpected only if no rank's state dict holds it (pipeline stages each hold a part
    of the model).

    Args:
        state_dict: The destination, as for ``dcp.load`` (nested; DTensor welcome).
        metadata: The checkpoint's metadata (``reader.read_metadata()``).
        strict: Check keys as well as shapes.
        unexpected_under: Top-level entries whose saved keys must all be wanted.
        process_group: The group of the load (``None``: the default group).
        url: The checkpoint, named in the error.

    Raises:
        StateMismatchError: naming the keys, both shapes, the checkpoint and what to do.
    """
    found = compare(state_dict, metadata, unexpected_under if strict else ())
    everyone: list[Any] = [found]
    if dist.is_available() and dist.is_initialized():
        everyone = [None] * dist.get_world_size(process_group)
        dist.all_gather_object(everyone, found, group=process_group)
    first = next((r for r, (s, m, _u) in enumerate(everyone) if s or (strict and m)), None)
    shapes: dict[str, tuple[Shape, Shape]] = {}
    for s, _m, _u in everyone:  # the first rank's shapes of a key
        shapes.update({k: v for k, v in s.items() if k not in shapes})
    missing = list(dict.fromkeys(k for _s, m, _u in everyone for k in m)) if strict else []
    others = [set(u) for _s, _m, u in everyone[1:]]  # unexpected: on no rank
    unexpected = [k for k in everyone[0][2] if strict and all(k in u for u in others)]
    if shapes or missing or unexpected:
        raise mismatch_error(shapes, missing, unexpected, url, first)


def load_verified(
    state_dict: Any,
    path_or_reader: LocationLike | StorageReader,
    *,
    planner: LoadPlanner | None = None,
    process_group: Any = None,
    s3_config: S3Config | None = None,
    transfer_config: TransferConfig | None = None,
    store: ObjectStore | None = None,
) -> Metadata:
    """``dcp.load`` into ``state_dict`` in place and prove every entry was restored.

    Checks shapes first (:func:`check_state_dict` with ``strict=False``: a tensor of
    another shape raises :class:`~s3ckpt.errors.StateMismatchError` before anything is
    filled), then fills floating-point destinations with NaN, loads with
    ``DefaultLoadPlanner(allow_partial_load=True)`` (so a missing key is reported with the
    others instead of aborting the load), then :func:`check_restored`.

    Args:
        state_dict: The destination (nested; DTensor welcome), as for ``dcp.load``.
        path_or_reader: The checkpoint (a URL, a local path, a
            :class:`~s3ckpt.uri.StoreURL` or a :class:`~s3ckpt.store.Location`), or any DCP
            ``StorageReader``.
        planner: Load planner (must allow partial loads to report missing keys).
        process_group: For ``dcp.load``; ``None`` loads in one process when
            ``torch.distributed`` is not initialised.

    Returns:
        The checkpoint's metadata.

    Raises:
        StateMismatchError: a tensor was saved with another shape (nothing changed).
        IncompleteRestoreError: naming every entry not restored.
    """
    reader = path_or_reader
    if not isinstance(reader, StorageReader):
        # A string may be a local path here (as_url), which the reader does not take.
        target = reader if isinstance(reader, (Location, StoreURL)) else as_url(reader)
        reader = S3StorageReader(
            target, s3_config=s3_config, transfer_config=transfer_config, store=store
        )
    metadata = reader.read_metadata()
    url = reader.url if isinstance(reader, S3StorageReader) else None
    check_state_dict(state_dict, metadata, strict=False, process_group=process_group, url=url)
    fill_nan(state_dict)
    with quiet_dcp():
        dcp.load(
            state_dict,
            storage_reader=reader,
            planner=planner or DefaultLoadPlanner(allow_partial_load=True),
            process_group=process_group,
        )
    metadata = reader.read_metadata()
    check_restored(state_dict, metadata)
    return metadata
