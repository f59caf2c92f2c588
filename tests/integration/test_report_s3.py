"""``s3ckpt report`` against the moto S3 server, opened in a real headless Chromium.

A bucket of several runs (committed checkpoints with metrics, a pinned one, a save in
progress, an abandoned save, a stock-DCP one, a run in another storage class, a run whose
name is HTML) is reported with a policy through the CLI; the page must render without an
error or a network request, and the numbers in its DOM must be those of ``s3ckpt ls --json``
and ``s3ckpt prune --json`` (a dry run with the same policy and ``--now``).

Chromium comes from the system packages (``/usr/bin/chromium``), driven by Playwright.
Without it the tests skip, or fail when ``CI`` is set (CI installs it).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from benchmarks._chromium import CHROMIUM, launch
from s3ckpt.cli import main
from s3ckpt.config import S3Config
from s3ckpt.format._names import METADATA_NAME, data_name, heartbeat_name
from s3ckpt.retention import CheckpointInfo, pin
from s3ckpt.retention._catalog import CheckpointState
from s3ckpt.store.s3 import S3Store
from s3ckpt.tools._report import (
    DEFAULT_PRICES,
    GIB,
    CheckpointRow,
    PriceTable,
    Report,
    RunReport,
    render_html,
)
from s3ckpt.uri import StoreURL
from tests._retention_util import new_tag, write_checkpoint

pytestmark = pytest.mark.integration

DAY = 86400.0
POLICY = """
description = "last 3 + best 2 by val_loss"
[keep]
last = 3
[keep.best]
metric = "val_loss"
n = 2
"""
ODD_RUN = 'runs/odd <b>"run"</b> & co/'


# -- the browser -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        why = f"{CHROMIUM} is missing (apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = launch(p)
        try:
            yield b
        finally:
            b.close()


class Page:
    """A page opened from a file, recording console errors, page errors and requests."""

    def __init__(self, browser: Any, path: Path) -> None:
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page = browser.new_page(viewport={"width": 1400, "height": 1000})
        self.page.on(
            "console",
            lambda m: (
                self.errors.append(f"console {m.type}: {m.text}")
                if m.type in ("error", "warning")
                else None
            ),
        )
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.url = path.resolve().as_uri()
        self.page.goto(self.url, wait_until="load")

    def close(self) -> None:
        self.page.close()


# -- the bucket --------------------------------------------------------------------------------
def backdate(bucket: str, prefix: str, seconds: float) -> None:
    """Make every object under ``prefix`` ``seconds`` older (moto's in-process backend: S3
    itself cannot, and an abandoned or stock-DCP checkpoint is one nobody touched lately)."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    b = s3_backends[DEFAULT_ACCOUNT_ID]["aws"].buckets[bucket]
    for key in b.keys.values():
        if key.name.startswith(prefix):
            key.last_modified = key.last_modified - timedelta(seconds=seconds)


def dead_pid() -> int:
    """The pid of a process that has exited (a killed writer's)."""
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(proc.stdout)


def make_bucket(bucket: str) -> str:
    """The runs under ``s3://bucket/runs/``; returns that root."""
    now = time.time()
    store = S3Store(bucket)
    pre = StoreURL("s3", bucket, "runs/pretrain/")
    for i, step in enumerate(range(100, 1300, 100)):
        loss = 3.0 / math.sqrt(i + 1) + (0.4 if i == 7 else 0.0)
        write_checkpoint(
            store,
            pre,
            step,
            created=now - (12 - i) ** 1.5 * DAY,
            metrics={"val_loss": loss, "lr": 1e-4},
        )
    pin(store, pre.child("step_000000500"), "release <v1> & eval")
    # A save in progress: its objects are fresh, no marker, no .metadata.
    write_checkpoint(store, pre, 1300, created=now, commit=False, metadata=False)

    # A run stored in STANDARD_IA, with an abandoned save: its writer died (its heartbeat
    # names a process that is gone), and nothing of it was touched for a day.
    fine = StoreURL("s3", bucket, "runs/finetune/")
    ia = S3Store(bucket, S3Config(storage_class="STANDARD_IA"))
    for i, step in enumerate((10, 20, 30, 40, 50)):
        write_checkpoint(
            ia, fine, step, created=now - (5 - i) * 3600, metrics={"val_loss": 1.0 - i / 10}
        )
    tag = new_tag()
    dead = fine.child("step_000000060")
    body = {"tag": tag, "rank": 0, "step": 60, "host": os.uname().nodename, "pid": dead_pid()}
    from s3ckpt._commit import pid_namespace

    body["pidns"] = pid_namespace()
    store.put(dead.key(heartbeat_name(tag, 0)), json.dumps(body).encode())
    store.put(dead.key(data_name(0, 0, tag)), b"x" * 300)
    backdate(bucket, dead.prefix, DAY)

    # A stock-DCP checkpoint (no s3ckpt.json), last written three days ago.
    stock = StoreURL("s3", bucket, "runs/stock/step-7/")
    store.put(stock.key(METADATA_NAME), b"m" * 50)
    store.put(stock.key("__0_0.distcp"), b"d" * 500)
    backdate(bucket, stock.prefix, 3 * DAY)

    # A run whose name is markup.
    odd = StoreURL("s3", bucket, ODD_RUN)
    for step in (1, 2):
        write_checkpoint(store, odd, step, created=now - DAY + step, metrics={"val_loss": 2.0})
    return f"s3://{bucket}/runs/"


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code = main(list(argv))
    out = capsys.readouterr()
    assert code == 0, out.err
    doc: dict[str, Any] = json.loads(out.out)
    return doc


