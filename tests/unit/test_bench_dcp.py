"""bench_dcp.py's pure parts: state-dict shapes, the busy rule, ratios to the server's ceiling
and to the best peer, and a summary with busy runs. No server, no subprocess."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.bench

_BENCH = str(Path(__file__).resolve().parents[2] / "benchmarks")
if _BENCH not in sys.path:
    sys.path.insert(0, _BENCH)  # bench_dcp.py imports its _dcp_* modules by bare name

import _dcp_ceiling  # noqa: E402
import _dcp_machine  # noqa: E402
import _dcp_report  # noqa: E402
import _dcp_state  # noqa: E402

MiB = 1024 * 1024

# -- shapes ------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", sorted(_dcp_state.SHAPES))
@pytest.mark.parametrize("size_mib", [64, 256, 1024])
def test_large_tensors_hold_three_quarters_of_the_bytes(shape: str, size_mib: int) -> None:
    s = _dcp_state.SHAPES[shape]
    large, small = _dcp_state.shape_numels(size_mib, shape)
    large_b, small_b = s.n_large * large * 4, s.n_small * small * 4
    total = large_b + small_b
    assert large % 1024 == 0
    assert abs(total - size_mib * MiB) <= 0.001 * size_mib * MiB
    assert 0.74 <= large_b / total <= 0.76


def test_the_issues_shape_is_5_large_and_512_small_tensors() -> None:
    assert _dcp_state.SHAPES["large5"].describe() == "5 large + 512 small tensors"
    large, small = _dcp_state.shape_numels(1024, "large5")
    assert large * 4 == pytest.approx(768 * MiB / 5, rel=0.001)
    assert small * 4 == pytest.approx(512 * 1024, rel=0.01)
    # mix keeps the history's sizes: 4 x 192 MiB + 2000 x ~131 KiB
    assert _dcp_state.shape_numels(1024, "mix") == (192 * MiB // 4, 256 * MiB // 2000 // 4)


@pytest.mark.parametrize("shape", sorted(_dcp_state.SHAPES))
def test_build_blank_and_checksum_agree_for_every_shape(shape: str) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("crc32c")
    s = _dcp_state.SHAPES[shape]
    src = _dcp_state.build_state_dict(4, seed=3, shape=shape)
    dst = _dcp_state.blank_state_dict(4, shape)
    assert len(src["model"]) == s.n_large + s.n_small
    assert {k: v.shape for k, v in src["model"].items()} == {
        k: v.shape for k, v in dst["model"].items()
    }
    assert _dcp_state.tensor_bytes(src) == _dcp_state.tensor_bytes(dst)
    assert _dcp_state.checksum_state_dict(src) != _dcp_state.checksum_state_dict(dst)
    for k, v in src["model"].items():  # what a correct load does
        dst["model"][k].copy_(v)
    dst["step"] = src["step"]
    assert _dcp_state.checksum_state_dict(src) == _dcp_state.checksum_state_dict(dst)
    assert _dcp_state.checksum_state_dict(src) == _dcp_state.checksum_state_dict(
        _dcp_state.build_state_dict(4, seed=3, shape=shape)
    )


# -- the busy rule -----------------------------------------------------------------------------


def test_busy_rule() -> None:
    assert not _dcp_machine.is_busy(0.9, 0.10, 2)
    assert _dcp_machine.is_busy(0.9, 0.30, 2)  # CPUs busy in the second before
    assert _dcp_machine.is_busy(1.1, 0.10, 2)  # load1 > 0.5 x nproc
    assert not _dcp_machine.is_busy(1.1, 0.10, 2, own_load=0.5)  # but half of it is ours
    assert _dcp_machine.is_busy(1.1, None, 2) and not _dcp_machine.is_busy(0.9, None, 2)
    assert not _dcp_machine.is_busy(7.9, 0.2, 16)


def test_busy_fraction_from_proc_stat(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 0 50 800 50 0 0 0 30 0\ncpu0 1 2 3 4\n")
    a = _dcp_machine.read_cpu_times(str(stat))
    assert a == (150, 1000)  # guest is inside user already; iowait counts as idle
    stat.write_text("cpu  400 0 50 900 50 0 0 0 0 0\n")
    b = _dcp_machine.read_cpu_times(str(stat))
    assert b is not None and a is not None
    assert _dcp_machine.busy_fraction_between(a, b) == pytest.approx(300 / 400)
    assert _dcp_machine.busy_fraction_between(a, a) == 0.0
    assert _dcp_machine.read_cpu_times(str(tmp_path / "missing")) is None


def test_machine_state_records_load_fraction_nproc_and_verdict() -> None:
    samples = iter([(0, 100), (50, 200)])
    st = _dcp_machine.machine_state(
        1.0,
        sleep=lambda s: None,
        cpu_times=lambda: next(samples),
        loadavg=lambda: (0.2, 0.0, 0.0),
        nproc=4,
    )
    assert st == {
        "load1": 0.2,
        "load1_own_estimate": 0.0,
        "cpu_busy_fraction": 0.5,
        "nproc": 4,
        "busy": True,
    }


def test_own_load_follows_the_kernels_one_minute_average() -> None:
    t, cpu = [0.0], [0.0]
    own = _dcp_machine.OwnLoad(lambda: cpu[0], clock=lambda: t[0])
    t[0], cpu[0] = 60.0, 120.0  # two CPUs busy for a minute
    assert own.update() == pytest.approx(2 * (1 - 0.36788), rel=1e-3)
    t[0] += 600.0  # ten idle minutes
    assert own.update() < 0.01


def test_quiet_wait_waits_for_quiet_and_gives_up_at_the_deadline() -> None:
    now = [0.0]

    def sampler(verdicts: list[bool]) -> Any:
        it = iter(verdicts)

        def take(window: float) -> dict[str, Any]:
            now[0] += window
            return {"busy": next(it)}

        return take

    st = _dcp_machine.wait_quiet(30, sample=sampler([True, True, False]), clock=lambda: now[0])
    assert st["busy"] is False and st["waited_s"] == 2.0
    now[0] = 0.0
    st = _dcp_machine.wait_quiet(3, sample=sampler([True] * 10), clock=lambda: now[0])
    assert st["busy"] is True and st["waited_s"] == 3.0
    now[0] = 0.0
    st = _dcp_machine.wait_quiet(0, sample=sampler([True, False]), clock=lambda: now[0])
    assert st["busy"] is True and st["waited_s"] == 0.0  # no wait asked: one sample


# -- ratios and the summary --------------------------------------------------------------------


def _run(backend: str, op: str, mbs: float, *, busy: bool = False, peak: float = 100.0) -> dict:
    return {
        "backend": backend,
        "op": op,
        "mb_per_s": mbs,
        "wall_s": 1.0,
        "cpu_s_per_gib": 1.0,
        "server_cpu_s_per_gib": 0.5,
        "peak_over_baseline_mib": peak,
        "baseline_mib": 1000.0,
        "busy": busy,
        "loadavg_1m_before": 0.1,
    }


CEILING = {"put_mb_per_s": 1000.0, "get_mb_per_s": 2000.0}


def _results() -> list[dict[str, Any]]:
    return [
        _run("s3ckpt", "save", 600, busy=True, peak=200),
        _run("s3ckpt", "save", 400, peak=250),
        _run("s3ckpt", "load", 900),
        _run("s3tc", "save", 300),
        _run("s3tc", "load", 500),
        _run("fsspec", "save", 350),
        _run("fsspec", "load", 100),
        {"backend": "fsspec", "op": "load", "error": "worker exit 1", "busy": True},
    ]


def test_ratios_to_the_ceiling_and_to_the_best_peer() -> None:
    s = _dcp_report.summarize(_results(), ["s3ckpt", "s3tc", "fsspec"], CEILING)
    me = s["s3ckpt.save"]
    assert me["mb_per_s_median"] == 500
    assert me["mb_per_s_vs_ceiling"] == pytest.approx(0.5)  # save / PUT ceiling
    assert me["mb_per_s_vs_best_peer"] == pytest.approx(500 / 350)
    assert me["best_peer"] == "fsspec"
    assert s["s3ckpt.load"]["mb_per_s_vs_ceiling"] == pytest.approx(0.45)  # load / GET
    assert s["s3tc.load"]["mb_per_s_vs_best_peer"] == pytest.approx(500 / 900)
    rat = _dcp_report.ratios(s, CEILING)
    assert rat["save_mb_per_s_vs_best_other"] == {"ratio": 500 / 350, "best_other": "fsspec"}
    assert rat["load_mb_per_s_vs_ceiling"]["ratio"] == pytest.approx(0.45)
    assert rat["save_mb_per_s_vs_ceiling"]["ceiling_mb_per_s"] == 1000.0
    assert rat["save_peak_over_baseline_mib"] == 250


def test_without_a_ceiling_the_ratio_is_missing_not_invented() -> None:
    s = _dcp_report.summarize(_results(), ["s3ckpt", "s3tc"], None)
    assert s["s3ckpt.save"]["mb_per_s_vs_ceiling"] is None
    assert "save_mb_per_s_vs_ceiling" not in _dcp_report.ratios(s, None)
    alone = _dcp_report.summarize(_results()[:3], ["s3ckpt"], CEILING)
    assert alone["s3ckpt.load"]["mb_per_s_vs_best_peer"] is None


def _meta(busy: int, judged: int) -> dict[str, Any]:
    return {
        "size_mib": 64,
        "shape": "large5",
        "shape_desc": "5 large + 512 small tensors",
        "runs": 2,
        "tensor_bytes": 64 * MiB,
        "cpus": 2,
        "loadavg_min": 0.1,
        "loadavg_max": 1.5,
        "cpu_busy_min": 0.02,
        "cpu_busy_max": 0.6,
        "busy_runs": busy,
        "runs_judged": judged,
        "server": "s3sim",
        "shaping": "s3",
        "ceiling": {
            "measured": [
                {**CEILING, "clients": 2, "object_mib": 9, "total_mib": 54, "busy": False},
                {"put_mb_per_s": 900.0, "get_mb_per_s": 1500.0, "busy": True},
            ],
            "best": CEILING,
        },
    }


def test_summary_with_busy_runs_marks_and_counts_them() -> None:
    results = _results()
    backends = ["s3ckpt", "s3tc", "fsspec"]
    s = _dcp_report.summarize(results, backends, CEILING)
    assert s["s3ckpt.save"]["busy_runs"] == 1 and s["s3tc.save"]["busy_runs"] == 0
    assert _dcp_report.busy_count(results) == (2, 8)
    text = _dcp_report.render(s, _dcp_report.ratios(s, CEILING), backends, _meta(2, 8))
    assert "**2 of 8 run(s) busy**" in text
    assert "shape large5: 5 large + 512 small tensors" in text
    rows = {
        ln.split("|")[1].strip() + " " + ln.split("|")[2].strip(): ln
        for ln in text.splitlines()
        if ln.startswith("| ") and ln.count("|") == 14
    }
    assert "| 500* |" in rows["s3ckpt save"] and "| 50% | 1.43x (fsspec) |" in rows["s3ckpt save"]
    assert "| 300 |" in rows["s3torchconnector save"]  # no busy run: no mark
    assert "PUT 1000 / GET 2000 then PUT 900 / GET 1500 *" in text
    assert "2 run(s) were taken on a busy machine" in text


def test_goals_table_states_the_issues_goals() -> None:
    s = _dcp_report.summarize(_results(), ["s3ckpt", "s3tc", "fsspec"], CEILING)
    text = _dcp_report.render(s, _dcp_report.ratios(s, CEILING), ["s3ckpt"], _meta(0, 7))
    goals = {ln.split("|")[1].strip(): ln for ln in text.splitlines() if "s3ckpt /" in ln}
    load_peer = goals["load MB/s, s3ckpt / best peer (s3torchconnector)"]
    assert ">= 2.0x | 1.80 | NO" in load_peer
    assert ">= 40% | 45% | yes" in goals["load MB/s, s3ckpt / server's GET ceiling (2000 MB/s)"]
    assert (
        ">= 1.5x | 1.43 | NO" in goals["save MB/s, s3ckpt / best peer (FsspecWriter/Reader + s3fs)"]
    )
    assert ">= 50% | 50% | yes" in goals["save MB/s, s3ckpt / server's PUT ceiling (1000 MB/s)"]
    peak = [ln for ln in text.splitlines() if ln.startswith("| save peak RSS over state dict")]
    assert peak and "<= 256 | 250 | yes" in peak[0]
    assert "busy machine" not in text


def test_every_table_row_has_the_headers_cell_count() -> None:
    results = [*_results(), {"backend": "boto3", "op": "save", "error": "x"}]
    backends = ["s3ckpt", "s3tc", "fsspec", "boto3"]
    s = _dcp_report.summarize(results, backends, CEILING)
    text = _dcp_report.render(s, _dcp_report.ratios(s, CEILING), backends, _meta(1, 9))
    table = [
        ln
        for ln in text.splitlines()
        if ln.startswith("| backend") or "| save |" in ln or "| load |" in ln
    ]
    assert len(table) == 1 + 2 * len(backends)
    assert {ln.count("|") for ln in table} == {14}


# -- the ceiling's sizes -----------------------------------------------------------------------


def test_ceiling_is_sized_to_the_state_dict() -> None:
    assert _dcp_ceiling.ceiling_sizes(1024, "mix") == (64, 1024)  # 192 MiB tensors, capped
    assert _dcp_ceiling.ceiling_sizes(64, "large5") == (9, 64)  # 9.6 MiB tensors
    assert _dcp_ceiling.ceiling_sizes(4, "mix") == (1, 32)
    assert _dcp_ceiling.best_ceiling([]) is None
    best = _dcp_ceiling.best_ceiling(
        [{"put_mb_per_s": 5.0, "get_mb_per_s": 9.0}, {"put_mb_per_s": 7.0, "get_mb_per_s": 8.0}]
    )
    assert best == {"put_mb_per_s": 7.0, "get_mb_per_s": 9.0}
