"""``accelerator.save_state("s3://...")`` and ``load_state`` through s3ckpt, in one call.

::

    from accelerate import Accelerator
    from s3ckpt.accelerate import use_s3ckpt

    accelerator = Accelerator()
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    ckpt = use_s3ckpt(accelerator, policy="pretraining", step=lambda: step)   # every rank
    run = "s3://bucket/runs/llama"
    if (url := ckpt.latest(run)) is not None:
        accelerator.load_state(url)             # a fresh process resumes exactly
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

import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from s3ckpt.checkpointer import RetentionRecord, RetentionRunner
from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.dcp import S3StorageReader, S3StorageWriter, SafeGlobal, quiet_dcp
from s3ckpt.errors import (
    CheckpointError,
    CheckpointExistsError,
    CheckpointNotFoundError,
    ConfigError,
)
from s3ckpt.format import MANIFEST_NAME, checkpoint_step
from s3ckpt.retention import DEFAULT_GRACE, CheckpointState, KeepLast, list_checkpoints
from s3ckpt.retention import load_policy as load_policy_file
from s3ckpt.store import ObjectStore, open_store
from s3ckpt.uri import StoreURL, parse_url

if TYPE_CHECKING:
    from accelerate import Accelerator

    from s3ckpt.retention import Policy, PruneResult

__all__ = ["S3Checkpointing", "use_s3ckpt"]

log = logging.getLogger("s3ckpt")

_T = TypeVar("_T")

# Top-level entries a load may find missing without failing: RNG states of a rank the
# saving job did not have (another world size), data loader state (accelerate loads it
# only when its file exists), the accelerator's counters.
_OPTIONAL = ("random_states_", "dataloader", "accelerator")


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

    Returns:
        The installed :class:`S3Checkpointing` (``latest``, ``wait``, ``remove``).
    """
    previous = getattr(vars(accelerator).get("save_state"), "__self__", None)
    if isinstance(previous, S3Checkpointing):
        previous.remove()
    return S3Checkpointing(
        accelerator,
        policy=policy,
        s3_config=s3_config,
        transfer_config=transfer_config,
        step=step,
        verify_checksums=verify_checksums,
        safe_globals=safe_globals,
        allow_unsafe_pickle=allow_unsafe_pickle,
        retention_grace=retention_grace,
    )


@dataclass(frozen=True)
class _Target:
    """Where a save or load goes: the checkpoint and its run (the parent prefix)."""

    url: StoreURL
    run: StoreURL
    automatic: bool = False


