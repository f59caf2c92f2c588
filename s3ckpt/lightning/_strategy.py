"""S3ModelParallelStrategy: FSDP2 / TP sharded checkpoints through s3ckpt."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.strategies import ModelParallelStrategy

from s3ckpt.lightning._async import install_async_teardown
from s3ckpt.lightning._common import _is_remote
from s3ckpt.lightning._fs import install_filesystem
from s3ckpt.lightning._io import S3CheckpointIO
from s3ckpt.lightning._last import fix_parse_ckpt_path


class S3ModelParallelStrategy(ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` (FSDP2 / tensor parallel) saving its sharded
    checkpoints through s3ckpt.

    ``ModelParallelStrategy`` bypasses ``CheckpointIO`` and writes shards with a local
    ``FileSystemWriter``; this subclass sends an ``s3://`` path to s3ckpt instead: every
    rank streams its own shards into one DCP checkpoint (committed once, by rank 0), and
    loading reads back only each rank's part, at any world size (save on 2, resume on 4).
    The configuration (endpoint, retention policy, safe globals) is the trainer's
    :class:`S3CheckpointIO` plug-in when one is given, else a default one. Local paths keep
    the stock behaviour. Checkpoint traffic runs on a gloo group of its own.

    Only ``save_distributed_checkpoint=True`` (the default) is handled here; a full
    (gathered) checkpoint goes through the ``CheckpointIO`` plug-in as usual.
    """

    _s3ckpt_group: dist.ProcessGroup | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # What S3CheckpointIO installs when constructed, for a strategy given no plug-in.
        install_filesystem(None)
        fix_parse_ckpt_path()
        install_async_teardown()

    def _s3ckpt_io(self) -> S3CheckpointIO:
        io_: CheckpointIO = self.checkpoint_io  # type: ignore[has-type]
        if not isinstance(io_, S3CheckpointIO):
            io_ = S3CheckpointIO()
            self.checkpoint_io = io_
        return io_

    def _s3ckpt_pg(self) -> dist.ProcessGroup | None:
        if dist.get_backend() == "gloo":
            return None
        if self._s3ckpt_group is None:
            self._s3ckpt_group = dist.new_group(backend="gloo")
        return self._s3ckpt_group

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None
    ) -> None:
        """Every rank: save the sharded state and the rest of ``checkpoint`` to S3."""
        if not _is_remote(filepath) or not self._save_distributed_checkpoint:
            super().save_checkpoint(checkpoint, filepath, storage_options)
            return
        path = self.broadcast(str(filepath))
        sharded = {"state_dict": checkpoint.pop("state_dict")}
        for idx, state in enumerate(checkpoint.pop("optimizer_states", [])):
            sharded[f"optimizer_{idx}"] = state
        self._s3ckpt_io().save_sharded(sharded, checkpoint, path, self._s3ckpt_pg())

    def load_checkpoint(
        self, checkpoint_path: Any, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Every rank: load the model's and optimizers' shards in place; return the rest."""
        if not _is_remote(checkpoint_path):
            return super().load_checkpoint(checkpoint_path, weights_only)
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        path = self.broadcast(str(checkpoint_path))
        assert self.model is not None and self.lightning_module is not None
        options = StateDictOptions(cpu_offload=True)
        sharded: dict[str, Any] = {"state_dict": get_model_state_dict(self.model, options=options)}
        for idx, optimizer in enumerate(self.optimizers):
            sharded[f"optimizer_{idx}"] = get_optimizer_state_dict(
                self.model, optimizer, options=options
            )
        rest = self._s3ckpt_io().load_sharded(sharded, path, self._s3ckpt_pg(), weights_only)
        strict = self.lightning_module.strict_loading
        set_model_state_dict(
            self.model,
            sharded["state_dict"],
            options=StateDictOptions(cpu_offload=True, strict=strict),
        )
        for idx, optimizer in enumerate(self.optimizers):
            set_optimizer_state_dict(
                self.model, optimizer, sharded[f"optimizer_{idx}"], options=options
            )
        return rest

    def remove_checkpoint(self, filepath: Any) -> None:
        """Rank 0: delete one checkpoint through s3ckpt (see :class:`S3CheckpointIO`)."""
        if not _is_remote(filepath):
            super().remove_checkpoint(filepath)
            return
        if self.is_global_zero:
            self._s3ckpt_io().remove_checkpoint(filepath)
