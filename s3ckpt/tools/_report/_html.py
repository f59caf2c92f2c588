"""The report page as HTML: :func:`render_html` (a :class:`Report` to one self-contained
document) and :func:`build_report` (collect, then render).

Rendered on the server (here): every number is in the DOM before any script runs, and the
small inline script only filters, sorts, toggles the axis and links a hovered point to its
table row. No network, no server, no library: one file that opens from disk.
``docs/report.md`` documents the DOM attributes the page promises (a stable contract).

The stylesheet and the script are package data (``report.css``, ``report.js``, read once
with :mod:`importlib.resources`); ``report.js`` is a ``%``-template filled with the label
anchors of :mod:`~s3ckpt.tools._report._svg` (``%(lo)s``, ``%(hi)s``), and the page's
Content-Security-Policy admits exactly that script by its SHA-256.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from collections.abc import Iterable, Mapping
from importlib import resources
from typing import Any

from s3ckpt._time import iso_z
from s3ckpt._units import format_bytes
from s3ckpt._version import __version__
from s3ckpt.retention import Policy, PolicyFile, RetentionOptions
from s3ckpt.retention._duration import format_duration
from s3ckpt.store._location import LocationLike
from s3ckpt.tools._report._model import STATES, CheckpointRow, Report, RunReport, collect_report
from s3ckpt.tools._report._prices import PriceTable, format_usd
from s3ckpt.tools._report._svg import (
    ANCHOR_HI,
    ANCHOR_LO,
    chart,
    esc,
    metric_text,
    number,
    utc_text,
)

__all__ = ["build_report", "render_html"]

_ACTIONS = ("keep", "delete", "skip")


@functools.cache
def _asset(name: str) -> str:
    """A file of this package's data (``report.css``, ``report.js``), read once."""
    return resources.files("s3ckpt.tools._report").joinpath(name).read_text(encoding="utf-8")


def _summary(doc: Mapping[str, object], has_plan: bool, scope: str) -> str:
    def item(field_: str, label: str | None = None, kind: str = "count") -> str:
        v: Any = doc.get(field_, 0)
        value, text = v, str(v)
        if kind == "bytes":
            value, text = int(v), format_bytes(int(v))
        elif kind == "usd":
            value, text = number(float(v)), f"{format_usd(float(v))}/mo"
        return (
            f'<div><dt>{esc(label or field_.replace("_", " "))}</dt><dd data-field="{field_}" '
            f'data-value="{esc(value)}">{esc(text)}</dd></div>'
        )

    out = [item(n) for n in ("runs", "checkpoints", *STATES, "pinned") if n in doc or n != "runs"]
    out += [item("total_size", "total size", "bytes"), item("num_objects", "objects")]
    out.append(item("cost_month", "storage now", "usd"))
    if has_plan:
        out += [item(a) for a in _ACTIONS]
        out += [item("bytes_freed", "freed by the plan", "bytes"), item("objects_deleted")]
        out.append(item("cost_month_after", "after the plan", "usd"))
        out.append(item("cost_saved", "saved", "usd"))
    versioned = doc.get("versioning") in ("Enabled", "Suspended")
    if versioned and isinstance(doc.get("noncurrent_bytes"), int):
        out.append(item("noncurrent_bytes", "noncurrent versions (billed until expired)", "bytes"))
    return f'<dl class="summary" data-scope="{esc(scope)}">' + "".join(out) + "</dl>"


_COLUMNS: tuple[tuple[str, str, str], ...] = (
    # (header, data attribute to sort on, "num" | "str")
    ("#", "i", "num"),
    ("name", "name", "str"),
    ("step", "step", "num"),
    ("state", "state", "str"),
    ("committed", "committedAt", "str"),
    ("size", "size", "num"),
    ("objects", "numObjects", "num"),
    ("metrics", "metric", "num"),
    ("$/month", "cost", "num"),
    ("pinned", "pinned", "str"),
    ("action", "action", "str"),  # then "reasons", not sorted
)