class S3Checkpointing:
    """s3ckpt installed on one ``Accelerator``; made by :func:`use_s3ckpt`.

    :meth:`save_state` and :meth:`load_state` are what ``accelerator.save_state`` and
    ``accelerator.load_state`` now are (same arguments); call either. Both are collective:
    call them on every rank, as with accelerate.

    Attributes:
        policy: The retention policy (``None``: none).
        last_saved: URL of the last checkpoint this process saved (``None`` before).
    Retention passes run on the main process, one at a time, in the background; failures
    never fail training (they are logged). :attr:`last_retention` and
    :attr:`retention_history` show them.
    """

    def __init__(
        self,
        accelerator: Accelerator,
        *,
        policy: Policy | str | None,
        s3_config: S3Config | None,
        transfer_config: TransferConfig | None,
        step: Callable[[], int] | None,
        verify_checksums: bool,
        safe_globals: Sequence[SafeGlobal],
        allow_unsafe_pickle: bool,
        retention_grace: timedelta,
    ) -> None:
        from accelerate.utils import DistributedType

        if accelerator.distributed_type in (DistributedType.DEEPSPEED, DistributedType.MEGATRON_LM):
            raise ConfigError(
                f"s3ckpt.accelerate does not support {accelerator.distributed_type}: its "
                "engines save themselves (DDP, FSDP and single-process runs are supported)"
            )
        self.accelerator = accelerator
        self.policy: Policy | None = load_policy_file(policy) if isinstance(policy, str) else policy
        self.s3_config = s3_config or S3Config()
        self.transfer_config = transfer_config or TransferConfig()
        self.verify_checksums = verify_checksums
        self.safe_globals = tuple(safe_globals)
        self.allow_unsafe_pickle = allow_unsafe_pickle
        self.retention_grace = retention_grace
        self.last_saved: str | None = None
        self._step_fn = step
        self._stores: dict[tuple[str, str], ObjectStore] = {}
        self._runners: dict[StoreURL, RetentionRunner] = {}
        self._last_runner: RetentionRunner | None = None
        # A dedicated gloo group (a collective): checkpoint traffic never interleaves with
        # training collectives, and DCP's object gathers need a CPU backend under NCCL.
        self._pg: dist.ProcessGroup | None = None
        self._rank = 0
        if dist.is_available() and dist.is_initialized():
            self._rank = dist.get_rank()
            if dist.get_world_size() > 1:
                self._pg = dist.new_group(backend="gloo")
        # The originals: the class's methods bound to this instance.
        self._original_save = accelerator.save_state
        self._original_load = accelerator.load_state
        accelerator.save_state = self.save_state
        accelerator.load_state = self.load_state

    @property
    def _fsdp(self) -> bool:
        from accelerate.utils import DistributedType

        return bool(self.accelerator.distributed_type == DistributedType.FSDP)

    # -- public API ---------------------------------------------------------------------------
    def save_state(
        self,
        output_dir: str | None = None,
        safe_serialization: bool = True,
        **save_model_func_kwargs: Any,
    ) -> Any:
        """``Accelerator.save_state``: a URL (or automatic naming under a URL
        ``project_dir``) saves through s3ckpt and returns the checkpoint's URL; anything
        else is accelerate's own ``save_state``.

        ``safe_serialization`` does not apply to URLs: every item is a DCP item, and
        non-tensor ones load with ``weights_only``.

        Raises:
            CheckpointExistsError: automatic naming, and ``checkpoint_{save_iteration}``
                is already committed (as accelerate refuses an existing folder).
        """
        target = self._save_target(output_dir)
        if target is None:
            return self._original_save(
                output_dir, safe_serialization=safe_serialization, **save_model_func_kwargs
            )
        return self._save(target)

    def load_state(
        self,
        input_dir: str | None = None,
        load_kwargs: dict[str, Any] | None = None,
        **load_model_func_kwargs: Any,
    ) -> None:
        """``Accelerator.load_state``: a URL (or, with automatic naming under a URL
        ``project_dir`` and no ``input_dir``, the newest committed ``checkpoint_{i}``)
        loads through s3ckpt; anything else is accelerate's own ``load_state``.

        Tensors load into the prepared objects where they are (``map_location`` and
        ``load_kwargs`` do not apply to URLs). With automatic naming the next save goes to
        the checkpoint after the one loaded (accelerate leaves that to the user).

        Raises:
            CheckpointNotFoundError: nothing committed at the URL (or under the run).
            CheckpointError: the checkpoint lacks state this accelerator has (another
                number of models, optimizers, schedulers or registered objects).
        """
        target = self._load_target(input_dir)
        if target is None:
            self._original_load(input_dir, load_kwargs=load_kwargs, **load_model_func_kwargs)
            return
        self._load(target)

    def latest(self, run: str) -> str | None:
        """The URL of the newest committed checkpoint under ``run`` (by step, then commit
        time), or ``None``. Collective: the main process lists, every rank gets the answer.
        """
        url = parse_url(run)
        return self._agree(lambda: self._latest(url))

    @property
    def last_retention(self) -> PruneResult | BaseException | None:
        """The last retention pass's result, or the exception it failed with (on the main
        process; ``None`` before the first pass)."""
        return self._last_runner.last if self._last_runner is not None else None

    @property
    def retention_history(self) -> tuple[RetentionRecord, ...]:
        """This process's retention passes (the last 100 per run), oldest first: the step
        whose commit triggered each, and its result or the exception it failed with."""
        records = [r for runner in self._runners.values() for r in runner.history]
        return tuple(sorted(records, key=lambda r: r.started))

    def wait(self) -> None:
        """Block until the retention passes queued so far have run."""
        for runner in self._runners.values():
            runner.wait()

    def remove(self) -> None:
        """Give the accelerator its own ``save_state`` / ``load_state`` back (after the
        retention passes queued so far)."""
        for runner in self._runners.values():
            runner.close()
        self._runners.clear()
        own = vars(self.accelerator)
        for name in ("save_state", "load_state"):
            if getattr(own.get(name), "__self__", None) is self:
                del own[name]

    # -- where ----------------------------------------------------------------------------------
    def _save_target(self, output_dir: str | None) -> _Target | None:
        acc = self.accelerator
        if acc.project_configuration.automatic_checkpoint_naming:
            if not _is_url(acc.project_dir):
                return None
            run = parse_url(str(acc.project_dir)).child("checkpoints")
            return _Target(run.child(f"checkpoint_{acc.save_iteration}"), run, automatic=True)
        if output_dir is None or not _is_url(output_dir):
            return None
        url = parse_url(str(output_dir))
        return _Target(url, url.parent)

    def _load_target(self, input_dir: str | None) -> _Target | None:
        acc = self.accelerator
        if input_dir is not None:
            if not _is_url(input_dir):
                return None
            url = parse_url(str(input_dir))
            return _Target(url, url.parent)
        if not acc.project_configuration.automatic_checkpoint_naming or not _is_url(
            acc.project_dir
        ):
            return None
        run = parse_url(str(acc.project_dir)).child("checkpoints")
        found = self._agree(lambda: self._latest(run))
        if found is None:
            raise CheckpointNotFoundError(
                f"no committed checkpoint under {run} to resume from (automatic checkpoint "
                "naming); save one first, or pass input_dir",
                bucket=run.bucket,
                key=run.prefix,
            )
        url = parse_url(found)
        return _Target(url, run, automatic=True)

    # -- save -----------------------------------------------------------------------------------
    def _save(self, target: _Target) -> str:
        acc = self.accelerator
        url = target.url
        step = self._step(url)
        models = list(acc._models)
        model_sds = [get_model_state_dict(m) for m in models]
        # accelerate's save pre-hooks see (models, weights, output_dir) and may take weights
        # out (they saved those models themselves); under FSDP they see no weights.
        weights: list[dict[str, Any]] = [] if self._fsdp else model_sds
        for hook in acc._save_model_state_pre_hook.values():
            hook(acc._models, weights, str(url))
        sd: dict[str, Any] = {}
        for i, msd in enumerate(model_sds if self._fsdp else weights):
            sd[_name("model", i)] = msd
        for j, (opt, owner) in enumerate(self._optimizers(models)):
            sd[_name("optim", j)] = get_optimizer_state_dict(owner, opt)
        sd.update(self._other_state())

        store = self._store(url)
        committed = self._agree(lambda: store.head(url.key(MANIFEST_NAME)) is not None)
        if committed and target.automatic:
            raise CheckpointExistsError(
                f"{url} is already committed (automatic checkpoint naming, save_iteration "
                f"{acc.save_iteration}); set accelerator.project_configuration.iteration to "
                "the next free number",
                bucket=url.bucket,
                key=url.key(MANIFEST_NAME),
            )
        writer = S3StorageWriter(
            url,
            s3_config=self.s3_config,
            transfer_config=self.transfer_config,
            overwrite=committed,  # safe: the old checkpoint stays loadable until this commits
            step=step,
            user_metadata={"framework": "accelerate", "accelerate_version": _version()},
            store=store,
        )
        with quiet_dcp():
            dcp.save(sd, storage_writer=writer, process_group=self._pg)
        # Training goes on from exactly the RNG state saved, even if a library on the save
        # path drew from a global generator (s3ckpt's own jitter uses private ones).
        _set_rng_state(sd[f"random_states_{self._rank}"])
        acc.project_configuration.iteration += 1
        self.last_saved = str(url)
        log.info("s3ckpt: saved %s (step %d)", url, step)
        self._schedule_retention(target, step)
        return str(url)

    def _step(self, url: StoreURL) -> int:
        if self._step_fn is not None:
            return int(self._step_fn())
        found = checkpoint_step(url.name)
        return found if found is not None else int(self.accelerator.save_iteration)

    # -- load -----------------------------------------------------------------------------------
    def _load(self, target: _Target) -> None:
        acc = self.accelerator
        url = target.url
        reader = S3StorageReader(
            url,
            s3_config=self.s3_config,
            transfer_config=self.transfer_config,
            verify_checksums=self.verify_checksums,
            allow_unsafe_pickle=self.allow_unsafe_pickle,
            safe_globals=self.safe_globals,
            store=self._store(url),
        )
        models = list(acc._models)
        # accelerate's load pre-hooks see (models, input_dir) and may take models out
        # (they loaded those themselves); under FSDP they see none.
        load_models: list[torch.nn.Module] = [] if self._fsdp else list(models)
        for hook in acc._load_model_state_pre_hook.values():
            hook(load_models, str(url))
        if self._fsdp:
            load_models = models
        optimizers = self._optimizers(models)
        sd: dict[str, Any] = {}
        for i, m in enumerate(load_models):
            sd[_name("model", i)] = get_model_state_dict(m)
        for j, (opt, owner) in enumerate(optimizers):
            sd[_name("optim", j)] = get_optimizer_state_dict(owner, opt)
        sd.update(self._other_state())
        sd = _present(sd, set(reader.metadata.state_dict_metadata), url)

        with quiet_dcp():
            dcp.load(sd, storage_reader=reader, process_group=self._pg)

        for i, m in enumerate(load_models):
            set_model_state_dict(m, sd[_name("model", i)])
        if acc.scaler is not None and "scaler" in sd:
            acc.scaler.load_state_dict(sd["scaler"])  # before the optimizers (FSDP2)
        for j, (opt, owner) in enumerate(optimizers):
            set_optimizer_state_dict(owner, opt, sd[_name("optim", j)])
        for k, scheduler in enumerate(acc._schedulers):
            scheduler.load_state_dict(sd[_name("scheduler", k)])
        for k, loader in enumerate(acc._dataloaders):
            _load_loader_state(loader, sd.get(_name("dataloader", k), {}))
        for k, obj in enumerate(acc._custom_objects):
            obj.load_state_dict(sd[f"custom_{k}"])
        counters = sd.get("accelerator", {})
        if "step" in counters:
            acc.step = int(counters["step"])
        if target.automatic and "iteration" in counters:
            acc.project_configuration.iteration = int(counters["iteration"]) + 1
        rng = sd.get(f"random_states_{self._rank}")
        if rng is None:
            log.info("s3ckpt: %s has no random states for rank %d; not restored", url, self._rank)
        else:
            _set_rng_state(rng)
        log.info("s3ckpt: loaded %s", url)

    # -- state ----------------------------------------------------------------------------------
    def _optimizers(
        self, models: list[torch.nn.Module]
    ) -> list[tuple[torch.optim.Optimizer, torch.nn.Module]]:
        """Each prepared optimizer (unwrapped) with the prepared model holding its
        parameters (torch names optimizer state by that model's parameter names)."""
        out = []
        for j, wrapped in enumerate(self.accelerator._optimizers):
            opt = getattr(wrapped, "optimizer", wrapped)
            out.append((opt, _owner(models, opt, j)))
        return out

    def _other_state(self) -> dict[str, Any]:
        acc = self.accelerator
        sd: dict[str, Any] = {}
        for k, scheduler in enumerate(acc._schedulers):
            sd[_name("scheduler", k)] = scheduler.state_dict()
        for k, loader in enumerate(acc._dataloaders):
            sd[_name("dataloader", k)] = _loader_state(loader)
        if acc.scaler is not None:
            sd["scaler"] = acc.scaler.state_dict()
        for k, obj in enumerate(acc._custom_objects):
            sd[f"custom_{k}"] = obj.state_dict()
        sd["accelerator"] = {"step": int(acc.step), "iteration": int(acc.save_iteration)}
        sd[f"random_states_{self._rank}"] = _rng_state()
        return sd

    # -- coordination, stores, retention --------------------------------------------------------
    def _agree(self, fn: Callable[[], _T]) -> _T:
        """``fn()`` on the main process, its result (or exception) on every rank."""
        outcome: tuple[bool, Any] | None = None
        if self._rank == 0:
            try:
                outcome = (True, fn())
            except Exception as exc:
                outcome = (False, exc)
        if self._pg is not None:
            box = [outcome]
            dist.broadcast_object_list(box, src=0, group=self._pg)
            outcome = box[0]
        assert outcome is not None
        ok, value = outcome
        if not ok:
            raise value
        return value

    def _store(self, url: StoreURL) -> ObjectStore:
        key = (url.scheme, url.bucket)
        if key not in self._stores:
            self._stores[key], _ = open_store(
                url, s3_config=self.s3_config, transfer_config=self.transfer_config
            )
        return self._stores[key]

    def _latest(self, run: StoreURL) -> str | None:
        infos = list_checkpoints(self._store(run), run, grace=self.retention_grace)
        committed = [c for c in infos if c.state == CheckpointState.COMMITTED]
        return str(committed[-1].url) if committed else None

    def _schedule_retention(self, target: _Target, step: int) -> None:
        policy = self.policy
        limit = self.accelerator.project_configuration.total_limit
        if policy is None and target.automatic and limit is not None:
            policy = KeepLast(int(limit))
        if policy is None or self._rank != 0:
            return
        runner = self._runners.get(target.run)
        if runner is None:
            runner = self._runners[target.run] = RetentionRunner(
                self._store(target.run), target.run
            )
        self._last_runner = runner
        runner.schedule(policy, self.retention_grace, step)


