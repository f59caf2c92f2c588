"""Helpers shared by the DCP, tools and store tests: small transfer settings, state dicts
and their comparison, and listings of what a bucket holds.

Fixtures live in ``tests/conftest.py``; this module holds plain functions and constants
that test modules import.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import torch

from s3ckpt._crc import crc32c
from s3ckpt.config import MiB, TransferConfig
from s3ckpt.format._manifest import Manifest, manifest_digest
from s3ckpt.format._names import MANIFEST_NAME
from s3ckpt.store.base import ObjectStore

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


def committed_manifest(get: Callable[[str], bytes], prefix: str) -> Manifest:
    """The manifest committed at ``prefix`` with its item records (read from their own object
    for format 4); ``get`` reads a key's bytes (a store's ``get``, or boto3's)."""
    manifest = Manifest.from_json(get(prefix + MANIFEST_NAME))
    ref = manifest.items_ref
    return manifest if ref is None else manifest.with_items(get(prefix + ref.name), where=ref.name)


def edit_items(
    store: ObjectStore, prefix: str, edit: Callable[[list[list[Any]]], None], *, reseal: bool
) -> None:
    """A forger's edit of the item rows committed at ``prefix`` (format 4: in the item-records
    object). ``reseal``: the marker is updated to commit the edited object (its size, CRC32C
    and digest recomputed), as someone who knows the format would."""
    marker = json.loads(store.get(prefix + MANIFEST_NAME))
    key = prefix + marker["items"]["name"]
    doc = json.loads(store.get(key))
    edit(doc["items"])
    body = json.dumps(doc).encode()
    store.put(key, body)
    if reseal:
        marker["items"] |= {"size": len(body), "crc32c": f"{crc32c(body):08x}"}
        marker["digest"] = manifest_digest(marker)
        store.put(prefix + MANIFEST_NAME, json.dumps(marker).encode())


def boto_get(client: Any, bucket: str) -> Callable[[str], bytes]:
    """A key's bytes read with boto3's ``client`` (for :func:`committed_manifest`)."""
    return lambda key: bytes(client.get_object(Bucket=bucket, Key=key)["Body"].read())
