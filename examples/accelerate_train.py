"""Train with Hugging Face accelerate, checkpoint to S3 with s3ckpt, resume in a new process.

    pip install "s3ckpt[accelerate,demo]"
    python examples/accelerate_train.py

What it does:

1. Starts an embedded S3 server (moto, on 127.0.0.1) unless ``AWS_ENDPOINT_URL`` names
   one, and uses the bucket ``s3ckpt-demo`` there.
2. Trains a small model for 3 epochs; ``accelerator.save_state("s3://.../step_N")`` at
   the end of each epoch writes one committed checkpoint, and the retention policy
   (keep the last 2) prunes after each commit.
3. Starts itself again as a fresh process (as after a crash or a preemption), which finds
   the newest checkpoint, ``accelerator.load_state(url)`` restores model, optimizer,
   scheduler, data loader, RNG states and the registered progress counter, and trains
   2 more epochs.
4. Lists the run, as ``s3ckpt ls`` does.

On several processes, point ``AWS_ENDPOINT_URL`` at one S3 endpoint all of them reach (or
a real bucket: set ``S3CKPT_EXAMPLE_RUN=s3://bucket/prefix``) and start the training part
with ``accelerate launch --cpu --num_processes 2 examples/accelerate_train.py --epochs 3``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import Any


class Progress:
    """Where training is; saved with the checkpoint (accelerator.register_for_checkpointing)."""

    def __init__(self) -> None:
        self.step = 0
        self.epoch = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "epoch": self.epoch}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.step, self.epoch = int(sd["step"]), int(sd["epoch"])


def train(run: str, epochs: int) -> None:
    """Resume from the newest checkpoint under ``run`` (if any), train up to ``epochs``
    epochs in all, saving at the end of each."""
    import torch
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset

    from s3ckpt.accelerate import use_s3ckpt
    from s3ckpt.retention import KeepLast

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    data = TensorDataset(torch.randn(256, 16), torch.randn(256, 1))
    loader = DataLoader(data, batch_size=32, shuffle=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)

    # The one call: URLs given to save_state / load_state now go through s3ckpt.
    ckpt = use_s3ckpt(accelerator, policy=KeepLast(2), step=lambda: progress.step)
    say = accelerator.print

    latest = ckpt.latest(run)
    if latest is None:
        say(f"[pid {os.getpid()}] no checkpoint under {run}: starting from scratch")
    else:
        accelerator.load_state(latest)
        say(
            f"[pid {os.getpid()}] resumed from {latest}: step {progress.step}, epoch "
            f"{progress.epoch}, lr {scheduler.get_last_lr()[0]:.5f}"
        )

    while progress.epoch < epochs:
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            progress.step += 1
        progress.epoch += 1
        url = accelerator.save_state(f"{run}/step_{progress.step:06d}")
        say(f"  epoch {progress.epoch}: step {progress.step}, loss {loss.item():.4f}, saved {url}")
    ckpt.wait()  # the retention pass after the last commit
    ckpt.remove()
    accelerator.end_training()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, help="train (resuming) up to this many epochs")
    parser.add_argument("--run", help="the run prefix (default: on the embedded server)")
    args = parser.parse_args()
    if args.epochs is not None:  # the training part (also what accelerate launch runs)
        train(args.run or os.environ["S3CKPT_EXAMPLE_RUN"], args.epochs)
        return

    from s3ckpt.cli import main as s3ckpt_main
    from s3ckpt.demo import demo_server

    with demo_server() as bucket:
        run = os.environ.get("S3CKPT_EXAMPLE_RUN", f"{bucket}/examples/accelerate")
        print(f"S3 endpoint {os.environ['AWS_ENDPOINT_URL']}, run {run}")
        for epochs in (3, 5):  # each a new process: the second resumes the first
            print(f"$ {os.path.basename(sys.executable)} {__file__} --epochs {epochs}")
            cmd = [sys.executable, __file__, "--epochs", str(epochs), "--run", run]
            subprocess.run(cmd, check=True)
        print(f"$ s3ckpt ls {run}")
        s3ckpt_main(["ls", run])


if __name__ == "__main__":
    main()
