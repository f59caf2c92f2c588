"""Steps from checkpoint names: the forms training frameworks use, and a run's own pattern.

Checkpoint names come from a bucket, and anyone who can write to the bucket chooses them,
so every regular expression that runs on them runs in linear time: a user's pattern
(``step_pattern``, ``--step-pattern``) is compiled with RE2 (``google-re2``), whose engine
has no backtracking (``(?:a+)+(\\d+)`` over a thousand ``a`` answers at once, where
Python's ``re`` never returns); the built-in forms below are ours and linear on ``re``.

RE2 syntax is Python's without backreferences (``\\1``, ``(?P=name)``) and lookarounds
(``(?=...)``, ``(?!...)``, ``(?<=...)``, ``(?<!...)``), and it spells the end of text ``\\z``
(Python's ``\\Z``); :func:`compile_step_pattern` refuses what RE2 cannot run with a
:class:`~s3ckpt.errors.ConfigError` that says so. ``\\d`` matches ASCII digits only.

:mod:`s3ckpt.format` re-exports these names; this leaf module needs only ``s3ckpt.errors``.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Protocol

import re2

from s3ckpt.errors import ConfigError

MAX_STEP_DIGITS = 18
"""The most digits a step read from a name may have (a longer run of digits is no step)."""
_DIGITS = f"([0-9]{{1,{MAX_STEP_DIGITS}}})"
# A step word must not be glued to a letter or digit before it (``restep_4``, ``xstep_4``), and
# its number must end the name or be followed by ``-`` or ``_`` (``step_4a``, ``step=4.5`` are
# no steps). Ours, so Python's ``re`` is fine here: each form does bounded work per position.
_STEP_FORMS = (
    re.compile(r"(?<![A-Za-z0-9])step[_=-]" + _DIGITS + r"(?=$|[-_])"),
    re.compile(r"(?<![A-Za-z0-9])global_step" + _DIGITS + r"(?=$|[-_])"),
)
_HF_NAME = re.compile(r"checkpoint-" + _DIGITS)
_ONLY_DIGITS = re.compile(_DIGITS)
_STEP_EXTENSION = re.compile(r"\.(?:ckpt|pt|pth)\Z")

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # RE2 would print every refused pattern on stderr
_RE2_REFUSES = (
    "step patterns run on RE2 (linear time, safe on names anyone with write access to the "
    "bucket chooses), which has no backreferences (\\1, (?P=name)) and no lookarounds "
    "((?=...), (?!...), (?<=...), (?<!...)), and writes the end of text \\z, not \\Z"
)


class StepMatcher(Protocol):
    """What :func:`compile_step_pattern` returns: an RE2 regular expression."""

    @property
    def pattern(self) -> str:
        """The pattern's text."""

    @property
    def groups(self) -> int:
        """Its capture groups (always 1 for a step pattern)."""

    def fullmatch(self, text: str) -> Any:
        """A match of the whole of ``text`` (``group(1)``: the step's digits), or None."""


def compile_step_pattern(pattern: str | re.Pattern[str] | StepMatcher) -> StepMatcher:
    """``pattern`` compiled with RE2 and checked for :func:`checkpoint_step`: a regular
    expression with exactly one capture group, around the step's digits
    (``r"ckpt_e\\d+_s(\\d+)"``; other groups must not capture: ``(?:...)``).

    A compiled Python ``re.Pattern`` is recompiled with RE2 from its text (flags other than
    the default are refused: write them inline, ``(?i)``); the result of an earlier call
    passes through.

    Raises:
        ConfigError: Not a string, not a regular expression RE2 runs (backreferences and
            lookarounds are not), or not exactly one capture group; the message says which.
    """
    if isinstance(pattern, re.Pattern) and pattern.flags & ~re.UNICODE:
        raise ConfigError(
            f"step pattern '{pattern.pattern}' was compiled with flags ({pattern.flags}); "
            "give the pattern as a string and write flags inline, e.g. (?i)"
        )
    if isinstance(pattern, str):
        return _compile(pattern)
    if isinstance(getattr(pattern, "pattern", None), str) and hasattr(pattern, "fullmatch"):
        return _compile(pattern.pattern)  # a re.Pattern, one of ours (or any RE2 object)
    raise ConfigError(
        f"a step pattern must be a regular expression (string), got {type(pattern).__name__}"
    )


