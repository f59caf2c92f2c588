"""Helpers the accelerate plug-in's modules share: names, URLs, and s3ckpt's errors in
place of DCP's ``CheckpointException``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from s3ckpt.dcp import quiet_dcp
from s3ckpt.errors import ConfigError, unwrap_checkpoint_exception
from s3ckpt.uri import StoreURL

__all__ = ["dcp_call", "entry_name", "is_url", "owner_of", "version"]


def is_url(location: object) -> bool:
    """Whether accelerate's ``output_dir`` / ``input_dir`` names a store (has ``://``)."""
    return location is not None and "://" in str(location)


def entry_name(kind: str, index: int) -> str:
    """accelerate's numbering: ``model``, ``model_1``, ``model_2`` ..."""
    return kind if index == 0 else f"{kind}_{index}"


def version() -> str:
    """The installed accelerate's version."""
    import accelerate

    return str(accelerate.__version__)


def owner_of(
    models: list[torch.nn.Module], opt: torch.optim.Optimizer, index: int
) -> torch.nn.Module:
    """The prepared model holding every parameter ``opt`` updates (torch names optimizer
    state by that model's parameter names)."""
    wanted = {id(p) for group in opt.param_groups for p in group["params"]}
    for model in models:
        if wanted <= {id(p) for p in model.parameters()}:
            return model
    raise ConfigError(
        f"optimizer {index} ({type(opt).__name__}) updates parameters of no single prepared "
        "model; s3ckpt.accelerate names optimizer state by one model's parameter names. "
        "Prepare the models it spans as one module"
    )


@contextmanager
def dcp_call(what: str, url: StoreURL, rank: int) -> Iterator[None]:
    """DCP's logging quietened, and every failure an s3ckpt error (an ``Exception``) in
    place of DCP's ``CheckpointException``, naming the checkpoint and the rank
    (:func:`~s3ckpt.errors.unwrap_checkpoint_exception`)."""
    try:
        with quiet_dcp():
            yield
    except BaseException as exc:
        err = unwrap_checkpoint_exception(
            exc, f"{what} of {url}", bucket=url.bucket, key=url.prefix, rank=rank
        )
        raise err from err.__cause__
