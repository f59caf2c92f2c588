"""bench_dcp.py's summary: medians per backend and op, ratios, the goals, the markdown table.

Pure functions over the per-run result dicts (no I/O, no torch), so they are unit-tested.

Decisions:

- Every backend's median MB/s is read three ways: as a fraction of the shaped lean-client
  limit measured in the same run (issue 40: what the leanest client gets through the same
  S3 shaping, the fair 100 %), as a fraction of the server's own unshaped ceiling (issue 30:
  what the server process can move at all), save over the PUT and load over the GET phase of
  each, and as a ratio to the best of its peers (the other DCP backends; the raw boto3
  baseline is nobody's peer but is compared with the DCP backends).
- A save also reports what it left in the bucket (issue 40): the bytes stored under its
  prefix and the size of s3ckpt's commit marker ``s3ckpt.json`` where there is one.
- A run taken on a busy machine (see ``_dcp_machine``) stays in the medians (dropping it
  would hide that the numbers moved) but is counted per backend and op, its median is
  marked ``*`` in the table, and the header says how many runs were busy.
- The goals table states issue 30's goals: load >= 2x the best peer and >= 40 % of the GET
  ceiling; save >= 1.5x the best peer and >= 50 % of the PUT ceiling; save peak RSS over
  the state dict <= 256 MiB. Issue 40's goals follow: save >= 70 % of the shaped PUT limit,
  load >= 90 % of the shaped GET limit (its peer goals, 1.5x and 2x, are issue 30's rows),
  bytes stored <= 2x the tensor data plus torch's ``.metadata``, and the marker's size (a
  small fixed size: information). The earlier CPU and 503 goals follow as information.
"""

from __future__ import annotations

import statistics
from typing import Any

__all__ = [
    "BACKENDS",
    "CEILING_KEY",
    "DCP_BACKENDS",
    "GOALS",
    "GOALS_40",
    "LABELS",
    "busy_count",
    "ratios",
    "render",
    "summarize",
]

MiB = 1024 * 1024
MB = 1_000_000
BACKENDS = ("s3ckpt", "s3tc", "fsspec", "boto3")
DCP_BACKENDS = ("s3ckpt", "s3tc", "fsspec")
LABELS = {
    "s3ckpt": "s3ckpt",
    "s3tc": "s3torchconnector",
    "fsspec": "FsspecWriter/Reader + s3fs",
    "boto3": "raw boto3 (1 blob, baseline)",
}
OPS = ("save", "load")
#: Which ceiling phase an op is compared with.
CEILING_KEY = {"save": "put_mb_per_s", "load": "get_mb_per_s"}
#: Issue 30's goals for s3ckpt.
GOALS = {
    "save_vs_best_peer": 1.5,
    "load_vs_best_peer": 2.0,
    "save_vs_ceiling": 0.5,
    "load_vs_ceiling": 0.4,
    "save_peak_over_state_dict_mib": 256.0,
}
#: Issue 40's goals for s3ckpt (its peer goals are the same as issue 30's).
GOALS_40 = {
    "save_vs_limit": 0.7,
    "load_vs_limit": 0.9,
    "stored_vs_data_and_metadata": 2.0,
}
GOAL_CPU = 0.7  # earlier goal: s3ckpt client CPU per GiB over s3torchconnector's
GOAL_503 = 1 / 3  # earlier goal: s3ckpt's 503s over the fewest of its peers'


def _fmt(x: float | None, spec: str = ".0f") -> str:
    return "n/a" if x is None else format(x, spec)


def _mbs(x: float | None) -> str:
    """MB/s: whole numbers, with decimals below 10 (tiny's saves run at fractions of one)."""
    if x is None:
        return "n/a"
    return format(x, ".0f" if x >= 10 else ".2f" if x >= 0.1 else ".3f")


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def _stored(x: float | None, unit: float, spec: str) -> str:
    """A byte count in ``unit``s; empty when not recorded (a load row)."""
    return "" if x is None else format(x / unit, spec)


def _median_of(runs: list[dict[str, Any]], field: str) -> float | None:
    values = [r[field] for r in runs if field in r]
    return statistics.median(values) if values and len(values) == len(runs) else None


def busy_count(results: list[dict[str, Any]]) -> tuple[int, int]:
    """(runs marked busy, runs) among the results that carry a busy verdict."""
    judged = [r for r in results if "busy" in r]
    return sum(1 for r in judged if r["busy"]), len(judged)


def _peers(backend: str) -> tuple[str, ...]:
    return tuple(b for b in DCP_BACKENDS if b != backend)


