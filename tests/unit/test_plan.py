from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from s3ckpt._transfer import coalesce, pack


@given(st.lists(st.integers(0, 10**9), max_size=60), st.integers(1, 12))
def test_pack_covers_every_item_once_and_balances(sizes: list[int], n: int) -> None:
    bins = pack(sizes, n)
    flat = sorted(i for b in bins for i in b)
    assert flat == list(range(len(sizes)))
    assert len(bins) <= n
    assert all(b == sorted(b) for b in bins)
    if bins:
        loads = [sum(sizes[i] for i in b) for b in bins]
        # LPT guarantee: max load <= average + largest item.
        assert max(loads) <= sum(sizes) / len(bins) + max(sizes) + 1 or len(bins) < n


spans_strategy = st.lists(
    st.tuples(st.integers(0, 10_000), st.integers(0, 500)).map(lambda t: (t[0], t[0] + t[1])),
    max_size=40,
)


@given(spans_strategy, st.integers(0, 300), st.integers(1, 3000))
def test_coalesce_keeps_every_span_and_bounds_requests(
    spans: list[tuple[int, int]], gap: int, max_size: int
) -> None:
    reqs = coalesce([(s, e, i) for i, (s, e) in enumerate(spans)], gap, max_size)
    seen = sorted(p for r in reqs for (_, _, p) in r.spans)
    assert seen == list(range(len(spans)))
    for r in reqs:
        for s, e, _ in r.spans:
            assert r.start <= s and e <= r.end
        starts = [s for s, _, _ in r.spans]
        assert starts == sorted(starts)
        # A request exceeds max_size only when it holds one oversized span.
        if r.size > max_size:
            assert len(r.spans) == 1
    # Requests are ordered and do not start inside an earlier one's range twice.
    assert [r.start for r in reqs] == sorted(r.start for r in reqs)


def test_coalesce_merges_near_and_splits_far() -> None:
    reqs = coalesce([(0, 10, "a"), (12, 20, "b"), (100, 110, "c")], gap=5, max_size=1000)
    assert [(r.start, r.end, [p for *_, p in r.spans]) for r in reqs] == [
        (0, 20, ["a", "b"]),
        (100, 110, ["c"]),
    ]
    # Duplicate / overlapping ranges are all served.
    reqs = coalesce([(0, 10, "a"), (0, 10, "b"), (5, 15, "c")], gap=0, max_size=1000)
    assert len(reqs) == 1 and len(reqs[0].spans) == 3
