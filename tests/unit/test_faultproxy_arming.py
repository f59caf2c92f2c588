"""Which requests the fault proxy faults: the seeded random draw, ``max_faults``, arms (first
armed wins, the draw's sequence kept), and the arguments that configure them. Against the echo
upstream on loopback (tests/unit/_faultproxy_echo.py), no S3 server; arms aimed by operation
and key against moto are in tests/integration/test_faultproxy_arms_s3.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.faultproxy import ALL_FAULT_KINDS, FAULT_KINDS, FaultProxy
from tests.unit._faultproxy_echo import echo_server, get_statuses

# Validation only: a proxy that is never started never connects to its upstream.
UPSTREAM = "http://127.0.0.1:9"


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    with echo_server() as url:
        yield url


def test_max_faults_caps_injection(echo_url: str) -> None:
    with FaultProxy(echo_url, fault_rate=1.0, faults=["internal"], max_faults=2) as proxy:
        statuses = get_statuses(proxy, 5)
    assert statuses == [500, 500, 200, 200, 200]
    assert proxy.stats["internal"] == 2


def test_same_seed_same_fault_sequence(echo_url: str) -> None:
    def run(seed: int) -> list[int]:
        with FaultProxy(
            echo_url, fault_rate=0.5, faults=["internal", "slowdown"], seed=seed
        ) as proxy:
            return get_statuses(proxy, 30)

    first = run(3)
    assert first == run(3)
    assert {200, 500, 503} <= set(first)
    assert first != run(4)


def test_arm_beats_random_draw_and_max_faults(echo_url: str) -> None:
    with FaultProxy(echo_url, fault_rate=1.0, faults=["internal"], max_faults=0) as proxy:
        first = proxy.arm("*", "slowdown")
        second = proxy.arm("*", "internal", times=2)  # first armed wins the shared request
        statuses = get_statuses(proxy, 4, "/bucket/key")
    assert statuses == [503, 500, 200, 200]
    assert (first.hits, second.hits) == (1, 1)


def test_arm_keeps_random_sequence(echo_url: str) -> None:
    def run(arm: bool) -> list[int]:
        with FaultProxy(echo_url, fault_rate=0.5, faults=["internal"], seed=5) as proxy:
            if arm:
                proxy.arm("*", "slowdown", skip=3)
            return get_statuses(proxy, 20, "/b/k")

    plain, armed = run(False), run(True)
    assert armed[3] == 503
    assert armed[:3] + armed[4:] == plain[:3] + plain[4:]


def test_argument_validation() -> None:
    with pytest.raises(ValueError):
        FaultProxy(UPSTREAM, fault_rate=1.5)
    with pytest.raises(ValueError):
        FaultProxy(UPSTREAM, faults=["nope"])
    with pytest.raises(ValueError):
        FaultProxy(UPSTREAM, host="0.0.0.0")
    with pytest.raises(ValueError):
        FaultProxy("https://127.0.0.1:1")
    proxy = FaultProxy(UPSTREAM, fault_rate=0.0)
    with pytest.raises(ValueError):
        proxy.set_fault_rate(-0.1)
    assert set(proxy.stats) == {"requests", "forwarded", "faults", *FAULT_KINDS}


def test_new_argument_validation() -> None:
    with pytest.raises(ValueError):
        FaultProxy(UPSTREAM, ops=["PutObjects"])
    with pytest.raises(ValueError):
        FaultProxy(UPSTREAM, ops="PutObject")
    FaultProxy(UPSTREAM, faults=ALL_FAULT_KINDS)
    proxy = FaultProxy(UPSTREAM, fault_rate=0.0)
    with pytest.raises(ValueError):
        proxy.arm("Nope", "reset")
    with pytest.raises(ValueError):
        proxy.arm("PutObject", "nope")
    with pytest.raises(ValueError):
        proxy.arm("PutObject", "reset", times=0)
    assert set(ALL_FAULT_KINDS) > set(FAULT_KINDS)
    assert FAULT_KINDS == ("slowdown", "internal", "reset", "reset_mid_body")


def test_denied_answers_403_access_denied_without_forwarding(echo_url: str) -> None:
    import urllib.error
    import urllib.request

    with FaultProxy(echo_url, fault_rate=0.0) as proxy:
        proxy.arm("*", "denied")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(proxy.endpoint_url + "/bucket/key", timeout=10)
        body = info.value.read().decode()
        assert get_statuses(proxy, 1, "/bucket/key") == [200]  # armed once: then forwarded
    assert info.value.code == 403 and "<Code>AccessDenied</Code>" in body
    assert info.value.headers["Server"] == "FaultProxy" and proxy.stats["denied"] == 1
