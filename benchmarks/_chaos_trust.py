"""Chaos classes 8-12 (issue 27): what the protocol may not assume about its surroundings.

8. skewed clocks (gc, prune and writers; minutes and hours, both ways), 9. a second host
with the same hostname, 10. a store without conditional writes, 11. replies cut inside
their headers, 12. deleters (rm, prune) racing an overwrite's commit. A mixin of
benchmarks/chaos.py's ``Harness``: it uses the harness's moto, worker pool, arenas and
invariant checks, and adds the invariants of :data:`TRUST_VIOLATIONS`.

A skewed process is a worker whose wall clock is moved by benchmarks/_chaos_skew.py (a
harness-only environment variable); gc, prune and rm run as the real CLI in a worker.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import _chaos_skew
from _chaos_store import StoreClasses

__all__ = ["TRUST_CLASSES", "TRUST_VIOLATIONS", "TrustClasses"]

TRUST_CLASSES = {
    8: "skewed clocks (gc, prune, writers)",
    9: "a second host with the same hostname",
    10: "a store without conditional writes",
    11: "replies cut inside their headers",
    12: "deleters racing overwrites",
}
TRUST_VIOLATIONS = (
    "live_save_touched",  # gc/prune deleted or aborted anything of a save in progress
    "newer_step_deleted",  # a retention pass deleted a step newer than one it kept
    "two_winners",  # two saves of one prefix both reported success (no overwrite)
    "lease_stolen",  # a live holder's retention lease was taken over
)
HOLD_MAX_S = 60.0
MIN, HOUR, DAY = 60, 3600, 86400
WITHIN = "5m"  # the policy of the writer-skew trials: every step is within 5m (store time)


def dead_pid() -> int:
    """A pid no process has here (what a writer on another machine looks like)."""
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            pid = int(f.read()) - 1
    except (OSError, ValueError):
        pid = 4194303
    while pid > 300:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except OSError:
            pass
        pid -= 1
    raise RuntimeError("no free pid found")


def _policy_file(body: str) -> str:
    fd, path = tempfile.mkstemp(prefix="chaos-policy-", suffix=".toml")
    with os.fdopen(fd, "w") as f:
        f.write(body)
    return path


class TrustClasses(StoreClasses):
    """Classes 8-12 (mixed into benchmarks/chaos.py's Harness)."""

    # Provided by the Harness.
    moto: Any
    s3: Any
    pool: Any
    rng: Any
    quick: bool
    seed: int
    results: Any

    def sc(self, cls: int) -> float: ...
    def arena(self, kind: str) -> tuple[str, str, list[str]]: ...
    def command(self, kind: str, bucket: str, endpoint: str, **kw: Any) -> dict[str, Any]: ...
    def check(self, *a: Any, **kw: Any) -> None: ...
    def check_bucket(self, *a: Any, **kw: Any) -> None: ...
    def judge_worker(self, *a: Any, **kw: Any) -> None: ...
    def fault_run(self, *a: Any, **kw: Any) -> None: ...
    def load_flat_digest(self, url: str, **kw: Any) -> str: ...
    def expect_flat(self, step: int, variant: int = 0) -> str: ...
    def over_budget(self, where: str) -> bool: ...
    def store(self, url: str, endpoint: str | None = None) -> tuple[Any, Any]: ...
    def direct_writer_save(self, url: str, step: int, variant: int, overwrite: bool) -> None: ...

    # ------------------------------------------------------------------ shared pieces
    def _trial(self, cls: int, name: str, params: dict[str, Any]) -> Any:
        from chaos import Trial

        return Trial(cls, name, params)

    def _plan(self, cls: int, base: list[Any], quick: list[Any]) -> list[Any]:
        if self.quick:
            return quick
        reps = self.sc(cls)
        n = max(1, round(len(base) * reps))
        return [base[i % len(base)] for i in range(n)]

    def cli(self, argv: list[str], skew_s: float = 0.0, timeout: float = 120.0) -> dict[str, Any]:
        """``s3ckpt ARGV`` in a worker whose clock runs ``skew_s`` seconds off."""
        w = self.pool.take()
        w.send({"kind": "cli", "argv": argv, "env": {_chaos_skew.ENV: repr(float(skew_s))}})
        status, res = w.result(timeout)
        if status != "done" or res is None:
            return {"ok": False, "rc": None, "output": f"worker {status}"}
        return res

    def _run(self, t: Any, body: Callable[[Any], None], cleanup: list[str]) -> None:
        t0 = time.monotonic()
        try:
            body(t)
        finally:
            for b in cleanup:
                self.s3.wipe(b)
            t.duration = time.monotonic() - t0
            self.results.add(t)

    def held_save(
        self, b: str, attack: Callable[[str], None], t: Any, *, step_prefix: str
    ) -> tuple[str, dict[str, Any] | None]:
        """Run a Checkpointer save whose first UploadPart the proxy holds; call
        ``attack(step_prefix)`` while it is held (the save is live: heartbeat written, an
        upload open), then release it. Records ``live_save_touched`` when anything the
        save had written or opened vanished during the attack."""
        from tests.faultproxy import FaultProxy

        at_part, release = threading.Event(), threading.Event()

        def hook(op: str, key: str, phase: str) -> None:
            if op == "UploadPart" and phase == "before" and not at_part.is_set():
                at_part.set()
                release.wait(HOLD_MAX_S)

        tc = {"part_size": 5 << 20, "max_inflight_bytes": 20 << 20, "max_concurrency": 1}
        tc["read_timeout"] = HOLD_MAX_S + 30
        with FaultProxy(self.moto.endpoint, fault_rate=0.0, hook=hook) as proxy:
            w = self.pool.take()
            w.send(self.command("ckpt", b, proxy.endpoint_url, tc=tc, then_load=True))
            try:
                if not at_part.wait(60):
                    t.notes.append("the save never reached UploadPart")
                else:
                    before = set(self.s3.keys(b, step_prefix))
                    ups = set(self.s3.uploads(b, step_prefix))
                    attack(step_prefix)
                    gone = sorted(before - set(self.s3.keys(b, step_prefix)))
                    aborted = sorted(k for k, _ in ups - set(self.s3.uploads(b, step_prefix)))
                    if gone or aborted:
                        t.violate(
                            "live_save_touched",
                            f"while the save was live: deleted {gone}, aborted uploads {aborted}",
                        )
            finally:
                release.set()
            status, res = w.result(120)
        return status, res

    def _tool_argv(self, tool: str, url: str, grace: str | None, policy: str) -> list[str]:
        argv = [tool, url, "--apply", "--no-progress", "--endpoint-url", self.moto.endpoint]
        if tool == "prune":
            argv += ["--policy", policy]
        if grace:
            argv += ["--grace", grace]
        return argv

    def _live_trial(self, cls: int, label: str, params: dict[str, Any], attack: Any) -> None:
        t = self._trial(cls, label, params)

        def body(t: Any) -> None:
            b, run, planted = self.arena("ckpt")
            cleanup.append(b)
            status, res = self.held_save(
                b, lambda p: attack(t, b, run, p), t, step_prefix=f"{run}/step_000000002/"
            )
            self.judge_worker(t, status, res, "ckpt")
            ok = bool(res and res.get("ok"))
            if not ok:
                t.violate("lost", f"the live save did not commit: {t.outcome}")
            require = {"step_000000001": "the previous commit"}
            if ok:
                require["step_000000002"] = "the live save's commit"
            self.check(t, b, run, "ckpt", planted, fresh_save=False, require=require)

        cleanup: list[str] = []
        self._run(t, body, cleanup)

    # ------------------------------------------------------------------ class 8
    def class8(self) -> None:
        keep1 = _policy_file("[keep]\nlast = 1\n")
        live = [
            (tool, skew, grace)
            for tool in ("gc", "prune")
            for skew, grace in (
                (3 * MIN, "1m"),
                (2 * HOUR + 10 * MIN, None),
                (-2 * HOUR, None),
                (-3 * MIN, "1m"),
            )
        ]
        writers = [
            (0, -2 * DAY),
            (2 * DAY, 0),
            (0, -3 * HOUR),
            (3 * HOUR, 0),
            (0, -10 * MIN),
            (10 * MIN, 0),
        ]
        plan: list[tuple[str, Any]] = [("live", x) for x in live] + [("writer", x) for x in writers]
        for j, (what, x) in enumerate(self._plan(8, plan, [plan[0]])):
            if self.over_budget(f"class 8 after {j} trials"):
                return
            if what == "live":
                tool, skew, grace = x

                def attack(
                    t: Any,
                    b: str,
                    run: str,
                    p: str,
                    tool: str = tool,
                    skew: float = skew,
                    grace: str | None = grace,
                ) -> None:
                    r = self.cli(self._tool_argv(tool, f"s3://{b}/{run}", grace, keep1), skew)
                    t.params["tool_rc"] = r["rc"]
                    t.notes.append(f"{tool}: {r['output'][-300:]}")

                self._live_trial(
                    8,
                    f"[{j + 1}] {tool} with clock {skew:+d}s, grace {grace or 'default'}, "
                    "during a live save",
                    {"tool": tool, "skew_s": skew, "grace": grace},
                    attack,
                )
            else:
                self.writer_skew_trial(j, *x)

    def writer_skew_trial(self, j: int, early: int, late: int) -> None:
        """Steps 1-2 saved with clock ``early``, 3-4 with ``late``; prune ``within 5m``
        (store time: keep every step) must delete nothing."""
        t = self._trial(
            8,
            f"[{j + 1}] writers skewed {early:+d}s (steps 1-2) / {late:+d}s "
            f"(steps 3-4), prune within {WITHIN}",
            {"early_s": early, "late_s": late},
        )
        cleanup: list[str] = []
        policy = _policy_file(f'[keep]\nwithin = "{WITHIN}"\n')

        def body(t: Any) -> None:
            b = self.s3.new_bucket("skew")
            cleanup.append(b)
            run = "run"
            self.s3.put(b, f"{run}/notes.txt", b"foreign\n")
            for step, skew in ((1, early), (2, early), (3, late), (4, late)):
                w = self.pool.take()
                cmd = {
                    "kind": "ckpt_save",
                    "run_url": f"s3://{b}/{run}",
                    "step": step,
                    "endpoint": self.moto.endpoint,
                    "seed": self.seed,
                    "tc": {"part_size": 5 << 20, "max_inflight_bytes": 20 << 20},
                    "env": {_chaos_skew.ENV: repr(float(skew))},
                }
                w.send(cmd)
                status, res = w.result()
                if not (res and res.get("ok")):
                    self.judge_worker(t, status, res, "ckpt")
                    return
            r = self.cli(self._tool_argv("prune", f"s3://{b}/{run}", None, policy))
            t.params["prune_rc"] = r["rc"]
            self._judge_steps(t, b, run, {1, 2, 3, 4}, r)
            self.check(t, b, run, "ckpt", [f"{run}/notes.txt"], fresh_save=False)

        self._run(t, body, cleanup)

    def _judge_steps(self, t: Any, b: str, run: str, want: set[int], r: dict[str, Any]) -> None:
        from s3ckpt.retention import list_checkpoints
        from s3ckpt.retention._catalog import CheckpointState
        from s3ckpt.store import Location

        store, run_url = self.store(f"s3://{b}/{run}")
        have = {
            c.step
            for c in list_checkpoints(Location(run_url, store))
            if c.state is CheckpointState.COMMITTED
        }
        gone = sorted(want - have)
        t.outcome = f"kept {sorted(have & want)}"
        for s in gone:
            if any(k < s for k in have):
                t.violate(
                    "newer_step_deleted",
                    f"step {s} deleted, older {sorted(have)} kept: " + r["output"][-300:],
                )
            else:
                t.violate("lost", f"step {s} deleted (within {WITHIN} in store time)")

    # ------------------------------------------------------------------ class 9
    def forge_heartbeats(self, b: str, prefix: str, pid: int) -> int:
        """Rewrite the live save's heartbeats as if its writer ran on another machine with
        this hostname and PID namespace: another boot id, a pid not alive here."""
        n = 0
        for key in self.s3.keys(b, prefix):
            if "s3ckpt.alive." not in key:
                continue
            doc = json.loads(self.s3.get(b, key))
            doc.update(host=socket.gethostname(), pid=pid)
            for k in list(doc):
                if "boot" in k:
                    doc[k] = str(uuid.uuid4())
                elif "start" in k:
                    doc[k] = 1
            self.s3.put(b, key, json.dumps(doc, separators=(",", ":")).encode())
            n += 1
        return n

    def class9(self) -> None:
        keep1 = _policy_file("[keep]\nlast = 1\n")
        base = [("gc", None), ("gc", "1m"), ("prune", None), ("prune", "1m"), ("lease", None)]
        pid = dead_pid()
        for j, (tool, grace) in enumerate(self._plan(9, base, [base[1]])):
            if self.over_budget(f"class 9 after {j} trials"):
                return
            if tool == "lease":
                self.lease_trial(j, pid, keep1)
                continue

            def attack(
                t: Any, b: str, run: str, p: str, tool: str = tool, grace: str | None = grace
            ) -> None:
                t.params["forged"] = self.forge_heartbeats(b, p, pid)
                r = self.cli(self._tool_argv(tool, f"s3://{b}/{run}", grace, keep1))
                t.params["tool_rc"] = r["rc"]
                t.notes.append(f"{tool}: {r['output'][-300:]}")

            self._live_trial(
                9,
                f"[{j + 1}] {tool} (grace {grace or 'default'}) sees a live save's heartbeats "
                "from a same-hostname host",
                {"tool": tool, "grace": grace, "pid": pid},
                attack,
            )

    def lease_trial(self, j: int, pid: int, policy: str) -> None:
        """A live prune on a same-hostname host holds the run's lease: ours must not take it."""
        from s3ckpt._commit import pid_namespace

        t = self._trial(
            9, f"[{j + 1}] prune meets the lease of a live same-hostname pruner", {"pid": pid}
        )
        cleanup: list[str] = []

        def body(t: Any) -> None:
            b, run, planted = self.arena("ckpt")
            cleanup.append(b)
            now = time.time()
            lease = {
                "format": "s3ckpt.lease",
                "version": 1,
                "owner": f"{socket.gethostname()}:{pid}:{uuid.uuid4().hex[:12]}",
                "host": socket.gethostname(),
                "pid": pid,
                "pidns": pid_namespace(),
                "boot_id": str(uuid.uuid4()),
                "start": 1,
                "operation": "prune",
                "acquired": now,
                "expires": now + 300,
                "released": False,
                "deleting": [],
            }
            raw = json.dumps(lease, separators=(",", ":")).encode()
            self.s3.put(b, f"{run}/s3ckpt.lease", raw)
            r = self.cli(self._tool_argv("prune", f"s3://{b}/{run}", None, policy))
            t.outcome = f"prune rc {r['rc']}"
            if self.s3.get(b, f"{run}/s3ckpt.lease") != raw:
                t.violate(
                    "lease_stolen",
                    "a live same-hostname pruner's lease was replaced: " + r["output"][-300:],
                )
            self.check_bucket(t, b, run, planted)

        self._run(t, body, cleanup)
