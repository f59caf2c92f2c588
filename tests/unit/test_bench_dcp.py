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
#: The shapes sized by ``size_mib`` (tiny is fixed: its own tests below).
SIZED = sorted(k for k, v in _dcp_state.SHAPES.items() if not v.fixed)

# -- shapes ------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SIZED)
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


@pytest.mark.parametrize("shape", SIZED)
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
        if ln.startswith("| ") and ln.count("|") == 18
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
    assert {ln.count("|") for ln in table} == {18}


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


# -- issue 40: the shaped lean-client limit, the tiny shape, stored bytes ------------------

LIMIT = {"put_mb_per_s": 800.0, "get_mb_per_s": 1000.0}


def _stored_run(backend: str, stored: int, marker: int | None, metadata: int) -> dict:
    r = {
        **_run(backend, "save", 500),
        "bytes": 100 * 10**6,
        "stored_bytes": stored,
        "metadata_bytes": metadata,
    }
    if marker is not None:
        r["marker_bytes"] = marker
    return r


def test_ratios_to_both_limits() -> None:
    s = _dcp_report.summarize(_results(), ["s3ckpt", "s3tc", "fsspec"], CEILING, LIMIT)
    assert s["s3ckpt.save"]["mb_per_s_vs_shaped_limit"] == pytest.approx(500 / 800)
    assert s["s3ckpt.save"]["mb_per_s_vs_ceiling"] == pytest.approx(0.5)
    assert s["s3ckpt.load"]["mb_per_s_vs_shaped_limit"] == pytest.approx(0.9)  # load / GET
    assert s["s3tc.load"]["mb_per_s_vs_shaped_limit"] == pytest.approx(0.5)
    rat = _dcp_report.ratios(s, CEILING, LIMIT)
    assert rat["save_mb_per_s_vs_shaped_limit"] == {
        "ratio": pytest.approx(0.625),
        "limit_mb_per_s": 800.0,
        "phase": "put",
    }
    assert rat["load_mb_per_s_vs_shaped_limit"]["ratio"] == pytest.approx(0.9)
    assert rat["load_mb_per_s_vs_ceiling"]["ratio"] == pytest.approx(0.45)  # unchanged
    both = rat["mb_per_s_vs_limits"]
    assert both["fsspec.save"] == {
        "shaped_limit": pytest.approx(350 / 800),
        "ceiling": pytest.approx(0.35),
    }
    assert set(both) == {
        f"{b}.{op}" for b in ("s3ckpt", "s3tc", "fsspec") for op in ("save", "load")
    }
    # without a shaped limit: missing, not invented; the ceiling's ratios stay
    s = _dcp_report.summarize(_results(), ["s3ckpt", "s3tc"], CEILING, None)
    assert s["s3ckpt.save"]["mb_per_s_vs_shaped_limit"] is None
    rat = _dcp_report.ratios(s, CEILING, None)
    assert "save_mb_per_s_vs_shaped_limit" not in rat
    assert rat["save_mb_per_s_vs_ceiling"]["ratio"] == pytest.approx(0.5)


def _goals(text: str) -> dict[str, str]:
    return {ln.split("|")[1].strip(): ln for ln in text.splitlines() if ln.startswith("| ")}


