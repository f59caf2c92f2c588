"""The plug-in: :class:`S3Checkpointing`, what :func:`s3ckpt.accelerate.use_s3ckpt`
installs on one ``Accelerator`` (see the package docs)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import state_dict as tsd

from s3ckpt._plugin_common import Retention, agree, dcp_errors, open_reader, rank_of, together
from s3ckpt._step_names import checkpoint_step
from s3ckpt.accelerate import _state as st
from s3ckpt.checkpointer import RetentionRecord
from s3ckpt.checkpointer._latest import Candidate, load_newest_good
from s3ckpt.checkpointer._retention import resolve_policy
from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.dcp import S3StorageWriter, SafeGlobal
from s3ckpt.errors import (
    CheckpointError,
    CheckpointExistsError,
    CheckpointNotFoundError,
    ConfigError,
)
from s3ckpt.format._names import MANIFEST_NAME
from s3ckpt.retention import KeepLast, RetentionOptions, list_checkpoints
from s3ckpt.store import Location
from s3ckpt.tools.packing import pack_state, packed_destinations, unpack_state

if TYPE_CHECKING:
    from accelerate import Accelerator

    from s3ckpt.retention import Policy, PruneResult

log = logging.getLogger("s3ckpt")

_REPLACED = ("save_state", "load_state", "save_model", "prepare")


def is_url(location: object) -> bool:
    """Whether accelerate's ``output_dir`` / ``input_dir`` names a store (has ``://``)."""
    return location is not None and "://" in str(location)


