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

**The flat form** (:func:`flatten_state_dict`, :func:`unflatten_state_dict`, on the
:mod:`s3ckpt.tools` face): nested state (optimizer state above all) to the flat
``Dict[str, Tensor]`` safetensors needs, and back, exactly.

``flatten_state_dict`` names every tensor by its path joined with dots
(``state.0.exp_avg``, ``param_groups.0.params`` is not a tensor, ...) and adds one more
entry, :data:`SCHEMA_KEY`: a ``uint8`` tensor holding UTF-8 JSON that records the exact
shape of the tree:

* which containers were ``dict`` / ``list`` / ``tuple``, in their original order;
* dict keys with their type (``str`` or ``int``: ``optimizer.state_dict()["state"]`` is
  keyed by parameter index);
* which dicts were ``OrderedDict`` s, with the ``_metadata`` attribute that
  ``module.state_dict()`` sets (per-module version numbers, which ``load_state_dict``
  hands to modules' ``_load_from_state_dict`` upgrades) when it holds plain values; such
  a dict comes back an ``OrderedDict`` with its ``_metadata`` (extra fields of the dict's
  node, which readers before this field ignore: they build a plain ``dict``);
* every non-tensor leaf inline as JSON: ``None``, ``bool``, ``int`` (any size), ``float``
  (``repr`` round-trips exactly; NaN and infinities included), ``str``;
* which flat key holds each tensor (dots inside keys, such as ``layers.0.weight``, are
  therefore never ambiguous; a name two paths would share gets a ``~N`` suffix).

With ``objects=True`` (for DCP, not safetensors), any other leaf (a ``pathlib.Path`` or an
``argparse.Namespace`` among a framework's hyperparameters) is kept as it is under its own
flat key, recorded in the schema as an object; DCP pickles it, and s3ckpt's reader
unpickles it only through the safe loader and its allow-list of globals.

The schema travels inside the flat dict, so ``safetensors.torch.save_file(flat, path)``
then ``unflatten_state_dict(load_file(path))`` gives the original back, with no side file
and nothing unpickled. A flat dict without the schema key (someone else's safetensors)
unflattens by splitting names on dots into nested dicts.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Literal, overload

import torch
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

__all__ = [
    "SCHEMA_KEY",
    "WHOLE_KEY",
    "flatten_state_dict",
    "is_packed",
    "item_destinations",
    "pack_state",
    "packed_destinations",
    "unflatten_state_dict",
    "unpack_state",
]

WHOLE_KEY = "__s3ckpt_whole__"
"""The one item of a value stored whole (see the module): a 1-tuple holding it."""


SCHEMA_KEY = "__s3ckpt_schema__"
_VERSION = 1


@overload
def flatten_state_dict(
    state_dict: Mapping[Any, Any], *, objects: Literal[False] = False
) -> dict[str, torch.Tensor]: ...


@overload
def flatten_state_dict(state_dict: Mapping[Any, Any], *, objects: bool) -> dict[str, Any]: ...


def flatten_state_dict(state_dict: Mapping[Any, Any], *, objects: bool = False) -> dict[str, Any]:
    """``{"state": {0: {"exp_avg": t}}, "param_groups": [...]}`` ->
    ``{"state.0.exp_avg": t, ..., SCHEMA_KEY: <uint8 JSON>}``.

    Tensors are returned as they are (not copied). Raises ``TypeError`` naming the path of
    a leaf that is neither a tensor nor ``None``/``bool``/``int``/``float``/``str`` (unless
    ``objects``: such a leaf is then kept as it is, under its own flat key), or of a dict
    key that is neither ``str`` nor ``int``.
    """
    flat: dict[str, Any] = {}

    def keep(obj: Any, path: str) -> str:
        """Put ``obj`` under its own flat key (``path``, else a free ``path~N``)."""
        names = itertools.chain([path or "_"], (f"{path}~{n}" for n in itertools.count(1)))
        name = next(n for n in names if n not in flat and n != SCHEMA_KEY)
        flat[name] = obj
        return name

    def walk(obj: Any, path: str) -> Any:
        if isinstance(obj, torch.Tensor):
            return {"t": keep(obj, path)}
        if isinstance(obj, Mapping):
            items = []
            for k, v in obj.items():
                if isinstance(k, bool) or not isinstance(k, (str, int)):
                    raise TypeError(
                        f"cannot flatten key {k!r} ({type(k).__name__}) at {path or '<root>'!r}: "
                        "dict keys must be str or int"
                    )
                items.append([k, walk(v, f"{path}.{k}" if path else str(k))])
            node: dict[str, Any] = {"d": items}
            if isinstance(obj, OrderedDict):
                node["od"] = 1
            if (meta := _plain_metadata(getattr(obj, "_metadata", None))) is not None:
                node["md"] = meta
            return node
        if isinstance(obj, (list, tuple)):
            children = [walk(v, f"{path}.{i}" if path else str(i)) for i, v in enumerate(obj)]
            return {"tu" if isinstance(obj, tuple) else "l": children}
        if obj is None or isinstance(obj, (bool, int, str)):
            return {"v": obj}
        # A float subclass (numpy.float64) stays an object with objects, so that it comes
        # back as itself; without, it is stored as its float (its repr is not a float's).
        if isinstance(obj, float) and (type(obj) is float or not objects):
            return {"f": repr(float(obj))}
        if objects:
            return {"o": keep(obj, path)}
        raise TypeError(
            f"cannot flatten {type(obj).__name__} at {path or '<root>'!r}: leaves must be "
            "tensors, None, bool, int, float or str"
        )

    raw = json.dumps({"version": _VERSION, "tree": walk(state_dict, "")}, separators=(",", ":"))
    flat[SCHEMA_KEY] = torch.frombuffer(bytearray(raw.encode("utf-8")), dtype=torch.uint8)
    return flat


def unflatten_state_dict(flat: Mapping[str, Any]) -> Any:
    """Inverse of :func:`flatten_state_dict` (exact, including container and key types).

    Without :data:`SCHEMA_KEY`, names are split on dots into nested dicts of str keys.
    """
    if (schema := flat.get(SCHEMA_KEY)) is None:
        nested: dict[str, Any] = {}
        for name, t in flat.items():
            *parents, last = name.split(".")
            functools.reduce(lambda node, p: node.setdefault(p, {}), parents, nested)[last] = t
        return nested
    doc = json.loads(bytes(schema.cpu().contiguous().numpy().tobytes()).decode("utf-8"))
    if doc.get("version") != _VERSION:
        raise ValueError(f"{SCHEMA_KEY}: unsupported schema version {doc.get('version')!r}")

    def build(node: dict[str, Any]) -> Any:
        for kind, what in (("t", "tensor"), ("o", "object")):
            if kind in node:
                if node[kind] not in flat:
                    raise KeyError(f"the schema names {what} {node[kind]!r}, which is missing")
                return flat[node[kind]]
        if "d" in node:
            if not node.get("od") and "md" not in node:
                return {k: build(v) for k, v in node["d"]}
            out: dict[Any, Any] = OrderedDict((k, build(v)) for k, v in node["d"])
            if "md" in node:
                setattr(out, "_metadata", OrderedDict((p, dict(kv)) for p, kv in node["md"]))  # noqa: B010
            return out
        if "l" in node:
            return [build(v) for v in node["l"]]
        if "tu" in node:
            return tuple(build(v) for v in node["tu"])
        return float(node["f"]) if "f" in node else node["v"]

    return build(doc["tree"])


def _plain_metadata(meta: Any) -> list[list[Any]] | None:
    """``state_dict()._metadata`` (``{module prefix: {"version": 1, ...}}``) as JSON pairs in
    order, or None when there is none or it holds anything but plain values."""
    plain = (type(None), bool, int, float, str)
    if not isinstance(meta, Mapping) or not all(
        isinstance(prefix, str)
        and isinstance(fields, Mapping)
        and all(isinstance(k, str) and isinstance(v, plain) for k, v in fields.items())
        for prefix, fields in meta.items()
    ):
        return None
    return [[prefix, [[k, v] for k, v in fields.items()]] for prefix, fields in meta.items()]


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
    return flat[WHOLE_KEY][0] if WHOLE_KEY in flat else unflatten_state_dict(flat)


def item_destinations(metadata: Metadata, prefix: str = "") -> dict[str, Any]:
    """Destinations for every saved item whose name starts with ``prefix`` (``prefix``
    stripped): empty tensors of the saved dtype and shape, ``None`` for objects."""
    return {
        fqn[len(prefix) :]: (
            torch.empty(md.size, dtype=md.properties.dtype)
            if isinstance(md, TensorStorageMetadata)
            else None
        )
        for fqn, md in metadata.state_dict_metadata.items()
        if fqn.startswith(prefix)
    }


def packed_destinations(metadata: Metadata, entry: str) -> dict[str, Any] | None:
    """Destinations for the value packed under the top-level key ``entry`` of a
    checkpoint (:func:`item_destinations` of ``entry.``), or ``None`` when the checkpoint
    holds no packed value there."""
    packed = any(f"{entry}.{k}" in metadata.state_dict_metadata for k in (SCHEMA_KEY, WHOLE_KEY))
    return item_destinations(metadata, f"{entry}.") if packed else None
