"""torchrun entry point of the example: torchtitan's own ``torchtitan.train`` main, on CPU.

torchtitan 0.3.0 assumes an accelerator (``device_type`` falls back to "cuda"), a torch newer
than 2.13 in one place, and NCCL's PREMUL_SUM for FSDP; the shims below make it run on CPU
with gloo. On GPUs, run ``python -m torchtitan.train`` (or torchtitan's ``run_train.sh``)
with the same ``--module`` / ``--config`` instead: the shims are no part of the recipe.
"""

from __future__ import annotations

import types

import torch
import torchtitan.tools.utils as titan_utils

titan_utils.device_type = "cpu"
titan_utils.device_module = types.SimpleNamespace(
    current_device=lambda: 0,
    device_count=torch.cpu.device_count,
    set_device=lambda *args: None,
    synchronize=torch.cpu.synchronize,
    is_available=lambda: True,
    get_device_name=lambda *args: "cpu",
    get_device_properties=lambda *args: types.SimpleNamespace(total_memory=16 << 30),
    memory_stats=lambda *args: {},
    reset_peak_memory_stats=lambda *args: None,
    empty_cache=lambda: None,
)

import torchtitan.distributed.fsdp as titan_fsdp  # noqa: E402  (reads device_type on import)
import torchtitan.distributed.utils as titan_dist  # noqa: E402

# torchtitan 0.3.0 shortens the process groups' timeouts after the first step with
# torch.distributed.set_timeout, which torch 2.13 does not have yet: keep the timeouts.
if not hasattr(torch.distributed, "set_timeout"):
    titan_dist.set_pg_timeouts = lambda **kwargs: None

# gloo has no PREMUL_SUM, which FSDP uses to average gradients: sum, then divide.
_fully_shard = titan_fsdp.fully_shard


def _fully_shard_for_gloo(*args, **kwargs):
    sharded = _fully_shard(*args, **kwargs)
    for module in sharded if isinstance(sharded, list) else [sharded]:
        if hasattr(module, "set_force_sum_reduction_for_comms"):
            module.set_force_sum_reduction_for_comms(True)
    return sharded


titan_fsdp.fully_shard = _fully_shard_for_gloo

from torchtitan.train import main  # noqa: E402  (after the device is set)

if __name__ == "__main__":
    main()
