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
(:class:`~s3ckpt.retention._tiers.Tiered`), so that callers handing it to ``prune`` (the
Checkpointer, the framework plug-ins) keep both.

An unknown key, a wrong type, a bad duration or a bad pattern raises
:class:`~s3ckpt.errors.PolicyError` naming the file, the key and what is allowed.

Built-in policies: the ready-made files of the repository's ``policies/`` directory ship in the
package as ``s3ckpt.policies``; :func:`load_policy` takes their bare names (``"pretraining"``)
as well as paths (see :func:`builtin_policies`).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from s3ckpt._step_names import StepMatcher, compile_step_pattern
from s3ckpt.errors import ConfigError, PolicyError
from s3ckpt.retention._calendar import KeepCalendar
from s3ckpt.retention._duration import DURATION_HELP, parse_duration
from s3ckpt.retention._options import RetentionOptions, step_matcher
from s3ckpt.retention._policy import (
    AnyOf,
    KeepBest,
    KeepEvery,
    KeepLast,
    KeepPinned,
    KeepWithin,
    Policy,
)
from s3ckpt.retention._tiers import STORAGE_CLASSES, Tier, Tiered

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
_CAL = {
    k: "an integer >= 0, or -1 for unlimited"
    for k in ("hourly", "daily", "weekly", "monthly", "yearly")
}


def _err(source: str, key: str, message: str) -> PolicyError:
    return PolicyError(f"{source}: {key}: {message}", source=source, field=key)


def _type_name(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "float", str: "string"}.get(
        type(value), "table" if isinstance(value, dict) else type(value).__name__
    )


def _check_keys(source: str, where: str, table: Mapping[str, Any], allowed: Mapping[str, str]):  # type: ignore[no-untyped-def]
    for k in table:
        if k not in allowed:
            allowed_list = ", ".join(allowed)
            raise _err(
                source,
                f"{where}{k}",
                f"unknown key; allowed here: {allowed_list}",
            )


