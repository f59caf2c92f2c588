#!/usr/bin/env python
"""One command for a machine with CUDA: async-save blocked time and a fan-out load over NCCL.

The concept: what s3ckpt does with GPU state, measured in one bounded run against
benchmarks.s3sim (the in-memory S3 server in its own process; stdlib and ``crc32c``
only, so a machine without moto or internet runs it). Phases, each printed with its
duration as it ends:

1. ``environment``: torch, CUDA, devices, s3ckpt version (also in the JSON).
2. ``warmup``: one tiny untimed save (boto3 client, connections, CUDA context).
3. ``rounds[none]``: a CUDA module of ``--size-mib`` (bench_dcp's mix: 4 large tensors
   with 3/4 of the bytes, many small ones), ``Checkpointer.save`` (sync) and
   ``Checkpointer.async_save`` (staged into pinned CPU memory) alternated for ``--runs``
   rounds. Blocked time of each (the first async save, which allocates the staging
   cache, apart), async/sync, the time until the async upload committed. After an async
   save is staged the module is changed (a training step) while the upload runs.
4. ``load``: the last async checkpoint loaded into a zeroed module on the device (timed,
   MB/s) and compared bit for bit with the state the async save was called with.
5. ``fanout``: with two or more devices, one process per device (NCCL) loads one
   replicated checkpoint directly and with ``S3StorageReader(fan_out=True)``: GETs and
   GET bytes (s3sim's counters), wall time. With one device it is reported skipped.
6. ``rounds[s3]`` (``--shaping both`` or ``s3``): the rounds again under S3's shaping.

Decisions: one hard budget (``--budget-s``, default 420): a phase whose estimate (from the
throughput already measured) does not fit is skipped and reported so; a watchdog ends the
process ``GRACE_S`` after the budget whatever hangs (partial JSON written, server and
ranks killed, exit 124): ``_gpu_budget.py``. The fan-out's ranks live in
``_gpu_fanout.py``. The bit-exact check compares bytes, not values (``-0.0`` is not
``0.0``), against a device copy taken when the async save was staged. ``--dry-run-cpu``
runs the same code paths on CPU with a tiny state and two gloo ranks for the fan-out: what
tests/unit/test_gpu_check.py runs, so the script cannot rot in CI. Only torch APIs of 2.11
and earlier. Exit 1 when a phase failed.

Usage (repository root)::

    python benchmarks/gpu_check.py --out gpu_check.json           # on the GPU machine
    python benchmarks/gpu_check.py --dry-run-cpu   # anywhere: ~15 s on 2 idle cores
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks import _gpu_fanout  # noqa: E402 - needs ROOT on sys.path
from benchmarks._gpu_budget import Budget, Run, start_watchdog  # noqa: E402

__all__ = [
    "bit_mismatches",
    "environment",
    "fanout",
    "load",
    "main",
    "rounds",
    "shapes",
]

MiB = 1024 * 1024
MB = 1_000_000
GRACE_S = 40.0  # the watchdog fires this long after the budget: default 460 s < 8 min
BUCKET = "gpu-check"
FIRST_GUESS_MBPS = 120.0  # a save's MB/s before one is measured (estimates only)


# ===========================================================================================
# State, comparison, environment.
# ===========================================================================================


def shapes(size_mib: float, n_small: int) -> list[tuple[int, ...]]:
    """bench_dcp's mix at ``size_mib``: 4 large 2-D fp32 tensors with 3/4 of the bytes,
    ``n_small`` 1-D ones with the rest."""
    total = int(size_mib * MiB)
    large = max(1024, (total * 3 // 4) // 4 // 4 // 1024 * 1024)
    small = max(1, (total - 4 * large * 4) // n_small // 4)
    return [(large // 1024, 1024)] * 4 + [(small,)] * n_small


def _module(shape_list: list[tuple[int, ...]], device: Any, seed: int | None) -> Any:
    """A module of one parameter per shape on ``device``: seeded random, or zeros."""
    import torch

    module = torch.nn.Module()
    gen = None if seed is None else torch.Generator(device=device).manual_seed(seed)
    for i, shape in enumerate(shape_list):
        if gen is None:
            t = torch.zeros(shape, device=device)
        else:
            t = torch.randn(shape, generator=gen, device=device)
        module.register_parameter(f"p{i}", torch.nn.Parameter(t, requires_grad=False))
    return module


def bit_mismatches(expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    """Names whose tensors differ in any bit (or in shape, dtype, presence)."""
    import torch

    bad = sorted(set(expected) ^ set(actual))
    for name in sorted(set(expected) & set(actual)):
        a, b = expected[name].detach(), actual[name].detach()
        if a.shape != b.shape or a.dtype != b.dtype:
            bad.append(name)
            continue
        a8 = a.contiguous().reshape(-1).view(torch.uint8)
        b8 = b.contiguous().reshape(-1).to(a.device).view(torch.uint8)
        if not torch.equal(a8, b8):
            bad.append(name)
    return bad


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def environment(dry_run: bool) -> dict[str, Any]:
    """What ran: torch, CUDA devices, s3ckpt, Python, host."""
    import torch

    import s3ckpt

    cuda = torch.cuda.is_available()
    devices = []
    for i in range(torch.cuda.device_count() if cuda else 0):
        props = torch.cuda.get_device_properties(i)
        devices.append({"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1)})
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": cuda,
        "device_count": len(devices),
        "devices": devices,
        "s3ckpt": s3ckpt.__version__,
        "git_commit": commit,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_avg": os.getloadavg()[0],
        "dry_run_cpu": dry_run,
    }


# ===========================================================================================
# Phases in this process.
# ===========================================================================================


def rounds(run: Run, name: str, ctx: dict[str, Any], reserve_s: float) -> None:
    """Sync ``save`` and ``async_save`` alternated; the last async state kept for ``load``."""
    import torch

    from s3ckpt import Checkpointer

    nbytes = ctx["nbytes"]
    est = 2.5 * nbytes / MB / FIRST_GUESS_MBPS  # until a round is measured (shaping differs)
    if not run.budget.fits(est, reserve_s):
        run.skip(name, f"a round needs ~{est:.0f} s, {run.budget.left():.0f} s left")
        return
    with run.phase(name) as fig:
        device, model = ctx["device"], ctx["model"]
        url = f"s3://{BUCKET}/run-{name.replace('[', '-').rstrip(']')}"
        fig.update(
            bytes=nbytes,
            url=url,
            sync_s=[],
            async_blocked_s=[],
            async_call_s=[],
            async_commit_s=[],
            skipped_rounds=0,
        )
        pinned = device.type == "cuda"  # async saves stage into pinned CPU memory
        fig["pinned_staging"] = pinned
        with Checkpointer(url, s3_config=ctx["s3_config"], pin_memory=pinned) as ckpt:
            for r in range(ctx["runs"]):
                if r and not run.budget.fits(est, reserve_s):
                    fig["skipped_rounds"] = ctx["runs"] - r
                    run.say(f"{name}: {ctx['runs'] - r} round(s) skipped (budget)")
                    break
                t_round = time.perf_counter()
                _sync(device)
                h = ckpt.save(2 * r + 1, model)
                fig["sync_s"].append(h.blocked_seconds)
                _sync(device)
                h = ckpt.async_save(2 * r + 2, model)
                h.staged.result(timeout=max(1.0, run.budget.left()))
                expected = {k: v.detach().clone() for k, v in model.named_parameters()}
                with torch.no_grad():  # a training step while the upload runs
                    for p in model.parameters():
                        p.add_(1.0)
                h.wait(timeout=max(1.0, run.budget.left()))
                fig["async_blocked_s"].append(h.blocked_seconds)
                fig["async_call_s"].append(h.call_seconds)
                fig["async_commit_s"].append(h.commit_seconds)
                ctx["save_mbps"] = nbytes / MB / min(fig["sync_s"])
                est = time.perf_counter() - t_round
                run.say(
                    f"{name} round {r + 1}: sync {fig['sync_s'][-1]:.3f} s, async blocked "
                    f"{h.blocked_seconds:.3f} s, async committed {h.commit_seconds:.2f} s"
                )
        if ctx.get("expected") is None:
            ctx.update(expected=expected, url=url, step=2 * len(fig["async_blocked_s"]))
        sync_med = statistics.median(fig["sync_s"])
        warm = fig["async_blocked_s"][1:]
        fig.update(
            sync_median_s=sync_med,
            sync_save_mbps=nbytes / MB / sync_med,
            async_first_blocked_s=fig["async_blocked_s"][0],
            async_first_fraction=fig["async_blocked_s"][0] / sync_med,
            async_warm_blocked_median_s=statistics.median(warm) if warm else None,
            async_warm_fraction=statistics.median(warm) / sync_med if warm else None,
            async_commit_median_s=statistics.median(fig["async_commit_s"]),
        )


def load(run: Run, ctx: dict[str, Any], reserve_s: float) -> None:
    """The kept async checkpoint loaded onto the device, timed and compared bit for bit."""
    from s3ckpt import Checkpointer

    if ctx.get("expected") is None:
        run.skip("load", "no async save committed")
        return
    est = 2.0 * ctx["nbytes"] / (ctx.get("save_mbps") or FIRST_GUESS_MBPS) / MB
    if not run.budget.fits(est, reserve_s):
        run.skip("load", f"needs ~{est:.0f} s, {run.budget.left():.0f} s left")
        return
    with run.phase("load") as fig:
        dest = _module(ctx["shapes"], ctx["device"], seed=None)
        with Checkpointer(ctx["url"], s3_config=ctx["s3_config"]) as ckpt:
            t0 = time.perf_counter()
            step = ckpt.load(dest, step=ctx["step"])
            _sync(ctx["device"])
            wall = time.perf_counter() - t0
        bad = bit_mismatches(ctx["expected"], dict(dest.named_parameters()))
        fig.update(
            step=step,
            wall_s=wall,
            load_mbps=ctx["nbytes"] / MB / wall,
            bit_exact=not bad,
            mismatched=bad[:10],
            device=str(ctx["device"]),
        )
        ctx["load_mbps"] = fig["load_mbps"]
        if bad:
            raise AssertionError(f"{len(bad)} tensor(s) of step {step} differ, e.g. {bad[:3]}")


def fanout(run: Run, ctx: dict[str, Any], args: argparse.Namespace) -> None:
    """Direct vs fan-out loads of one replicated checkpoint, one process per device."""
    import torch

    world = 2 if args.dry_run_cpu else torch.cuda.device_count()
    if world < 2:
        run.skip("fanout", f"{world} CUDA device(s): a fan-out load needs two or more")
        return
    nbytes = int(args.fanout_size_mib * MiB)
    mbps = min(ctx.get("load_mbps") or FIRST_GUESS_MBPS, ctx.get("save_mbps") or 1e9)
    est = 45.0 + (1 + 2 * world) * nbytes / MB / mbps
    if not run.budget.fits(est):
        run.skip("fanout", f"needs ~{est:.0f} s, {run.budget.left():.0f} s left")
        return
    with run.phase("fanout") as fig:
        saved = _gpu_fanout.save_replicated(
            f"s3://{BUCKET}/fanout/step_1", nbytes, ctx["s3_config"]
        )
        spec = {
            **saved,
            "world": world,
            "endpoint": ctx["endpoint"],
            "env": ctx["env"],
            "cuda": not args.dry_run_cpu,
            "piece_mib": args.piece_mib,
        }
        ranks = _gpu_fanout.run_ranks(spec, run.budget.left, ctx.setdefault("ranks", []))
        fig.update(
            world=world,
            bytes=nbytes,
            backend="gloo (CPU dry run)" if args.dry_run_cpu else "nccl",
            **_gpu_fanout.summarise(ranks),
        )


def _cleanup(ctx: dict[str, Any]) -> None:
    """What the watchdog stops: the fan-out ranks, the server."""
    for p in ctx.get("ranks") or ():
        with contextlib.suppress(Exception):
            p.kill()
    if ctx.get("sim") is not None:
        ctx["sim"].stop()


def main(argv: list[str] | None = None) -> int:
    """Run every phase that fits in the budget; print and write the JSON. 1 on failure."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mib", type=float, help="state size (default 2048; dry run 8)")
    p.add_argument("--runs", type=int, help="sync/async rounds (default 3; dry run 2)")
    p.add_argument("--budget-s", type=float, default=420.0, help="time budget (default 420)")
    p.add_argument(
        "--shaping",
        choices=("none", "s3", "both"),
        default="none",
        help="s3sim shaping of the rounds: off, S3's, or off then S3's",
    )
    p.add_argument(
        "--fanout-size-mib",
        type=float,
        help="the fan-out checkpoint (default min(size, 1024); dry run 4)",
    )
    p.add_argument("--piece-mib", type=int, default=64, help="fan_out_piece_size (default 64)")
    p.add_argument("--out", help="write the JSON here too")
    p.add_argument("--grace-s", type=float, default=GRACE_S, help=argparse.SUPPRESS)
    p.add_argument(
        "--dry-run-cpu",
        action="store_true",
        help="CPU, tiny sizes, gloo fan-out: the same code paths without CUDA",
    )
    args = p.parse_args(argv)
    dry = args.dry_run_cpu
    args.size_mib = args.size_mib or (8 if dry else 2048)
    args.runs = args.runs or (2 if dry else 3)
    args.fanout_size_mib = args.fanout_size_mib or (4 if dry else min(args.size_mib, 1024))
    run = Run(Budget(args.budget_s), args.out)
    run.data["args"] = vars(args)
    ctx: dict[str, Any] = {"runs": args.runs}
    start_watchdog(run, args.grace_s, functools.partial(_cleanup, ctx))

    import torch

    from benchmarks.s3sim import S3Sim, Shaping

    world = 2 if dry else torch.cuda.device_count()
    if world >= 2:
        _gpu_fanout.start_forkserver()  # before s3ckpt's imports here, so the two overlap
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")

    with run.phase("environment") as fig:
        fig.update(environment(dry))
        run.say(json.dumps(fig))
    if not dry and not torch.cuda.is_available():
        run.say("no CUDA device: nothing to measure (use --dry-run-cpu to check the script)")
        run.data["phases"].append({"name": "cuda", "status": "failed", "error": "no CUDA"})
        run.write()
        return 1
    device = torch.device("cpu") if dry else torch.device("cuda", 0)
    if not dry:
        torch.cuda.set_device(device)
    profiles = {"none": ["none"], "s3": ["s3"], "both": ["none", "s3"]}[args.shaping]
    log = os.path.join(tempfile.mkdtemp(prefix="gpu_check_"), "s3sim.log")
    sim = ctx["sim"] = S3Sim(Shaping.profile(profiles[0]), buckets=[BUCKET], log=log)
    try:
        with run.phase("server") as fig:
            sim.start()
            fig.update(endpoint=sim.endpoint, shaping=profiles[0], log=log)
        from s3ckpt import Checkpointer, S3Config

        env = {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }
        for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
            os.environ.pop(var, None)
        os.environ.update(env)
        shape_list = shapes(args.size_mib, 64 if dry else 2000)
        ctx.update(
            device=device,
            env=env,
            endpoint=sim.endpoint,
            shapes=shape_list,
            s3_config=S3Config(endpoint_url=sim.endpoint),
        )
        with run.phase("warmup") as fig:
            tiny = _module([(1024,)], device, seed=0)
            with Checkpointer(f"s3://{BUCKET}/warmup", s3_config=ctx["s3_config"]) as ckpt:
                ckpt.save(1, tiny)
                ckpt.async_save(2, tiny).wait(timeout=120)
            ctx["model"] = _module(shape_list, device, seed=0)
            _sync(device)
            ctx["nbytes"] = sum(t.numel() * t.element_size() for t in ctx["model"].parameters())
            fig.update(state_bytes=ctx["nbytes"], tensors=len(shape_list))
        # The first rounds leave room for the load check (and the fan-out, if it will run).
        reserve = 2.0 * ctx.get("nbytes", 0) / MB / FIRST_GUESS_MBPS
        if world >= 2:
            reserve += 45.0 + 3 * world * args.fanout_size_mib * MiB / MB / FIRST_GUESS_MBPS
        if "model" in ctx:
            rounds(run, f"rounds[{profiles[0]}]", ctx, reserve_s=reserve)
            load(run, ctx, reserve_s=0.0)
            fanout(run, ctx, args)
            for prof in profiles[1:]:
                sim.configure(profile=prof)
                rounds(run, f"rounds[{prof}]", ctx, reserve_s=0.0)
        run.data["results"]["peak_rss_mib"] = (
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        )
        if not dry:
            run.data["results"]["cuda_max_allocated_mib"] = torch.cuda.max_memory_allocated() / MiB
    finally:
        sim.stop()
    run.write()
    return 1 if run.failed() else 0


if __name__ == "__main__":
    raise SystemExit(main())
