"""Draw the performance plots of docs/performance.md from committed benchmark JSON.

    scripts/build-docs.sh plots                      (in the docs venv, which has matplotlib)
    .venv-docs/bin/python benchmarks/plot.py [--dcp FILE] [--async FILE] [--out DIR]

Inputs (defaults under benchmarks/results/):

- ``dcp_s3sim_1gib_large5_16cpu.json`` (the default ``--dcp``): ``bench_dcp.py --out``
  (per-backend summary of every save and load;
  from a run that measured the server's ceiling, also the ratios to it);
- ``async_256mib.json``: ``{"meta": ..., "result": <the JSON line bench_async.py prints>}``.

Outputs, in docs/img/: ``throughput.png`` (MB/s per backend and op, median with the min-max
range; with a ceiling in the JSON, the server's PUT and GET ceilings drawn across and each
bar labelled with its share of it), ``peak_memory.png`` (peak RSS over the baseline per
backend and op), ``ceiling_ratio.png`` (only with a ceiling: each backend's MB/s as a
fraction of the server's ceiling, issue 30's goals for s3ckpt drawn across) and
``async_blocked.png`` (training-blocked seconds per save: synchronous, first async, warm
async). A median that includes a run taken on a busy machine is labelled with ``*``. The
PNGs carry no timestamp or version, so redrawing unchanged JSON gives the same bytes with
the same matplotlib.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import PercentFormatter

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

#: bench_dcp.py's backend keys -> the names the docs use, in plot order.
BACKENDS: dict[str, str] = {
    "s3ckpt": "s3ckpt",
    "s3tc": "s3torch-\nconnector",
    "fsspec": "FsspecWriter\n+ s3fs",
    "boto3": "raw boto3\n(1 blob, baseline)",
}
OPS = ("save", "load")
COLORS = {"save": "#4C72B0", "load": "#DD8452"}
SAVE_OPTS: dict[str, Any] = {"dpi": 110, "metadata": {"Software": None}, "bbox_inches": "tight"}


#: issue 30's goals for s3ckpt as a fraction of the server's ceiling.
CEILING_GOALS = {"save": 0.5, "load": 0.4}
CEILING_KEY = {"save": "put_mb_per_s", "load": "get_mb_per_s"}


def _subtitle(meta: dict[str, Any]) -> str:
    lo, hi = meta.get("loadavg_min"), meta.get("loadavg_max")
    load = f", load avg {lo:.1f}-{hi:.1f}" if lo is not None and hi is not None else ""
    server = meta.get("server") or "moto"
    if meta.get("shaping"):
        server += f" ({meta['shaping']} shaping)"
    shape = f" ({meta['shape']})" if meta.get("shape") else ""
    busy = ""
    if meta.get("runs_judged"):
        busy = f", {meta.get('busy_runs', 0)} of {meta['runs_judged']} runs busy (*)"
    return (
        f"{meta['size_mib']} MiB fp32 state dict{shape}, {meta['runs']} interleaved runs, "
        f"{server} on 127.0.0.1, {meta.get('cpus', '?')} CPUs{load}{busy}"
    )


def _ceiling(data: dict[str, Any]) -> dict[str, float] | None:
    """The best PUT/GET ceiling the run measured (bench_dcp.py's meta), or None."""
    return ((data["meta"].get("ceiling") or {}).get("best")) or None


def _star(row: dict[str, Any]) -> str:
    return "*" if row.get("busy_runs") else ""


def _present(summary: dict[str, Any]) -> list[str]:
    return [b for b in BACKENDS if any(f"{b}.{op}" in summary for op in OPS)]


def plot_throughput(data: dict[str, Any], out: Path) -> Path:
    """MB/s per backend, save and load side by side; bars are medians, whiskers min-max."""
    summary = data["summary"]
    backends = _present(summary)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4), layout="constrained")
    for ax, op in zip(axes, OPS, strict=True):
        ceil = (_ceiling(data) or {}).get(CEILING_KEY[op])
        names, med, err, labels = [], [], [[], []], []
        for b in backends:
            row = summary.get(f"{b}.{op}")
            if not row or row.get("mb_per_s_median") is None:
                continue
            names.append(BACKENDS[b])
            m = row["mb_per_s_median"]
            med.append(m)
            err[0].append(m - row["mb_per_s_min"])
            err[1].append(row["mb_per_s_max"] - m)
            labels.append(f"{m:.0f}{_star(row)}" + (f"\n{m / ceil:.0%}" if ceil else ""))
        bars = ax.bar(names, med, yerr=err, capsize=4, color=COLORS[op])
        ax.bar_label(bars, labels=labels, padding=3, fontsize=8)
        if ceil:
            phase = CEILING_KEY[op][:3].upper()
            ax.axhline(ceil, color="#555555", linestyle="--", linewidth=1)
            ax.annotate(
                f"server's {phase} ceiling {ceil:.0f}",
                (0.01, ceil),
                xycoords=("axes fraction", "data"),
                va="bottom",
                fontsize=8,
                color="#555555",
            )
        ax.set_title(f"DCP {op}")
        ax.set_ylabel("MB/s (higher is better)")
        ax.tick_params(axis="x", labelsize=8)
        ax.margins(y=0.15)
    fig.suptitle("Throughput per backend\n" + _subtitle(data["meta"]), fontsize=10)
    path = out / "throughput.png"
    fig.savefig(path, **SAVE_OPTS)
    plt.close(fig)
    return path


