"""Large items read in pieces: parallel ranged GETs within one stored item.

One connection to S3 carries about 85 MB/s, so an item of hundreds of MB read by one GET
keeps one connection busy while the rank's others idle: a rank loading five large tensors
would use five. :func:`split_spans` cuts every item longer than the load's piece size
(:func:`s3ckpt._transfer.read_piece_size`: the bytes to load spread over twice the
connections, 8 MiB at least) into near-equal pieces (any other item is one piece, and so
is a span of the fan-out stream: :func:`decode_span`). Each piece is a span of its own in
the range walk, so the pieces of one item are fetched by several threads at once, and each
lands straight in its place (decided when the item's first piece starts):

* an item that streams directly (:meth:`~s3ckpt.dcp._decode.SpanDecoder.direct`: a CPU
  destination, contiguous, of the saved dtype and shape) lands in the destination tensor's
  memory; its zip framing in two small buffers. No copy, no buffer of the item's size.
* any other item (a GPU destination, a resharded slice, a non-tensor item) lands in one
  buffer of the item's length, allocated when its first piece starts, decoded once its last
  piece arrives (:meth:`~s3ckpt.dcp._decode.SpanDecoder.decode_buffer`), as a whole read
  would.

Checksums: each piece's CRC32C is computed as its bytes arrive; when the last piece of an
item is in, the pieces' CRCs are combined in order (:func:`s3ckpt._crc.crc32c_combine`,
no byte read twice) and the item is checked against ``s3ckpt.json`` exactly as a whole read
is: the same checks, the same errors, naming the object, the item and the rank.
"""

from __future__ import annotations

import functools
import itertools
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

from s3ckpt._crc import crc32c_combine
from s3ckpt.dcp._decode import ByteSource, DirectTarget, ItemSpan, SpanDecoder, SpansByObject

__all__ = ["Piece", "SplitItem", "decode_span", "split_spans"]

WalkSpans = dict[str, list[tuple[int, int, "Piece"]]]
# Spans for :meth:`~s3ckpt._transfer.RangeWalk.plan`: ``(start, end, payload)`` by object.


class SplitItem:
    """One stored item read as one or more pieces, and where their bytes land (decided
    when its first piece starts: :meth:`~s3ckpt.dcp._decode.SpanDecoder.direct`). Its buffers
    (the framing around a streamed tensor, or the whole item) go once it is decoded, not when
    the load ends: a load of many small items holds only those being read."""

    __slots__ = ("_crcs", "_decoder", "_direct", "_left", "_lock", "_regions", "fqn", "key", "span")

    def __init__(self, span: ItemSpan, key: str, decoder: SpanDecoder, n_pieces: int) -> None:
        self.span, self.key, self.fqn = span, key, span.reads[0].storage_index.fqn
        self._decoder = decoder
        self._lock = threading.Lock()
        self._crcs = [(0, 0)] * n_pieces  # (crc, length) of each piece
        self._left = n_pieces
        self._direct: DirectTarget | None = None
        self._regions: list[tuple[int, memoryview]] | None = None

    def regions(self) -> list[tuple[int, memoryview]]:
        """``(offset in the item, writable view)`` covering the item's bytes, in order."""
        with self._lock:
            if self._regions is None:
                d = self._direct = self._decoder.direct(self.span, self.key)
                if d is not None:
                    self._regions = [
                        (0, memoryview(d.head)),
                        (len(d.head), d.data() if d.nbytes else memoryview(b"")),
                        (len(d.head) + d.nbytes, memoryview(d.tail)),
                    ]
                else:
                    self._regions = [(0, memoryview(bytearray(self.span.info.length)))]
            return self._regions

    def piece_done(self, index: int, crc: int, length: int) -> None:
        """Record piece ``index``; the last one checks and commits the whole item."""
        with self._lock:
            self._crcs[index] = (crc, length)
            self._left -= 1
            if self._left:
                return
        total = functools.reduce(lambda acc, part: crc32c_combine(acc, *part), self._crcs, 0)
        direct, regions = self._direct, self.regions()
        self._direct = self._regions = None  # decoded below: nothing reads its buffers again
        if direct is not None:
            self._decoder.finish_direct(self.span, self.key, direct, total)
        else:
            self._decoder.decode_buffer(self.span, self.key, regions[0][1], total)


@dataclass(frozen=True, slots=True)
class Piece:
    """Bytes ``[start, end)`` of a :class:`SplitItem` (offsets within the item)."""

    item: SplitItem
    index: int
    start: int
    end: int

    def read(self, reader: ByteSource) -> None:
        """Read this piece from ``reader`` (positioned at its first byte) into its place."""
        crc = 0
        for at, view in self.item.regions():
            lo, hi = max(self.start, at), min(self.end, at + len(view))
            if lo < hi:
                crc = reader.readinto_all(view[lo - at : hi - at], self.item.fqn, crc)
        self.item.piece_done(self.index, crc, self.end - self.start)


def split_spans(
    per_object: SpansByObject,
    decoder: SpanDecoder,
    *,
    piece_size: int,
    key_of: Callable[[str], str],
) -> WalkSpans:
    """The walk's spans of ``per_object``: each item as one span, or, when longer than
    ``piece_size``, as near-equal :class:`Piece` spans of at most ``piece_size`` bytes.
    ``key_of`` maps an object name to its store key (errors name the key)."""
    out: WalkSpans = {}
    for name, spans in per_object.items():
        key, walk = key_of(name), out.setdefault(name, [])
        for span in spans.values():
            start, length = span.info.offset, span.info.length
            n = max(1, math.ceil(length / piece_size))
            item = SplitItem(span, key, decoder, n)
            bounds = [length * i // n for i in range(n + 1)]  # n < piece_size <= length / n
            for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
                walk.append((start + lo, start + hi, Piece(item, i, lo, hi)))
    return out


def decode_span(decoder: SpanDecoder, source: ByteSource, key: str, span: ItemSpan) -> None:
    """Read ``span`` (of object ``key``) whole from ``source`` into the decoder's planner,
    checked: as one piece (the fan-out stream's spans)."""
    Piece(SplitItem(span, key, decoder, 1), 0, 0, span.info.length).read(source)
