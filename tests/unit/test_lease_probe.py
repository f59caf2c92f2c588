"""The capability probe a pruner runs before its first lease never touches the shared lease
object: on a store that enforces conditional creates and replaces but deletes whatever the
If-Match says, probing the lease key itself deleted the lease another pruner held (and put
its bytes back under a new ETag), so that pruner's next renewal failed and, for a moment,
no lease existed at all."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from s3ckpt.errors import LeaseHeldError
from s3ckpt.retention._lease import Lease
from s3ckpt.store import MemoryStore
from s3ckpt.store._known import clear_capabilities_cache
from s3ckpt.uri import parse_url

RUN = parse_url("s3://bkt/run/")


class DeletesAnyway(MemoryStore):
    """Conditional creates and replaces enforced; DeleteObject If-Match ignored."""

    def __init__(self) -> None:
        super().__init__("bkt")
        self.deleted: list[str] = []

    def delete_if_match(self, key: str, etag: str) -> None:
        self.deleted.append(key)
        self.delete([key])


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    clear_capabilities_cache()
    yield
    clear_capabilities_cache()


def test_the_probe_leaves_a_held_lease_alone() -> None:
    store = DeletesAnyway()
    holder = Lease(store, RUN, owner="a").acquire()
    before = store.head(holder.key)
    clear_capabilities_cache()  # the second pruner is another process: it probes again
    with pytest.raises(LeaseHeldError):
        Lease(store, RUN, owner="b").acquire()
    assert holder.key not in store.deleted
    after = store.head(holder.key)
    assert after is not None and before is not None and after.etag == before.etag
    holder.record_intent(["step_1"])  # a conditional write on our ETag: still ours
    assert not [k for k in store.objects if ".probe-" in k]  # the probe's key is removed
