"""The retention cron's deployments under deploy/: what a linter cannot know.

The image (deploy/cron/Dockerfile) runs as a non-root user and builds from files the build
context holds; the Kubernetes CronJob (deploy/kubernetes/cronjob.yaml) and the ECS task
(deploy/ecs/main.tf) run as the terraform module's pruner role, never two at once
(Kubernetes) and on a read-only root filesystem; and the commands each of them runs, found by
running the image's entry point (deploy/cron/s3ckpt-cron) with their settings and a stand-in
``s3ckpt`` that records its arguments, parse as ``s3ckpt`` invocations with a policy that
exists. scripts/check-deploy.sh runs the linters (hadolint, shellcheck, yamllint, terraform).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest
import yaml

from s3ckpt.cli import build_parser
from s3ckpt.retention import load_policy

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "cron" / "Dockerfile"
ENTRYPOINT = DEPLOY / "cron" / "s3ckpt-cron"
CRONJOB = DEPLOY / "kubernetes" / "cronjob.yaml"
ECS = DEPLOY / "ecs" / "main.tf"
OUTPUTS = ROOT / "terraform" / "outputs.tf"
URL = "s3://acme-ml-checkpoints/checkpoints/"


# -- the Dockerfile -------------------------------------------------------------------------


def instructions(text: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` per instruction: comments dropped, continuations joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def stages(text: str) -> dict[str, list[tuple[str, str]]]:
    """Each stage's instructions by stage name (the last, unnamed, stage is ``final``)."""
    out: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for word, rest in instructions(text):
        if word == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?$", rest, re.IGNORECASE)
            assert m, rest
            current = out.setdefault(m.group(2) or "final", [])
        if current is not None:
            current.append((word, rest))
    return out


def global_args(text: str) -> dict[str, str]:
    """The ``ARG NAME=default`` lines before the first FROM."""
    out = {}
    for word, rest in instructions(text):
        if word == "FROM":
            break
        if word == "ARG":
            name, _, default = rest.partition("=")
            out[name] = default
    return out


DOCKER_TEXT = DOCKERFILE.read_text()
STAGES = stages(DOCKER_TEXT)
FINAL = STAGES["final"]


def final(word: str) -> list[str]:
    return [rest for w, rest in FINAL if w == word]


def image_uid() -> int:
    (user,) = final("USER")
    return int(user.partition(":")[0])


def test_the_image_runs_as_a_non_root_user_it_creates() -> None:
    uid = image_uid()
    assert uid != 0
    assert re.fullmatch(r"\d+(:\d+)?", final("USER")[0]), "numeric, for runAsNonRoot"
    created = [r for r in final("RUN") if "useradd" in r]
    assert created and f"--uid {uid}" in created[0]
    # USER comes after every RUN: nothing after it runs as root.
    words = [w for w, _ in FINAL]
    assert words.index("USER") > max(i for i, w in enumerate(words) if w == "RUN")


def test_the_image_runs_the_retention_job_through_its_entry_point() -> None:
    assert json.loads(final("ENTRYPOINT")[0]) == ["s3ckpt-cron"]
    assert json.loads(final("CMD")[0]) == ["retention"]
    assert f"{ENTRYPOINT.relative_to(ROOT)} /usr/local/bin/s3ckpt-cron" in final("COPY")
    assert os.access(ENTRYPOINT, os.X_OK), "COPY keeps the mode: the file must be executable"


def test_the_image_bakes_the_policies_in_and_installs_no_torch() -> None:
    assert "policies/*.toml /etc/s3ckpt/policies/" in final("COPY")
    (install,) = [r for r in final("RUN") if "pip install" in r]
    assert "[torch]" not in install and "find_spec('torch') is not None" in install


def test_the_wheel_comes_from_the_checkout_or_from_pypi() -> None:
    args = global_args(DOCKER_TEXT)
    assert args["PYTHON_IMAGE"] == "python:3.11-slim"
    assert f"wheel-{args['S3CKPT_FROM']}" in STAGES
    assert {"wheel-checkout", "wheel-pypi"} <= set(STAGES)
    (pypi,) = [r for w, r in STAGES["wheel-pypi"] if w == "RUN"]
    assert '"s3ckpt==${S3CKPT_VERSION}"' in pypi and "--only-binary=:all:" in pypi


