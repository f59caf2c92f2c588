"""Chaos classes 13-17 (issue 37): one life for a checkpoint, whatever the commands around it do.

13. a writer paused (SIGSTOP, as ``scontrol suspend`` or a VM migration) with its commit-marker
    PUT in flight, past gc's grace; ``gc --apply``; the writer resumed (a fresh save and an
    overwrite): the save must fail clearly and the previous checkpoint stay the latest;
14. damage then prune: the newest step's data corrupted, ``s3ckpt check --read-data all``,
    ``prune`` keeping the last one: the newest *good* step must survive and ``load`` latest
    load it;
15. a GET reply that drips one byte a second, during ``load(step="latest")`` and during
    ``latest()``'s marker read: a clear error within the bound;
16. a black-holed endpoint per command (load, prune, gc, rm; save is class 3's black hole):
    each ends within a minute with a clear error;
17. deletes refused (403) during ``prune --apply``, then allowed: the next prune and gc leave
    what an uninterrupted run leaves (no lone ``.metadata``, no phantom save, no tombstone
    shown as damaged).

A mixin of benchmarks/chaos.py's ``Harness``, as ``_chaos_trust.TrustClasses`` is.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from _chaos_trust import _policy_file

__all__ = ["LIFE_CLASSES", "LifeClasses"]

LIFE_CLASSES = {
    13: "writer paused at its marker PUT past gc's grace",
    14: "damage, check, then prune and load latest",
    15: "a reply dripping 1 byte/s during load and latest",
    16: "a black-holed endpoint per command",
    17: "deletes refused during prune, then allowed",
}
LIMIT_S = 60.0  # every command ends within this of the endpoint going silent
SAVE = 2  # the step the harness's "ckpt" arena saves under attack
KEEP_LAST_1 = 'description = "chaos: the newest"\n\n[keep]\nlast = 1\n'


class LifeClasses:
    """Classes 13-17 (the Harness provides every attribute used here)."""

    moto: Any
    s3: Any
    pool: Any
    quick: bool
    results: Any

    # Provided by the Harness.
    def _trial(self, cls: int, name: str, params: dict[str, Any]) -> Any: ...
    def _run(self, t: Any, body: Any, cleanup: list[str]) -> None: ...
    def _plan(self, cls: int, base: list[Any], quick: list[Any]) -> list[Any]: ...
    def arena(self, kind: str) -> tuple[str, str, list[str]]: ...
    def command(self, kind: str, bucket: str, endpoint: str, **kw: Any) -> dict[str, Any]: ...
    def check(self, *a: Any, **kw: Any) -> None: ...
    def check_bucket(self, *a: Any, **kw: Any) -> None: ...
    def cli(
        self, argv: list[str], skew_s: float = 0.0, timeout: float = 120.0
    ) -> dict[str, Any]: ...
    def store(self, url: str, endpoint: str | None = None) -> tuple[Any, Any]: ...
    def direct_ckpt_save(self, run_url: str, step: int, variant: int = 0) -> None: ...
    def expect_model(self, step: int, variant: int = 0) -> str: ...
    def over_budget(self, where: str) -> bool: ...

    # ------------------------------------------------------------------ shared pieces
    def _worker(self, cmd: dict[str, Any], timeout: float) -> tuple[str, dict[str, Any] | None]:
        w = self.pool.take()
        w.send(cmd)
        return w.result(timeout)

    def _judge_bounded(self, t: Any, what: str, status: str, res: dict[str, Any] | None) -> None:
        """A command that must fail (the endpoint is broken) within LIMIT_S, clearly."""
        if status != "done" or res is None:
            t.outcome = f"{what}:{status}"
            t.time_to_error = LIMIT_S + 20
            t.violate("slow_error", f"{what}: no result within {LIMIT_S + 20:.0f}s ({status})")
            return
        took = float(res.get("elapsed_s") or 0.0)
        err = res.get("error")
        if err is not None:
            took = float(err.get("after_s", took))
        t.time_to_error = took
        if res.get("ok"):
            t.outcome = f"{what}:ok"
            t.notes.append(f"{what} succeeded through a broken endpoint ({took:.1f}s)")
            return
        if "rc" in res:  # a CLI run
            t.outcome = f"{what}:exit {res['rc']}"
            if res["rc"] in (None, 99):
                t.violate("unclear_error", f"{what}: {res.get('output', '')[-400:]}")
        else:
            t.outcome = f"{what}:failed:{err['s3ckpt_type'] or err['type']}"
            if not err["clear"]:
                t.violate("unclear_error", f"{what}: {err['type']}: {err['message']}")
        if took > LIMIT_S:
            t.violate("slow_error", f"{what} ended after {took:.1f}s (bound {LIMIT_S:.0f}s)")

    # ------------------------------------------------------------------ class 13
    def class13(self) -> None:
        base = [("ckpt", 1.0), ("writer", 1.0), ("ckpt", 3.0)]
        for j, (kind, past) in enumerate(self._plan(13, base, base[:1])):
            if self.over_budget(f"class 13 after {j} trials"):
                return
            self.paused_writer_trial(j, kind, past)

    def paused_writer_trial(self, j: int, kind: str, past_s: float) -> None:
        from s3ckpt.format._names import MIN_GRACE_SECONDS
        from s3ckpt.retention import RetentionOptions, gc
        from s3ckpt.retention._liveness import MIN_GRACE
        from s3ckpt.store import Location
        from tests.faultproxy import FaultProxy

        t = self._trial(
            13,
            f"[{j + 1}] {kind} SIGSTOPped with its marker PUT in flight, gc --apply "
            f"{past_s:.0f}s past the shortest grace, resumed",
            {"saver": kind, "past_s": past_s},
        )
        cleanup: list[str] = []

        def body(t: Any) -> None:
            b, run, planted = self.arena(kind)
            cleanup.append(b)
            marker = (
                f"{run}/step_{SAVE:09d}/s3ckpt.json"
                if kind == "ckpt"
                else f"{run}/ckpt/s3ckpt.json"
            )
            at_marker, release = threading.Event(), threading.Event()

            def hook(op: str, key: str, phase: str) -> None:
                at = op == "PutObject" and phase == "before" and key.endswith(marker)
                if at and not at_marker.is_set():
                    at_marker.set()
                    release.wait(120)

            with FaultProxy(self.moto.endpoint, fault_rate=0.0, hook=hook) as proxy:
                w = self.pool.take()
                w.send(self.command(kind, b, proxy.endpoint_url, then_load=True))
                stopped = False
                try:
                    if not at_marker.wait(90):
                        t.notes.append("the save never reached its marker PUT")
                    else:
                        os.kill(w.pid, signal.SIGSTOP)
                        stopped = True
                        time.sleep(1.0)  # its heartbeats stop with it
                        # gc raises any grace to MIN_GRACE_SECONDS (four missed heartbeats):
                        # judge ages at a time that far (and past_s more) ahead instead of
                        # waiting for it (moto runs here: its clock is this host's).
                        ahead = timedelta(seconds=MIN_GRACE_SECONDS + past_s)
                        store, run_url = self.store(f"s3://{b}/{run}")
                        when = datetime.now(UTC) + ahead
                        res = gc(
                            Location(run_url, store),
                            apply=True,
                            options=RetentionOptions(grace=MIN_GRACE, now=when),
                        )
                        t.params["gc_removed"] = len(res.removed) + res.leftovers_deleted
                finally:
                    release.set()  # the held PUT reaches the store now: it must meet the fence
                    time.sleep(0.5)
                    if stopped:
                        os.kill(w.pid, signal.SIGCONT)
                status, res = w.result(150)
            if not t.params.get("gc_removed"):
                t.notes.append("gc reaped nothing of the paused save: no fence was tested")
            t.outcome = status if res is None else ("committed" if res.get("ok") else "failed")
            if res is not None and not res.get("ok"):
                err = res["error"]
                t.outcome = f"failed:{err['s3ckpt_type'] or err['type']}"
                if not err["clear"]:
                    t.violate("unclear_error", f"{err['type']}: {err['message']}")
            require = (
                {f"step_{1:09d}": "the previous commit"}
                if kind == "ckpt"
                else {"ckpt": "the overwritten checkpoint"}
            )
            # check() loads every committed checkpoint: a "committed" save whose data gc
            # took is committed_unloadable; latest() must not point past a loadable step.
            self.check(t, b, run, kind, planted, fresh_save=True, require=require)

        self._run(t, body, cleanup)

    # ------------------------------------------------------------------ class 14
    def class14(self) -> None:
        base = ["data", "metadata"]
        for j, where in enumerate(self._plan(14, base, base[:1])):
            if self.over_budget(f"class 14 after {j} trials"):
                return
            self.damage_then_prune_trial(j, where)

    def damage_then_prune_trial(self, j: int, where: str) -> None:
        t = self._trial(14, f"[{j + 1}] newest step's {where} corrupted, check, prune, load", {})
        cleanup: list[str] = []
        policy = _policy_file(KEEP_LAST_1)

        def body(t: Any) -> None:
            b, run, _planted = self.arena("ckpt")
            cleanup.append(b)
            url = f"s3://{b}/{run}"
            for step in (2, 3):
                self.direct_ckpt_save(url, step)
            prefix = f"{run}/step_{3:09d}/"
            keys = self.s3.keys(b, prefix)
            if where == "data":
                target = max(
                    (k for k in keys if k.endswith(".distcp")), key=lambda k: len(self.s3.get(b, k))
                )
            else:
                target = next(k for k in keys if "/.metadata." in k)
            raw = bytearray(self.s3.get(b, target))
            raw[len(raw) // 2] ^= 0xFF
            self.s3.put(b, target, bytes(raw))
            ep = ["--endpoint-url", self.moto.endpoint]
            r = self.cli(["check", url, "--read-data", "all", *ep])
            t.params["check_rc"] = r.get("rc")
            if r.get("rc") != 1:
                t.violate(
                    "undetected_corruption", f"check exit {r.get('rc')}: {r['output'][-300:]}"
                )
            r = self.cli(["prune", url, "--policy", policy, "--apply", "--no-progress", *ep])
            t.params["prune_rc"] = r.get("rc")
            status, res = self._worker(
                self.command("ckpt", b, self.moto.endpoint) | {"kind": "ckpt_load"}, 120
            )
            if status != "done" or res is None or not res.get("ok"):
                detail = (res or {}).get("error", {}).get("message", status)
                t.outcome = "load failed"
                t.violate("committed_unloadable", f"load latest after prune: {detail}"[:500])
                return
            t.outcome = f"loaded step {res.get('loaded_step')}"
            if res.get("loaded_step") != 2 or res.get("loaded_digest") != self.expect_model(2):
                t.violate(
                    "lost" if res.get("loaded_step") != 2 else "silent_wrong_load",
                    f"load latest gave step {res.get('loaded_step')}; the newest good is 2",
                )

        try:
            self._run(t, body, cleanup)
        finally:
            os.unlink(policy)

    # ------------------------------------------------------------------ class 15
    def class15(self) -> None:
        base = [("GetObject", "*.distcp"), ("GetObject", "*s3ckpt.json")]
        for j, (op, glob) in enumerate(self._plan(15, base, base[:1])):
            if self.over_budget(f"class 15 after {j} trials"):
                return
            self.drip_trial(j, op, glob)

    def drip_trial(self, j: int, op: str, glob: str) -> None:
        from tests.faultproxy import FaultProxy

        t = self._trial(15, f"[{j + 1}] {op} {glob} drips 1 byte/s during load latest", {})
        cleanup: list[str] = []

        def body(t: Any) -> None:
            b, _run, _planted = self.arena("ckpt")
            cleanup.append(b)
            with FaultProxy(self.moto.endpoint, fault_rate=0.0) as proxy:
                proxy.arm(op=op, kind="drip", key_glob=glob, times=1000)
                cmd = self.command("ckpt", b, proxy.endpoint_url) | {"kind": "ckpt_load", "tc": {}}
                status, res = self._worker(cmd, LIMIT_S + 20)
            self._judge_bounded(t, "load latest", status, res)

        self._run(t, body, cleanup)

    # ------------------------------------------------------------------ class 16
    def class16(self) -> None:
        base = ["load", "prune", "gc", "rm"]
        for j, what in enumerate(self._plan(16, base, base[:1])):
            if self.over_budget(f"class 16 after {j} trials"):
                return
            self.black_hole_trial(j, what)

    def black_hole_trial(self, j: int, what: str) -> None:
        from tests.faultproxy import FaultProxy

        t = self._trial(16, f"[{j + 1}] {what} against a black hole (defaults)", {"command": what})
        cleanup: list[str] = []
        policy = _policy_file(KEEP_LAST_1)

        def body(t: Any) -> None:
            b, run, _planted = self.arena("ckpt")
            cleanup.append(b)
            url = f"s3://{b}/{run}"
            if what in ("prune", "rm"):
                self.direct_ckpt_save(url, 2)  # something to delete
            with FaultProxy(self.moto.endpoint, fault_rate=1.0, faults=("stall",)) as proxy:
                ep = ["--endpoint-url", proxy.endpoint_url, "--no-progress"]
                if what == "load":
                    cmd = self.command("ckpt", b, proxy.endpoint_url) | {
                        "kind": "ckpt_load",
                        "tc": {},
                    }
                    status, res = self._worker(cmd, LIMIT_S + 20)
                else:
                    argv = {
                        "prune": ["prune", url, "--policy", policy, "--apply", *ep],
                        "gc": ["gc", url, "--apply", *ep],
                        "rm": ["rm", f"{url}/step_{1:09d}", *ep[:2]],  # no --no-progress
                    }[what]
                    res = self.cli(argv, timeout=LIMIT_S + 20)
                    status = "done" if res.get("rc") is not None else "timeout"
            self._judge_bounded(t, what, status, res)

        try:
            self._run(t, body, cleanup)
        finally:
            os.unlink(policy)

    # ------------------------------------------------------------------ class 17
    def class17(self) -> None:
        base = ["DeleteObjects", "DeleteObject", "PutObject"]
        for j, op in enumerate(self._plan(17, base, base[:1])):
            if self.over_budget(f"class 17 after {j} trials"):
                return
            self.refused_deletes_trial(j, op)

    def refused_deletes_trial(self, j: int, op: str) -> None:
        from s3ckpt.retention import list_checkpoints
        from s3ckpt.store import Location
        from tests.faultproxy import FaultProxy

        t = self._trial(17, f"[{j + 1}] {op} refused (403) during prune --apply, then allowed", {})
        cleanup: list[str] = []
        policy = _policy_file(KEEP_LAST_1)

        def body(t: Any) -> None:
            b, run, planted = self.arena("ckpt")
            cleanup.append(b)
            url = f"s3://{b}/{run}"
            for step in (2, 3):
                self.direct_ckpt_save(url, step)
            with FaultProxy(self.moto.endpoint, fault_rate=0.0) as proxy:
                glob = "*s3ckpt.json" if op == "PutObject" else "*"
                proxy.arm(op=op, kind="denied", key_glob=glob, times=1000)
                argv = ["prune", url, "--policy", policy, "--apply", "--no-progress"]
                r = self.cli([*argv, "--endpoint-url", proxy.endpoint_url])
                t.params["denied_rc"] = r.get("rc")
            ep = ["--endpoint-url", self.moto.endpoint]
            r = self.cli([*argv, *ep])
            t.params["prune_rc"] = r.get("rc")
            store, run_url = self.store(url)
            committed: set[str] = set()
            for c in list_checkpoints(Location(run_url, store)):
                if c.is_committed and not c.damaged:
                    committed.add(c.url.prefix)
                if c.damaged or c.live_saves or str(c.state) == "in_progress":
                    t.violate(
                        "leftover_after_gc",
                        f"after the denial was lifted: {c.name} shows {c.state}"
                        f"{' damaged' if c.damaged else ''}"
                        f"{' with a live save' if c.live_saves else ''}",
                    )
            lone = [
                k
                for k in self.s3.keys(b, f"{run}/")
                if k.endswith("/.metadata") and k[: -len(".metadata")] not in committed
            ]
            if lone:
                t.violate("leftover_after_gc", f"lone .metadata after the re-run: {lone}")
            t.outcome = f"denied prune exit {t.params['denied_rc']}, re-run exit {r.get('rc')}"
            self.check(
                t,
                b,
                run,
                "ckpt",
                planted,
                fresh_save=False,
                require={f"step_{3:09d}": "the newest"},
            )

        try:
            self._run(t, body, cleanup)
        finally:
            os.unlink(policy)
