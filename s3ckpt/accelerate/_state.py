"""What an accelerate checkpoint holds besides the models and optimizers: the entries
(schedulers, data loaders, the scaler, registered objects, the accelerator's counters, the
RNG states), how each is captured and how it is put back.

Every such entry is stored packed (:mod:`s3ckpt.tools.packing`, the storage form the
Lightning plug-in uses too): exactly, ``None`` leaves, ``int`` keys and tuples included,
and loaded into destinations the checkpoint's metadata describes, so the value comes back
as it was saved whatever the live object holds now.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from s3ckpt.accelerate._common import entry_name, owner_of

if TYPE_CHECKING:
    from accelerate import Accelerator

__all__ = [
    "OPTIONAL",
    "apply_state",
    "optimizers",
    "other_names",
    "other_state",
    "rng_state",
    "set_rng_state",
    "watch_epochs",
]

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
        out.append((opt, owner_of(models, opt, j)))
    return out


def other_names(acc: Accelerator, rank: int) -> list[str]:
    """The entries of :func:`other_state`, without building it."""
    names = [entry_name("scheduler", k) for k in range(len(acc._schedulers))]
    names += [entry_name("dataloader", k) for k in range(len(acc._dataloaders))]
    names += ["scaler"] if acc.scaler is not None else []
    names += [f"custom_{k}" for k in range(len(acc._custom_objects))]
    return [*names, "accelerator", f"random_states_{rank}"]


def other_state(acc: Accelerator, rank: int) -> dict[str, Any]:
    """Every entry but the models and optimizers, as values (names: :func:`other_names`)."""
    sd: dict[str, Any] = {}
    for k, scheduler in enumerate(acc._schedulers):
        sd[entry_name("scheduler", k)] = scheduler.state_dict()
    for k, loader in enumerate(acc._dataloaders):
        sd[entry_name("dataloader", k)] = loader_state(loader)
    if acc.scaler is not None:
        sd["scaler"] = acc.scaler.state_dict()
    for k, obj in enumerate(acc._custom_objects):
        sd[f"custom_{k}"] = obj.state_dict()
    sd["accelerator"] = {"step": int(acc.step), "iteration": int(acc.save_iteration)}
    sd[f"random_states_{rank}"] = rng_state()
    return sd


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
    original = getattr(loader, "set_epoch", None)
    if original is None or getattr(original, "_s3ckpt_watch", False):
        return

    def set_epoch(epoch: int) -> None:
        generator = _generator(loader, _sampler(loader))
        if generator is not None:
            setattr(loader, _EPOCH_START, (int(epoch), generator.get_state()))
        original(epoch)

    set_epoch._s3ckpt_watch = True  # type: ignore[attr-defined]
    loader.set_epoch = set_epoch


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
        started = getattr(loader, _EPOCH_START, None)
        mid_epoch = not getattr(loader, "end_of_dataloader", True)
        if started is not None and started[0] == iteration and mid_epoch:
            state["generator"] = started[1]
        else:
            state["generator"] = generator.get_state()
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
    for _ in range(4):  # BatchSamplerShard -> BatchSampler -> sampler
        if batches is None:
            return None
        inner = getattr(batches, "sampler", None)
        if inner is not None:
            return inner
        batches = getattr(batches, "batch_sampler", None)
    return None


def _generator(loader: Any, sampler: Any) -> torch.Generator | None:
    """The generator the loader shuffles with: the one accelerate synchronises across
    ranks at each epoch's start, else the sampler's own."""
    for candidate in (
        getattr(loader, "synchronized_generator", None),
        getattr(sampler, "generator", None),
    ):
        if isinstance(candidate, torch.Generator):
            return candidate
    return None


# -- random number generators ------------------------------------------------------------------
def _device_rng_module() -> tuple[str, Any] | None:
    """The accelerator device's name and torch module (``cuda``, ``xpu`` ...), if any."""
    accel = getattr(torch, "accelerator", None)
    if accel is None or not accel.is_available():
        return None
    name = accel.current_accelerator().type
    module = torch.get_device_module(name)
    if not hasattr(module, "get_rng_state_all"):
        return None
    return name, module


def rng_state() -> dict[str, Any]:
    """This process's RNG states: Python's, NumPy's legacy global one, torch's CPU one and
    each accelerator device's."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np
    except ImportError:
        pass
    else:
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
