"""A plain training loop that checkpoints to S3 with s3ckpt.Checkpointer, and resumes.

Trains a tiny model three times: uninterrupted; stopped part-way, as if the job had been
killed; and resumed from that run's latest checkpoint in a fresh process. The resumed run
must reproduce the uninterrupted one bit for bit: the same loss at every step, the same
final weights.

    python examples/plain_loop.py                          # on an embedded S3 server (moto)
    python examples/plain_loop.py --url s3://bucket/runs   # on your bucket
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import uuid
import warnings
from concurrent.futures import ProcessPoolExecutor

import torch

from s3ckpt import Checkpointer
from s3ckpt.demo import demo_server
from s3ckpt.retention import KeepLast

# DCP says on every save and load that it runs in a single process: here, that is the intent.
warnings.filterwarnings("ignore", "torch.distributed is disabled")


class TrainState:
    """What a resumed run needs besides model and optimizer: the step and the data RNG."""

    def __init__(self) -> None:
        self.step = 0
        self.data_rng = torch.Generator().manual_seed(1234)

    def state_dict(self) -> dict:
        return {"step": self.step, "data_rng": self.data_rng.get_state()}

    def load_state_dict(self, sd: dict) -> None:
        self.step = sd["step"]
        self.data_rng.set_state(sd["data_rng"])


def train(url: str, steps: int, every: int, stop_after: int | None = None):
    """Resume from the latest checkpoint under ``url`` (if any) and train up to ``steps``.

    Async-saves every ``every`` steps, saves the last step synchronously, keeps the two
    newest checkpoints. Returns the step it resumed from, ``{step: loss}``, the weights.
    """
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    state = TrainState()
    losses = {}
    with Checkpointer(url, policy=KeepLast(2)) as ckpt:
        resumed = ckpt.load(model, opt, state, step="latest")  # None: nothing saved yet
        name = url.rpartition("/")[2]
        print(f"  {name}: " + ("fresh start" if resumed is None else f"resumed from {resumed}"))
        handle = None
        for step in range(state.step + 1, steps + 1):
            x = torch.randn(16, 32, generator=state.data_rng)
            loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True).sin())
            loss.backward()
            if handle is not None:
                handle.staged.result()  # the async save has copied the weights: change them
            opt.step()
            opt.zero_grad()
            state.step, losses[step] = step, loss.item()
            if step == steps:  # returns once the checkpoint is durable
                ckpt.save(step, model, opt, state, metrics={"loss": loss.item()})
            elif step % every == 0:  # uploads in the background while training goes on
                handle = ckpt.async_save(step, model, opt, state, metrics={"loss": loss.item()})
            if step == stop_after:
                print(f"  stopped after step {step}")
                break
        ckpt.wait()  # the last save has committed and retention has run after it
        kept = [c.name for c in ckpt.list() if c.state == "committed"]
        print(f"  checkpoints kept by KeepLast(2): {', '.join(kept)}")
    return resumed, losses, model.state_dict()


def in_fresh_process(fn, *args):
    """``fn(*args)`` in a new Python process: it shares nothing with this one but the bucket."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="run prefix, s3://bucket/prefix (default: embedded S3)")
    parser.add_argument("--steps", type=int, default=10, help="training steps (default 10)")
    parser.add_argument("--every", type=int, default=3, help="async-save every N steps (3)")
    args = parser.parse_args()
    stop_after = max(1, args.steps - 2)

    # No --url: a bucket on the server AWS_ENDPOINT_URL names or, without one, on an
    # embedded S3 server (moto, on 127.0.0.1) that runs until the block ends.
    with contextlib.nullcontext(args.url) if args.url else demo_server() as bucket:
        base = f"{bucket}/plain-loop-{uuid.uuid4().hex[:6]}"
        print(f"S3 endpoint {os.environ.get('AWS_ENDPOINT_URL', '(AWS)')}, runs under {base}")

        print("1. uninterrupted")
        _, expected, expected_weights = train(f"{base}/uninterrupted", args.steps, args.every)
        print(f"2. interrupted after step {stop_after}")
        _, first, _ = train(f"{base}/interrupted", args.steps, args.every, stop_after)
        print("3. the interrupted run, resumed in a fresh process")
        resumed, second, weights = in_fresh_process(
            train, f"{base}/interrupted", args.steps, args.every
        )

    print("step  uninterrupted  interrupted  resumed")
    for step, loss in expected.items():
        a, b = (f"{run[step]:.6f}" if step in run else "" for run in (first, second))
        print(f"{step:4d}  {loss:<13.6f}  {a:<11}  {b}")
    same_losses = all(run[s] == expected[s] for run in (first, second) for s in run)
    same_weights = weights.keys() == expected_weights.keys() and all(
        torch.equal(w, expected_weights[k]) for k, w in weights.items()
    )
    if resumed is not None and same_losses and same_weights:
        print(f"OK: resumed from step {resumed}, matches the uninterrupted run bit for bit")
        return 0
    print(
        f"FAILED: resumed from step {resumed}, losses same: {same_losses}, weights same: "
        f"{same_weights}"
    )
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
