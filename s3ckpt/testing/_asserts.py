"""Assertions on what a run prefix holds: a committed, verified checkpoint of step N; the
committed steps; no open multipart uploads; nothing left outside committed checkpoints.

Each opens the store with :func:`s3ckpt.store.open_store` (so ``AWS_ENDPOINT_URL`` and the
rest of the environment apply, as for a Checkpointer) unless a store is passed, and fails
with an :class:`AssertionError` that says what is there instead.
"""

from __future__ import annotations

from s3ckpt.format._names import MANIFEST_NAME, METADATA_NAME, PIN_NAME, owned_tag, shard_owner
from s3ckpt.retention import CheckpointInfo, list_checkpoints
from s3ckpt.retention._scan import scan
from s3ckpt.store import Location, ObjectStore
from s3ckpt.uri import StoreURL

_SHOWN = 10  # problems, keys or uploads listed in one message


def _describe(c: CheckpointInfo) -> str:
    step = "no step" if c.step is None else f"step {c.step}"
    what = [f"{c.name} ({step}): {c.state.value}"]
    if c.is_committed and c.error:
        what.append(f"commit marker unreadable: {c.error}")
    elif not c.is_committed:
        what.append(f"no commit marker ({MANIFEST_NAME})")
    what.append(f"{c.num_objects} object(s)")
    if c.uploads:
        what.append(f"{len(c.uploads)} open multipart upload(s)")
    return ", ".join(what)


def _listing(checkpoints: list[CheckpointInfo]) -> str:
    if not checkpoints:
        return "nothing that s3ckpt or DCP writes is there"
    return "what is there:" + "".join(f"\n  {_describe(c)}" for c in checkpoints)


def _shown(lines: list[str]) -> str:
    more = len(lines) - _SHOWN
    out = "".join(f"\n  {line}" for line in lines[:_SHOWN])
    return out + (f"\n  ... and {more} more" if more > 0 else "")


def assert_committed(
    url: str | StoreURL,
    step: int | None = None,
    *,
    verify: bool = True,
    store: ObjectStore | None = None,
) -> CheckpointInfo:
    """Assert that ``url`` holds a committed checkpoint (of ``step``, when given) whose
    every byte reads back with its recorded CRC32C.

    Args:
        url: A checkpoint prefix (``s3://bucket/run/step_000000004``) or a run prefix
            (``s3://bucket/run``: then its checkpoint of ``step``, or with ``step=None``
            its newest committed one).
        step: The step the checkpoint must have (the one its commit marker records).
        verify: Re-read every object and check every CRC32C, sizes and structure, as
            ``s3ckpt verify`` does (needs torch; reads the whole checkpoint).
        store: The store to read (default: :func:`s3ckpt.store.open_store` on ``url``).

    Returns:
        The checkpoint, as :func:`s3ckpt.retention.list_checkpoints` describes it.

    Raises:
        AssertionError: No such committed checkpoint (the message lists every checkpoint
            there with its state and step), or verification found problems (the message
            names them, the damaged tensors and objects).
    """
    loc = Location.of(url, store=store)  # open_store's, unless a store is passed
    where, catalogs = loc.url, scan(loc)
    itself = [c for cat in catalogs for c in cat.checkpoints if c.url.prefix == where.prefix]
    if itself:  # ``url`` is a checkpoint prefix
        chosen = itself[0]
        if not chosen.is_committed:
            raise AssertionError(f"{where} is not a committed checkpoint: {_describe(chosen)}")
        if step is not None and chosen.step != step:
            raise AssertionError(
                f"{where} is committed at step {chosen.step}, not at step {step}: "
                + _describe(chosen)
            )
    else:
        ckpts = [c for cat in catalogs if cat.run.prefix == where.prefix for c in cat.checkpoints]
        committed = [c for c in ckpts if c.is_committed]
        of_step = [c for c in committed if step in (None, c.step)]
        if not of_step:
            what = "" if step is None else f" of step {step}"
            steps = "" if step is None else f" (committed steps: {[c.step for c in committed]})"
            raise AssertionError(
                f"no committed checkpoint{what} under {where}{steps}: {_listing(ckpts)}"
            )
        chosen = of_step[-1]
    if chosen.error:
        raise AssertionError(
            f"{chosen.url} has a commit marker that cannot be read: {chosen.error}"
        )
    if verify:
        _verify(chosen, loc.store)
    return chosen


