"""ObjectSink: bytes land in the part buffer with no intermediate copy; a large buffer whose
owner is handed over is uploaded from its own memory; item CRCs and the object's bytes are
right wherever part boundaries fall."""

from __future__ import annotations

import ctypes
import gc
import threading
import tracemalloc
import weakref

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from s3ckpt._crc import crc32c
from s3ckpt._transfer import ItemCrc, ObjectSink, Uploader
from s3ckpt.store.memory import MemoryStore

MiB = 1 << 20


def test_write_copies_straight_into_the_part_buffer() -> None:
    up = Uploader(MemoryStore(), part_size=16 * MiB, n_buffers=2, max_concurrency=1)
    try:
        sink = ObjectSink(up, "obj")
        sink.write(b"x")  # takes (allocates) the part buffer before measuring
        payload = memoryview(bytes(range(256)) * (32 * 1024))  # 8 MiB, fits the buffer
        tracemalloc.start()
        try:
            sink.write(payload)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        # A slice assignment into the bytearray would allocate a temporary copy of all
        # 8 MiB; writing through a memoryview allocates nothing of that size.
        assert peak < MiB, f"write() allocated {peak} bytes for an 8 MiB payload"
        sink.close()
        assert sink.completion is not None
        sink.completion.result()
        assert up.store.get("obj") == b"x" + bytes(payload)
    finally:
        up.close()


# Writes of any size, grouped into items with bytes between them, against parts small
# enough that items and single writes straddle part boundaries, some items ending with a
# watched buffer (uploaded from its own memory when its owner is handed over and it spans
# two parts or more): every item's CRC32C is the CRC32C of exactly its bytes, the watched
# buffer is found where it landed, and the object is every byte in order.
_writes = st.lists(st.integers(min_value=0, max_value=40), min_size=0, max_size=6)
_watched = st.one_of(st.none(), st.tuples(st.integers(1, 150), st.booleans()))  # (size, hold)
_layout = st.lists(st.tuples(_writes, _watched, _writes), min_size=1, max_size=6)


@settings(max_examples=300, deadline=None)
@given(layout=_layout, part_size=st.integers(min_value=1, max_value=48), seed=st.integers(0, 255))
def test_item_crcs_and_bytes_across_part_boundaries(
    layout: list[tuple[list[int], tuple[int, bool] | None, list[int]]], part_size: int, seed: int
) -> None:
    up = Uploader(MemoryStore(), part_size=part_size, n_buffers=3, max_concurrency=2)
    try:
        sink = ObjectSink(up, "obj")
        everything = bytearray()
        item_crcs: list[tuple[ItemCrc, int]] = []  # whole once the parts are sent
        counter = seed

        def chunk(n: int) -> bytes:
            nonlocal counter
            data = bytes((counter + i) % 251 for i in range(n))
            counter += n
            return data

        for item_sizes, watched, gap_sizes in layout:
            source = np.frombuffer(chunk(watched[0]), dtype=np.uint8).copy() if watched else None
            if source is not None and watched is not None:
                hold = source if watched[1] else None
                start = sink.begin_item(source.ctypes.data, source.nbytes, hold=hold)
            else:
                start = sink.begin_item()
            assert start == len(everything)
            item = bytearray()
            for n in item_sizes:
                data = chunk(n)
                assert sink.write(data) == n
                item += data
            if source is not None:
                at = len(everything) + len(item)
                view = (ctypes.c_ubyte * source.nbytes).from_address(source.ctypes.data)
                assert sink.write(memoryview(view)) == source.nbytes
                item += source.tobytes()
            crc, watched_at = sink.end_item()
            item_crcs.append((crc, crc32c(bytes(item))))
            assert watched_at == (at if source is not None else None)
            everything += item
            for n in gap_sizes:  # bytes outside any item count for no item
                data = chunk(n)
                sink.write(data)
                everything += data
            assert sink.tell() == len(everything)
        sink.close()
        assert sink.completion is not None
        sink.completion.result()
        up.finish()
        assert up.store.get("obj") == bytes(everything)
        assert [crc.value() for crc, _ in item_crcs] == [want for _, want in item_crcs]
    finally:
        up.close()


