"""The uploader finds a watched buffer by its address, read through the buffer protocol with
ctypes (no numpy): writable and read-only buffers alike, and a read-only one that is handed
over is uploaded from its own memory."""

from __future__ import annotations

import ctypes
import mmap

import pytest

from s3ckpt._crc import crc32c
from s3ckpt._transfer import ObjectSink, Uploader
from s3ckpt._transfer._sink import _address
from s3ckpt.store.memory import MemoryStore

MiB = 1 << 20


def _bytes_address(data: bytes) -> int:
    """Where CPython keeps a bytes object's contents (c_char_p points at them, no copy)."""
    value = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value
    assert value is not None
    return value


def test_address_of_writable_read_only_and_empty_buffers() -> None:
    writable = bytearray(b"0123456789")
    arr = (ctypes.c_ubyte * len(writable)).from_buffer(writable)
    assert _address(memoryview(writable)) == ctypes.addressof(arr)
    assert _address(memoryview(writable)[3:]) == ctypes.addressof(arr) + 3
    del arr
    data = b"read-only bytes"
    view = memoryview(data)
    assert view.readonly
    assert _address(view) == _bytes_address(data)
    assert _address(view[4:]) == _bytes_address(data) + 4
    with mmap.mmap(-1, 4096) as m:
        m.write(b"x" * 4096)
        ro = memoryview(m).toreadonly()
        assert _address(ro) == _address(memoryview(m))
        ro.release()
    assert _address(memoryview(b"")) == 0


def test_address_refuses_a_non_contiguous_view() -> None:
    with pytest.raises(BufferError):
        _address(memoryview(bytearray(16))[::2])


class _RecordingStore(MemoryStore):
    """Notes the address of each part's body."""

    def __init__(self) -> None:
        super().__init__()
        self.addresses: dict[int, int] = {}

    def upload_part(self, key, upload_id, part_number, data, *, crc32c=None):  # type: ignore[no-untyped-def]
        self.addresses[part_number] = _address(memoryview(data).cast("B"))
        return super().upload_part(key, upload_id, part_number, data, crc32c=crc32c)


def test_a_held_read_only_buffer_is_uploaded_from_its_own_memory() -> None:
    part = 5 * MiB
    store = _RecordingStore()
    up = Uploader(store, part_size=part, n_buffers=2, max_concurrency=2)
    try:
        source = bytes(range(256)) * ((3 * part) // 256)  # immutable: a read-only buffer
        lo = _bytes_address(source)
        sink = ObjectSink(up, "obj")
        sink.begin_item(lo, len(source), hold=source)
        sink.write(b"header")
        sink.write(memoryview(source))
        crc, watched_at = sink.end_item()
        sink.close()
        up.finish()
        data = store.get("obj")
        assert data == b"header" + source and crc.value() == crc32c(data)
        assert watched_at == len(b"header")
        inside = [lo <= store.addresses[n] < lo + len(source) for n in sorted(store.addresses)]
        assert inside == [False, True, True, False], inside
    finally:
        up.close()
