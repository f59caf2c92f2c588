"""The pure parts of benchmarks/bench_hashed.py: per-save figures from s3sim's stats, where
the steady state starts, the summary and the table. No server, no ranks."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.bench_hashed import (
    layout_name,
    markdown_table,
    save_stats,
    steady_from,
    summarise,
)

pytestmark = pytest.mark.bench


def _partition(prefix: str, writes: int, throttled: int = 0, reads: int = 0) -> dict[str, Any]:
    return {
        "prefix": prefix,
        "reads": reads,
        "writes": writes,
        "throttled_reads": 0,
        "throttled_writes": throttled,
        "peak_reads_per_s": reads,
        "peak_writes_per_s": writes,
    }


def _stats() -> dict[str, Any]:
    return {
        "since_reset_s": 3.5,
        "requests": 107,
        "slowdowns": 9,
        "ops": {
            "PutObject": {"count": 90, "slowdown": 9},
            "DeleteObjects": {"count": 1, "slowdown": 0},
            "ListObjectsV2": {"count": 16, "slowdown": 0},
        },
        "partitions": [
            _partition("b/", 0),  # in the map, not used since the reset
            _partition("b/run/s3ckpt-shards/0/", 60, throttled=9),
            _partition("b/run/st", 31, reads=16),
        ],
        "splits": [{"at_s": 1.0, "parent": "b/", "children": ["b/run/s"]}],
    }


def test_save_stats_counts_writes_used_partitions_and_splits() -> None:
    s = save_stats(_stats())
    assert s["requests"] == 107 and s["slowdowns"] == 9
    assert s["writes"] == 91  # PutObject + DeleteObjects; the LISTs are reads
    assert s["writes_admitted"] == 82  # the 503s were not admitted
    assert s["slowdowns_by_op"] == {"PutObject": 9}
    assert (s["partitions_used"], s["partitions_total"]) == (2, 3)
    assert s["throttled_partitions"] == 1
    assert s["hottest"]["prefix"] == "b/run/s3ckpt-shards/0/"
    assert s["splits"] == 1 and s["split_parents"] == ["b/"]


def _save(slowdowns: int, wall: float = 1.0, requests: int = 100) -> dict[str, Any]:
    return {
        "slowdowns": slowdowns,
        "wall_s": wall,
        "requests": requests,
        "writes": requests - 10,
        "writes_admitted": requests - 10 - slowdowns,
        "partitions_used": 5,
        "partitions_total": 6,
        "splits": 0,
    }


@pytest.mark.parametrize(
    ("slowdowns", "expected"),
    [
        ([5, 3, 0, 0, 0], 3),
        ([0, 0, 0], 1),
        ([5, 0, 0, 2], None),  # throttled again at the end: never steady
        ([5, 0, 4, 0], 4),  # a quiet save between throttled ones does not count
        ([], None),
    ],
)
def test_steady_from_is_the_first_save_after_the_last_503(
    slowdowns: list[int], expected: int | None
) -> None:
    assert steady_from([_save(n) for n in slowdowns]) == expected


def test_summarise_reports_the_last_half() -> None:
    saves = [_save(10, 8.0), _save(4, 4.0), _save(0, 2.0), _save(0, 1.0)]
    out = summarise(saves)
    assert out["steady_from"] == 3
    assert out["slowdowns_total"] == 14 and out["slowdowns_last_half"] == 0
    assert out["first_wall_s"] == 8.0
    assert out["last_half_median_wall_s"] == pytest.approx(1.5)
    assert out["last_half_median_writes"] == 90
    assert out["last_half_median_writes_admitted"] == 90
    assert summarise([]) == {"saves": 0, "steady_from": None}


def test_markdown_table_has_a_row_per_layout_and_save() -> None:
    runs = [
        {"layout": layout_name(1), "saves": [_save(3), _save(2)]},
        {"layout": layout_name(16, presplit=True), "saves": [_save(0)]},
    ]
    lines = markdown_table(runs).splitlines()
    assert len(lines) == 2 + 3
    assert lines[2].startswith("| default | 1 | 1.0 | 100 | 3 |")
    assert lines[4].startswith("| HashedPrefixes(16), pre-split | 1 |")
