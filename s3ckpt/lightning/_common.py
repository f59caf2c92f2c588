"""Helpers the Lightning plug-in's modules share: remote paths, the metrics a save
records, DCP calls with s3ckpt's errors, and ``map_location`` for loaded tensors."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from fsspec.core import split_protocol

from s3ckpt.dcp import quiet_dcp
from s3ckpt.errors import unwrap_checkpoint_exception

log = logging.getLogger("s3ckpt.lightning")

# Keys of a sharded checkpoint: the model's and optimizers' DTensor state dicts as DCP
# saves them, and everything else Lightning saves, packed (s3ckpt.tools.packing), under
# this key.
_REST = "lightning"


def _is_remote(path: Any) -> bool:
    protocol, _ = split_protocol(str(path))
    return protocol not in (None, "file", "local")


def _metrics_of(checkpoint: Mapping[str, Any]) -> dict[str, float]:
    """Each ModelCheckpoint's monitored value at this save, by its metric name."""
    out: dict[str, float] = {}
    callbacks = checkpoint.get("callbacks")
    if not isinstance(callbacks, Mapping):
        return out
    for state in callbacks.values():
        if not isinstance(state, Mapping):
            continue
        monitor, score = state.get("monitor"), state.get("current_score")
        if isinstance(monitor, str) and score is not None:
            try:
                value = float(score)
            except (TypeError, ValueError):
                continue
            if value == value and abs(value) != float("inf"):
                out[monitor] = value
    return out


@contextmanager
def _dcp_call(what: str = "a checkpoint save or load") -> Iterator[None]:
    """DCP's logging quietened, and every failure an s3ckpt error (an ``Exception``) in
    place of DCP's ``CheckpointException`` (:func:`~s3ckpt.errors.unwrap_checkpoint_exception`)."""
    try:
        with quiet_dcp():
            yield
    except BaseException as exc:
        err = unwrap_checkpoint_exception(exc, what)
        raise err from err.__cause__


def _to_device(obj: Any, map_location: Any) -> Any:
    """``obj`` (a checkpoint read into CPU memory) with its tensors placed as torch.load's
    ``map_location`` would place tensors saved on the CPU: a device (``str``, ``int`` or
    :class:`torch.device`); a dict, by its ``"cpu"`` entry; a function, called as
    ``fn(storage, "cpu")`` (Lightning's default keeps CPU tensors where they are).
    A DCP checkpoint does not record the device a tensor was saved from, so ``"cpu"`` is
    the only source location a mapping can name."""
    if map_location is None:
        return obj
    if isinstance(map_location, dict):
        target = map_location.get("cpu")
        return obj if target is None else _to_device(obj, target)
    if isinstance(map_location, (str, int, torch.device)):
        device = torch.device(map_location)
        return _map_tensors(obj, lambda t: t.to(device))
    if callable(map_location):
        fn = map_location

        def place(t: torch.Tensor) -> torch.Tensor:
            moved = fn(t.untyped_storage(), "cpu")
            if moved is None or moved.device == t.device:
                return t
            return t.to(moved.device)

        return _map_tensors(obj, place)
    return obj


def _map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``obj`` with ``fn`` applied to every tensor; containers keep their type (an
    ``OrderedDict`` its ``_metadata``)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        out = type(obj)() if type(obj) in (dict, OrderedDict) else {}
        for k, v in obj.items():
            out[k] = _map_tensors(v, fn)
        meta = getattr(obj, "_metadata", None)
        if meta is not None and isinstance(out, OrderedDict):
            setattr(out, "_metadata", meta)  # noqa: B010
        return out
    if isinstance(obj, list):
        return [_map_tensors(v, fn) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_map_tensors(v, fn) for v in obj)
    return obj
