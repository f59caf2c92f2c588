"""What the demo prints once both training processes are done: the checkpoints kept (and
why), how long training was blocked per async save against a synchronous save, the
exact-resume proof, and the ``s3ckpt`` commands to try next on the run.

Nothing here needs torch: the catalog and the reasons are a plan of the built-in policy.
"""

from __future__ import annotations

import textwrap
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from s3ckpt.demo._train import DEMO_POLICY

if TYPE_CHECKING:
    from s3ckpt.demo._train import TrainLog
    from s3ckpt.retention import CheckpointInfo
    from s3ckpt.store import Location

__all__ = ["print_blocked", "print_checkpoints", "print_next", "print_proof", "resume_proof"]


def print_checkpoints(run: Location) -> list[CheckpointInfo]:
    """Print the run's checkpoints with the reasons :data:`DEMO_POLICY` keeps each one (a
    plan of the built-in policy: no torch, no source tree needed); return the catalog."""
    from s3ckpt._units import format_bytes
    from s3ckpt.retention import list_checkpoints, load_policy, plan

    catalog = list_checkpoints(run)
    reasons = dict(plan(catalog, load_policy(DEMO_POLICY), datetime.now(UTC)).keep)
    leftovers = False
    for c in catalog:
        why = "; ".join(reasons.get(c.name, ())) or "-"
        if c.state.value != "committed":
            leftovers = True
            why = "not a checkpoint (no commit marker): never loaded, never pruned"
        print(f"  {c.name}  {c.state.value:<11} {format_bytes(c.size):>10}  kept: {why}")
    if leftovers:
        print(
            "  (objects without a commit marker: a save or a prune that the kill interrupted.\n"
            "   Recent objects look in progress, so nothing touches them yet; once the grace\n"
            "   period has passed, the next prune finishes an interrupted deletion (it is in\n"
            "   the lease's intent log) and `s3ckpt gc` removes an abandoned save.)"
        )
    return catalog


def print_blocked(blocked: list[float], sync_s: float | None, steps: int) -> None:
    """Training blocked per async save (median, mean) against the synchronous save of the
    same state; nothing when either is unknown."""
    if not blocked or not sync_s:
        return
    import statistics

    from s3ckpt._units import plural

    mean = sum(blocked) / len(blocked)
    median = statistics.median(blocked)
    print(
        f"\ntraining blocked per async save: median {1000 * median:.1f} ms, mean "
        f"{1000 * mean:.1f} ms over {plural(len(blocked), 'save')} (the first save of each "
        "process "
        f"allocates the staging cache), vs {sync_s:.2f} s for a synchronous save of the same "
        f"state: {100 * median / sync_s:.1f} % (median), {100 * mean / sync_s:.1f} % (mean)"
    )
    print(
        f"(step {steps + 1} is that synchronous save: process 2 saved the state of step "
        f"{steps} once more with Checkpointer.save, which returns only once the checkpoint "
        "is durable, to measure how much of a save the async ones take off the training loop.)"
    )


def print_proof(first: TrainLog, second: TrainLog) -> bool:
    """Print the exact-resume proof (:func:`resume_proof`); return whether it held."""
    exact, verdict = resume_proof(first, second)
    print("\n== exact resume ==")
    print(textwrap.fill(verdict, width=92, initial_indent="  ", subsequent_indent="  "))
    return exact


def resume_proof(first: TrainLog, second: TrainLog) -> tuple[bool, str]:
    """Compare the losses of the steps both processes trained: process 1 trained them
    uninterrupted, process 2 after loading the checkpoint. Each such step depends on the
    model, the optimizer state and the data RNG restored, so equal losses, bit for bit,
    show that all three came back exactly."""
    from s3ckpt._units import plural

    if second.resumed is None:
        return False, "process 2 found no committed checkpoint to resume from."
    both = sorted(set(first.losses) & set(second.losses))
    if not both:
        return True, (
            f"process 2 resumed from step {second.resumed}, the last step process 1 trained "
            "(its save committed before the kill): no step was trained by both processes, so "
            "there are no losses to compare."
        )
    differ = [s for s in both if first.losses[s] != second.losses[s]]
    span = f"step {both[0]}" if len(both) == 1 else f"steps {both[0]}-{both[-1]}"
    if differ:
        shown = ", ".join(
            f"step {s}: {float.fromhex(first.losses[s])!r} then {float.fromhex(second.losses[s])!r}"
            for s in differ[:3]
        )
        return False, (
            f"MISMATCH: process 2 resumed from step {second.resumed} and trained {span} again, "
            f"but {len(differ)} of those {plural(len(both), 'loss', 'losses')} differ from "
            f"process 1's ({shown}): "
            "the checkpoint did not restore the model, the optimizer state or the data RNG "
            "exactly."
        )
    last = both[-1]
    same = {1: "its loss is", 2: "both losses are"}.get(len(both), f"all {len(both)} losses are")
    return True, (
        f"process 2 resumed from step {second.resumed} and trained {span} again, which process 1 "
        f"had trained before it was killed: {same} bit-for-bit the same (step {last}: "
        f"{float.fromhex(second.losses[last])!r} in both). Each of those steps depends on the "
        "model, the optimizer state and the data RNG restored from the checkpoint, so all three "
        "came back exactly."
    )


def print_next(url: str, catalog: list[CheckpointInfo], env_hint: str) -> None:
    """The ``s3ckpt`` commands to try on the run (after ``env_hint``, a shell line that
    points them at the embedded server, when there is one)."""
    committed = [c.name for c in catalog if c.state.value == "committed"]
    run_url = url.rstrip("/") + "/"
    print("\n== next: try the s3ckpt command on this run ==")
    if env_hint:
        print(f"  {env_hint}")
    print(f"  s3ckpt ls {run_url}")
    if committed:
        ckpt_url = f"{run_url}{committed[-1]}/"
        print(f"  s3ckpt inspect {ckpt_url} --summary")
        print(f"  s3ckpt verify {ckpt_url}")
    # A built-in policy name: the same file, from any directory.
    print(f"  s3ckpt prune {run_url} --policy {DEMO_POLICY}    # a dry run; --apply deletes")