class _RecordingStore(MemoryStore):
    """A MemoryStore that notes where each part's body lives and can hold parts back."""

    @property
    def part_addresses(self) -> list[int]:
        """Body addresses by part number (parts upload on several threads, in any order)."""
        return [self._addresses[n] for n in sorted(self._addresses)]

    def __init__(self) -> None:
        super().__init__()
        self._addresses: dict[int, int] = {}
        self.sizes: dict[int, int] = {}  # part number -> body size
        self.release = threading.Event()
        self.release.set()

    def upload_part(self, key, upload_id, part_number, data, *, crc32c=None):  # type: ignore[no-untyped-def]
        view = memoryview(data).cast("B")
        self._addresses[part_number] = np.frombuffer(view, dtype=np.uint8).ctypes.data
        self.sizes[part_number] = view.nbytes
        assert self.release.wait(10)
        return super().upload_part(key, upload_id, part_number, data, crc32c=crc32c)


def _watched_write(
    sink: ObjectSink, source: np.ndarray, hold: object | None
) -> tuple[ItemCrc, int]:
    """One item: a small header, then ``source`` as the watched buffer, written as torch's
    zip writer writes a tensor: a view over its memory that does not own it."""
    sink.begin_item(source.ctypes.data, source.nbytes, hold=hold)
    sink.write(b"header")
    sink.write(memoryview((ctypes.c_ubyte * source.nbytes).from_address(source.ctypes.data)))
    crc, watched_at = sink.end_item()
    assert watched_at is not None
    return crc, watched_at


def test_a_large_held_buffer_is_uploaded_from_its_own_memory() -> None:
    part = 5 * MiB
    store = _RecordingStore()
    up = Uploader(store, part_size=part, n_buffers=2, max_concurrency=2)
    try:
        source = np.random.default_rng(0).integers(0, 255, 4 * part + 123, dtype=np.uint8)
        sink = ObjectSink(up, "obj")
        crc, watched_at = _watched_write(sink, source, hold=source)
        sink.close()
        up.finish()
        data = store.get("obj")
        assert data == b"header" + source.tobytes()
        assert watched_at == len(b"header")
        assert crc.value() == crc32c(data)
        # Part 1 is a pool buffer (header + top-up); parts 2-4 point into ``source`` itself;
        # the tail is copied into a pool buffer again.
        lo, hi = source.ctypes.data, source.ctypes.data + source.nbytes
        inside = [lo <= a < hi for a in store.part_addresses]
        assert inside == [False, True, True, True, False]
    finally:
        up.close()


@pytest.mark.parametrize("held", [True, False], ids=["borrowed", "copied"])
def test_the_last_parts_are_cut_smaller(held: bool) -> None:
    # 6 MiB parts, a save of 6 + 40 MiB: full parts while the bytes not yet cut fill
    # TAIL_SHARE (4) of them, then that remainder shared among 4, down to 5 MiB; every part
    # but the last at least 5 MiB (S3's minimum), the bytes and CRC32C unchanged.
    part = 6 * MiB
    store = _RecordingStore()
    total = 46 * MiB + len(b"header")
    up = Uploader(store, part_size=part, n_buffers=2, max_concurrency=2, expected_bytes=total)
    try:
        source = np.random.default_rng(1).integers(0, 255, 40 * MiB, dtype=np.uint8)
        sink = ObjectSink(up, "obj")
        sink.write(bytes(6 * MiB))
        crc, _ = _watched_write(sink, source, hold=source if held else None)
        sink.close()
        up.finish()
        assert store.get("obj") == bytes(6 * MiB) + b"header" + source.tobytes()
        assert crc.value() == crc32c(b"header" + source.tobytes())
        sizes = [store.sizes[n] for n in sorted(store.sizes)]
        assert sizes[:4] == [part] * 4 and sizes == sorted(sizes, reverse=True)
        assert 5 * MiB in sizes and min(sizes[:-1]) >= 5 * MiB and sum(sizes) == total
    finally:
        up.close()


def test_parts_are_whole_again_once_the_save_outgrows_its_estimate() -> None:
    # The writer's estimate (12 MiB) falls short of the 40 MiB sent: parts shrink toward
    # it, then, with what is left unknown, go back to full parts instead of 5 MiB ones.
    part = 6 * MiB
    store = _RecordingStore()
    up = Uploader(store, part_size=part, n_buffers=2, max_concurrency=2, expected_bytes=12 * MiB)
    try:
        source = np.random.default_rng(2).integers(0, 255, 40 * MiB, dtype=np.uint8)
        sink = ObjectSink(up, "obj")
        _watched_write(sink, source, hold=source)
        sink.close()
        up.finish()
        assert store.get("obj") == b"header" + source.tobytes()
        sizes = [store.sizes[n] for n in sorted(store.sizes)]
        assert sizes[0] < part and sizes[-2] == part and min(sizes[:-1]) >= 5 * MiB
    finally:
        up.close()


