"""The state dict a Checkpointer saves and loads: ``{"model", "optim", "train_state"}``.

Built by torch's ``get_state_dict`` / ``set_state_dict``, so plain modules, DDP, DTensor
and FSDP2 (``fully_shard``) all work.
"""

from __future__ import annotations

from typing import Any

from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from s3ckpt.errors import ConfigError

__all__ = ["apply_state_dict", "collect_state_dict"]


def collect_state_dict(model: Any, optimizer: Any, train_state: Any) -> dict[str, Any]:
    """The state dict to save (or to load into): ``model``, ``optim`` when an optimizer is
    given, ``train_state`` when a train state is given."""
    sd: dict[str, Any] = {}
    if optimizer is None:
        sd["model"] = get_model_state_dict(model)
    else:
        sd["model"], sd["optim"] = get_state_dict(model, optimizer)
    if train_state is not None:
        fn = getattr(train_state, "state_dict", None)
        if fn is None or not callable(getattr(train_state, "load_state_dict", None)):
            raise ConfigError(
                "train_state must have state_dict() and load_state_dict() (torch's Stateful); "
                f"got {type(train_state).__name__}"
            )
        sd["train_state"] = fn()
    return sd


def apply_state_dict(sd: dict[str, Any], model: Any, optimizer: Any, train_state: Any) -> None:
    """Put a loaded ``sd`` (from :func:`collect_state_dict`) back into its owners."""
    if optimizer is None:
        set_model_state_dict(model, sd["model"])
    else:
        set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    if train_state is not None:
        train_state.load_state_dict(sd["train_state"])
