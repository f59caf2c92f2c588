"""A bounded run for gpu_check.py: the budget, the phases as they go, the JSON, a watchdog.

The concept: a benchmark that must end within a fixed time on a lent machine. A phase
whose estimate does not fit the :class:`Budget` is skipped and reported so (the callers
decide, with :meth:`Budget.fits`); :class:`Run` prints each phase's start and duration as
it goes (flushed: the run is watched live) and collects the figures; a phase that raises
is marked failed and the next ones still run. :func:`start_watchdog` ends the process a
grace period after the budget whatever is stuck (threads dumped, partial JSON written,
the caller's cleanup run, exit 124), so the run never hangs.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["WATCHDOG_EXIT", "Budget", "Run", "start_watchdog"]

WATCHDOG_EXIT = 124  # the exit status when the watchdog ended the run


class Budget:
    """The run's time budget: seconds left, and whether an estimate fits.

    Args:
        total_s: The whole run's budget in seconds.
        clock: A monotonic clock (injectable for tests).
    """

    def __init__(self, total_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.total_s = total_s
        self._clock = clock
        self.start = clock()

    def elapsed(self) -> float:
        """Seconds since the run began."""
        return self._clock() - self.start

    def left(self) -> float:
        """Seconds of budget left (negative once spent)."""
        return self.total_s - self.elapsed()

    def fits(self, estimate_s: float, reserve_s: float = 0.0) -> bool:
        """Whether ``estimate_s`` fits in what is left after ``reserve_s``."""
        return estimate_s + reserve_s <= self.left()


class Run:
    """The results so far: phases in order, figures by phase, the JSON written at the end."""

    def __init__(self, budget: Budget, out: str | None) -> None:
        self.budget = budget
        self.out = out
        self.current = "start"
        self.data: dict[str, Any] = {"phases": [], "results": {}}

    def say(self, msg: str) -> None:
        """One progress line on stdout, flushed (the run is watched live)."""
        print(f"[gpu_check {self.budget.elapsed():6.1f}s] {msg}", flush=True)

    def skip(self, name: str, reason: str) -> None:
        """Record ``name`` as skipped, with why."""
        self.data["phases"].append({"name": name, "status": "skipped", "reason": reason})
        self.say(f"{name}: skipped ({reason})")

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[dict[str, Any]]:
        """Time a phase; its figures go in the yielded dict; an error marks it failed."""
        self.current = name
        self.say(f"{name}: start ({self.budget.left():.0f} s of budget left)")
        figures: dict[str, Any] = {}
        self.data["results"][name] = figures
        record: dict[str, Any] = {"name": name, "status": "ok"}
        t0 = time.perf_counter()
        try:
            yield figures
        except Exception as exc:  # a failed phase is reported; the next ones still run
            record.update(status="failed", error=f"{type(exc).__name__}: {exc}")
        record["duration_s"] = round(time.perf_counter() - t0, 3)
        self.data["phases"].append(record)
        extra = f": {record['error']}" if "error" in record else ""
        self.say(f"{name}: {record['status']} in {record['duration_s']:.1f} s{extra}")

    def failed(self) -> bool:
        """Whether any phase failed."""
        return any(p["status"] == "failed" for p in self.data["phases"])

    def write(self) -> None:
        """The JSON on stdout and in ``--out``."""
        self.data["total_s"] = round(self.budget.elapsed(), 3)
        text = json.dumps(self.data, indent=2, default=str)
        print(text, flush=True)
        if self.out:
            with open(self.out, "w") as f:
                f.write(text + "\n")


def start_watchdog(run: Run, grace_s: float, cleanup: Callable[[], None]) -> None:
    """End the process ``grace_s`` after ``run``'s budget, whatever is stuck (never hang):
    print where it was and every thread's stack, run ``cleanup`` (kill servers, ranks),
    write the JSON so far, exit :data:`WATCHDOG_EXIT`. A daemon thread: a run that ends in
    time ends with it."""

    def watch() -> None:
        time.sleep(max(0.0, run.budget.left() + grace_s))
        run.say(
            f"watchdog: still in phase {run.current!r} {grace_s:.0f} s after the budget; "
            "stopping (threads below)"
        )
        faulthandler.dump_traceback(sys.stdout)
        with contextlib.suppress(Exception):
            cleanup()
        run.data["phases"].append(
            {"name": run.current, "status": "failed", "error": "watchdog: the budget was exceeded"}
        )
        with contextlib.suppress(Exception):
            run.write()
        os._exit(WATCHDOG_EXIT)

    threading.Thread(target=watch, daemon=True, name="gpu-check-watchdog").start()
