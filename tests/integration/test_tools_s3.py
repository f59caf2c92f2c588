"""The tools over HTTP against the moto S3 server, mostly through the ``s3ckpt`` command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors.torch as st
import torch
import torch.distributed.checkpoint as dcp

from s3ckpt import S3StorageReader, S3StorageWriter
from s3ckpt._cli import EXIT_OK, EXIT_PARTIAL
from s3ckpt.cli import main
from s3ckpt.errors import IncompleteRestoreError
from s3ckpt.tools import load_verified
from tests._helpers import SMALL, boto_get, committed_manifest, list_keys

pytestmark = pytest.mark.integration


def state(bump: float = 0.0) -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "model": {
            "embed.weight": torch.randn(512, 512, generator=g),  # 1 MiB
            "layers.0.attn.w": torch.randn(512, 1024, generator=g) + bump,  # 2 MiB
            "layers.0.attn.b": torch.randn(1024, generator=g).to(torch.bfloat16),
            "norm.weight": torch.ones(512),
        },
        "optim": {"state": {"embed.weight": {"exp_avg": torch.randn(512, 512, generator=g)}}},
        "train_state": {"step": 10},
    }


def save(url: str, sd: dict, **kw: object) -> None:
    dcp.save(sd, storage_writer=S3StorageWriter(url, transfer_config=SMALL, **kw), no_dist=True)  # type: ignore[arg-type]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_inspect_cli(bucket: str, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"s3://{bucket}/run/step_10"
    save(url, state(), step=10, metrics={"loss": 1.25})
    code, out, _ = run(capsys, "inspect", url, "--json")
    assert code == EXIT_OK
    doc = json.loads(out)
    assert doc["step"] == 10 and doc["metrics"] == {"loss": 1.25} and doc["world_size"] == 1
    names = {t["name"]: t for t in doc["tensors"]}
    assert names["model.layers.0.attn.w"]["shape"] == [512, 1024]
    assert names["model.layers.0.attn.b"]["dtype"] == "bfloat16"
    code, out, _ = run(capsys, "inspect", url)
    assert code == EXIT_OK and "model.layers.0.attn.w" in out and "step" in out
    code, out, _ = run(capsys, "inspect", url, "--summary", "--json")
    summary = json.loads(out)
    assert code == EXIT_OK and "tensors" not in summary
    assert summary["tensor_count"] == len([t for t in doc["tensors"] if t["kind"] == "tensor"])


def test_verify_catches_a_flipped_byte_and_a_truncated_object(
    bucket: str, s3_client, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    url = f"s3://{bucket}/run/step_10"
    save(url, state())
    code, out, _ = run(capsys, "verify", url)
    assert code == EXIT_OK and "OK" in out

    manifest = committed_manifest(boto_get(s3_client, bucket), "run/step_10/")
    rec = next(i for i in manifest.records if i.fqn == "model.layers.0.attn.w")
    key = f"run/step_10/{rec.object}"
    body = bytearray(s3_client.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[rec.start + rec.length // 2] ^= 0x40
    s3_client.put_object(Bucket=bucket, Key=key, Body=bytes(body))
    code, out, err = run(capsys, "verify", url, "--json")
    assert code == EXIT_PARTIAL
    doc = json.loads(out)
    assert doc["bad_items"] == ["model.layers.0.attn.w"] and doc["bad_objects"] == [rec.object]
    assert doc["problems"][0]["kind"] == "checksum"
    assert "1 problem: 1 bad tensor in 1 object;" in err

    # Truncate another object: the tensors in its lost tail are named.
    other = next(o for o in manifest.objects if o.name != rec.object and o.size > 1024)
    okey = f"run/step_10/{other.name}"
    head = s3_client.get_object(Bucket=bucket, Key=okey)["Body"].read()[: other.size // 2]
    s3_client.put_object(Bucket=bucket, Key=okey, Body=head)
    lost = {
        i.fqn for i in manifest.records if i.object == other.name and i.start + i.length > len(head)
    }
    code, out, err = run(capsys, "verify", url)
    assert code == EXIT_PARTIAL
    assert "truncated" in out and other.name in out
    for fqn in lost | {"model.layers.0.attn.w"}:
        assert fqn in out
    assert "bad tensors:" in out


def test_diff_cli_finds_exactly_the_changed_tensors(
    bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = f"s3://{bucket}/run/step_10", f"s3://{bucket}/run/step_20"
    save(a, state())
    changed = state(bump=0.5)
    changed["model"]["norm.weight"][7] = 3.0
    changed["train_state"]["step"] = 20
    del changed["optim"]
    save(b, changed)
    code, out, _ = run(capsys, "diff", a, b, "--json", "--exit-code")
    assert code == EXIT_PARTIAL
    doc = json.loads(out)
    status = {e["name"]: e["status"] for e in doc["entries"] if e["status"] != "identical"}
    assert status == {
        "model.layers.0.attn.w": "changed",
        "model.norm.weight": "changed",
        "optim.state.embed.weight.exp_avg": "only_in_a",
        "train_state.step": "changed",
    }
    attn = next(e for e in doc["entries"] if e["name"] == "model.layers.0.attn.w")
    assert attn["max_abs_diff"] == pytest.approx(0.5, rel=1e-5)
    assert attn["mean_abs_diff"] == pytest.approx(0.5, rel=1e-5)
    same = [e for e in doc["entries"] if e["status"] == "identical"]
    assert {e["name"] for e in same} == {"model.embed.weight", "model.layers.0.attn.b"}
    assert all(e["method"] == "checksum" for e in same)
    code, out, _ = run(capsys, "diff", a, b, "--include", "model.*", "--exclude", "*.w")
    assert code == EXIT_OK and "model.norm.weight" in out and "attn.w" not in out


def test_export_then_load_file_equals_the_original(
    bucket: str, s3_client, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    url = f"s3://{bucket}/run/step_10"
    sd = state()
    save(url, sd)
    dest = f"s3://{bucket}/hf/model"
    code, out, _ = run(
        capsys, "export", url, dest, "--only", "model", "--max-shard-size", "2MB", "--json"
    )
    assert code == EXIT_OK, out
    res = json.loads(out)
    keys = list_keys(s3_client, bucket, "hf/model/")
    n = len(res["files"]) - 1
    assert n >= 2 and len(keys) == n + 1 and "hf/model/model.safetensors.index.json" in keys
    loaded: dict = {}
    for key in keys:
        local = tmp_path / key.rsplit("/", 1)[1]
        s3_client.download_file(bucket, key, str(local))
        if local.suffix == ".safetensors":
            loaded.update(st.load_file(local))
    assert loaded.keys() == sd["model"].keys()
    for name, t in sd["model"].items():
        assert loaded[name].dtype == t.dtype and torch.equal(loaded[name], t), name
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(sd["model"])

    # --format torch, bf16, to a local file.
    code, out, _ = run(
        capsys, "export", url, str(tmp_path / "full.pt"), "--format", "torch", "--dtype", "bf16"
    )
    assert code == EXIT_OK, out
    full = torch.load(tmp_path / "full.pt", weights_only=True)
    assert torch.equal(full["model.embed.weight"], sd["model"]["embed.weight"].bfloat16())
    assert full["train_state.step"] == 10


def test_import_from_s3_then_load_gives_the_original(
    bucket: str, s3_client, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    model = state()["model"]
    names = sorted(model)
    st.save_file({k: model[k] for k in names[:2]}, tmp_path / "model-00001-of-00002.safetensors")
    st.save_file({k: model[k] for k in names[2:]}, tmp_path / "model-00002-of-00002.safetensors")
    for f in tmp_path.glob("*.safetensors"):
        s3_client.upload_file(str(f), bucket, f"hf/{f.name}")
    dest = f"s3://{bucket}/run/step_0"
    code, out, _ = run(capsys, "import", f"s3://{bucket}/hf", dest, "--step", "0")
    assert code == EXIT_OK, out
    assert "imported 4 tensors" in out
    restored = {"model": {k: torch.zeros_like(v) for k, v in model.items()}}
    dcp.load(restored, storage_reader=S3StorageReader(dest), no_dist=True)
    for k, v in model.items():
        assert torch.equal(restored["model"][k], v), k
    # Local (memory-mapped) import of a single file, and the restore check passes on it.
    code, out, _ = run(
        capsys,
        "import",
        str(tmp_path / "model-00001-of-00002.safetensors"),
        f"s3://{bucket}/run/local",
        "--no-prefix",
    )
    assert code == EXIT_OK, out
    part = {k: torch.zeros_like(model[k]) for k in names[:2]}
    load_verified(part, f"s3://{bucket}/run/local")
    assert all(torch.equal(part[k], model[k]) for k in names[:2])


def test_restore_check_catches_a_missing_key(bucket: str) -> None:
    url = f"s3://{bucket}/run/step_10"
    save(url, state())
    dest = state(bump=1.0)
    dest["model"]["lm_head.weight"] = torch.zeros(8, 8)
    with pytest.raises(IncompleteRestoreError) as info:
        load_verified(dest, url)
    assert info.value.items == ["model.lm_head.weight"]
    assert torch.equal(dest["model"]["layers.0.attn.w"], state()["model"]["layers.0.attn.w"])
