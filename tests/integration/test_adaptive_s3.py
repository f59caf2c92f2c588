"""Adaptive back-off and derived concurrency, over HTTP to moto through FaultProxy.

* A save whose requests are answered ``503 SlowDown`` for a while completes, loads back,
  and the process's limiter for that endpoint and bucket counted every throttled attempt
  the proxy injected and narrowed its window (and said so, once per interval, in the log).
* The HTTP connection pool is sized from the connection count derived from the throughput
  target, and an explicit ``max_concurrency`` still wins.

Each test points at its own proxy port, so its limiter and client are its own.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from s3ckpt import S3Config, S3StorageReader, S3StorageWriter, TransferConfig
from s3ckpt.config import MiB
from s3ckpt.store.s3 import S3Store
from tests._helpers import assert_same, open_uploads, seeded, zeros_like_state
from tests.faultproxy import FaultProxy

pytestmark = pytest.mark.integration


def _state() -> dict[str, Any]:
    g = seeded(3)
    sd: dict[str, Any] = {f"layer{i}": torch.randn(256, 256, generator=g) for i in range(8)}
    sd["big"] = torch.randn(3 * 1024, 1024, generator=g)  # 12 MiB: a few 5 MiB parts
    sd["step"] = 7
    return sd


def test_a_save_under_slowdown_completes_and_the_window_narrows(
    bucket: str, moto_endpoint: str, s3_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    tc = TransferConfig(
        part_size=5 * MiB,
        max_concurrency=4,
        target_object_size=4 * MiB,
        retry_initial_delay=0.01,
        retry_max_delay=0.1,
    )
    sd = _state()
    with FaultProxy(moto_endpoint, fault_rate=0.0, faults=("slowdown",)) as proxy:
        # Requests 3 to 8, whatever they are, are throttled: a burst of congestion.
        burst = proxy.arm("*", "slowdown", times=6, skip=2)
        cfg = S3Config(endpoint_url=proxy.endpoint_url)
        url = f"s3://{bucket}/throttled/step_7"
        with caplog.at_level(logging.INFO, logger="s3ckpt.store._adaptive"):
            dcp.save(sd, storage_writer=S3StorageWriter(url, s3_config=cfg, transfer_config=tc))
        injected = proxy.stats["slowdown"]
        stats = S3Store(bucket, cfg, tc).throttle_stats()  # the writer's limiter: shared
        out = zeros_like_state(sd)
        dcp.load(out, storage_reader=S3StorageReader(url, s3_config=cfg, transfer_config=tc))
    assert_same(sd, out)
    assert open_uploads(s3_client, bucket) == []
    assert burst.hits == injected == 6
    assert stats is not None
    assert stats.throttles == injected  # every throttled attempt was seen by the limiter
    assert 1 <= stats.decreases <= stats.throttles
    assert stats.ceiling == 4 and stats.in_flight == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "s3ckpt.store._adaptive"]
    assert lines and f"s3://{bucket} at 127.0.0.1" in lines[0], lines
    assert "4 request(s) in flight ->" in lines[0], lines


def test_the_pool_is_sized_from_the_derived_concurrency(bucket: str, moto_endpoint: str) -> None:
    cfg = S3Config(endpoint_url=moto_endpoint)
    derived = S3Store(bucket, cfg)
    assert TransferConfig().concurrency == 14 and TransferConfig().read_concurrency == 28
    assert derived.client.meta.config.max_pool_connections == 28 + 4  # a load's connections
    slow = S3Store(bucket, cfg, TransferConfig(target_throughput_gbps=1.0))
    assert slow.client.meta.config.max_pool_connections == 4 + 4
    pinned = S3Store(bucket, cfg, TransferConfig(max_concurrency=5, target_throughput_gbps=1.0))
    assert pinned.client.meta.config.max_pool_connections == 5 + 4
    slow.put("k", b"x")  # and the client works
    assert slow.get("k") == b"x"
    assert slow.throttle_stats() is not None and slow.throttle_stats().throttles == 0  # type: ignore[union-attr]