def _row(r: CheckpointRow, i: int, rid: str, metric: str | None) -> str:
    c = r.info
    step = "" if c.step is None else str(c.step)
    committed = iso_z(c.committed_at) or ""
    attrs = [
        f'id="{rid}-c{i}" class="checkpoint" data-i="{i}" data-name="{esc(c.name)}"',
        f'data-url="{esc(c.url)}" data-step="{step}" data-state="{c.state.value}"',
        f'data-committed-at="{committed}" data-size="{c.size}" data-num-objects="{c.num_objects}"',
        f'data-cost="{number(r.cost)}" data-action="{r.action or ""}"',
    ]
    if r.time is not None:
        attrs.append(f'data-t="{r.time.timestamp():.3f}"')
    if metric is not None and (mv := c.metrics.get(metric)) is not None:
        attrs.append(f'data-metric="{number(mv)}"')
    if c.pinned:
        attrs.append(f'data-pinned="{esc(c.pinned)}"')
    by_class = sorted(c.bytes_by_class.items())
    classes = ""
    if by_class and {k for k, _ in by_class} != {"STANDARD"}:
        attrs.append(f'data-classes="{esc(" ".join(f"{k}={v}" for k, v in by_class))}"')
        classes = f'<small class="cls">{esc(", ".join(k for k, _ in by_class))}</small>'
    metrics = "".join(
        f'<span data-metric="{esc(k)}" data-value="{number(v)}">'
        f"{esc(k)}={esc(metric_text(v))}</span> "
        for k, v in c.metrics.items()
    )
    reasons = "".join(f"<li>{esc(x)}</li>" for x in r.reasons)
    action = f'<span class="act a-{r.action}">{r.action}</span>' if r.action else "-"
    return (
        f"<tr {' '.join(attrs)}>"
        f"<td>{i + 1}</td>"
        f'<td class="name">{esc(c.name)}</td>'
        f'<td class="n">{step or "-"}</td>'
        f'<td><span class="badge s-{c.state.value}"'
        + (f' title="{esc(c.damage or "")}">damaged' if c.damaged else f">{c.state.value}")
        + "</span></td>"
        f'<td class="t">{esc(utc_text(c.committed_at)) or "-"}</td>'
        f'<td class="n">{esc(format_bytes(c.size))}<small class="b">{c.size} B</small>'
        f"{classes}</td>"
        f'<td class="n">{c.num_objects}</td>'
        f'<td class="metrics">{metrics or "-"}</td>'
        f'<td class="n">{esc(format_usd(r.cost))}</td>'
        f'<td class="pin">{esc(c.pinned or "")}</td>'
        f"<td>{action}</td>"
        f'<td><ul class="reasons">{reasons}</ul></td>'
        "</tr>"
    )


def _run_section(rr: RunReport, k: int) -> str:
    rid = f"r{k}"
    out = [
        f'<section class="run" id="{rid}" data-run="{esc(rr.run)}" data-x="step" '
        f'data-metric="{esc(rr.metric or "")}" data-mode="{rr.mode}" '
        f'data-best="{esc(rr.best or "")}">',
        f'<h2><span class="runname">{esc(rr.run)}</span></h2>',
        _summary(rr.summary(), rr.plan is not None, str(rr.run)),
    ]
    if rr.versions is not None and (line := rr.versions.sentence(rr.run.prefix)):
        out.append(f'<p class="muted versions">{esc(line)}</p>')
    if rr.rows:
        no_step = sum(1 for r in rr.rows if r.info.step is None)
        note = f" · {no_step} without a step (shown on the time axis only)" if no_step else ""
        out.append(
            '<figure class="chartbox"><div class="controls" role="group" aria-label="x axis">'
            '<span>x axis:</span><button type="button" data-xmode="step" aria-pressed="true">'
            'step</button><button type="button" data-xmode="time" aria-pressed="false">'
            f'commit time</button><span class="muted">{esc(note)}</span></div>'
            + chart(rr, rid)
            + '<figcaption class="detail" aria-live="polite">Hover a point for details; '
            "click it to find its row.</figcaption></figure>"
        )
        head = "".join(
            f'<th data-sort="{key}" data-type="{kind}" aria-sort="none">{esc(h)}</th>'
            for h, key, kind in _COLUMNS
        )
        body = "".join(_row(r, i, rid, rr.metric) for i, r in enumerate(rr.rows))
        out.append(
            f'<div class="tablewrap"><table class="checkpoints"><thead><tr>{head}<th>reasons</th>'
            f"</tr></thead><tbody>{body}</tbody></table></div>"
        )
    else:
        out.append('<p class="muted">No checkpoints (the run holds only a lease).</p>')
    return "".join(out) + "</section>"


