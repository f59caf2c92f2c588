"""The zip framing around a tensor's bytes inside a saved item: the check that pins
``data_offset`` and the length independently of the manifest."""

from __future__ import annotations

__all__ = ["FRAMING_HEAD", "FRAMING_TAIL", "tensor_framing_error"]

FRAMING_HEAD = 512
"""Bytes before a tensor's data that hold its zip local file header (30 bytes, the record
name, and torch's alignment padding of at most 64 bytes)."""
FRAMING_TAIL = 24
"""Bytes after a tensor's data that hold its zip data descriptor (ZIP64: 24 bytes)."""


def tensor_framing_error(
    head: bytes | bytearray | memoryview, tail: bytes | bytearray | memoryview, nbytes: int
) -> str | None:
    """Why ``data_offset`` does not point at a tensor's data inside its item, or None.

    An item is ``torch.save``'s zip archive; the tensor's bytes are the data of one record:
    a local file header ends exactly where they begin, and a data descriptor carrying their
    size follows them. Checking both pins ``data_offset`` and the length independently of
    the manifest, so even a manifest re-sealed with a valid digest cannot make a reader take
    other bytes for the tensor. ``head`` ends at ``data_offset`` (at least
    :data:`FRAMING_HEAD` bytes of it, or all there is); ``tail`` starts right after the data.
    """
    head = bytes(head[-FRAMING_HEAD:])
    at = head.rfind(b"PK\x03\x04")
    if at < 0 or len(head) - at < 30:
        return "no zip record header ends where the tensor data is said to begin"
    name_len = int.from_bytes(head[at + 26 : at + 28], "little")
    extra_len = int.from_bytes(head[at + 28 : at + 30], "little")
    if at + 30 + name_len + extra_len != len(head):
        return "the zip record header before the tensor data does not end at data_offset"
    if b"/data/" not in head[at + 30 : at + 30 + name_len]:
        return "the zip record before the tensor data is not a tensor storage"
    tail = bytes(tail[:FRAMING_TAIL])
    if tail[:4] != b"PK\x07\x08" or len(tail) < 16:
        return "no zip data descriptor follows the tensor data"
    small = (int.from_bytes(tail[8:12], "little"), int.from_bytes(tail[12:16], "little"))
    large = (
        (int.from_bytes(tail[8:16], "little"), int.from_bytes(tail[16:24], "little"))
        if len(tail) >= 24
        else None
    )
    if small != (nbytes, nbytes) and large != (nbytes, nbytes):
        return f"the zip record of the tensor data is not {nbytes} bytes long"
    return None
