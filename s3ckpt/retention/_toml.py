"""Policy files (TOML), parsed strictly into a :class:`PolicyFile`: the rules, and the
settings of the run the file names.

Format (every key optional, at least one rule required; rules are OR'ed — a checkpoint
is kept if any rule keeps it, like restic's ``forget``)::

    description = "free text"          # shown nowhere, for people reading the file
    step_pattern = 'ckpt_e\\d+_s(\\d+)'   # optional: how this run's names give their steps

    [keep]
    last = 3                            # KeepLast(3)
    every = 10000                       # KeepEvery(10000): closest to each multiple
    within = "7d"                       # KeepWithin(7 days of the newest)
    pinned = true                       # KeepPinned() (pins are always kept anyway)

    [keep.best]                         # KeepBest; or [[keep.best]] for several metrics
    metric = "val_loss"
    n = 2
    mode = "min"                        # "min" | "max"
    nan = "worst"                       # "worst" | "skip"
    missing = "skip"                    # "skip" | "worst"

    [keep.calendar]                     # KeepCalendar (restic semantics, UTC)
    hourly = 24
    daily = 7
    weekly = 4
    monthly = 12
    yearly = -1                         # -1: unlimited

    [[tier]]                            # a storage class (Tier) for what [keep] keeps:
    rule = { every = 1000 }             # rules as in [keep]; also after = "7d" (since the
    storage_class = "GLACIER_IR"        # commit) and method = "copy" | "tag"

``step_pattern`` (a regular expression with one capture group, matched against the whole
name) and the tiers are settings of the run: :meth:`PolicyFile.options` hands them to the
run's :class:`~s3ckpt.retention.RetentionOptions` (what the run names itself wins).
:func:`load_policy` and :func:`parse_policy` return the rules as one
:class:`~s3ckpt.retention.Policy`, wrapped with the file's pattern and tiers
(the :class:`PolicyFile` itself, a Policy), so that callers handing it to ``prune`` (the
Checkpointer, the framework plug-ins) keep both.

An unknown key, a wrong type, a bad duration or a bad pattern raises
:class:`~s3ckpt.errors.PolicyError` naming the file, the key and what is allowed.

Built-in policies: the ready-made files of the repository's ``policies/`` directory ship in the
package as ``s3ckpt.policies``; :func:`load_policy` takes their bare names (``"pretraining"``)
as well as paths (see :func:`builtin_policies`).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from s3ckpt._step_names import StepMatcher, compile_step_pattern
from s3ckpt.errors import ConfigError, PolicyError
from s3ckpt.retention._calendar import KeepCalendar
from s3ckpt.retention._catalog import CheckpointInfo
from s3ckpt.retention._duration import DURATION_HELP, parse_duration
from s3ckpt.retention._options import RetentionOptions, settle
from s3ckpt.retention._policy import (
    BEST_CHOICES,
    AnyOf,
    KeepBest,
    KeepEvery,
    KeepLast,
    KeepPinned,
    KeepWithin,
    Policy,
    Selection,
    check_policy,
)
from s3ckpt.retention._tiers import STORAGE_CLASSES, Tier

__all__ = ["PolicyFile", "builtin_policies", "load_policy", "parse_policy"]

# The package the ready-made policy files are installed as (pyproject.toml maps the
# repository's policies/ directory to it).
_BUILTIN_PACKAGE = "s3ckpt.policies"

_TOP = {
    "description": "a string",
    "keep": "a table of rules",
    "step_pattern": "a regular expression with one capture group (the step's digits)",
    "tier": "an array of tables ([[tier]]) with rule, storage_class, after, method",
}
_TIER = {
    "rule": "an inline table of rules, as in [keep] (e.g. { every = 1000 })",
    "storage_class": "one of " + ", ".join(STORAGE_CLASSES),
    "after": f"a duration since the commit ({DURATION_HELP})",
    "method": "'copy' (CopyObject onto itself) or 'tag' (a lifecycle rule moves)",
}
_KEEP = {
    "last": "a positive integer",
    "every": "a positive integer (steps)",
    "within": f"a duration string ({DURATION_HELP})",
    "pinned": "true or false",
    "best": "a table (or array of tables) with metric, n, mode, nan, missing",
    "calendar": "a table with hourly, daily, weekly, monthly, yearly",
}
_RULES = "last, every, within, best, calendar"
_BEST = {
    "metric": "a metric name (string)",
    "n": "a positive integer",
    "mode": "'min' or 'max'",
    "nan": "'worst' or 'skip'",
    "missing": "'skip' or 'worst'",
}
_CAL = {f.name: "an integer >= 0, or -1 for unlimited" for f in fields(KeepCalendar)}


def _err(source: str, key: str, message: str) -> PolicyError:
    return PolicyError(f"{source}: {key}: {message}", source=source, field=key)


def _type_name(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "float", str: "string"}.get(
        type(value), "table" if isinstance(value, dict) else type(value).__name__
    )


def _table(
    source: str, key: str, value: Any, allowed: Mapping[str, str], what: str
) -> dict[str, Any]:
    """``value`` checked to be a table (``what``) holding only ``allowed`` keys."""
    if not isinstance(value, dict):
        raise _err(source, key, f"must be {what}, got {_type_name(value)}")
    for k in value:
        if k not in allowed:
            where = f"{key}.{k}" if key else k
            raise _err(source, where, f"unknown key; allowed here: {', '.join(allowed)}")
    return value


def _int(source: str, key: str, value: Any, *, minimum: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _err(source, key, f"must be {what}, got {value!r} ({_type_name(value)})")
    return value


def _choice(source: str, key: str, value: Any, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise _err(source, key, f"must be {' or '.join(repr(c) for c in choices)}, got {value!r}")
    return value


def _duration(source: str, key: str, value: Any) -> timedelta:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise _err(source, key, str(exc)) from None


_CHOICES = BEST_CHOICES.items()


def _best(source: str, key: str, table: Any) -> KeepBest:
    _table(source, key, table, _BEST, _KEEP["best"])
    metric = table.get("metric")
    if metric is None:
        raise _err(source, key + ".metric", "is required (the metric name in s3ckpt.json)")
    if not isinstance(metric, str) or not metric:
        raise _err(source, key + ".metric", f"must be {_BEST['metric']}, got {metric!r}")
    return KeepBest(
        n=_int(source, key + ".n", table.get("n", 1), minimum=1, what=_BEST["n"]),
        metric=metric,
        **{k: _choice(source, f"{key}.{k}", table.get(k, c[0]), c) for k, c in _CHOICES},  # type: ignore[arg-type]
    )


@dataclass(frozen=True)
class PolicyFile(Policy):
    """A retention policy as a policy file gives it: the rules, and the settings of the run
    the file names. It selects as its rules do (a Policy itself, for callers that take no
    settings: ``prune`` takes it apart again).

    ``prune``, ``prune_runs`` and ``plan`` take one wherever they take a Policy::

        source = PolicyFile.load("policies/pretraining.toml")
        prune(location, source, apply=True)    # steps read with the file's step_pattern

    Attributes:
        policy: The rules (what a plan keeps, and why).
        step_pattern: The file's ``step_pattern``, compiled, or None.
        source: Where the file was read from (``<string>`` for text).
        tiers: The file's ``[[tier]]`` tables (:class:`~s3ckpt.retention.Tier`), in order;
            :meth:`options` hands them to the run unless it names its own.

    Raises:
        ConfigError: ``step_pattern`` is not a regular expression with one capture group.
    """

    policy: Policy
    step_pattern: str | StepMatcher | None = None
    source: str = field(default="<string>", compare=False)
    tiers: tuple[Tier, ...] = ()

    def __post_init__(self) -> None:
        settle(self)

    @classmethod
    def parse(cls, text: str, source: str = "<string>") -> PolicyFile:
        """Parse a TOML policy document.

        Raises:
            PolicyError: Invalid TOML, an unknown key, a wrong type, a bad duration, a bad
                ``step_pattern`` or no rule at all; the message names ``source``, the key and
                what is allowed.
        """
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise PolicyError(f"{source}: not valid TOML: {exc}", source=source) from exc
        _table(source, "", doc, _TOP, "a table")
        for key in ("description", "step_pattern"):
            if key in doc and not isinstance(doc[key], str):
                raise _err(source, key, f"must be {_TOP[key]}, got {_type_name(doc[key])}")
        try:
            pattern = compile_step_pattern(doc["step_pattern"]) if "step_pattern" in doc else None
        except ConfigError as exc:
            raise _err(source, "step_pattern", exc.message) from None
        if "keep" not in doc:
            raise _err(
                source, "keep", "missing: a policy needs a [keep] table with at least one rule"
            )
        policy = _rules(source, "keep", doc["keep"], _TOP["keep"])
        tables = doc.get("tier", [])
        if not isinstance(tables, list):
            raise _err(source, "tier", "must be an array of tables: write [[tier]], not [tier]")
        tiers = tuple(_tier(source, i, t) for i, t in enumerate(tables))
        return cls(policy, pattern, source, tiers)

    @classmethod
    def load(cls, path: str | Path) -> PolicyFile:
        """Read and parse a policy file, or the built-in policy ``path`` names (see
        :func:`load_policy`, which this is less the wrapping).

        Raises:
            PolicyError: As :func:`load_policy`.
        """
        builtins = _builtin_files()
        names = ", ".join(sorted(builtins)) or "none installed"
        bare = isinstance(path, str) and not {"/", "\\"} & set(path) and not path.endswith(".toml")
        if isinstance(path, str) and bare and not Path(path).is_file():
            if path in builtins:
                return cls.parse(builtins[path].read_text(encoding="utf-8"), str(builtins[path]))
            raise PolicyError(
                f"{path}: no such policy file and no built-in policy of that name "
                f"(built-in: {names}; a file path needs a / or the .toml suffix)",
                source=str(path),
            )
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            name = p.name.removesuffix(".toml")
            hint = (
                f'the built-in policy "{name}" ships with s3ckpt: use policy="{name}" '
                f"(Python) or --policy {name} (CLI)"
                if name in builtins
                else f"built-in policies: {names}"
            )
            why = f"no such file; {hint}" if isinstance(exc, FileNotFoundError) else exc.strerror
            why = f"cannot read the policy file: {why or exc}"
            raise PolicyError(f"{p}: {why}", source=str(p)) from exc
        except UnicodeDecodeError as exc:
            raise PolicyError(f"{p}: not UTF-8 text: {exc}", source=str(p)) from exc
        return cls.parse(text, str(p))

    @classmethod
    def of(cls, policy: Policy | PolicyFile) -> PolicyFile:
        """``policy`` as a PolicyFile: itself, a file's rules and settings given as one
        Policy (:meth:`as_policy`), or a Policy with no settings; its rules checked
        (:func:`~s3ckpt.retention._policy.check_policy`).

        Raises:
            PolicyError: ``policy`` is neither, or has no keep rule.
        """
        source = policy if isinstance(policy, PolicyFile) else cls(policy, None, "<policy>")
        check_policy(source.policy)
        return source

    def options(self, options: RetentionOptions | None = None) -> RetentionOptions:
        """``options`` (default: the defaults) with this file's step pattern, unless they
        name one already: a pattern given for the run (``--step-pattern``,
        ``step_pattern=``) wins over the file's; so do the run's tiers
        (``RetentionOptions.tiers``) over the file's ``[[tier]]`` tables."""
        base = options if options is not None else RetentionOptions()
        if self.tiers and not base.tiers:
            base = base.replace(tiers=self.tiers)
        if self.step_pattern is None or base.step_pattern is not None:
            return base
        return base.replace(step_pattern=self.step_pattern)

    def select(self, checkpoints: Sequence[CheckpointInfo], now: datetime) -> Selection:
        return self.policy.select(checkpoints, now)

    def rules(self) -> tuple[Policy, ...]:
        return self.policy.rules()

    def describe(self) -> str:
        """The rules' description, and the file's step pattern (``last 3 (step_pattern
        ckpt_(\\d+))``): a plan's ``policy`` text."""
        if self.step_pattern is None:
            return self.policy.describe()
        pattern = self.step_pattern
        text = pattern if isinstance(pattern, str) else pattern.pattern
        return f"{self.policy.describe()} (step_pattern {text})"

    def as_policy(self) -> Policy:
        """The rules as one Policy for callers that take no settings: the rules alone, or
        this file when it has settings (step pattern, tiers), which ``prune`` takes apart."""
        return self.policy if self.step_pattern is None and not self.tiers else self


