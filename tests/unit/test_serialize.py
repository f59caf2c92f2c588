"""The writer's ``torch.save`` without the zip CRC-32 (s3ckpt.dcp._serialize)."""

from __future__ import annotations

import gc
import io
import struct
import zipfile

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from s3ckpt.dcp._serialize import Framings, _tensor_for_save, fast_path_available, save_item

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


# --- Framings: torch's bytes around a tensor's storage, cut once per signature -------------

_DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int8,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.float8_e4m3fn,
]


# Shared by every example below: cuts of every signature seen so far must never be mixed up.
_SHARED = Framings()


def _framed(framings: Framings, t: torch.Tensor) -> bytes | None:
    cut = framings.get(t)
    if cut is None:
        return None
    return cut[0] + t.reshape(-1).view(torch.uint8).numpy().tobytes() + cut[1]


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(_DTYPES),
    shape=st.lists(st.integers(1, 7), min_size=0, max_size=4),
    seeds=st.tuples(st.integers(0, 2**16), st.integers(0, 2**16)),
    transpose=st.booleans(),
)
def test_framed_items_are_byte_for_byte_what_torch_writes(
    dtype: torch.dtype, shape: list[int], seeds: tuple[int, int], transpose: bool
) -> None:
    # The second tensor of a signature is written from the first one's cut: its bytes are
    # still exactly torch's, and it loads as itself.
    framings = Framings()
    for seed in seeds:
        g = torch.Generator().manual_seed(seed)
        t = (torch.rand(shape, generator=g) * 100).to(dtype)
        if transpose and t.dim() >= 2:
            t = t.transpose(0, 1)
        stored = _tensor_for_save(t)
        framed = _framed(framings, stored)
        assert framed is not None
        assert framed == _ours(stored)
        assert _framed(_SHARED, stored) == framed
        back = torch.load(io.BytesIO(framed), weights_only=True)
        assert back.dtype == t.dtype and back.shape == t.shape
        assert torch.equal(back.reshape(-1).view(torch.uint8), stored.reshape(-1).view(torch.uint8))


def test_unusual_tensors_are_serialised_by_torch_every_time() -> None:
    framings = Framings()
    t = torch.ones(6, dtype=torch.complex64)
    assert framings.get(torch.ones(0)) is None  # no storage bytes to cut around
    assert framings.get(t.conj()) is None  # the conjugate bit is in the pickle
    assert framings.get(torch.ones(3, requires_grad=True)) is None
    assert framings.get(torch.nn.Parameter(torch.ones(3))) is None  # a subclass
    assert framings.get(torch.ones(3)) is not None


def test_framings_keep_at_most_their_limit_of_signatures() -> None:
    framings = Framings(limit=2)
    for n in range(1, 6):
        assert framings.get(torch.ones(n)) is not None  # past the limit: cut, not kept
    assert len(framings._cut) == 2


def test_no_framing_where_torch_save_writes_crcs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("s3ckpt.dcp._serialize.fast_path_available", lambda: False)
    assert Framings().get(torch.ones(3)) is None
