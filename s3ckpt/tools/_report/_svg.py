"""The run's chart as inline SVG: geometry (scales, ticks, the step and commit-time axes)
and the markup of points, the metric curve and the best checkpoint; and how values are
written into the page (:func:`esc`, :func:`number`, :func:`metric_text`, :func:`utc_text`).

Every string from a bucket (run and checkpoint names, metric names, pin reasons) is
untrusted and goes through :func:`esc`; nothing reaches the page unescaped.

Both x axes are drawn: points sit at their step (``cx``, ``data-xs``) and carry their
commit-time position (``data-xt``), so the page's script toggles the axis by moving
attributes, never by computing geometry. Points without a y value sit in a "no value" lane.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime

from s3ckpt._units import format_bytes, plural
from s3ckpt.retention._catalog import CheckpointState
from s3ckpt.tools._report._model import CheckpointRow, RunReport
from s3ckpt.tools._report._prices import format_usd

__all__ = ["ANCHOR_HI", "ANCHOR_LO", "chart", "esc", "metric_text", "number", "utc_text"]


def esc(value: object) -> str:
    """Escaped for HTML text and double-quoted attributes (bucket data is untrusted)."""
    return html.escape(str(value))


def number(v: float) -> str:
    """A float for a data attribute: ``repr`` when finite, else what ``parseFloat`` reads."""
    if math.isnan(v):
        return "NaN"
    return repr(float(v)) if math.isfinite(v) else "Infinity" if v > 0 else "-Infinity"


def metric_text(v: float) -> str:
    """A metric value as the page prints it: six significant digits (``nan``, ``inf``)."""
    return f"{v:.6g}" if math.isfinite(v) else str(v)


def utc_text(t: datetime | None) -> str:
    """``t`` in UTC to the second (``2025-06-01 12:00:00Z``); empty for None."""
    return "" if t is None else t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


# Chart geometry (viewBox units).
_W, _H = 960, 290
_L, _R, _T = 70, 20, 24  # margins: left (y labels), right, top (best label)
_PLOT_B = 214  # bottom of the plot area
_LANE = 236  # the lane of points without a value
_AXIS = 254  # the x axis line
_XR = (_L + 8, _W - _R - 8)
ANCHOR_LO, ANCHOR_HI = 240, 720
"""A label left of ``ANCHOR_LO`` hangs right (``start``), right of ``ANCHOR_HI`` left
(``end``), else centred; the page's script uses the same bounds when it moves a label."""


def _nice_ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return [
        round(k * step, 12) for k in range(math.ceil(lo / step), math.floor(hi / step + 1e-9) + 1)
    ]


# Spacings of the time axis' ticks: minutes and hours, then days.
_TIME_STEPS = [*(60 * m for m in (1, 5, 15, 30)), *(3600 * h for h in (1, 3, 6, 12))]
_TIME_STEPS += [86400 * d for d in (1, 2, 7, 14, 30, 91, 365)]


def _time_ticks(lo: float, hi: float, n: int = 6) -> tuple[list[int], str]:
    step = next((s for s in _TIME_STEPS if max(hi - lo, 1.0) / s <= n), _TIME_STEPS[-1])
    fmt = "%Y-%m-%d" if step >= 86400 else "%m-%d %H:%M"
    return list(range(math.ceil(lo / step) * step, math.floor(hi) + 1, step)), fmt


def _step_axis(steps: Sequence[float]) -> tuple[float, float, list[float]]:
    """The step axis: its range and its ticks.

    Steps are whole numbers, so are the ticks. One step (or several saves of the same
    step) sits in the middle of a range of at least one step either side (5 % of the step
    for big ones), which starts at 0 at the lowest when no step is negative: a run whose
    only checkpoint is step 0 gets an axis from 0 to 1, never negative step labels.
    """
    if not steps:
        return 0.0, 1.0, []
    lo, hi = min(steps), max(steps)
    if hi <= lo:
        pad = max(1.0, float(math.ceil(abs(lo) * 0.05)))
        lo, hi = (max(lo - pad, 0.0) if lo >= 0 else lo - pad), hi + pad
    return lo, hi, [t for t in _nice_ticks(lo, hi, 8) if t == math.floor(t)]


