"""Fixtures for the terraform module's integration test: terraform with the local provider
mirror, and a moto server of this module's own on 127.0.0.1 whose IAM enforcement can be
switched on.

Self-contained on purpose: nothing here depends on tests/conftest.py. moto's backends and its
IAM switch are process-global, so the server fixture always switches enforcement back off.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
MODULE_DIR = REPO / "terraform"
MOTO_EXAMPLE = MODULE_DIR / "examples" / "moto"
ENV_SCRIPT = REPO / "scripts" / "terraform-env.sh"


@pytest.fixture(scope="session")
def terraform_cli_config() -> str:
    """Path of a Terraform CLI config that installs hashicorp/aws from the local mirror.

    Skips (with the reason) when terraform or the mirror is missing: there is no registry
    access on CI machines, so without the mirror ``terraform init`` cannot succeed.
    """
    if shutil.which("terraform") is None:
        pytest.skip("terraform is not on PATH")
    if shutil.which("bash") is None:
        pytest.skip("bash is needed to run scripts/terraform-env.sh")
    found = subprocess.run(
        ["bash", str(ENV_SCRIPT), "mirror"], capture_output=True, text=True, check=False
    )
    if found.returncode != 0:
        pytest.skip(
            "no local Terraform provider mirror holding registry.terraform.io/hashicorp/aws "
            "(set S3CKPT_TF_PLUGIN_MIRROR to the folder that contains registry.terraform.io)"
        )
    env = subprocess.run(
        ["bash", "-c", f'source "{ENV_SCRIPT}" >/dev/null && printf %s "$TF_CLI_CONFIG_FILE"'],
        capture_output=True,
        text=True,
        check=True,
    )
    return env.stdout


def _teach_moto_not_resource() -> None:
    """Make moto's IAM evaluator honour ``NotResource``.

    moto 5.2.5 (``moto/iam/access_control.py``) only reads ``Resource``: a statement with
    ``NotResource`` is treated as having no resource at all and returns *permitted*, even when
    its effect is Deny. The pruner's "deny every write except the lease" statement is exactly
    such a statement, so without this the test would measure moto's gap, not our policy.
    Semantics implemented: the statement applies to every resource that matches none of the
    ``NotResource`` patterns (as in AWS).
    """
    from moto.iam import access_control

    statement_cls: Any = access_control.IAMPolicyStatement
    if getattr(statement_cls, "_s3ckpt_not_resource", False):
        return
    original = statement_cls.is_action_permitted

    def is_action_permitted(
        self: Any,
        action: str,
        resource: str = "*",
        principal: str | None = None,
        incoming_condition_values: dict[str, str] | None = None,
    ) -> Any:
        statement = self._statement
        if "NotResource" not in statement:
            return original(self, action, resource, principal, incoming_condition_values)
        excluded = statement["NotResource"]
        excluded = [excluded] if isinstance(excluded, str) else excluded
        if any(self._match(pattern, resource) for pattern in excluded):
            return access_control.PermissionResult.NEUTRAL
        as_resource = {k: v for k, v in statement.items() if k != "NotResource"}
        as_resource["Resource"] = "*"
        return original(
            statement_cls(as_resource), action, resource, principal, incoming_condition_values
        )

    statement_cls.is_action_permitted = is_action_permitted
    statement_cls._s3ckpt_not_resource = True


class MotoServer:
    """A moto server on 127.0.0.1 with a switch for IAM enforcement."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    def enforce_iam(self, on: bool) -> None:
        """Switch moto's IAM authentication and authorisation on or off (process-wide)."""
        import requests

        # 0: every request from now on is checked; inf: none is (moto's default).
        body = b"0" if on else b"inf"
        response = requests.post(f"{self.endpoint}/moto-api/reset-auth", data=body, timeout=10)
        response.raise_for_status()


@pytest.fixture(scope="module")
def moto_server() -> Iterator[MotoServer]:
    """A ThreadedMotoServer of this module's own, on 127.0.0.1 and a free port."""
    from moto.server import ThreadedMotoServer

    _teach_moto_not_resource()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    moto = MotoServer(f"http://{host}:{port}")
    try:
        yield moto
    finally:
        try:
            moto.enforce_iam(False)
        finally:
            server.stop()


def terraform_env(cli_config: str, data_dir: Path) -> dict[str, str]:
    """Environment for terraform against moto: dummy credentials, no profile, no endpoint
    overrides inherited from the caller (the moto example sets its endpoints itself)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "TF_VAR_", "TF_CLI_ARGS")) and k != "TF_DATA_DIR"
    }
    env.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_REGION="us-east-1",
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        AWS_EC2_METADATA_DISABLED="true",
        TF_CLI_CONFIG_FILE=cli_config,
        TF_DATA_DIR=str(data_dir),
        TF_IN_AUTOMATION="1",
        TF_INPUT="0",
        CHECKPOINT_DISABLE="1",
    )
    return env
