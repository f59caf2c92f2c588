"""Format 4: a save's item records live beside its marker, in ``s3ckpt.items.{tag}``.

The marker every resume and retention scan reads stays small whatever the number of items;
the records are committed by the marker (size, CRC32C, count), read once by a load, verify
and check, and are part of what the save owns (discarded with it, replaced by an overwrite,
removed with the checkpoint).
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from torch.distributed.checkpoint.api import CheckpointException

from s3ckpt.errors import CorruptCheckpointError
from s3ckpt.format._manifest import FORMAT_VERSION, Manifest
from s3ckpt.format._names import ITEMS_PREFIX, MANIFEST_NAME, items_name, owned_tag
from s3ckpt.store import Location, MemoryStore
from s3ckpt.tools import check, verify_checkpoint
from tests._helpers import assert_same, committed_manifest
from tests._helpers import zeros_like_state as zeros
from tests.unit._memory_dcp import load, make_state, save

PREFIX = "run/step_1/"


def _tiny(n: int) -> dict[str, torch.Tensor]:
    return {f"t.{i}": torch.full((4,), float(i)) for i in range(n)}


def _items_keys(store: MemoryStore) -> list[str]:
    return sorted(k for k in store.objects if k.rpartition("/")[2].startswith(ITEMS_PREFIX))


def test_the_marker_does_not_grow_with_the_items() -> None:
    sizes = {}
    for n in (10, 3000):
        store = MemoryStore("bkt")
        save(store, _tiny(n))
        raw = store.get(PREFIX + MANIFEST_NAME)
        doc = json.loads(raw)
        assert doc["format_version"] == FORMAT_VERSION == 4 and "item_fields" not in doc
        m = committed_manifest(store.get, PREFIX)
        assert m.items_ref is not None and m.items_ref.count == len(m.records) == n
        assert _items_keys(store) == [PREFIX + items_name(m.tag)]
        sizes[n] = len(raw)
        out = zeros(_tiny(n))
        load(store, out)
        assert_same(_tiny(n), out)
    # One row per data object, nothing per item (with 3000 rows inline it was ~250 KB).
    assert sizes[3000] < 2 * sizes[10] < 4096


def test_missing_or_changed_records_are_refused_by_load_verify_and_check() -> None:
    store = MemoryStore("bkt")
    sd = make_state()
    save(store, sd)
    (key,) = _items_keys(store)
    body = store.get(key)
    store.put(key, body[:-1] + b" ")  # one byte changed: the CRC32C the marker commits differs
    with pytest.raises(CorruptCheckpointError, match="does not match") as info:
        load(store, zeros(sd))
    assert info.value.key == key
    with pytest.raises(CorruptCheckpointError, match="does not match"):
        verify_checkpoint("s3://bkt/run/step_1", store=store)
    store.delete([key])
    with pytest.raises(CorruptCheckpointError, match="missing") as info:
        load(store, zeros(sd))
    assert info.value.key == key and "earlier checkpoint" in str(info.value)
    result = check("s3://bkt/run/", store=store, read_data="all")
    assert not result.ok and [c.name for c in result.damaged] == ["step_1"]
    (finding,) = result.damaged[0].findings
    assert finding.kind == "items" and finding.object == key.rpartition("/")[2]
    store.put(key, body)  # put back: whole again
    assert check("s3://bkt/run/", store=store, read_data="all").ok
    out = zeros(sd)
    load(store, out)
    assert_same(sd, out)


def test_records_of_another_save_are_refused_even_when_resealed() -> None:
    """A records object copied from another save (same items, its own save id) cannot stand
    in for this save's, even when the marker is resealed to commit its size and CRC32C."""
    from s3ckpt._crc import crc32c
    from s3ckpt.format._manifest import manifest_digest

    store = MemoryStore("bkt")
    sd = make_state()
    save(store, sd)
    save(store, sd, url="s3://bkt/run/step_2")
    other = store.get(_items_keys(store)[1])
    marker = json.loads(store.get(PREFIX + MANIFEST_NAME))
    store.put(PREFIX + marker["items"]["name"], other)
    marker["items"] |= {"size": len(other), "crc32c": f"{crc32c(other):08x}"}
    marker["digest"] = manifest_digest(marker)
    store.put(PREFIX + MANIFEST_NAME, json.dumps(marker).encode())
    with pytest.raises(CorruptCheckpointError, match="not this save's item records"):
        load(store, zeros(sd))


def test_a_format_3_marker_with_inline_records_still_loads() -> None:
    store = MemoryStore("bkt")
    sd = make_state()
    save(store, sd)
    m = committed_manifest(store.get, PREFIX)
    old = dataclasses.replace(m, format_version=2, items_ref=None)
    store.put(PREFIX + MANIFEST_NAME, old.to_json())
    store.delete(_items_keys(store))
    doc = json.loads(store.get(PREFIX + MANIFEST_NAME))
    assert doc["format_version"] == 2 and len(doc["items"]) == len(m.records)
    assert Manifest.from_json(store.get(PREFIX + MANIFEST_NAME)).records == m.records
    out = zeros(sd)
    load(store, out)
    assert_same(sd, out)
    assert verify_checkpoint("s3://bkt/run/step_1", store=store).ok


def test_the_records_belong_to_their_save() -> None:
    """Named by the save's tag (gc can prove them s3ckpt's), replaced by an overwrite, and
    never left by a save that lost."""
    assert owned_tag("s3ckpt.items.0badcafe") == "0badcafe"
    assert owned_tag("s3ckpt.items.0badcafe.x") is None
    store = MemoryStore("bkt")
    sd = make_state()
    first = save(store, sd)
    second = save(store, sd, overwrite=True)
    assert _items_keys(store) == [PREFIX + items_name(second.save_id[:8])]
    assert first.save_id != second.save_id

    class Refusing(MemoryStore):
        def put(self, key: str, data: object, **kw: object) -> str:
            if key.endswith(MANIFEST_NAME):
                raise CorruptCheckpointError("refused", key=key)
            return super().put(key, data, **kw)  # type: ignore[arg-type]

    store = Refusing("bkt")
    with pytest.raises(CheckpointException, match="refused"):
        save(store, sd)
    assert _items_keys(store) == []


def test_retention_deletes_the_records_with_their_checkpoint() -> None:
    from s3ckpt.retention import delete_checkpoint

    store = MemoryStore("bkt")
    save(store, make_state())
    save(store, make_state(), url="s3://bkt/run/step_2")
    before = MemoryStore("bkt")
    before.objects = {k: o for k, o in store.objects.items() if k.startswith(PREFIX)}
    r = delete_checkpoint(Location.of("s3://bkt/run/step_1", store=store))
    assert r.deleted and [k for k in r.keys if ITEMS_PREFIX in k] == _items_keys(before)
    assert not [k for k in store.objects if k.startswith(PREFIX)]
    assert [k.split("/")[1] for k in _items_keys(store)] == ["step_2"]