class S3Checkpointing:
    """s3ckpt installed on one ``Accelerator``; made by
    :func:`~s3ckpt.accelerate.use_s3ckpt`.

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
        fallback: bool = True,
    ) -> None:
        from accelerate.utils import DistributedType

        if accelerator.distributed_type in (DistributedType.DEEPSPEED, DistributedType.MEGATRON_LM):
            raise ConfigError(
                f"s3ckpt.accelerate does not support {accelerator.distributed_type}: its "
                "engines save themselves (DDP, FSDP and single-process runs are supported)"
            )
        self.accelerator = accelerator
        self._fsdp = accelerator.distributed_type == DistributedType.FSDP
        self.policy = resolve_policy(policy)
        self.s3_config = s3_config or S3Config()
        self.transfer_config = transfer_config or TransferConfig()
        self.verify_checksums = verify_checksums
        self.safe_globals = tuple(safe_globals)
        self.allow_unsafe_pickle = allow_unsafe_pickle
        self.retention_grace = retention_grace
        self.fallback = fallback
        self.last_saved: str | None = None
        self._step_fn = step
        self._retention = Retention()
        # A dedicated gloo group (a collective): checkpoint traffic never interleaves with
        # training collectives, and DCP's object gathers need a CPU backend under NCCL.
        self._rank = rank_of()
        several = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        self._pg = dist.new_group(backend="gloo") if several else None
        # The originals (the class's methods bound to this instance), then ours in their place.
        self._original = {name: getattr(accelerator, name) for name in _REPLACED}
        for name in _REPLACED:
            setattr(accelerator, name, getattr(self, "_prepare" if name == "prepare" else name))
        self._watch()

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
        acc, run = self.accelerator, self._auto_run()
        if run is not None:  # the checkpoint, in its run (the parent prefix)
            return self._save(run.child(f"checkpoint_{acc.save_iteration}"), automatic=True)
        if not acc.project_configuration.automatic_checkpoint_naming and is_url(output_dir):
            return self._save(self._at(str(output_dir)), automatic=False)
        return self._original["save_state"](
            output_dir, safe_serialization=safe_serialization, **save_model_func_kwargs
        )

    def load_state(
        self,
        input_dir: str | None = None,
        load_kwargs: dict[str, Any] | None = None,
        **load_model_func_kwargs: Any,
    ) -> None:
        """``Accelerator.load_state``: a URL (or, with automatic naming under a URL
        ``project_dir`` and no ``input_dir``, the newest good ``checkpoint_{i}``, as
        :meth:`load_latest` finds it) loads through s3ckpt; anything else is accelerate's
        own ``load_state``.

        Tensors load into the prepared objects where they are (``map_location`` and
        ``load_kwargs`` do not apply to URLs). With automatic naming the next save goes to
        the checkpoint after the one loaded (accelerate leaves that to the user).

        Raises:
            CheckpointNotFoundError: nothing committed at the URL (or under the run).
            CheckpointError: the checkpoint lacks state this accelerator has (another
                number of models, optimizers, schedulers or registered objects).
        """
        run = self._auto_run()
        if input_dir is None and run is not None:
            if self._load_newest(run, automatic=True) is None:
                raise CheckpointNotFoundError(
                    f"no committed checkpoint under {run} to resume from (automatic "
                    "checkpoint naming); save one first, or pass input_dir",
                    bucket=run.bucket,
                    key=run.url.prefix,
                )
        elif input_dir is not None and is_url(input_dir):
            self._load(self._at(str(input_dir)), automatic=False)
        else:
            self._original["load_state"](
                input_dir, load_kwargs=load_kwargs, **load_model_func_kwargs
            )

    def latest(self, run: str) -> str | None:
        """The URL of the newest good committed checkpoint under ``run`` (by step, then
        commit time; damaged ones skipped), or ``None``. Collective: the main process
        lists, every rank gets the answer."""
        return next((c.url for c in self._candidates(self._at(run)) if not c.damage), None)

    def load_latest(self, run: str) -> str | None:
        """Load the newest good checkpoint under ``run``; its URL (``None``, nothing
        changed, when ``run`` holds no committed checkpoint). Collective. With
        ``fallback`` (:func:`~s3ckpt.accelerate.use_s3ckpt`) one known damaged, or whose
        read fails verification, is skipped with a WARNING naming it, and every tensor and
        entry is then the older good checkpoint's; else it raises
        :class:`~s3ckpt.errors.CorruptCheckpointError` (also when none is good)."""
        return self._load_newest(self._at(run), automatic=False)

    @property
    def last_retention(self) -> PruneResult | BaseException | None:
        """The last retention pass's result, or the exception it failed with (on the main
        process; ``None`` before the first pass)."""
        return self._retention.last.last if self._retention.last is not None else None

    @property
    def retention_history(self) -> tuple[RetentionRecord, ...]:
        """This process's retention passes (the last 100 per run), oldest first: the step
        whose commit triggered each, and its result or the exception it failed with."""
        return self._retention.history

    def wait(self) -> None:
        """Block until the retention passes queued so far have run."""
        self._retention.wait()

    def save_model(
        self,
        model: torch.nn.Module,
        save_directory: str | os.PathLike[str],
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> None:
        """``Accelerator.save_model``: to a URL, the files accelerate writes to a folder
        (``model.safetensors``, or ``model-00001-of-0000N.safetensors`` shards and
        ``model.safetensors.index.json``; ``pytorch_model*.bin`` without
        ``safe_serialization``), streamed to the store by the main process; anything else
        is accelerate's own ``save_model``. Collective, as accelerate's is under FSDP.

        Shards an earlier save left there that the new files replace are deleted after
        the new index is written, as accelerate deletes them locally.

        Raises:
            ConfigError: a parameter on the ``meta`` device, or (with
                ``safe_serialization``) a value safetensors cannot store; before anything
                is written.
        """
        options: dict[str, Any] = {
            "max_shard_size": max_shard_size,
            "safe_serialization": safe_serialization,
        }
        if not is_url(save_directory):
            self._original["save_model"](model, save_directory, **options)
            return
        where = self._at(str(save_directory))
        state_dict = st.model_state_dict(self.accelerator, model, where.url)  # collective (FSDP)
        written = agree(lambda: st.write_model_files(state_dict, where, **options), self._pg)
        log.info("s3ckpt: saved model %s (%s)", where.url, ", ".join(written))

    def remove(self) -> None:
        """Give the accelerator its own ``save_state``, ``load_state``, ``save_model``
        and ``prepare`` back (after the retention passes queued so far)."""
        self._retention.close()
        own = vars(self.accelerator)
        for name in _REPLACED:
            if getattr(own.get(name), "__self__", None) is self:
                del own[name]

    def _prepare(self, *args: Any, **kwargs: Any) -> Any:
        """``Accelerator.prepare``, then :meth:`_watch` the loaders it made."""
        out = self._original["prepare"](*args, **kwargs)
        self._watch()
        return out

    def _watch(self) -> None:
        """Each prepared loader records its generator as each epoch starts (for saves in
        the middle of an epoch: :func:`~s3ckpt.accelerate._state.watch_epochs`)."""
        for loader in self.accelerator._dataloaders:
            st.watch_epochs(loader)

    # -- where ----------------------------------------------------------------------------------
    def _auto_run(self) -> Location | None:
        """The run of automatic checkpoint naming under a URL ``project_dir``, else None."""
        acc = self.accelerator
        if acc.project_configuration.automatic_checkpoint_naming and is_url(acc.project_dir):
            return self._at(str(acc.project_dir)).child("checkpoints")
        return None

    def _candidates(self, run: Location) -> list[Candidate]:
        """The committed checkpoints under ``run``, newest first, as the catalog judged
        them: the main process lists, every rank gets the answer."""
        options = RetentionOptions(grace=self.retention_grace)
        return agree(
            lambda: Candidate.newest_first(list_checkpoints(run, options=options)), self._pg
        )

    def _load_newest(self, run: Location, *, automatic: bool) -> str | None:
        """Every rank: load the newest good checkpoint under ``run``; its URL, or None."""
        found = load_newest_good(
            self._candidates(run),
            lambda c: self._load(run.at(c.url), automatic=automatic),
            fallback=self.fallback,
            run=run.url,
        )
        return None if found is None else found[0].url

    # -- save -----------------------------------------------------------------------------------
    def _save(self, ckpt: Location, *, automatic: bool) -> str:
        import accelerate

        acc = self.accelerator
        url = ckpt.url
        # The step: the user's, else the folder name's, else the count of saves.
        step = checkpoint_step(url.name) if self._step_fn is None else int(self._step_fn())
        step = int(acc.save_iteration) if step is None else step
        models = list(acc._models)
        model_sds = [tsd.get_model_state_dict(m) for m in models]
        # accelerate's save pre-hooks see (models, weights, output_dir) and may take weights
        # out (they saved those models themselves); under FSDP they see no weights.
        weights: list[dict[str, Any]] = [] if self._fsdp else model_sds
        for hook in acc._save_model_state_pre_hook.values():
            hook(acc._models, weights, str(url))
        sd = self._entries(model_sds if self._fsdp else weights, st.optimizers(acc, models))
        other = st.other_state(acc, self._rank)
        sd.update((name, pack_state(value)) for name, value in other.items())

        committed = agree(lambda: ckpt.store.head(url.key(MANIFEST_NAME)) is not None, self._pg)
        if committed and automatic:
            raise CheckpointExistsError(
                f"{url} is already committed (automatic checkpoint naming, save_iteration "
                f"{acc.save_iteration}); set accelerator.project_configuration.iteration to "
                "the next free number",
                bucket=url.bucket,
                key=url.key(MANIFEST_NAME),
            )
        writer = S3StorageWriter(
            ckpt,
            overwrite=committed,  # safe: the old checkpoint stays loadable until this commits
            step=step,
            user_metadata={"framework": "accelerate", "accelerate_version": accelerate.__version__},
        )
        with dcp_errors("save", url, self._rank):
            dcp.save(sd, storage_writer=writer, process_group=self._pg)
        # Training goes on from exactly the RNG state saved, even if a library on the save
        # path drew from a global generator (s3ckpt's own jitter uses private ones).
        st.set_rng_state(other[f"random_states_{self._rank}"])
        acc.project_configuration.iteration += 1
        self.last_saved = str(url)
        log.info("s3ckpt: saved %s (step %d)", url, step)
        # Retention on the main process: the policy, else (automatic naming) total_limit.
        policy, limit = self.policy, acc.project_configuration.total_limit
        if policy is None and automatic and limit is not None:
            policy = KeepLast(int(limit))
        if policy is not None and self._rank == 0:
            self._retention.schedule(ckpt.parent, policy, self.retention_grace, step)
        return str(url)

    @staticmethod
    def _entries(model_sds: Sequence[Any], opts: Sequence[tuple[Any, Any]]) -> dict[str, Any]:
        """The models' and optimizers' entries: ``model``, ``model_1`` ..., ``optim`` ..."""
        sd = {st.entry_name("model", i): msd for i, msd in enumerate(model_sds)}
        for j, (opt, owner) in enumerate(opts):
            sd[st.entry_name("optim", j)] = tsd.get_optimizer_state_dict(owner, opt)
        return sd

    # -- load -----------------------------------------------------------------------------------
    def _load(self, ckpt: Location, *, automatic: bool) -> None:
        acc = self.accelerator
        url = ckpt.url
        # Each rank reads the marker and .metadata itself; one that fails makes every rank
        # raise (the same error), so none waits in dcp.load for it (_plugin_common).
        reader = together(lambda: open_reader(ckpt, self, self.allow_unsafe_pickle), self._pg)
        models = list(acc._models)
        # accelerate's load pre-hooks see (models, input_dir) and may take models out
        # (they loaded those themselves); under FSDP they see none.
        hooked: list[torch.nn.Module] = [] if self._fsdp else list(models)
        for hook in acc._load_model_state_pre_hook.values():
            hook(hooked, str(url))
        load_models = models if self._fsdp else hooked
        opts = st.optimizers(acc, models)
        sd = self._entries([tsd.get_model_state_dict(m) for m in load_models], opts)
        saved = {fqn.split(".")[0] for fqn in reader.metadata.state_dict_metadata}
        missing = [k for k, v in sd.items() if k not in saved and v]
        # Everything else loads into destinations the checkpoint describes, then unpacks
        # to exactly the values saved (s3ckpt/accelerate/_state.py).
        names = st.other_names(acc, self._rank)
        for name in names:
            flat = packed_destinations(reader.metadata, name)
            if flat is not None:
                sd[name] = flat
            elif not name.startswith(st.OPTIONAL):
                missing.append(name)

        def check() -> None:
            if missing:
                raise CheckpointError(
                    f"{url} has no {', '.join(missing)}: it was saved by a job with other "
                    "models, optimizers, schedulers, scaler or registered objects than this "
                    "accelerator has",
                    bucket=url.bucket,
                    key=url.prefix,
                    rank=self._rank,
                )

        together(check, self._pg)

        with dcp_errors("load", url, self._rank):
            dcp.load(sd, storage_reader=reader, process_group=self._pg)
        state = together(
            lambda: {name: unpack_state(sd[name]) for name in names if name in sd}, self._pg
        )

        for i, m in enumerate(load_models):
            tsd.set_model_state_dict(m, sd[st.entry_name("model", i)])
        if acc.scaler is not None and "scaler" in state:
            acc.scaler.load_state_dict(state["scaler"])  # before the optimizers (FSDP2)
        for j, (opt, owner) in enumerate(opts):
            tsd.set_optimizer_state_dict(owner, opt, sd[st.entry_name("optim", j)])
        st.apply_state(acc, state, automatic=automatic)
        rng = state.get(f"random_states_{self._rank}")
        if rng is None:
            log.info("s3ckpt: %s has no random states for rank %d; not restored", url, self._rank)
        else:
            st.set_rng_state(rng)
        log.info("s3ckpt: loaded %s", url)

    # -- coordination, stores, retention --------------------------------------------------------
    def _at(self, target: str) -> Location:
        """``target`` in the process's shared store for this plug-in's settings."""
        return Location.of(target, s3_config=self.s3_config, transfer_config=self.transfer_config)
