"""NumPy values through the safe loader (s3ckpt/dcp/_safe.py): arrays of every plain
dtype, structured records, dtypes and scalars round-trip through dcp.save / dcp.load on
MemoryStore by default; object arrays, ndarray subclasses and direct ``numpy.ndarray(...)``
calls are refused with s3ckpt's error; NumPy 1.x names load; a refusal names every global
the item needs, not only the first."""

from __future__ import annotations

import io
import pickle
from typing import Any

import numpy as np
import pytest
import torch
from torch.distributed.checkpoint.api import CheckpointException

from s3ckpt.dcp import SAFE_GLOBALS
from s3ckpt.dcp._safe import check_item
from s3ckpt.errors import UnsafeCheckpointError, find_s3ckpt_error
from s3ckpt.store import MemoryStore
from tests.unit._memory_dcp import load, save

VALUES: dict[str, Any] = {
    "f32": np.arange(6, dtype=np.float32).reshape(2, 3),
    "f16_fortran": np.asfortranarray(np.ones((3, 2), dtype=np.float16)),
    "i8": np.array([-1, 0, 1], dtype=np.int8),
    "u64": np.array([2**64 - 1], dtype=np.uint64),
    "bool": np.array([True, False]),
    "c128": np.array([1 + 2j]),
    "longdouble": np.array([1.5], dtype=np.longdouble),
    "unicode": np.array(["ab", "c"]),
    "bytes": np.array([b"x", b"yz"]),
    "record": np.array([(1, 2.5, b"ab")], dtype=[("a", "<i4"), ("b", "<f8"), ("c", "S2")]),
    "dates": np.array(["2024-01-02", "NaT"], dtype="datetime64[D]"),
    "span": np.array([3], dtype="timedelta64[s]"),
    "empty": np.empty((0, 4), dtype=np.float64),
    "dtype": np.dtype(">i2"),
    "record_dtype": np.dtype([("x", "<f4", (2,))]),
    "f64_scalar": np.float64(0.1),
    "i32_scalar": np.int32(-7),
    "bool_scalar": np.True_,
    "date_scalar": np.datetime64("2024-05-06T07:08"),
    "mt19937": np.random.RandomState(3).get_state(),  # (str, uint32 array, int, int, float)
    "pcg64": np.random.default_rng(4).bit_generator.state,  # dicts of Python ints
}


def _same(a: Any, b: Any) -> None:
    assert type(a) is type(b), (a, b)
    if isinstance(a, np.ndarray):
        assert (
            a.dtype == b.dtype
            and a.shape == b.shape
            and a.flags.f_contiguous == (b.flags.f_contiguous)
        )
        assert a.tobytes() == b.tobytes()
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    else:
        assert a == b or (a != a and b != b), (a, b)


def test_numpy_arrays_dtypes_and_scalars_load_by_default() -> None:
    store = MemoryStore("bkt")
    # A tuple is one DCP item (DCP would split a dict into one item per key).
    save(store, {"w": torch.ones(2), "np": (VALUES,)})
    out: dict[str, Any] = {"w": torch.zeros(2), "np": None}
    load(store, out)
    assert torch.equal(out["w"], torch.ones(2))
    _same(out["np"], (VALUES,))


def _torch_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


class _Matrixish(np.ndarray):
    """An ndarray subclass (np.matrix, np.memmap and record arrays are such)."""


@pytest.mark.parametrize(
    "value",
    [
        np.array([1, "a"], dtype=object),
        np.dtype("O"),
        np.zeros(2, dtype=[("a", "O"), ("b", "<i4")]),
        np.zeros(2).view(_Matrixish),
        np.rec.array([(1, 2.0)], dtype=[("a", "<i4"), ("b", "<f8")]),
    ],
    ids=["object_array", "object_dtype", "record_with_object_field", "subclass", "recarray"],
)
def test_object_arrays_and_subclasses_stay_refused(value: Any) -> None:
    store = MemoryStore("bkt")
    save(store, {"bad": (value,)})  # a tuple: one DCP object item
    with pytest.raises(CheckpointException) as info:
        load(store, {"bad": None})
    err = find_s3ckpt_error(info.value)
    assert isinstance(err, UnsafeCheckpointError) and isinstance(err, Exception)
    assert "'bad'" in str(err)


