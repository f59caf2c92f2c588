"""Planning: catalog + policy + now -> a :class:`Plan` with a reason for every decision.

Pure: no store, no clock. The invariants are enforced here, on top of any policy:

1. the newest committed checkpoint (by step, then commit time) is kept, and so is the
   most recently committed one (they differ after a rollback);
2. pinned checkpoints are kept;
3. in-progress, abandoned and (unless ``include_foreign``) foreign checkpoints are never
   deleted by a plan (``gc`` owns abandoned ones);
4. an empty policy is refused (:class:`~s3ckpt.errors.PolicyError`);
5. ``max_delete`` caps the deletions of one run: the oldest go first, the rest are
   deferred to the next run;
6. a committed checkpoint that is being overwritten (a live save writes into its prefix,
   :attr:`~s3ckpt.retention.CheckpointInfo.overwrite_in_progress`) is not deleted now: the
   overwrite commits with a compare-and-swap on the marker it replaces, which a deletion
   would make fail. It is deferred (``skip``) to a run after the overwrite;
7. a damaged checkpoint (committed, its marker unreadable or ``s3ckpt check`` found damage
   in it: :attr:`~s3ckpt.retention.CheckpointInfo.damaged`) is skipped, never deleted, and
   no policy sees it: it never counts toward keep-last-K nor is kept as "the newest" in
   place of the newest good one (so the newest good one is always kept).

With storage tiers (``RetentionOptions.tiers``) the plan also says which kept checkpoints
move to which storage class (:attr:`Plan.transitions`, :func:`~s3ckpt.retention._tiers.plan_tiers`):
never one the plan deletes or skips, never one being written into.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from s3ckpt._gc_pause import gc_paused
from s3ckpt._time import iso_z
from s3ckpt.retention._catalog import CheckpointInfo, CheckpointState
from s3ckpt.retention._options import RetentionOptions
from s3ckpt.retention._policy import Policy, check_policy
from s3ckpt.retention._tiers import Transition, plan_tiers
from s3ckpt.retention._toml import PolicyFile
from s3ckpt.uri import StoreURL

__all__ = ["Decision", "Plan", "check_policy", "decide", "hold", "newest", "plan"]

Action = Literal["keep", "delete", "skip"]

OVERWRITE = "deferred: an overwrite is in progress (a live save is re-writing it)"


@dataclass(frozen=True, slots=True)
class Decision:
    """What the plan does with one checkpoint, and why."""

    checkpoint: CheckpointInfo
    action: Action
    reasons: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return {**self.checkpoint.to_dict(), "action": self.action, "reasons": list(self.reasons)}


@dataclass(frozen=True)
class Plan:
    """The decisions for one run, in catalog order (oldest first).

    ``keep`` / ``delete`` / ``skipped`` give the classic view; ``decisions`` has them all.
    """

    decisions: tuple[Decision, ...]
    policy: str
    now: datetime
    run: StoreURL | None = None
    max_delete: int | None = None
    deferred: int = 0
    """Deletions the policy wanted but ``max_delete`` postponed."""
    transitions: tuple[Transition, ...] = ()
    """Kept checkpoints a tier moves to another storage class, in catalog order (their
    ``objects`` / ``bytes`` are known once listed: a prune fills them in)."""

    @property
    def keep(self) -> dict[str, tuple[str, ...]]:
        """Kept checkpoint names -> reasons."""
        return {d.checkpoint.name: d.reasons for d in self.decisions if d.action == "keep"}

    @property
    def delete(self) -> tuple[CheckpointInfo, ...]:
        """Checkpoints to delete, oldest first."""
        return tuple(d.checkpoint for d in self.decisions if d.action == "delete")

    @property
    def skipped(self) -> dict[str, tuple[str, ...]]:
        """Checkpoints the plan does not touch (not eligible, or deferred) -> why."""
        return {d.checkpoint.name: d.reasons for d in self.decisions if d.action == "skip"}

    @property
    def bytes_freed(self) -> int:
        """Bytes the deletions free."""
        return sum(c.size for c in self.delete)

    @property
    def objects_deleted(self) -> int:
        """Objects the deletions remove (control objects excluded)."""
        return sum(c.num_objects for c in self.delete)

    @property
    def objects_to_move(self) -> int:
        """Objects the transitions move (those listed; skipped ones excluded)."""
        return sum(t.objects or 0 for t in self.transitions if t.skipped is None)

    @property
    def bytes_to_move(self) -> int:
        """Bytes the transitions move (those listed; skipped ones excluded)."""
        return sum(t.bytes or 0 for t in self.transitions if t.skipped is None)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (``s3ckpt prune --json``)."""
        return {
            "run": str(self.run) if self.run is not None else None,
            "policy": self.policy,
            "now": iso_z(self.now),
            "max_delete": self.max_delete,
            "deferred": self.deferred,
            "keep": len(self.keep),
            "delete": len(self.delete),
            "skip": len(self.skipped),
            "bytes_freed": self.bytes_freed,
            "objects_deleted": self.objects_deleted,
            "decisions": [d.to_dict() for d in self.decisions],
            "transitions": [t.to_dict() for t in self.transitions],
            "objects_to_move": self.objects_to_move,
            "bytes_to_move": self.bytes_to_move,
        }


