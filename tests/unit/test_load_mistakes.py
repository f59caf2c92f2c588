"""The mistakes of a new user's load, on MemoryStore: none may silently restart training.

A checkpoint's URL given as the run, a misspelt run, a model of another shape, a model
with other keys (issue 28, items 12 and 14).
"""

from __future__ import annotations

import logging
import pickle
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from s3ckpt import Checkpointer, ConfigError, S3CkptError
from s3ckpt.dcp import S3StorageReader
from s3ckpt.dcp.restore import check_state_dict
from s3ckpt.errors import AccessDeniedError, CheckpointError, StateMismatchError, find_s3ckpt_error
from s3ckpt.store import MemoryStore

BUCKET = "unit-bkt"
RUN = f"s3://{BUCKET}/runs/llama"
STEP_URL = f"{RUN}/step_000000010"


def _model(width: int = 4, layers: int = 2) -> torch.nn.Sequential:
    torch.manual_seed(width * 10 + layers)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def _saved(store: MemoryStore, run: str = RUN, step: int = 10) -> torch.nn.Sequential:
    """A model and its AdamW state saved at ``step`` of ``run``; the model is returned."""
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    with Checkpointer(run, store=store) as ckpt:
        ckpt.save(step, model, opt)
    return model


def _snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _unchanged(model: torch.nn.Module, before: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


# -- item 12: a checkpoint's URL given as the run -------------------------------------------


@pytest.mark.parametrize("step", ["latest", 10])
def test_load_from_a_checkpoint_url_raises_naming_the_run_and_step(step: Any) -> None:
    store = MemoryStore(BUCKET)
    _saved(store)
    model = _model()
    before = _snapshot(model)
    with (
        Checkpointer(STEP_URL, store=store) as ckpt,
        pytest.raises(ConfigError) as info,
    ):
        ckpt.load(model, step=step)
    message = str(info.value)
    assert "is a committed checkpoint, not a run" in message
    assert f"Checkpointer('{RUN}/').load(..., step=10)" in message
    assert _unchanged(model, before)


def test_save_to_a_checkpoint_url_raises_and_writes_nothing() -> None:
    store = MemoryStore(BUCKET)
    _saved(store)
    keys = sorted(o.key for o in store.list(""))
    with Checkpointer(STEP_URL, store=store) as ckpt:
        with pytest.raises(ConfigError, match=r"would nest checkpoints inside it") as info:
            ckpt.save(11, _model())
        assert f"Checkpointer('{RUN}/')" in str(info.value)
        with pytest.raises(ConfigError, match="not a run"):
            ckpt.async_save(11, _model())
    assert sorted(o.key for o in store.list("")) == keys


def test_a_stock_dcp_checkpoint_url_raises_and_says_how_to_read_it() -> None:
    store = MemoryStore(BUCKET)
    store.put("exports/final/.metadata", b"torch's pickled Metadata")
    with (
        Checkpointer(f"s3://{BUCKET}/exports/final", store=store) as ckpt,
        pytest.raises(ConfigError, match=r"a DCP checkpoint \(\.metadata\)") as info,
    ):
        ckpt.load(_model())
    assert "S3StorageReader('s3://unit-bkt/exports/final/')" in str(info.value)


def test_the_run_url_is_checked_once_per_checkpointer_before_its_first_save() -> None:
    store = MemoryStore(BUCKET)
    model = _model()
    with Checkpointer(RUN, store=store) as ckpt:
        ckpt.save(1, model)
        # A HEAD of the run's own marker key now fails: the second save must not ask.
        probe = store.inject("head", key_glob="runs/llama/s3ckpt.json", times=1)
        ckpt.save(2, model)
        assert probe.hits == 0
        assert ckpt.load(_model()) == 2
    with Checkpointer(RUN, store=store) as fresh, pytest.raises(S3CkptError, match="injected"):
        fresh.save(3, model)  # a new Checkpointer checks before its first save


# -- item 12: a misspelt run ----------------------------------------------------------------


def test_misspelt_run_returns_none_and_warns_naming_the_nearest_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore(BUCKET)
    _saved(store)
    _saved(store, f"s3://{BUCKET}/runs/gpt2-small")
    model = _model()
    before = _snapshot(model)
    with (
        caplog.at_level(logging.WARNING, logger="s3ckpt"),
        Checkpointer(f"s3://{BUCKET}/runs/lama", store=store) as ckpt,
    ):
        assert ckpt.load(model) is None
        assert ckpt.latest() is None  # reported once per Checkpointer
    assert _unchanged(model, before)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    text = warnings[0].getMessage()
    assert "nothing to resume at s3://unit-bkt/runs/lama/" in text
    # nearest first: llama is one edit away, gpt2-small many
    assert text.index(f"{RUN}/") < text.index(f"s3://{BUCKET}/runs/gpt2-small/")


def test_a_typo_one_level_up_finds_the_run(caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryStore(BUCKET)
    _saved(store)
    with (
        caplog.at_level(logging.WARNING, logger="s3ckpt"),
        Checkpointer(f"s3://{BUCKET}/runz/llama", store=store) as ckpt,
    ):
        assert ckpt.load(_model()) is None
    assert f"near it: {RUN}/" in caplog.text


def test_the_folder_of_runs_given_as_the_run_names_its_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore(BUCKET)
    _saved(store)
    with (
        caplog.at_level(logging.WARNING, logger="s3ckpt"),
        Checkpointer(f"s3://{BUCKET}/runs", store=store) as ckpt,
    ):
        assert ckpt.load(_model()) is None
    assert f"near it: {RUN}/" in caplog.text


def test_a_new_run_in_an_empty_bucket_warns_nothing(caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryStore(BUCKET)
    store.put("datasets/shard-0.bin", b"not a checkpoint")
    with (
        caplog.at_level(logging.WARNING, logger="s3ckpt"),
        Checkpointer(RUN, store=store) as ckpt,
    ):
        assert ckpt.load(_model()) is None
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_run_with_only_an_uncommitted_save_is_no_typo(caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryStore(BUCKET)
    _saved(store, f"s3://{BUCKET}/runs/llama-old")
    store.put("runs/llama/step_000000005/__0_0.distcp", b"a save killed before its commit")
    with (
        caplog.at_level(logging.WARNING, logger="s3ckpt"),
        Checkpointer(RUN, store=store) as ckpt,
    ):
        assert ckpt.load(_model()) is None
    assert "nothing to resume" not in caplog.text


def test_a_denied_listing_around_the_run_never_fails_the_load(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore(BUCKET)
    _saved(store)
    # The role may list its own run but not the folder of runs around it.
    store.inject(
        "list",
        lambda key: AccessDeniedError("denied", bucket=BUCKET, key=key),
        key_glob="runs/",
        times=10,
    )
    with (
        caplog.at_level(logging.DEBUG, logger="s3ckpt"),
        Checkpointer(f"s3://{BUCKET}/runs/lama", store=store) as ckpt,
    ):
        assert ckpt.load(_model()) is None
    assert "could not look for runs near s3://unit-bkt/runs/lama/" in caplog.text


# -- item 14: a model of another shape or with other keys ------------------------------------


def test_shape_mismatch_is_an_s3ckpt_error_naming_key_and_both_shapes_and_changes_nothing() -> None:
    store = MemoryStore(BUCKET)
    _saved(store)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 6))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    before = _snapshot(model)
    with Checkpointer(RUN, store=store) as ckpt, pytest.raises(Exception) as info:
        ckpt.load(model, opt)
    err = info.value
    assert isinstance(err, StateMismatchError)
    assert isinstance(err, CheckpointError) and isinstance(err, S3CkptError)
    message = str(err)
    assert "model.1.weight saved (4, 4), expected (6, 4)" in message
    assert "model.1.bias saved (4,), expected (6,)" in message
    assert "s3://unit-bkt/runs/llama/step_000000010/.metadata" in message
    assert "Nothing was loaded" in message and "strict=False" not in message
    assert err.item == "model.1.weight"
    assert err.shapes["model.1.weight"] == ((4, 4), (6, 4))
    assert err.shapes["optim.state.1.weight.exp_avg"] == ((4, 4), (6, 4))
    assert _unchanged(model, before)
    assert opt.state_dict()["state"] == {} or all(
        not torch.count_nonzero(t)
        for s in opt.state_dict()["state"].values()
        for t in s.values()
        if torch.is_tensor(t) and t.dim()
    )
    again = pickle.loads(pickle.dumps(err))  # DCP gathers errors across ranks
    assert type(again) is StateMismatchError and again.shapes == err.shapes


def test_shape_mismatch_with_verify_complete_fills_nothing_with_nan() -> None:
    store = MemoryStore(BUCKET)
    _saved(store)
    model = _model(width=4, layers=2)
    model[1] = torch.nn.Linear(4, 3)
    before = _snapshot(model)
    with Checkpointer(RUN, store=store) as ckpt, pytest.raises(StateMismatchError):
        ckpt.load(model, verify_complete=True)
    assert _unchanged(model, before)


def test_missing_and_unexpected_keys_are_listed_with_counts() -> None:
    store = MemoryStore(BUCKET)
    _saved(store)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))  # the checkpoint has layer 1 too
    with Checkpointer(RUN, store=store) as ckpt, pytest.raises(StateMismatchError) as info:
        ckpt.load(model)
    err = info.value
    assert err.unexpected == ["model.1.weight", "model.1.bias"] and not err.missing
    assert "2 key(s) of the checkpoint not in the model: model.1.weight, model.1.bias" in str(err)
    assert "strict=False" in str(err)

    wide = _model(width=4, layers=9)  # layers 2..8 are not in the checkpoint
    with Checkpointer(RUN, store=store) as ckpt, pytest.raises(StateMismatchError) as info:
        ckpt.load(wide)
    err = info.value
    assert len(err.missing) == 14 and err.item == "model.2.weight"
    assert "14 key(s) missing from the checkpoint: model.2.weight, model.2.bias," in str(err)
    assert "(and 9 more)" in str(err)


def test_strict_false_loads_the_keys_both_have() -> None:
    store = MemoryStore(BUCKET)
    saved = _saved(store)
    model = _model(width=4, layers=3)  # a new last layer, as for fine-tuning
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    new_layer = _snapshot(model[2])
    with Checkpointer(RUN, store=store) as ckpt:
        assert ckpt.load(model, opt, strict=False) == 10
    for i in (0, 1):
        assert torch.equal(model[i].weight, saved[i].weight)
    assert _unchanged(model[2], new_layer)
    shrunk = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with Checkpointer(RUN, store=store) as ckpt:
        assert ckpt.load(shrunk, strict=False) == 10
    assert torch.equal(shrunk[0].weight, saved[0].weight)
    other = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Linear(5, 4))
    with (
        Checkpointer(RUN, store=store) as ckpt,
        pytest.raises(
            StateMismatchError, match=r"model.0.weight saved \(4, 4\), expected \(5, 4\)"
        ),
    ):
        ckpt.load(other, strict=False)  # shapes are checked either way


