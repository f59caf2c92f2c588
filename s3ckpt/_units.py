"""Sizes for people: one spelling of a byte count for the CLI, the tools and the demo.

A leaf module (standard library only).
"""

from __future__ import annotations

__all__ = ["format_bytes"]


def format_bytes(n: float) -> str:
    """A binary size: ``512 B``, ``1.5 GiB`` (whole bytes, else one decimal; TiB at most)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