# -- helpers ------------------------------------------------------------------------------------
def _is_url(location: object) -> bool:
    return location is not None and "://" in str(location)


def _name(kind: str, index: int) -> str:
    return kind if index == 0 else f"{kind}_{index}"


def _version() -> str:
    import accelerate

    return str(accelerate.__version__)


def _owner(
    models: list[torch.nn.Module], opt: torch.optim.Optimizer, index: int
) -> torch.nn.Module:
    wanted = {id(p) for group in opt.param_groups for p in group["params"]}
    for model in models:
        if wanted <= {id(p) for p in model.parameters()}:
            return model
    raise ConfigError(
        f"optimizer {index} ({type(opt).__name__}) updates parameters of no single prepared "
        "model; s3ckpt.accelerate names optimizer state by one model's parameter names. "
        "Prepare the models it spans as one module"
    )


def _present(sd: dict[str, Any], saved: set[str], url: StoreURL) -> dict[str, Any]:
    """``sd`` without what a checkpoint may lack (:data:`_OPTIONAL`), where it lacks it;
    raises for anything else missing (DCP would name one key; this names the objects)."""
    prefixes = {".".join(fqn.split(".")[:n]) for fqn in saved for n in range(1, fqn.count(".") + 2)}
    out: dict[str, Any] = {}
    missing = []
    for key, value in sd.items():
        if key.startswith(_OPTIONAL):
            kept = _prune_to(value, key, prefixes)
            if kept is not None:
                out[key] = kept
        elif key in prefixes or (isinstance(value, Mapping) and not value):
            out[key] = value
        else:
            missing.append(key)
    if missing:
        raise CheckpointError(
            f"{url} has no {', '.join(missing)}: it was saved by a job with other models, "
            "optimizers, schedulers, scaler or registered objects than this accelerator has",
            bucket=url.bucket,
            key=url.prefix,
        )
    return out


