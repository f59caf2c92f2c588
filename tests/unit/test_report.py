"""``s3ckpt report`` without a browser: the cost maths, the price table, escaping of bucket
data, the plan overlay on the in-memory store, a page of 10,000 checkpoints, and the CLI on a
local folder (tests/integration/test_report_s3.py opens pages in Chromium)."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from s3ckpt.cli import main
from s3ckpt.errors import ConfigError, PolicyError
from s3ckpt.retention import (
    CheckpointInfo,
    KeepBest,
    KeepLast,
    KeepPinned,
    PolicyFile,
    RetentionOptions,
    parse_policy,
    prune,
)
from s3ckpt.retention._catalog import CheckpointState
from s3ckpt.retention._liveness import MIN_GRACE
from s3ckpt.store import Location, MemoryStore
from s3ckpt.tools._report import (
    DEFAULT_PRICES,
    GIB,
    CheckpointRow,
    PriceTable,
    Report,
    RunReport,
    build_report,
    collect_report,
    parse_price,
    render_html,
)
from s3ckpt.uri import StoreURL
from tests._retention_util import write_checkpoint

ROOT = Path(__file__).resolve().parents[2]
DAY = 86400.0
NOW = datetime(2025, 6, 1, tzinfo=UTC)


def info(name: str, size: int, by_class: dict[str, int] | None = None) -> CheckpointInfo:
    return CheckpointInfo(
        url=StoreURL("s3", "b", f"run/{name}/"),
        name=name,
        step=1,
        state=CheckpointState.COMMITTED,
        committed_at=NOW,
        size=size,
        num_objects=1,
        bytes_by_class=by_class or {},
    )


# -- prices --------------------------------------------------------------------------------------
def test_the_default_prices_are_aws_us_east_1_per_gib_month() -> None:
    assert GIB == 1024**3
    assert DEFAULT_PRICES["STANDARD"] == 0.023 and DEFAULT_PRICES["DEEP_ARCHIVE"] == 0.00099
    assert set(DEFAULT_PRICES) == {
        "STANDARD",
        "INTELLIGENT_TIERING",
        "STANDARD_IA",
        "ONEZONE_IA",
        "GLACIER_IR",
        "GLACIER",
        "DEEP_ARCHIVE",
        "REDUCED_REDUNDANCY",
        "EXPRESS_ONEZONE",
    }
    table = PriceTable()
    # 10 GiB standard + 100 GiB Glacier IR: 0.23 + 0.40 USD a month.
    cost = table.monthly_cost({"STANDARD": 10 * GIB, "GLACIER_IR": 100 * GIB})
    assert cost == pytest.approx(0.23 + 0.40, rel=1e-12)
    assert table.monthly_cost({"STANDARD": 10**9}) == pytest.approx(10**9 / 2**30 * 0.023)


def test_prices_are_overridden_by_a_file_and_by_price_options(tmp_path: Path) -> None:
    f = tmp_path / "prices.toml"
    f.write_text('source = "our rates"\n[prices]\nSTANDARD = 0.02\nmy_class = 0.5\n')
    table = PriceTable.load(f)
    assert table.prices["STANDARD"] == 0.02 and table.prices["MY_CLASS"] == 0.5
    assert table.prices["GLACIER"] == DEFAULT_PRICES["GLACIER"]  # the rest keep the default
    assert table.source == "our rates"
    top = tmp_path / "top.toml"
    top.write_text("GLACIER = 0.001\n")  # no [prices] table: top-level lines
    assert PriceTable.load(top).prices["GLACIER"] == 0.001
    assert parse_price("standard_ia=0.01") == ("STANDARD_IA", 0.01)
    assert table.with_prices({"STANDARD": 1}).prices["STANDARD"] == 1.0
    for bad in ("STANDARD", "STANDARD=x", "STANDARD=-1", "=1", "STANDARD=nan"):
        with pytest.raises(ConfigError):
            parse_price(bad)
    broken = tmp_path / "broken.toml"
    broken.write_text("[prices]\nSTANDARD = 'cheap'\n")
    with pytest.raises(ConfigError, match="must be a number"):
        PriceTable.load(broken)
    with pytest.raises(ConfigError, match="cannot read"):
        PriceTable.load(tmp_path / "missing.toml")


def test_a_class_without_a_price_is_an_error_naming_it_and_how_to_add_one() -> None:
    table = PriceTable({"STANDARD": 0.023})
    with pytest.raises(ConfigError) as exc:
        table.monthly_cost({"STANDARD": 1, "GLACIER": 5}, "s3://b/run/step_1/")
    message = str(exc.value)
    assert "'GLACIER'" in message and "s3://b/run/step_1/" in message
    assert "--price GLACIER=" in message and "[prices]" in message


# -- the model on the in-memory store ------------------------------------------------------------
def memory_bucket() -> tuple[MemoryStore, StoreURL]:
    store = MemoryStore("b")
    now = time.time()
    run = StoreURL("s3", "b", "runs/a/")
    for i, step in enumerate(range(100, 1100, 100)):
        write_checkpoint(
            store, run, step, created=now - (10 - i) * DAY, metrics={"acc": 0.5 + i / 100}
        )
    evil = StoreURL("s3", "b", "runs/<script>alert(1)</script>/")
    write_checkpoint(
        store,
        evil,
        1,
        created=now - DAY,
        metrics={'<img src=x onerror="alert(2)">': 1.0},
        name="step-1<svg onload=alert(3)>",
    )
    return store, StoreURL("s3", "b", "runs/")


def test_the_plan_overlay_is_prunes_dry_run_and_costs_add_up() -> None:
    store, root = memory_bucket()
    policy = KeepLast(2) | KeepBest(3, "acc", mode="max")
    now = datetime.now(UTC)
    report = collect_report(
        Location.of(root, store=store), policy=policy, options=RetentionOptions(now=now)
    )
    assert [str(r.run) for r in report.runs] == [
        "s3://b/runs/<script>alert(1)</script>/",
        "s3://b/runs/a/",
    ]
    a = report.runs[1]
    dry = prune(Location.of(a.run, store=store), policy, options=RetentionOptions(now=now))
    assert [(r.info.name, r.action, r.reasons) for r in a.rows] == [
        (d.checkpoint.name, d.action, d.reasons) for d in dry.plan.decisions
    ]
    assert a.bytes_freed == dry.plan.bytes_freed > 0
    assert a.metric == "acc" and a.mode == "max" and a.best == "step_000001000"
    for r in a.rows:  # a MemoryStore names no class: everything is STANDARD
        assert r.bytes_by_class == {"STANDARD": r.info.size}
        assert r.cost == pytest.approx(r.info.size / GIB * 0.023, rel=1e-12)
    deleted = sum(r.cost for r in a.rows if r.action == "delete")
    assert a.cost - a.cost_after == pytest.approx(deleted, rel=1e-12) and deleted > 0
    summary = report.summary()
    assert summary["bytes_freed"] == sum(r.bytes_freed for r in report.runs)
    assert summary["checkpoints"] == 11 and summary["committed"] == 11
    assert json.loads(json.dumps(report.to_dict()))["per_run"][1]["delete"] == len(dry.plan.delete)


def test_bucket_data_is_escaped_everywhere() -> None:
    store, root = memory_bucket()
    page = build_report(
        Location.of(root, store=store),
        policy=KeepLast(1),
        options=RetentionOptions(now=datetime.now(UTC)),
    )
    assert page.count("<script") == 1  # ours; the run named <script> is text
    assert "<img" not in page and "<svg onload" not in page
    assert html.escape("runs/<script>alert(1)</script>/") in page
    assert 'data-name="step-1&lt;svg onload=alert(3)&gt;"' in page
    assert html.escape('<img src=x onerror="alert(2)">', quote=True) in page
    # The script may not use innerHTML (data reaches the page as escaped markup only), and
    # the page names no other origin.
    script = page[page.index("<script>") : page.index("</script>")]
    assert "innerHTML" not in script and "eval(" not in script
    assert not re.search(r"https?://", page)
    # Its Content-Security-Policy admits exactly the one script (read from the package data).
    digest = hashlib.sha256(script[len("<script>") :].encode("utf-8")).digest()
    assert f"script-src 'sha256-{base64.b64encode(digest).decode()}'" in page
    assert "default-src 'none'" in page and "function anchor(x) { return x > 720" in script
    assert "--committed:#0072b2" in page and "%(" not in page  # the stylesheet, filled


def test_without_a_policy_there_is_no_plan_on_the_page() -> None:
    store, root = memory_bucket()
    report = collect_report(Location.of(root, store=store))
    assert report.policy is None and all(r.plan is None for r in report.runs)
    assert all(row.action is None and row.reasons == () for r in report.runs for row in r.rows)
    page = render_html(report)
    assert 'data-field="bytes_freed"' not in page and 'data-field="cost_month"' in page
    assert set(re.findall(r'data-action="([^"]*)"', page)) == {""}


def test_a_short_grace_is_raised_to_the_floor_as_prune_does() -> None:
    store, root = memory_bucket()
    report = collect_report(
        Location.of(root, store=store),
        policy=KeepLast(1),
        options=RetentionOptions(grace=timedelta(seconds=1)),
    )
    assert report.grace == MIN_GRACE and "raised" in report.notes[0]
    with pytest.raises(PolicyError, match="no keep rule"):
        collect_report(Location.of(root, store=store), policy=KeepPinned())


def test_options_are_one_value() -> None:
    store, root = memory_bucket()
    now = datetime.now(UTC)
    policy = KeepLast(2) | KeepBest(3, "acc", mode="max")
    options = RetentionOptions(now=now, max_delete=1, include_foreign=True)
    location = Location(root, store)
    by_options = collect_report(location, policy=policy, options=options)
    assert by_options.include_foreign and by_options.now == now
    assert all(len(r.plan.delete) <= 1 for r in by_options.runs if r.plan is not None)
    # A copy with one field changed leaves the others.
    other = collect_report(location, policy=policy, options=options.replace(max_delete=None))
    assert other.include_foreign and sum(r.objects_deleted for r in other.runs) > sum(
        r.objects_deleted for r in by_options.runs
    )
    assert build_report(location, policy=policy, options=options) == render_html(by_options)


def test_a_bad_step_pattern_is_refused_before_any_request() -> None:
    store, root = memory_bucket()
    store.calls.clear()
    with pytest.raises(ConfigError, match="capture group"):
        collect_report(
            Location.of(root, store=store), options=RetentionOptions(step_pattern="step_\\d+")
        )
    assert store.calls == {}


def test_the_step_pattern_comes_from_options_else_from_the_policy() -> None:
    store = MemoryStore("b")
    run = StoreURL("s3", "b", "runs/e/")
    for i in range(3):
        write_checkpoint(
            store, run, 0, created=time.time() - DAY, name=f"ckpt_e1_s{i * 10}", record_step=False
        )
    pattern = r"ckpt_e\d+_s(\d+)"
    now = datetime.now(UTC)
    steps = [
        r.info.step
        for r in collect_report(Location.of(run, store=store), options=RetentionOptions(now=now))
        .runs[0]
        .rows
    ]
    assert steps == [None, None, None]
    by_options = collect_report(
        Location.of(run, store=store), options=RetentionOptions(now=now, step_pattern=pattern)
    )
    assert sorted(r.info.step for r in by_options.runs[0].rows) == [0, 10, 20]
    text = f"step_pattern = '{pattern}'\n[keep]\nlast = 1\n"
    for policy in (PolicyFile.parse(text), parse_policy(text)):  # the file's pattern applies
        by_policy = collect_report(
            Location.of(run, store=store), policy=policy, options=RetentionOptions(now=now)
        )
        assert sorted(r.info.step for r in by_policy.runs[0].rows) == [0, 10, 20]
        assert [r.action for r in by_policy.runs[0].rows].count("keep") == 1
        assert by_policy.policy == f"last 1 (step_pattern {pattern})"
    # A pattern the run names wins over the file's.
    mine = RetentionOptions(now=now, step_pattern=r"ckpt_e(\d+)_s\d+")
    named = {
        r.info.step
        for r in collect_report(Location.of(run, store=store), policy=policy, options=mine)
        .runs[0]
        .rows
    }
    assert named == {1}


def ten_thousand() -> Report:
    t0 = datetime(2025, 1, 1, tzinfo=UTC)
    prices = PriceTable()
    run = StoreURL("s3", "bucket", "runs/long/")
    rows = []
    for i in range(10_000):
        step = (i + 1) * 100
        c = CheckpointInfo(
            url=run.child(f"step_{step:09d}"),
            name=f"step_{step:09d}",
            step=step,
            state=CheckpointState.COMMITTED,
            committed_at=t0 + timedelta(minutes=10 * i),
            size=5 * GIB + i,
            num_objects=17,
            metrics={"val_loss": 1.0 + 1.0 / (i + 1), "lr": 3e-4},
        )
        action = "keep" if i % 100 == 0 else "delete"
        reason = "every 10000 steps" if action == "keep" else "no rule keeps it"
        rows.append(CheckpointRow(c, action, (reason,), prices.monthly_cost({"STANDARD": c.size})))
    rr = RunReport(run, tuple(rows), None, "val_loss", "min", rows[-1].info.name)
    return Report(run, (rr,), t0, "every 10000 steps", prices, "long run")


def test_a_page_of_ten_thousand_checkpoints_stays_small_and_whole() -> None:
    page = render_html(ten_thousand())
    assert len(page.encode()) < 14 * 2**20, len(page)
    assert page.count('<tr id="r0-c') == 10_000 and page.count('class="pt ') == 10_000
    assert page.count("<title>") == 10_000 + 1  # a title per point, and the page's
    assert 'data-name="step_001000000"' in page  # the last row is there, undecimated


def test_collect_raises_for_a_storage_class_without_a_price() -> None:
    store, root = memory_bucket()
    with pytest.raises(ConfigError, match="'STANDARD'"):
        collect_report(Location.of(root, store=store), prices=PriceTable({"GLACIER": 0.0036}))


# -- the CLI -------------------------------------------------------------------------------------
def local_run(root: Path) -> Path:
    from s3ckpt.store import open_store
    from s3ckpt.uri import parse_location

    store, run = open_store(parse_location(root / "runs" / "a"))
    for step in (1, 2, 3, 4):
        write_checkpoint(store, run, step, created=time.time() - 30 * DAY + step)
    return root


def test_cli_writes_the_page_and_prints_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local_run(tmp_path)
    out = tmp_path / "out" / "report.html"
    out.parent.mkdir()
    code = main(["report", str(tmp_path), "--html", str(out), "--policy", "keep-last-3"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert re.fullmatch(
        rf"wrote {re.escape(str(out))}: 1 run, 4 checkpoints, [\d.]+ KiB, <\$0\.01/month; the plan "
        r"deletes 1 \(\d+ B freed\), <\$0\.01/month after\n",
        printed.out,
    ), printed.out
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count('class="checkpoint"') == 4
    assert list(out.parent.iterdir()) == [out]  # no temporary file left behind
    code = main(["report", str(tmp_path), "--html", str(out), "--json", "--price", "STANDARD=1"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["html"] == str(out) and doc["prices"]["STANDARD"] == 1.0
    assert doc["checkpoints"] == 4 and "bytes_freed" not in doc


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("s3ckpt: error: "), err
    return lines[0]


def test_cli_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local_run(tmp_path)
    out = str(tmp_path / "r.html")
    cases = [
        (["--html", "-", "--json"], "--json prints on stdout"),
        (["--html", out, "--policy", "no-such-policy"], "no-such-policy"),
        (["--html", out, "--prices", str(tmp_path / "nope.toml")], "cannot read"),
        (["--html", str(tmp_path / "no" / "dir" / "r.html")], "cannot write the report"),
        (["--html", str(tmp_path)], "is a directory"),
        (["--html", out, "--price", "GLACIER=0", "--prices", str(tmp_path / "x")], "cannot read"),
    ]
    for argv, words in cases:
        code = main(["report", str(tmp_path), *argv])
        err = capsys.readouterr().err
        assert code == 2 and words in one_error_line(err), (argv, err)
    code = main(["report", str(tmp_path), "--html", out, "--price", "oops"])
    assert code == 2 and "CLASS=USD" in capsys.readouterr().err


def test_report_runs_without_torch(tmp_path: Path) -> None:
    local_run(tmp_path)
    code = (
        'import sys\nsys.modules["torch"] = None\nfrom s3ckpt.cli import main\n'
        "sys.exit(main(sys.argv[1:]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, "report", str(tmp_path), "--html", str(tmp_path / "r.html")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert out.returncode == 0 and out.stdout.startswith("wrote "), out.stderr
