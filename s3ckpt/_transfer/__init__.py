"""The transfer engine: how bytes move between s3ckpt and an :class:`~s3ckpt.store.ObjectStore`.

* Writes: :class:`Uploader` (a bounded :class:`PartPool` of part buffers, parts uploaded in
  parallel, every multipart upload aborted on failure) and :class:`ObjectSink`, the
  write-only stream one object is written through; :func:`pack` balances items over
  objects.
* Reads: :func:`coalesce` merges byte ranges of one object into :class:`Request` s, and
  :class:`RangeWalk` reads them with parallel ranged GETs (a load's requests sized by
  :func:`read_piece_size` so that every connection has work), handing each span to its
  caller through a :class:`SpanReader` (the DCP reader and ``s3ckpt verify`` share it).

Sits beside :mod:`s3ckpt.store` and below :mod:`s3ckpt.dcp` and :mod:`s3ckpt.tools`;
imports no torch.
"""

from __future__ import annotations

from s3ckpt._transfer._sink import ItemCrc, ObjectSink, Request, coalesce, pack, read_piece_size
from s3ckpt._transfer._upload import PartPool, Uploader, format_leftovers
from s3ckpt._transfer._walk import RangeWalk, ReadFailure, Span, SpanReader

__all__ = [
    "ItemCrc",
    "ObjectSink",
    "PartPool",
    "RangeWalk",
    "ReadFailure",
    "Request",
    "Span",
    "SpanReader",
    "Uploader",
    "coalesce",
    "format_leftovers",
    "pack",
    "read_piece_size",
]