def _prune_to(value: Any, path: str, prefixes: set[str]) -> Any:
    """``value`` cut down to the paths saved (``None`` when nothing of it was)."""
    if path not in prefixes:
        return None
    if isinstance(value, Mapping) and value:
        kept = {}
        for k, v in value.items():
            sub = _prune_to(v, f"{path}.{k}", prefixes)
            if sub is not None:
                kept[k] = sub
        return kept or None
    return value


def _loader_state(loader: Any) -> dict[str, Any]:
    """What resumes a prepared data loader: its epoch counter (accelerate seeds each
    epoch's shuffle by it), the shuffling generator (synchronised across ranks, and not
    saved by accelerate), a seedable sampler's epoch and seed, a stateful loader's state."""
    from accelerate.data_loader import SeedableRandomSampler

    state: dict[str, Any] = {}
    if isinstance(getattr(loader, "iteration", None), int):
        state["iteration"] = loader.iteration
    sampler = _sampler(loader)
    generator = _generator(loader, sampler)
    if generator is not None:
        state["generator"] = generator.get_state()
    if isinstance(sampler, SeedableRandomSampler):
        state["sampler"] = {"epoch": int(sampler.epoch), "initial_seed": int(sampler.initial_seed)}
    if getattr(loader, "use_stateful_dataloader", False):
        state["state"] = loader.state_dict()
    return state