def _time_range(times: Sequence[float]) -> tuple[float, float]:
    """The commit-time axis' range: one commit time (or all equal) is centred in an hour."""
    if not times:
        return 0.0, 1.0
    lo, hi = min(times), max(times)
    return (lo - 1800.0, hi + 1800.0) if hi <= lo else (lo, hi)


def _scale(lo: float, hi: float, out_lo: float, out_hi: float) -> Callable[[float], float]:
    if hi <= lo:
        pad = abs(lo) * 0.05 or 1.0
        lo, hi = lo - pad, hi + pad
    return lambda v: out_lo + (v - lo) / (hi - lo) * (out_hi - out_lo)


def _fmt_tick(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    return f"{v:.3g}" if a >= 1e6 or a < 1e-3 else f"{v:,.6g}" if a >= 1000 else f"{v:.6g}"


def _y_value(r: CheckpointRow, metric: str | None) -> float | None:
    if metric is None:
        return float(r.info.size)
    v = r.info.metrics.get(metric)
    return float(v) if v is not None and math.isfinite(v) else None


def _title(r: CheckpointRow, metric: str | None) -> str:
    c = r.info
    state = c.state.value
    if c.damaged:  # marker unreadable, or check found damage: never deleted by a plan
        state += f" · damaged: {c.damage}"
    if c.pinned:
        state += f" · pinned: {c.pinned}"
    size = f"{format_bytes(c.size)} ({c.size} B) · {plural(c.num_objects, 'object')}"
    lines = [f"{c.name} · step {'-' if c.step is None else c.step}", state]
    lines.append(f"{size} · {format_usd(r.cost)}/mo")
    if metric is not None and metric in c.metrics:
        lines.append(f"{metric} = {metric_text(c.metrics[metric])}")
    if r.action is not None:
        lines.append(f"{r.action}: {'; '.join(r.reasons)}")
    return "\n".join(lines)


def chart(rr: RunReport, rid: str) -> str:
    """The run's inline SVG: points at step positions (``cx``), with the time positions in
    ``data-xt`` for the script's axis toggle."""
    rows = rr.rows
    steps = [float(r.info.step) for r in rows if r.info.step is not None]
    times = [r.time.timestamp() for r in rows if r.time is not None]
    ys = [y for y in (_y_value(r, rr.metric) for r in rows) if y is not None]
    step_lo, step_hi, step_ticks = _step_axis(steps)
    sx = _scale(step_lo, step_hi, *_XR)
    t_lo, t_hi = _time_range(times)  # (never equal)
    st = _scale(t_lo, t_hi, *_XR)
    ylo, yhi = min(ys, default=0.0), max(ys, default=1.0)
    ticks_y = _nice_ticks(ylo, yhi, 5)
    if len(ticks_y) > 1:
        ylo, yhi = min(ylo, ticks_y[0]), max(yhi, ticks_y[-1])
    sy = _scale(ylo, yhi, _PLOT_B, _T + 6)
    radius = 4.0 if len(rows) <= 300 else 3.0 if len(rows) <= 3000 else 2.2
    ylabel = rr.metric if rr.metric is not None else "size (bytes)"
    out = [  # then the grid and the y axis
        f'<svg class="chart" viewBox="0 0 {_W} {_H}" role="img" '
        f'aria-label="{esc(ylabel)} by step for {esc(rr.run)}"><g class="grid">'
    ]
    for t in ticks_y:
        y = sy(t)
        out.append(
            f'<line x1="{_L}" x2="{_W - _R}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="yt" x="{_L - 6}" y="{y + 4:.1f}">'
            f"{esc(format_bytes(t) if rr.metric is None else _fmt_tick(t))}</text>"
        )
    out.append(
        f'</g><text class="ylabel" x="{_L - 6}" y="{_T - 8}">{esc(ylabel)}'
        f"{'' if rr.metric is None else f' ({rr.mode} is best)'}</text>"
        f'<text class="lane" x="{_L - 6}" y="{_LANE + 4}">no value</text>'
        f'<line class="laneline" x1="{_L}" x2="{_W - _R}" y1="{_LANE}" y2="{_LANE}"/>'
        f'<line class="axis" x1="{_L}" x2="{_W - _R}" y1="{_AXIS}" y2="{_AXIS}"/>'
    )

    # x axes: both drawn, CSS shows the one the section's data-x names.
    def x_axis(name: str, ticks: Iterable[tuple[float, str]], label: str) -> None:
        """The ticks at their ``(x, text)`` (those off the plot left out), and the label."""
        out.append(f'<g class="ax ax-{name}">')
        for x, text in ticks:
            if _XR[0] - 1 <= x <= _XR[1] + 1:
                out.append(
                    f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{_AXIS}" y2="{_AXIS + 5}"/>'
                    f'<text x="{x:.1f}" y="{_AXIS + 18}">{esc(text)}</text>'
                )
        out.append(f'<text class="xlabel" x="{_W - _R}" y="{_H - 4}">{label}</text></g>')

    x_axis("step", ((sx(t), _fmt_tick(t)) for t in step_ticks), "step")
    tt, fmt = _time_ticks(t_lo, t_hi) if times else ([], "")
    dates = ((st(t), datetime.fromtimestamp(t, UTC).strftime(fmt)) for t in tt)
    x_axis("time", dates, "commit time (UTC)")

    xs = ["" if r.info.step is None else f"{sx(float(r.info.step)):.1f}" for r in rows]
    xt = ["" if r.time is None else f"{st(r.time.timestamp()):.1f}" for r in rows]
    yv = [_y_value(r, rr.metric) for r in rows]

    # The metric curve: committed (and foreign) points with a value, in x order.
    on_curve = (CheckpointState.COMMITTED, CheckpointState.FOREIGN)
    curve = [i for i, r in enumerate(rows) if yv[i] is not None and r.info.state in on_curve]
    if len(curve) > 1:
        ps = " ".join(f"{xs[i]},{sy(yv[i] or 0.0):.1f}" for i in curve if xs[i])
        by_t = sorted((i for i in curve if xt[i]), key=lambda i: float(xt[i]))
        pt = " ".join(f"{xt[i]},{sy(yv[i] or 0.0):.1f}" for i in by_t)
        out.append(f'<polyline class="curve" points="{ps}" data-ps="{ps}" data-pt="{pt}"/>')

    # Where each point sits on both axes (hidden on the step axis when it has no step).
    pos = [
        f'data-xs="{x}" data-xt="{t}"' + ("" if x else ' style="display:none"')
        for x, t in zip(xs, xt, strict=True)
    ]
    out.append('<g class="pts">')
    for i, r in enumerate(rows):
        c = r.info
        y = _LANE if yv[i] is None else sy(yv[i] or 0.0)
        cls = f"pt s-{c.state.value}" + (f" a-{r.action}" if r.action else "")
        cx = f'cx="{xs[i] or 0}" cy="{y:.1f}"'
        if c.pinned:
            cls += " pinned"
            out.append(f'<circle class="ring" {cx} r="{radius + 3:.1f}" data-i="{i}" {pos[i]}/>')
        out.append(
            f'<circle id="{rid}-p{i}" class="{cls}" {cx} r="{radius:.1f}" data-i="{i}" {pos[i]}>'
            f"<title>{esc(_title(r, rr.metric))}</title></circle>"
        )
    out.append("</g>")
    if rr.best is not None:
        i = next(i for i, r in enumerate(rows) if r.info.name == rr.best)
        y = sy(yv[i] or 0.0)
        value = esc(metric_text(rows[i].info.metrics[rr.metric or ""]))
        x = float(xs[i] or 0)  # a label near either edge hangs towards the middle
        anchor = "end" if x > ANCHOR_HI else "start" if x < ANCHOR_LO else "middle"
        out.append(
            f'<circle class="best" cx="{xs[i] or 0}" cy="{y:.1f}" r="{radius + 5:.1f}" {pos[i]}/>'
            f'<text class="bestlabel" x="{xs[i] or 0}" y="{max(y - radius - 9, 12):.1f}" '
            f'text-anchor="{anchor}" {pos[i]}>best {esc(rr.metric)} {value} · {esc(rr.best)}</text>'
        )
    return "".join(out) + "</svg>"
