"""Helpers the Lightning plug-in's modules share: remote paths, the metrics a save
records, ``map_location`` for loaded tensors, and which settings open a bucket's store
when no plug-in is at hand.

``MyModule.load_from_checkpoint("s3://...")``, the fsspec file system and
``ckpt_path="last"`` without a trainer plug-in open stores with no :class:`S3CheckpointIO`
to ask. They take the settings from a registry, in this order: the settings of the plug-in
that last opened that bucket (scheme and bucket) in this process (a save, load or removal
registers them); else those of the last :class:`S3CheckpointIO` constructed (a
``ModelCheckpoint`` lists its folder before the first save); else the environment's
(``S3Config()``: ``AWS_ENDPOINT_URL``, profile, region). Every store comes from
:meth:`s3ckpt.store.Location.of`, the one process-wide cache: a plug-in and the hook with
the same settings share one store. Nothing here runs at import.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from fsspec.core import split_protocol

from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.store import Location
from s3ckpt.uri import StoreURL, parse_url

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
    for state in callbacks.values() if isinstance(callbacks, Mapping) else ():
        if not isinstance(state, Mapping) or not isinstance(state.get("monitor"), str):
            continue
        try:
            value = float(state.get("current_score"))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if math.isfinite(value):
            out[state["monitor"]] = value
    return out


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


@dataclass(frozen=True)
class StoreSettings:
    """A plug-in's store settings (``None``: the defaults, from the environment)."""

    s3_config: S3Config | None = None
    transfer_config: TransferConfig | None = None

    def open(self, target: str | StoreURL) -> Location:
        """``target`` in the process's shared store for these settings."""
        return Location.of(target, s3_config=self.s3_config, transfer_config=self.transfer_config)


_LOCK = threading.Lock()
_BY_BUCKET: dict[tuple[str, str], StoreSettings] = {}
_LAST: list[StoreSettings] = []  # the last plug-in constructed (at most one entry)


def remember(settings: StoreSettings, url: StoreURL | None = None) -> None:
    """Register a plug-in's settings: for ``url``'s bucket, or (``None``, at the plug-in's
    construction) as the fallback for buckets no plug-in opened."""
    with _LOCK:
        if url is None:
            _LAST[:] = [settings]
        else:
            _BY_BUCKET[(url.scheme, url.bucket)] = settings


def settings_for(url: StoreURL) -> StoreSettings:
    """The settings that open ``url``'s bucket (see the module for the order)."""
    with _LOCK:
        found = _BY_BUCKET.get((url.scheme, url.bucket))
        if found is None and _LAST:
            found = _LAST[0]
    return found if found is not None else StoreSettings()


def location_for(target: str | StoreURL) -> Location:
    """``target`` opened with the settings registered for its bucket.

    Raises:
        InvalidURLError: ``target`` is not a URL s3ckpt reads.
    """
    url = target if isinstance(target, StoreURL) else parse_url(str(target))
    return settings_for(url).open(url)
