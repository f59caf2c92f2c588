"""The writer's ``torch.save`` without the zip CRC-32 (s3ckpt.dcp._serialize)."""

from __future__ import annotations

import gc
import io
import struct
import zipfile

import pytest
import torch

from s3ckpt.dcp._serialize import fast_path_available, save_item

SAMPLES = [
    torch.arange(1000, dtype=torch.float32),
    torch.randn(3, 5, 7, dtype=torch.float64),
    torch.randint(0, 255, (4096,), dtype=torch.uint8),
    torch.ones(0, dtype=torch.bfloat16),
    torch.tensor(3, dtype=torch.int64),
    torch.zeros(33, dtype=torch.bool),
]


def _stock(obj: torch.Tensor) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _ours(obj: torch.Tensor) -> bytes:
    buf = io.BytesIO()
    save_item(obj, buf)
    return buf.getvalue()


def _records(raw: bytes) -> dict[str, bytes]:
    """Each zip record's stored bytes, read from its local header (no CRC check)."""
    out = {}
    for info in zipfile.ZipFile(io.BytesIO(raw)).infolist():
        assert info.compress_type == zipfile.ZIP_STORED
        name_len, extra_len = struct.unpack_from("<HH", raw, info.header_offset + 26)
        start = info.header_offset + 30 + name_len + extra_len
        out[info.filename] = raw[start : start + info.file_size]
    return out


def test_torch_load_does_not_verify_the_zip_crc() -> None:
    # The premise: the CRC-32 torch.save computes protects nothing on torch.load.
    t = torch.arange(1000, dtype=torch.float32)
    raw = bytearray(_stock(t))
    raw[raw.find(t.numpy().tobytes()[:64]) + 100] ^= 0xFF
    back = torch.load(io.BytesIO(bytes(raw)), weights_only=True)
    assert not torch.equal(back, t)


def test_fast_path_is_taken_on_the_pinned_torch() -> None:
    assert fast_path_available()


@pytest.mark.parametrize("t", SAMPLES, ids=lambda t: f"{t.dtype}{tuple(t.shape)}")
def test_item_loads_with_torch_load_and_matches_torch_save_but_for_crcs(t: torch.Tensor) -> None:
    ours, stock = _ours(t), _stock(t)
    back = torch.load(io.BytesIO(ours), weights_only=True)
    assert back.dtype == t.dtype and torch.equal(back, t)
    assert len(ours) == len(stock)
    # Same records with the same bytes, but for the serialization id torch derives from
    # the CRCs it computed.
    mine, theirs = _records(ours), _records(stock)
    assert mine.keys() == theirs.keys()
    for name in mine:
        if not name.endswith("serialization_id"):
            assert mine[name] == theirs[name], name
    # The CRC was not computed: a zip tool that checks it flags the archive.
    assert zipfile.ZipFile(io.BytesIO(ours)).testzip() is not None
    assert zipfile.ZipFile(io.BytesIO(stock)).testzip() is None


def test_falls_back_to_torch_save_when_the_private_api_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def changed(*args: object) -> None:
        raise TypeError("PyTorchFileWriter(): incompatible constructor arguments")

    monkeypatch.setattr(torch._C, "PyTorchFileWriter", changed)
    fast_path_available.cache_clear()
    try:
        assert not fast_path_available()
        t = SAMPLES[0]
        monkeypatch.undo()  # torch.save itself needs the real writer; the answer is kept
        assert _ours(t) == _stock(t)
    finally:
        fast_path_available.cache_clear()


class _FailingSink(io.RawIOBase):
    """Accepts ``ok_writes`` writes, then fails every one (a store that went away)."""

    def __init__(self, ok_writes: int) -> None:
        super().__init__()
        self.left = ok_writes
        self.calls = 0

    def writable(self) -> bool:
        return True

    def write(self, data: object) -> int:
        self.calls += 1
        if self.left <= 0:
            raise OSError(f"injected failure on write {self.calls}")
        self.left -= 1
        return memoryview(data).nbytes  # type: ignore[arg-type]


@pytest.mark.parametrize("ok_writes", [0, 1, 3, 6])
def test_a_failing_sink_raises_its_error_and_leaves_no_writer_to_abort_in_gc(
    ok_writes: int,
) -> None:
    # Without finishing the archive on failure, the writer's destructor wrote to the
    # failed sink again during a later garbage collection and aborted the interpreter.
    sink = _FailingSink(ok_writes)
    with pytest.raises(OSError, match="injected failure"):
        save_item(torch.arange(4096, dtype=torch.float32), sink)
    calls = sink.calls
    gc.collect()
    assert sink.calls == calls  # nothing wrote to the sink after save_item returned
