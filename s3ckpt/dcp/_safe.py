"""Which non-tensor values a load may rebuild: :data:`SAFE_GLOBALS`, and the check every
non-tensor item passes before DCP's planner unpickles it.

DCP stores each non-tensor value of a state dict (an int, a dict of hyperparameters, a
``pathlib.Path``) as its own ``torch.save`` pickle, and its load planner unpickles it with
full pickle, which can run any code. :class:`~s3ckpt.dcp.S3StorageReader` therefore first
loads the item with torch's restricted unpickler, ``torch.load(weights_only=True)``: only
tensors, containers, numbers, strings and the globals torch allows by default, those the
process registered with ``torch.serialization.add_safe_globals``, :data:`SAFE_GLOBALS` and
the reader's own ``safe_globals``. An item that asks for anything else is refused with
:class:`~s3ckpt.errors.UnsafeCheckpointError` naming the global.

torch keeps the allowed globals in one process-wide set, and a reader checks items on
several threads: :func:`check_item` adds the reader's globals that the set lacks under one
lock, for the duration of one item, and removes exactly those again (never what the process
registered itself). Another thread's own ``torch.load`` running in that instant sees them too
(they are value types someone declared safe); ``add_safe_globals`` called by another thread
in that instant may be lost, so register process-wide globals before loading.
"""

from __future__ import annotations

import argparse
import datetime
import io
import pathlib
import re
import threading
import types
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import torch

from s3ckpt.dcp._numpy_safe import numpy_globals

__all__ = [
    "SAFE_GLOBALS",
    "SafeGlobal",
    "check_item",
    "global_name",
    "missing_global",
    "missing_globals",
    "reason",
]

SafeGlobal: TypeAlias = Callable[..., Any] | tuple[Callable[..., Any], str]
"""What ``torch.serialization.add_safe_globals`` takes: a class or function, or a pair of
it and the dotted name a pickle calls it by (for a class pickled under another name)."""


def _pathlib_aliases() -> tuple[SafeGlobal, ...]:
    """Python 3.13 pickles paths as ``pathlib._local.X``, 3.11/3.12 and 3.14 as
    ``pathlib.X``: accept both names, so a checkpoint loads on the other Python too."""
    out: list[SafeGlobal] = []
    for cls in (
        pathlib.PurePosixPath,
        pathlib.PureWindowsPath,
        pathlib.PosixPath,
        pathlib.WindowsPath,
    ):
        for module in ("pathlib", "pathlib._local"):
            if cls.__module__ != module:
                out.append((cls, f"{module}.{cls.__qualname__}"))
    return tuple(out)


SAFE_GLOBALS: tuple[SafeGlobal, ...] = (
    pathlib.PurePosixPath,
    pathlib.PureWindowsPath,
    pathlib.PosixPath,
    pathlib.WindowsPath,
    *_pathlib_aliases(),
    argparse.Namespace,
    types.SimpleNamespace,
    datetime.date,
    datetime.time,
    datetime.datetime,
    datetime.timedelta,
    datetime.timezone,
    uuid.UUID,
    *numpy_globals(),
)
"""Standard-library value types (and NumPy arrays, dtypes and scalars) that every
:class:`~s3ckpt.dcp.S3StorageReader` lets non-tensor items rebuild, on top of torch's
``weights_only`` defaults: the hyperparameters frameworks put in checkpoints (Lightning's
``hparams``, an ``argparse.Namespace`` of a script's arguments, paths, timestamps, run ids)
and the NumPy values of data pipelines and registered objects.

Why these are safe to allow: the restricted unpickler can only *call* a listed class with
arguments that are themselves allowed values, create it with ``cls.__new__``, and set its
state (``__setstate__``, else its ``__dict__`` / slots). For these classes that builds a
value and nothing else: no file is opened, no name is imported, no other attribute (such
as ``Path.write_text``) is reachable, since torch resolves a pickle's globals by their
exact dotted names. Checked by tests/unit/test_safe_globals.py, which loads each type and
shows a pickle reaching for a method of one is refused.

Deliberately left out: ``zoneinfo.ZoneInfo`` (rebuilding one reads the time-zone database
from disk), ``decimal.Decimal`` and ``fractions.Fraction`` (rarely hyperparameters), enums
and dataclasses (your own classes: pass them as ``safe_globals``). ``WindowsPath`` and
``PosixPath`` rebuild only on their own OS; the other OS's concrete path fails to load.

NumPy (when installed): arrays, dtypes and scalars of booleans, numbers, fixed-width
strings, structured (object-free) records and datetimes load; arrays of Python objects,
``ndarray`` subclasses and direct ``numpy.ndarray(...)`` calls are refused. Its entries are
gates around NumPy's own functions, registered under the names NumPy's pickles call
(``numpy.dtype``, ``numpy._core.multiarray._reconstruct``, ...): see
:mod:`s3ckpt.dcp._numpy_safe`.
"""

