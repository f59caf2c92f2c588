"""Non-tensor values through the safe loader: SAFE_GLOBALS round-trip through dcp.save /
dcp.load on MemoryStore, an unlisted class is refused (naming what to do) and loads once
listed, and nothing in the list opens a way to run code."""

from __future__ import annotations

import argparse
import datetime
import io
import pathlib
import struct
import threading
import types
import uuid
import zipfile
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.api import CheckpointException

from s3ckpt.dcp import SAFE_GLOBALS
from s3ckpt.dcp._safe import check_item, missing_global
from s3ckpt.errors import UnsafeCheckpointError, find_s3ckpt_error
from s3ckpt.store import MemoryStore
from tests.unit._memory_dcp import URL, load, save


class Custom:
    """A user's own value class: not in SAFE_GLOBALS."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Custom) and other.n == self.n


def _hparams() -> dict[str, Any]:
    tz = datetime.timezone(datetime.timedelta(hours=2), "CEST")
    return {
        "root": pathlib.Path("/data/run"),
        "rel": pathlib.PurePosixPath("a/b"),
        "win": pathlib.PureWindowsPath(r"C:\data"),
        "args": argparse.Namespace(lr=0.1, out=pathlib.Path("/out"), depth=3),
        "ns": types.SimpleNamespace(a=1),
        "when": datetime.datetime(2024, 5, 6, 7, 8, 9, 10, tzinfo=tz),
        "utc": datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC),
        "day": datetime.date(2024, 5, 6),
        "at": datetime.time(7, 8, 9),
        "took": datetime.timedelta(minutes=3),
        "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    }


def test_stdlib_value_types_round_trip_through_the_safe_loader() -> None:
    store = MemoryStore("bkt")
    sd = {"w": torch.ones(3), "hp": _hparams()}
    save(store, sd)
    out: dict[str, Any] = {"w": torch.zeros(3), "hp": dict.fromkeys(_hparams())}
    load(store, out)
    assert out["hp"] == _hparams()
    assert type(out["hp"]["root"]) is type(pathlib.Path("/"))


def test_an_unlisted_class_is_refused_naming_key_item_global_and_the_way_out() -> None:
    store = MemoryStore("bkt")
    save(store, {"w": torch.ones(3), "extra": Custom(7)})
    with pytest.raises(CheckpointException) as info:
        load(store, {"w": torch.zeros(3), "extra": None})
    err = find_s3ckpt_error(info.value)
    assert isinstance(err, UnsafeCheckpointError)
    name = f"{Custom.__module__}.Custom"
    text = str(err)
    assert err.key is not None and err.key.startswith("run/step_1/__0_")  # the object
    assert f"s3://bkt/{err.key}" in text
    assert "'extra'" in text  # the item
    assert f"needs {name}" in text  # the global
    assert f"safe_globals=[{name}]" in text and "allow_unsafe_pickle=True" in text


def test_an_unlisted_class_loads_once_listed_and_the_listing_stays_with_the_reader() -> None:
    store = MemoryStore("bkt")
    save(store, {"w": torch.ones(3), "extra": Custom(7), "when": datetime.date(2024, 1, 2)})
    before = set(torch.serialization.get_safe_globals())
    out: dict[str, Any] = {"w": torch.zeros(3), "extra": None, "when": None}
    load(store, out, safe_globals=[Custom])
    assert out["extra"] == Custom(7) and out["when"] == datetime.date(2024, 1, 2)
    # torch's process-wide list is as it was: nothing added for the load is left behind.
    assert set(torch.serialization.get_safe_globals()) == before


def test_globals_the_process_registered_are_honoured_and_kept() -> None:
    store = MemoryStore("bkt")
    save(store, {"extra": Custom(1), "root": pathlib.Path("/x")})
    torch.serialization.add_safe_globals([Custom, pathlib.PosixPath])
    try:
        out: dict[str, Any] = {"extra": None, "root": None}
        load(store, out)  # Custom allowed process-wide, as torch.load would allow it
        assert out == {"extra": Custom(1), "root": pathlib.Path("/x")}
        assert {Custom, pathlib.PosixPath} <= set(torch.serialization.get_safe_globals())
    finally:
        torch.serialization.clear_safe_globals()


def test_readers_on_threads_see_only_their_own_safe_globals() -> None:
    """torch's allow-list is process-wide; a reader allowing Custom on one thread never lets
    a reader that does not allow it, on another thread, load it."""
    store = MemoryStore("bkt")
    save(store, {"extra": [Custom(i) for i in range(20)]})
    outcomes: dict[str, list[bool]] = {"allowed": [], "refused": []}
    lock = threading.Lock()

    def run(allow: bool) -> None:
        for _ in range(5):
            try:
                load(store, {"extra": None}, safe_globals=[Custom] if allow else [])
                ok = True
            except CheckpointException as exc:
                assert isinstance(find_s3ckpt_error(exc), UnsafeCheckpointError)
                ok = False
            with lock:
                outcomes["allowed" if allow else "refused"].append(ok)

    threads = [threading.Thread(target=run, args=(i % 2 == 0,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes["allowed"] == [True] * 15
    assert outcomes["refused"] == [False] * 15


# -- no code through the allowed classes ------------------------------------------------------
def _torch_zip(pickle_bytes: bytes) -> bytes:
    """A ``torch.save`` file whose pickle is ``pickle_bytes``."""
    buf = io.BytesIO()
    torch.save({}, buf)
    src = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = pickle_bytes if info.filename.endswith("/data.pkl") else src.read(info)
            dst.writestr(info.filename, data)
    return out.getvalue()


def _text(s: str) -> bytes:
    raw = s.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw  # BINUNICODE


def _write_text_pickle(target: pathlib.Path, *, proto4: bool) -> bytes:
    """``PosixPath.write_text(PosixPath(target), "pwned")``: a method of an allowed class."""
    if proto4:  # STACK_GLOBAL, which resolves dotted names
        method = b"\x8c\x07pathlib\x8c\x14PosixPath.write_text\x93"
        cls = b"\x8c\x07pathlib\x8c\x09PosixPath\x93"
        head = b"\x80\x04"
    else:  # GLOBAL, what torch.save's protocol 2 writes
        method = b"cpathlib\nPosixPath.write_text\n"
        cls = b"cpathlib\nPosixPath\n"
        head = b"\x80\x02"
    return head + method + cls + _text(str(target)) + b"\x85R" + _text("pwned") + b"\x86R."


@pytest.mark.filterwarnings("ignore:Detected pickle protocol 4")
@pytest.mark.parametrize("proto4", [False, True], ids=["GLOBAL", "STACK_GLOBAL"])
def test_a_method_of_an_allowed_class_is_not_reachable(
    tmp_path: pathlib.Path, proto4: bool
) -> None:
    target = tmp_path / "pwned"
    data = _torch_zip(_write_text_pickle(target, proto4=proto4))
    with pytest.raises(Exception) as info:
        check_item(data, SAFE_GLOBALS)
    assert not target.exists()
    if not proto4:
        assert missing_global(info.value) == "pathlib.PosixPath.write_text"
    else:  # the payload is live: full pickle (what DCP's planner uses) runs it
        torch.load(io.BytesIO(data), weights_only=False)
        assert target.read_text() == "pwned"


def test_every_safe_global_is_a_value_type_of_the_standard_library() -> None:
    for entry in SAFE_GLOBALS:
        module = getattr(entry[0], "__module__", "") if isinstance(entry, tuple) else ""
        if module == "s3ckpt.dcp._safe" or module.split(".")[0] == "numpy":
            continue  # NumPy's gates and value classes: tests/unit/test_numpy_safe.py
        cls = entry[0] if isinstance(entry, tuple) else entry
        assert isinstance(cls, type), entry
        assert cls.__module__.split(".")[0] in {"pathlib", "argparse", "types", "datetime", "uuid"}


def test_reader_url_and_safe_globals_are_kept() -> None:
    store = MemoryStore("bkt")
    save(store, {"w": torch.ones(1)})
    reader = load(store, {"w": torch.zeros(1)}, URL, safe_globals=(Custom,))
    assert reader.safe_globals == (Custom,)
