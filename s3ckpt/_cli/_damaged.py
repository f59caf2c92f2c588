"""Damaged checkpoints on the command line: ``ls``, ``prune``, ``gc`` and ``report`` list a
checkpoint the catalog calls damaged (its commit marker cannot be read, or ``s3ckpt check``
found damage in it: :attr:`s3ckpt.retention.CheckpointInfo.damaged`) as its own row, warn
about it on stderr (one line per checkpoint, naming it and why) and exit 1, "done in part",
after processing everything else.

Names and reasons come from the bucket, where anyone with write access chooses them, so
they are printed with control characters escaped: a key cannot move the cursor or rewrite
the terminal.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable

from s3ckpt.retention import CheckpointInfo

__all__ = ["DAMAGED_STATE", "printable", "state_label", "warn_damaged"]

DAMAGED_STATE = "damaged"
"""What the STATE column shows for a damaged checkpoint (its ``state`` is ``committed``, its
``life`` damaged)."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with every control character (C0, DEL, C1) written as a Python escape."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def state_label(c: CheckpointInfo) -> str:
    """The STATE column: ``damaged`` for a damaged checkpoint, else its state."""
    return DAMAGED_STATE if c.damaged else c.state.value


def warn_damaged(command: str, checkpoints: Iterable[CheckpointInfo]) -> int:
    """One warning on stderr per damaged checkpoint in ``checkpoints``; how many there were."""
    n = 0
    for c in checkpoints:
        if not c.damaged:
            continue
        n += 1
        print(
            f"s3ckpt {command}: warning: damaged checkpoint {printable(str(c.url))}: "
            f"{printable(c.damage or '')}; it is listed but never deleted by prune or gc, "
            "nor counted as the newest, and load(step='latest') skips it ("
            + (
                "restore its s3ckpt.json"
                if c.error is not None
                else "s3ckpt check --read-data all checks it again"
            )
            + ", or delete it with s3ckpt rm; docs/troubleshooting.md)",
            file=sys.stderr,
        )
    return n