def test_the_checkout_stage_copies_what_the_wheel_build_reads() -> None:
    """Everything pyproject.toml names (readme, license files, package directories) is
    copied into the build stage, and the Dockerfile's ignore file lets each COPY through."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = {"pyproject.toml", project["project"]["readme"], *project["project"]["license-files"]}
    needed |= {d.split("/")[0] for d in project["tool"]["setuptools"]["package-dir"].values()}
    needed |= {p.split(".")[0] for p in project["tool"]["setuptools"]["packages"]}
    copied = set()
    for word, rest in STAGES["wheel-checkout"]:
        if word == "COPY":
            copied |= {src.rstrip("/") for src in rest.split()[:-1]}
    assert needed <= copied, needed - copied
    ignore = (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text().split()
    allowed = [p[1:].rstrip("/") for p in ignore if p.startswith("!")]
    sources = set(copied)
    for word, rest in FINAL:
        if word == "COPY" and not rest.startswith("--from"):
            sources.add(rest.split()[0])
    for src in sources:
        assert any(fnmatch(src, a) or src.startswith(a + "/") or src == a for a in allowed), src
        assert list(ROOT.glob(src)), f"{src}: not in the repository"


# -- the entry point, run with a stand-in s3ckpt ---------------------------------------------


def run_entrypoint(
    tmp_path: Path, env: dict[str, str], *args: str, exits: dict[str, int] | None = None
) -> tuple[int, list[list[str]], str, str]:
    """Run s3ckpt-cron with ``env`` (and nothing else but PATH); returns the exit code, the
    argument lists the stand-in ``s3ckpt`` was called with, stdout and stderr."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "calls.jsonl"
    log.unlink(missing_ok=True)
    fake = bin_dir / "s3ckpt"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "with open(os.environ['FAKE_LOG'], 'a') as f:\n"
        "    f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "print(json.dumps({'command': sys.argv[1]}))\n"
        "sys.exit(int(os.environ.get('FAKE_EXIT_' + sys.argv[1], '0')))\n"
    )
    fake.chmod(0o755)
    full_env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "FAKE_LOG": str(log), **env}
    full_env.update({f"FAKE_EXIT_{k}": str(v) for k, v in (exits or {}).items()})
    proc = subprocess.run(
        ["sh", str(ENTRYPOINT), *args], env=full_env, capture_output=True, text=True, timeout=60
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc.returncode, calls, proc.stdout, proc.stderr


def check_invocations(calls: list[list[str]], *, apply: bool) -> None:
    """prune, then gc, of the same URL, each a valid s3ckpt command line, with --json, with
    --apply exactly when ``apply``, and a policy that exists."""
    assert [c[0] for c in calls] == ["prune", "gc"], calls
    parser = build_parser()
    parsed = [parser.parse_args(c) for c in calls]
    for args in parsed:
        assert args.json is True and args.apply is apply
        assert args.path == parsed[0].path
    load_policy(parsed[0].policy)  # raises PolicyError for a name that is neither file nor built-in


def test_retention_prunes_then_gcs_with_apply_and_json(tmp_path: Path) -> None:
    env = {"S3CKPT_URL": URL, "POLICY": "pretraining", "APPLY": "1", "GC_OLDER_THAN": "2d"}
    code, calls, out, err = run_entrypoint(tmp_path, env)
    assert code == 0, err
    check_invocations(calls, apply=True)
    assert calls[1][-2:] == ["--older-than", "2d"]
    # stdout is the commands' own output only (a log pipeline reads JSON); notes go to stderr
    assert [json.loads(line) for line in out.splitlines()] == [
        {"command": "prune"},
        {"command": "gc"},
    ]
    assert "prune s3://acme-ml-checkpoints/checkpoints/ with policy pretraining (apply)" in err


@pytest.mark.parametrize("apply", [None, "0", "false", "no"])
def test_retention_is_a_dry_run_unless_apply_is_set(tmp_path: Path, apply: str | None) -> None:
    env = {"S3CKPT_URL": URL} | ({"APPLY": apply} if apply is not None else {})
    code, calls, _, err = run_entrypoint(tmp_path, env)
    assert code == 0, err
    check_invocations(calls, apply=False)
    assert calls[0][calls[0].index("--policy") + 1] == "pretraining"  # the default
    assert "(dry run)" in err


@pytest.mark.parametrize(
    ("exits", "expected"),
    [({"prune": 1}, 1), ({"gc": 4}, 4), ({"prune": 3, "gc": 3}, 3), ({"prune": 4, "gc": 1}, 4)],
)
def test_gc_runs_after_a_failed_prune_and_the_worse_code_wins(
    tmp_path: Path, exits: dict[str, int], expected: int
) -> None:
    code, calls, _, _ = run_entrypoint(tmp_path, {"S3CKPT_URL": URL, "APPLY": "1"}, exits=exits)
    assert [c[0] for c in calls] == ["prune", "gc"]
    assert code == expected


@pytest.mark.parametrize(
    ("env", "args", "message"),
    [
        ({}, (), "S3CKPT_URL is not set"),
        ({"S3CKPT_URL": URL, "APPLY": "maybe"}, (), "APPLY=maybe is neither 1"),
        ({"S3CKPT_URL": URL}, ("retention", "--apply"), "retention takes no arguments"),
    ],
)
def test_bad_settings_are_one_line_exit_2_and_run_nothing(
    tmp_path: Path, env: dict[str, str], args: tuple[str, ...], message: str
) -> None:
    code, calls, _, err = run_entrypoint(tmp_path, env, *args)
    assert code == 2 and calls == []
    assert len(err.strip().splitlines()) == 1 and message in err


@pytest.mark.parametrize("prefix", [(), ("s3ckpt",)])
def test_any_other_command_goes_to_s3ckpt(tmp_path: Path, prefix: tuple[str, ...]) -> None:
    args = (*prefix, "ls", URL, "--json")
    code, calls, _, _ = run_entrypoint(tmp_path, {}, *args, exits={"ls": 3})
    assert (code, calls) == (3, [["ls", URL, "--json"]])


# -- Kubernetes ------------------------------------------------------------------------------


def k8s_objects() -> dict[str, dict]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(CRONJOB.read_text()) if doc}


