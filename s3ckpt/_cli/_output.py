"""How the ``s3ckpt`` commands print: shapes, aligned tables and JSON on stdout (sizes:
:func:`s3ckpt._units.format_bytes`); progress and warnings about damaged checkpoints on
stderr.

Progress (:class:`ProgressBar` when the total is known, :class:`ProgressCounter` when it is
not) is drawn only when stderr is a terminal, and never with ``--json`` or
``--no-progress`` (:func:`progress_enabled`): a cron job's log or a pipe gets none.

Damaged checkpoints: ``ls``, ``prune``, ``gc`` and ``report`` list a checkpoint the catalog
calls damaged (its commit marker cannot be read, or ``s3ckpt check`` found damage in it:
:attr:`s3ckpt.retention.CheckpointInfo.damaged`) as its own row, warn about it on stderr
(:func:`warn_damaged`: one line per checkpoint, naming it and why) and exit 1, "done in
part", after processing everything else. Names and reasons come from the bucket, where
anyone with write access chooses them, so they are printed with control characters escaped
(:func:`printable`): a key cannot move the cursor or rewrite the terminal.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from contextlib import AbstractContextManager, suppress
from typing import TYPE_CHECKING, Any

from s3ckpt._units import format_bytes

if TYPE_CHECKING:
    from s3ckpt.retention import CheckpointInfo

__all__ = [
    "ProgressBar",
    "ProgressCounter",
    "add_output_options",
    "format_shape",
    "print_json",
    "print_table",
    "printable",
    "progress_enabled",
    "state_label",
    "warn_damaged",
]

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with every control character (C0, DEL, C1) written as a Python escape."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def state_label(c: CheckpointInfo) -> str:
    """The STATE column: ``damaged`` for a damaged checkpoint (its ``state`` is
    ``committed``, its ``life`` damaged), else its state."""
    return "damaged" if c.damaged else c.state.value


def warn_damaged(command: str, checkpoints: Iterable[CheckpointInfo]) -> int:
    """One warning on stderr per damaged checkpoint in ``checkpoints``; how many there were."""
    damaged = [c for c in checkpoints if c.damaged]
    for c in damaged:
        todo = "s3ckpt check --read-data all checks it again"
        todo = "restore its s3ckpt.json" if c.error is not None else todo
        print(
            f"s3ckpt {command}: warning: damaged checkpoint {printable(str(c.url))}: "
            f"{printable(c.damage or '')}; it is listed but never deleted by prune or gc, "
            f"nor counted as the newest, and load(step='latest') skips it ({todo}, or "
            "delete it with s3ckpt rm; docs/troubleshooting.md)",
            file=sys.stderr,
        )
    return len(damaged)


def format_shape(shape: Sequence[int] | None) -> str:
    """``(2, 3)`` -> ``[2, 3]``; no shape -> ``-``."""
    return "-" if shape is None else "[" + ", ".join(str(s) for s in shape) + "]"


def print_table(
    rows: Sequence[Sequence[str]], right: Collection[int] = (), indent: str = ""
) -> None:
    """Print ``rows`` as columns two spaces apart, each line after ``indent``; the columns
    whose indexes are in ``right`` are right-aligned. Trailing blanks are cut; no rows
    print nothing."""
    widths = [max(map(len, column)) for column in zip(*rows, strict=True)]
    for r in rows:
        cells = [
            (c.rjust if i in right else c.ljust)(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        print(indent + "  ".join(cells).rstrip())


def print_json(doc: Any, *, strict: bool = False) -> None:
    """Print ``doc`` as JSON indented by two, and a newline. ``strict``: NaN and infinities
    refused (ValueError), anything else JSON cannot hold written as text; else NaN is
    written as JavaScript does."""
    print(json.dumps(doc, indent=2, allow_nan=not strict, default=str if strict else None))


# -- progress on stderr ----------------------------------------------------------------------
def add_output_options(p: argparse.ArgumentParser, *, progress: bool = True) -> None:
    """``--json`` (and ``--no-progress`` when the command draws progress)."""
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    if progress:
        help = "no progress on stderr (it is drawn only when stderr is a terminal)"
        p.add_argument("--no-progress", action="store_true", help=help)


def progress_enabled(args: argparse.Namespace) -> bool | None:
    """``False`` with ``--json`` or ``--no-progress``; else ``None``: drawn when stderr is a
    terminal."""
    return False if getattr(args, "json", False) or getattr(args, "no_progress", False) else None


class _StatusLine(AbstractContextManager[Any]):
    """One line on stderr, redrawn in place at most ten times a second from any thread;
    nothing at all when stderr is not a TTY (unless ``enabled=True``). A context manager:
    the line is closed on leaving."""

    def __init__(self, label: str, enabled: bool | None = None):
        self.label, self.stream = label, sys.stderr
        with suppress(AttributeError, ValueError):  # no isatty, or closed: not drawn
            enabled = self.stream.isatty() if enabled is None else enabled
        self.enabled = bool(enabled)
        self._t0, self._last, self._drawn = time.monotonic(), 0.0, False
        self._lock = threading.Lock()

    def _draw(self, text: Callable[[float], str], force: bool) -> None:
        if not self.enabled:
            return
        with self._lock:
            if (now := time.monotonic()) - self._last < 0.1 and not force:
                return
            self._last = now
            print("\r" + text(now - self._t0), end="", file=self.stream, flush=True)
            self._drawn = True

    def _end(self, text: str) -> None:
        with self._lock:
            if self._drawn:
                print(text, end="", file=self.stream, flush=True)
                self._drawn = False

    def clear(self) -> None:
        """Erase the line (before other output; the next update draws it again)."""
        self._end("\r\x1b[K")

    def close(self) -> None:
        """End the line (the last state stays on screen)."""
        self._end("\n")

    def __exit__(self, *exc: object) -> None:
        self.close()


class ProgressBar(_StatusLine):
    """``label [#####.....] 1.2 GiB / 3.4 GiB  210.5 MiB/s  ETA 0:11`` on a terminal.

    Callable as ``bar(done, total)`` (bytes) from any thread; draws at most ten times a
    second and only when stderr is a TTY (or ``enabled=True``).
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
    first seen); draws at most ten times a second and only when stderr is a TTY (or
    ``enabled=True``). ``counter.clear()`` erases it before the command's own output.
    """

    def __init__(self, label: str, enabled: bool | None = None):
        super().__init__(label, enabled)
        self.counts: dict[str, int] = {}

    def add(self, what: str, n: int = 1) -> None:
        """Count ``n`` more ``what`` and redraw."""
        with self._lock:
            self.counts[what] = self.counts.get(what, 0) + n
            parts = ", ".join(f"{v} {k}" for k, v in self.counts.items())
        self._draw(lambda elapsed: f"{self.label}: {parts}  {elapsed:.1f} s\x1b[K", force=False)
