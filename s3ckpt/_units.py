"""Sizes and counts for people: one spelling of a byte count, and of "1 checkpoint" /
"2 checkpoints", for the CLI, the tools and the demo.

A leaf module (standard library only).
"""

from __future__ import annotations

__all__ = ["format_bytes", "plural"]


def format_bytes(n: float) -> str:
    """A binary size: ``512 B``, ``1.5 GiB`` (whole bytes, else one decimal; TiB at most)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """``n`` and ``noun``, in the plural unless ``n`` is 1: ``1 checkpoint``,
    ``0 checkpoints``, ``2 DeleteObjects requests`` (``nouns``: the plural when it is not
    ``noun + "s"``)."""
    return f"{n} {noun if n == 1 else (nouns or noun + 's')}"