def terraform_outputs() -> set[str]:
    return set(re.findall(r'^output "([a-z_]+)"', OUTPUTS.read_text(), re.MULTILINE))


def test_the_cronjob_never_runs_twice_at_once_and_ends_before_the_next() -> None:
    spec = k8s_objects()["CronJob"]["spec"]
    assert spec["concurrencyPolicy"] == "Forbid"
    job = spec["jobTemplate"]["spec"]
    assert isinstance(job["backoffLimit"], int) and job["backoffLimit"] <= 2
    minute, hour, *_ = spec["schedule"].split()
    assert minute.isdigit() and hour == "*", "hourly"
    assert 0 < job["activeDeadlineSeconds"] < 3600
    assert job["template"]["spec"]["restartPolicy"] == "Never"


def test_the_cronjob_runs_as_the_pruner_role() -> None:
    objects = k8s_objects()
    sa = objects["ServiceAccount"]
    arn = sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]
    assert re.fullmatch(r"arn:aws:iam::\d{12}:role/[\w+=,.@-]+", arn)
    lines = CRONJOB.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if "eks.amazonaws.com/role-arn:" in line)
    before = lines[at - 1]
    assert "terraform output pruner_role_arn" in before and "pruner_role_arn" in terraform_outputs()
    pod = objects["CronJob"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    assert sa["metadata"]["namespace"] == objects["CronJob"]["metadata"]["namespace"]


def test_the_cronjob_is_non_root_read_only_and_bounded() -> None:
    pod = k8s_objects()["CronJob"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    security = pod["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] == image_uid()
    (container,) = pod["containers"]
    c_security = container["securityContext"]
    assert c_security["readOnlyRootFilesystem"] is True
    assert c_security["allowPrivilegeEscalation"] is False
    assert c_security["capabilities"]["drop"] == ["ALL"]
    resources = container["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"]) and "memory" in resources["limits"]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/tmp" in mounts, "a writable /tmp beside the read-only root"


def test_the_cronjob_prunes_then_gcs_with_apply_and_json(tmp_path: Path) -> None:
    pod = k8s_objects()["CronJob"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "command" not in container, "the image's entry point runs"
    env = {e["name"]: e["value"] for e in container["env"]}
    # The two variables the terraform module's env output names.
    assert {"AWS_REGION", "S3CKPT_URL"} <= set(env)
    assert re.search(r"AWS_REGION\s*=.*\n\s*S3CKPT_URL\s*=", OUTPUTS.read_text())
    code, calls, _, err = run_entrypoint(tmp_path, env, *container["args"])
    assert code == 0, err
    check_invocations(calls, apply=True)


# -- ECS -------------------------------------------------------------------------------------


ECS_TEXT = ECS.read_text()


def hcl(pattern: str) -> str:
    m = re.search(pattern, ECS_TEXT, re.MULTILINE)
    assert m, pattern
    return m.group(1)


def variable_default(name: str) -> str:
    block = hcl(rf'^variable "{name}" \{{\n((?:.*\n)*?)\}}')
    return hcl_value(re.search(r"^\s*default\s*=\s*(.+)$", block, re.MULTILINE).group(1))  # type: ignore[union-attr]


def hcl_value(text: str) -> str:
    text = text.split(" #")[0].strip()
    return text[1:-1] if text.startswith('"') else text


def test_the_ecs_task_runs_as_the_pruner_role_non_root_and_read_only() -> None:
    assert hcl(r"^\s*task_role_arn\s*=\s*(\S+)$") == "module.checkpoints.pruner_role_arn"
    assert "pruner_role_arn" in terraform_outputs()
    assert hcl(r'module "checkpoints" \{\n\s*source\s*=\s*"([^"]+)"') == "../../terraform"
    assert (ECS.parent / "../../terraform/outputs.tf").resolve() == OUTPUTS
    assert hcl(r'^\s*user\s*=\s*"([^"]+)"').split(":")[0] == str(image_uid())
    assert hcl(r"^\s*readonlyRootFilesystem\s*=\s*(\S+)$") == "true"
    assert '"ecs-tasks.amazonaws.com"' in hcl(r"pruner_trust = \{\n\s*services\s*=\s*(\[.*\])")
    # The scheduler may pass exactly the pruner role and the execution role.
    assert "module.checkpoints.pruner_role_arn, aws_iam_role.execution.arn" in ECS_TEXT


def test_the_ecs_task_prunes_then_gcs_with_apply_and_json(tmp_path: Path) -> None:
    args = json.loads(hcl(r"^\s*command\s*=\s*(\[.*\])$"))
    block = hcl(r"cron_environment = merge\(module\.checkpoints\.env, \{\n((?:.*\n)*?)\s*\}\)")
    settings = dict(
        (k.strip(), hcl_value(v)) for k, v in (line.split("=", 1) for line in block.splitlines())
    )
    assert settings["POLICY"] == "var.policy" and settings["APPLY"] == 'var.apply ? "1" : "0"'
    env = {
        "AWS_REGION": variable_default("region"),
        "S3CKPT_URL": URL,  # module.checkpoints.env
        "POLICY": variable_default("policy"),
        "APPLY": "1" if variable_default("apply") == "true" else "0",
        "GC_OLDER_THAN": settings["GC_OLDER_THAN"],
    }
    code, calls, _, err = run_entrypoint(tmp_path, env, *args)
    assert code == 0, err
    check_invocations(calls, apply=True)
    assert shlex.join(calls[1][-2:]) == "--older-than 2d"
