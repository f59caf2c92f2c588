"""ObjectSink: bytes land in the part buffer with no intermediate copy."""

from __future__ import annotations

import tracemalloc

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
