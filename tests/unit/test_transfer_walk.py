"""The transfer engine's read walk and part pool: spans that share bytes are each read from
their own offset, truncation and failures reach the caller as the caller asked, the DCP
reader and ``s3ckpt verify`` make the same GETs, and the part pool blocks without polling
and wakes at once on a failure."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
import torch
import torch.distributed.checkpoint as dcp

from s3ckpt import S3StorageReader, S3StorageWriter, TransferConfig
from s3ckpt._transfer import (
    PartPool,
    RangeWalk,
    ReadFailure,
    Span,
    SpanReader,
    Uploader,
    coalesce,
)
from s3ckpt.config import KiB, MiB
from s3ckpt.errors import CorruptCheckpointError, TransientStoreError
from s3ckpt.store import MemoryStore
from s3ckpt.tools import verify_checkpoint
from tests._helpers import SMALL
from tests.unit._memory_dcp import OVERLAPPING, read_overlapping_spans

CONFIG = TransferConfig(read_request_size=MiB, coalesce_gap=64 * KiB, read_chunk_size=64 * KiB)
PAYLOAD = bytes(range(256)) * 4


class Recording(MemoryStore):
    """A MemoryStore that records every ranged GET as (object, start, length)."""

    def __init__(self) -> None:
        super().__init__("bkt")
        self.gets: list[tuple[str, int, int | None]] = []

    def open_range(self, key, start=0, length=None):  # type: ignore[no-untyped-def]
        self.gets.append((key, start, length))
        return super().open_range(key, start, length)


def _collect(store: MemoryStore, spans: dict[str, list[tuple[int, int]]], **kw):  # type: ignore[no-untyped-def]
    seen: dict[tuple[str, int, int], bytes] = {}
    lock = threading.Lock()

    def on_span(span: Span[None], reader: SpanReader) -> None:
        buf = memoryview(bytearray(span.end - span.start))
        reader.readinto_all(buf, "item")
        with lock:
            seen[(span.name, span.start, span.end)] = bytes(buf)

    walk: RangeWalk[None] = RangeWalk(store, lambda n: n, config=CONFIG, on_span=on_span, **kw)
    walk.run(walk.plan({name: [(s, e, None) for s, e in ss] for name, ss in spans.items()}))
    return seen, walk


def test_spans_that_share_bytes_each_read_their_own_bytes() -> None:
    """(40, 160) starts inside (0, 100): a walk that skipped "back" by ignoring the negative
    gap would hand it bytes 100-220. It gets a GET of its own, after the first."""
    store = Recording()
    store.put("blob", PAYLOAD)
    spans = [(0, 100), (40, 160), (150, 170)]
    seen, walk = _collect(store, {"blob": spans})
    assert seen == {("blob", s, e): PAYLOAD[s:e] for s, e in spans}
    assert store.gets == [("blob", 0, 170), ("blob", 40, 120)]
    assert walk.bytes_requested == 170 + 120


def test_a_stream_never_skips_backwards() -> None:
    store = MemoryStore("bkt")
    store.put("blob", PAYLOAD)
    reader = SpanReader(store.open_range("blob", 0, 100), "blob", "bkt", chunk=64 * KiB)
    with pytest.raises(ValueError, match="skip back"):
        reader.skip(-10)


def test_what_a_span_callback_leaves_unread_is_skipped() -> None:
    store = MemoryStore("bkt")
    store.put("blob", PAYLOAD)
    seen: dict[int, bytes] = {}

    def on_span(span: Span[None], reader: SpanReader) -> None:
        buf = memoryview(bytearray(min(5, span.end - span.start)))
        reader.readinto_all(buf, "item")
        seen[span.start] = bytes(buf)

    walk: RangeWalk[None] = RangeWalk(store, lambda n: n, config=CONFIG, on_span=on_span)
    walk.run(walk.plan({"blob": [(10, 50, None), (60, 100, None)]}))
    assert seen == {10: PAYLOAD[10:15], 60: PAYLOAD[60:65]}


def test_reading_past_a_span_is_refused() -> None:
    store = MemoryStore("bkt")
    store.put("blob", PAYLOAD)

    def on_span(span: Span[None], reader: SpanReader) -> None:
        reader.readinto_all(memoryview(bytearray(span.end - span.start + 1)), "item")

    walk: RangeWalk[None] = RangeWalk(store, lambda n: n, config=CONFIG, on_span=on_span)
    with pytest.raises(ValueError, match="span with 10 left"):
        walk.run(walk.plan({"blob": [(0, 10, None)]}))


def test_truncation_raises_with_the_rank_or_is_reported_for_the_spans_it_cost() -> None:
    store = MemoryStore("bkt")
    store.put("blob", PAYLOAD[:150])  # spans past 150 are cut off
    spans = {"blob": [(0, 100), (120, 140), (145, 200), (300, 310)]}
    with pytest.raises(CorruptCheckpointError, match="object ends early") as info:
        _collect(store, spans, rank=3)
    assert info.value.rank == 3
    failures: list[ReadFailure[None]] = []
    seen, walk = _collect(store, spans, on_failure=failures.append)
    assert [(f.kind, [(s.start, s.end) for s in f.spans]) for f in failures] == [
        ("truncated", [(145, 200), (300, 310)])
    ]
    assert set(seen) == {("blob", 0, 100), ("blob", 120, 140)}
    assert walk.bytes_requested == 0  # the request did not complete


def test_failures_to_open_or_stream_name_every_span_of_the_request() -> None:
    store = MemoryStore("bkt")
    store.put("a", PAYLOAD)
    store.put("b", PAYLOAD)
    store.inject("get", lambda k: TransientStoreError("slow down", key=k), key_glob="a", times=2)
    failures: list[ReadFailure[None]] = []
    seen, _ = _collect(
        store, {"a": [(0, 10), (20, 30)], "b": [(0, 10)]}, on_failure=failures.append
    )
    assert [(f.kind, len(f.spans)) for f in failures] == [("open", 2)]
    assert set(seen) == {("b", 0, 10)}
    with pytest.raises(TransientStoreError) as info:
        _collect(store, {"a": [(0, 10)]}, rank=1)
    assert info.value.rank is None  # an open failure is raised as the store raised it

    class Breaking(MemoryStore):
        """Streams that fail after their first 15 bytes."""

        def open_range(self, key, start=0, length=None):  # type: ignore[no-untyped-def]
            inner = super().open_range(key, start, length)
            sent = [0]

            class Stream:
                def readinto(self, view: memoryview) -> int:
                    if sent[0] >= 15:
                        raise TransientStoreError("connection reset", key=key)
                    got = inner.readinto(view[: 15 - sent[0]])
                    sent[0] += got
                    return got

                def close(self) -> None:
                    inner.close()

            return Stream()

    broken = Breaking("bkt")
    broken.put("a", PAYLOAD)
    failures.clear()
    seen, _ = _collect(broken, {"a": [(0, 10), (20, 30)]}, on_failure=failures.append)
    assert [(f.kind, len(f.spans)) for f in failures] == [("error", 2)]
    assert set(seen) == {("a", 0, 10)}
    with pytest.raises(TransientStoreError) as info:
        _collect(broken, {"a": [(0, 10), (20, 30)]}, rank=1)
    assert info.value.rank == 1  # a failure while streaming names the rank


def _checkpoint(store: MemoryStore, tc: TransferConfig) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    sd = {f"w{i}": torch.randn(100 + 37 * i, 300, generator=g) for i in range(12)}
    writer = S3StorageWriter("s3://bkt/run/step_1", store=store, transfer_config=tc)
    dcp.save(sd, storage_writer=writer)
    return sd


@pytest.mark.parametrize("gap,request_size", [(4 * MiB, 4 * MiB), (0, MiB), (64 * KiB, 2 * MiB)])
def test_the_reader_and_verify_make_the_same_gets_the_plan_names(
    gap: int, request_size: int
) -> None:
    tc = dataclasses.replace(
        SMALL, read_request_size=request_size, coalesce_gap=gap, read_chunk_size=64 * KiB
    )
    store = Recording()
    sd = _checkpoint(store, tc)
    reader = S3StorageReader("s3://bkt/run/step_1", store=store, transfer_config=tc)
    store.gets.clear()
    dest = {k: torch.zeros_like(v) for k, v in sd.items()}
    dcp.load(dest, storage_reader=reader)
    assert all(torch.equal(dest[k], sd[k]) for k in sd)
    loaded = sorted(store.gets)

    store.gets.clear()
    result = verify_checkpoint("s3://bkt/run/step_1", store=store, transfer_config=tc)
    assert result.ok and result.items_read == len(sd)
    verified = sorted(g for g in store.gets if g[2] is not None and ".distcp" in g[0])
    assert verified == loaded

    spans: dict[str, list[tuple[int, int, None]]] = {}
    for info in reader.metadata.storage_data.values():  # type: ignore[union-attr]
        key = reader.url.key(info.relative_path)
        spans.setdefault(key, []).append((info.offset, info.offset + info.length, None))
    planned = sorted(
        (key, r.start, r.size) for key, ss in spans.items() for r in coalesce(ss, gap, request_size)
    )
    assert loaded == planned
    assert reader.bytes_read == result.bytes_read == sum(size for _, _, size in planned)


def test_the_reader_reads_overlapping_spans_of_one_request_from_their_own_offsets() -> None:
    """The reader's per-request entry point hands each span its own bytes."""
    store = MemoryStore("bkt")
    _checkpoint(store, TransferConfig())
    store.put("run/step_1/blob", PAYLOAD)
    seen, reader = read_overlapping_spans(store, "blob", "s3://bkt/run/step_1")
    assert seen == {s: PAYLOAD[s:e] for s, e in OVERLAPPING}
    assert reader.bytes_read == 170 + 120


