"""What an accelerate checkpoint holds besides the models and optimizers: the entries
(schedulers, data loaders, the scaler, registered objects, the accelerator's counters, the
RNG states), how each is captured and how it is put back.

Every such entry is stored packed (:mod:`s3ckpt.tools.packing`, the storage form the
Lightning plug-in uses too): exactly, ``None`` leaves, ``int`` keys and tuples included,
and loaded into destinations the checkpoint's metadata describes, so the value comes back
as it was saved whatever the live object holds now.

Also here: ``accelerator.save_model(model, "s3://...")``: the files accelerate writes to a local
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
import random
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from s3ckpt._plugin_common import patch_once
from s3ckpt._transfer import ObjectSink, Uploader, format_leftovers
from s3ckpt.errors import ConfigError
from s3ckpt.store import Location
from s3ckpt.tools._safetensors import TORCH_TO_ST, build_header, tensor_bytes
from s3ckpt.uri import StoreURL

if TYPE_CHECKING:
    from accelerate import Accelerator

# Entries a load may find missing without failing: RNG states of a rank the saving job did
# not have (another world size), data loader state (accelerate loads it only when its file
# exists), the accelerator's counters.
OPTIONAL = ("random_states_", "dataloader", "accelerator")


# -- the entries of one accelerator ------------------------------------------------------------
def optimizers(
    acc: Accelerator, models: list[torch.nn.Module]
) -> list[tuple[torch.optim.Optimizer, torch.nn.Module]]:
    """Each prepared optimizer (unwrapped) with the prepared model holding its
    parameters (torch names optimizer state by that model's parameter names)."""
    out = []
    for j, wrapped in enumerate(acc._optimizers):
        opt = getattr(wrapped, "optimizer", wrapped)
        wanted = {id(p) for group in opt.param_groups for p in group["params"]}
        owner = next((m for m in models if wanted <= {id(p) for p in m.parameters()}), None)
        if owner is None:
            raise ConfigError(
                f"optimizer {j} ({type(opt).__name__}) updates parameters of no single prepared "
                "model; s3ckpt.accelerate names optimizer state by one model's parameter "
                "names. Prepare the models it spans as one module"
            )
        out.append((opt, owner))
    return out


def entry_name(kind: str, index: int) -> str:
    """accelerate's numbering: ``model``, ``model_1``, ``model_2`` ..."""
    return kind if index == 0 else f"{kind}_{index}"


def other_names(acc: Accelerator, rank: int) -> list[str]:
    """The entries of :func:`other_state`, without building it."""
    names = [entry_name("scheduler", k) for k in range(len(acc._schedulers))]
    names += [entry_name("dataloader", k) for k in range(len(acc._dataloaders))]
    names += ["scaler"] if acc.scaler is not None else []
    names += [f"custom_{k}" for k in range(len(acc._custom_objects))]
    return [*names, "accelerator", f"random_states_{rank}"]


def other_state(acc: Accelerator, rank: int) -> dict[str, Any]:
    """Every entry but the models and optimizers, as values (names: :func:`other_names`)."""
    values = [scheduler.state_dict() for scheduler in acc._schedulers]
    values += [loader_state(loader) for loader in acc._dataloaders]
    values += [acc.scaler.state_dict()] if acc.scaler is not None else []
    values += [obj.state_dict() for obj in acc._custom_objects]
    values += [{"step": int(acc.step), "iteration": int(acc.save_iteration)}, rng_state()]
    return dict(zip(other_names(acc, rank), values, strict=True))


def apply_state(acc: Accelerator, state: Mapping[str, Any], *, automatic: bool) -> None:
    """Load what :func:`other_state` saved (``state``: each entry loaded and unpacked) into
    the accelerator's objects, except the RNG states and the scaler (the caller restores
    the scaler before the optimizers). With ``automatic`` naming, the next save goes to
    the checkpoint after the one loaded."""
    for k, scheduler in enumerate(acc._schedulers):
        scheduler.load_state_dict(state[entry_name("scheduler", k)])
    for k, loader in enumerate(acc._dataloaders):
        load_loader_state(loader, state.get(entry_name("dataloader", k), {}))
    for k, obj in enumerate(acc._custom_objects):
        obj.load_state_dict(state[f"custom_{k}"])
    counters = state.get("accelerator", {})
    if "step" in counters:
        acc.step = int(counters["step"])
    if automatic and "iteration" in counters:
        acc.project_configuration.iteration = int(counters["iteration"]) + 1


# -- data loaders -------------------------------------------------------------------------------
_EPOCH_START = "_s3ckpt_epoch_start"  # on a watched loader: (epoch, generator state)


def watch_epochs(loader: Any) -> None:
    """Record the shuffling generator's state as each epoch of the prepared ``loader``
    starts, before the epoch's order is drawn from it (accelerate's ``DataLoaderShard``
    calls ``set_epoch`` right after synchronising the generator across ranks). A save in
    the middle of an epoch stores that state, so the resumed epoch draws the same order
    and a stateful loader (or ``skip_first_batches``) skips exactly the batches seen.
    Idempotent."""

    @patch_once(loader, "set_epoch")
    def set_epoch(original: Callable[[int], None], epoch: int) -> None:
        generator = _generator(loader, _sampler(loader))
        if generator is not None:
            setattr(loader, _EPOCH_START, (int(epoch), generator.get_state()))
        original(epoch)


def loader_state(loader: Any) -> dict[str, Any]:
    """What resumes a prepared data loader: its epoch counter (accelerate seeds each
    epoch's shuffle by it), the shuffling generator (synchronised across ranks, and not
    saved by accelerate: its state at the start of the epoch when saved in the middle of
    one, see :func:`watch_epochs`), a seedable sampler's epoch and seed, a stateful
    loader's state (``use_stateful_dataloader=True``: where in the epoch it is)."""
    from accelerate.data_loader import SeedableRandomSampler

    state: dict[str, Any] = {}
    iteration = getattr(loader, "iteration", None)
    if isinstance(iteration, int):
        state["iteration"] = iteration
    sampler = _sampler(loader)
    generator = _generator(loader, sampler)
    if generator is not None:
        epoch, began = getattr(loader, _EPOCH_START, (None, None))
        mid_epoch = not getattr(loader, "end_of_dataloader", True)
        at_start = began is not None and epoch == iteration and mid_epoch
        state["generator"] = began if at_start else generator.get_state()
    if isinstance(sampler, SeedableRandomSampler):
        state["sampler"] = {"epoch": int(sampler.epoch), "initial_seed": int(sampler.initial_seed)}
    if getattr(loader, "use_stateful_dataloader", False):
        state["state"] = loader.state_dict()
    return state


def load_loader_state(loader: Any, state: Mapping[str, Any]) -> None:
    """Restore what :func:`loader_state` saved into ``loader``."""
    from accelerate.data_loader import SeedableRandomSampler

    if "iteration" in state:
        loader.iteration = int(state["iteration"])
    sampler = _sampler(loader)
    generator = _generator(loader, sampler)
    if "generator" in state and generator is not None:
        generator.set_state(state["generator"])
    if "sampler" in state and isinstance(sampler, SeedableRandomSampler):
        sampler.epoch = int(state["sampler"]["epoch"])
        sampler.initial_seed = int(state["sampler"]["initial_seed"])
    if "state" in state and getattr(loader, "use_stateful_dataloader", False):
        loader.load_state_dict(state["state"])


def _sampler(loader: Any) -> Any:
    """The index sampler under a prepared loader's batch samplers. (accelerate's own
    ``get_sampler`` stops at its ``BatchSamplerShard``, which has no ``sampler``.)"""
    from torch.utils.data import BatchSampler

    outer = getattr(loader, "sampler", None)
    batches = outer if isinstance(outer, BatchSampler) else getattr(loader, "batch_sampler", None)
    for _ in range(4):  # BatchSamplerShard -> BatchSampler -> sampler (None: None)
        inner = getattr(batches, "sampler", None)
        if inner is not None:
            return inner
        batches = getattr(batches, "batch_sampler", None)
    return None


def _generator(loader: Any, sampler: Any) -> torch.Generator | None:
    """The generator the loader shuffles with: the one accelerate synchronises across
    ranks at each epoch's start, else the sampler's own."""
    found = (getattr(loader, "synchronized_generator", None), getattr(sampler, "generator", None))
    return next((g for g in found if isinstance(g, torch.Generator)), None)


# -- random number generators ------------------------------------------------------------------
def _device_rng_module() -> tuple[str, Any] | None:
    """The accelerator device's name and torch module (``cuda``, ``xpu`` ...), if any."""
    if not torch.accelerator.is_available():
        return None
    name = torch.accelerator.current_accelerator().type
    module = torch.get_device_module(name)
    return (name, module) if hasattr(module, "get_rng_state_all") else None


def rng_state() -> dict[str, Any]:
    """This process's RNG states: Python's, NumPy's legacy global one, torch's CPU one and
    each accelerator device's."""
    import numpy as np  # (a dependency of accelerate's)

    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    state["numpy"] = np.random.get_state()
    device = _device_rng_module()
    if device is not None:
        name, module = device
        state[name] = {str(i): t for i, t in enumerate(module.get_rng_state_all())}
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what :func:`rng_state` returned (or a part of it)."""
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
    device = _device_rng_module()
    if device is not None and device[0] in state:
        name, module = device
        saved = state[name]
        module.set_rng_state_all([saved[str(i)] for i in range(len(saved))])


log = logging.getLogger("s3ckpt")


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
    where: Location,
    *,
    max_shard_size: int | str,
    safe_serialization: bool,
) -> list[str]:
    """Write ``state_dict`` under ``where`` (with its transfer settings) as
    ``Accelerator.save_model`` writes a folder; returns the names written (shards, then
    the index when sharded).

    Raises:
        ConfigError: a tensor of a dtype safetensors cannot store, or a non-tensor value
            (with ``safe_serialization``), before anything is uploaded.
    """
    from accelerate.utils import clean_state_dict_for_safetensors, constants
    from huggingface_hub import split_torch_state_dict_into_shards

    url, store, transfer_config = where.url, where.store, where.transfer_config

    if safe_serialization:
        state_dict = clean_state_dict_for_safetensors(dict(state_dict))
        for name, value in state_dict.items():
            if not isinstance(value, torch.Tensor) or value.dtype not in TORCH_TO_ST:
                what = value.dtype if isinstance(value, torch.Tensor) else type(value).__name__
                raise ConfigError(
                    f"save_model to {url}: {name!r} is a {what}, which safetensors cannot "
                    "store; pass safe_serialization=False to write pytorch_model.bin files"
                )
    kind = "SAFE_WEIGHTS" if safe_serialization else "WEIGHTS"  # accelerate's file names
    weights, pattern, index_name = (
        getattr(constants, f"{kind}{end}") for end in ("_NAME", "_PATTERN_NAME", "_INDEX_NAME")
    )
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
        max_concurrency=transfer_config.read_concurrency,
    )
    try:
        for filename, shard in shards.items():
            sink = uploader.sink(url.key(filename))
            (_write_safetensors if safe_serialization else torch.save)(shard, sink)
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
    _remove_stale(where, weights, index_name, set(written))
    return written


def _nbytes(shard: Mapping[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in shard.values() if isinstance(t, torch.Tensor))


def _write_safetensors(shard: Mapping[str, torch.Tensor], sink: ObjectSink) -> None:
    """One safetensors file: the 8-byte header length, the JSON header (8-byte aligned,
    as safetensors pads it), then each tensor's bytes in header order."""
    header, _ = build_header(
        [(n, t.dtype, tuple(t.shape)) for n, t in shard.items()], {"format": "pt"}
    )
    sink.write(header)
    for t in shard.values():
        if t.numel():
            sink.write(tensor_bytes(t))


def _remove_stale(where: Location, weights: str, index_name: str, keep: set[str]) -> None:
    """Delete what an earlier save left under ``where`` that this save's files replace:
    shards of accelerate's pattern the new files do not include, and the index when the
    new save is not sharded. Other objects there are left alone."""
    store, url = where.store, where.url
    stem, ext = weights.rsplit(".", 1)
    shard = re.compile(rf"{re.escape(stem)}.*-\d{{5}}-of-\d{{5}}\.{re.escape(ext)}")
    stale = [
        info.key
        for info in store.list(url.prefix)
        if (name := info.key[len(url.prefix) :]) not in keep
        and "/" not in name
        and (name == index_name or shard.fullmatch(name))
    ]
    if stale:
        failures = store.delete(stale)
        if failures:  # the new files are complete; the old ones only clutter the folder
            log.warning(
                "s3ckpt: save_model to %s could not delete the earlier save's %s; delete "
                "them by hand",
                url,
                ", ".join(f.key for f in failures),
            )