def _load_loader_state(loader: Any, state: Mapping[str, Any]) -> None:
    from accelerate.data_loader import SeedableRandomSampler

    if "iteration" in state:
        loader.iteration = int(state["iteration"])
    sampler = _sampler(loader)
    generator = _generator(loader, sampler)
    if "generator" in state and generator is not None:
        generator.set_state(state["generator"])
    if "sampler" in state and isinstance(sampler, SeedableRandomSampler):
        sampler.epoch = int(state["sampler"]["epoch"])
        sampler.initial_seed = int(state["sampler"]["initial_seed"])
    if "state" in state and getattr(loader, "use_stateful_dataloader", False):
        loader.load_state_dict(state["state"])


def _sampler(loader: Any) -> Any:
    """The index sampler under a prepared loader's batch samplers. (accelerate's own
    ``get_sampler`` stops at its ``BatchSamplerShard``, which has no ``sampler``.)"""
    from torch.utils.data import BatchSampler

    outer = getattr(loader, "sampler", None)
    batches = outer if isinstance(outer, BatchSampler) else getattr(loader, "batch_sampler", None)
    for _ in range(4):  # BatchSamplerShard -> BatchSampler -> sampler
        if batches is None:
            return None
        inner = getattr(batches, "sampler", None)
        if inner is not None:
            return inner
        batches = getattr(batches, "batch_sampler", None)
    return None


