"""Fixtures for the terraform module's integration test: terraform with the local provider
mirror, and a moto server of this module's own on 127.0.0.1 whose IAM enforcement can be
switched on.

Self-contained on purpose: nothing here depends on tests/conftest.py. moto's backends and its
IAM switch are process-global, so the server fixture always switches enforcement back off.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
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


class DebugProvider:
    """The AWS provider started once, in its debug mode, for every terraform command of a test.

    Terraform normally starts the provider (a 675 MB binary) afresh for each graph walk of each
    command, and gives up if it has not answered within one minute: on a busy 2-core machine
    that start alone takes tens of seconds and sometimes fails ("timeout while waiting for
    plugin to start"). A provider started with ``-debug`` serves until it is stopped and prints
    a ``TF_REATTACH_PROVIDERS`` value; terraform commands given that value attach to it instead
    of starting their own (the provider development workflow), so the start happens once, here,
    without terraform's deadline.
    """

    def __init__(
        self, binary: Path, env: dict[str, str], log_dir: Path, start_timeout: float = 600
    ) -> None:
        """Start ``binary -debug`` with ``env``: a reattached provider reads its AWS settings
        (credentials, AWS_CA_BUNDLE, ...) from its own environment, not terraform's."""
        log_dir.mkdir(parents=True, exist_ok=True)
        self._stdout = log_dir / "provider.stdout"
        self._stderr = log_dir / "provider.stderr"
        with open(self._stdout, "wb") as out, open(self._stderr, "wb") as err:
            # Files, not pipes: the provider logs a lot, and a full pipe would stall it.
            self._process = subprocess.Popen(
                [str(binary), "-debug"],
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        self.reattach = self._wait_for_reattach(start_timeout)

    def _wait_for_reattach(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(r"TF_REATTACH_PROVIDERS='([^']+)'", self._stdout.read_text())
            if match:
                json.loads(match.group(1))  # well-formed, or fail loudly here
                return match.group(1)
            if self._process.poll() is not None:
                break
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(
            f"the AWS provider did not start in debug mode within {timeout:.0f}s:\n"
            f"{self._stdout.read_text()[-2000:]}\n{self._stderr.read_text()[-2000:]}"
        )

    def stop(self) -> None:
        """SIGINT (the provider's own way out of debug mode), then SIGKILL if it hangs."""
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGINT)
            try:
                self._process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()


def installed_aws_provider(data_dir: Path) -> Path:
    """The provider binary ``terraform init`` installed (or linked) under ``data_dir``."""
    found = sorted(
        data_dir.glob("providers/registry.terraform.io/hashicorp/aws/*/*/terraform-provider-aws*")
    )
    if not found:
        raise RuntimeError(f"terraform init installed no hashicorp/aws provider in {data_dir}")
    return found[-1]


def terraform_env(cli_config: str, data_dir: Path) -> dict[str, str]:
    """Environment for terraform (and its provider) against moto: dummy credentials, no
    profile, no endpoint overrides inherited from the caller (the moto example sets its
    endpoints itself). Every inherited AWS_* variable is dropped: AWS_CA_BUNDLE, for one, makes
    the provider fail to configure ("unable to add custom RootCAs HTTPClient")."""
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
