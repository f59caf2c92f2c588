"""Large items load as parallel ranged GETs (s3ckpt.dcp._split): the pieces' CRC32Cs
combine into the item's, every destination kind loads bit-exact, and a flipped byte in any
piece is still caught, naming the item."""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any

import crc32c
import pytest
import torch
import torch.distributed.checkpoint as dcp
from hypothesis import given, settings
from hypothesis import strategies as st

from s3ckpt import S3StorageReader, S3StorageWriter
from s3ckpt._crc import crc32c_combine
from s3ckpt._transfer import read_piece_size
from s3ckpt._transfer._sink import MIN_READ_PIECE
from s3ckpt.config import MiB, TransferConfig
from s3ckpt.store import MemoryStore

URL = "s3://bkt/run/step_1"
CONFIG = TransferConfig(
    part_size=5 * MiB, max_concurrency=2, target_object_size=64 * MiB, read_request_size=64 * MiB
)
"""Two connections: a 36 MiB load reads in 9 MiB pieces, so the 24 MiB tensor is cut in 3."""


class RangeLog(MemoryStore):
    """A MemoryStore that records every ranged read: (key, start, length)."""

    def __init__(self, bucket: str) -> None:
        super().__init__(bucket)
        self.ranges: list[tuple[str, int, int | None]] = []
        self._log_lock = threading.Lock()

    def open_range(self, key: str, start: int = 0, length: int | None = None) -> Any:
        with self._log_lock:
            self.ranges.append((key, start, length))
        return super().open_range(key, start, length)


def _state() -> dict[str, Any]:
    g = torch.Generator().manual_seed(1)
    return {
        "big": torch.randn(6 * MiB, generator=g),  # 24 MiB: cut into pieces
        "mid": torch.randn(2 * MiB, generator=g).to(torch.bfloat16),  # 4 MiB
        "small": [torch.randn(1000, generator=g) for _ in range(8)],
        "meta": {"step": 7, "name": "x"},
    }


def _saved() -> tuple[RangeLog, dict[str, Any]]:
    store = RangeLog("bkt")
    sd = _state()
    dcp.save(sd, storage_writer=S3StorageWriter(URL, store=store, transfer_config=CONFIG))
    store.ranges.clear()
    return store, sd


def _load(store: MemoryStore, dest: dict[str, Any]) -> S3StorageReader:
    reader = S3StorageReader(URL, store=store, transfer_config=CONFIG)
    dcp.load(dest, storage_reader=reader)
    return reader


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=300), st.integers(0, 2**32 - 1))
def test_combine_is_the_crc_of_the_concatenation(a: bytes, b: bytes, seed: int) -> None:
    prefix = seed.to_bytes(4, "little")
    a = prefix + a
    assert crc32c_combine(crc32c.crc32c(a), crc32c.crc32c(b), len(b)) == crc32c.crc32c(a + b)


def test_combine_of_large_lengths_matches() -> None:
    a, b = os.urandom(1 << 20), os.urandom((3 << 20) + 5)
    assert crc32c_combine(crc32c.crc32c(a), crc32c.crc32c(b), len(b)) == crc32c.crc32c(a + b)


def test_piece_size_spreads_the_load_over_the_connections() -> None:
    assert read_piece_size(1024 * MiB, 14, ceiling=256 * MiB) == 37 * MiB
    assert read_piece_size(10 * MiB, 14, ceiling=256 * MiB) == MIN_READ_PIECE
    assert read_piece_size(100 * 1024 * MiB, 14, ceiling=256 * MiB) == 256 * MiB
    assert read_piece_size(100 * MiB, 1, ceiling=4 * MiB) == 4 * MiB  # the ceiling wins


def test_a_large_tensor_is_read_in_parallel_pieces_bit_exact() -> None:
    store, sd = _saved()
    dest = {
        "big": torch.zeros_like(sd["big"]),
        "mid": torch.zeros_like(sd["mid"]),
        "small": [torch.zeros_like(t) for t in sd["small"]],
        "meta": {"step": 0, "name": ""},
    }
    reader = _load(store, dest)
    assert torch.equal(dest["big"], sd["big"])
    assert torch.equal(dest["mid"], sd["mid"])
    assert all(torch.equal(x, y) for x, y in zip(dest["small"], sd["small"], strict=True))
    assert dest["meta"] == {"step": 7, "name": "x"}
    data = [r for r in store.ranges if "distcp" in r[0] or ".data" in r[0] or "__" in r[0]]
    biggest = max(length or 0 for _, _, length in data)
    assert biggest <= 9 * MiB, store.ranges  # nothing read the 24 MiB tensor in one GET
    assert reader.bytes_read >= sd["big"].numel() * 4


def test_a_converting_destination_loads_from_pieces() -> None:
    """Another dtype than saved: the item is assembled in one buffer, then converted."""
    store, sd = _saved()
    dest = {"big": torch.zeros(sd["big"].shape, dtype=torch.float64)}
    _load(store, dest)
    assert torch.equal(dest["big"], sd["big"].to(torch.float64))


def test_a_non_contiguous_destination_loads_from_pieces() -> None:
    store = RangeLog("bkt")
    saved = torch.randn(3 * MiB, 2, generator=torch.Generator().manual_seed(2))  # 24 MiB
    url = URL + "_2d"
    dcp.save({"w": saved}, storage_writer=S3StorageWriter(url, store=store, transfer_config=CONFIG))
    target = torch.zeros(2, 3 * MiB).t()  # the saved shape, not contiguous
    assert not target.is_contiguous()
    dcp.load(
        {"w": target}, storage_reader=S3StorageReader(url, store=store, transfer_config=CONFIG)
    )
    assert torch.equal(target, saved)
    assert max(length or 0 for _, _, length in store.ranges) <= 13 * MiB


def test_a_flipped_byte_in_any_piece_is_caught_naming_the_item() -> None:
    store, sd = _saved()
    reader = S3StorageReader(URL, store=store, transfer_config=CONFIG)
    info = next(
        i
        for idx, i in reader.metadata.storage_data.items()
        if idx.fqn == "big"  # type: ignore[union-attr]
    )
    key = reader.object_key(info.relative_path)
    for where in (info.offset + info.length // 2, info.offset + info.length - 200):
        store2 = RangeLog("bkt")
        store2.objects.update(store.objects)
        data = bytearray(store2.objects[key].data)
        data[where] ^= 0x01
        store2.objects[key] = dataclasses.replace(store2.objects[key], data=bytes(data))
        dest = {"big": torch.zeros_like(sd["big"])}
        with pytest.raises(BaseException) as caught:  # DCP wraps it in CheckpointException
            _load(store2, dest)
        text = str(caught.value)
        assert "big" in text and "checksum mismatch" in text, text
        assert key in text, text