def test_the_part_pool_blocks_when_every_buffer_is_out_and_reuses_them() -> None:
    pool = PartPool(16, 2)
    a, b = pool.take(), pool.take()
    assert a is not None and b is not None and a is not b
    got: list[bytearray | None] = []
    waiter = threading.Thread(target=lambda: got.append(pool.take()))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive(), "a third buffer was handed out with two in flight"
    pool.give(a)
    waiter.join(5)
    assert got == [a] and got[0] is a  # the buffer came back, none was allocated


def test_a_failure_wakes_every_waiter_at_once() -> None:
    pool = PartPool(16, 1)
    assert pool.take() is not None
    got: list[bytearray | None] = []
    waiters = [threading.Thread(target=lambda: got.append(pool.take())) for _ in range(3)]
    for w in waiters:
        w.start()
    time.sleep(0.05)
    t0 = time.perf_counter()
    pool.close_for_failure()
    for w in waiters:
        w.join(5)
    assert got == [None, None, None]
    assert time.perf_counter() - t0 < 0.05
    assert pool.take() is None


def test_a_writer_blocked_on_buffers_gets_the_upload_failure() -> None:
    """All buffers are in flight in parts that then fail: the writer waiting for a buffer
    raises the part's error instead of waiting on."""
    release = threading.Event()

    class Failing(MemoryStore):
        def upload_part(self, key, upload_id, part_number, data, *, crc32c=None):  # type: ignore[no-untyped-def]
            assert release.wait(10)
            raise TransientStoreError("part refused", key=key)

    up = Uploader(Failing("bkt"), part_size=5 * MiB, n_buffers=2, max_concurrency=2)
    sink = up.sink("obj")
    errors: list[BaseException] = []

    def write() -> None:
        try:
            sink.write(bytes(3 * 5 * MiB))  # needs a third buffer
        except BaseException as exc:
            errors.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    writer.join(0.2)
    assert writer.is_alive()
    release.set()
    writer.join(5)
    assert not writer.is_alive()
    assert [type(e) for e in errors] == [TransientStoreError]
    assert up.abort() == []
