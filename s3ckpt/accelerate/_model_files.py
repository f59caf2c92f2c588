"""``accelerator.save_model(model, "s3://...")``: the files accelerate writes to a local
folder (safetensors shards and their index, or ``pytorch_model*.bin``), streamed to the store.

The split into shards, their names and the index are accelerate's own (huggingface_hub's
``split_torch_state_dict_into_shards``, accelerate's file names and its removal of shared
tensors), so ``transformers``' ``from_pretrained``, accelerate's
``load_checkpoint_in_model`` and ``safetensors`` read the folder as they read a local one.
Each shard streams through one multipart upload (memory: the upload buffers, not a copy of
the shard); the index is written last; shards an earlier save left that the new index does
not name are deleted after it (as accelerate deletes them locally), and so is an index an
earlier sharded save left when the new save is one file.
"""

from __future__ import annotations

import json
import logging
import re
import struct
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from s3ckpt.config import TransferConfig
from s3ckpt.errors import ConfigError
from s3ckpt.store import ObjectStore
from s3ckpt.tools import TORCH_TO_ST
from s3ckpt.transfer import ObjectSink, Uploader, format_leftovers
from s3ckpt.uri import StoreURL

if TYPE_CHECKING:
    from accelerate import Accelerator

__all__ = ["model_state_dict", "write_model_files"]

log = logging.getLogger("s3ckpt")

_SHARD = re.compile(r"(.*?)-\d{5}-of-\d{5}")


def model_state_dict(acc: Accelerator, model: torch.nn.Module, url: StoreURL) -> dict[str, Any]:
    """The state dict ``Accelerator.save_model`` saves: an offloaded model's, else
    ``accelerator.get_state_dict`` (which gathers a sharded model: collective).

    Raises:
        ConfigError: a parameter on the ``meta`` device (not loaded).
    """
    from accelerate.utils import has_offloaded_params
    from accelerate.utils.modeling import get_state_dict_offloaded_model

    if any(has_offloaded_params(module) for module in model.modules()):
        return dict(get_state_dict_offloaded_model(model))
    if any(p.device.type == "meta" for p in model.parameters()):
        raise ConfigError(
            f"save_model to {url}: some parameters are on the meta device (not loaded)",
            bucket=url.bucket,
            key=url.prefix,
        )
    return dict(acc.get_state_dict(model))


def write_model_files(
    state_dict: dict[str, Any],
    url: StoreURL,
    store: ObjectStore,
    transfer_config: TransferConfig,
    *,
    max_shard_size: int | str,
    safe_serialization: bool,
) -> list[str]:
    """Write ``state_dict`` under ``url`` as ``Accelerator.save_model`` writes a folder;
    returns the names written (shards, then the index when sharded).

    Raises:
        ConfigError: a tensor of a dtype safetensors cannot store, or a non-tensor value
            (with ``safe_serialization``), before anything is uploaded.
    """
    from accelerate.utils import clean_state_dict_for_safetensors
    from accelerate.utils.constants import (
        SAFE_WEIGHTS_INDEX_NAME,
        SAFE_WEIGHTS_NAME,
        SAFE_WEIGHTS_PATTERN_NAME,
        WEIGHTS_INDEX_NAME,
        WEIGHTS_NAME,
        WEIGHTS_PATTERN_NAME,
    )
    from huggingface_hub import split_torch_state_dict_into_shards

    if safe_serialization:
        state_dict = clean_state_dict_for_safetensors(dict(state_dict))
        for name, value in state_dict.items():
            if not isinstance(value, torch.Tensor) or value.dtype not in TORCH_TO_ST:
                what = value.dtype if isinstance(value, torch.Tensor) else type(value).__name__
                raise ConfigError(
                    f"save_model to {url}: {name!r} is a {what}, which safetensors cannot "
                    "store; pass safe_serialization=False to write pytorch_model.bin files"
                )
    weights = SAFE_WEIGHTS_NAME if safe_serialization else WEIGHTS_NAME
    pattern = SAFE_WEIGHTS_PATTERN_NAME if safe_serialization else WEIGHTS_PATTERN_NAME
    index_name = SAFE_WEIGHTS_INDEX_NAME if safe_serialization else WEIGHTS_INDEX_NAME
    split = split_torch_state_dict_into_shards(
        state_dict, filename_pattern=pattern, max_shard_size=max_shard_size
    )
    shards = {
        f: {n: state_dict[n] for n in names} for f, names in split.filename_to_tensors.items()
    }
    biggest = max((_nbytes(s) for s in shards.values()), default=0)
    part_size = transfer_config.part_size_for(biggest + 2**20)
    uploader = Uploader(
        store,
        part_size=part_size,
        n_buffers=transfer_config.upload_buffers(part_size),
        max_concurrency=transfer_config.max_concurrency,
    )
    try:
        for filename, shard in shards.items():
            sink = uploader.sink(url.key(filename))
            if safe_serialization:
                _write_safetensors(sink, shard)
            else:
                torch.save(shard, sink)
            sink.close()
        uploader.finish()
    except BaseException as exc:
        leftovers = uploader.abort()
        if leftovers:
            exc.add_note(format_leftovers(leftovers))
        raise
    written = list(shards)
    if split.is_sharded:
        index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
        raw = (json.dumps(index, indent=2, sort_keys=True) + "\n").encode("utf-8")
        store.put(url.key(index_name), raw)
        written.append(index_name)
    _remove_stale(store, url, weights, index_name, set(written))
    return written


def _nbytes(shard: Mapping[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in shard.values() if isinstance(t, torch.Tensor))


def _write_safetensors(sink: ObjectSink, shard: Mapping[str, torch.Tensor]) -> None:
    """One safetensors file: the 8-byte header length, the JSON header (8-byte aligned,
    as safetensors pads it), then each tensor's bytes in header order."""
    doc: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, t in shard.items():
        n = t.numel() * t.element_size()
        doc[name] = {
            "dtype": TORCH_TO_ST[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + n],
        }
        offset += n
    raw = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    sink.write(struct.pack("<Q", len(raw)) + raw)
    for t in shard.values():
        if t.numel():
            flat = t.detach().to("cpu").contiguous().reshape(-1)
            sink.write(memoryview(flat.view(torch.uint8).numpy()))


def _remove_stale(
    store: ObjectStore, url: StoreURL, weights: str, index_name: str, keep: set[str]
) -> None:
    """Delete what an earlier save left under ``url`` that this save's files replace:
    shards of accelerate's pattern the new files do not include, and the index when the
    new save is not sharded. Other objects there are left alone."""
    stem = weights.rsplit(".", 1)[0]
    stale = []
    for info in store.list(url.prefix):
        name = info.key[len(url.prefix) :]
        if name in keep or "/" in name:
            continue
        base = name.rsplit(".", 1)[0]
        if name == index_name or (
            name.startswith(stem)
            and name.endswith(weights[len(stem) :])
            and _SHARD.fullmatch(base) is not None
        ):
            stale.append(info.key)
    if stale:
        failures = store.delete(stale)
        if failures:  # the new files are complete; the old ones only clutter the folder
            log.warning(
                "s3ckpt: save_model to %s could not delete the earlier save's %s; delete "
                "them by hand",
                url,
                ", ".join(f.key for f in failures),
            )
