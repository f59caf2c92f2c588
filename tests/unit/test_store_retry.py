"""The one retry policy (``s3ckpt.store.retry``) and the exception table it retries on.

Strategies are asked directly with tenacity states and a fake clock where time matters,
as tenacity's own tests do; the deleter's rounds run against a MemoryStore.
"""

from __future__ import annotations

import http.client
import time
from collections.abc import Iterator

import botocore.exceptions as bce
import pytest
import urllib3.exceptions as u3e
from tenacity import RetryCallState, retry_if_exception, retry_if_exception_type

from s3ckpt.config import TransferConfig
from s3ckpt.errors import TransientStoreError
from s3ckpt.retention import RetentionOptions
from s3ckpt.retention._deleter import Deleter
from s3ckpt.store import MemoryStore
from s3ckpt.store._errors import _ERROR_TABLE, is_transient, map_error, timeout_kind
from s3ckpt.store.retry import TRANSIENT_CODES, retrying


class _Flaky:
    """Raises ``exc`` ``times`` times, then returns ``"ok"``; counts calls."""

    def __init__(self, exc: Exception, times: int) -> None:
        self.exc, self.left, self.calls = exc, times, 0

    def __call__(self) -> str:
        self.calls += 1
        if self.left:
            self.left -= 1
            raise self.exc
        return "ok"


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Clock]:
    c = _Clock()
    monkeypatch.setattr(time, "monotonic", c)  # tenacity's clock and the policy's
    yield c


def _state(attempt: int, exc: BaseException, since_start: float) -> RetryCallState:
    # A real retry state as tenacity builds it, with its clock set where the test needs it.
    state = RetryCallState(retrying(retry=retry_if_exception(is_transient)), None, (), {})
    state.attempt_number = attempt
    state.set_exception((type(exc), exc, None))
    state.start_time = 0.0
    state.outcome_timestamp = since_start
    return state


def test_transient_codes_are_the_error_tables_transient_entries() -> None:
    assert {c for c, (cls, _) in _ERROR_TABLE.items() if cls is TransientStoreError} == set(
        TRANSIENT_CODES
    )


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (u3e.ProtocolError("reset", ConnectionResetError()), True),
        (u3e.ReadTimeoutError(None, "/k", "read timed out"), True),
        (http.client.IncompleteRead(b"x", 10), True),
        (u3e.IncompleteRead(1, 10), True),
        (bce.ConnectTimeoutError(endpoint_url="http://x"), True),
        (bce.ReadTimeoutError(endpoint_url="http://x"), True),
        (bce.ResponseStreamingError(error="reset"), True),
        (bce.IncompleteReadError(actual_bytes=1, expected_bytes=2), True),
        (ConnectionResetError(), True),
        (BrokenPipeError(), True),
        (TimeoutError(), True),
        (bce.EndpointConnectionError(endpoint_url="http://x"), False),
        (ValueError("x"), False),
        (type("ProtocolError", (Exception,), {})(), False),  # a name alone is not a type
        (TransientStoreError("given up"), False),
    ],
)
def test_is_transient_goes_by_exception_type(exc: BaseException, transient: bool) -> None:
    assert is_transient(exc) is transient


def test_timeout_kind_by_type_through_wrapping() -> None:
    assert timeout_kind(bce.ConnectTimeoutError(endpoint_url="u")) == "connect"
    inner = u3e.ReadTimeoutError(None, "/k", "read timed out")
    assert timeout_kind(bce.ResponseStreamingError(error=inner)) == "read"  # botocore kwargs
    outer = RuntimeError("outer")
    outer.__cause__ = TimeoutError()
    assert timeout_kind(outer) == "read"
    assert timeout_kind(bce.ResponseStreamingError(error=ConnectionResetError())) is None
    assert timeout_kind(None) is None


def test_map_error_keeps_codes_and_messages() -> None:
    exc = bce.ClientError({"Error": {"Code": "SlowDown"}, "ResponseMetadata": {}}, "PutObject")
    err = map_error(exc, operation="put", bucket="b", key="k", endpoint=None, attempts=8)
    assert type(err) is TransientStoreError and err.code == "SlowDown"
    assert str(err).startswith("put failed with SlowDown (HTTP 0) after 8 attempts: ")
    reset = map_error(
        u3e.ProtocolError("x"), operation="get", bucket="b", key="k", endpoint=None, attempts=3
    )
    assert type(reset) is TransientStoreError and reset.code == "ProtocolError"


