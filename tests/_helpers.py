"""Helpers shared by the DCP, tools and store tests: small transfer settings, state dicts
and their comparison, and listings of what a bucket holds.

Fixtures live in ``tests/conftest.py``; this module holds plain functions and constants
that test modules import.
"""

from __future__ import annotations

from typing import Any

import torch

from s3ckpt.config import MiB, TransferConfig

__all__ = [
    "SMALL",
    "assert_same",
    "list_keys",
    "open_uploads",
    "seeded",
    "zeros_like_state",
]

SMALL = TransferConfig(part_size=5 * MiB, max_inflight_bytes=10 * MiB, target_object_size=2 * MiB)
"""Small parts and objects, so a few MiB of tensors make multipart uploads, several data
objects per rank and coalesced ranged reads. Tests that rely on another object or request
size say so with ``dataclasses.replace(SMALL, ...)``."""


def seeded(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed``: the same tensors on every run and every rank."""
    return torch.Generator().manual_seed(seed)


def zeros_like_state(sd: dict[str, Any]) -> dict[str, Any]:
    """A state dict to load ``sd`` into: zero tensors of the same shapes and dtypes (made
    contiguous), nested dicts alike, and ``None`` for every other value."""
    out: dict[str, Any] = {}
    for k, v in sd.items():
        if isinstance(v, torch.Tensor):
            out[k] = torch.zeros_like(v.contiguous())
        elif isinstance(v, dict):
            out[k] = zeros_like_state(v)
        else:
            out[k] = None
    return out


def assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    """``a`` and ``b`` hold the same keys, equal tensors of the same dtype and equal values,
    nested dicts included."""
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
        elif isinstance(a[k], dict):
            assert_same(a[k], b[k])
        else:
            assert a[k] == b[k], k


def list_keys(client: Any, bucket: str, prefix: str = "") -> list[str]:
    """Every key under ``prefix``, sorted, through a plain boto3 client."""
    keys: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.extend(o["Key"] for o in page.get("Contents", []))
    return sorted(keys)


def open_uploads(client: Any, bucket: str, prefix: str = "") -> list[str]:
    """Keys of the open multipart uploads under ``prefix``, sorted."""
    resp = client.list_multipart_uploads(Bucket=bucket, Prefix=prefix)
    return sorted(u["Key"] for u in resp.get("Uploads", []))
