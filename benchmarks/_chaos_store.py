"""Chaos classes 10-12 (issue 27): the store's guarantees and deleters racing commits.

10. a store that ignores If-None-Match / If-Match (moto behind a proxy that strips them),
11. replies cut inside their headers (FaultProxy's ``cut_head``), 12. ``s3ckpt rm`` and
``s3ckpt prune --apply`` whose first delete of the checkpoint they planned to delete is held
until an overwrite of it has committed. A mixin of benchmarks/chaos.py's Harness, through
benchmarks/_chaos_trust.py's TrustClasses.
"""

from __future__ import annotations

import os
import tempfile
import threading
from typing import Any

import _chaos_wire

__all__ = ["StoreClasses"]


def _policy_file(body: str) -> str:
    fd, path = tempfile.mkstemp(prefix="chaos-policy-", suffix=".toml")
    with os.fdopen(fd, "w") as f:
        f.write(body)
    return path


class StoreClasses:
    """Classes 10-12 (the Harness provides every attribute used here)."""

    moto: Any
    s3: Any
    pool: Any
    rng: Any
    results: Any

    # ------------------------------------------------------------------ class 10
    def class10(self) -> None:
        base = [
            ("writer", 2, False),
            ("ckpt", 2, False),
            ("writer", 3, False),
            ("ckpt", 3, False),
            ("writer", 1, True),
        ]
        for j, (kind, n, single) in enumerate(self._plan(10, base, [base[0]])):
            if self.over_budget(f"class 10 after {j} trials"):
                return
            self.noncond_trial(j, kind, n, single)

    def noncond_trial(self, j: int, kind: str, n: int, single: bool) -> None:
        t = self._trial(
            10,
            f"[{j + 1}] {n} {kind} saver(s) of one prefix, store ignores "
            f"conditional writes, single_writer={single}",
            {"saver": kind, "savers": n, "single_writer": single},
        )
        cleanup: list[str] = []

        def body(t: Any) -> None:
            b, run, planted = self.arena(kind)
            cleanup.append(b)
            proxy, _arms, how = _chaos_wire.open_proxy(self.moto.endpoint, strip=True)
            t.notes.append(how)
            try:
                workers = []
                for i in range(n):
                    w = self.pool.take()
                    # Checkpointer savers save one state (the harness checks step 2 against
                    # variant 0); the writers' states tell the winner apart.
                    v = i + 1 if kind == "writer" else 0
                    cmd = self.command(
                        kind,
                        b,
                        proxy.endpoint_url,
                        variant=v,
                        barrier=True,
                        s3={"single_writer": True} if single else {},
                    )
                    if kind == "writer":
                        cmd.update(ckpt_url=f"s3://{b}/{run}/fresh", overwrite=False)
                    w.send(cmd)
                    workers.append(w)
                for w in workers:
                    w.go()
                outs = [w.result() for w in workers]
            finally:
                proxy.stop()
            ok = [i + 1 for i, (s, r) in enumerate(outs) if s == "done" and r and r["ok"]]
            errs = [r["error"] for s, r in outs if s == "done" and r and not r["ok"]]
            t.outcome = f"{len(ok)} won, {len(errs)} refused"
            t.params["winners"] = ok
            for s, r in outs:
                if s != "done":
                    t.violate("unclear_error", f"saver {s}")
                elif r and r.get("dropped_s3"):
                    t.notes.append(f"S3Config lacks {r['dropped_s3']}")
            for e in errs:
                if not e["clear"]:
                    t.violate("unclear_error", f"{e['type']}: {e['message']}")
            if len(ok) > 1 and not single:
                t.violate("two_winners", f"savers {ok} all reported success")
            if (
                not ok
                and not single
                and errs
                and not all("conditional" in e["message"].lower() for e in errs)
            ):
                t.violate(
                    "unclear_error",
                    "a refusal does not name conditional writes: " + errs[0]["message"][:300],
                )
            if single and n == 1 and not ok:
                t.violate("lost", "single_writer=True: the only saver did not commit")
            if ok and kind == "writer":
                got = self.load_flat_digest(f"s3://{b}/{run}/fresh")
                winners = {self.expect_flat(7, v) for v in ok}
                if got not in winners:
                    t.violate("silent_wrong_load", f"committed state is none of winners {ok}")
            require = {"step_000000002": "a save reported success"} if ok and kind == "ckpt" else {}
            self.check(t, b, run, kind, planted, fresh_save=False, require=require or None)

        self._run(t, body, cleanup)

    # ------------------------------------------------------------------ class 11
    def class11(self) -> None:
        tk = _chaos_wire.TRUNCATE_KIND
        base = [
            ("ckpt", "UploadPart", "*", 0),
            ("ckpt", "UploadPart", "*", 1),
            ("ckpt", "PutObject", "*s3ckpt.json", 0),
            ("ckpt", "PutObject", "*.metadata.*", 0),
            ("ckpt", "PutObject", "*s3ckpt.latest.json", 0),
            ("ckpt", "CompleteMultipartUpload", "*", 0),
            ("writer", "UploadPart", "*", 0),
            ("writer", "PutObject", "*s3ckpt.json", 0),
            ("writer", "CompleteMultipartUpload", "*", 0),
        ]
        for j, (kind, op, glob, skip) in enumerate(self._plan(11, base, [base[0]])):
            if self.over_budget(f"class 11 after {j} trials"):
                return
            arm = dict(op=op, kind=tk, key_glob=glob, skip=skip)
            t = self._trial(
                11, f"[{j + 1}] {tk} {kind}:{op} {glob} #{skip + 1}", {"saver": kind, "arm": arm}
            )
            self.fault_run(t, kind, dict(fault_rate=0.0), [arm])
            self.results.add(t)

    # ------------------------------------------------------------------ class 12
    def class12(self) -> None:
        base = [
            ("rm", "after_commit"),
            ("prune", "after_commit"),
            ("rm", "random"),
            ("prune", "random"),
        ]
        for j, (tool, mode) in enumerate(self._plan(12, base, [base[0]])):
            if self.over_budget(f"class 12 after {j} trials"):
                return
            self.delete_race_trial(j, tool, mode)

    def delete_race_trial(self, j: int, tool: str, mode: str) -> None:
        """The deleter's first request against the checkpoint it planned to delete (made
        after its listing under the run's lease) is held until an overwrite of that
        checkpoint has committed (or a random moment of the overwrite)."""
        from s3ckpt.format._names import LEASE_NAME, MANIFEST_NAME
        from tests.faultproxy import FaultProxy

        delay = round(self.rng.uniform(0.0, 2.0), 2) if mode == "random" else None
        t = self._trial(
            12,
            f"[{j + 1}] {tool} vs an overwrite of ow/ckpt, released {mode}"
            + (f" +{delay}s" if delay is not None else ""),
            {"tool": tool, "mode": mode, "delay_s": delay},
        )
        cleanup: list[str] = []
        policy = _policy_file("[keep]\nlast = 1\n")

        def body(t: Any) -> None:
            b, run, planted = self.arena("writer")
            cleanup.append(b)
            self.direct_writer_save(f"s3://{b}/{run}/ckpt2", 8, 0, overwrite=False)
            at_delete, release = threading.Event(), threading.Event()

            def hook(op: str, key: str, phase: str) -> None:
                # Hold the first request that changes the checkpoint (its marker's
                # conditional delete, a batch, or a tombstone PUT), not the capability
                # probe's DeleteObject If-Match beside the lease: that is sent inside
                # Lease.acquire, before the deleter lists and plans under the lease, and
                # an overwrite that commits then is simply part of what it plans.
                deleting = phase == "before" and (
                    (op in ("DeleteObjects", "DeleteObject") and f"{LEASE_NAME}.probe-" not in key)
                    or (op == "PutObject" and key.endswith("/" + MANIFEST_NAME))
                )
                if deleting and not at_delete.is_set():
                    at_delete.set()
                    release.wait(45)

            with FaultProxy(self.moto.endpoint, fault_rate=0.0, hook=hook) as proxy:
                url = f"s3://{b}/{run}" + ("/ckpt" if tool == "rm" else "")
                argv = [tool, url, "--endpoint-url", proxy.endpoint_url]
                argv += (
                    ["--allow-newest"]
                    if tool == "rm"
                    else ["--apply", "--no-progress", "--policy", policy]
                )
                d = self.pool.take()
                d.send({"kind": "cli", "argv": argv})
                out: dict[str, Any] = {}
                o_done = threading.Event()
                if at_delete.wait(30):
                    o = self.pool.take()
                    o.send(self.command("writer", b, self.moto.endpoint))

                    def over() -> None:
                        out["o"] = o.result()
                        o_done.set()

                    threading.Thread(target=over, daemon=True).start()
                    if delay is not None:
                        o_done.wait(delay)
                    elif not o_done.wait(40):  # the hook lets go at 45 s anyway
                        t.notes.append("released before the overwrite finished (a slow machine)")
                else:
                    t.notes.append("the deleter sent no delete request")
                release.set()
                ds, dr = d.result(120)
                o_done.wait(120)
            t.params["deleter_rc"] = dr.get("rc") if dr else ds
            t.notes.append(f"{tool}: {(dr or {}).get('output', '')[-300:]}")
            os_, orr = out.get("o", ("not run", None))
            o_ok = bool(orr and orr.get("ok"))
            t.outcome = (
                f"overwrite {'ok' if o_ok else os_ if orr is None else 'failed'}, "
                f"{tool} rc {t.params['deleter_rc']}"
            )
            if orr is not None and not o_ok:
                self.judge_worker(t, os_, orr, "writer")
            if o_ok:
                try:
                    if self.load_flat_digest(f"s3://{b}/{run}/ckpt") != self.expect_flat(7, 1):
                        t.violate("silent_wrong_load", "ow/ckpt loads other than the overwrite")
                except Exception as exc:  # any failure to load here is the finding
                    t.violate(
                        "lost",
                        f"the overwrite reported success; ow/ckpt now: {type(exc).__name__}: {exc}"[
                            :400
                        ],
                    )
            require = {"ckpt2": "the newest checkpoint"}
            if o_ok:
                require["ckpt"] = "an overwrite that reported success"
            self.check(t, b, run, "writer", planted, fresh_save=False, require=require)

        self._run(t, body, cleanup)
