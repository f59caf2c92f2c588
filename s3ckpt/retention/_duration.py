"""Durations as people write them: ``90s``, ``15m``, ``36h``, ``7d``, ``2w``, ``1d12h``."""

from __future__ import annotations

import math
import re
from datetime import timedelta

__all__ = ["MAX_DURATION", "format_duration", "parse_duration"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_WHOLE = re.compile(r"^(?:\d+(?:\.\d+)?[smhdw])+$")

DURATION_HELP = "a number and a unit s, m, h, d or w, e.g. '90s', '36h', '7d' or '1d12h'"

MAX_DURATION = timedelta(days=36500)
"""The longest duration s3ckpt takes (100 years, ``36500d``): a grace period, ``within`` or
lease longer than that is a typo, and one beyond :class:`~datetime.datetime`'s range would
overflow the arithmetic on times (``now - grace``) instead of being refused."""


def parse_duration(text: str) -> timedelta:
    """Parse ``text`` into a :class:`timedelta`.

    Raises:
        ValueError: naming the text and the accepted forms (callers wrap it with the key).
    """
    if not isinstance(text, str):
        raise ValueError(f"expected a duration string ({DURATION_HELP}), got {text!r}")
    compact = text.strip().lower().replace(" ", "")
    if not _WHOLE.match(compact):
        raise ValueError(f"bad duration {text!r}: use {DURATION_HELP}")
    seconds = sum(float(n) * _UNITS[u] for n, u in _PART.findall(compact))
    if not math.isfinite(seconds) or seconds > MAX_DURATION.total_seconds():
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise ValueError(
            f"duration {shown!r} is longer than {MAX_DURATION.days}d (100 years), the "
            "longest s3ckpt takes"
        )
    return timedelta(seconds=seconds)


def format_duration(value: timedelta) -> str:
    """The shortest ``1d12h``-style spelling of ``value`` (whole seconds)."""
    total, out = round(value.total_seconds()), ""
    for unit, size in reversed(_UNITS.items()):  # the largest unit first
        n, total = divmod(total, size)
        out += f"{n}{unit}" if n else ""
    return out or "0s"
