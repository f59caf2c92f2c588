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


def test_gc_deletes_a_probe_left_behind_once_past_the_grace_period() -> None:
    # A silent store made the probe's own delete fail: the object stays beside the lease.
    # gc takes it once older than the grace period (store time), never a younger one (a
    # probe in flight), nor a name that only looks like one.
    from datetime import UTC, datetime, timedelta

    from s3ckpt.retention import RetentionOptions, gc
    from s3ckpt.store import Location
    from tests._retention_util import Clock, write_checkpoint

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    clock = Clock(t0)
    store = MemoryStore("bkt", clock=clock)
    write_checkpoint(store, RUN, 1, created=clock.t)
    old, odd = "run/s3ckpt.lease.probe-0123456789ab", "run/s3ckpt.lease.probe-notours"
    store.put(old, b"{}")
    store.put(odd, b"{}")
    clock.t += 600
    young = "run/s3ckpt.lease.probe-ba9876543210"
    store.put(young, b"{}")
    location, options = (
        Location.of(RUN, store=store),
        RetentionOptions(now=t0 + timedelta(seconds=601), grace=timedelta(seconds=300)),
    )
    assert old in gc(location, options=options).leftovers  # the dry run names it
    assert old in store.objects
    gc(location, apply=True, options=options)
    assert old not in store.objects
    assert young in store.objects and odd in store.objects
    assert "run/step_000000001/s3ckpt.json" in store.objects


def test_a_lost_reply_of_gcs_delete_of_a_probe_is_settled_by_its_retry() -> None:
    # The store deletes the stale probe, then the reply is lost: the retry finds nothing to
    # delete (success), gc ends clean, and a second gc has nothing left to do.
    from datetime import UTC, datetime, timedelta

    from s3ckpt.errors import TransientStoreError
    from s3ckpt.retention import RetentionOptions, gc
    from s3ckpt.store import Location
    from tests._retention_util import Clock, write_checkpoint

    class LosesAReply(MemoryStore):
        lost = 0

        def delete(self, keys):  # type: ignore[no-untyped-def]
            done = super().delete(keys)
            if not self.lost and any(".probe-" in k for k in keys):
                self.lost += 1
                raise TransientStoreError("reply lost", bucket=self.bucket, key=keys[0])
            return done

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    clock = Clock(t0)
    store = LosesAReply("bkt", clock=clock)
    write_checkpoint(store, RUN, 1, created=clock.t)
    probe = "run/s3ckpt.lease.probe-0123456789ab"
    store.put(probe, b"{}")
    clock.t += 600
    location = Location.of(RUN, store=store)
    options = RetentionOptions(
        now=t0 + timedelta(seconds=601), grace=timedelta(seconds=300), sleep=lambda _: None
    )
    result = gc(location, apply=True, options=options)
    assert store.lost == 1 and probe not in store.objects
    assert result.ok and result.leftovers_deleted == 1
    assert gc(location, options=options).leftovers == ()
