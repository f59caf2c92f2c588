"""How the ``s3ckpt`` commands print: shapes, aligned tables and JSON on stdout (sizes:
:func:`s3ckpt._units.format_bytes`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from typing import Any

__all__ = ["format_shape", "print_json", "print_table"]


def format_shape(shape: Sequence[int] | None) -> str:
    """``(2, 3)`` -> ``[2, 3]``; no shape -> ``-``."""
    return "-" if shape is None else "[" + ", ".join(str(s) for s in shape) + "]"


def print_table(
    rows: Sequence[Sequence[str]], right: Collection[int] = (), indent: str = ""
) -> None:
    """Print ``rows`` as columns two spaces apart, each line after ``indent``; the columns
    whose indexes are in ``right`` are right-aligned. Trailing blanks are cut; no rows
    print nothing."""
    if not rows:
        return
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        cells = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        print(indent + "  ".join(cells).rstrip())


def print_json(
    doc: Any, *, allow_nan: bool = True, default: Callable[[Any], Any] | None = None
) -> None:
    """Print ``doc`` as JSON indented by two, and a newline.

    Args:
        allow_nan: Write NaN and infinities as JavaScript does; False raises ValueError.
        default: Turns what JSON cannot hold into something it can (None: TypeError).
    """
    print(json.dumps(doc, indent=2, allow_nan=allow_nan, default=default))
