"""Lightning on S3 with s3ckpt: train, save (top-k + last), resume in a fresh process.

    python examples/lightning_train.py                      # world size 1, embedded S3 server
    python examples/lightning_train.py --devices 2          # DDP on 2 CPU processes (gloo)
    python examples/lightning_train.py --devices 2 --strategy model_parallel   # FSDP2 shards

Without AWS_ENDPOINT_URL, an embedded S3 server (moto) is started on 127.0.0.1. The script
runs three fresh processes: an uninterrupted run of ``--epochs`` epochs, a run stopped
halfway, and a resume from ``ckpt_path="last"`` to the end. It then checks that the resumed
run's final weights and optimizer state equal the uninterrupted run's exactly, and lists
the run's checkpoints. One phase alone: ``--phase train --url s3://bucket/prefix``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch


def build_module(width: int = 16):  # type: ignore[no-untyped-def]
    import lightning.pytorch as pl

    class Regressor(pl.LightningModule):
        def __init__(self, width: int, data_dir: Path) -> None:
            super().__init__()
            # A pathlib.Path among the hyperparameters: loads through s3ckpt's safe loader.
            self.save_hyperparameters()
            self.width = width
            self.net: torch.nn.Module = torch.nn.Sequential(
                torch.nn.Linear(8, width), torch.nn.Tanh(), torch.nn.Linear(width, 1)
            )

        def configure_model(self) -> None:
            # Sharded strategy: shard each linear layer, then the root (FSDP2).
            if self.device_mesh is None or isinstance(self.net, torch.distributed.fsdp.FSDPModule):
                return
            from torch.distributed.fsdp import fully_shard

            mesh = self.device_mesh["data_parallel"]
            for layer in self.net:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer, mesh=mesh)
            fully_shard(self.net, mesh=mesh)

        def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y), sync_dist=True)

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
            return [opt], [sched]

    return Regressor(width, Path("/data/regression"))


def loaders():  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=g)
    y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(256, 1, generator=g)
    ds = torch.utils.data.TensorDataset(x, y)
    train = torch.utils.data.DataLoader(ds, batch_size=32, shuffle=False)
    val = torch.utils.data.DataLoader(ds, batch_size=64)
    return train, val


def train(args: argparse.Namespace) -> None:
    import lightning.pytorch as pl

    from s3ckpt.lightning import S3CheckpointIO, S3ModelCheckpoint, S3ModelParallelStrategy
    from s3ckpt.retention import KeepBest, KeepLast

    pl.seed_everything(0, workers=True)
    strategy: object = "auto" if args.devices == 1 else "ddp"
    if args.strategy == "model_parallel":
        strategy = S3ModelParallelStrategy(data_parallel_size=args.devices, tensor_parallel_size=1)
    checkpoint = S3ModelCheckpoint(  # ModelCheckpoint that needs no s3fs for s3://
        dirpath=args.url,
        monitor="val_loss",
        save_top_k=2,
        save_last=True,
        every_n_epochs=1,
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=strategy,  # type: ignore[arg-type]
        max_epochs=args.epochs,
        callbacks=[checkpoint],
        plugins=[S3CheckpointIO(policy=KeepLast(2) | KeepBest(2, "val_loss"))],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
    )
    model = build_module()
    train_loader, val_loader = loaders()
    trainer.fit(model, train_loader, val_loader, ckpt_path="last" if args.resume else None)
    trainer.strategy.checkpoint_io.teardown()  # let the last retention pass finish
    # Gathering sharded (FSDP2) state is a collective: every rank takes part, rank 0 writes.
    if args.out and (trainer.is_global_zero or args.strategy == "model_parallel"):
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        net = trainer.lightning_module.net
        opt = trainer.optimizers[0]
        state = {
            "model": get_model_state_dict(net, options=full),
            "optim": get_optimizer_state_dict(net, opt, options=full),
            "step": trainer.global_step,
        }
        if trainer.is_global_zero:
            torch.save(state, args.out)


def compare(a: str, b: str) -> int:
    """Number of differing tensors between two saved states (0: identical)."""
    sa, sb = torch.load(a), torch.load(b)
    diffs = 0

    def walk(x: object, y: object, path: str) -> None:
        nonlocal diffs
        if isinstance(x, torch.Tensor):
            if not (isinstance(y, torch.Tensor) and torch.equal(x, y)):
                print(f"  differs: {path}")
                diffs += 1
        elif isinstance(x, dict):
            assert isinstance(y, dict) and x.keys() == y.keys(), path
            for k in x:
                walk(x[k], y[k], f"{path}.{k}")
        elif isinstance(x, (list, tuple)):
            assert isinstance(y, (list, tuple)) and len(x) == len(y), path
            for i, (u, v) in enumerate(zip(x, y, strict=True)):
                walk(u, v, f"{path}.{i}")
        elif x != y:
            print(f"  differs: {path}: {x!r} != {y!r}")
            diffs += 1

    walk(sa, sb, "")
    return diffs


def run_all(args: argparse.Namespace) -> int:
    from s3ckpt.demo import demo_server

    server = contextlib.nullcontext(args.url) if args.url else demo_server("lightning-example")
    with server as base, tempfile.TemporaryDirectory() as tmp:

        def phase(url: str, epochs: int, resume: bool, out: str) -> None:
            cmd = [
                sys.executable,
                __file__,
                "--phase",
                "train",
                "--url",
                url,
                "--epochs",
                str(epochs),
                "--devices",
                str(args.devices),
                "--strategy",
                args.strategy,
                "--out",
                out,
            ]
            if resume:
                cmd.append("--resume")
            print("$", " ".join(cmd[1:]), flush=True)
            subprocess.run(cmd, check=True)

        whole, part = f"{base}/uninterrupted", f"{base}/resumed"
        phase(whole, args.epochs, False, f"{tmp}/whole.pt")
        phase(part, args.epochs // 2, False, f"{tmp}/half.pt")
        phase(part, args.epochs, True, f"{tmp}/resumed.pt")
        diffs = compare(f"{tmp}/whole.pt", f"{tmp}/resumed.pt")
        print(f"resumed run vs uninterrupted run: {diffs} differences")
        from s3ckpt.cli import main as s3ckpt_command

        s3ckpt_command(["ls", part])
        return 0 if diffs == 0 else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--phase", choices=["all", "train"], default="all")
    p.add_argument("--url", help="run prefix (default: the embedded server)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--strategy", choices=["ddp", "model_parallel"], default="ddp")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--out")
    args = p.parse_args()
    if args.phase == "train":
        train(args)
        return 0
    return run_all(args)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