def parse_policy(text: str, source: str = "<string>") -> Policy:
    """Parse a TOML policy document into a :class:`~s3ckpt.retention.Policy`: the rules
    (:meth:`PolicyFile.as_policy`; :meth:`PolicyFile.parse` keeps the file's settings apart).

    Raises:
        PolicyError: Invalid TOML, an unknown key, a wrong type, a bad duration, a bad
            ``step_pattern`` or no rule at all; the message names ``source``, the key and
            what is allowed.
    """
    return PolicyFile.parse(text, source).as_policy()


def _rules(source: str, where: str, table: Any, what: str) -> Policy:
    """The rules of a ``[keep]`` table (or a tier's ``rule``), OR'ed; ``where`` names it."""
    _table(source, where, table, _KEEP, what)
    rules: list[Policy] = []
    for k, rule in (("last", KeepLast), ("every", KeepEvery)):
        if k in table:
            rules.append(rule(_int(source, f"{where}.{k}", table[k], minimum=1, what=_KEEP[k])))
    if "within" in table:
        duration = _duration(source, f"{where}.within", table["within"])
        if duration.total_seconds() <= 0:
            raise _err(source, f"{where}.within", "must be a positive duration")
        rules.append(KeepWithin(duration))
    best = table.get("best")
    if isinstance(best, list):
        if not best:
            raise _err(source, f"{where}.best", "is an empty array; give at least one table")
        rules.extend(_best(source, f"{where}.best[{i}]", b) for i, b in enumerate(best))
    elif best is not None:
        rules.append(_best(source, f"{where}.best", best))
    if "calendar" in table:
        at = f"{where}.calendar"
        cal = _table(source, at, table["calendar"], _CAL, _KEEP["calendar"])
        counts = {k: _int(source, f"{at}.{k}", v, minimum=-1, what=_CAL[k]) for k, v in cal.items()}
        if not any(counts.values()):
            raise _err(source, at, "needs at least one non-zero count")
        rules.append(KeepCalendar(**counts))
    if "pinned" in table:
        if not isinstance(table["pinned"], bool):
            raise _err(source, f"{where}.pinned", f"must be true or false, got {table['pinned']!r}")
        if table["pinned"]:
            rules.append(KeepPinned())
    if not [r for r in rules if not isinstance(r, KeepPinned)]:
        why = "an empty policy would delete everything but the invariants"
        why = why if where == "keep" else "a tier selects with at least one"
        raise _err(source, where, f"has no rule: {why}; name one of {_RULES}")
    return rules[0] if len(rules) == 1 else AnyOf(tuple(rules))


