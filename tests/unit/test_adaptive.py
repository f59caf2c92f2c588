"""The adaptive limiter (AIMD on throttling) and the connection count derived from a
throughput target.

The limiter runs on a fake clock: its sleeps move the clock and are recorded, so pacing is
checked to the exact start times, and nothing here waits on real time except the thread
test (which asserts a bound, never a speed).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import pickle
import threading
import time

import botocore.exceptions as bce
import pytest
from tenacity import retry_if_exception_type

from s3ckpt.config import (
    MAX_DERIVED_CONCURRENCY,
    UPLOAD_MEMORY_BOUND,
    MiB,
    S3Config,
    TransferConfig,
)
from s3ckpt.errors import ConfigError, TransientStoreError
from s3ckpt.store._adaptive import (
    LOG_INTERVAL,
    MIN_RATE,
    AdaptiveLimiter,
    Slot,
    forget_limiters,
    shared_limiter,
)
from s3ckpt.store._errors import is_throttle, timeout_kind
from s3ckpt.store._request import call
from s3ckpt.store.retry import THROTTLE_CODES, TRANSIENT_CODES, RetryPolicy, retrying
from s3ckpt.store.s3 import S3Store


class FakeClock:
    """A monotonic clock that moves only when told to, or when something sleeps on it."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def _never_sleep(seconds: float) -> None:
    raise AssertionError(f"slept {seconds} s")


def _limiter(ceiling: int, clock: FakeClock | None = None) -> AdaptiveLimiter:
    clock = clock or FakeClock()
    return AdaptiveLimiter(ceiling, name="s3://bkt", clock=clock, sleep=clock.sleep)


def _throttle_once(lim: AdaptiveLimiter, clock: FakeClock | None = None) -> None:
    """One attempt, alone in flight, throttled: one congestion event."""
    slot = lim.acquire()
    if clock is not None:
        clock.advance(0.1)
    lim.throttled(slot)


