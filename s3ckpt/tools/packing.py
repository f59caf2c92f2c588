"""A value stored exactly as DCP items ("packed"), and read back: the one storage form the
framework integrations use for the training state they keep beside the model.

:func:`pack_state` turns any value (a Lightning checkpoint dict, an accelerate scheduler's
or data loader's state, RNG states, a registered object's ``state_dict()``) into the flat
dict :func:`~s3ckpt.tools.flatten_state_dict` makes of it with ``objects=True``: tensors
as DCP tensor items, any other non-JSON leaf (a NumPy array, a path) as a DCP object item,
and :data:`~s3ckpt.tools.SCHEMA_KEY`, a small tensor recording the exact tree (dicts,
lists, tuples, ``int`` keys, ``None`` leaves, ``OrderedDict`` and its ``_metadata``). DCP's
own nesting would drop ``None`` leaves and empty dicts, turn ``int`` keys into ``str`` and
tuples into lists. A value whose dict keys are neither ``str`` nor ``int`` (which the flat
form cannot name) is stored whole instead, as one object item (:data:`WHOLE_KEY`); it
loads through the same safe loader.

A load builds its destinations from the checkpoint's metadata, not from the live objects
(:func:`packed_destinations`, :func:`item_destinations`), so the value comes back exactly
as it was saved, whatever the object holds now (a fresh ``StatefulDataLoader`` has
``None`` where a used one has a sampler state); :func:`unpack_state` rebuilds it.

Used by :mod:`s3ckpt.lightning` (the checkpoint dict, or the part of it beside a sharded
model) and :mod:`s3ckpt.accelerate` (every entry but the models and optimizers); a public
module (not on the :mod:`s3ckpt.tools` face) for whoever writes another integration.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from s3ckpt.tools._flatten import SCHEMA_KEY, flatten_state_dict, unflatten_state_dict

__all__ = [
    "WHOLE_KEY",
    "is_packed",
    "item_destinations",
    "pack_state",
    "packed_destinations",
    "unpack_state",
]

WHOLE_KEY = "__s3ckpt_whole__"
"""The one item of a value stored whole (see the module): a 1-tuple holding it."""


def pack_state(value: Any) -> dict[str, Any]:
    """``value`` as the flat dict of DCP items that stores it exactly (see the module).

    Tensors are not copied. A value the flat form cannot name (a dict key neither ``str``
    nor ``int``) is stored whole, as one object item under :data:`WHOLE_KEY`.
    """
    try:
        return flatten_state_dict(value, objects=True)
    except TypeError:
        return {WHOLE_KEY: (value,)}  # a tuple: DCP stores it as one object, tensors and all


def is_packed(flat: Any) -> bool:
    """Whether ``flat`` (a loaded dict) is what :func:`pack_state` made."""
    return isinstance(flat, Mapping) and (SCHEMA_KEY in flat or WHOLE_KEY in flat)


def unpack_state(flat: Mapping[str, Any]) -> Any:
    """The value :func:`pack_state` stored, from its loaded flat dict."""
    if WHOLE_KEY in flat:
        return flat[WHOLE_KEY][0]
    return unflatten_state_dict(flat)


def item_destinations(metadata: Metadata, prefix: str = "") -> dict[str, Any]:
    """Destinations for every saved item whose name starts with ``prefix`` (``prefix``
    stripped): empty tensors of the saved dtype and shape, ``None`` for objects."""
    out: dict[str, Any] = {}
    for fqn, md in metadata.state_dict_metadata.items():
        if not fqn.startswith(prefix):
            continue
        name = fqn[len(prefix) :]
        if isinstance(md, TensorStorageMetadata):
            out[name] = torch.empty(md.size, dtype=md.properties.dtype)
        else:
            out[name] = None
    return out


def packed_destinations(metadata: Metadata, entry: str) -> dict[str, Any] | None:
    """Destinations for the value packed under the top-level key ``entry`` of a
    checkpoint (:func:`item_destinations` of ``entry.``), or ``None`` when the checkpoint
    holds no packed value there."""
    prefix = f"{entry}."
    items = metadata.state_dict_metadata
    if f"{prefix}{SCHEMA_KEY}" not in items and f"{prefix}{WHOLE_KEY}" not in items:
        return None
    return item_destinations(metadata, prefix)