def _verify(c: CheckpointInfo, store: ObjectStore) -> None:
    from s3ckpt.errors import S3CkptError
    from s3ckpt.tools import verify_checkpoint

    try:
        res = verify_checkpoint(str(c.url), store=store)
    except S3CkptError as exc:
        raise AssertionError(f"{c.url} (step {c.step}) does not verify: {exc}") from exc
    if res.ok:
        return
    lines = [f"{p.kind}: {p.message}" for p in res.problems]
    raise AssertionError(
        f"{c.url} (step {c.step}) is committed but does not verify: {len(res.problems)} "
        f"problem(s){_shown(lines)}\n  bad tensors: {', '.join(res.bad_items) or '-'}"
        f"\n  bad objects: {', '.join(res.bad_objects) or '-'}"
    )


def committed_steps(run_url: str | StoreURL, *, store: ObjectStore | None = None) -> list[int]:
    """The steps of the committed checkpoints directly under ``run_url``, ascending
    (checkpoints without a step are left out).

    Args:
        run_url: The run prefix (what a :class:`~s3ckpt.Checkpointer` was given).
        store: The store to read (default: :func:`s3ckpt.store.open_store` on ``run_url``).
    """
    return sorted(
        c.step
        for c in list_checkpoints(Location.of(run_url, store=store))
        if c.is_committed and c.step is not None
    )


def assert_no_partial_uploads(run_url: str | StoreURL, *, store: ObjectStore | None = None) -> None:
    """Assert that no multipart upload is open under ``run_url``: no save left a
    half-uploaded object behind (one that S3 would keep, and bill, until aborted).

    Call it once saves have finished (``Checkpointer.wait()`` or ``close()``): a save in
    flight has uploads open.

    Raises:
        AssertionError: Naming every open upload's key.
    """
    run = Location.of(run_url, store=store)
    if uploads := list(run.store.list_multipart_uploads(run.url.prefix)):
        raise AssertionError(
            f"{len(uploads)} multipart upload(s) open under {run}:"
            + _shown(sorted(f"{u.key} (upload id {u.upload_id})" for u in uploads))
        )


def _uncommitted_keys(c: CheckpointInfo) -> list[str]:
    """Objects s3ckpt (or DCP) wrote in a committed checkpoint that its marker does not
    commit: another save's data, heartbeats, an interrupted overwrite's objects."""

    def stray(key: str) -> bool:
        if shard_owner(key) is not None:
            return True  # a data object in the run's shard folder
        rest = key[len(c.url.prefix) :]
        # Not a nested (foreign) key, the plain .metadata copy or a pin.
        plain = "/" not in rest and rest not in (METADATA_NAME, PIN_NAME, MANIFEST_NAME)
        return plain and (owned_tag(rest) is not None or rest.endswith(".distcp"))

    return [key for key in c.keys if key not in c.committed_keys and stray(key)]


def assert_clean(
    run_url: str | StoreURL, *, store: ObjectStore | None = None
) -> list[CheckpointInfo]:
    """Assert that everything s3ckpt wrote under ``run_url`` belongs to a committed
    checkpoint: no open multipart upload, no checkpoint prefix in progress or abandoned,
    and in each committed one no object that its commit marker does not commit (another
    save's data, heartbeats), and its plain ``.metadata`` copy current.

    What a finished run looks like after saves that met lost replies, resets and 503s; a
    run whose process was killed mid-save is not clean until ``s3ckpt gc`` has run (its
    leftovers are never loaded, but they are there). Files that s3ckpt does not write
    (logs, TensorBoard events) are not its business and are ignored.

    Returns:
        The committed checkpoints under ``run_url`` (nested runs included), oldest first.

    Raises:
        AssertionError: Naming every open upload, uncommitted checkpoint and leftover key.
    """
    run = Location.of(run_url, store=store)
    uploads = run.store.list_multipart_uploads(run.url.prefix)
    problems = sorted(f"open multipart upload: {u.key}" for u in uploads)
    committed: list[CheckpointInfo] = []
    for cat in scan(run, include_uploads=False):
        for c in cat.checkpoints:
            if not c.is_committed or c.error:
                problems.append(f"not committed: {c.url}: {_describe(c)}")
                continue
            committed.append(c)
            problems += [f"not committed by {c.name}'s marker: {k}" for k in _uncommitted_keys(c)]
            if c.metadata_stale:
                problems.append(f"stale or missing plain {METADATA_NAME} copy in {c.url}")
    if problems:
        raise AssertionError(f"{run} is not clean: {len(problems)} problem(s)" + _shown(problems))
    return committed