def test_an_object_dtype_is_refused_by_numpys_gate_itself() -> None:
    """Not merely for want of a global: the numpy.dtype gate refuses it by name."""
    with pytest.raises(Exception, match=r"is or holds Python objects"):
        check_item(_torch_bytes(np.zeros(2, dtype=[("a", "O")])), SAFE_GLOBALS)


def _reduce_pickle(func: bytes, args: bytes) -> bytes:
    """Protocol-2 pickle of ``func(*args)``, ``func`` as ``module\\nname\\n``."""
    return b"\x80\x02c" + func + args + b"R."


def test_calling_numpy_ndarray_directly_is_refused() -> None:
    from tests.unit.test_safe_globals import _torch_zip

    # numpy.ndarray((4,), "f8"): an uninitialised array (process memory) of any dtype.
    args = b"K\x04\x85X\x02\x00\x00\x00f8\x86"  # ((4,), "f8")
    data = _torch_zip(_reduce_pickle(b"numpy\nndarray\n", args))
    with pytest.raises(Exception, match="uninitialised"):
        check_item(data, SAFE_GLOBALS)


def test_reconstruct_builds_only_plain_ndarrays() -> None:
    from tests.unit.test_safe_globals import _torch_zip

    # _reconstruct(torch.Tensor, (0,), "b"): a class torch allows, not numpy.ndarray.
    args = b"(ctorch\nTensor\nK\x00\x85X\x01\x00\x00\x00bt"
    data = _torch_zip(_reduce_pickle(b"numpy._core.multiarray\n_reconstruct\n", args))
    with pytest.raises(Exception, match=r"only plain numpy\.ndarray"):
        check_item(data, SAFE_GLOBALS)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_numpy_1_names_load() -> None:
    """NumPy 1.x pickles name numpy.core.multiarray; the gate takes that name too."""
    from tests.unit.test_safe_globals import _torch_zip

    value = np.arange(3.0)
    raw = pickle.dumps(value, protocol=2).replace(b"numpy._core", b"numpy.core")
    assert b"numpy.core.multiarray" in raw
    data = _torch_zip(raw)
    check_item(data, SAFE_GLOBALS)
    _same(torch.load(io.BytesIO(data), weights_only=False), value)  # what DCP then loads


class Custom:
    """A value class the allow-list does not know."""

    def __init__(self, n: int) -> None:
        self.n = n


class Other(Custom):
    """A second one."""


def test_a_refusal_names_every_global_the_item_needs() -> None:
    store = MemoryStore("bkt")
    save(store, {"two": [Custom(1), Other(2)]})
    with pytest.raises(CheckpointException) as info:
        load(store, {"two": None})
    err = find_s3ckpt_error(info.value)
    assert isinstance(err, UnsafeCheckpointError)
    names = [f"{__name__}.Custom", f"{__name__}.Other"]
    assert f"safe_globals=[{', '.join(names)}]" in str(err), str(err)


def test_flatten_keeps_numpy_float_scalars_exact() -> None:
    """numpy.float64 is a float subclass whose repr is not a float's: with objects it stays
    itself (loaded by the gates above), without it is stored as its float."""
    from s3ckpt.tools import flatten_state_dict, unflatten_state_dict

    value = {"loss": np.float64(0.1), "plain": 0.25, "f32": np.float32(2.5)}
    back = unflatten_state_dict(flatten_state_dict(value, objects=True))
    _same(back, value)
    plain = unflatten_state_dict(flatten_state_dict({"loss": np.float64(0.1)}))
    assert type(plain["loss"]) is float and plain["loss"] == 0.1