def _client_error(code: str, status: int) -> bce.ClientError:
    return bce.ClientError(
        {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject"
    )


# -- nothing throttled: free ------------------------------------------------------------------
def test_an_unthrottled_limiter_never_waits_nor_sleeps() -> None:
    lim = AdaptiveLimiter(4, clock=FakeClock(), sleep=_never_sleep)
    slots = [lim.acquire() for _ in range(10)]  # more than the ceiling: nothing holds them
    assert all(s.queued == 0 for s in slots)
    for s in slots:
        lim.succeeded(s)
    stats = lim.stats()
    assert (stats.limited, stats.window, stats.rate, stats.in_flight) == (False, 4.0, None, 0)
    assert (stats.throttles, stats.decreases) == (0, 0)


# -- multiplicative decrease ------------------------------------------------------------------
def test_throttles_of_one_congestion_event_decrease_the_window_once() -> None:
    lim = _limiter(8)
    slots = [lim.acquire() for _ in range(8)]
    for s in slots:
        lim.throttled(s)
    stats = lim.stats()
    assert (stats.throttles, stats.decreases, stats.window, stats.limited) == (8, 1, 4.0, True)


def test_a_throttle_of_an_attempt_started_after_the_decrease_is_a_new_event() -> None:
    lim = _limiter(8)
    old = [lim.acquire() for _ in range(8)]
    lim.throttled(old[7])  # 8 -> 4
    for s in old[2:7]:
        lim.failed(s)  # two of the old attempts are still in flight
    new = lim.acquire()  # started after the decrease
    lim.throttled(old[1])  # the same event as the first: counted only
    assert lim.stats().decreases == 1
    lim.throttled(new)  # a new event: halves the two in flight (old[0] and itself)
    stats = lim.stats()
    assert (stats.throttles, stats.decreases, stats.window) == (3, 2, 1.0)
    lim.failed(old[0])


def test_the_window_halves_what_is_in_flight_when_that_is_less() -> None:
    lim = _limiter(16)
    slots = [lim.acquire() for _ in range(6)]
    lim.throttled(slots[0])
    assert lim.stats().window == 3.0


def test_the_window_stops_at_one_and_pacing_takes_over() -> None:
    clock = FakeClock()
    lim = _limiter(4, clock)
    for _ in range(3):
        _throttle_once(lim, clock)
    stats = lim.stats()
    assert stats.window == 1.0
    assert stats.rate is not None and stats.decreases == 3


# -- pacing -----------------------------------------------------------------------------------
def _paced(clock: FakeClock) -> AdaptiveLimiter:
    """A limiter at window 1 whose starts came every 0.1 s, then throttled: 5 starts/s."""
    lim = _limiter(2, clock)
    _throttle_once(lim, clock)  # window 2 -> 1
    for _ in range(12):
        slot = lim.acquire()
        clock.advance(0.1)
        lim.failed(slot)  # neither grows nor shrinks anything
    assert lim.stats().rate is None
    _throttle_once(lim, clock)  # at window 1: pacing at half the rate observed (10/s)
    return lim


def test_pacing_spaces_request_starts_at_its_rate() -> None:
    clock = FakeClock()
    lim = _paced(clock)
    rate = lim.stats().rate
    assert rate is not None and rate == pytest.approx(5.0, rel=0.05)
    throttled_at = clock.now
    starts = []
    for _ in range(3):
        slot = lim.acquire()
        starts.append(slot.started)
        lim.failed(slot)
    assert starts[0] == pytest.approx(throttled_at + 1 / rate)
    assert [b - a for a, b in itertools.pairwise(starts)] == pytest.approx([1 / rate] * 2)
    assert sum(clock.sleeps) == pytest.approx(3 / rate)  # slept by the limiter, on its clock


def test_pacing_sleeps_with_the_callers_sleep_when_given() -> None:
    clock = FakeClock()
    lim = _paced(clock)
    mine: list[float] = []
    slot = lim.acquire(mine.append)
    assert mine and slot.queued == pytest.approx(mine[0])
    lim.failed(slot)


def test_pacing_halves_per_event_down_to_its_floor() -> None:
    clock = FakeClock()
    lim = _paced(clock)
    rate = lim.stats().rate
    assert rate is not None
    _throttle_once(lim)
    assert lim.stats().rate == pytest.approx(rate / 2)
    for _ in range(40):
        _throttle_once(lim)
    assert lim.stats().rate == MIN_RATE
    assert lim.stats().window == 1.0


# -- additive increase ------------------------------------------------------------------------
def test_successes_grow_the_window_back_to_the_ceiling_and_unlimit() -> None:
    lim = _limiter(8)
    slots = [lim.acquire() for _ in range(8)]
    lim.throttled(slots[0])  # window 4
    for s in slots[1:]:
        lim.succeeded(s)  # started before the decrease: no growth
    assert lim.stats().window == 4.0
    successes = 0
    while lim.stats().limited:
        lim.succeeded(lim.acquire())
        successes += 1
        assert successes < 100
    # ~one slot per window of successes: 4 + 5 + 6 + 7 from 4 to 8.
    assert 18 <= successes <= 24
    assert lim.stats().window == 8.0


def test_pacing_grows_back_in_seconds_then_the_window_grows() -> None:
    clock = FakeClock()
    lim = _paced(clock)  # 5 starts/s, half of the 10/s observed one at a time
    throttled_at = clock.now
    successes = 0
    while lim.stats().rate is not None:
        slot = lim.acquire()  # each start waits its turn on the fake clock
        clock.advance(0.1)  # answered in 0.1 s: one at a time makes 10/s
        lim.succeeded(slot)
        successes += 1
        assert successes < 1000
    # 10/s more per RATE_RECOVERY (2 s): from 5/s to 20/s (twice the observed) in ~3 s.
    assert 2.5 <= clock.now - throttled_at <= 3.5
    assert lim.stats().window == 1.0 and lim.stats().limited
    lim.succeeded(lim.acquire())  # window 1 + 1/1: back at the ceiling
    assert lim.stats().window == 2.0 and not lim.stats().limited


def test_pacing_at_its_floor_doubles_per_success_and_recovers_within_seconds() -> None:
    clock = FakeClock()
    lim = _paced(clock)
    while lim.stats().rate != MIN_RATE:
        _throttle_once(lim)
    slot = lim.acquire()
    clock.advance(0.1)
    lim.succeeded(slot)
    assert lim.stats().rate == 2 * MIN_RATE  # no leap past what was throttled
    started = clock.now
    while lim.stats().rate is not None:
        slot = lim.acquire()
        clock.advance(0.1)
        lim.succeeded(slot)
        assert clock.now - started < 60
    assert clock.now - started < 5  # seconds, not minutes


def test_a_rate_that_grew_shortens_the_wait_for_the_next_start() -> None:
    clock = FakeClock()
    lim = _paced(clock)
    while lim.stats().rate != MIN_RATE:
        _throttle_once(lim)
    first = lim.acquire()
    clock.advance(0.1)
    lim.succeeded(first)  # 1/s -> 2/s
    second = lim.acquire()
    assert second.started == pytest.approx(first.started + 1 / (2 * MIN_RATE))
    lim.failed(second)


def test_failures_other_than_throttling_change_nothing() -> None:
    lim = _limiter(8)
    slots = [lim.acquire() for _ in range(8)]
    lim.throttled(slots[0])
    before = lim.stats()
    for s in slots[1:]:
        lim.failed(s)
    after = lim.stats()
    assert (after.window, after.decreases, after.in_flight) == (before.window, 1, 0)


# -- threads ----------------------------------------------------------------------------------
def test_threads_never_have_more_attempts_in_flight_than_the_window() -> None:
    lim = AdaptiveLimiter(8)
    slots = [lim.acquire() for _ in range(4)]
    lim.throttled(slots[0])  # window 2
    for s in slots[1:]:
        lim.failed(s)
    assert lim.stats().window == 2.0
    lock = threading.Lock()
    in_flight = 0
    peak = 0
    done = 0

    def work() -> None:
        nonlocal in_flight, peak, done
        for _ in range(25):
            slot = lim.acquire()
            with lock:
                in_flight += 1
                peak = max(peak, in_flight)
            time.sleep(0.001)  # hold the slot so others pile up behind it
            with lock:
                in_flight -= 1
                done += 1
            lim.failed(slot)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a thread never got a slot"
    assert done == 200 and 1 <= peak <= 2
    assert lim.stats().in_flight == 0


def test_a_waiting_thread_starts_when_a_slot_is_given_back() -> None:
    lim = AdaptiveLimiter(2)
    first, second = lim.acquire(), lim.acquire()
    lim.throttled(first)  # window 1; `second` still holds the only slot
    got: list[Slot] = []
    waiter = threading.Thread(target=lambda: got.append(lim.acquire()))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and not got  # waiting for the window
    lim.failed(second)
    waiter.join(10)
    assert got and got[0].queued > 0
    lim.failed(got[0])


# -- logging ----------------------------------------------------------------------------------
def test_one_info_line_per_interval_without_credentials(caplog: pytest.LogCaptureFixture) -> None:
    forget_limiters()
    lim = shared_limiter("http://user:secret@store.example:9000", "bkt", 16)
    clock = FakeClock()
    lim._clock = clock  # the shared one, on a fake clock
    with caplog.at_level(logging.INFO, logger="s3ckpt.store._adaptive"):
        for _ in range(3):
            _throttle_once(lim)
        assert len(caplog.records) == 1
        clock.advance(LOG_INTERVAL)
        _throttle_once(lim)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "s3://bkt at store.example:9000" in lines[0] and "16 request(s) in flight" in lines[0]
    assert "2 more decrease(s)" in lines[1]
    assert not any("secret" in line or "user" in line for line in lines)
    forget_limiters()


# -- one limiter per (endpoint, bucket) -------------------------------------------------------
def test_stores_of_one_endpoint_and_bucket_share_a_limiter() -> None:
    forget_limiters()
    cfg = S3Config(endpoint_url="http://127.0.0.1:1")
    a = S3Store("bkt", cfg, TransferConfig(max_concurrency=4))
    b = S3Store("bkt", cfg, TransferConfig(max_concurrency=6))
    other = S3Store("other", cfg)
    assert a.limiter is not None and a.limiter is b.limiter
    assert a.limiter is not other.limiter
    assert a.limiter.stats().ceiling == 6  # the most threads of the stores using it
    assert pickle.loads(pickle.dumps(a)).limiter is a.limiter  # same process, same limiter
    forget_limiters()
    assert S3Store("bkt", cfg).limiter is not a.limiter


def test_adaptive_off_means_no_limiter() -> None:
    store = S3Store(
        "bkt", S3Config(endpoint_url="http://127.0.0.1:1"), TransferConfig(adaptive=False)
    )
    assert store.limiter is None and store.throttle_stats() is None
    on = S3Store("bkt", S3Config(endpoint_url="http://127.0.0.1:1"))
    stats = on.throttle_stats()
    assert stats is not None and stats.ceiling == TransferConfig().read_concurrency


# -- the request loop -------------------------------------------------------------------------
def test_only_throttling_answers_count_as_throttles() -> None:
    assert THROTTLE_CODES <= TRANSIENT_CODES
    assert is_throttle(_client_error("SlowDown", 503))
    assert is_throttle(_client_error("ServiceUnavailable", 503))
    assert is_throttle(_client_error("", 503))
    assert is_throttle(_client_error("ThrottlingException", 400))
    assert not is_throttle(_client_error("InternalError", 500))
    assert not is_throttle(_client_error("RequestTimeout", 400))
    assert not is_throttle(ConnectionResetError())
    assert not is_throttle(bce.ReadTimeoutError(endpoint_url="http://x"))


def _run(errors: list[BaseException], limiter: AdaptiveLimiter | None) -> int:
    def fn() -> str:
        if errors:
            raise errors.pop(0)
        return "ok"

    tc = TransferConfig(max_attempts=10)
    result, attempts = call(
        fn,
        operation="put",
        bucket="bkt",
        key="k",
        endpoint=None,
        config=tc,
        policy=RetryPolicy.of(tc, timeout_kind=timeout_kind, sleep=lambda s: None),
        limiter=limiter,
    )
    assert result == "ok"
    return attempts


def test_each_attempt_reports_its_outcome_to_the_limiter() -> None:
    lim = AdaptiveLimiter(8)
    errors: list[BaseException] = [
        _client_error("SlowDown", 503),
        _client_error("InternalError", 500),
        ConnectionResetError(),
        _client_error("SlowDown", 503),
    ]
    assert _run(errors, lim) == 5
    stats = lim.stats()
    # Two throttles, each on an attempt started after the previous decrease: two events.
    assert (stats.throttles, stats.decreases, stats.in_flight) == (2, 2, 0)
    assert stats.window == 1.0 and stats.rate is not None


def test_without_a_limiter_the_request_loop_is_unchanged() -> None:
    assert _run([_client_error("SlowDown", 503)] * 3, None) == 4


def test_a_request_that_keeps_being_throttled_fails_and_gives_every_slot_back() -> None:
    lim = AdaptiveLimiter(4)
    with pytest.raises(TransientStoreError, match="SlowDown"):
        _run([_client_error("SlowDown", 503)] * 10, lim)
    assert lim.stats().in_flight == 0 and lim.stats().throttles == 10


def test_time_queued_for_the_limiter_does_not_count_towards_the_deadline() -> None:
    tc = TransferConfig(max_attempts=5, request_deadline=1.0, retry_initial_delay=0.0)
    long_ago = time.monotonic() - 30.0  # the deadline passed long ago...

    def attempts_made(queued: float) -> int:
        n = 0
        policy = retrying(
            tc,
            retry=retry_if_exception_type(ConnectionResetError),
            sleep=lambda s: None,
            since=long_ago,
            queued=lambda: queued,
        )
        with pytest.raises(ConnectionResetError):
            for attempt in policy:
                with attempt:
                    n += 1
                    raise ConnectionResetError
        return n

    assert attempts_made(0.0) == 1
    assert attempts_made(30.0) == 5  # ...unless it was all spent queued


# -- connections from a throughput target -----------------------------------------------------
def test_the_default_throughput_target_derives_14_connections_within_160_mib() -> None:
    tc = TransferConfig()
    assert tc.target_throughput_gbps == 10.0
    assert tc.concurrency == tc.max_concurrency == math.ceil(10e9 / 8 / 90e6) == 14
    assert tc.read_concurrency == 28  # loads: twice the connections, no buffers
    assert tc.max_inflight_bytes == 9 * 16 * MiB and tc.max_inflight_parts == 9
    assert tc.max_inflight_bytes + tc.part_size == 160 * MiB == UPLOAD_MEMORY_BOUND


def test_an_explicit_concurrency_is_also_the_read_concurrency() -> None:
    assert TransferConfig(max_concurrency=5).read_concurrency == 5
    assert TransferConfig(target_throughput_gbps=1.0).read_concurrency == 4  # 2 x 2
    assert TransferConfig(target_throughput_gbps=400.0).read_concurrency == MAX_DERIVED_CONCURRENCY


@pytest.mark.parametrize(
    ("tc", "want"),
    [
        (TransferConfig(part_size=5 * MiB, target_throughput_gbps=2.0), 6),  # 3 derived, twice
        (TransferConfig(part_size=5 * MiB, max_concurrency=4), 4),  # given: wins
    ],
)
def test_a_save_uploads_its_parts_on_the_read_concurrency(tc: TransferConfig, want: int) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    from s3ckpt import S3StorageWriter
    from s3ckpt.store import MemoryStore

    class Counting(MemoryStore):
        """Notes the most part uploads in flight at once (each held 20 ms)."""

        def __init__(self) -> None:
            super().__init__()
            self.now = self.most = 0
            self.lock = threading.Lock()

        def upload_part(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            with self.lock:
                self.now += 1
                self.most = max(self.most, self.now)
            time.sleep(0.02)
            with self.lock:
                self.now -= 1
            return super().upload_part(*args, **kwargs)

    assert tc.read_concurrency == want
    store = Counting()
    state = {"w": torch.ones(12 * 5 * MiB // 4)}  # 12 parts of one tensor, from its memory
    dcp.save(
        state, storage_writer=S3StorageWriter("s3://memory/r/s", store=store, transfer_config=tc)
    )
    assert store.most == want


@pytest.mark.parametrize("gbps", [0.01, 1.0, 5.0, 25.0, 100.0, 400.0])
@pytest.mark.parametrize("part_mib", [5, 8, 16, 32, 64, 100, 128])
def test_derived_buffers_stay_within_the_bound(gbps: float, part_mib: int) -> None:
    tc = TransferConfig(target_throughput_gbps=gbps, part_size=part_mib * MiB)
    assert 1 <= tc.concurrency <= MAX_DERIVED_CONCURRENCY
    assert tc.part_size <= tc.max_inflight_bytes
    # Parts over half the bound: one in flight and one filling.
    assert tc.max_inflight_bytes + tc.part_size <= max(UPLOAD_MEMORY_BOUND, 2 * tc.part_size)
    assert tc.max_inflight_parts <= tc.concurrency  # never more parts than connections


def test_explicit_values_win_and_replace_derives_again() -> None:
    assert TransferConfig(max_concurrency=3).concurrency == 3
    assert TransferConfig(max_concurrency=3).max_inflight_bytes == 3 * 16 * MiB
    assert TransferConfig(max_concurrency=100).concurrency == 100  # past the derived cap
    assert TransferConfig(max_inflight_bytes=32 * MiB).max_inflight_bytes == 32 * MiB
    tc = TransferConfig()
    assert dataclasses.replace(tc, target_throughput_gbps=1.0).concurrency == 2
    assert dataclasses.replace(tc, target_throughput_gbps=100.0).concurrency == 64
    assert dataclasses.replace(tc, part_size=64 * MiB).max_inflight_bytes == 64 * MiB  # bound
    pinned = dataclasses.replace(tc, max_concurrency=5)
    assert dataclasses.replace(pinned, target_throughput_gbps=100.0).concurrency == 5
    back = pickle.loads(pickle.dumps(tc))
    assert back == tc and dataclasses.replace(back, target_throughput_gbps=1.0).concurrency == 2
    assert tc.with_profile_attempts(3).concurrency == 14
    assert "max_concurrency=14," in repr(tc)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"target_throughput_gbps": 0},
        {"target_throughput_gbps": -1.0},
        {"target_throughput_gbps": float("nan")},
        {"target_throughput_gbps": float("inf")},
        {"target_throughput_gbps": "10"},
        {"max_concurrency": 0},
        {"max_inflight_bytes": 4 * MiB},
    ],
)
def test_bad_values_are_config_errors(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match=next(iter(kwargs))):
        TransferConfig(**kwargs)  # type: ignore[arg-type]
