"""NumPy arrays, dtypes and scalars for the safe loader: the few globals NumPy's pickles
call, each behind a gate that admits only what rebuilds a value.

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
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["numpy_globals"]

# One kind code per allowed dtype class ("M8"/"m8": datetime64/timedelta64; "V": void).
_KINDS = (
    "?",
    "b",
    "h",
    "i",
    "l",
    "q",
    "B",
    "H",
    "I",
    "L",
    "Q",
    "e",
    "f",
    "d",
    "g",
    "F",
    "D",
    "G",
    "S",
    "U",
    "V",
    "M8",
    "m8",
)


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
    real_reconstruct = multiarray._reconstruct
    real_scalar = multiarray.scalar
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

    out: list[tuple[Callable[..., Any], str]] = [
        (dtype, "numpy.dtype"),
        (token, "numpy.ndarray"),
        (empty_bytes, "builtins.bytes"),
    ]
    for module in ("numpy._core.multiarray", "numpy.core.multiarray"):
        out.append((_reconstruct, f"{module}._reconstruct"))
        out.append((scalar, f"{module}.scalar"))
    # For __setstate__ only (the unpickler checks the instance's class): names no pickle of
    # NumPy's own uses, so a pickle naming them fails in DCP's own load.
    out.append((np.ndarray, "numpy.ndarray.<s3ckpt: setstate only>"))
    for cls in sorted(classes, key=lambda c: c.__name__):
        out.append((cls, f"numpy.dtypes.{cls.__name__}.<s3ckpt: setstate only>"))
    return tuple(out)