def plan(
    checkpoints: Sequence[CheckpointInfo],
    policy: Policy | PolicyFile,
    now: datetime,
    *,
    options: RetentionOptions | None = None,
    run: StoreURL | None = None,
) -> Plan:
    """Decide, for every checkpoint of one run, keep / delete / skip, with reasons.

    Args:
        checkpoints: One run's catalog (any order; sorted here by step, commit time).
        policy: The rules (a :class:`~s3ckpt.retention.PolicyFile`'s settings play no part
            here: the catalog is already read).
        now: The time the rules judge against (never read from the clock here; the
            options' ``now`` is not read).
        options: The run's settings; the plan reads ``max_delete`` (delete at most this
            many, the oldest; the rest wait for the next run) and ``include_foreign``
            (treat ``FOREIGN`` checkpoints, stock DCP, as committed).
        run: The run, for display.

    Raises:
        PolicyError: The policy is empty, or ``max_delete`` is not an integer >= 0.

    Cost: ``O(n log n)`` in the number of checkpoints (``O(n)`` for a catalog already in
    order, as listed); no I/O.
    """
    source = PolicyFile.of(policy)  # checked: an empty policy is refused
    # a policy file's tiers, unless the options name some
    return decide(checkpoints, source.policy, now, source.options(options), run, policy.describe())


def decide(
    checkpoints: Sequence[CheckpointInfo],
    rules: Policy,
    now: datetime,
    options: RetentionOptions,
    run: StoreURL | None,
    description: str,
) -> Plan:
    """:func:`plan` below its entry point: ``rules`` already checked (once per run) and
    free of step-pattern wrappers; ``description`` is the plan's ``policy`` text."""
    max_delete, include_foreign = options.max_delete, options.include_foreign
    with gc_paused():
        ordered = sorted(checkpoints, key=CheckpointInfo.sort_key)
        eligible = [c for c in ordered if _eligible(c, include_foreign)]
        kept: dict[str, list[str]] = {k: list(v) for k, v in rules.select(eligible, now).items()}
        # Invariants: these reasons are added whatever the policy said.
        resume = newest(eligible)
        for name, reason in resume.items():
            kept.setdefault(name, []).insert(0, reason)
        for c in eligible:
            if c.pinned:
                kept.setdefault(c.name, []).insert(0, f"pinned: {c.pinned}")
        decisions: list[Decision] = []
        wanted = sum(1 for c in eligible if c.name not in kept and not c.overwrite_in_progress)
        cap = wanted if max_delete is None else min(max_delete, wanted)
        deferred = wanted - cap
        for c in ordered:
            if not _eligible(c, include_foreign):
                d = Decision(c, "skip", (_skip_reason(c),))
            elif c.name in kept:
                d = Decision(c, "keep", tuple(dict.fromkeys(kept[c.name])))
            elif c.overwrite_in_progress:
                d = Decision(c, "skip", (OVERWRITE,))
            elif cap > 0:
                cap -= 1
                d = Decision(c, "delete", ("no rule keeps it",))
            else:
                d = Decision(c, "skip", (f"deferred: max_delete={max_delete} reached",))
            decisions.append(d)
        return Plan(
            decisions=tuple(decisions),
            policy=description,
            now=now,
            run=run,
            max_delete=max_delete,
            deferred=deferred,
            transitions=plan_tiers(eligible, kept, options.tiers, now, resume=resume),
        )


def hold(p: Plan, reasons: tuple[str, ...], doomed: Collection[str] | None = None) -> Plan:
    """``p`` with its deletions skipped for ``reasons`` instead (those not in ``doomed``,
    when given)."""
    decisions = tuple(
        Decision(d.checkpoint, "skip", reasons)
        if d.action == "delete" and (doomed is None or d.checkpoint.name not in doomed)
        else d
        for d in p.decisions
    )
    return dataclasses.replace(p, decisions=decisions)


def _eligible(c: CheckpointInfo, include_foreign: bool = True) -> bool:
    """Whether a plan may delete ``c``: committed (or foreign, when included), not damaged."""
    ok = c.state is CheckpointState.COMMITTED or (
        include_foreign and c.state is CheckpointState.FOREIGN
    )
    return ok and not c.damaged


def newest(catalog: Sequence[CheckpointInfo], include_foreign: bool = True) -> dict[str, str]:
    """Invariant 1: the newest committed checkpoint (by step, then commit time) and the most
    recently committed one, by name, with the reason each is kept.

    ``catalog`` is in catalog order; of it only the checkpoints a plan may delete count
    (committed ones, and foreign ones with ``include_foreign``; never a damaged one), the
    foreign ones only when none is committed. ``delete_checkpoint`` refuses the same ones.
    """
    eligible = [c for c in catalog if _eligible(c, include_foreign)]
    committed = [c for c in eligible if c.state is CheckpointState.COMMITTED] or eligible
    if not committed:
        return {}
    out = {committed[-1].name: "newest committed"}
    # ``committed`` is in catalog order: reversed, max() lets the later one win a commit-time
    # tie, as sort_key() would.
    timed = [c for c in reversed(committed) if c.committed_at is not None]
    latest = max(timed, key=lambda c: c.committed_at, default=None)  # type: ignore[arg-type,return-value]
    if latest is not None and latest.name not in out:
        out[latest.name] = "most recently committed"
    return out


def _skip_reason(c: CheckpointInfo) -> str:
    if c.damaged:
        return f"damaged, never deleted by a plan (s3ckpt rm deletes it): {c.damage}"
    if c.pinned:
        return f"{c.state.value.replace('_', ' ')}; pinned: {c.pinned}"
    if c.state is CheckpointState.IN_PROGRESS:
        return "in progress (no commit marker, recent activity)"
    if c.state is CheckpointState.ABANDONED:
        return "abandoned (no commit marker): removed by gc, not prune"
    if c.state is CheckpointState.FOREIGN:
        return "foreign (DCP .metadata, no s3ckpt.json): pass include_foreign to prune it"
    return c.state.value
