"""torchtitan checkpointing to S3 through s3ckpt: train, get killed, resume exactly.

For each world size (1 and 2 ranks, gloo on CPU): torchtitan's own trainer trains the llama3
debug model with ``S3CheckpointManager`` (async saves every ``--interval`` steps, retention
``KeepLast(2)``); once step ``--kill-after`` has committed, the whole job is SIGKILLed. A
fresh ``torchrun`` then resumes from the newest *committed* step, checks that every tensor
it loaded (model, optimizer, LR scheduler, dataloader, train state, on every rank) equals
the state saved at that step, and trains to ``--steps``. ``s3ckpt ls`` shows the run after
the kill and at the end.

    python examples/torchtitan/run_example.py                # embedded S3 server (moto)

Needs torchtitan (0.3.0), triton (torchtitan imports it even on CPU), moto and s3ckpt, and
no s3fs; see README.md. Exit code 0: every resume was exact.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from s3ckpt.demo import demo_server
from s3ckpt.retention import list_checkpoints

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent


def make_assets(folder: Path) -> tuple[Path, Path]:
    """A byte-level BPE tokenizer (2,000 tokens; the debug model has 2,048 embeddings) and a
    JSON-lines text data set, both made here: nothing is downloaded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer_dir, data_dir = folder / "tokenizer", folder / "data"
    tokenizer_dir.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choices(letters, k=rng.randint(2, 8))) for _ in range(3000)]
    docs = [" ".join(rng.choices(words, k=rng.randint(50, 400))) for _ in range(400)]
    with open(data_dir / "train.jsonl", "w") as f:
        for doc in docs:
            f.write(json.dumps({"text": doc}) + "\n")
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    special = ["<unk>", "<|begin_of_text|>", "<|end_of_text|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=2000,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(docs, trainer)
    tokenizer.save(str(tokenizer_dir / "tokenizer.json"))
    config = {"bos_token": special[1], "eos_token": special[2]}
    (tokenizer_dir / "tokenizer_config.json").write_text(json.dumps(config))
    return tokenizer_dir, data_dir


def committed_steps(url: str) -> list[int]:
    return [c.step for c in list_checkpoints(url) if c.is_committed and c.step is not None]


def s3ckpt_ls(url: str) -> None:
    print(f"$ s3ckpt ls {url}", flush=True)
    subprocess.run([str(BIN / "s3ckpt"), "ls", url], check=False)


def torchrun(world: int, url: str, steps: int, args: argparse.Namespace, log: Path):
    cmd = [
        str(BIN / "torchrun"),
        f"--nproc_per_node={world}",
        str(HERE / "train.py"),
        "--module=s3_config",
        "--config=llama3_debugmodel_s3_cpu",
        f"--hf-assets-path={args.tokenizer}",
        f"--dataloader.dataset-path={args.data}",
        "--training.seq-len=128",
        "--training.local-batch-size=2",
        f"--training.steps={steps}",
        f"--checkpoint.folder={url}",
        f"--checkpoint.interval={args.interval}",
        f"--checkpoint.async-mode={args.async_mode}",
        f"--dump-folder={args.workdir / 'outputs'}",
    ]
    print(f"$ {' '.join(cmd[:4])} ... --training.steps={steps}  (log: {log})", flush=True)
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)


def descendants(pid: int) -> list[int]:
    """``pid``'s child processes, theirs, and so on (Linux /proc): torchrun starts its
    workers in sessions of their own, so killing its process group would miss them."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_job(job: subprocess.Popen) -> None:
    """SIGKILL the torchrun agent and every worker under it, at once, as a node failure
    would."""
    for pid in [*descendants(job.pid), job.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    job.wait()


def show(log: Path, *needles: str) -> None:
    for line in log.read_text().splitlines():
        if any(n in line for n in needles):
            print("   ", line.split(" - ")[-1] if " - " in line else line)


def run_world(world: int, bucket: str, args: argparse.Namespace) -> bool:
    url = f"{bucket}/torchtitan-ws{world}"
    states = args.workdir / f"states-ws{world}"
    states.mkdir(parents=True, exist_ok=True)
    os.environ["S3CKPT_EXAMPLE_STATES"] = str(states)
    print(f"\n=== world size {world}: {url}", flush=True)

    log = args.workdir / f"ws{world}-killed.log"
    job = torchrun(world, url, args.steps, args, log)
    while job.poll() is None and max(committed_steps(url), default=0) < args.kill_after:
        time.sleep(0.5)
    if job.poll() is not None:
        print(f"the job ended before step {args.kill_after} committed; see {log}")
        return False
    kill_job(job)
    done = committed_steps(url)
    print(f"SIGKILLed the job once step {args.kill_after} had committed; committed: {done}")
    show(log, "step: " if world == 1 else "step:  ")
    s3ckpt_ls(url)

    log = args.workdir / f"ws{world}-resumed.log"
    rc = torchrun(world, url, args.steps, args, log).wait()
    print(f"resumed job exited {rc}")
    show(log, "s3ckpt:", "[check]", "Training starts", f"step: {args.steps:2d}")
    s3ckpt_ls(url)
    verdicts = [json.loads((states / f"verdict-rank{r}.json").read_text()) for r in range(world)]
    exact = rc == 0 and all(v["step"] == max(done) and not v["differ"] for v in verdicts)
    for v in verdicts:
        print(
            f"rank {v['rank']}: resumed step {v['step']} (newest committed: {max(done)}), "
            f"{v['tensors']} tensors compared, {len(v['differ'])} differ {v['differ'][:5]}"
        )
    return exact


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--interval", type=int, default=3)
    parser.add_argument("--kill-after", type=int, default=6)
    parser.add_argument("--async-mode", default="async", choices=["disabled", "async"])
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    args.workdir = args.workdir or Path(tempfile.mkdtemp(prefix="s3ckpt-torchtitan-"))
    print(f"s3fs importable: {importlib.util.find_spec('s3fs') is not None}")
    args.tokenizer, args.data = make_assets(args.workdir / "assets")
    os.environ.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(HERE))
    results = {}
    with demo_server("s3ckpt-torchtitan") as bucket:
        for world in args.world_sizes:
            results[world] = run_world(world, bucket, args)
    print()
    for world, exact in results.items():
        print(f"world size {world}: {'exact resume' if exact else 'FAILED'}")
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
