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

NumPy (:func:`numpy_globals`): arrays, dtypes and scalars for the safe loader, the few
globals NumPy's pickles call, each behind a gate that admits only what rebuilds a value.

A NumPy array pickles as ``numpy._core.multiarray._reconstruct(numpy.ndarray, (0,), b"b")``
followed by ``ndarray.__setstate__((1, shape, dtype, fortran, raw_bytes))``; a dtype as
``numpy.dtype("f8", False, True)`` followed by its ``__setstate__`` (which the restricted
unpickler runs only for classes it allows: the dtype's class, ``numpy.dtypes.Float64DType``);
a scalar as ``numpy._core.multiarray.scalar(dtype, raw_bytes)``. NumPy 1.x pickles name
``numpy.core.multiarray`` instead of ``numpy._core.multiarray``; both names are accepted.

The gates (what :func:`numpy_globals` registers under NumPy's names):

- ``numpy.dtype`` builds a dtype and refuses any that is or holds ``object`` (an object
  array's elements are arbitrary Python objects, and a structured dtype with an object
  field treats raw bytes as object pointers), and NumPy 2's variable-width ``StringDType``.
- ``_reconstruct`` builds only a plain ``numpy.ndarray`` (no subclass: ``np.matrix``,
  ``np.memmap``, record arrays) of such a dtype; the array's contents come from
  ``__setstate__``, whose dtype comes from the ``numpy.dtype`` gate.
- ``numpy.ndarray`` is a token that only ``_reconstruct`` accepts: calling it (an
  uninitialised array of any dtype) is refused. The class itself is allowed under a name
  no NumPy pickle uses, so the unpickler may run ``ndarray.__setstate__``.
- ``scalar`` builds a scalar of such a dtype from bytes.
- ``bytes()`` with no argument: ``b""``, which pickle protocol 2 (``torch.save``'s) writes
  as that call, as the data of every empty array.
- the dtype classes of booleans, integers, floats, complex numbers, fixed-width byte and
  unicode strings, ``void`` (raw and structured), ``datetime64`` and ``timedelta64``.

The reader checks an item with these gates (``torch.load(weights_only=True)``), then DCP
unpickles it with NumPy's own functions: the same pickle makes the same calls, so what the
gates admit is exactly what the second load builds. Checked by tests/unit/test_numpy_safe.py.

The ``.metadata`` unpickler (:func:`load_metadata`): ``.metadata`` is a pickle, and a
pickle can run any code. A checkpoint may come from a
bucket other people can write to, so s3ckpt loads it with an unpickler that admits only
the types DCP's metadata is made of (its dataclasses, ``torch.Size``, dtypes, layouts,
memory formats, a few containers and paths). Anything else is refused, naming the global
it asked for.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import io
import pathlib
import pickle
import re
import threading
import types
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import torch

from s3ckpt._gc_pause import gc_paused
from s3ckpt.errors import CorruptCheckpointError, UnsafeCheckpointError

__all__ = [
    "ALLOWED_GLOBALS",
    "SAFE_GLOBALS",
    "SafeGlobal",
    "check_item",
    "global_name",
    "load_metadata",
    "missing_global",
    "missing_globals",
    "numpy_globals",
    "reason",
]

# One kind code per allowed dtype class ("M8"/"m8": datetime64/timedelta64; "V": void).
_KINDS = (*"?bhilqBHILQefdgFDGSUV", "M8", "m8")


class _Refused(Exception):
    """A NumPy pickle asked for something the gates do not build (torch reports it as the
    item failing ``weights_only``)."""


class _NdarrayToken:
    """What ``numpy.ndarray`` means to the gates: an argument of ``_reconstruct``."""

    def __repr__(self) -> str:
        return "numpy.ndarray (s3ckpt safe-loader token)"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise _Refused("numpy.ndarray(...) builds an uninitialised array; refused")


def numpy_globals() -> tuple[tuple[Callable[..., Any], str], ...]:
    """The ``(callable, name)`` pairs that let ``torch.load(weights_only=True)`` rebuild
    NumPy arrays, dtypes and scalars (see the module docs); ``()`` without NumPy."""
    try:
        import numpy as np
    except ImportError:
        return ()
    try:
        multiarray = importlib.import_module("numpy._core.multiarray")  # numpy 2
    except ImportError:  # numpy 1.x
        multiarray = importlib.import_module("numpy.core.multiarray")
    real_reconstruct, real_scalar = multiarray._reconstruct, multiarray.scalar
    classes = {type(np.dtype(kind)) for kind in _KINDS}
    token = _NdarrayToken()

    def checked(dt: Any) -> Any:
        if type(dt) not in classes or dt.hasobject:
            raise _Refused(f"numpy dtype {dt!r} is or holds Python objects; refused")
        return dt

    def dtype(*args: Any) -> Any:
        return checked(np.dtype(*args))

    def _reconstruct(subtype: Any, shape: Any, kind: Any) -> Any:
        if subtype is not token and subtype is not np.ndarray:
            raise _Refused(f"_reconstruct of {subtype!r}: only plain numpy.ndarray is allowed")
        checked(np.dtype(kind))
        return real_reconstruct(np.ndarray, shape, kind)

    def empty_bytes(*args: Any) -> bytes:
        if args:
            raise _Refused("bytes(...) with arguments; only bytes() (b'') is allowed")
        return b""

    def scalar(dt: Any, *data: Any) -> Any:
        if not isinstance(dt, np.dtype) or not all(isinstance(d, bytes) for d in data):
            raise _Refused("numpy scalar(...) takes a dtype and bytes")
        return real_scalar(checked(dt), *data)

    out: list[tuple[Callable[..., Any], str]] = [(dtype, "numpy.dtype"), (token, "numpy.ndarray")]
    out.append((empty_bytes, "builtins.bytes"))
    for module in ("numpy._core.multiarray", "numpy.core.multiarray"):
        out += [(_reconstruct, f"{module}._reconstruct"), (scalar, f"{module}.scalar")]
    # For __setstate__ only (the unpickler checks the instance's class): names no pickle of
    # NumPy's own uses, so a pickle naming them fails in DCP's own load.
    out.append((np.ndarray, "numpy.ndarray.<s3ckpt: setstate only>"))
    for cls in sorted(classes, key=lambda c: c.__name__):
        out.append((cls, f"numpy.dtypes.{cls.__name__}.<s3ckpt: setstate only>"))
    return tuple(out)


SafeGlobal: TypeAlias = Callable[..., Any] | tuple[Callable[..., Any], str]
# What ``torch.serialization.add_safe_globals`` takes: a class or function, or a pair of
# it and the dotted name a pickle calls it by (for a class pickled under another name).


_PATH_CLASSES = (
    pathlib.PurePosixPath,
    pathlib.PureWindowsPath,
    pathlib.PosixPath,
    pathlib.WindowsPath,
)

SAFE_GLOBALS: tuple[SafeGlobal, ...] = (
    *_PATH_CLASSES,
    # Python 3.13 pickles paths as pathlib._local.X, 3.11/3.12 and 3.14 as pathlib.X: accept
    # both names, so a checkpoint loads on the other Python too.
    *(
        (c, f"{m}.{c.__qualname__}")
        for c in _PATH_CLASSES
        for m in ("pathlib", "pathlib._local")
        if c.__module__ != m
    ),
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
# Standard-library value types (and NumPy arrays, dtypes and scalars) that every
# :class:`~s3ckpt.dcp.S3StorageReader` lets non-tensor items rebuild, on top of torch's
# ``weights_only`` defaults: the hyperparameters frameworks put in checkpoints (Lightning's
# ``hparams``, an ``argparse.Namespace`` of a script's arguments, paths, timestamps, run ids)
# and the NumPy values of data pipelines and registered objects.
#
# Why these are safe to allow: the restricted unpickler can only *call* a listed class with
# arguments that are themselves allowed values, create it with ``cls.__new__``, and set its
# state (``__setstate__``, else its ``__dict__`` / slots). For these classes that builds a
# value and nothing else: no file is opened, no name is imported, no other attribute (such
# as ``Path.write_text``) is reachable, since torch resolves a pickle's globals by their
# exact dotted names. Checked by tests/unit/test_safe_globals.py, which loads each type and
# shows a pickle reaching for a method of one is refused.
#
# Deliberately left out: ``zoneinfo.ZoneInfo`` (rebuilding one reads the time-zone database
# from disk), ``decimal.Decimal`` and ``fractions.Fraction`` (rarely hyperparameters), enums
# and dataclasses (your own classes: pass them as ``safe_globals``). ``WindowsPath`` and
# ``PosixPath`` rebuild only on their own OS; the other OS's concrete path fails to load.
#
# NumPy (when installed): arrays, dtypes and scalars of booleans, numbers, fixed-width
# strings, structured (object-free) records and datetimes load; arrays of Python objects,
# ``ndarray`` subclasses and direct ``numpy.ndarray(...)`` calls are refused. Its entries are
# gates around NumPy's own functions, registered under the names NumPy's pickles call
# (``numpy.dtype``, ``numpy._core.multiarray._reconstruct``, ...): see
# :func:`numpy_globals`.

_torch_globals = threading.Lock()

_UNLISTED = re.compile(r"GLOBAL (\S+) was not an allowed global")
_REDUCE = re.compile(r"unrecognized function (.+?)(?: which belongs to|$)", re.MULTILINE)
_BUILD = re.compile(r"allowlisted via `add_safe_globals`, but got <class '([^']+)'>")
_WHY = re.compile(r"WeightsUnpickler error:\s*(.+?)(?:\n\n|$)", re.DOTALL)


def global_name(obj: SafeGlobal) -> str:
    """The dotted name a pickle uses for ``obj``."""
    return obj[1] if isinstance(obj, tuple) else f"{obj.__module__}.{obj.__qualname__}"


def missing_global(exc: BaseException) -> str | None:
    """The global torch's restricted unpickler refused in ``exc``, when it says (for the
    message only: what is refused is decided by torch, never by this text)."""
    text = str(exc)
    found = (pattern.search(text) for pattern in (_UNLISTED, _REDUCE, _BUILD))  # the first wins
    return next((match.group(1).strip() for match in found if match is not None), None)


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
    if (found := _WHY.search(str(exc))) is not None:
        return " ".join(found.group(1).split())
    lines = str(exc).strip().splitlines()
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
        with torch.serialization.safe_globals(extra) if extra else contextlib.nullcontext():
            torch.load(io.BytesIO(data), weights_only=True)


_DCP = "torch.distributed.checkpoint"

ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {
        (f"{_DCP}.metadata", "Metadata"),
        (f"{_DCP}.metadata", "TensorStorageMetadata"),
        (f"{_DCP}.metadata", "BytesStorageMetadata"),
        (f"{_DCP}.metadata", "ChunkStorageMetadata"),
        (f"{_DCP}.metadata", "TensorProperties"),
        (f"{_DCP}.metadata", "MetadataIndex"),
        (f"{_DCP}.metadata", "StorageMeta"),
        (f"{_DCP}.metadata", "_MEM_FORMAT_ENCODING"),
        (f"{_DCP}.filesystem", "_StorageInfo"),
        (f"{_DCP}.planner", "WriteItemType"),
        (f"{_DCP}.planner", "LoadItemType"),
        ("torch", "Size"),
        # torch.layout pickles as a call of this by name (it only looks the name up).
        ("torch.serialization", "_get_layout"),
        ("collections", "OrderedDict"),
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("builtins", "object"),
        ("copyreg", "_reconstructor"),
        ("pathlib", "PosixPath"),
        ("pathlib", "PurePosixPath"),
        ("pathlib", "WindowsPath"),
        ("pathlib", "PureWindowsPath"),
        ("pathlib", "Path"),
        ("pathlib._local", "PosixPath"),
        ("pathlib._local", "PurePosixPath"),
    }
)

_TORCH_CONSTANT_TYPES = (torch.dtype, torch.layout, torch.memory_format)


class _RestrictedUnpickler(pickle.Unpickler):
    where: dict[str, Any]  # the object's bucket and key, for the errors

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), _TORCH_CONSTANT_TYPES):
            return getattr(torch, name)
        raise UnsafeCheckpointError(
            f"the metadata pickle asks to load {module}.{name}, which is not a DCP metadata "
            "type; refusing to unpickle it. Only load checkpoints from buckets you trust; if "
            "this one is trusted and the type legitimate, read it with a stock torch reader",
            **self.where,
        )

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeCheckpointError(
            "the metadata pickle uses persistent ids, which DCP metadata never does; refusing",
            **self.where,
        )


def load_metadata(data: bytes, *, bucket: str | None = None, key: str = ".metadata") -> Any:
    """Unpickle DCP metadata allowing only DCP's own types.

    Raises:
        UnsafeCheckpointError: the pickle asked for any other global.
        CorruptCheckpointError: the bytes are not a valid pickle / not DCP ``Metadata``.
    """
    from torch.distributed.checkpoint.metadata import Metadata

    unpickler = _RestrictedUnpickler(io.BytesIO(data))
    unpickler.where = {"bucket": bucket, "key": key}
    try:
        # Thousands of small objects, no cycles: pause the collector (see s3ckpt._gc_pause).
        with gc_paused():
            obj = unpickler.load()
    except UnsafeCheckpointError:
        raise
    except Exception as exc:
        raise CorruptCheckpointError(
            f"not a readable DCP metadata pickle ({type(exc).__name__}: {exc}); the object is "
            "truncated or was not written by torch.distributed.checkpoint",
            bucket=bucket,
            key=key,
        ) from exc
    if not isinstance(obj, Metadata):
        raise CorruptCheckpointError(
            f"holds a {type(obj).__name__}, not DCP Metadata", bucket=bucket, key=key
        )
    return obj