def test_check_state_dict_on_its_own_and_the_reader_path() -> None:
    store = MemoryStore(BUCKET)
    _saved(store)
    reader = S3StorageReader(STEP_URL, store=store)
    sd = {"model": torch.nn.Linear(4, 5).state_dict()}
    with pytest.raises(StateMismatchError) as info:
        check_state_dict(sd, reader.metadata, url=reader.url)
    assert "model.weight" in info.value.missing  # the saved names are model.0.*, model.1.*
    fits = {"model": _model().state_dict()}
    check_state_dict(fits, reader.metadata, unexpected_under=("model",))  # no error


class _NoSizeCheckPlanner(DefaultLoadPlanner):
    """A planner that plans reads without torch's size check (a framework's own planner)."""

    def create_local_plan(self) -> Any:
        from torch.distributed.checkpoint.planner import LoadPlan
        from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

        requests = []
        for fqn in self.state_dict:
            md = self.metadata.state_dict_metadata[fqn]
            chunks = md.chunks
            requests += create_read_items_for_chunk_list(fqn, md, chunks)
        return LoadPlan(requests)


def test_the_reader_names_a_mismatch_a_planner_let_through() -> None:
    store = MemoryStore(BUCKET)
    _saved(store)
    sd = {"model": {"0.weight": torch.zeros(4, 4), "1.weight": torch.zeros(2, 4)}}
    with pytest.raises(BaseException) as info:  # DCP wraps it: CheckpointException
        dcp.load(
            sd,
            storage_reader=S3StorageReader(STEP_URL, store=store),
            planner=_NoSizeCheckPlanner(),
        )
    err = find_s3ckpt_error(info.value)
    assert isinstance(err, StateMismatchError)
    assert err.item == "model.1.weight"
    assert err.shapes == {"model.1.weight": ((4, 4), (2, 4))}
