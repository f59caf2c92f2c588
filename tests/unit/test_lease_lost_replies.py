"""The retention lease when a conditional PUT's reply is lost after S3 applied it.

Real HTTP to moto through FaultProxy: the proxy forwards the PUT, S3 applies it, and the
client sees a reset; S3Store retries and meets its own write (412). The lease must read
the state back and carry on, and two leases must still exclude each other.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.errors import LeaseHeldError
from s3ckpt.retention._lease import Lease
from s3ckpt.store.s3 import S3Store
from s3ckpt.uri import parse_url
from tests.faultproxy import FaultProxy

pytestmark = pytest.mark.integration

TC = TransferConfig(retry_initial_delay=0.01, retry_max_delay=0.02)


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_endpoint, fault_rate=0.0) as p:
        yield p


def _lease(proxy: FaultProxy, bucket: str, owner: str, **kw: object) -> Lease:
    store = S3Store(bucket, S3Config(endpoint_url=proxy.endpoint_url), TC)
    return Lease(store, parse_url(f"s3://{bucket}/run/"), owner=owner, **kw)  # type: ignore[arg-type]


def _body(s3_client: object, bucket: str) -> dict[str, object]:
    raw = s3_client.get_object(Bucket=bucket, Key="run/s3ckpt.lease")["Body"].read()  # type: ignore[attr-defined]
    return json.loads(raw)  # type: ignore[no-any-return]


def test_every_lease_step_survives_a_lost_reply(
    proxy: FaultProxy, bucket: str, s3_client: object
) -> None:
    now = [1000.0]
    lease = _lease(proxy, bucket, "a", ttl=timedelta(seconds=60), clock=lambda: now[0])

    armed = proxy.arm("PutObject", "lost_reply", conditional=True)
    lease.acquire()
    assert armed.hits == 1 and lease.held
    assert _body(s3_client, bucket)["owner"] == "a"

    armed = proxy.arm("PutObject", "lost_reply", conditional=True)
    lease.record_intent(["step-1", "step-2"])
    assert armed.hits == 1 and lease.held
    assert _body(s3_client, bucket)["deleting"] == ["step-1", "step-2"]

    now[0] += 45  # past half the TTL: renew_if_due writes
    armed = proxy.arm("PutObject", "lost_reply", conditional=True)
    lease.renew_if_due()
    assert armed.hits == 1 and lease.held
    assert _body(s3_client, bucket)["ttl"] == 60

    # The ETag we carry on with is the real one: a plain renew needs no read-back.
    now[0] += 45
    lease.renew_if_due()

    armed = proxy.arm("PutObject", "lost_reply", conditional=True)
    lease.release()
    assert armed.hits == 1 and not lease.held
    body = _body(s3_client, bucket)
    assert body["released"] is True and body["owner"] == "a"
    assert proxy.stats["lost_reply"] == 4


def test_takeover_survives_a_lost_reply(proxy: FaultProxy, bucket: str) -> None:
    first = _lease(proxy, bucket, "a").acquire()
    first.record_intent(["step-9"])
    # "a" dies without releasing; its lease expires. "b" takes over with If-Match.
    later = _lease(proxy, bucket, "b", store_clock=lambda: 10**10)
    # skip=1: the If-None-Match put (412) goes through; the If-Match takeover's reply is lost.
    armed = proxy.arm("PutObject", "lost_reply", conditional=True, skip=1)
    later.acquire()
    assert armed.hits == 1 and later.held
    assert later.previous is not None and later.previous.deleting == ("step-9",)


def test_leases_still_exclude_each_other(proxy: FaultProxy, bucket: str) -> None:
    armed = proxy.arm("PutObject", "lost_reply", conditional=True)
    holder = _lease(proxy, bucket, "a").acquire()
    assert armed.hits == 1
    rival = _lease(proxy, bucket, "b")
    with pytest.raises(LeaseHeldError) as info:
        rival.acquire()
    assert info.value.holder == "a"
    # A rival whose own reply is "lost" is not fooled into thinking it won.
    armed = proxy.arm("PutObject", "lost_reply", conditional=True)
    with pytest.raises(LeaseHeldError):
        _lease(proxy, bucket, "c").acquire()
    assert armed.hits == 1
    holder.renew_if_due()
    holder.record_intent(["x"])
    assert holder.held
    holder.release()
    _lease(proxy, bucket, "b").acquire()  # free again


def test_a_lost_lease_is_still_reported_lost(proxy: FaultProxy, bucket: str) -> None:
    from s3ckpt.errors import LeaseLostError

    now = [1000.0]
    a = _lease(proxy, bucket, "a", ttl=timedelta(seconds=60), clock=lambda: now[0]).acquire()
    now[0] += 120
    # took over the expired one (120 s later in the store's time)
    _lease(proxy, bucket, "b", store_clock=lambda: time.time() + 120).acquire()
    armed = proxy.arm("PutObject", "lost_reply", conditional=True)
    with pytest.raises(LeaseLostError):
        a.record_intent(["x"])  # 412 (its reply lost, then again): b's record is there
    assert armed.hits == 1
    assert not a.held
