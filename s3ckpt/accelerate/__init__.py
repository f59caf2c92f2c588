"""``accelerator.save_state("s3://...")`` and ``load_state`` through s3ckpt, in one call.

::

    from accelerate import Accelerator
    from s3ckpt.accelerate import use_s3ckpt

    accelerator = Accelerator()
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    ckpt = use_s3ckpt(accelerator, policy="pretraining", step=lambda: step)   # every rank
    run = "s3://bucket/runs/llama"
    ckpt.load_latest(run)       # the newest good checkpoint, if any: a fresh process resumes
    for step in range(...):
        ...
        accelerator.save_state(f"{run}/step_{step}")   # one DCP checkpoint, committed

After :func:`use_s3ckpt`, ``accelerator.save_state`` / ``load_state`` given a URL (anything
with ``://``: ``s3://``, or another fsspec URL), or run with automatic checkpoint naming
under a URL ``project_dir``, save and load one ``torch.distributed.checkpoint`` checkpoint
through :class:`~s3ckpt.dcp.S3StorageWriter` / :class:`~s3ckpt.dcp.S3StorageReader`:
streamed, checksummed, committed by ``s3ckpt.json`` (with the step), safely overwritten
when the folder is already committed, then pruned by the retention policy. Local paths
still go to accelerate's own code, unchanged.

The state dict of one save (names follow accelerate's files; ``_1``, ``_2`` ... for the
second and later objects of a kind)::

    model, model_1 ...        torch's get_model_state_dict: plain, DDP, FSDP2 (sharded DTensors)
    optim, optim_1 ...        torch's get_optimizer_state_dict (parameters named by FQN)
    scheduler, scheduler_1 .. each prepared scheduler's state_dict()
    dataloader, dataloader_1  epoch counter, the sampler's generator state, a seedable
                              sampler's epoch and seed, a stateful data loader's state_dict()
    scaler                    the GradScaler, when there is one
    custom_0, custom_1 ...    objects given to accelerator.register_for_checkpointing
    accelerator               {"step": accelerator.step, "iteration": accelerator.save_iteration}
    random_states_{rank}      each rank's python, numpy, torch (and accelerator device) RNGs

Every non-tensor value is a plain type (numpy's RNG state is stored as a tensor and
numbers), so checkpoints load through s3ckpt's safe loader (``weights_only``) without
``allow_unsafe_pickle``. Shared entries are saved once (DCP de-duplicates them across
ranks), as accelerate saves them from the main process only; the RNG entry is per rank.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

from s3ckpt.accelerate._plugin import S3Checkpointing
from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.dcp import SafeGlobal
from s3ckpt.retention._liveness import DEFAULT_GRACE

if TYPE_CHECKING:
    from accelerate import Accelerator

    from s3ckpt.retention import Policy

__all__ = ["S3Checkpointing", "use_s3ckpt"]


def use_s3ckpt(
    accelerator: Accelerator,
    *,
    policy: Policy | str | None = None,
    s3_config: S3Config | None = None,
    transfer_config: TransferConfig | None = None,
    step: Callable[[], int] | None = None,
    verify_checksums: bool = True,
    safe_globals: Sequence[SafeGlobal] = (),
    allow_unsafe_pickle: bool = False,
    retention_grace: timedelta = DEFAULT_GRACE,
    fallback: bool = True,
) -> S3Checkpointing:
    """Make ``accelerator.save_state`` / ``load_state`` store URLs through s3ckpt.

    Call it on every rank, after the ``Accelerator`` is constructed (it creates a gloo
    process group for checkpoint traffic, a collective call), before or after
    ``prepare``. A second call replaces the first one's settings.

    Args:
        accelerator: The ``accelerate.Accelerator`` whose ``save_state`` / ``load_state``
            (this instance's, not the class's) learn URLs.
        policy: Retention after each commit, over the folder's parent prefix (the run): a
            :class:`s3ckpt.retention.Policy`, a built-in policy name (``"pretraining"``)
            or a TOML policy file. ``None`` keeps everything, except that with automatic
            checkpoint naming a ``ProjectConfiguration.total_limit`` keeps that many
            (``KeepLast(total_limit)``).
        s3_config: Endpoint, region, encryption, storage class (default: environment).
        transfer_config: Part size, concurrency and memory bounds of transfers.
        step: Returns the training step to record in each checkpoint's ``s3ckpt.json``
            (what ``s3ckpt ls`` shows and step-based policies judge). Default: the step
            the folder's name gives (``step_100``, ``checkpoint-100``), else
            ``accelerator.save_iteration`` (the count of saves, accelerate's
            ``checkpoint_{i}``).
        verify_checksums: Verify every item's CRC32C on load.
        safe_globals: Your own value classes that non-tensor items (a registered
            object's state, a scheduler's) may rebuild on load, on top of torch's
            ``weights_only`` defaults and :data:`s3ckpt.dcp.SAFE_GLOBALS`.
        allow_unsafe_pickle: Load non-tensor items with full pickle (only for a bucket
            you trust); by default they load with torch's ``weights_only`` rules.
        retention_grace: Prefixes without a commit marker younger than this are saves in
            progress to retention and to :meth:`S3Checkpointing.latest`.
        fallback: When loading the newest checkpoint (:meth:`S3Checkpointing.load_latest`,
            ``load_state()`` with automatic naming), skip one ``s3ckpt check`` found damaged
            or whose read fails verification (a checksum, a missing object), with a WARNING
            naming it, and load the newest good one. ``False``: such a checkpoint raises
            :class:`~s3ckpt.errors.CorruptCheckpointError`. A URL given is always strict.

    Returns:
        The installed :class:`S3Checkpointing` (``latest``, ``wait``, ``remove``).
    """
    options = {k: v for k, v in locals().items() if k != "accelerator"}
    previous = getattr(vars(accelerator).get("save_state"), "__self__", None)
    if isinstance(previous, S3Checkpointing):
        previous.remove()
    return S3Checkpointing(accelerator, **options)
