"""The mistakes of a new user's load against the moto server over HTTP (issue 28, items 12
and 14): a checkpoint's URL, a misspelt run, a model of another shape or with other keys;
and on two ranks (gloo), every rank raises the same error (no rank hangs in a collective).
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from s3ckpt import Checkpointer, ConfigError
from s3ckpt.errors import StateMismatchError
from tests._helpers import list_keys
from tests._http import free_port
from tests._spawn import run_ranks

pytestmark = [pytest.mark.integration]


def _model(layers: int = 2, width: int = 4) -> torch.nn.Sequential:
    torch.manual_seed(layers + width)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def _save(run: str, step: int = 10) -> torch.nn.Sequential:
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    with Checkpointer(run) as ckpt:
        ckpt.save(step, model, opt)
    return model


def _snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_a_checkpoint_url_is_refused_for_load_and_save(bucket: str, s3_client) -> None:  # type: ignore[no-untyped-def]
    run = f"s3://{bucket}/runs/llama"
    _save(run)
    keys = list_keys(s3_client, bucket)
    with Checkpointer(f"{run}/step_000000010") as ckpt:
        with pytest.raises(ConfigError) as on_load:
            ckpt.load(_model())
        assert f"Checkpointer('{run}/').load(..., step=10)" in str(on_load.value)
        with pytest.raises(ConfigError, match="would nest checkpoints inside it"):
            ckpt.save(20, _model())
    assert list_keys(s3_client, bucket) == keys  # nothing nested, no pointer written


def test_a_misspelt_run_warns_naming_the_nearest_run(
    bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    _save(f"s3://{bucket}/runs/llama-8b")
    _save(f"s3://{bucket}/runs/mistral")
    model = _model()
    before = _snapshot(model)
    with (
        caplog.at_level(logging.WARNING, logger="s3ckpt"),
        Checkpointer(f"s3://{bucket}/runs/llama-8B-v2") as ckpt,
    ):
        assert ckpt.load(model) is None
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert f"nothing to resume at s3://{bucket}/runs/llama-8B-v2/" in caplog.text
    assert f"near it: s3://{bucket}/runs/llama-8b/, s3://{bucket}/runs/mistral/" in caplog.text


def test_shape_and_key_mismatches_are_s3ckpt_errors_and_change_nothing(bucket: str) -> None:
    run = f"s3://{bucket}/run"
    saved = _save(run)
    wider = _model(width=5)
    before = _snapshot(wider)
    with Checkpointer(run) as ckpt:
        with pytest.raises(StateMismatchError) as info:
            ckpt.load(wider, torch.optim.AdamW(wider.parameters()))
        assert isinstance(info.value, Exception)
        assert "model.0.weight saved (4, 4), expected (5, 5)" in str(info.value)
        assert f"s3://{bucket}/run/step_000000010/.metadata" in str(info.value)
        assert all(torch.equal(v, before[k]) for k, v in wider.state_dict().items())

        deeper = _model(layers=3)
        with pytest.raises(StateMismatchError, match=r"2 key\(s\) missing from the checkpoint"):
            ckpt.load(deeper)
        shallower = _model(layers=1)
        with pytest.raises(StateMismatchError) as info:
            ckpt.load(shallower)
        assert info.value.unexpected == ["model.1.weight", "model.1.bias"]
        assert ckpt.load(deeper, strict=False) == 10
    assert torch.equal(deeper[1].weight, saved[1].weight)


# -- two ranks --------------------------------------------------------------------------------


def _worker(rank: int, world: int, port: int, run: str, out: str) -> None:
    """Each scenario on every rank; what each raised goes to ``out/rank{rank}.json``."""
    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    result: dict[str, Any] = {}

    def attempt(name: str, fn: Any) -> None:
        try:
            result[name] = {"returned": fn()}
        except Exception as exc:
            result[name] = {
                "type": type(exc).__name__,
                "rank": getattr(exc, "rank", None),
                "message": str(exc),
            }

    try:
        full = _model()
        with Checkpointer(run) as ckpt:
            ckpt.save(10, full)
            # Only rank 1's model is wider: every rank must raise, none may wait.
            attempt("one_rank_differs", lambda: ckpt.load(_model(width=5) if rank else _model()))
            # Pipeline stages: each rank holds one layer; no key is unexpected for the group.
            stage = torch.nn.Sequential(
                *[_model()[i] if i == rank else torch.nn.Identity() for i in range(2)]
            )
            attempt("pipeline_stages", lambda: ckpt.load(stage))
            # No rank holds layer 1: unexpected for the group.
            first = torch.nn.Sequential(_model()[0])
            attempt("nobody_holds_a_layer", lambda: ckpt.load(first))
        with Checkpointer(f"{run}/step_000000010") as wrong:
            attempt("checkpoint_url", lambda: wrong.load(_model()))
    finally:
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
        dist.destroy_process_group()


def test_on_two_ranks_every_rank_raises_the_same_error(bucket: str, tmp_path: Path) -> None:
    run = f"s3://{bucket}/ranks"
    run_ranks(_worker, 2, (2, free_port(), run, str(tmp_path)))
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for got in ranks:
        differs = got["one_rank_differs"]
        assert differs["type"] == "StateMismatchError" and differs["rank"] == 1
        assert "model.0.weight saved (4, 4), expected (5, 5)" in differs["message"]
        assert got["pipeline_stages"] == {"returned": 10}
        nobody = got["nobody_holds_a_layer"]
        assert nobody["type"] == "StateMismatchError"
        assert "2 key(s) of the checkpoint not in the model: model.1." in nobody["message"]
        assert "model.1.weight" in nobody["message"] and "model.1.bias" in nobody["message"]
        assert got["checkpoint_url"]["type"] == "ConfigError"
        assert f"Checkpointer('{run}/').load(..., step=10)" in got["checkpoint_url"]["message"]
