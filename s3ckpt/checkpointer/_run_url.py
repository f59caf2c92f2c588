"""Is a Checkpointer's URL a run? Two mistakes that would otherwise restart training silently.

``start = ckpt.load(...) or 0`` trains from step 0 whenever ``load`` finds nothing, so a
wrong URL must not look like an empty run:

* **A checkpoint's URL** (``s3://b/runs/llama/step_000010000``, copied from ``s3ckpt ls``)
  holds a commit marker (or a stock DCP ``.metadata``) rather than checkpoints.
  :func:`refuse_checkpoint_url` raises :class:`~s3ckpt.errors.ConfigError` naming the run
  URL to use, for a load and for a save alike. Loading it for ``step="latest"`` would
  look helpful, but the same Checkpointer's next save would then nest a checkpoint inside
  a checkpoint (``.../step_000010000/step_000010100/``), hours later; failing at once,
  with the fix in the message, is the safer surprise.
* **A misspelt run** (``s3://b/runs/lama``) holds nothing. ``load`` still returns
  ``None`` (a new run looks the same), but :func:`warn_if_misspelt` logs a WARNING naming
  the URL and the runs nearest to it by edit distance, found by a bounded search.

Request cost: :func:`checkpoint_at` is one or two HEADs; :func:`nearby_runs` at most
``2 + _MAX_UNCLES`` LISTs of sub-prefixes (each stopped after :data:`_MAX_LISTED`
prefixes, one request) plus :data:`_MAX_PROBES` LISTs to confirm candidates. Both run only
when a load finds nothing (and the run check once before a Checkpointer's first save).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from itertools import islice

from s3ckpt._step_names import checkpoint_step
from s3ckpt.errors import ConfigError
from s3ckpt.format import MANIFEST_NAME, METADATA_NAME, SHARDS_DIR, checkpoint_name
from s3ckpt.metrics.instrument import expecting
from s3ckpt.store import ObjectStore
from s3ckpt.uri import StoreURL

__all__ = ["checkpoint_at", "nearby_runs", "refuse_checkpoint_url", "warn_if_misspelt"]

log = logging.getLogger("s3ckpt")

#: The most sub-prefixes read from one listing (a bucket may hold thousands of runs).
_MAX_LISTED = 300
#: How many of the grandparent's other children (nearest by name first) are searched.
_MAX_UNCLES = 2
#: How many candidates are listed to confirm they hold checkpoints.
_MAX_PROBES = 6
#: How many runs a warning names.
_MAX_NAMED = 3


def checkpoint_at(store: ObjectStore, url: StoreURL) -> str | None:
    """``"s3ckpt"`` if ``url`` itself holds a commit marker, ``"dcp"`` if it holds a
    stock DCP ``.metadata``, else ``None`` (one or two HEADs)."""
    with expecting("not_found"):  # a run holds neither: the normal answer is 404
        if store.head(url.key(MANIFEST_NAME)) is not None:
            return "s3ckpt"
        if store.head(url.key(METADATA_NAME)) is not None:
            return "dcp"
    return None


def refuse_checkpoint_url(store: ObjectStore, url: StoreURL, *, saving: bool) -> None:
    """Raise :class:`~s3ckpt.errors.ConfigError` if ``url`` is a checkpoint, not a run.

    The message names the run to give the Checkpointer instead (the checkpoint's parent)
    and the step to load, or, for a checkpoint the Checkpointer would not name so (another
    framework's, stock DCP), how to load it directly.
    """
    kind = checkpoint_at(store, url)
    if kind is None:
        return
    run, name = url.parent, url.name
    step = checkpoint_step(name)
    own = kind == "s3ckpt" and step is not None and checkpoint_name(step) == name
    what = "a committed checkpoint" if kind == "s3ckpt" else "a DCP checkpoint (.metadata)"
    if saving:
        todo = (
            f"saving here would nest checkpoints inside it. Give the Checkpointer the run: "
            f"Checkpointer({str(run)!r})"
        )
    elif own:
        todo = (
            f"give the Checkpointer the run and the step: Checkpointer({str(run)!r})"
            f".load(..., step={step})"
        )
    else:
        todo = (
            "a Checkpointer loads the step_* checkpoints of a run; load this one with "
            f"dcp.load(state_dict, storage_reader=S3StorageReader({str(url)!r}))"
        )
    raise ConfigError(
        f"{url} is {what}, not a run of checkpoints: {todo}",
        bucket=store.bucket,
        key=url.key(MANIFEST_NAME if kind == "s3ckpt" else METADATA_NAME),
    )


def _children(store: ObjectStore, url: StoreURL) -> Iterator[StoreURL]:
    """The sub-prefixes of ``url`` (at most :data:`_MAX_LISTED`; one LIST request)."""
    for prefix in islice(store.list_prefixes(url.prefix), _MAX_LISTED):
        child = StoreURL(url.scheme, url.bucket, prefix)
        if child.name != SHARDS_DIR:
            yield child


def _is_run(store: ObjectStore, url: StoreURL) -> bool:
    """Whether ``url`` has a sub-prefix named like a checkpoint (one LIST request)."""
    return any(checkpoint_step(c.name) is not None for c in _children(store, url))


def _shared(a: str, b: str) -> int:
    """How many characters ``a`` and ``b`` share at the start."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _distance(a: str, b: str) -> int:
    """Levenshtein distance of ``a`` and ``b``, case-insensitive. What they share at the
    start and end changes nothing and is cut first, so whole prefixes compare fast."""
    a, b = a.lower(), b.lower()
    head = _shared(a, b)
    a, b = a[head:], b[head:]
    tail = _shared(a[::-1], b[::-1])
    a, b = a[: len(a) - tail], b[: len(b) - tail]
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


def nearby_runs(store: ObjectStore, url: StoreURL) -> list[StoreURL] | None:
    """Runs (prefixes holding checkpoints) near ``url``, nearest first, or ``None`` when
    ``url`` is a run itself (it holds checkpoint prefixes, committed or not).

    Searched, each listing bounded: the sub-prefixes of ``url`` (it may be the folder of
    runs), its siblings (a typo in the run's name), and the children of the two
    grandparent's children named nearest to its parent (a typo one level up). Candidates
    are ranked by the edit distance of their whole prefix to ``url``'s; the nearest are
    confirmed by one listing each.
    """
    children = list(_children(store, url))
    if any(checkpoint_step(c.name) is not None for c in children):
        return None
    candidates = dict.fromkeys(children)
    parent = url.parent
    if parent != url:
        candidates.update(dict.fromkeys(c for c in _children(store, parent) if c != url))
        grand = parent.parent
        if grand != parent:
            uncles = sorted(
                (c for c in _children(store, grand) if c != parent),
                key=lambda c: _distance(c.name, parent.name),
            )[:_MAX_UNCLES]
            for uncle in uncles:
                candidates.update(dict.fromkeys(_children(store, uncle)))
    ranked = sorted(candidates, key=lambda c: (_distance(c.prefix, url.prefix), c.prefix))
    runs: list[StoreURL] = []
    for candidate in ranked[:_MAX_PROBES]:
        if _is_run(store, candidate):
            runs.append(candidate)
            if len(runs) == _MAX_NAMED:
                break
    return runs


def warn_if_misspelt(store: ObjectStore, url: StoreURL) -> None:
    """Log a WARNING when ``url`` holds nothing but runs with checkpoints are near it.

    Never raises: a role may list its own run but not the bucket around it (the search is
    then logged at DEBUG and skipped).
    """
    try:
        runs = nearby_runs(store, url)
    except Exception as exc:
        log.debug("s3ckpt: could not look for runs near %s: %s", url, exc)
        return
    if not runs:
        return
    log.warning(
        "s3ckpt: nothing to resume at %s: it holds no checkpoint, so load() returns None "
        "and training starts from step 0. Runs with checkpoints near it: %s. If you meant "
        "one of them, fix the Checkpointer's URL; if this is a new run, ignore this",
        url,
        ", ".join(str(r) for r in runs),
    )