def _tier(source: str, i: int, table: Any) -> Tier:
    """One ``[[tier]]`` table as a :class:`~s3ckpt.retention.Tier`."""
    where = f"tier[{i}]"
    _table(source, where, table, _TIER, "a table")
    for k in ("rule", "storage_class"):
        if k not in table:
            raise _err(source, f"{where}.{k}", f"is required: {_TIER[k]}")
    rule = _rules(source, f"{where}.rule", table["rule"], _TIER["rule"])
    cls = table["storage_class"]
    if not isinstance(cls, str) or cls not in STORAGE_CLASSES:
        raise _err(
            source, f"{where}.storage_class", f"must be {_TIER['storage_class']}, got {cls!r}"
        )
    after = _duration(source, f"{where}.after", table["after"]) if "after" in table else None
    method = _choice(source, f"{where}.method", table.get("method", "copy"), ("copy", "tag"))
    return Tier(rule, cls, after, method)  # type: ignore[arg-type]


def _builtin_files() -> dict[str, Traversable]:
    """The shipped policy files by name (file name without ``.toml``)."""
    try:
        root = resources.files(_BUILTIN_PACKAGE)
    except ModuleNotFoundError:  # a source tree used without installing (PYTHONPATH=.)
        return {}
    return {
        f.name.removesuffix(".toml"): f
        for f in root.iterdir()
        if f.name.endswith(".toml") and f.is_file()
    }


def builtin_policies() -> list[str]:
    """The names of the built-in policies, sorted (``["archive", ..., "pretraining"]``).

    Each is a ready-made file of the repository's ``policies/`` directory, shipped with the
    package; :func:`load_policy` and ``s3ckpt prune --policy NAME`` accept these names.
    """
    return sorted(_builtin_files())


def load_policy(path: str | Path) -> Policy:
    """Read and parse a TOML policy file (see :func:`parse_policy`); its settings
    (``step_pattern``) apart from the rules: :meth:`PolicyFile.load`.

    ``path`` is a policy file, or, as a string, the name of a built-in policy (see
    :func:`builtin_policies`): a name has no path separator and no ``.toml`` suffix. A file
    that exists wins over a built-in of the same name.

    A path that does not exist is an error, also when it names a built-in policy's file
    (``policies/pretraining.toml``, as in the repository, absent from a pip install): the
    message then says to use the built-in name. A missing file is never silently replaced
    by the built-in, which may differ from the file the caller meant.

    Raises:
        PolicyError: The file cannot be read or is not a valid policy, or the name is
            neither a file nor a built-in policy (the message lists the built-in names).
    """
    return PolicyFile.load(path).as_policy()
