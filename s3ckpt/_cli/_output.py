"""How the ``s3ckpt`` commands print: shapes, aligned tables and JSON on stdout (sizes:
:func:`s3ckpt._units.format_bytes`); progress on stderr.

Progress (:class:`ProgressBar` when the total is known, :class:`ProgressCounter` when it is
not) is drawn only when stderr is a terminal, and never with ``--json`` or
``--no-progress`` (:func:`progress_enabled`): a cron job's log or a pipe gets none.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, TextIO

from s3ckpt._units import format_bytes

__all__ = [
    "ProgressBar",
    "ProgressCounter",
    "add_output_options",
    "format_shape",
    "print_json",
    "print_table",
    "progress_enabled",
]


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


# -- progress on stderr ----------------------------------------------------------------------
def add_output_options(p: argparse.ArgumentParser, *, progress: bool = True) -> None:
    """``--json`` (and ``--no-progress`` when the command draws progress)."""
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    if progress:
        p.add_argument(
            "--no-progress",
            action="store_true",
            help="no progress on stderr (it is drawn only when stderr is a terminal)",
        )


def progress_enabled(args: argparse.Namespace) -> bool | None:
    """``False`` with ``--json`` or ``--no-progress``; else ``None``: drawn when stderr is a
    terminal."""
    return False if getattr(args, "json", False) or getattr(args, "no_progress", False) else None


class _StatusLine:
    """One line on a terminal, redrawn in place at most ten times a second from any
    thread; nothing at all when ``stream`` is not a TTY (unless ``enabled=True``)."""

    def __init__(self, label: str, stream: TextIO | None = None, enabled: bool | None = None):
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = _isatty(self.stream) if enabled is None else enabled
        self._t0 = time.monotonic()
        self._last = 0.0
        self._drawn = False
        self._lock = threading.Lock()

    def _draw(self, text: Callable[[float], str], force: bool) -> None:
        if not self.enabled:
            return
        with self._lock:
            now = time.monotonic()
            if now - self._last < 0.1 and not force:
                return
            self._last = now
            self.stream.write("\r" + text(now - self._t0))
            self.stream.flush()
            self._drawn = True

    def clear(self) -> None:
        """Erase the line (before other output; the next update draws it again)."""
        with self._lock:
            if self._drawn:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
                self._drawn = False

    def close(self) -> None:
        """End the line (the last state stays on screen)."""
        with self._lock:
            if self._drawn:
                self.stream.write("\n")
                self.stream.flush()
                self._drawn = False


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


class ProgressBar(_StatusLine):
    """``label [#####.....] 1.2 GiB / 3.4 GiB  210.5 MiB/s  ETA 0:11`` on a terminal.

    Callable as ``bar(done, total)`` (bytes) from any thread; draws at most ten times a
    second and only when ``stream`` is a TTY (or ``enabled=True``).
    """

    def __call__(self, done: int, total: int) -> None:
        def text(elapsed: float) -> str:
            frac = min(1.0, done / total) if total else 1.0
            rate = done / max(elapsed, 1e-6)
            eta = int((total - done) / rate) if rate > 0 and total > done else 0
            filled = int(frac * 30)
            return (
                f"{self.label} [{'#' * filled}{'.' * (30 - filled)}] {format_bytes(done)} / "
                f"{format_bytes(total)}  {format_bytes(rate)}/s  ETA {eta // 60}:{eta % 60:02d} "
            )

        self._draw(text, force=done >= total)


class ProgressCounter(_StatusLine):
    """``label: 12345 objects listed, 310 deleted  4.2 s`` on a terminal, for work whose
    total is not known ahead (a listing, a prune).

    ``counter.add(what, n)`` from any thread counts ``n`` more ``what`` (in the order
    first seen); draws at most ten times a second and only when ``stream`` is a TTY (or
    ``enabled=True``).
    """

    def __init__(self, label: str, stream: TextIO | None = None, enabled: bool | None = None):
        super().__init__(label, stream, enabled)
        self.counts: dict[str, int] = {}
        self._count_lock = threading.Lock()

    def add(self, what: str, n: int = 1) -> None:
        """Count ``n`` more ``what`` and redraw."""
        with self._count_lock:
            self.counts[what] = self.counts.get(what, 0) + n
            parts = ", ".join(f"{v} {k}" for k, v in self.counts.items())
        self._draw(lambda elapsed: f"{self.label}: {parts}  {elapsed:.1f} s\x1b[K", force=False)

    def close(self) -> None:
        """Erase the line: the command's own output follows."""
        self.clear()