def _prices(report: Report, used: set[str]) -> str:
    rows = "".join(
        f'<tr data-class="{esc(cls)}" data-price="{number(p)}"'
        f"{' class=used' if cls in used else ''}>"
        f"<td>{esc(cls)}</td><td class=n>${p:g}</td><td>{'used' if cls in used else ''}</td></tr>"
        for cls, p in sorted(report.prices.prices.items(), key=lambda kv: -kv[1])
    )
    return (
        '<details class="prices"><summary>Storage prices (USD per GB-month, GB = 2<sup>30</sup>'
        f" bytes): {esc(report.prices.source)}</summary><table><thead><tr><th>storage class</th>"
        f"<th>USD / GB-month</th><th></th></tr></thead><tbody>{rows}</tbody></table>"
        '<p class="muted">An estimate: bytes times the price. Minimum billable sizes and '
        "durations, per-object overheads, requests and transfer are not counted.</p></details>"
    )


def _filter_css(has_plan: bool) -> str:
    """One rule per filter value: filtering is a body attribute, no per-row script."""
    rules = [("fstate", s, f'[data-state="{s}"]', f"s-{s}") for s in STATES]
    rules.append(("fstate", "pinned", "[data-pinned]", "pinned"))
    rules += [("faction", a, f'[data-action="{a}"]', f"a-{a}") for a in _ACTIONS if has_plan]
    return "\n".join(
        f'body[data-{f}="{v}"] tr.checkpoint:not({row}),'
        f'body[data-{f}="{v}"] .pt:not(.{pt}){{display:none!important}}'
        for f, v, row, pt in rules
    )


def _legend(has_plan: bool) -> str:
    def dot(cls: str, extra: str = "", r: int = 4) -> str:
        return (
            f'<svg width="14" height="14" viewBox="0 0 14 14"><circle class="{cls}" cx="7" '
            f'cy="7" r="{r}"/>{extra}</svg>'
        )

    items = [f"{dot(f'sw s-{s}')} {s.replace('_', ' ')}" for s in STATES]
    items.append(f"{dot('sw s-committed', '<circle class=ring cx=7 cy=7 r=6 />')} pinned (ring)")
    items.append(f"{dot('best', r=6)} best by the metric")
    if has_plan:
        items.append(f"{dot('sw s-committed a-keep')} kept (filled)")
        items.append(f"{dot('sw s-committed a-delete')} deleted by the plan (hollow)")
        items.append(f"{dot('sw s-in_progress a-skip')} skipped (faint)")
    return '<div class="legend">' + "".join(f"<span>{i}</span>" for i in items) + "</div>"


