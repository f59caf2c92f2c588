"""Loading a step that gc, prune or rm fenced (its marker key holds a tombstone) says the
step was deleted, and by whom: never that its marker is corrupt (issue 37)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp

from s3ckpt import S3StorageReader, S3StorageWriter
from s3ckpt._tombstone import Tombstone
from s3ckpt.errors import CheckpointNotFoundError, CorruptCheckpointError, find_s3ckpt_error
from s3ckpt.format._names import MANIFEST_NAME
from s3ckpt.retention import delete_checkpoint
from s3ckpt.store import Location, MemoryStore
from s3ckpt.uri import parse_url

STEP = parse_url("s3://bkt/run/step_000000007/")


def _load(store: MemoryStore) -> BaseException:
    out = {"w": torch.zeros(3)}
    with pytest.raises(BaseException) as info:  # under dcp.load: its CheckpointException
        dcp.load(out, storage_reader=S3StorageReader(STEP, store=store))
    found = find_s3ckpt_error(info.value)
    assert found is not None and not isinstance(found, CorruptCheckpointError)
    return found


def test_a_gone_step_loads_as_deleted_naming_the_step_and_the_deleter() -> None:
    store = MemoryStore("bkt")
    tomb = Tombstone("host-a:42:abc", by="gc", reaped=("deadbeef",), keep=True, done=True)
    store.put(STEP.key(MANIFEST_NAME), tomb.to_json())
    err = _load(store)
    assert isinstance(err, CheckpointNotFoundError)
    assert "step 7" in str(err) and "deleted by `s3ckpt gc` (host-a:42:abc)" in str(err)
    assert "corrupt" not in str(err).lower() and err.key == STEP.key(MANIFEST_NAME)


def test_a_step_whose_deletion_was_cut_short_loads_as_being_deleted() -> None:
    store = MemoryStore("bkt")
    dcp.save({"w": torch.ones(3)}, storage_writer=S3StorageWriter(STEP, store=store))
    store.inject("delete", key_glob="*.distcp", times=100)  # deletes of its data refused
    res = delete_checkpoint(Location.of(STEP, store=store), allow_newest=True)
    assert not res.deleted and any(k.endswith(".distcp") for k in store.objects)
    err = _load(store)
    assert isinstance(err, CheckpointNotFoundError) and "step 7" in str(err)
    assert "is being deleted by `s3ckpt rm`" in str(err)