# -- reading the DOM ---------------------------------------------------------------------------
READ_DOM = """
() => Array.from(document.querySelectorAll("section.run")).map(sec => ({
  run: sec.dataset.run,
  metric: sec.dataset.metric,
  best: sec.dataset.best,
  fields: Object.fromEntries(Array.from(sec.querySelectorAll("dd[data-field]"))
    .map(dd => [dd.dataset.field, dd.dataset.value])),
  rows: Array.from(sec.querySelectorAll("tr.checkpoint")).map(tr => ({
    ...tr.dataset,
    reasons: Array.from(tr.querySelectorAll("ul.reasons > li")).map(li => li.textContent),
  })),
  points: sec.querySelectorAll("circle.pt").length,
}))
"""


def test_report_of_several_runs_agrees_with_ls_and_prune(
    bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], browser: Any
) -> None:
    root = make_bucket(bucket)
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    now = datetime.now(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")
    listed = cli_json(capsys, "ls", root, "--json")
    planned = cli_json(capsys, "prune", root, "--policy", str(policy), "--now", now, "--json")
    out = tmp_path / "report.html"
    code = main(["report", root, "--html", str(out), "--policy", str(policy), "--now", now])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert printed.out.startswith(f"wrote {out}: 4 runs, ") and printed.out.count("\n") == 1

    text = out.read_text(encoding="utf-8")
    assert not re.search(r"""(?:src|href|action)\s*=\s*["']?\s*(?:https?:)?//""", text, re.I)
    assert "http://" not in text and "https://" not in text
    assert text.count("<script") == 1  # ours; the run named <b>...</b> is text

    page = Page(browser, out)
    try:
        dom = page.page.evaluate(READ_DOM)
        assert page.errors == []
        assert page.requests == [page.url], page.requests  # the file itself, nothing else

        # Every run and checkpoint of `ls --json`, in its order, with the same numbers.
        states = set()
        assert [s["run"] for s in dom] == [r["run"] for r in listed["runs"]]
        for sec, run in zip(dom, listed["runs"], strict=True):
            assert len(sec["rows"]) == len(run["checkpoints"]) == sec["points"], sec["run"]
            for row, c in zip(sec["rows"], run["checkpoints"], strict=True):
                states.add(c["state"])
                assert row["name"] == c["name"] and row["url"] == c["url"]
                assert row["step"] == ("" if c["step"] is None else str(c["step"]))
                assert row["state"] == c["state"]
                assert int(row["size"]) == c["size"]
                assert int(row["numObjects"]) == c["num_objects"]
                assert row["committedAt"] == (c["committed_at"] or "")
                assert row.get("pinned") == c["pinned"]
            f = sec["fields"]
            assert int(f["checkpoints"]) == len(run["checkpoints"])
            assert int(f["total_size"]) == sum(c["size"] for c in run["checkpoints"])
            for state in ("committed", "in_progress", "abandoned", "foreign"):
                assert int(f[state]) == sum(1 for c in run["checkpoints"] if c["state"] == state)
            # Storage cost: the listing's bytes per class times the default prices.
            cost = sum(
                n / GIB * DEFAULT_PRICES[cls]
                for c in run["checkpoints"]
                for cls, n in c["bytes_by_class"].items()
            )
            assert float(f["cost_month"]) == pytest.approx(cost, rel=1e-12)
        assert states == {"committed", "in_progress", "abandoned", "foreign"}
        fine = next(r for r in listed["runs"] if r["run"].endswith("/finetune/"))
        assert {"STANDARD_IA"} <= {k for c in fine["checkpoints"] for k in c["bytes_by_class"]}

        # Actions, reasons and bytes freed: those of `prune --json`'s dry run.
        assert [d["run"] for d in planned["runs"]] == [s["run"] for s in dom]
        freed_total = 0
        for sec, run in zip(dom, planned["runs"], strict=True):
            for row, d in zip(sec["rows"], run["decisions"], strict=True):
                assert (row["name"], row["action"], row["reasons"]) == (
                    d["name"],
                    d["action"],
                    d["reasons"],
                )
            assert int(sec["fields"]["bytes_freed"]) == run["bytes_freed"]
            assert int(sec["fields"]["delete"]) == run["delete"]
            freed_total += run["bytes_freed"]
            kept = sum(float(r["cost"]) for r in sec["rows"] if r["action"] != "delete")
            assert float(sec["fields"]["cost_month_after"]) == pytest.approx(kept, rel=1e-9)
        assert freed_total > 0
        totals = page.page.evaluate(
            """() => Object.fromEntries(Array.from(document.querySelectorAll(
                 'dl.summary[data-scope="all"] dd[data-field]')).map(d => [d.dataset.field,
                 d.dataset.value]))"""
        )
        assert int(totals["bytes_freed"]) == freed_total
        assert int(totals["runs"]) == 4
        assert int(totals["checkpoints"]) == sum(len(r["checkpoints"]) for r in listed["runs"])

        # The chart: the policy's metric, the best marked, a title on every point.
        pre_i = next(i for i, s in enumerate(dom) if s["run"].endswith("/pretrain/"))
        pre = dom[pre_i]
        assert pre["metric"] == "val_loss"
        losses = {r["name"]: float(r["metric"]) for r in pre["rows"] if "metric" in r}
        assert pre["best"] == min(losses, key=lambda n: losses[n])
        odd = next(s for s in dom if "odd" in s["run"])
        assert odd["run"] == f"s3://{bucket}/{ODD_RUN}"

        # Hovering a point shows its title and lights its row, and the reverse.
        p = page.page
        sid = f"r{pre_i}"
        title = p.text_content(f"#{sid}-p4 > title")
        assert title is not None and "step_000000500" in title and "pinned" in title
        assert "keep: pinned: release <v1> & eval" in title
        p.hover(f"#{sid}-p4")
        assert "hl" in (p.get_attribute(f"#{sid}-c4", "class") or "")
        assert "step_000000500" in (p.text_content(f"#{sid} .detail") or "")
        p.hover(f"#{sid}-c2")
        assert "hl" in (p.get_attribute(f"#{sid}-p2", "class") or "")
        assert "hl" not in (p.get_attribute(f"#{sid}-c4", "class") or "")

        # The x axis toggles to commit time and back. Every point moves to its time position;
        # one point's two positions may coincide (commit times from moto's clock can be
        # proportional to steps), so the move is checked over all the points.
        points = f"#{sid} circle.pt"
        read_cx = (
            "ps => ps.filter(p => p.dataset.xs && p.dataset.xt)"
            ".map(p => [p.getAttribute('cx'), p.dataset.xt])"
        )
        before = p.eval_on_selector_all(points, read_cx)
        assert len(before) >= 3
        assert p.is_visible(f"#{sid} .ax-step") and not p.is_visible(f"#{sid} .ax-time")
        p.click(f'#{sid} button[data-xmode="time"]')
        assert p.get_attribute(f"#{sid}", "data-x") == "time"
        timed = p.eval_on_selector_all(points, read_cx)
        assert all(cx == xt for cx, xt in timed), timed
        assert [cx for cx, _ in timed] != [cx for cx, _ in before]
        assert p.is_visible(f"#{sid} .ax-time") and not p.is_visible(f"#{sid} .ax-step")
        p.click(f'#{sid} button[data-xmode="step"]')
        assert p.eval_on_selector_all(points, read_cx) == before

        # Filters hide rows and points; sorting reorders rows.
        p.select_option('select[data-filter="action"]', "delete")
        visible = p.eval_on_selector_all(
            f"#{sid} tr.checkpoint",
            "rs => rs.filter(r => r.offsetParent).map(r => r.dataset.action)",
        )
        assert visible and set(visible) == {"delete"}
        assert not p.is_visible(f"#{sid}-p{len(pre['rows']) - 2}")  # kept: newest but one
        p.select_option('select[data-filter="action"]', "")
        p.click(f'#{sid} th[data-sort="size"]')
        p.click(f'#{sid} th[data-sort="size"]')  # descending
        sizes = p.eval_on_selector_all(
            f"#{sid} tr.checkpoint", "rs => rs.map(r => +r.dataset.size)"
        )
        assert sizes == sorted(sizes, reverse=True)
        assert page.errors == []
    finally:
        page.close()


def test_report_without_policy_on_stdout_has_no_plan(
    bucket: str, capsys: pytest.CaptureFixture[str], browser: Any, tmp_path: Path
) -> None:
    root = make_bucket(bucket)
    code = main(["report", root, "--html", "-", "--price", "STANDARD_IA=1"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert out.out.startswith("<!DOCTYPE html>") and out.err.startswith("wrote the page to stdout")
    path = tmp_path / "r.html"
    path.write_text(out.out, encoding="utf-8")
    page = Page(browser, path)
    try:
        fields = page.page.evaluate(
            """() => Array.from(document.querySelectorAll('section.run')).map(s =>
                 [s.dataset.run, s.querySelector('dd[data-field="cost_month"]').dataset.value])"""
        )
        assert page.errors == [] and page.requests == [page.url]
        # No plan: no action on any row, no plan numbers, no action filter.
        actions = page.page.eval_on_selector_all(
            "tr.checkpoint", "rs => rs.map(r => r.dataset.action)"
        )
        assert actions and set(actions) == {""}
        assert page.page.query_selector('dd[data-field="bytes_freed"]') is None
        assert page.page.query_selector('select[data-filter="action"]') is None
    finally:
        page.close()
    listed = cli_json(capsys, "ls", root, "--json")
    prices = {**DEFAULT_PRICES, "STANDARD_IA": 1.0}
    for (run, cost), listed_run in zip(fields, listed["runs"], strict=True):
        assert run == listed_run["run"]
        want = sum(
            n / GIB * prices[cls]
            for c in listed_run["checkpoints"]
            for cls, n in c["bytes_by_class"].items()
        )
        assert float(cost) == pytest.approx(want, rel=1e-12)


def synthetic_report(n: int, runs: int = 1) -> Report:
    """``n`` checkpoints per run, built as catalog records (no store): a long run's page."""
    t0 = datetime(2025, 1, 1, tzinfo=UTC)
    prices = PriceTable()
    out = []
    for k in range(runs):
        run = StoreURL("s3", "bucket", f"runs/r{k}/")
        rows = []
        for i in range(n):
            step = (i + 1) * 100
            state = CheckpointState.COMMITTED if i < n - 1 else CheckpointState.IN_PROGRESS
            info = CheckpointInfo(
                url=run.child(f"step_{step:09d}"),
                name=f"step_{step:09d}",
                step=step,
                state=state,
                committed_at=t0 + timedelta(minutes=10 * i) if i < n - 1 else None,
                size=3 * 2**30 + i,
                num_objects=9,
                metrics={"val_loss": 2.0 / math.sqrt(i + 1)} if i < n - 1 else {},
                pinned="release" if i % 1000 == 0 else None,
                last_activity=t0 + timedelta(minutes=10 * i),
            )
            action = "skip" if i == n - 1 else ("keep" if i % 50 == 0 else "delete")
            reasons = ("every 5000 steps",) if action == "keep" else ("no rule keeps it",)
            rows.append(
                CheckpointRow(info, action, reasons, prices.monthly_cost({"STANDARD": info.size}))
            )
        best = min((r for r in rows if r.info.metrics), key=lambda r: r.info.metrics["val_loss"])
        out.append(RunReport(run, tuple(rows), None, "val_loss", "min", best.info.name))
    return Report(
        root=StoreURL("s3", "bucket", "runs/"),
        runs=tuple(out),
        now=t0 + timedelta(days=90),
        policy="every 50th (synthetic)",
        prices=prices,
        title="10,000 checkpoints",
    )


def test_a_page_of_ten_thousand_checkpoints_loads(browser: Any, tmp_path: Path) -> None:
    page_text = render_html(synthetic_report(10_000))
    path = tmp_path / "big.html"
    path.write_text(page_text, encoding="utf-8")
    page = Page(browser, path)
    try:
        p = page.page
        assert p.eval_on_selector_all("tr.checkpoint", "rs => rs.length") == 10_000
        assert p.eval_on_selector_all("circle.pt", "ps => ps.length") == 10_000
        last = p.get_attribute("#r0-c9999", "data-state")
        assert last == "in_progress"
        p.click('#r0 button[data-xmode="time"]')
        assert p.get_attribute("#r0-p5000", "cx") == p.get_attribute("#r0-p5000", "data-xt")
        p.dispatch_event("#r0-p5000", "mouseover")  # points overlap: no pointer can pick one
        assert "hl" in (p.get_attribute("#r0-c5000", "class") or "")
        assert page.errors == [] and page.requests == [page.url]
    finally:
        page.close()