def test_goals_rows_for_the_shaped_limit_and_stored_bytes() -> None:
    results = [r for r in _results() if not (r["backend"] != "fsspec" and r["op"] == "save")]
    results += [
        _stored_run("s3ckpt", 130 * 10**6, 812, 2 * 10**6),
        _stored_run("s3tc", 101 * 10**6, None, 2 * 10**6),
    ]
    backends = ["s3ckpt", "s3tc", "fsspec"]
    s = _dcp_report.summarize(results, backends, CEILING, LIMIT)
    rat = _dcp_report.ratios(s, CEILING, LIMIT)
    assert rat["save_stored_vs_data_and_metadata"]["ratio"] == pytest.approx(130 / 102)
    assert rat["save_marker_bytes"] == 812
    meta = {
        **_meta(0, 8),
        "shaped_limit": {
            "measured": [{**LIMIT, "clients": 14, "object_mib": 16, "total_mib": 224}],
            "best": LIMIT,
        },
    }
    text = _dcp_report.render(s, rat, backends, meta)
    goals = _goals(text)
    assert (
        ">= 70% | 62% | NO"
        in goals["save MB/s, s3ckpt / shaped lean-client PUT limit (800 MB/s) (issue 40)"]
    )
    assert (
        ">= 90% | 90% | yes"
        in goals["load MB/s, s3ckpt / shaped lean-client GET limit (1000 MB/s) (issue 40)"]
    )
    stored = [v for k, v in goals.items() if k.startswith("bytes stored by s3ckpt's save")]
    assert stored and "<= 2x | 1.27 | yes" in stored[0]
    assert "(info) | 0.8 |" in goals["s3ckpt.json marker size, KB (issue 40: a small fixed size)"]
    # issue 30's rows are still there, and the peer goals (1.5x, 2x) are issue 40's too
    assert ">= 50% | 50% | yes" in goals["save MB/s, s3ckpt / server's PUT ceiling (1000 MB/s)"]
    assert ">= 2.0x | 1.80 | NO" in goals["load MB/s, s3ckpt / best peer (s3torchconnector)"]
    assert "Shaped lean-client limit (the same s3sim, shaping s3, 14 lean clients, 16 MiB" in text
    assert "ratios use PUT 800 and GET 1000 MB/s" in text
    # the table: both ratios side by side, stored MB and marker KB on save rows
    rows = {
        ln.split("|")[1].strip() + " " + ln.split("|")[2].strip(): ln
        for ln in text.splitlines()
        if ln.count("|") == 18
    }
    me = rows["s3ckpt save"].split("|")
    assert [c.strip() for c in me[6:9]] == ["62%", "50%", "1.00x (s3tc)"]
    assert [c.strip() for c in me[14:16]] == ["130.0", "0.8"]
    tc = rows["s3torchconnector save"].split("|")
    assert [c.strip() for c in tc[14:16]] == ["101.0", ""]
    assert [c.strip() for c in rows["s3ckpt load"].split("|")[14:16]] == ["", ""]


def test_without_limits_the_new_goal_rows_say_n_a() -> None:
    s = _dcp_report.summarize(_results(), ["s3ckpt", "s3tc"], None, None)
    text = _dcp_report.render(
        s, _dcp_report.ratios(s), ["s3ckpt", "s3tc"], {**_meta(0, 7), "ceiling": None}
    )
    goals = _goals(text)
    assert (
        ">= 70% | n/a | n/a" in goals["save MB/s, s3ckpt / shaped lean-client PUT limit (issue 40)"]
    )
    assert not any(k.startswith("bytes stored") for k in goals)  # not recorded: no row


