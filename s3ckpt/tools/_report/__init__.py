"""``s3ckpt report``: one self-contained HTML page about the checkpoints under a prefix.

The page shows, per run, every checkpoint on a step (or commit-time) axis with its state, the
metric curve with the best checkpoint marked, sizes, the storage cost per month and, with a
policy, what the plan keeps or deletes and why (on hover and in a table). ``docs/report.md``
documents the DOM attributes the page promises (a stable contract, read by tests and
scripts).

Pipeline, all pure but the listing::

    scan(location)               one paged listing, like ``s3ckpt ls``
    plan(run, policy, now)       per run, like ``s3ckpt prune`` (a dry run: no lease, no delete)
    PriceTable.monthly_cost      bytes per storage class -> USD per month
    render_html(Report)          the page

Modules, one concept each: ``_prices`` (:class:`PriceTable`, :func:`parse_price`,
:func:`format_usd`), ``_model`` (:class:`Report`, :class:`RunReport`,
:class:`CheckpointRow`, and :func:`collect_report`: the scan and each run's dry-run plan),
``_svg`` (the chart; escaping and numbers in the page), ``_html``
(:func:`render_html`, :func:`build_report`); ``report.css`` and ``report.js`` are package
data. Needs no torch (the retention cron image can run it).

Example::

    from s3ckpt.retention import load_policy
    from s3ckpt.tools._report import build_report

    page = build_report("s3://bucket/runs/", policy=load_policy("pretraining"))
"""

from __future__ import annotations

from s3ckpt.tools._report._html import build_report, render_html
from s3ckpt.tools._report._model import STATES, CheckpointRow, Report, RunReport, collect_report
from s3ckpt.tools._report._prices import (
    DEFAULT_PRICES,
    GIB,
    PRICES_SOURCE,
    PriceTable,
    format_usd,
    parse_price,
)

__all__ = [
    "DEFAULT_PRICES",
    "GIB",
    "PRICES_SOURCE",
    "STATES",
    "CheckpointRow",
    "PriceTable",
    "Report",
    "RunReport",
    "build_report",
    "collect_report",
    "format_usd",
    "parse_price",
    "render_html",
]