@functools.lru_cache(maxsize=64)
def _compile(pattern: str) -> StepMatcher:
    try:
        compiled = re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        why = exc.args[0] if exc.args else exc
        why = why.decode("utf-8", "replace") if isinstance(why, bytes) else str(why)
        raise ConfigError(
            f"step pattern '{pattern}' is not a valid regular expression for RE2 ({why}); "
            + _RE2_REFUSES
        ) from None
    except (TypeError, ValueError) as exc:  # e.g. a lone surrogate RE2 cannot encode
        raise ConfigError(
            f"step pattern {pattern!r} is not a valid regular expression for RE2 ({exc})"
        ) from None
    if compiled.groups != 1:
        raise ConfigError(
            f"step pattern '{pattern}' has {compiled.groups} capture groups; it needs "
            r"exactly one, around the step's digits (e.g. 'ckpt_e\d+_s(\d+)'; write other "
            "groups as (?:...))"
        )
    return compiled


def checkpoint_step(
    name: str, pattern: str | re.Pattern[str] | StepMatcher | None = None
) -> int | None:
    """The step a checkpoint sub-prefix's name (without the slash) gives, else None.

    With ``pattern`` (see :func:`compile_step_pattern`) the whole name must match it
    (RE2's ``fullmatch``) and its capture group must be 1 to 18 ASCII digits; nothing else
    is tried. Without one, the forms training frameworks use are read, by these rules:

    1. One trailing ``.ckpt``, ``.pt`` or ``.pth`` is ignored (``step=4.ckpt``).
    2. A *step word* is ``step`` followed by ``_``, ``=`` or ``-`` (``step_000000100`` of the
       Checkpointer, ``step_4``, ``step-4`` of torchtitan, ``step=4`` of Lightning), or
       ``global_step`` followed directly by the digits (DeepSpeed's ``global_step4``). The
       word must not be glued to a letter or digit before it (``restep_4`` is no step;
       ``epoch=0-step=4`` and ``global_step=4`` are), and its 1 to 18 digits must end the
       name or be followed by ``-`` or ``_`` (``epoch=1-step=200-v1`` is 200; ``step_4a``,
       ``step=4.5`` and ``steps_4`` are no steps). Case matters: ``Step_4`` is no step.
    3. Every step word of the name counts: when they name **different** numbers
       (``step_4-step_8``, ``epoch=0-step=4-warmup_step=10``) the name is ambiguous and
       gives None rather than a guess; the same number twice is that number.
    4. Failing those, the whole name ``checkpoint-<digits>`` (Hugging Face Trainer) gives
       its number.

    So ``last.ckpt``, ``epoch=3.ckpt``, ``best`` and accelerate's ``checkpoint_4`` (a count
    of saves, not a step) give None; a run named otherwise can pass a pattern (the policy
    file's ``step_pattern``, ``s3ckpt ls --step-pattern``). The catalog prefers the step
    recorded in a checkpoint's commit marker to either.
    """
    if pattern is not None:
        m = compile_step_pattern(pattern).fullmatch(name)
        digits = m.group(1) if m else None
        return int(digits) if isinstance(digits, str) and _ONLY_DIGITS.fullmatch(digits) else None
    name = _STEP_EXTENSION.sub("", name)
    if found := {int(m.group(1)) for form in _STEP_FORMS for m in form.finditer(name)}:
        return found.pop() if len(found) == 1 else None
    m = _HF_NAME.fullmatch(name)
    return int(m.group(1)) if m else None
