"""s3sim's shaping model (benchmarks/s3sim/_shaping.py) with a fake clock: no server."""

from __future__ import annotations

import pytest

from benchmarks.s3sim._shaping import (
    READ,
    WRITE,
    Pacer,
    PartitionMap,
    Shaping,
    Throttle,
    TokenBucket,
)

pytestmark = pytest.mark.bench

# -- config -----------------------------------------------------------------------------------


def test_s3_preset_is_awss_published_figures() -> None:
    s = Shaping.s3()
    assert (s.read_rate, s.write_rate) == (5500, 3500)
    assert s.ttfb_s == 0.030 and s.conn_mb_per_s == 85 and s.burst_s == 1.0
    assert s.split_after_s == 60 and s.split_load == 0.5
    assert Shaping.s3(rate_scale=0.01).scaled_write_rate == pytest.approx(35)


def test_none_preset_limits_nothing() -> None:
    s = Shaping.none()
    assert s.ttfb_s == 0 and s.conn_bytes_per_s is None
    assert s.scaled_read_rate is None and s.scaled_write_rate is None
    assert not PartitionMap(s, 0.0).limits


def test_json_round_trip_and_profile_start() -> None:
    s = Shaping.s3(rate_scale=0.5, throttles=(Throttle("b/hot/", 10, None),))
    assert Shaping.from_json(s.to_json()) == s
    t = Shaping.from_json({"profile": "s3", "ttfb_s": 0.001})
    assert t == Shaping.s3(ttfb_s=0.001)
    u = Shaping.from_json({"write_rate": 7}, base=s)  # a partial update keeps the rest
    assert u.write_rate == 7 and u.rate_scale == 0.5 and u.throttles == s.throttles


@pytest.mark.parametrize(
    "bad",
    [{"ttfb_s": -1}, {"read_rate": 0}, {"rate_scale": 0}, {"split_load": 0}, {"burst_s": 0}],
)
def test_invalid_knobs_are_rejected(bad: dict) -> None:
    with pytest.raises(ValueError):
        Shaping(**bad)


def test_unknown_knob_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown shaping knobs"):
        Shaping.from_json({"ttfb": 1})


def test_throttle_parse() -> None:
    assert Throttle.parse("ckpt/hot/=100/-") == Throttle("ckpt/hot/", 100.0, None)
    assert Throttle.parse("b/a=b/=-/2.5") == Throttle("b/a=b/", None, 2.5)  # last '=' splits
    for bad in ("nohalf", "b/p=1", "/lead=1/1"):
        with pytest.raises(ValueError):
            Throttle.parse(bad)


# -- token bucket and pacer -------------------------------------------------------------------


def test_token_bucket_burst_then_rate() -> None:
    b = TokenBucket(rate=10, capacity=10, now=0.0)
    assert sum(b.take(0.0) for _ in range(15)) == 10  # the burst, then empty
    assert not b.take(0.05)  # half a token
    assert b.take(0.1)  # one token after 0.1 s
    assert sum(b.take(100.0) for _ in range(20)) == 10  # refill is capped at capacity


def test_pacer_lets_small_transfers_through_and_holds_the_rate() -> None:
    p = Pacer(bytes_per_s=1_000_000, allowance=100_000)
    assert p.delay(0.0, 50_000) == 0.0  # within the allowance
    # A sender that always waits what it is told moves 10 MB in ~10 s.
    now, sent = 0.0, 50_000
    while sent < 10_000_000:
        now += p.delay(now, 100_000)
        sent += 100_000
    assert now == pytest.approx(10.0, abs=0.2)


# -- partitions -------------------------------------------------------------------------------


def test_one_partition_per_bucket_and_longest_throttle_prefix_wins() -> None:
    s = Shaping(write_rate=100, throttles=(Throttle("b/hot/", None, 1), Throttle("b/hot/x", 2, 2)))
    m = PartitionMap(s, 0.0)
    assert m.lookup("b/cold/k", 0.0).prefix == "b/"
    assert m.lookup("other/k", 0.0).prefix == "other/"
    assert m.lookup("b/hot/k", 0.0).prefix == "b/hot/"
    assert m.lookup("b/hot/xyz", 0.0).prefix == "b/hot/x"
    assert m.lookup("bb/hot/k", 0.0).prefix == "bb/"  # a bucket is never a prefix of another