def test_stops_after_max_attempts_and_reraises_the_last_error() -> None:
    sleeps: list[float] = []
    flaky = _Flaky(ConnectionResetError("reset"), times=10)
    policy = retrying(
        TransferConfig(max_attempts=4, retry_initial_delay=0.5, retry_max_delay=1.5),
        retry=retry_if_exception(is_transient),
        sleep=sleeps.append,
    )
    with pytest.raises(ConnectionResetError):
        policy(flaky)
    assert flaky.calls == 4 and len(sleeps) == 3
    assert all(0 <= s <= cap for s, cap in zip(sleeps, [0.5, 1.0, 1.5], strict=True))


def test_not_retried_error_is_raised_at_once() -> None:
    flaky = _Flaky(ValueError("bad"), times=1)
    with pytest.raises(ValueError):
        retrying(retry=retry_if_exception(is_transient), sleep=lambda s: None)(flaky)
    assert flaky.calls == 1


def test_attempts_used_count_and_keep_growing_the_back_off() -> None:
    sleeps: list[float] = []
    flaky = _Flaky(ConnectionResetError(), times=10)
    tc = TransferConfig(max_attempts=6, retry_initial_delay=1.0, retry_max_delay=100.0)
    policy = retrying(
        tc, retry=retry_if_exception_type(), sleep=sleeps.append, attempts_used=3, deadline=False
    )
    with pytest.raises(ConnectionResetError):
        policy(flaky)
    assert flaky.calls == 3  # attempts 4, 5 and 6 of 6
    # attempt 4 of one long loop backs off up to 1 * 2**3, attempt 5 up to 2**4
    state = _state(1, ConnectionResetError(), 0.0)
    waits = [policy.wait(state) for _ in range(200)]
    assert max(waits) <= 8.0 and max(waits) > 4.0


def test_deadline_stops_after_a_timeout_that_could_not_end_in_time() -> None:
    tc = TransferConfig(read_timeout=20.0, request_deadline=50.0)
    policy = retrying(tc, retry=retry_if_exception_type(), timeout_kind=timeout_kind)
    timeout = bce.ReadTimeoutError(endpoint_url="u")
    # 25 s spent + one more 20 s attempt ends before 50 s: go on; at 31 s it would not.
    assert not policy.stop(_state(2, timeout, 25.0))
    assert policy.stop(_state(2, timeout, 31.0))
    # A quick failure is retried until the deadline itself.
    reset = ConnectionResetError()
    assert not policy.stop(_state(2, reset, 49.0))
    assert policy.stop(_state(2, reset, 50.0))
    # Without a classifier, or without the deadline, a timeout is a quick failure.
    assert not retrying(tc, retry=retry_if_exception_type()).stop(_state(2, timeout, 31.0))
    no_deadline = retrying(tc, retry=retry_if_exception_type(), deadline=False)
    assert not no_deadline.stop(_state(2, reset, 500.0))


def test_deadline_counts_from_since(clock: _Clock) -> None:
    tc = TransferConfig(max_attempts=100, request_deadline=10.0, retry_max_delay=0.1)
    flaky = _Flaky(ConnectionResetError(), times=1000)
    t0 = clock.now
    policy = retrying(tc, retry=retry_if_exception_type(), sleep=clock.sleep, since=t0 - 9.5)
    with pytest.raises(ConnectionResetError):
        policy(flaky)
    # Half a second of the deadline was left: stopped by it, not by max_attempts.
    assert flaky.calls < 100 and clock.now - t0 <= 0.5


def test_deleter_retries_transient_keys_in_jittered_rounds() -> None:
    store = MemoryStore()
    for i in range(4):
        store.put(f"k{i}", b"x")
    store.inject(
        "delete_key",
        lambda k: TransientStoreError("slow down", key=k, code="SlowDown"),
        key_glob="k1",
        times=100,
    )
    sleeps: list[float] = []
    deleter = Deleter(store, None, RetentionOptions(batch_size=2, retries=3, sleep=sleeps.append))
    assert deleter.delete([f"k{i}" for i in range(4)], "data") == {"k1"}
    assert deleter.requests == 2 + 3  # the first round's two batches, then k1 alone 3 times
    assert len(sleeps) == 3 and all(
        0 <= s <= c for s, c in zip(sleeps, [0.1, 0.2, 0.4], strict=True)
    )
    assert [f.code for f in deleter.failures] == ["SlowDown"]
    assert [k for k in ("k0", "k2", "k3") if store.head(k) is not None] == []
