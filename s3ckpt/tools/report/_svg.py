"""The run's chart as inline SVG: geometry (scales, ticks, the step and commit-time axes)
and the markup of points, the metric curve and the best checkpoint.

Both x axes are drawn: points sit at their step (``cx``, ``data-xs``) and carry their
commit-time position (``data-xt``), so the page's script toggles the axis by moving
attributes, never by computing geometry. Points without a y value sit in a "no value" lane.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime

from s3ckpt._units import format_bytes, plural
from s3ckpt.retention import CheckpointState
from s3ckpt.tools.report._model import CheckpointRow, RunReport
from s3ckpt.tools.report._prices import format_usd
from s3ckpt.tools.report._text import esc, metric_text

__all__ = ["ANCHOR_HI", "ANCHOR_LO", "chart"]

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
    first = math.ceil(lo / step) * step
    out = []
    v = first
    while v <= hi + step * 1e-9:
        out.append(round(v, 12))
        v += step
    return out


_TIME_STEPS = [
    60,
    300,
    900,
    1800,
    3600,
    3 * 3600,
    6 * 3600,
    12 * 3600,
    86400,
    2 * 86400,
    7 * 86400,
    14 * 86400,
    30 * 86400,
    91 * 86400,
    365 * 86400,
]


def _time_ticks(lo: float, hi: float, n: int = 6) -> tuple[list[float], str]:
    span = max(hi - lo, 1.0)
    step = next((s for s in _TIME_STEPS if span / s <= n), _TIME_STEPS[-1])
    fmt = "%Y-%m-%d" if step >= 86400 else "%m-%d %H:%M"
    first = math.ceil(lo / step) * step
    ticks: list[float] = []
    v = first
    while v <= hi:
        ticks.append(v)
        v += step
    return ticks, fmt


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


class _Scale:
    def __init__(self, lo: float, hi: float, out_lo: float, out_hi: float) -> None:
        if hi <= lo:
            pad = abs(lo) * 0.05 or 1.0
            lo, hi = lo - pad, hi + pad
        self.lo, self.hi, self.out_lo, self.out_hi = lo, hi, out_lo, out_hi

    def __call__(self, v: float) -> float:
        return self.out_lo + (v - self.lo) / (self.hi - self.lo) * (self.out_hi - self.out_lo)


def _fmt_tick(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e6 or a < 1e-3:
        return f"{v:.3g}"
    return f"{v:,.6g}" if a >= 1000 else f"{v:.6g}"


def _y_value(r: CheckpointRow, metric: str | None) -> float | None:
    if metric is None:
        return float(r.info.size)
    v = r.info.metrics.get(metric)
    return float(v) if v is not None and math.isfinite(v) else None


def _title(r: CheckpointRow, metric: str | None) -> str:
    c = r.info
    lines = [f"{c.name} · step {'-' if c.step is None else c.step}"]
    state = c.state.value
    if c.damaged:  # marker unreadable, or check found damage: never deleted by a plan
        state += f" · damaged: {c.damage}"
    if c.pinned:
        state += f" · pinned: {c.pinned}"
    lines.append(state)
    lines.append(
        f"{format_bytes(c.size)} ({c.size} B) · {plural(c.num_objects, 'object')} · "
        f"{format_usd(r.cost)}/mo"
    )
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
    sx = _Scale(step_lo, step_hi, *_XR)
    st = _Scale(*_time_range(times), *_XR)
    ylo, yhi = min(ys, default=0.0), max(ys, default=1.0)
    ticks_y = _nice_ticks(ylo, yhi, 5)
    if len(ticks_y) > 1:
        ylo, yhi = min(ylo, ticks_y[0]), max(yhi, ticks_y[-1])
    sy = _Scale(ylo, yhi, _PLOT_B, _T + 6)
    n = len(rows)
    radius = 4.0 if n <= 300 else 3.0 if n <= 3000 else 2.2
    out: list[str] = []
    ylabel = rr.metric if rr.metric is not None else "size (bytes)"
    out.append(
        f'<svg class="chart" viewBox="0 0 {_W} {_H}" role="img" '
        f'aria-label="{esc(ylabel)} by step for {esc(rr.run)}">'
    )
    # Grid and y axis.
    out.append('<g class="grid">')
    for t in ticks_y:
        y = sy(t)
        out.append(
            f'<line x1="{_L}" x2="{_W - _R}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="yt" x="{_L - 6}" y="{y + 4:.1f}">'
            f"{esc(format_bytes(t) if rr.metric is None else _fmt_tick(t))}</text>"
        )
    out.append("</g>")
    out.append(
        f'<text class="ylabel" x="{_L - 6}" y="{_T - 8}">{esc(ylabel)}'
        f"{'' if rr.metric is None else f' ({rr.mode} is best)'}</text>"
        f'<text class="lane" x="{_L - 6}" y="{_LANE + 4}">no value</text>'
        f'<line class="laneline" x1="{_L}" x2="{_W - _R}" y1="{_LANE}" y2="{_LANE}"/>'
        f'<line class="axis" x1="{_L}" x2="{_W - _R}" y1="{_AXIS}" y2="{_AXIS}"/>'
    )
    # x axes: both drawn, CSS shows the one the section's data-x names.
    out.append('<g class="ax ax-step">')
    for t in step_ticks:
        x = sx(t)
        if _XR[0] - 1 <= x <= _XR[1] + 1:
            out.append(
                f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{_AXIS}" y2="{_AXIS + 5}"/>'
                f'<text x="{x:.1f}" y="{_AXIS + 18}">{esc(_fmt_tick(t))}</text>'
            )
    out.append(f'<text class="xlabel" x="{_W - _R}" y="{_H - 4}">step</text></g>')
    out.append('<g class="ax ax-time">')
    tt, fmt = _time_ticks(st.lo, st.hi) if times else ([], "")
    for t in tt:
        x = st(t)
        if _XR[0] - 1 <= x <= _XR[1] + 1:
            label = datetime.fromtimestamp(t, UTC).strftime(fmt)
            out.append(
                f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{_AXIS}" y2="{_AXIS + 5}"/>'
                f'<text x="{x:.1f}" y="{_AXIS + 18}">{esc(label)}</text>'
            )
    out.append(f'<text class="xlabel" x="{_W - _R}" y="{_H - 4}">commit time (UTC)</text></g>')

    xs: list[str] = []
    xt: list[str] = []
    yv: list[float | None] = []
    for r in rows:
        xs.append("" if r.info.step is None else f"{sx(float(r.info.step)):.1f}")
        xt.append("" if r.time is None else f"{st(r.time.timestamp()):.1f}")
        yv.append(_y_value(r, rr.metric))

    # The metric curve: committed (and foreign) points with a value, in x order.
    curve = [
        i
        for i, r in enumerate(rows)
        if yv[i] is not None
        and r.info.state in (CheckpointState.COMMITTED, CheckpointState.FOREIGN)
    ]
    if len(curve) > 1:
        ps = " ".join(f"{xs[i]},{sy(yv[i] or 0.0):.1f}" for i in curve if xs[i])
        by_t = sorted((i for i in curve if xt[i]), key=lambda i: float(xt[i]))
        pt = " ".join(f"{xt[i]},{sy(yv[i] or 0.0):.1f}" for i in by_t)
        out.append(f'<polyline class="curve" points="{ps}" data-ps="{ps}" data-pt="{pt}"/>')

    out.append('<g class="pts">')
    for i, r in enumerate(rows):
        c = r.info
        y = _LANE if yv[i] is None else sy(yv[i] or 0.0)
        cls = f"pt s-{c.state.value}" + (f" a-{r.action}" if r.action else "")
        if c.pinned:
            cls += " pinned"
        hide = ' style="display:none"' if not xs[i] else ""
        cx = xs[i] or "0"
        if c.pinned:
            out.append(
                f'<circle class="ring" cx="{cx}" cy="{y:.1f}" r="{radius + 3:.1f}" '
                f'data-xs="{xs[i]}" data-xt="{xt[i]}" data-i="{i}"{hide}/>'
            )
        out.append(
            f'<circle id="{rid}-p{i}" class="{cls}" cx="{cx}" cy="{y:.1f}" r="{radius:.1f}" '
            f'data-i="{i}" data-xs="{xs[i]}" data-xt="{xt[i]}"{hide}>'
            f"<title>{esc(_title(r, rr.metric))}</title></circle>"
        )
    out.append("</g>")
    if rr.best is not None:
        i = next(i for i, r in enumerate(rows) if r.info.name == rr.best)
        r = rows[i]
        y = sy(yv[i] or 0.0)
        hide = ' style="display:none"' if not xs[i] else ""
        value = metric_text(r.info.metrics[rr.metric or ""])
        out.append(
            f'<circle class="best" cx="{xs[i] or 0}" cy="{y:.1f}" r="{radius + 5:.1f}" '
            f'data-xs="{xs[i]}" data-xt="{xt[i]}"{hide}/>'
            f'<text class="bestlabel" x="{xs[i] or 0}" y="{max(y - radius - 9, 12):.1f}" '
            f'text-anchor="{_anchor(float(xs[i] or 0))}" '
            f'data-xs="{xs[i]}" data-xt="{xt[i]}"{hide}>best {esc(rr.metric)} '
            f"{esc(value)} · {esc(r.info.name)}</text>"
        )
    out.append("</svg>")
    return "".join(out)


def _anchor(x: float) -> str:
    """Where a label at ``x`` hangs: towards the middle near either edge of the chart."""
    return "end" if x > ANCHOR_HI else "start" if x < ANCHOR_LO else "middle"