def plot_peak_memory(data: dict[str, Any], out: Path) -> Path:
    """Peak RSS over the baseline (the state dict), max over runs, per backend and op."""
    summary = data["summary"]
    backends = _present(summary)
    fig, ax = plt.subplots(figsize=(8, 4.2), layout="constrained")
    width = 0.38
    xs = range(len(backends))
    for i, op in enumerate(OPS):
        vals = [
            (summary.get(f"{b}.{op}") or {}).get("peak_over_baseline_mib_max") or 0.0
            for b in backends
        ]
        bars = ax.bar([x + (i - 0.5) * width for x in xs], vals, width, label=op, color=COLORS[op])
        ax.bar_label(bars, labels=[f"{v:.0f}" for v in vals], padding=2, fontsize=8)
    ax.set_xticks(list(xs), [BACKENDS[b] for b in backends], fontsize=8)
    ax.set_ylabel("MiB over the state dict (lower is better)")
    ax.legend()
    ax.margins(y=0.15)
    ax.set_title("Peak client memory per backend\n" + _subtitle(data["meta"]), fontsize=10)
    path = out / "peak_memory.png"
    fig.savefig(path, **SAVE_OPTS)
    plt.close(fig)
    return path


def plot_ceiling_ratio(data: dict[str, Any], out: Path) -> Path | None:
    """Each backend's median MB/s as a fraction of the server's ceiling measured in the same
    run (save / PUT, load / GET), with issue 30's goals for s3ckpt; None without a ceiling."""
    ceil = _ceiling(data)
    if not ceil:
        return None
    summary = data["summary"]
    backends = _present(summary)
    fig, ax = plt.subplots(figsize=(8, 4.2), layout="constrained")
    width = 0.38
    xs = range(len(backends))
    for i, op in enumerate(OPS):
        rows = [summary.get(f"{b}.{op}") or {} for b in backends]
        vals = [
            (r["mb_per_s_median"] / ceil[CEILING_KEY[op]]) if r.get("mb_per_s_median") else 0.0
            for r in rows
        ]
        label = f"{op} / {CEILING_KEY[op][:3].upper()} ceiling ({ceil[CEILING_KEY[op]]:.0f} MB/s)"
        bars = ax.bar(
            [x + (i - 0.5) * width for x in xs], vals, width, label=label, color=COLORS[op]
        )
        ax.bar_label(
            bars,
            labels=[f"{v:.0%}{_star(r)}" for v, r in zip(vals, rows, strict=True)],
            padding=2,
            fontsize=8,
        )
        ax.axhline(CEILING_GOALS[op], color=COLORS[op], linestyle=":", linewidth=1)
    ax.set_xticks(list(xs), [BACKENDS[b] for b in backends], fontsize=8)
    ax.set_ylabel("fraction of the server's ceiling (higher is better)")
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.legend(fontsize=8)
    ax.margins(y=0.15)
    ax.set_title(
        "Throughput as a share of the server's own ceiling (dotted: s3ckpt's goals)\n"
        + _subtitle(data["meta"]),
        fontsize=10,
    )
    path = out / "ceiling_ratio.png"
    fig.savefig(path, **SAVE_OPTS)
    plt.close(fig)
    return path


def plot_async(data: dict[str, Any], out: Path) -> Path:
    """Training-blocked seconds per save: synchronous save, first async save, warm async."""
    res = data["result"]
    sync = statistics.median(res["sync_s"])
    first = res["async_blocked_s"][0]
    warm = res["async_blocked_s"][1:]
    labels = ["synchronous save", "async_save, first\n(allocates staging)"]
    values = [sync, first]
    if warm:
        labels.append(f"async_save, warm\n(median of {len(warm)})")
        values.append(statistics.median(warm))
    fig, ax = plt.subplots(figsize=(7, 3.8), layout="constrained")
    bars = ax.bar(labels, values, color=["#8C8C8C", "#DD8452", "#55A868"][: len(values)])
    ax.bar_label(
        bars,
        labels=[f"{v:.2f} s ({v / sync:.0%})" for v in values],
        padding=3,
        fontsize=9,
    )
    ax.set_ylabel("training blocked per save (s)")
    ax.margins(y=0.18)
    gib = res["bytes"] / 2**30
    ax.set_title(
        f"Checkpointer: time training waits per save, {gib:.2f} GiB state\n"
        f"(async upload to commit: median {statistics.median(res['async_commit_s']):.1f} s, "
        "overlapping training)",
        fontsize=10,
    )
    path = out / "async_blocked.png"
    fig.savefig(path, **SAVE_OPTS)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    """Draw every plot; print the paths written."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--dcp", type=Path, default=HERE / "results" / "dcp_s3sim_1gib_large5_16cpu.json"
    )
    ap.add_argument(
        "--async", dest="async_", type=Path, default=HERE / "results" / "async_256mib.json"
    )
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "img")
    ap.add_argument("--no-async", action="store_true", help="draw only the DCP plots")
    args = ap.parse_args(argv)
    plt.rcParams["svg.hashsalt"] = "s3ckpt"
    args.out.mkdir(parents=True, exist_ok=True)
    dcp = json.loads(args.dcp.read_text())
    written = [plot_throughput(dcp, args.out), plot_peak_memory(dcp, args.out)]
    ratio = plot_ceiling_ratio(dcp, args.out)
    if ratio is not None:
        written.append(ratio)
    if not args.no_async:
        written.append(plot_async(json.loads(args.async_.read_text()), args.out))
    for path in written:
        print(path.relative_to(REPO) if path.is_relative_to(REPO) else path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
