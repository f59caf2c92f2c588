"""A training metric as a plain number: ``metrics={"loss": loss}`` with ``loss`` a tensor.

A leaf module (imports :mod:`s3ckpt.errors` only, and never torch or numpy: it duck-types
their values), so the manifest's :func:`~s3ckpt.format.check_metrics` can call it in a
process without torch (the retention cron).
"""

from __future__ import annotations

from typing import Any

from s3ckpt.errors import ConfigError

__all__ = ["metric_scalar"]


def metric_scalar(name: str, value: Any) -> Any:
    """``value`` as a Python number when it is a one-element tensor or array, else as it is.

    A torch tensor (a 0-d ``loss``, or one element; on any device, with or without
    ``requires_grad``) is detached and read with ``.item()``: no requires_grad warning, and
    the checkpoint holds no reference to the autograd graph. A numpy scalar or array of one
    element is read with ``.item()`` too. Plain numbers come back unchanged; the caller
    (:func:`~s3ckpt.format.check_metrics`) turns the result into a float and refuses what
    is not a real number.

    Non-finite values are kept, as for plain floats: a diverged run's NaN loss is exactly
    the checkpoint to keep an eye on, and retention ranks NaN worst.

    Raises:
        ConfigError: ``value`` is a tensor or array of more than one element (or none),
            naming the metric and its shape, and what to pass instead.
    """
    if isinstance(value, (int, float)):
        return value
    detach = getattr(value, "detach", None)
    if callable(detach):
        value = detach()
    item = getattr(value, "item", None)
    if not callable(item):
        return value
    numel = getattr(value, "numel", None)  # elements of a tensor, or (size) of an array
    size = numel() if callable(numel) else getattr(value, "size", None)
    if isinstance(size, int) and size != 1:
        shape = getattr(value, "shape", None)
        where = f" of shape {list(shape)}" if shape is not None else ""
        raise ConfigError(
            f"metric {name!r} must be a scalar, got a {type(value).__name__}{where} with "
            f"{size} elements: pass one number (loss.item(), or reduce it: loss.mean())"
        )
    return item()
