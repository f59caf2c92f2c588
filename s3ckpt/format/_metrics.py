"""Metric values in the manifest: what a save accepts (string names, real numbers), how
they are written (NaN and +-inf as the strings ``float()`` reads back) and read."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from s3ckpt._scalars import metric_scalar
from s3ckpt.errors import ConfigError

__all__ = ["check_metrics", "metric_from_json", "metric_to_json"]


def check_metrics(metrics: Mapping[str, Any] | None) -> dict[str, float]:
    """Metrics as the manifest records them: string names, float values.

    NaN and +-inf are kept (a diverging run needs exactly that checkpoint, and retention
    ranks NaN worst); anything that is not a real number is a :class:`ConfigError`. A
    one-element tensor or numpy value is read with ``.item()`` (:func:`metric_scalar`).
    """
    out: dict[str, float] = {}
    for name, value in (metrics or {}).items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"metric names must be non-empty strings, got {name!r}")
        value = metric_scalar(name, value)
        if isinstance(value, bool):
            raise ConfigError(f"metric {name!r} must be a number, got a bool")
        try:
            out[name] = float(value)
        except (TypeError, ValueError):
            raise ConfigError(
                f"metric {name!r} must be a number, got {type(value).__name__} {value!r}"
            ) from None
    return out


def metric_to_json(value: float) -> float | str:
    """Finite metrics as JSON numbers; NaN and +-inf as the strings float() reads back."""
    value = float(value)
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def metric_from_json(value: Any) -> float:
    """A metric read from a marker: a number, or one of the strings :func:`metric_to_json`
    writes (``TypeError`` / ``ValueError`` for anything else)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(f"metric must be a number, got {type(value).__name__}")
    if isinstance(value, str) and value not in ("NaN", "Infinity", "-Infinity"):
        raise ValueError(f"metric {value!r} is not a number")
    return float(value)