def summarize(
    results: list[dict[str, Any]],
    backends: list[str],
    ceiling: dict[str, float] | None = None,
    limit: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Per ``backend.op``: runs, medians, extremes, busy runs, and the ratios to the shaped
    limit (``mb_per_s_vs_shaped_limit``, None without one), to the ceiling
    (``mb_per_s_vs_ceiling``, None without one) and to the best peer
    (``mb_per_s_vs_best_peer`` and ``best_peer``, None when no peer ran); a save's stored
    bytes, marker and ``.metadata`` sizes (medians, None when not recorded)."""
    summary: dict[str, Any] = {}
    for b in backends:
        for op in OPS:
            mine = [r for r in results if r["backend"] == b and r["op"] == op]
            ok = [r for r in mine if "error" not in r]
            bad = [r for r in mine if "error" in r]
            if not ok:
                summary[f"{b}.{op}"] = {"runs": 0, "failed": len(bad)}
                continue
            mbs = [r["mb_per_s"] for r in ok]
            summary[f"{b}.{op}"] = {
                "runs": len(ok),
                "failed": len(bad),
                "busy_runs": busy_count(ok)[0],
                "mb_per_s_median": statistics.median(mbs),
                "mb_per_s_min": min(mbs),
                "mb_per_s_max": max(mbs),
                "wall_s_median": statistics.median(r["wall_s"] for r in ok),
                "cpu_s_per_gib_median": statistics.median(r["cpu_s_per_gib"] for r in ok),
                "server_cpu_s_per_gib_median": _median_of(ok, "server_cpu_s_per_gib"),
                "peak_over_baseline_mib_max": max(r["peak_over_baseline_mib"] for r in ok),
                "baseline_mib_median": statistics.median(r["baseline_mib"] for r in ok),
                "requests_per_gib_median": _median_of(ok, "requests_per_gib"),
                "slowdowns_per_gib_median": _median_of(ok, "slowdowns_per_gib"),
                "slowdowns_median": _median_of(ok, "slowdowns"),
                "bytes_read_median": _median_of(ok, "bytes_read"),
                "tensor_bytes_median": _median_of(ok, "bytes"),
                "stored_bytes_median": _median_of(ok, "stored_bytes"),
                "marker_bytes_median": _median_of(ok, "marker_bytes"),
                "metadata_bytes_median": _median_of(ok, "metadata_bytes"),
            }
    for key, row in summary.items():
        if not row.get("runs"):
            continue
        b, op = key.split(".")
        row["mb_per_s_vs_shaped_limit"] = _vs(row["mb_per_s_median"], limit, op)
        row["mb_per_s_vs_ceiling"] = _vs(row["mb_per_s_median"], ceiling, op)
        peers = [
            (summary[f"{p}.{op}"]["mb_per_s_median"], p)
            for p in _peers(b)
            if summary.get(f"{p}.{op}", {}).get("runs")
        ]
        if peers:
            best, who = max(peers)
            row["mb_per_s_vs_best_peer"] = row["mb_per_s_median"] / best
            row["best_peer"] = who
        else:
            row["mb_per_s_vs_best_peer"] = row["best_peer"] = None
    return summary


def _vs(mbs: float, limit: dict[str, float] | None, op: str) -> float | None:
    """``mbs`` over the limit's phase for ``op`` (save: PUT, load: GET); None without it."""
    den = (limit or {}).get(CEILING_KEY[op])
    return mbs / den if den else None


def ratios(
    summary: dict[str, Any],
    ceiling: dict[str, float] | None = None,
    limit: dict[str, float] | None = None,
) -> dict[str, Any]:
    """s3ckpt against its peers, the shaped limit and the ceiling, and what its save stored:
    the figures the goals table judges."""

    def get(b: str, op: str, field: str) -> Any:
        s = summary.get(f"{b}.{op}", {})
        return s.get(field) if s.get("runs") else None

    others = _peers("s3ckpt")
    out: dict[str, Any] = {}
    for op in OPS:
        mine = get("s3ckpt", op, "mb_per_s_median")
        cands = [(get(b, op, "mb_per_s_median"), b) for b in others]
        cands = [(v, b) for v, b in cands if v is not None]
        if mine is not None and cands:
            best, who = max(cands)
            out[f"{op}_mb_per_s_vs_best_other"] = {"ratio": mine / best, "best_other": who}
        ceil = (ceiling or {}).get(CEILING_KEY[op])
        if mine is not None and ceil:
            out[f"{op}_mb_per_s_vs_ceiling"] = {
                "ratio": mine / ceil,
                "ceiling_mb_per_s": ceil,
                "phase": CEILING_KEY[op][:3],
            }
        lim = (limit or {}).get(CEILING_KEY[op])
        if mine is not None and lim:
            out[f"{op}_mb_per_s_vs_shaped_limit"] = {
                "ratio": mine / lim,
                "limit_mb_per_s": lim,
                "phase": CEILING_KEY[op][:3],
            }
        cpu_me = get("s3ckpt", op, "cpu_s_per_gib_median")
        cpu_tc = get("s3tc", op, "cpu_s_per_gib_median")
        if cpu_me is not None and cpu_tc:
            out[f"{op}_cpu_per_gib_vs_s3torchconnector"] = cpu_me / cpu_tc
        slow_me = get("s3ckpt", op, "slowdowns_median")
        slows = [(get(b, op, "slowdowns_median"), b) for b in others]
        slows = [(v, b) for v, b in slows if v is not None]
        if slow_me is not None and slows and any(v for v, _ in slows):
            fewest, who = min(slows)
            out[f"{op}_slowdowns_vs_fewest_other"] = {
                "ratio": slow_me / fewest if fewest else None,
                "fewest_other": who,
                "s3ckpt": slow_me,
                "other": fewest,
            }
        mem_me = get("s3ckpt", op, "peak_over_baseline_mib_max")
        mems = [(get(b, op, "peak_over_baseline_mib_max"), b) for b in others]
        mems = [(v, b) for v, b in mems if v is not None]
        if mem_me is not None:
            out[f"{op}_peak_over_baseline_mib"] = mem_me
            if mems:
                best, who = min(mems)
                out[f"{op}_peak_vs_lowest_other"] = {
                    "ratio": mem_me / best if best > 0 else None,
                    "lowest_other": who,
                }
    stored = get("s3ckpt", "save", "stored_bytes_median")
    data = get("s3ckpt", "save", "tensor_bytes_median")
    if stored is not None and data:
        meta_b = get("s3ckpt", "save", "metadata_bytes_median") or 0
        out["save_stored_vs_data_and_metadata"] = {
            "ratio": stored / (data + meta_b),
            "stored_bytes": stored,
            "tensor_bytes": data,
            "metadata_bytes": meta_b,
        }
    marker = get("s3ckpt", "save", "marker_bytes_median")
    if marker is not None:
        out["save_marker_bytes"] = marker
    # Every backend against both limits, as the table's two columns.
    out["mb_per_s_vs_limits"] = {
        key: {
            "shaped_limit": row.get("mb_per_s_vs_shaped_limit"),
            "ceiling": row.get("mb_per_s_vs_ceiling"),
        }
        for key, row in summary.items()
        if row.get("runs")
    }
    return out


def _measured_phases(measured: list[dict[str, Any]]) -> str:
    """``PUT a / GET b then PUT c / GET d`` of limit measurements (``*``: taken busy)."""
    return " then ".join(
        f"PUT {m['put_mb_per_s']:.0f} / GET {m['get_mb_per_s']:.0f}"
        + (" *" if m.get("busy") else "")
        for m in measured
    )


def _header(meta: dict[str, Any]) -> list[str]:
    busy, judged = meta.get("busy_runs", 0), meta.get("runs_judged", 0)
    frac = meta.get("cpu_busy_min"), meta.get("cpu_busy_max")
    busy_txt = f", CPU busy {_pct(frac[0])}-{_pct(frac[1])}" if None not in frac else ""
    if meta.get("size_fixed"):
        sd_txt = (f"State dict: {meta['tensor_bytes'] / MiB:.1f} MiB fp32 (shape "
                  f"{meta.get('shape')}: {meta.get('shape_desc', '')}; --size-mib ignored), ")
    else:
        sd_txt = (f"State dict: {meta['size_mib']} MiB fp32 ({meta['tensor_bytes'] / MiB:.0f} "
                  f"MiB of tensor data; shape {meta.get('shape', 'mix')}: "
                  f"{meta.get('shape_desc', '')}), ")
    lines = [
        sd_txt + f"{meta['runs']} interleaved run(s) per backend and op. MB = 10^6 bytes.",
        "",
        f"Machine before each run: load average (1 min) {meta['loadavg_min']:.1f}-"
        f"{meta['loadavg_max']:.1f}{busy_txt} on {meta['cpus']} CPUs. "
        f"**{busy} of {judged} run(s) busy** (`*`; busy: CPU busy fraction over the second "
        f"before > 25 % or load1 less the benchmark's own share > 0.5 x CPUs).",
        "",
        f"Server: {meta.get('server', 'moto')}"
        + (f", shaping {meta['shaping']}" if meta.get("shaping") else "")
        + (f", rates x{meta['rate_scale']}" if meta.get("rate_scale", 1.0) != 1.0 else "")
        + (
            f", bucket throttled to {meta['throttle']} reads/writes per s"
            if meta.get("throttle")
            else ""
        )
        + ".",
    ]
    c = meta.get("ceiling")
    if c and c.get("best"):
        measured = [m for m in c.get("measured", []) if "error" not in m]
        ms = _measured_phases(measured)
        first = measured[0] if measured else {}
        lines += [
            "",
            f"Server's own ceiling (s3sim, shaping off, {first.get('clients', '?')} lean "
            f"clients, {first.get('object_mib', '?')} MiB objects, "
            f"{first.get('total_mib', '?')} MiB per phase), before then after the runs: "
            f"{ms} MB/s; ratios use PUT {c['best']['put_mb_per_s']:.0f} and GET "
            f"{c['best']['get_mb_per_s']:.0f} MB/s (the higher of each).",
        ]
    lim = meta.get("shaped_limit")
    if lim and lim.get("best"):
        measured = [m for m in lim.get("measured", []) if "error" not in m]
        ms = _measured_phases(measured)
        first = measured[0] if measured else {}
        lines += [
            "",
            f"Shaped lean-client limit (the same s3sim, shaping {meta.get('shaping') or 'on'}, "
            f"{first.get('clients', '?')} lean clients, {first.get('object_mib', '?')} MiB "
            f"bodies with CRC32C, {first.get('total_mib', '?')} MiB per phase), before then "
            f"after the runs: {ms} MB/s; ratios use PUT {lim['best']['put_mb_per_s']:.0f} and "
            f"GET {lim['best']['get_mb_per_s']:.0f} MB/s (the higher of each): the fair 100 %.",
        ]
    return lines


def render(
    summary: dict[str, Any], rat: dict[str, Any], backends: list[str], meta: dict[str, Any]
) -> str:
    """The markdown the benchmark prints: header, per-backend table, goals table."""
    lines = [
        *_header(meta),
        "",
        "| backend | op | MB/s median | MB/s min-max | wall s (median) | / shaped limit "
        "| / server ceiling "
        "| / best peer | client CPU s/GiB (median) | server CPU s/GiB (median) "
        "| peak RSS over baseline MiB (max) | requests/GiB | 503s/GiB | stored MB | marker KB "
        "| runs ok/failed | busy runs |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for op in OPS:
        for b in backends:
            s = summary.get(f"{b}.{op}", {})
            if not s.get("runs"):
                what = "FAILED" if s.get("failed") else "not run"  # not run: --ops
                lines.append(
                    f"| {LABELS[b]} | {op} | {what} | | | | | | | | | | | | | "
                    f"0/{s.get('failed', 0)} | |"
                )
                continue
            peer = s.get("mb_per_s_vs_best_peer")
            peer_txt = f"{peer:.2f}x ({s['best_peer']})" if peer is not None else "n/a"
            lines.append(
                f"| {LABELS[b]} | {op} | {_mbs(s['mb_per_s_median'])}"
                f"{'*' if s.get('busy_runs') else ''} | "
                f"{_mbs(s['mb_per_s_min'])}-{_mbs(s['mb_per_s_max'])} | "
                f"{_fmt(s['wall_s_median'], '.2f')} | "
                f"{_pct(s.get('mb_per_s_vs_shaped_limit'))} | "
                f"{_pct(s.get('mb_per_s_vs_ceiling'))} | {peer_txt} | "
                f"{_fmt(s['cpu_s_per_gib_median'], '.2f')} | "
                f"{_fmt(s['server_cpu_s_per_gib_median'], '.2f')} | "
                f"{_fmt(s['peak_over_baseline_mib_max'])} | "
                f"{_fmt(s.get('requests_per_gib_median'))} | "
                f"{_fmt(s.get('slowdowns_per_gib_median'), '.1f')} | "
                f"{_stored(s.get('stored_bytes_median'), MB, '.1f')} | "
                f"{_stored(s.get('marker_bytes_median'), 1000, '.1f')} | "
                f"{s['runs']}/{s['failed']} | {s.get('busy_runs', 0)} |"
            )
    lines += [
        "",
        "| goal (issue 30; `(issue 40)`: issue 40's, whose peer goals are the same) | target "
        "| measured | met |",
        "|---|---|---:|---|",
    ]

    def row(goal: str, target: str, value: str, ok: bool | None) -> None:
        met = "n/a" if ok is None else ("yes" if ok else "NO")
        lines.append(f"| {goal} | {target} | {value} | {met} |")

    for op in ("load", "save"):
        r = rat.get(f"{op}_mb_per_s_vs_best_other")
        goal = GOALS[f"{op}_vs_best_peer"]
        who = LABELS[r["best_other"]] if r else "-"
        row(
            f"{op} MB/s, s3ckpt / best peer ({who})",
            f">= {goal}x",
            _fmt(r and r["ratio"], ".2f"),
            None if r is None else r["ratio"] >= goal,
        )
        c = rat.get(f"{op}_mb_per_s_vs_ceiling")
        goal = GOALS[f"{op}_vs_ceiling"]
        phase = CEILING_KEY[op][:3].upper()
        row(
            f"{op} MB/s, s3ckpt / server's {phase} ceiling"
            + (f" ({c['ceiling_mb_per_s']:.0f} MB/s)" if c else ""),
            f">= {goal:.0%}",
            _pct(c and c["ratio"]),
            None if c is None else c["ratio"] >= goal,
        )
    for op in ("load", "save"):
        c = rat.get(f"{op}_mb_per_s_vs_shaped_limit")
        goal = GOALS_40[f"{op}_vs_limit"]
        phase = CEILING_KEY[op][:3].upper()
        row(
            f"{op} MB/s, s3ckpt / shaped lean-client {phase} limit"
            + (f" ({c['limit_mb_per_s']:.0f} MB/s)" if c else "")
            + " (issue 40)",
            f">= {goal:.0%}",
            _pct(c and c["ratio"]),
            None if c is None else c["ratio"] >= goal,
        )
    st = rat.get("save_stored_vs_data_and_metadata")
    goal = GOALS_40["stored_vs_data_and_metadata"]
    if st:
        row(
            f"bytes stored by s3ckpt's save / (tensor data + .metadata) "
            f"({st['stored_bytes'] / MB:.1f} MB / "
            f"{(st['tensor_bytes'] + st['metadata_bytes']) / MB:.1f} MB) (issue 40)",
            f"<= {goal:.0f}x",
            _fmt(st["ratio"], ".2f"),
            st["ratio"] <= goal,
        )
    mk = rat.get("save_marker_bytes")
    if mk is not None:
        lines.append(
            f"| s3ckpt.json marker size, KB (issue 40: a small fixed size) | (info) "
            f"| {mk / 1000:.1f} | |"
        )
    v = rat.get("save_peak_over_baseline_mib")
    goal = GOALS["save_peak_over_state_dict_mib"]
    sd_mib = (f"{meta['tensor_bytes'] / MiB:.1f}" if meta.get("size_fixed")
              else f"{meta['size_mib']}")
    row(
        f"save peak RSS over state dict, s3ckpt (MiB, {sd_mib} MiB state dict)",
        f"<= {goal:.0f}",
        _fmt(v),
        None if v is None else v <= goal,
    )
    for op in OPS:
        cpu = rat.get(f"{op}_cpu_per_gib_vs_s3torchconnector")
        if cpu is not None:
            row(
                f"{op} client CPU/GiB, s3ckpt / s3torchconnector (earlier goal)",
                f"<= {GOAL_CPU}",
                _fmt(cpu, ".2f"),
                cpu <= GOAL_CPU,
            )
    for op in OPS:
        m = rat.get(f"{op}_slowdowns_vs_fewest_other")
        if m:
            row(
                f"{op} 503s, s3ckpt / fewest other ({LABELS[m['fewest_other']]}: "
                f"{m['s3ckpt']:.0f} vs {m['other']:.0f}) (earlier goal)",
                "<= 0.33",
                _fmt(m["ratio"], ".2f"),
                None if m["ratio"] is None else m["ratio"] <= GOAL_503,
            )
    for op in OPS:
        m = rat.get(f"{op}_peak_vs_lowest_other")
        if m and m["ratio"] is not None:
            lines.append(
                f"| {op} peak memory, s3ckpt / lowest other ({LABELS[m['lowest_other']]}) "
                f"| (info) | {m['ratio']:.2f} | |"
            )
    if meta.get("busy_runs"):
        lines += [
            "",
            f"{meta['busy_runs']} run(s) were taken on a busy machine: the goals are "
            "judged on a quiet one; rerun with `--quiet-wait`.",
        ]
    return "\n".join(lines)
