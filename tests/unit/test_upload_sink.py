"""ObjectSink: bytes land in the part buffer with no intermediate copy; item CRCs and the
object's bytes are right wherever part boundaries fall."""

from __future__ import annotations

import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from s3ckpt._crc import crc32c
from s3ckpt.dcp._upload import ObjectSink, Uploader
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
# enough that items and single writes straddle part boundaries: every item's CRC32C is
# the CRC32C of exactly its bytes, and the object is every byte in order.
_writes = st.lists(st.integers(min_value=0, max_value=40), min_size=0, max_size=6)
_layout = st.lists(st.tuples(_writes, _writes), min_size=1, max_size=6)  # (item, gap after)


@settings(max_examples=200, deadline=None)
@given(layout=_layout, part_size=st.integers(min_value=1, max_value=48), seed=st.integers(0, 255))
def test_item_crcs_and_bytes_across_part_boundaries(
    layout: list[tuple[list[int], list[int]]], part_size: int, seed: int
) -> None:
    up = Uploader(MemoryStore(), part_size=part_size, n_buffers=3, max_concurrency=2)
    try:
        sink = ObjectSink(up, "obj")
        everything = bytearray()
        counter = seed

        def chunk(n: int) -> bytes:
            nonlocal counter
            data = bytes((counter + i) % 251 for i in range(n))
            counter += n
            return data

        for item_sizes, gap_sizes in layout:
            start = sink.begin_item()
            assert start == len(everything)
            item = bytearray()
            for n in item_sizes:
                data = chunk(n)
                assert sink.write(data) == n
                item += data
            crc, _ = sink.end_item()
            assert crc == crc32c(bytes(item))
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
    finally:
        up.close()
