"""s3ckpt.tools.packing: the storage form lightning and accelerate keep training state in.

A value saved packed through DCP (MemoryStore) loads back exactly into destinations built
from the checkpoint's metadata alone: ``None`` leaves, ``int`` keys, tuples and empty dicts
survive; a value the flat form cannot name is stored whole; an entry never saved is None.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import PurePosixPath
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from s3ckpt.dcp import S3StorageReader, S3StorageWriter, quiet_dcp
from s3ckpt.store import MemoryStore
from s3ckpt.tools.packing import (
    WHOLE_KEY,
    is_packed,
    item_destinations,
    pack_state,
    packed_destinations,
    unpack_state,
)

URL = "s3://bkt/run/step_1"


def _roundtrip(sd: dict[str, Any], entries: list[str]) -> dict[str, Any]:
    """Save ``sd`` (entries packed), then load each entry into destinations built from the
    saved metadata only; the unpacked values by entry."""
    store = MemoryStore("bkt")
    with quiet_dcp():
        dcp.save(sd, storage_writer=S3StorageWriter(URL, store=store), no_dist=True)
        reader = S3StorageReader(URL, store=store, safe_globals=[PurePosixPath])
        dests = {e: packed_destinations(reader.metadata, e) for e in entries}
        wanted = {e: d for e, d in dests.items() if d is not None}
        dcp.load(wanted, storage_reader=reader, no_dist=True)
    return {e: (None if d is None else unpack_state(wanted[e])) for e, d in dests.items()}


def test_a_value_comes_back_exactly() -> None:
    value = {
        "state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.arange(4.0)}},
        "groups": [{"lr": 0.1, "params": (0, 1), "betas": (0.9, 0.99)}],
        "none": None,
        "empty": {},
        "ordered": OrderedDict(b=1, a=2),
        "path": PurePosixPath("/data/x"),
    }
    flat = pack_state(value)
    assert is_packed(flat)
    out = _roundtrip({"opt": flat}, ["opt"])["opt"]
    assert out["state"][0]["exp_avg"].equal(value["state"][0]["exp_avg"])  # int key kept
    assert out["groups"][0]["params"] == (0, 1)  # a tuple stays a tuple
    assert out["none"] is None and out["empty"] == {}
    assert list(out["ordered"]) == ["b", "a"] and type(out["ordered"]) is OrderedDict
    assert out["path"] == PurePosixPath("/data/x")


def test_a_value_the_flat_form_cannot_name_is_stored_whole() -> None:
    value = {(1, 2): "tuple key", "t": torch.ones(2)}
    flat = pack_state(value)
    assert list(flat) == [WHOLE_KEY] and is_packed(flat)
    out = _roundtrip({"odd": flat}, ["odd"])["odd"]
    assert out[(1, 2)] == "tuple key" and out["t"].equal(torch.ones(2))


def test_an_entry_never_saved_has_no_destinations() -> None:
    out = _roundtrip({"a": pack_state({"x": 1}), "plain": torch.zeros(2)}, ["a", "b", "plain"])
    assert out == {"a": {"x": 1}, "b": None, "plain": None}  # "plain" was not packed


def test_item_destinations_describe_every_saved_item() -> None:
    store = MemoryStore("bkt")
    sd = {"w": torch.zeros(2, 3, dtype=torch.bfloat16), "n": {"k": "v"}}
    with quiet_dcp():
        dcp.save(sd, storage_writer=S3StorageWriter(URL, store=store), no_dist=True)
    md = S3StorageReader(URL, store=store).metadata
    dests = item_destinations(md)
    assert dests["w"].shape == (2, 3) and dests["w"].dtype == torch.bfloat16
    assert dests["n.k"] is None
    assert set(item_destinations(md, "n.")) == {"k"}
    assert not is_packed({"w": 1}) and not is_packed(None)
