"""What a save and a load cost in requests and clients, counted on the wire.

Every request goes through a :class:`~s3ckpt.testing.FaultProxy` (no faults) in front of
the moto server, whose hook sees each request's S3 operation and key; clients are counted
by a spy around botocore's ``Session.create_client`` that calls the real one. Each test
points at its own proxy port, so no client cached by an earlier test matches its settings.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any, cast

import botocore.session
import pytest
import torch
import torch.distributed.checkpoint as dcp

from s3ckpt import Checkpointer, S3Config, S3StorageReader, S3StorageWriter
from tests.faultproxy import FaultProxy

pytestmark = pytest.mark.integration


class Wire:
    """Requests seen by the proxy, as ``(operation, key)``, and S3 clients created."""

    def __init__(self) -> None:
        self.requests: Counter[tuple[str, str]] = Counter()
        self.clients = 0
        self._lock = threading.Lock()

    def hook(self, op: str, key: str, phase: str) -> None:
        if phase == "before":
            with self._lock:
                self.requests[(op, key)] += 1

    def of(self, key: str) -> dict[str, int]:
        """``{operation: count}`` of the requests for ``key``."""
        return {op: n for (op, k), n in self.requests.items() if k == key}

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.clients = 0


@pytest.fixture
def wire(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Wire, S3Config]]:
    """The counters, and an S3Config whose endpoint is a fresh counting proxy."""
    seen = Wire()
    real = botocore.session.Session.create_client

    def counting(self: Any, service_name: str, *args: Any, **kwargs: Any) -> Any:
        if service_name == "s3":
            seen.clients += 1
        return real(self, service_name, *args, **kwargs)

    monkeypatch.setattr(botocore.session.Session, "create_client", counting)
    with FaultProxy(moto_endpoint, fault_rate=0.0, hook=seen.hook) as proxy:
        # The protocol's own requests: verify-after-write (auto on moto) adds a read of
        # everything saved and of the marker, counted in test_wire_faults.py.
        yield seen, S3Config(endpoint_url=proxy.endpoint_url, verify_after_write=False)


def _state() -> dict[str, Any]:
    return {"w": torch.arange(64.0).reshape(8, 8), "step": 4, "hp": {"lr": 0.1}}


def test_dcp_save_naming_its_checkpoint_id_reads_the_marker_once(
    bucket: str, wire: tuple[Wire, S3Config]
) -> None:
    seen, cfg = wire
    url = f"s3://{bucket}/run/step_4"  # no trailing slash: dcp.save resets the writer to it
    dcp.save(_state(), checkpoint_id=url, storage_writer=S3StorageWriter(url, s3_config=cfg))
    marker = "run/step_4/s3ckpt.json"
    # One fail-fast read (constructing the writer), one read by the commit (its HEAD finds
    # nothing), one conditional PUT: the commit point.
    assert seen.of(marker) == {"GetObject": 1, "HeadObject": 1, "PutObject": 1}
    assert seen.of("run/step_4/.metadata") == {"PutObject": 1}
    assert seen.clients == 1


def test_dcp_load_naming_its_checkpoint_id_reads_marker_records_and_metadata_once(
    bucket: str, wire: tuple[Wire, S3Config]
) -> None:
    seen, cfg = wire
    url = f"s3://{bucket}/run/step_4"
    sd = _state()
    dcp.save(sd, storage_writer=S3StorageWriter(url, s3_config=cfg))
    seen.reset()
    out = {"w": torch.zeros(8, 8), "step": 0, "hp": {"lr": 0.0}}
    reader = S3StorageReader(url, s3_config=cfg)
    dcp.load(out, checkpoint_id=url, storage_reader=reader)
    assert torch.equal(out["w"], sd["w"]) and out["hp"] == {"lr": 0.1}
    assert seen.of("run/step_4/s3ckpt.json") == {"GetObject": 1}
    assert seen.of("run/step_4/.metadata") == {"GetObject": 1}
    records = [k for (op, k) in seen.requests if k.startswith("run/step_4/s3ckpt.items.")]
    assert len(records) == 1 and seen.requests[("GetObject", records[0])] == 1
    data = [k for (op, k) in seen.requests if k.endswith(".distcp")]
    assert len(data) == 1 and seen.requests[("GetObject", data[0])] == 1
    assert sum(seen.requests.values()) == 4  # nothing else: no LIST, no HEAD
    assert seen.clients == 0  # the save's client serves the load


def test_one_client_per_process_for_a_checkpointer_and_a_separate_reader(
    bucket: str, wire: tuple[Wire, S3Config]
) -> None:
    seen, cfg = wire
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Checkpointer(f"s3://{bucket}/ck", s3_config=cfg) as ckpt:
        ckpt.save(1, model, opt)
        save_requests = dict(seen.requests)
        seen.requests.clear()
        assert ckpt.load(torch.nn.Linear(4, 3), None) == 1
        load_requests = dict(seen.requests)
        reader = S3StorageReader(f"s3://{bucket}/ck/step_000000001", s3_config=cfg)
        # Equal settings in one process: one store (the Location cache), so one client.
        assert reader.store is ckpt.store
        assert cast(Any, reader.store).client is cast(Any, ckpt.store).client
    assert seen.clients == 1
    marker = "ck/step_000000001/s3ckpt.json"
    assert {op: n for (op, k), n in save_requests.items() if k == marker} == {
        "GetObject": 1,
        "HeadObject": 1,
        "PutObject": 1,
    }
    # The load: one GET of the latest pointer, one LIST after it, one GET of the run's
    # s3ckpt.check.json (404) and one of the marker the pointer names (the pointer is a
    # hint; the marker judged as the catalog judges it), then the reader's one GET of the
    # marker and .metadata.
    assert load_requests[("GetObject", "ck/s3ckpt.latest.json")] == 1
    assert load_requests[("GetObject", "ck/s3ckpt.check.json")] == 1
    assert ("HeadObject", "ck/s3ckpt.latest.json") not in load_requests
    assert {op: n for (op, k), n in load_requests.items() if k == marker} == {"GetObject": 2}
    assert load_requests[("GetObject", "ck/step_000000001/.metadata")] == 1


def test_the_capability_probe_costs_five_requests_once_per_endpoint(
    bucket: str, wire: tuple[Wire, S3Config]
) -> None:
    """The first save per (endpoint, bucket) and process probes conditional writes on its
    coordinator heartbeat (s3ckpt.store._capabilities): HEAD (404), the heartbeat created
    with If-None-Match, If-None-Match again (412), If-Match with a wrong ETag (412), one
    ListMultipartUploads (the races are doctor's). The second save on the same endpoint
    makes none of them."""
    from s3ckpt.store._capabilities import clear_capabilities_cache

    seen, cfg = wire
    clear_capabilities_cache()

    def save(step: int) -> dict[tuple[str, str], int]:
        seen.reset()
        url = f"s3://{bucket}/run/step_{step}"
        dcp.save(_state(), storage_writer=S3StorageWriter(url, s3_config=cfg))
        return {
            (op, "heartbeat" if "s3ckpt.alive." in k else k): n
            for (op, k), n in seen.requests.items()
            if "s3ckpt.alive." in k or op == "ListMultipartUploads"
        }

    first, second = save(1), save(2)
    probe = {
        ("HeadObject", "heartbeat"): 1,
        ("PutObject", "heartbeat"): 3,
        ("ListMultipartUploads", ""): 1,  # the proxy names no key: the prefix is a query
    }
    assert Counter(first) - Counter(second) == Counter(probe), (first, second)
    assert not any(op == "ListMultipartUploads" for op, _ in second)