def render_html(report: Report) -> str:
    """The page of ``report``: one HTML document, no external resources (its
    Content-Security-Policy allows none), every number in the DOM before any script runs.

    The DOM contract (stable; ``docs/report.md``): ``main`` carries ``data-root``,
    ``data-now`` and ``data-policy``; ``dl.summary[data-scope]`` holds ``dd[data-field]``
    with exact ``data-value``\\ s (bytes, counts, USD per month); each run is a
    ``section.run[data-run]`` with ``data-metric`` and ``data-best``; each checkpoint a
    ``tr.checkpoint`` with ``data-name``, ``data-url``, ``data-step``, ``data-state``,
    ``data-committed-at``, ``data-size``, ``data-num-objects``, ``data-cost``,
    ``data-action`` (and ``data-pinned``, ``data-metric``, ``data-t``, ``data-classes`` when
    they apply), its reasons as ``ul.reasons > li``; and a chart point ``circle.pt`` per
    checkpoint (``id`` ``{run id}-p{i}``, row ``{run id}-c{i}``) with a ``<title>``.
    """
    has_plan = report.policy is not None
    used = {cls for rr in report.runs for cls in rr.bytes_by_class()}
    # No innerHTML anywhere: data reaches the page only as escaped markup rendered here; the
    # script reads attributes and writes textContent. Listeners are delegated (one per event
    # type for the whole document), so 10,000 points cost nothing to wire.
    script = (_asset("report.js") % {"lo": ANCHOR_LO, "hi": ANCHOR_HI}).strip()
    script_hash = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode()
    csp = (
        "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
        f"script-src 'sha256-{script_hash}'"
    )
    policy = f"policy <b>{esc(report.policy)}</b> (dry run: nothing was deleted)"
    meta = [f"root <b>{esc(report.root)}</b>", f"as of <b>{esc(iso_z(report.now))}</b>"]
    meta.append(policy if has_plan else "no policy (pass --policy to overlay a plan)")
    meta.append(f"grace {esc(format_duration(report.grace))}")
    if report.include_foreign:
        meta.append("foreign checkpoints included")

    def select(name: str, values: Iterable[str]) -> str:
        opts = "".join(f'<option value="{v}">{v.replace("_", " ")}</option>' for v in values)
        return (
            f'<label>{name} <select data-filter="{name}"><option value="">all</option>'
            f"{opts}</select></label>"
        )

    toolbar = select("state", (*STATES, "pinned")) + (
        select("action", _ACTIONS) if has_plan else ""
    )
    notes = "".join(f'<p class="muted">note: {esc(n)}</p>' for n in report.notes)
    runs = "".join(_run_section(rr, k) for k, rr in enumerate(report.runs))
    if not report.runs:
        runs = f'<p class="muted">No checkpoints under {esc(report.root)}.</p>'
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f'<meta name="generator" content="s3ckpt {esc(__version__)}">'
        f"<title>{esc(report.title)}</title><style>\n{_asset('report.css')}"
        f"{_filter_css(has_plan)}</style></head>"
        f'<body data-fstate="" data-faction=""><main data-root="{esc(report.root)}" '
        f'data-now="{esc(iso_z(report.now))}" data-policy="{esc(report.policy or "")}">'
        f"<h1>{esc(report.title)}</h1>"
        f'<p class="meta">{" · ".join(meta)}</p>{notes}'
        + _summary(report.summary(), has_plan, "all")
        + _prices(report, used)
        + f'<div class="toolbar">{toolbar}</div>'
        + _legend(has_plan)
        + runs
        + f"</main><footer>Generated by s3ckpt {esc(__version__)} at "
        f"{esc(iso_z(report.now))}; one self-contained file, no network.</footer>"
        f"<script>{script}</script></body></html>\n"
    )


def build_report(
    location: LocationLike,
    /,
    *,
    policy: Policy | PolicyFile | None = None,
    options: RetentionOptions | None = None,
    prices: PriceTable | None = None,
    title: str | None = None,
) -> str:
    """The report page of ``location`` as one self-contained HTML document.

    :func:`~s3ckpt.tools._report.collect_report` then :func:`render_html`; the arguments are
    :func:`~s3ckpt.tools._report.collect_report`'s. Example::

        from s3ckpt.retention import RetentionOptions, load_policy
        from s3ckpt.tools import build_report

        page = build_report(
            "s3://bucket/runs/",
            policy=load_policy("pretraining"),
            options=RetentionOptions(max_delete=10),
        )
        Path("report.html").write_text(page, encoding="utf-8")
    """
    return render_html(
        collect_report(location, policy=policy, options=options, prices=prices, title=title)
    )
