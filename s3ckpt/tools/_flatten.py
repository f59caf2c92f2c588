"""Nested state (optimizer state above all) to the flat ``Dict[str, Tensor]`` safetensors
needs, and back, exactly.

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

import json
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Literal, overload

import torch

__all__ = ["SCHEMA_KEY", "flatten_state_dict", "unflatten_state_dict"]

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

    def name_for(path: str) -> str:
        name = path or "_"
        n = 1
        while name in flat or name == SCHEMA_KEY:
            name = f"{path}~{n}"
            n += 1
        return name

    def walk(obj: Any, path: str) -> Any:
        if isinstance(obj, torch.Tensor):
            name = name_for(path)
            flat[name] = obj
            return {"t": name}
        if isinstance(obj, Mapping):
            items = []
            for k, v in obj.items():
                if isinstance(k, bool) or not isinstance(k, (str, int)):
                    raise TypeError(
                        f"cannot flatten key {k!r} ({type(k).__name__}) at {path or '<root>'!r}: "
                        "dict keys must be str or int"
                    )
                child = f"{path}.{k}" if path else str(k)
                items.append([k, walk(v, child)])
            node: dict[str, Any] = {"d": items}
            if isinstance(obj, OrderedDict):
                node["od"] = 1
            meta = _plain_metadata(getattr(obj, "_metadata", None))
            if meta is not None:
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
            name = name_for(path)
            flat[name] = obj
            return {"o": name}
        raise TypeError(
            f"cannot flatten {type(obj).__name__} at {path or '<root>'!r}: leaves must be "
            "tensors, None, bool, int, float or str"
        )

    tree = walk(state_dict, "")
    raw = json.dumps({"version": _VERSION, "tree": tree}, separators=(",", ":"))
    flat[SCHEMA_KEY] = torch.frombuffer(bytearray(raw.encode("utf-8")), dtype=torch.uint8)
    return flat


def unflatten_state_dict(flat: Mapping[str, Any]) -> Any:
    """Inverse of :func:`flatten_state_dict` (exact, including container and key types).

    Without :data:`SCHEMA_KEY`, names are split on dots into nested dicts of str keys.
    """
    schema = flat.get(SCHEMA_KEY)
    if schema is None:
        nested: dict[str, Any] = {}
        for name, t in flat.items():
            *parents, last = name.split(".")
            node = nested
            for p in parents:
                node = node.setdefault(p, {})
            node[last] = t
        return nested
    doc = json.loads(bytes(schema.cpu().contiguous().numpy().tobytes()).decode("utf-8"))
    if doc.get("version") != _VERSION:
        raise ValueError(f"{SCHEMA_KEY}: unsupported schema version {doc.get('version')!r}")

    def build(node: dict[str, Any]) -> Any:
        for kind, what in (("t", "tensor"), ("o", "object")):
            if kind in node:
                try:
                    return flat[node[kind]]
                except KeyError:
                    raise KeyError(
                        f"the schema names {what} {node[kind]!r}, which is missing"
                    ) from None
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
        if "f" in node:
            return float(node["f"])
        return node["v"]

    return build(doc["tree"])


def _plain_metadata(meta: Any) -> list[list[Any]] | None:
    """``state_dict()._metadata`` (``{module prefix: {"version": 1, ...}}``) as JSON pairs in
    order, or None when there is none or it holds anything but plain values."""
    if not isinstance(meta, Mapping):
        return None
    out: list[list[Any]] = []
    for prefix, fields in meta.items():
        if not isinstance(prefix, str) or not isinstance(fields, Mapping):
            return None
        pairs = []
        for k, v in fields.items():
            if not isinstance(k, str) or not (v is None or isinstance(v, (bool, int, float, str))):
                return None
            pairs.append([k, v])
        out.append([prefix, pairs])
    return out
