"""A saver/loader process for benchmarks/chaos.py (the process the harness SIGKILLs).

The harness starts it with multiprocessing's forkserver (this module preloaded, so torch
is imported once, not per trial). Protocol over a Pipe: the child sends ``{"ready": pid}``,
receives one command, sends ``{"armed": True}``, waits for a ``go`` message when the
command has ``"barrier": True``, runs it, sends ``{"result": ...}`` and exits.
A command may carry ``env`` (set before it runs: ``CHAOS_CLOCK_SKEW_S`` skews this process's
clock, see _chaos_skew.py) and ``s3`` (extra S3Config fields); ``{"kind": "cli", "argv":
[...]}`` runs the s3ckpt CLI and returns its exit code and output.
Results never raise: every failure is reported with its type,
whether it is (or wraps) an s3ckpt error, and how long it took to surface.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
import warnings
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch

torch.set_num_threads(1)
warnings.filterwarnings("ignore", message="torch.distributed is disabled")

import _chaos_skew  # noqa: E402
import _chaos_state as state  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

from s3ckpt import Checkpointer, S3Config, S3StorageReader, S3StorageWriter, TransferConfig  # noqa: E402
from s3ckpt.errors import S3CkptError, find_s3ckpt_error  # noqa: E402


def transfer_config(spec: dict[str, Any]) -> tuple[TransferConfig, list[str]]:
    """TransferConfig(**spec), dropping fields this s3ckpt does not know (reported)."""
    spec = dict(spec)
    dropped: list[str] = []
    while True:
        try:
            return TransferConfig(**spec), dropped
        except TypeError as exc:
            bad = [k for k in spec if f"'{k}'" in str(exc)]
            if not bad:
                raise
            for k in bad:
                dropped.append(k)
                spec.pop(k)


def describe_error(exc: BaseException, t0: float) -> dict[str, Any]:
    inner = find_s3ckpt_error(exc)
    return {
        "type": type(exc).__name__,
        "s3ckpt_type": type(inner).__name__ if inner is not None else None,
        "top_is_s3ckpt": isinstance(exc, S3CkptError),
        "clear": inner is not None,
        "message": str(inner if inner is not None else exc)[:600],
        "after_s": round(time.monotonic() - t0, 3),
        "trace": traceback.format_exc()[-1500:],
    }


def s3_config(endpoint: str, extra: dict[str, Any]) -> tuple[S3Config, list[str]]:
    """S3Config(endpoint_url=..., **extra), dropping fields this s3ckpt does not know."""
    extra = dict(extra)
    dropped: list[str] = []
    while True:
        try:
            return S3Config(endpoint_url=endpoint, **extra), dropped
        except TypeError as exc:
            bad = [k for k in extra if f"'{k}'" in str(exc)]
            if not bad:
                raise
            for k in bad:
                dropped.append(k)
                extra.pop(k)


def run_cli(argv: list[str]) -> dict[str, Any]:
    """``s3ckpt ARGV`` (the CLI's own main) in this process, output captured."""
    import contextlib
    import io

    from s3ckpt.cli import main

    buf = io.StringIO()
    t0 = time.monotonic()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = int(exc.code) if isinstance(exc.code, int) else 2
        except BaseException as exc:
            print(f"CLI crashed: {type(exc).__name__}: {exc}")
            print(traceback.format_exc()[-1500:])
            rc = 99
    return {
        "ok": rc == 0,
        "rc": rc,
        "output": buf.getvalue()[-4000:],
        "elapsed_s": round(time.monotonic() - t0, 3),
    }


def run(cmd: dict[str, Any]) -> dict[str, Any]:
    if cmd["kind"] == "cli":
        return run_cli(cmd["argv"])
    s3, dropped_s3 = s3_config(cmd["endpoint"], cmd.get("s3", {}))
    tc, dropped = transfer_config(cmd.get("tc", {}))
    out: dict[str, Any] = {"ok": True, "dropped_tc": dropped, "dropped_s3": dropped_s3}
    t0 = time.monotonic()
    seed, step, variant = cmd["seed"], cmd["step"], cmd.get("variant", 0)
    kind = cmd["kind"]
    try:
        if kind == "ckpt_save":
            ck = Checkpointer(cmd["run_url"], s3_config=s3, transfer_config=tc)
            model, opt = state.build_model(seed, step, variant)
            ck.save(step, model, opt)
            out["saved_s"] = round(time.monotonic() - t0, 3)
            if cmd.get("then_load"):
                m2, o2 = state.build_model(-1, 0)
                t1 = time.monotonic()
                got = ck.latest()
                out["latest"] = got
                if got is not None:
                    out["loaded_step"] = ck.load(m2, o2, step=got)
                    out["loaded_digest"] = state.model_digest(m2, o2)
                out["load_s"] = round(time.monotonic() - t1, 3)
            ck.close()
        elif kind == "writer_save":
            sd = state.flat_state(seed, step, variant)
            writer = S3StorageWriter(
                cmd["ckpt_url"],
                s3_config=s3,
                transfer_config=tc,
                overwrite=cmd.get("overwrite", False),
                step=step,
            )
            dcp.save(sd, storage_writer=writer)
            out["saved_s"] = round(time.monotonic() - t0, 3)
            if cmd.get("then_load"):
                t1 = time.monotonic()
                dest = state.blank_flat_state()
                dcp.load(
                    dest,
                    storage_reader=S3StorageReader(
                        cmd["ckpt_url"], s3_config=s3, transfer_config=tc
                    ),
                )
                out["loaded_digest"] = state.digest(dest)
                out["load_s"] = round(time.monotonic() - t1, 3)
        elif kind == "ckpt_load":
            ck = Checkpointer(cmd["run_url"], s3_config=s3, transfer_config=tc)
            m2, o2 = state.build_model(-1, 0)
            out["loaded_step"] = ck.load(m2, o2, step=cmd.get("load_step", "latest"))
            out["loaded_digest"] = state.model_digest(m2, o2)
            ck.close()
        else:
            raise ValueError(f"unknown command kind {kind!r}")
    except BaseException as exc:
        out["ok"] = False
        out["error"] = describe_error(exc, t0)
    out["elapsed_s"] = round(time.monotonic() - t0, 3)
    return out


def child(conn: Any) -> None:
    """Entry point in a process forked from the harness's forkserver (torch preloaded)."""
    try:
        conn.send({"ready": os.getpid()})
        cmd = conn.recv()
        # A harness-only variable (never read by s3ckpt): this process's clock is skewed.
        os.environ.update(cmd.get("env", {}))
        _chaos_skew.install_from_env()
        conn.send({"armed": True})
        if cmd.get("barrier"):
            conn.recv()
        result = run(cmd)
        conn.send({"result": result})
    finally:
        # Skip interpreter teardown (thread pools of a failed save may still be blocked).
        os._exit(0)
