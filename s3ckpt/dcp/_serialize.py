"""``torch.save`` of one DCP item, without the zip CRC-32 that nothing checks.

``torch.save`` writes a zip archive and by default computes a CRC-32 over every record,
the tensor bytes included: a full pass over the data (about as costly as copying it) on
the thread that blocks ``dcp.save``. ``torch.load`` never verifies those CRCs (a changed
byte loads silently; see ``tests/unit/test_serialize.py``), whereas s3ckpt records a
CRC32C of every item's bytes, headers and tensor data alike, and verifies it on load. So
the writer builds torch's own zip writer with ``compute_crc32=False``: the bytes are the
same format and length, stock readers (``torch.load``, DCP's ``FsspecReader``,
s3torchconnector) load them unchanged; only the CRC fields are zero.

That needs two private torch names (``torch._C.PyTorchFileWriter`` and
``torch.serialization._save``). They are probed once, by a round trip through
``torch.load``; on a torch where they differ the writer falls back to plain
``torch.save``. ``torch.serialization.set_crc32_options`` is not used because it is
process-wide: flipping it would change other threads' ``torch.save`` output.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import threading
from typing import Any

import torch

__all__ = ["fast_path_available", "save_item"]

_lock = threading.Lock()
_fast: bool | None = None


def _save_without_crc(obj: Any, f: Any) -> None:
    ser: Any = torch.serialization
    writer = torch._C.PyTorchFileWriter(f, False, ser._get_storage_alignment())
    try:
        ser._save(obj, writer, pickle, ser.DEFAULT_PROTOCOL, False)
    except BaseException:
        # As torch.save's context manager does: finishing the archive marks the writer
        # finalized even if it fails. Otherwise its C++ destructor finishes it later, in
        # whatever thread collects it, calls ``f.write`` again, and a second failure
        # there aborts the process (std::terminate; pytorch#87997).
        with contextlib.suppress(Exception):
            writer.write_end_of_file()
        raise
    writer.write_end_of_file()


def _probe() -> bool:
    try:
        sample = torch.arange(17, dtype=torch.float32)
        ours, stock = io.BytesIO(), io.BytesIO()
        _save_without_crc(sample, ours)
        torch.save(sample, stock)
        back = torch.load(io.BytesIO(ours.getvalue()), weights_only=True)
        return (
            len(ours.getvalue()) == len(stock.getvalue())
            and isinstance(back, torch.Tensor)
            and torch.equal(back, sample)
        )
    except Exception:  # any change in the private API means "use torch.save"
        return False


def fast_path_available() -> bool:
    """Whether this torch lets items be written without the zip CRC-32 (probed once)."""
    global _fast
    if _fast is None:
        with _lock:
            if _fast is None:
                _fast = _probe()
    return _fast


def save_item(obj: Any, f: Any) -> None:
    """Serialise ``obj`` into the file-like ``f`` exactly as ``torch.save`` would, minus
    the zip CRC-32 where this torch allows it."""
    if fast_path_available():
        _save_without_crc(obj, f)
    else:
        torch.save(obj, f)
