"""How busy the machine was just before a benchmark run, and waiting for it to go quiet.

Before every run bench_dcp.py records the 1-minute load average, the CPU busy fraction of
the whole machine over ~1 s (from the first line of ``/proc/stat``: every CPU, every
process, ours and the server's included) and the number of CPUs. The rule that marks a run
``busy``:

    busy fraction > 0.25  or  load1 - own load > 0.5 x nproc

Decisions: the busy fraction is the primary signal because it is immediate (the load
average lags by a minute and counts runnable processes, not CPU used); the load average
catches a machine whose load comes in bursts shorter than the 1 s window. ``iowait`` counts
as idle (a waiting CPU runs nothing). The benchmark's own server sits idle while the window
is sampled and no worker runs, so the busy fraction is other processes' CPU. The load
average, though, still holds the benchmark's own previous runs (a minute's memory): on a
2-CPU machine back-to-back runs alone lift it over 1. :class:`OwnLoad` estimates that
share (the kernel's 1-minute exponential average fed with the CPU seconds the benchmark's
own processes used, spread evenly over the time between samples) and the rule subtracts
it; the JSON keeps ``load1`` and the estimate, so the plain rule can be applied too. Where
``/proc/stat`` cannot be read the busy fraction is ``None`` and only the load decides.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import Any

__all__ = [
    "BUSY_FRACTION",
    "LOAD_PER_CPU",
    "OwnLoad",
    "busy_fraction_between",
    "is_busy",
    "machine_state",
    "read_cpu_times",
    "wait_quiet",
]

#: A run is busy when the machine's CPUs were busier than this over the second before it.
BUSY_FRACTION = 0.25
#: ... or when the 1-minute load average exceeded this many runnable processes per CPU.
LOAD_PER_CPU = 0.5


def read_cpu_times(path: str = "/proc/stat") -> tuple[int, int] | None:
    """(busy jiffies, total jiffies) of all CPUs since boot; None where unreadable.

    Busy is user + nice + system + irq + softirq + steal; total adds idle and iowait (guest
    time is already inside user and nice, so it is not added again).
    """
    try:
        with open(path) as f:
            first = f.readline().split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    v = [int(x) for x in first[1:9]] + [0] * max(0, 9 - len(first))
    user, nice, system, idle, iowait, irq, softirq, steal = v[:8]
    busy = user + nice + system + irq + softirq + steal
    return busy, busy + idle + iowait


def busy_fraction_between(a: tuple[int, int], b: tuple[int, int]) -> float:
    """Fraction of CPU time that was busy between two :func:`read_cpu_times` samples."""
    d_total = b[1] - a[1]
    if d_total <= 0:
        return 0.0
    return max(0.0, min(1.0, (b[0] - a[0]) / d_total))


def is_busy(load1: float, busy_fraction: float | None, nproc: int, own_load: float = 0.0) -> bool:
    """The busy rule: ``busy_fraction > BUSY_FRACTION`` or
    ``load1 - own_load > LOAD_PER_CPU * nproc``."""
    if busy_fraction is not None and busy_fraction > BUSY_FRACTION:
        return True
    return load1 - own_load > LOAD_PER_CPU * max(1, nproc)


class OwnLoad:
    """The part of the 1-minute load average the benchmark's own processes put there.

    Each :meth:`update` spreads the CPU seconds ``cpu_seconds()`` grew by since the last one
    evenly over the time between them and feeds that average number of busy CPUs into an
    exponential average with the kernel's 60 s time constant. An estimate: it counts CPU
    used, not tasks waiting for a CPU, and the kernel samples every 5 s.
    """

    def __init__(
        self, cpu_seconds: Callable[[], float], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._cpu = cpu_seconds
        self._clock = clock
        self._last_cpu = cpu_seconds()
        self._last_t = clock()
        self.value = 0.0

    def update(self) -> float:
        """Account for the CPU used since the last update; the estimate now."""
        cpu, t = self._cpu(), self._clock()
        dt = t - self._last_t
        if dt > 0:
            busy_cpus = max(0.0, (cpu - self._last_cpu) / dt)
            decay = math.exp(-dt / 60.0)
            self.value = self.value * decay + busy_cpus * (1.0 - decay)
        self._last_cpu, self._last_t = cpu, t
        return self.value


def machine_state(
    window_s: float = 1.0,
    *,
    sleep: Callable[[float], None] = time.sleep,
    cpu_times: Callable[[], tuple[int, int] | None] = read_cpu_times,
    loadavg: Callable[[], tuple[float, float, float]] = os.getloadavg,
    nproc: int | None = None,
    own_load: OwnLoad | None = None,
) -> dict[str, Any]:
    """Sample the machine over ``window_s``: load1, busy fraction, nproc, the estimate of
    the benchmark's own share of load1 and the busy verdict.

    The load average is read at the end of the window (it is the one closest to the run).
    """
    n = nproc or os.cpu_count() or 1
    a = cpu_times()
    sleep(window_s)
    b = cpu_times()
    frac = busy_fraction_between(a, b) if a is not None and b is not None else None
    load1 = loadavg()[0]
    own = own_load.update() if own_load is not None else 0.0
    return {
        "load1": load1,
        "load1_own_estimate": round(own, 3),
        "cpu_busy_fraction": frac,
        "nproc": n,
        "busy": is_busy(load1, frac, n, own),
    }


def wait_quiet(
    max_wait_s: float,
    window_s: float = 1.0,
    *,
    sample: Callable[[float], dict[str, Any]] | None = None,
    clock: Callable[[], float] = time.monotonic,
    own_load: OwnLoad | None = None,
) -> dict[str, Any]:
    """Sample until the machine is quiet or ``max_wait_s`` has passed; the last sample.

    With ``max_wait_s <= 0`` this is one sample. The returned state carries ``waited_s``:
    how long the wait took beyond the first sample.
    """
    take = sample or (lambda w: machine_state(w, own_load=own_load))
    state = take(window_s)
    first = clock()
    while state["busy"] and clock() - first < max_wait_s:
        state = take(window_s)
    state["waited_s"] = round(clock() - first, 3)
    return state
