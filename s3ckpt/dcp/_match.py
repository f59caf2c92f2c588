"""Does a state dict fit a checkpoint? Shapes and keys compared with the ``.metadata``.

Shared by :func:`~s3ckpt.dcp.restore.check_state_dict` (before a load, on every rank) and
:class:`~s3ckpt.dcp.S3StorageReader` (the sizes of a plan its planner let through), so
both raise the same :class:`~s3ckpt.errors.StateMismatchError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner

from s3ckpt.dcp._torch import flatten_state_dict
from s3ckpt.errors import StateMismatchError
from s3ckpt.format._names import METADATA_NAME
from s3ckpt.uri import StoreURL

__all__ = ["Shape", "compare", "mismatch_error", "planned_shapes"]

#: How many keys of each kind a :class:`~s3ckpt.errors.StateMismatchError` message lists
#: (the error's attributes hold them all).
_LISTED = 5

Shape = tuple[int, ...]


def compare(
    state_dict: Any, metadata: Metadata, unexpected_under: Sequence[str]
) -> tuple[dict[str, tuple[Shape, Shape]], list[str], list[str]]:
    """``(shapes, missing, unexpected)`` of ``state_dict`` against ``metadata``, as
    torch's ``DefaultLoadPlanner`` matches them: by flattened key, tensors by global size."""
    flat, _ = flatten_state_dict(state_dict)
    saved = metadata.state_dict_metadata
    missing = [fqn for fqn in flat if fqn not in saved]
    shapes = {k: pair for k, v in flat.items() if (pair := _mismatch(saved.get(k), v)) is not None}
    sections = tuple(f"{name}." for name in unexpected_under if name in state_dict)
    unexpected = [fqn for fqn in saved if fqn.startswith(sections) and fqn not in flat]
    return shapes, missing, unexpected


def _mismatch(md: Any, value: Any) -> tuple[Shape, Shape] | None:
    """``(saved, expected)`` when ``value`` is a tensor of another global size than its
    saved ``md`` (a DTensor's ``size()`` is global)."""
    if not (isinstance(md, TensorStorageMetadata) and isinstance(value, torch.Tensor)):
        return None
    saved, expected = tuple(md.size), tuple(value.size())
    return (saved, expected) if saved != expected else None


def _listed(what: str, keys: Sequence[str], sep: str = ", ") -> str:
    more = f" (and {len(keys) - _LISTED} more)" if len(keys) > _LISTED else ""
    return f"{len(keys)} {what}: {sep.join(keys[:_LISTED])}{more}"


def mismatch_error(
    shapes: dict[str, tuple[Shape, Shape]],
    missing: list[str],
    unexpected: list[str],
    url: StoreURL | None,
    rank: int | None,
) -> StateMismatchError:
    """The error naming ``shapes`` (saved, expected), ``missing`` and ``unexpected`` keys
    (the first :data:`_LISTED` of each, with counts), ``url``'s ``.metadata`` and what to do."""
    listed = [f"{k} saved {tuple(a)}, expected {tuple(b)}" for k, (a, b) in shapes.items()]
    parts = [_listed("tensor(s) of another shape", listed, "; ")] if shapes else []
    if missing:
        parts.append(_listed("key(s) missing from the checkpoint", missing))
    if unexpected:
        parts.append(_listed("key(s) of the checkpoint not in the model", unexpected))
    todo = (
        "Load a checkpoint saved from this model (another run or step), or build the model "
        "as it was saved"
    )
    if missing or unexpected:
        todo += (
            "; Checkpointer.load(..., strict=False) loads the keys both have (shapes must "
            "still match)"
        )
    return StateMismatchError(
        f"the checkpoint does not fit the state dict it is loaded into. {'. '.join(parts)}. "
        f"Nothing was loaded. {todo}",
        bucket=url.bucket if url is not None else None,
        key=url.key(METADATA_NAME) if url is not None else None,
        rank=rank,
        shapes=shapes,
        missing=missing,
        unexpected=unexpected,
    )


def planned_shapes(
    plan: LoadPlan, planner: LoadPlanner, metadata: Metadata
) -> dict[str, tuple[Shape, Shape]]:
    """``{key: (saved, expected)}`` for the tensors of ``plan`` whose destination in the
    planner's state dict (``DefaultLoadPlanner`` and its subclasses keep it, flattened, as
    ``planner.state_dict``) has another global size than saved. Empty for planners that
    keep no state dict: their reads are checked one by one as they arrive."""
    dest = getattr(planner, "state_dict", None)
    if not isinstance(dest, Mapping):
        return {}
    saved = metadata.state_dict_metadata
    fqns = dict.fromkeys(r.storage_index.fqn for r in plan.items if r.type == LoadItemType.TENSOR)
    return {k: pair for k in fqns if (pair := _mismatch(saved.get(k), dest.get(k))) is not None}
