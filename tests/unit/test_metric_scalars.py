"""``metrics={"loss": loss}`` with a tensor: read with ``.detach().item()``, no warning;
a tensor of many elements is a clear error (issue 28)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from s3ckpt import Checkpointer
from s3ckpt.errors import ConfigError
from s3ckpt.format._manifest import check_metrics
from s3ckpt.store import MemoryStore

URL = "s3://unit-bkt/runs/scalars"


def _loss() -> torch.Tensor:
    w = torch.ones(3, requires_grad=True)
    return (w * 0.5).sum()  # 0-d, requires_grad, part of a graph


def test_tensors_and_numpy_scalars_become_floats_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = check_metrics(
            {
                "loss": _loss(),
                "one": torch.tensor([2.0], dtype=torch.bfloat16),
                "steps": torch.tensor(7),
                "np32": np.float32(0.25),
                "np0d": np.array(3.5),
                "nan": torch.tensor(float("nan")),
                "plain": 1,
            }
        )
    assert out["loss"] == 1.5 and out["one"] == 2.0 and out["steps"] == 7.0
    assert out["np32"] == 0.25 and out["np0d"] == 3.5 and out["plain"] == 1.0
    assert math.isnan(out["nan"])  # kept, as a float NaN is: retention ranks it worst
    assert all(type(v) is float for v in out.values())


@pytest.mark.parametrize(
    ("value", "shape"),
    [(torch.zeros(2, 3), "[2, 3]"), (np.arange(4.0), "[4]"), (torch.zeros(0), "[0]")],
)
def test_a_tensor_of_many_elements_is_refused_by_name(value: object, shape: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_metrics({"loss": value})
    message = str(info.value)
    assert f"metric 'loss' must be a scalar, got a {type(value).__name__} of shape {shape}" in (
        message
    )
    assert "loss.item()" in message


def test_a_bool_tensor_is_refused_as_bools_are() -> None:
    with pytest.raises(ConfigError, match="must be a number, got a bool"):
        check_metrics({"done": torch.tensor(True)})


def test_save_and_attach_metrics_take_a_loss_tensor() -> None:
    model = torch.nn.Linear(2, 2)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with Checkpointer(URL, store=MemoryStore("unit-bkt")) as ckpt:
            ckpt.save(1, model, metrics={"loss": _loss()})
            ckpt.attach_metrics(1, {"val_loss": torch.tensor(0.75)})
            (info,) = ckpt.list()
    assert info.metrics == {"loss": 1.5, "val_loss": 0.75}
    assert not [w for w in seen if "requires_grad" in str(w.message)]
    with warnings.catch_warnings(record=True) as seen:  # what the test would miss otherwise
        warnings.simplefilter("always")
        float(_loss())
    assert [w for w in seen if "requires_grad" in str(w.message)]
