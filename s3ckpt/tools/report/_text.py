"""How values are written into the page: escaped text and attributes, numbers that
``parseFloat`` reads back exactly, metric values and UTC times as the page shows them.

Every string from a bucket (run and checkpoint names, metric names, pin reasons) is
untrusted and goes through :func:`esc`; nothing reaches the page unescaped.
"""

from __future__ import annotations

import html
import math
from datetime import UTC, datetime

__all__ = ["esc", "metric_text", "number", "utc_text"]


def esc(value: object) -> str:
    """Escaped for HTML text and double-quoted attributes (bucket data is untrusted)."""
    return html.escape(str(value), quote=True)


def number(v: float) -> str:
    """A float for a data attribute: ``repr`` when finite, else what ``parseFloat`` reads."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return repr(float(v))


def metric_text(v: float) -> str:
    """A metric value as the page prints it: six significant digits (``nan``, ``inf``)."""
    return f"{v:.6g}" if math.isfinite(v) else str(v)


def utc_text(t: datetime | None) -> str:
    """``t`` in UTC to the second (``2025-06-01 12:00:00Z``); empty for None."""
    return "" if t is None else t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
