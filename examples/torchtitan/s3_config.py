"""torchtitan config functions (``--module s3_config --config ...``) with checkpoints in S3.

``llama3_debugmodel_s3`` is the recipe: a stock torchtitan config with its ``checkpoint``
replaced by :class:`s3ckpt.torchtitan.S3CheckpointManager`'s. ``llama3_debugmodel_s3_cpu``
is what ``run_example.py`` trains: the same, made to run on CPU, and with the manager that
checks every resume (``check.py``).

The bucket and prefix come from ``S3CKPT_TORCHTITAN_URL`` (or ``--checkpoint.folder``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_mask
from torchtitan.models.common.attention import FlexAttention
from torchtitan.models.llama3.config_registry import llama3_debugmodel
from torchtitan.trainer import Trainer

from s3ckpt.torchtitan import S3CheckpointManager


def llama3_debugmodel_s3() -> Trainer.Config:
    """torchtitan's llama3 debug model, checkpointing to S3 through s3ckpt."""
    config = llama3_debugmodel()
    config.checkpoint = S3CheckpointManager.Config(
        enable=True,
        folder=os.environ.get("S3CKPT_TORCHTITAN_URL", "s3://my-bucket/runs/llama3-debug"),
        interval=5,
        keep_latest_k=2,  # retention: KeepLast(2); or retention_policy="pretraining"
        async_mode="async",
        last_save_model_only=False,  # the last step is a full, resumable checkpoint
    )
    return config


class DenseMaskAttention(FlexAttention):
    """FlexAttention's block-causal attention computed by ``scaled_dot_product_attention``
    with the mask made dense, because FlexAttention has no backward on CPU. For this CPU
    example only; on GPUs keep FlexAttention."""

    @dataclass(kw_only=True, slots=True)
    class Config(FlexAttention.Config):
        pass

    def forward(  # type: ignore[override]
        self,
        q_BLNH: torch.Tensor,
        k_BLNH: torch.Tensor,
        v_BLNH: torch.Tensor,
        *,
        attention_masks,
        scale: float | None = None,
        enable_gqa: bool = False,
        **kwargs,
    ) -> torch.Tensor:
        batch, length = q_BLNH.shape[0], q_BLNH.shape[1]
        mask = create_mask(attention_masks.mask_mod, batch, 1, length, length, q_BLNH.device)
        out = F.scaled_dot_product_attention(
            q_BLNH.transpose(1, 2),
            k_BLNH.transpose(1, 2),
            v_BLNH.transpose(1, 2),
            attn_mask=mask,
            scale=scale,
            enable_gqa=enable_gqa,
        )
        return out.transpose(1, 2)


def llama3_debugmodel_s3_cpu() -> Trainer.Config:
    """The recipe on CPU, with every resume checked (``check.py``)."""
    from check import CheckedS3CheckpointManager

    config = llama3_debugmodel_s3()
    assert config.model_spec is not None
    for _, _, parent, attr in config.model_spec.model.traverse(FlexAttention.Config):
        if isinstance(parent, list):
            parent[attr] = DenseMaskAttention.Config()
        else:
            setattr(parent, attr, DenseMaskAttention.Config())
    # FSDP's gradient averaging on gloo needs the partial-DTensor path in torch 2.13.
    config.parallelism.spmd_backend = "partial_dtensor"
    stock = config.checkpoint
    config.checkpoint = CheckedS3CheckpointManager.Config(
        **{f.name: getattr(stock, f.name) for f in fields(stock)}
    )
    return config