def test_without_hold_the_same_buffer_is_copied() -> None:
    part = 5 * MiB
    store = _RecordingStore()
    up = Uploader(store, part_size=part, n_buffers=2, max_concurrency=2)
    try:
        source = np.arange(3 * part, dtype=np.uint8)
        sink = ObjectSink(up, "obj")
        _watched_write(sink, source, hold=None)
        sink.close()
        up.finish()
        lo, hi = source.ctypes.data, source.ctypes.data + source.nbytes
        assert not any(lo <= a < hi for a in store.part_addresses)
        assert store.get("obj") == b"header" + source.tobytes()
    finally:
        up.close()


def test_the_held_owner_stays_alive_until_its_parts_are_sent() -> None:
    part = 5 * MiB
    store = _RecordingStore()
    store.release.clear()  # parts wait in upload_part
    up = Uploader(store, part_size=part, n_buffers=2, max_concurrency=2)
    try:
        source = np.full(3 * part, 7, dtype=np.uint8)
        alive = weakref.ref(source)
        sink = ObjectSink(up, "obj")
        _watched_write(sink, source, hold=source)
        del source
        gc.collect()
        assert alive() is not None, "the owner of a borrowed part was freed before the upload"
        store.release.set()
        sink.close()
        up.finish()
        gc.collect()
        assert alive() is None, "the sink kept the owner after its parts were sent"
        assert store.get("obj") == b"header" + bytes([7]) * (3 * part)
    finally:
        store.release.set()
        up.close()


class _OrderStore(MemoryStore):
    """Records the order parts are sent in; the first part waits for ``gate``."""

    def __init__(self) -> None:
        super().__init__()
        self.order: list[tuple[str, int]] = []
        self.gate = threading.Event()

    def upload_part(self, key, upload_id, part_number, data, *, crc32c=None):  # type: ignore[no-untyped-def]
        if not self.order:
            self.order.append((key, part_number))
            assert self.gate.wait(10)
        else:
            self.order.append((key, part_number))
        return super().upload_part(key, upload_id, part_number, data, crc32c=crc32c)


def test_parts_in_pool_buffers_go_before_a_tensors_own_parts_queued_earlier() -> None:
    # One upload thread: a large held buffer queues four parts from its own memory, then a
    # second object fills two pool buffers. The buffers' parts are sent first, so the
    # writing thread gets its buffers back without waiting for the tensor's parts.
    part = 5 * MiB
    store = _OrderStore()
    up = Uploader(store, part_size=part, n_buffers=3, max_concurrency=1)
    try:
        source = np.random.default_rng(1).integers(0, 255, 4 * part, dtype=np.uint8)
        a = up.sink("a")
        a.begin_item(source.ctypes.data, source.nbytes, hold=source)
        a.write(memoryview((ctypes.c_ubyte * source.nbytes).from_address(source.ctypes.data)))
        a.end_item()
        a.close()
        b = up.sink("b")
        b.write(bytes(2 * part))
        b.close()
        store.gate.set()
        up.finish()
        assert store.get("a") == source.tobytes() and store.get("b") == bytes(2 * part)
        order = store.order
        for borrowed in (("a", 2), ("a", 3), ("a", 4)):
            assert order.index(("b", 1)) < order.index(borrowed)
            assert order.index(("b", 2)) < order.index(borrowed)
    finally:
        up.close()


def test_an_object_expected_to_span_parts_creates_its_upload_when_opened() -> None:
    created: list[str] = []

    class Store(MemoryStore):
        def create_multipart(self, key, **kwargs):  # type: ignore[no-untyped-def]
            created.append(key)
            return super().create_multipart(key, **kwargs)

    part = 5 * MiB
    up = Uploader(Store(), part_size=part, n_buffers=2, max_concurrency=2)
    try:
        up.sink("small", size_hint=part)
        up.sink("large", size_hint=part + 1)
        while up._futures and not all(f.done() for f in up._futures):
            threading.Event().wait(0.01)
        assert created == ["large"]  # before a byte was written
    finally:
        assert up.abort() == []  # the open upload is aborted: nothing left
