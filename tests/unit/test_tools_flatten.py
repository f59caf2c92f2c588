"""flatten_state_dict / unflatten_state_dict round-trip nested state exactly."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch as st
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as s

from s3ckpt.tools import flatten_state_dict, unflatten_state_dict
from s3ckpt.tools.packing import SCHEMA_KEY


def same(a: Any, b: Any) -> bool:
    """Exact equality: types, container kinds, key order, tensor dtype/shape/bits, NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return (
            a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
        )
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        )
    return bool(a == b)


tensors = s.builds(
    lambda shape, dtype, seed: (
        torch.rand(shape, generator=torch.Generator().manual_seed(seed)) * 100
    ).to(dtype),
    s.lists(s.integers(0, 3), max_size=3).map(tuple),
    s.sampled_from(
        [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.uint8, torch.bool]
    ),
    s.integers(0, 2**16),
)
leaves = s.one_of(
    tensors,
    s.none(),
    s.booleans(),
    s.integers(-(2**70), 2**70),
    s.floats(allow_nan=True, allow_infinity=True),
    s.text(max_size=8),
)
keys = s.one_of(s.text(max_size=6), s.integers(-5, 1000))
trees = s.recursive(
    leaves,
    lambda children: s.one_of(
        s.dictionaries(keys, children, max_size=4),
        s.lists(children, max_size=4),
        s.lists(children, max_size=3).map(tuple),
    ),
    max_leaves=20,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(s.dictionaries(keys, trees, max_size=5))
def test_round_trip_is_exact(tree: dict) -> None:
    flat = flatten_state_dict(tree)
    assert all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in flat.items())
    assert same(unflatten_state_dict(flat), tree)


def adamw_state() -> dict:
    """What ``torch.optim.AdamW(...).state_dict()`` looks like after a step (built by hand:
    constructing a torch optimizer imports torch._dynamo, which costs a minute here)."""
    shapes = [(3, 4), (3,), (3,), (3,)]
    return {
        "state": {
            i: {
                "step": torch.tensor(1.0),
                "exp_avg": torch.randn(shape),
                "exp_avg_sq": torch.rand(shape),
            }
            for i, shape in enumerate(shapes)
        },
        "param_groups": [
            {
                "lr": 1e-3,
                "betas": (0.9, 0.95),
                "eps": 1e-8,
                "weight_decay": 0.01,
                "amsgrad": False,
                "maximize": False,
                "foreach": None,
                "capturable": False,
                "differentiable": False,
                "fused": None,
                "decoupled_weight_decay": True,
                "params": [0, 1, 2, 3],
            }
        ],
    }


def test_optimizer_state_through_a_safetensors_file(tmp_path: Path) -> None:
    model = {"0.weight": torch.randn(3, 4), "0.bias": torch.randn(3)}
    sd = adamw_state()
    flat = flatten_state_dict({"model": model, "optim": sd, "step": 7})
    assert "optim.state.0.exp_avg" in flat and "model.0.weight" in flat
    st.save_file({k: v.contiguous() for k, v in flat.items()}, tmp_path / "o.safetensors")
    back = unflatten_state_dict(st.load_file(tmp_path / "o.safetensors"))
    assert same(back["optim"], sd) and same(back["model"], model) and back["step"] == 7
    assert list(back["optim"]["state"]) == [0, 1, 2, 3]  # int keys stay ints
    assert back["optim"]["param_groups"][0]["betas"] == (0.9, 0.95)


def test_dotted_keys_and_collisions_are_unambiguous() -> None:
    t1, t2, t3 = torch.ones(1), torch.zeros(1), torch.full((1,), 2.0)
    tree = {"a.b": t1, "a": {"b": t2}, SCHEMA_KEY: t3}
    flat = flatten_state_dict(tree)
    assert len(flat) == 4
    assert same(unflatten_state_dict(flat), tree)


def test_unsupported_leaves_are_named() -> None:
    with pytest.raises(TypeError, match=r"'opt.x'"):
        flatten_state_dict({"opt": {"x": object()}})
    with pytest.raises(TypeError, match="dict keys must be str or int"):
        flatten_state_dict({"opt": {(1, 2): 3}})


def test_flat_dicts_without_a_schema_split_on_dots() -> None:
    t = torch.ones(2)
    assert unflatten_state_dict({"a.b": t, "c": t}) == {"a": {"b": t}, "c": t}


def test_objects_keeps_other_leaves_under_their_own_names() -> None:
    import pathlib

    tree = {"hp": {"dir": pathlib.PurePosixPath("/d"), "n": 3}, "w": torch.ones(2)}
    with pytest.raises(TypeError, match="PurePosixPath"):
        flatten_state_dict(tree)
    flat = flatten_state_dict(tree, objects=True)
    assert flat["hp.dir"] == pathlib.PurePosixPath("/d")
    back = unflatten_state_dict(flat)
    assert back["hp"] == {"dir": pathlib.PurePosixPath("/d"), "n": 3}
    assert torch.equal(back["w"], tree["w"])