def test_tiny_shape_is_200000_tensors_of_4_floats_whatever_the_size() -> None:
    tiny = _dcp_state.SHAPES["tiny"]
    assert (tiny.n_large, tiny.small_numel, tiny.fixed) == (0, 4, True)
    for size_mib in (1, 64, 1024):
        assert _dcp_state.shape_numels(size_mib, "tiny") == (0, 4)
        assert _dcp_state.state_dict_mib(size_mib, "tiny") == tiny.n_small * 16 / MiB
    assert _dcp_state.state_dict_mib(1024, "mix") == pytest.approx(1024, rel=0.001)
    assert not _dcp_state.SHAPES["mix"].fixed and not _dcp_state.SHAPES["large5"].fixed
    # mix and large5 build what they did
    assert _dcp_state.shape_numels(1024, "mix") == (192 * MiB // 4, 256 * MiB // 2000 // 4)
    with pytest.raises(ValueError):
        _dcp_state.Shape("bad", 2, 10, 4)
    with pytest.raises(ValueError):
        _dcp_state.Shape("bad", 0, 10)
    # the limits' sizes for tiny: 16 MiB objects, one per client at least
    assert _dcp_ceiling.ceiling_sizes(64, "tiny") == (16, 32)
    assert _dcp_ceiling.limit_sizes(64, "tiny", 14) == (16, 1, 224)


def test_tiny_default_count_is_200000(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    if "BENCH_DCP_TINY_COUNT" not in os.environ:
        assert _dcp_state.SHAPES["tiny"].n_small == 200_000
        assert _dcp_state.SHAPES["tiny"].describe() == "200000 tensors of 4 fp32, no large ones"


def test_tiny_builds_blank_and_checksums(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("crc32c")
    small = _dcp_state.Shape("tiny", 0, 300, 4)  # the real one's 200,000 take ~10 s
    monkeypatch.setitem(_dcp_state.SHAPES, "tiny", small)
    src = _dcp_state.build_state_dict(1024, seed=1, shape="tiny")
    dst = _dcp_state.blank_state_dict(7, "tiny")
    assert len(src["model"]) == 300 and {v.shape for v in src["model"].values()} == {(4,)}
    assert _dcp_state.tensor_bytes(src) == _dcp_state.tensor_bytes(dst) == 300 * 16
    for k, v in src["model"].items():
        dst["model"][k].copy_(v)
    dst["step"] = src["step"]
    assert _dcp_state.checksum_state_dict(src) == _dcp_state.checksum_state_dict(dst)


def test_shaped_limit_sizes() -> None:
    assert _dcp_ceiling.limit_sizes(1024, "mix", 14) == (16, 5, 1120)  # ~1 GiB, 5 per client
    assert _dcp_ceiling.limit_sizes(64, "mix", 4) == (16, 1, 64)
    assert _dcp_ceiling.limit_sizes(64, "mix", 14) == (16, 1, 224)  # at least 14 x 16 MiB


def test_crc32c_header_is_base64_of_the_big_endian_value() -> None:
    from benchmarks.s3sim import ceiling

    # CRC32C("123456789") = 0xE3069283, RFC 3720's check value
    assert ceiling.crc32c_header(b"123456789") == "4waSgw=="


def test_shaped_limit_against_a_real_s3sim() -> None:
    """Two lean clients, 5 MiB bodies, S3's shaping: the CRC32C headers are accepted (s3sim
    answers 400 BadDigest to a wrong one), both phases report, and the objects are gone."""
    import http.client

    from benchmarks.s3sim import S3Sim, Shaping, ceiling

    with S3Sim(Shaping.s3(), buckets=["bench-limit"]) as sim:
        res = ceiling.shaped_limit(sim, "bench-limit", "_shaped-limit/t", clients=2, size_mib=5)
        assert res["total_mib"] == 10 and res["checksum"] == "CRC32C"
        for phase in ("put", "get"):
            assert res[phase]["mb_per_s"] > 0 and res[phase]["server_requests"] >= 2
        assert res["deleted"] == 2
        conn = http.client.HTTPConnection(sim.host, sim.port, timeout=30)
        conn.request("GET", "/bench-limit?list-type=2")
        listing = conn.getresponse().read()
        assert b"<KeyCount>0</KeyCount>" in listing
        conn.request(
            "PUT",
            "/bench-limit/bad",
            body=b"x" * 10,
            headers={"x-amz-checksum-crc32c": ceiling.crc32c_header(b"y" * 10)},
        )
        resp = conn.getresponse()
        assert resp.status == 400 and b"BadDigest" in resp.read()
        conn.close()


def test_lean_clients_that_die_without_a_row_do_not_hang_the_phase() -> None:
    import queue
    from types import SimpleNamespace

    from benchmarks.s3sim import ceiling

    q: queue.Queue[Any] = queue.Queue()
    q.put((1.0, 0.5, 0))
    procs = [SimpleNamespace(exitcode=0), SimpleNamespace(exitcode=1)]
    with pytest.raises(RuntimeError, match=r"exited with \[1\] \(1 row"):
        ceiling._collect(q, procs, 60.0)
    q.put((1.0, 0.5, 0))
    q.put(("error", "client 1: RuntimeError: put /b/x: 400"))
    rows = ceiling._collect(q, procs, 60.0)  # both rows came: the caller reports the error
    assert rows[1][0] == "error"


def test_tiny_runs_show_small_mb_per_s_wall_time_and_its_own_size() -> None:
    tiny = {
        **_stored_run("s3ckpt", 424 * 10**6, 17 * 10**6, 45 * 10**6),
        "bytes": 3_200_000,
        "mb_per_s": 0.0414,
        "wall_s": 77.3,
    }
    s = _dcp_report.summarize([tiny], ["s3ckpt"], None, LIMIT)
    meta = {
        **_meta(0, 1),
        "shape": "tiny",
        "size_fixed": True,
        "size_mib": 1024,
        "tensor_bytes": 3_200_000,
        "shape_desc": "200000 tensors of 4 fp32, no large ones",
        "ceiling": None,
    }
    text = _dcp_report.render(s, _dcp_report.ratios(s, None, LIMIT), ["s3ckpt"], meta)
    assert (
        "State dict: 3.1 MiB fp32 (shape tiny: 200000 tensors of 4 fp32, no large ones; "
        "--size-mib ignored)" in text
    )
    row = next(ln for ln in text.splitlines() if ln.startswith("| s3ckpt | save |"))
    assert [c.strip() for c in row.split("|")[3:6]] == ["0.041", "0.041-0.041", "77.30"]
    assert "(MiB, 3.1 MiB state dict)" in text
    stored = [ln for ln in text.splitlines() if ln.startswith("| bytes stored")]
    assert stored and "| <= 2x | 8.80 | NO |" in stored[0]  # 424 / (3.2 + 45)