def _generator(loader: Any, sampler: Any) -> torch.Generator | None:
    """The generator the loader shuffles with: the one accelerate synchronises across
    ranks at each epoch's start, else the sampler's own."""
    for candidate in (
        getattr(loader, "synchronized_generator", None),
        getattr(sampler, "generator", None),
    ):
        if isinstance(candidate, torch.Generator):
            return candidate
    return None


def _device_rng_module() -> tuple[str, Any] | None:
    """The accelerator device's name and torch module (``cuda``, ``xpu`` ...), if any."""
    accel = getattr(torch, "accelerator", None)
    if accel is None or not accel.is_available():
        return None
    name = accel.current_accelerator().type
    module = torch.get_device_module(name)
    if not hasattr(module, "get_rng_state_all"):
        return None
    return name, module


def _rng_state() -> dict[str, Any]:
    """This process's RNG states as plain values and tensors (no numpy arrays, which the
    safe loader refuses): numpy's Mersenne Twister key becomes an int64 tensor."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        algorithm, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = {
            "algorithm": str(algorithm),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        }
    device = _device_rng_module()
    if device is not None:
        name, module = device
        state[name] = {str(i): t for i, t in enumerate(module.get_rng_state_all())}
    return state


def _set_rng_state(state: Mapping[str, Any]) -> None:
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        st = state["numpy"]
        keys = np.asarray(st["keys"].numpy(), dtype=np.uint32)
        np.random.set_state(
            (st["algorithm"], keys, st["pos"], st["has_gauss"], st["cached_gaussian"])
        )
    device = _device_rng_module()
    if device is not None and device[0] in state:
        name, module = device
        saved = state[name]
        module.set_rng_state_all([saved[str(i)] for i in range(len(saved))])