def _int(source: str, key: str, value: Any, *, minimum: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _err(source, key, f"must be {what}, got {value!r} ({_type_name(value)})")
    return value


def _choice(source: str, key: str, value: Any, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        allowed = " or ".join(repr(c) for c in choices)
        raise _err(source, key, f"must be {allowed}, got {value!r}")
    return value


def _best(source: str, key: str, table: Any) -> KeepBest:
    if not isinstance(table, dict):
        raise _err(source, key, f"must be {_KEEP['best']}, got {_type_name(table)}")
    _check_keys(source, key + ".", table, _BEST)
    if "metric" not in table:
        raise _err(source, key + ".metric", "is required (the metric name in s3ckpt.json)")
    metric = table["metric"]
    if not isinstance(metric, str) or not metric:
        raise _err(source, key + ".metric", f"must be {_BEST['metric']}, got {metric!r}")
    return KeepBest(
        n=_int(source, key + ".n", table.get("n", 1), minimum=1, what=_BEST["n"]),
        metric=metric,
        mode=_choice(source, key + ".mode", table.get("mode", "min"), ("min", "max")),  # type: ignore[arg-type]
        nan=_choice(source, key + ".nan", table.get("nan", "worst"), ("worst", "skip")),  # type: ignore[arg-type]
        missing=_choice(  # type: ignore[arg-type]
            source, key + ".missing", table.get("missing", "skip"), ("skip", "worst")
        ),
    )


@dataclass(frozen=True)
class PolicyFile:
    """A retention policy as a policy file gives it: the rules, and the settings of the run
    the file names.

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
    source: str = "<string>"
    tiers: tuple[Tier, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "tiers", tuple(self.tiers))
        for t in self.tiers:
            if not isinstance(t, Tier):
                raise PolicyError(f"tiers must hold s3ckpt.retention.Tier values, got {t!r}")
        if self.step_pattern is not None:
            object.__setattr__(self, "step_pattern", step_matcher(self.step_pattern))

    @classmethod
    def parse(cls, text: str, source: str = "<string>") -> PolicyFile:
        """Parse a TOML policy document.

        Raises:
            PolicyError: Invalid TOML, an unknown key, a wrong type, a bad duration, a bad
                ``step_pattern`` or no rule at all; the message names ``source``, the key and
                what is allowed.
        """
        return _parse(text, source)

    @classmethod
    def load(cls, path: str | Path) -> PolicyFile:
        """Read and parse a policy file, or the built-in policy ``path`` names (see
        :func:`load_policy`, which this is less the wrapping).

        Raises:
            PolicyError: As :func:`load_policy`.
        """
        text, source = _read(path)
        return _parse(text, source)

    @classmethod
    def of(cls, policy: Policy | PolicyFile) -> PolicyFile:
        """``policy`` as a PolicyFile: itself, a file's rules and settings given as one
        Policy (:meth:`as_policy`), or a Policy with no settings.

        Raises:
            PolicyError: ``policy`` is neither.
        """
        if isinstance(policy, PolicyFile):
            return policy
        if isinstance(policy, Tiered):  # a file's rules and settings, as one Policy
            return cls(policy.policy, policy.step_pattern, "<policy>", policy.tiers)
        if not isinstance(policy, Policy):
            raise PolicyError(f"not a retention policy: {policy!r}")
        return cls(policy, None, "<policy>")

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

    def describe(self) -> str:
        """The rules' description, and the file's step pattern (``last 3 (step_pattern
        ckpt_(\\d+))``): a plan's ``policy`` text."""
        if self.step_pattern is None:
            return self.policy.describe()
        return f"{self.policy.describe()} (step_pattern {_text(self.step_pattern)})"

    def as_policy(self) -> Policy:
        """The rules as one Policy for callers that take no settings: wrapped with the
        file's step pattern and tiers (``Tiered``), which ``prune`` takes apart again."""
        if self.step_pattern is None and not self.tiers:
            return self.policy
        pattern = None if self.step_pattern is None else _text(self.step_pattern)
        return Tiered(self.policy, self.tiers, pattern)

    def __str__(self) -> str:
        return self.describe()


def _text(pattern: str | StepMatcher) -> str:
    return pattern if isinstance(pattern, str) else pattern.pattern


def parse_policy(text: str, source: str = "<string>") -> Policy:
    """Parse a TOML policy document into a :class:`~s3ckpt.retention.Policy`: the rules
    (:meth:`PolicyFile.as_policy`; :meth:`PolicyFile.parse` keeps the file's settings apart).

    Raises:
        PolicyError: Invalid TOML, an unknown key, a wrong type, a bad duration, a bad
            ``step_pattern`` or no rule at all; the message names ``source``, the key and
            what is allowed.
    """
    return _parse(text, source).as_policy()


def _parse(text: str, source: str) -> PolicyFile:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{source}: not valid TOML: {exc}", source=source) from exc
    _check_keys(source, "", doc, _TOP)
    if "description" in doc and not isinstance(doc["description"], str):
        raise _err(source, "description", f"must be a string, got {_type_name(doc['description'])}")
    given = doc.get("step_pattern")
    pattern: StepMatcher | None = None
    if given is not None:
        if not isinstance(given, str):
            raise _err(
                source, "step_pattern", f"must be {_TOP['step_pattern']}, got {_type_name(given)}"
            )
        try:
            pattern = compile_step_pattern(given)
        except ConfigError as exc:
            raise _err(source, "step_pattern", exc.message) from None
    keep = doc.get("keep")
    if keep is None:
        raise _err(source, "keep", "missing: a policy needs a [keep] table with at least one rule")
    if not isinstance(keep, dict):
        raise _err(source, "keep", f"must be {_TOP['keep']}, got {_type_name(keep)}")
    policy = _rules(source, "keep", keep)
    tables = doc.get("tier", [])
    if not isinstance(tables, list):
        raise _err(source, "tier", "must be an array of tables: write [[tier]], not [tier]")
    tiers = tuple(_tier(source, i, t) for i, t in enumerate(tables))
    return PolicyFile(policy, pattern, source, tiers)


def _rules(source: str, where: str, table: dict[str, Any]) -> Policy:
    """The rules of a ``[keep]`` table (or a tier's ``rule``), OR'ed; ``where`` names it."""
    _check_keys(source, where + ".", table, _KEEP)
    rules: list[Policy] = []
    if "last" in table:
        rules.append(
            KeepLast(_int(source, f"{where}.last", table["last"], minimum=1, what=_KEEP["last"]))
        )
    if "every" in table:
        rules.append(
            KeepEvery(
                _int(source, f"{where}.every", table["every"], minimum=1, what=_KEEP["every"])
            )
        )
    if "within" in table:
        try:
            duration = parse_duration(table["within"])
        except ValueError as exc:
            raise _err(source, f"{where}.within", str(exc)) from None
        if duration.total_seconds() <= 0:
            raise _err(source, f"{where}.within", "must be a positive duration")
        rules.append(KeepWithin(duration))
    if "best" in table:
        best = table["best"]
        if isinstance(best, list):
            if not best:
                raise _err(source, f"{where}.best", "is an empty array; give at least one table")
            rules.extend(_best(source, f"{where}.best[{i}]", b) for i, b in enumerate(best))
        else:
            rules.append(_best(source, f"{where}.best", best))
    if "calendar" in table:
        cal = table["calendar"]
        if not isinstance(cal, dict):
            raise _err(
                source, f"{where}.calendar", f"must be {_KEEP['calendar']}, got {_type_name(cal)}"
            )
        _check_keys(source, f"{where}.calendar.", cal, _CAL)
        counts = {
            k: _int(source, f"{where}.calendar.{k}", v, minimum=-1, what=_CAL[k])
            for k, v in cal.items()
        }
        if not any(counts.values()):
            raise _err(source, f"{where}.calendar", "needs at least one non-zero count")
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
    if not isinstance(table, dict):
        raise _err(source, where, f"must be a table, got {_type_name(table)}")
    _check_keys(source, where + ".", table, _TIER)
    for k in ("rule", "storage_class"):
        if k not in table:
            raise _err(source, f"{where}.{k}", f"is required: {_TIER[k]}")
    if not isinstance(table["rule"], dict):
        raise _err(
            source, f"{where}.rule", f"must be {_TIER['rule']}, got {_type_name(table['rule'])}"
        )
    rule = _rules(source, f"{where}.rule", table["rule"])
    cls = table["storage_class"]
    if not isinstance(cls, str) or cls not in STORAGE_CLASSES:
        raise _err(
            source, f"{where}.storage_class", f"must be {_TIER['storage_class']}, got {cls!r}"
        )
    after = None
    if "after" in table:
        try:
            after = parse_duration(table["after"])
        except ValueError as exc:
            raise _err(source, f"{where}.after", str(exc)) from None
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


def _is_bare_name(name: str) -> bool:
    return "/" not in name and "\\" not in name and not name.endswith(".toml")


def _missing_file(p: Path) -> PolicyError:
    """A policy path that does not exist; named after a built-in policy, say so."""
    name = p.name.removesuffix(".toml")
    builtins = _builtin_files()
    if name in builtins:
        hint = (
            f'the built-in policy "{name}" ships with s3ckpt: use policy="{name}" '
            f"(Python) or --policy {name} (CLI)"
        )
    else:
        hint = f"built-in policies: {', '.join(sorted(builtins)) or 'none installed'}"
    return PolicyError(f"{p}: cannot read the policy file: no such file; {hint}", source=str(p))


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


def _read(path: str | Path) -> tuple[str, str]:
    """The text of the policy file (or built-in policy) ``path`` names, and its source."""
    if isinstance(path, str) and _is_bare_name(path) and not Path(path).is_file():
        builtins = _builtin_files()
        if path in builtins:
            res = builtins[path]
            return res.read_text(encoding="utf-8"), str(res)
        names = ", ".join(sorted(builtins)) or "none installed"
        raise PolicyError(
            f"{path}: no such policy file and no built-in policy of that name "
            f"(built-in: {names}; a file path needs a / or the .toml suffix)",
            source=path,
        )
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise _missing_file(p) from exc
    except OSError as exc:
        raise PolicyError(
            f"{p}: cannot read the policy file: {exc.strerror or exc}", source=str(p)
        ) from exc
    except UnicodeDecodeError as exc:
        raise PolicyError(f"{p}: not UTF-8 text: {exc}", source=str(p)) from exc
    return text, str(p)