def test_admission_throttles_past_the_burst_and_counts() -> None:
    m = PartitionMap(Shaping(write_rate=1000, rate_scale=0.01, burst_s=2), 0.0)  # 10/s, burst 20
    results = [m.admit("b/k", WRITE, 0.0) for _ in range(25)]
    assert results.count(True) == 20 and results.count(False) == 5
    assert m.admit("b/k", READ, 0.0)  # reads are unlimited here
    snap = m.snapshot(0.0)[0]
    assert snap["writes"] == 25 and snap["throttled_writes"] == 5 and snap["reads"] == 1
    assert snap["peak_writes_per_s"] == 25


def test_throttle_rates_are_not_scaled() -> None:
    m = PartitionMap(Shaping(rate_scale=0.001, throttles=(Throttle("b/t/", None, 3),)), 0.0)
    assert [m.admit("b/t/k", WRITE, 0.0) for _ in range(4)] == [True, True, True, False]


def _drive(m: PartitionMap, keys: list[str], per_second: int, seconds: int) -> None:
    for sec in range(seconds):
        for i in range(per_second):
            m.admit(keys[i % len(keys)], WRITE, sec + i / per_second)


def test_sustained_load_splits_at_the_first_distinguishing_character() -> None:
    s = Shaping(write_rate=100, split_after_s=2, split_load=0.5)
    m = PartitionMap(s, 0.0)
    keys = [f"b/run/step_1/{c}{i}" for c in "ab" for i in range(3)]
    _drive(m, keys, per_second=60, seconds=4)  # 60% of the rate, every second
    assert m.splits and m.splits[0]["parent"] == "b/"
    assert m.splits[0]["children"] == ["b/run/step_1/a", "b/run/step_1/b"]
    assert m.lookup("b/run/step_1/a0", 4.0).prefix == "b/run/step_1/a"
    assert m.lookup("b/run/other", 4.0).prefix == "b/"  # the parent keeps the rest


def test_light_load_or_a_gap_does_not_split() -> None:
    m = PartitionMap(Shaping(write_rate=100, split_after_s=2), 0.0)
    _drive(m, ["b/a", "b/b"], per_second=20, seconds=6)  # 20% of the rate
    assert not m.splits
    m2 = PartitionMap(Shaping(write_rate=100, split_after_s=2), 0.0)
    for start in (0, 3, 6):  # hot seconds with idle seconds between them
        for i in range(60):
            m2.admit("b/a" if i % 2 else "b/b", WRITE, start + i / 60)
    assert not m2.splits


def test_throttling_alone_makes_a_partition_hot() -> None:
    # 3 requests at once each second: 30% of the rate (not busy), but a 1-token bucket
    # throttles two of them, and a window that throttled is hot.
    m = PartitionMap(Shaping(write_rate=10, burst_s=0.1, split_after_s=1, split_load=0.5), 0.0)
    for sec in range(2):
        for key in ("b/x1", "b/y2", "b/x3"):
            m.admit(key, WRITE, float(sec))
    assert m.snapshot(1.0)[0]["throttled_writes"] == 2  # in window 0, the one that was hot
    assert [s["children"] for s in m.splits] == [["b/x", "b/y"]]


def test_a_single_hot_key_and_pinned_partitions_never_split() -> None:
    m = PartitionMap(Shaping(write_rate=10, split_after_s=1), 0.0)
    _drive(m, ["b/only"], per_second=30, seconds=4)
    assert not m.splits
    pinned = Shaping(split_after_s=1, throttles=(Throttle("b/p/", None, 2),))
    m2 = PartitionMap(pinned, 0.0)
    _drive(m2, ["b/p/a", "b/p/b"], per_second=30, seconds=4)
    assert not m2.splits


def test_reset_counts_keeps_the_layout() -> None:
    m = PartitionMap(Shaping(write_rate=100, split_after_s=1), 0.0)
    _drive(m, ["b/a1", "b/b1"], per_second=80, seconds=3)
    prefixes = sorted(m.parts)
    m.reset_counts()
    assert sorted(m.parts) == prefixes and not m.splits
    assert all(p["writes"] == 0 and p["peak_writes_per_s"] == 0 for p in m.snapshot(3.0))


def test_command_line_flags_override_the_profile() -> None:
    from benchmarks.s3sim._server import build_parser, config_from_args

    def parse(*argv: str) -> Shaping:
        return config_from_args(build_parser().parse_args(list(argv)))[0]

    assert parse() == Shaping.none()
    assert parse("--profile", "s3") == Shaping.s3()
    s = parse(
        *("--profile", "s3", "--split-after-s", "none", "--ttfb-ms", "5"),
        *("--rate-scale", "0.01", "--throttle", "b/hot/=-/5"),
    )
    assert s == Shaping.s3(
        split_after_s=None, ttfb_s=0.005, rate_scale=0.01, throttles=(Throttle("b/hot/", None, 5),)
    )
