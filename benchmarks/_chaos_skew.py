"""A skewed wall clock for one chaos worker process (benchmarks/chaos.py classes 8 and 9).

The harness sets :data:`ENV` (seconds, may be negative) in a worker's command; the worker
puts it in its environment and calls :func:`install_from_env` before it runs the command.
From then on ``time.time``, ``time.time_ns``, ``datetime.datetime.now`` and
``datetime.datetime.utcnow`` read the host clock plus the skew, everywhere in the process:
in modules imported later and in modules that already hold ``from datetime import
datetime`` or ``from time import time`` (their references are rebound). ``time.monotonic``
is left alone, so timeouts and retries keep real durations.

The variable belongs to the harness: s3ckpt never reads it (a process of a host whose clock
is wrong does not know it), and ``tests``/``s3ckpt`` contain no reference to it.
"""

from __future__ import annotations

import datetime as _dt
import os
import sys
import time
from typing import Any

__all__ = ["ENV", "install", "install_from_env"]

ENV = "CHAOS_CLOCK_SKEW_S"
"""Seconds this process's wall clock runs ahead of the host's (negative: behind)."""

_REAL_DATETIME = _dt.datetime
_REAL_TIME = time.time
_REAL_TIME_NS = time.time_ns
_installed: list[float] = []


class _Meta(type):
    """Lets ``isinstance(real_datetime, datetime)`` stay true once the name is rebound."""

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, _REAL_DATETIME)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, _REAL_DATETIME)


def install(skew_s: float) -> None:
    """Skew this process's wall clock by ``skew_s`` seconds (once per process)."""
    if _installed:
        raise RuntimeError(f"clock already skewed by {_installed[0]} s")
    _installed.append(skew_s)
    delta = _dt.timedelta(seconds=skew_s)
    skew_ns = int(skew_s * 1e9)

    def skewed_time() -> float:
        return _REAL_TIME() + skew_s

    def skewed_time_ns() -> int:
        return _REAL_TIME_NS() + skew_ns

    class SkewedDatetime(_REAL_DATETIME, metaclass=_Meta):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return _REAL_DATETIME.now(tz) + delta

        @classmethod
        def utcnow(cls) -> Any:
            return _REAL_DATETIME.now(_dt.UTC).replace(tzinfo=None) + delta

    SkewedDatetime.__name__ = SkewedDatetime.__qualname__ = "datetime"
    SkewedDatetime.__module__ = "datetime"
    swaps: dict[int, Any] = {
        id(_REAL_TIME): skewed_time,
        id(_REAL_TIME_NS): skewed_time_ns,
        id(_REAL_DATETIME): SkewedDatetime,
    }
    time.time = skewed_time
    time.time_ns = skewed_time_ns
    _dt.datetime = SkewedDatetime  # type: ignore[misc]
    for mod in list(sys.modules.values()):
        if mod is None or mod is _dt or mod is time or mod.__name__ == __name__:
            continue
        try:
            items = list(vars(mod).items())
        except TypeError:
            continue
        for name, value in items:
            new = swaps.get(id(value))
            if new is not None:
                try:
                    setattr(mod, name, new)
                except (AttributeError, TypeError):
                    pass


def install_from_env() -> float:
    """Apply :data:`ENV` if it is set; returns the skew in seconds (0.0 when unset)."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return 0.0
    skew = float(raw)
    if skew:
        install(skew)
    return skew