_torch_globals = threading.Lock()

_UNLISTED = re.compile(r"GLOBAL (\S+) was not an allowed global")
_REDUCE = re.compile(r"unrecognized function (.+?)(?: which belongs to|$)", re.MULTILINE)
_BUILD = re.compile(r"allowlisted via `add_safe_globals`, but got <class '([^']+)'>")
_WHY = re.compile(r"WeightsUnpickler error:\s*(.+?)(?:\n\n|$)", re.DOTALL)


def global_name(obj: SafeGlobal) -> str:
    """The dotted name a pickle uses for ``obj``."""
    if isinstance(obj, tuple):
        return obj[1]
    return f"{obj.__module__}.{obj.__qualname__}"


def missing_global(exc: BaseException) -> str | None:
    """The global torch's restricted unpickler refused in ``exc``, when it says (for the
    message only: what is refused is decided by torch, never by this text)."""
    text = str(exc)
    for pattern in (_UNLISTED, _REDUCE, _BUILD):
        found = pattern.search(text)
        if found is not None:
            return found.group(1).strip()
    return None


def missing_globals(
    data: bytes | bytearray | memoryview, allowed: Sequence[SafeGlobal], exc: BaseException
) -> list[str]:
    """Every global the ``torch.save`` bytes ``data`` name that neither torch nor
    ``allowed`` admits, the one ``exc`` (torch's refusal) names first: torch stops at the
    first, and a user adding them one load at a time should not have to."""
    first = missing_global(exc)
    try:
        named = torch.serialization.get_unsafe_globals_in_checkpoint(io.BytesIO(data))
    except Exception:  # not a zip torch.save file: torch's own refusal says enough
        named = []
    ok = {global_name(g) for g in allowed}
    rest = sorted(n for n in named if n not in ok and n != first)
    if first is None or any(n.endswith(f".{first}") for n in rest):  # torch's short form
        return rest
    return [first, *rest]


def reason(exc: BaseException) -> str:
    """One line on why torch refused an item (its own words, without its boilerplate)."""
    text = str(exc)
    found = _WHY.search(text)
    if found is not None:
        return " ".join(found.group(1).split())
    lines = text.strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def check_item(data: bytes | bytearray | memoryview, allowed: Sequence[SafeGlobal]) -> None:
    """Load the ``torch.save`` bytes ``data`` with ``torch.load(weights_only=True)`` and
    ``allowed`` on top of torch's allow-list; the object is dropped (DCP's planner
    unpickles it again).

    Thread-safe; see the module docs for what another thread can see meanwhile.

    Raises:
        Exception: torch's own error when the item does not load that way.
    """
    with _torch_globals:
        present = set(torch.serialization.get_safe_globals())
        extra = [g for g in dict.fromkeys(allowed) if g not in present]
        if not extra:
            torch.load(io.BytesIO(data), weights_only=True)
            return
        with torch.serialization.safe_globals(extra):
            torch.load(io.BytesIO(data), weights_only=True)
