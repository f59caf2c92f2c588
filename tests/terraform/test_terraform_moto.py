"""Apply terraform/ to a moto server, check what it built with boto3, prove the trainer and
pruner roles' permissions under moto's IAM enforcement, then destroy it.

The tests run in file order and share one deployment (module-scoped fixture); the last one
destroys it, and the fixture destroys it anyway if a test failed first.

moto gaps worked around here (moto 5.2.5):
- it ignores bucket-policy conditions, so the TLS-only deny would refuse every object call:
  the moto example sets ``enforce_tls = false`` (terraform test covers the rendered policy);
- its IAM evaluator ignores ``NotResource`` (conftest teaches it, see
  ``_teach_moto_not_resource``);
- it authorises DeleteObjects against the bucket ARN instead of each key, so the pruner is
  shown deleting with DeleteObject (AWS checks s3:DeleteObject per key for both);
- destroying a bucket whose versioning is Suspended and that holds delete markers fails, so
  every version and marker is deleted before ``terraform destroy``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.terraform.conftest import (
    MODULE_DIR,
    MOTO_EXAMPLE,
    DebugProvider,
    MotoServer,
    installed_aws_provider,
    terraform_env,
)

# Seconds one terraform command may take. Each command that loads the AWS provider's schema
# costs tens of CPU seconds; a 2-core CI machine needs about a minute for apply or destroy, an
# overloaded one many times that (raise it with S3CKPT_TF_COMMAND_TIMEOUT).
COMMAND_TIMEOUT = float(os.environ.get("S3CKPT_TF_COMMAND_TIMEOUT", "900"))

# Per test, including the module fixture's init + apply (first test) or destroy (last test).
pytestmark = [pytest.mark.terraform, pytest.mark.timeout(3 * COMMAND_TIMEOUT)]

boto3 = pytest.importorskip("boto3")
from botocore.exceptions import ClientError  # noqa: E402

REGION = "us-east-1"
PREFIX = "checkpoints/"
NONCURRENT_DAYS = 7  # the module's defaults, which the moto example keeps
ABORT_DAYS = 3


@dataclass
class Deployment:
    """One applied copy of the moto example."""

    moto: MotoServer
    workdir: Path
    env: dict[str, str]
    tf_vars: list[str]
    bucket: str
    trainer_user: str
    pruner_user: str
    outputs: dict[str, Any] = field(default_factory=dict)
    destroyed: bool = False
    timings: dict[str, float] = field(default_factory=dict)

    def terraform(self, *args: str, timeout: float = COMMAND_TIMEOUT) -> str:
        started = time.monotonic()
        done = subprocess.run(
            ["terraform", f"-chdir={self.workdir}", *args, "-no-color"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        self.timings[args[0]] = self.timings.get(args[0], 0.0) + time.monotonic() - started
        if done.returncode != 0:
            pytest.fail(
                f"terraform {' '.join(args)} failed ({done.returncode}):\n"
                f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
            )
        return done.stdout

    def client(self, service: str, **credentials: str) -> Any:
        credentials = credentials or {
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
        }
        return boto3.client(
            service, endpoint_url=self.moto.endpoint, region_name=REGION, **credentials
        )

    def empty_bucket(self) -> None:
        """Delete every object version and delete marker (moto cannot destroy a bucket that
        still holds delete markers once the versioning resource has suspended versioning)."""
        s3 = self.client("s3")
        try:
            for page in s3.get_paginator("list_object_versions").paginate(Bucket=self.bucket):
                for item in page.get("Versions", []) + page.get("DeleteMarkers", []):
                    s3.delete_object(
                        Bucket=self.bucket, Key=item["Key"], VersionId=item["VersionId"]
                    )
        except s3.exceptions.NoSuchBucket:
            pass  # the apply failed before creating it; destroy the rest

    def destroy(self) -> None:
        self.moto.enforce_iam(False)
        self.empty_bucket()
        # No refresh: the state is what apply wrote, and the bucket was just emptied.
        self.terraform("destroy", "-auto-approve", "-input=false", "-refresh=false", *self.tf_vars)
        self.destroyed = True


@pytest.fixture(scope="module")
def deployment(
    terraform_cli_config: str,
    moto_server: MotoServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Deployment]:
    """The moto example applied, with an IAM user per role allowed to assume it."""
    workdir = tmp_path_factory.mktemp("tf-moto")
    # A copy outside the checkout, with the module source made absolute, so the run leaves no
    # .terraform.lock.hcl, state or data dir behind in terraform/.
    text = (MOTO_EXAMPLE / "main.tf").read_text()
    relative_source = 'source = "../.."'
    assert relative_source in text, "examples/moto/main.tf must use the module at ../.."
    (workdir / "main.tf").write_text(text.replace(relative_source, f'source = "{MODULE_DIR}"'))

    bucket = f"s3ckpt-tf-{uuid.uuid4().hex[:10]}"
    env = terraform_env(terraform_cli_config, workdir / ".terraform-data")
    deployment = Deployment(
        moto=moto_server,
        workdir=workdir,
        env=env,
        tf_vars=[],
        bucket=bucket,
        trainer_user=f"ci-trainer-{bucket[-6:]}",
        pruner_user=f"ci-pruner-{bucket[-6:]}",
    )
    iam = deployment.client("iam")
    arns = {
        user: iam.create_user(UserName=user)["User"]["Arn"]
        for user in (deployment.trainer_user, deployment.pruner_user)
    }
    deployment.tf_vars = [
        f"-var=endpoint={moto_server.endpoint}",
        f"-var=bucket_name={bucket}",
        f"-var=trainer_principal_arn={arns[deployment.trainer_user]}",
        f"-var=pruner_principal_arn={arns[deployment.pruner_user]}",
    ]
    deployment.terraform(
        "init", "-input=false", f"-backend-config=path={workdir / 'terraform.tfstate'}"
    )
    started = time.monotonic()
    provider = DebugProvider(
        installed_aws_provider(Path(env["TF_DATA_DIR"])),
        {**env, "TF_LOG": "WARN"},  # the debug mode's default is TRACE: megabytes of log
        workdir / "provider",
    )
    deployment.timings["provider start"] = time.monotonic() - started
    env["TF_REATTACH_PROVIDERS"] = provider.reattach
    try:
        deployment.terraform("apply", "-auto-approve", "-input=false", *deployment.tf_vars)
        deployment.outputs = {
            name: value["value"]
            for name, value in json.loads(deployment.terraform("output", "-json")).items()
        }
        yield deployment
    finally:
        try:
            if not deployment.destroyed:
                deployment.destroy()
        finally:
            provider.stop()
        timings = {step: round(seconds, 1) for step, seconds in deployment.timings.items()}
        print(f"\nterraform timings (s): {timings}")
        shutil.rmtree(workdir / ".terraform-data", ignore_errors=True)


@contextmanager
def _fails_with(*codes: str, what: object = None) -> Iterator[None]:
    """The block raises a ClientError whose error code is one of ``codes`` (``what`` names
    the case in the assertion message)."""
    with pytest.raises(ClientError) as excinfo:
        yield
    assert str(excinfo.value.response["Error"]["Code"]) in codes, what


def test_outputs_name_what_s3ckpt_needs(deployment: Deployment) -> None:
    out = deployment.outputs
    assert out["bucket_name"] == deployment.bucket
    assert out["checkpoint_prefix"] == PREFIX
    assert out["checkpoint_url"] == f"s3://{deployment.bucket}/{PREFIX}"
    assert out["env"] == {"AWS_REGION": REGION, "S3CKPT_URL": out["checkpoint_url"]}
    assert out["trainer_role_arn"].endswith(":role/s3ckpt-trainer")
    assert out["pruner_role_arn"].endswith(":role/s3ckpt-pruner")
    assert out["kms_key_arn"].startswith(f"arn:aws:kms:{REGION}:")


def test_bucket_is_encrypted_with_the_key_and_a_bucket_key(deployment: Deployment) -> None:
    s3 = deployment.client("s3")
    rule = s3.get_bucket_encryption(Bucket=deployment.bucket)["ServerSideEncryptionConfiguration"][
        "Rules"
    ][0]
    assert rule["ApplyServerSideEncryptionByDefault"] == {
        "SSEAlgorithm": "aws:kms",
        "KMSMasterKeyID": deployment.outputs["kms_key_arn"],
    }
    assert rule["BucketKeyEnabled"] is True
    kms = deployment.client("kms")
    assert kms.get_key_rotation_status(KeyId=deployment.outputs["kms_key_arn"])[
        "KeyRotationEnabled"
    ]
    # The default applies to an upload that asks for nothing.
    key = f"{PREFIX}probe/encrypted"
    s3.put_object(Bucket=deployment.bucket, Key=key, Body=b"x")
    head = s3.head_object(Bucket=deployment.bucket, Key=key)
    assert head["ServerSideEncryption"] == "aws:kms"


def test_bucket_blocks_public_access_and_enforces_ownership(deployment: Deployment) -> None:
    s3 = deployment.client("s3")
    block = s3.get_public_access_block(Bucket=deployment.bucket)["PublicAccessBlockConfiguration"]
    assert block == {
        "BlockPublicAcls": True,
        "IgnorePublicAcls": True,
        "BlockPublicPolicy": True,
        "RestrictPublicBuckets": True,
    }
    rules = s3.get_bucket_ownership_controls(Bucket=deployment.bucket)["OwnershipControls"]["Rules"]
    assert rules == [{"ObjectOwnership": "BucketOwnerEnforced"}]


def test_bucket_is_versioned(deployment: Deployment) -> None:
    s3 = deployment.client("s3")
    assert s3.get_bucket_versioning(Bucket=deployment.bucket)["Status"] == "Enabled"


def test_lifecycle_rules_are_as_declared(deployment: Deployment) -> None:
    s3 = deployment.client("s3")
    rules = {
        rule["ID"]: rule
        for rule in s3.get_bucket_lifecycle_configuration(Bucket=deployment.bucket)["Rules"]
    }
    assert set(rules) == {
        "abort-incomplete-multipart-uploads",
        "expire-noncurrent-versions",
        "remove-expired-delete-markers",
    }
    for rule in rules.values():
        assert rule["Status"] == "Enabled"
        # Whole bucket: an empty prefix (some clients send no Prefix at all).
        assert rule["Filter"] in ({"Prefix": ""}, {})
    assert rules["abort-incomplete-multipart-uploads"]["AbortIncompleteMultipartUpload"] == {
        "DaysAfterInitiation": ABORT_DAYS
    }
    assert (
        rules["expire-noncurrent-versions"]["NoncurrentVersionExpiration"]["NoncurrentDays"]
        == NONCURRENT_DAYS
    )
    assert rules["remove-expired-delete-markers"]["Expiration"] == {
        "ExpiredObjectDeleteMarker": True
    }


def test_no_tls_policy_on_moto(deployment: Deployment) -> None:
    """The moto example leaves the TLS-only policy out (moto would apply its deny to every
    request); this pins that choice so a change to the example is noticed."""
    s3 = deployment.client("s3")
    with _fails_with("NoSuchBucketPolicy"):
        s3.get_bucket_policy(Bucket=deployment.bucket)


def _assume(deployment: Deployment, keys: dict[str, str], user: str, role_arn: str) -> Any:
    """An S3 client with the role's session credentials, obtained with ``user``'s ``keys``."""
    sts = deployment.client(
        "sts",
        aws_access_key_id=keys["AccessKeyId"],
        aws_secret_access_key=keys["SecretAccessKey"],
    )
    creds = sts.assume_role(RoleArn=role_arn, RoleSessionName=f"{user}-session")["Credentials"]
    return deployment.client(
        "s3",
        aws_access_key_id=creds["AccessKeyId"],
        aws_secret_access_key=creds["SecretAccessKey"],
        aws_session_token=creds["SessionToken"],
    )


@pytest.fixture(scope="module")
def role_clients(deployment: Deployment) -> Iterator[dict[str, Any]]:
    """S3 clients acting as the trainer and the pruner role, with IAM enforced.

    Each user may call sts:AssumeRole on any role; the roles' trust policies decide.
    """
    iam = deployment.client("iam")
    assume_any = json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole", "Resource": "*"}],
        }
    )
    for user in (deployment.trainer_user, deployment.pruner_user):
        iam.put_user_policy(UserName=user, PolicyName="assume-roles", PolicyDocument=assume_any)
    # Created before enforcement: from then on moto's dummy root keys are refused.
    keys = {
        user: iam.create_access_key(UserName=user)["AccessKey"]
        for user in (deployment.trainer_user, deployment.pruner_user)
    }
    deployment.moto.enforce_iam(True)
    try:
        yield {
            "trainer": _assume(
                deployment,
                keys[deployment.trainer_user],
                deployment.trainer_user,
                deployment.outputs["trainer_role_arn"],
            ),
            "pruner": _assume(
                deployment,
                keys[deployment.pruner_user],
                deployment.pruner_user,
                deployment.outputs["pruner_role_arn"],
            ),
            "keys": keys,
        }
    finally:
        deployment.moto.enforce_iam(False)


def test_iam_enforcement_is_on(deployment: Deployment, role_clients: dict[str, Any]) -> None:
    """Guards the tests below: with enforcement on, moto's dummy root keys are refused."""
    with _fails_with("InvalidAccessKeyId"):
        deployment.client("s3").list_objects_v2(Bucket=deployment.bucket)


def test_only_the_trusted_user_can_assume_each_role(
    deployment: Deployment, role_clients: dict[str, Any]
) -> None:
    keys = role_clients["keys"][deployment.trainer_user]
    sts = deployment.client(
        "sts",
        aws_access_key_id=keys["AccessKeyId"],
        aws_secret_access_key=keys["SecretAccessKey"],
    )
    with _fails_with("AccessDenied"):
        sts.assume_role(
            RoleArn=deployment.outputs["pruner_role_arn"], RoleSessionName="trainer-as-pruner"
        )


RUN = f"{PREFIX}run-a/"
STEP = f"{RUN}step_000000100/"


def test_trainer_writes_a_checkpoint_under_the_prefix(
    deployment: Deployment, role_clients: dict[str, Any]
) -> None:
    """Every request a Checkpointer save and resume makes, as the trainer role."""
    s3 = role_clients["trainer"]
    bucket = deployment.bucket
    # A data object as a multipart upload (CreateMultipartUpload, UploadPart and
    # CompleteMultipartUpload are s3:PutObject; ListParts is s3:ListMultipartUploadParts).
    upload = s3.create_multipart_upload(Bucket=bucket, Key=f"{STEP}__0_0.distcp")["UploadId"]
    etag = s3.upload_part(
        Bucket=bucket, Key=f"{STEP}__0_0.distcp", UploadId=upload, PartNumber=1, Body=b"t" * 1024
    )["ETag"]
    s3.list_parts(Bucket=bucket, Key=f"{STEP}__0_0.distcp", UploadId=upload)
    s3.complete_multipart_upload(
        Bucket=bucket,
        Key=f"{STEP}__0_0.distcp",
        UploadId=upload,
        MultipartUpload={"Parts": [{"ETag": etag, "PartNumber": 1}]},
    )
    s3.put_object(Bucket=bucket, Key=f"{STEP}.metadata", Body=b"m")
    # The commit marker: a conditional PUT.
    s3.put_object(Bucket=bucket, Key=f"{STEP}s3ckpt.json", Body=b"{}", IfNoneMatch="*")
    # The run's pointer to its newest checkpoint, overwritten by every save.
    for step in (100, 200):
        s3.put_object(Bucket=bucket, Key=f"{RUN}s3ckpt.latest.json", Body=b'{"step": %d}' % step)
    # A failed save aborts its uploads.
    doomed = s3.create_multipart_upload(Bucket=bucket, Key=f"{STEP}__1_0.distcp")["UploadId"]
    s3.list_multipart_uploads(Bucket=bucket, Prefix=PREFIX)
    s3.abort_multipart_upload(Bucket=bucket, Key=f"{STEP}__1_0.distcp", UploadId=doomed)
    # Resume reads it back: list, head, ranged get.
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=STEP)
    assert {o["Key"] for o in listed["Contents"]} == {
        f"{STEP}__0_0.distcp",
        f"{STEP}.metadata",
        f"{STEP}s3ckpt.json",
    }
    assert s3.get_object(Bucket=bucket, Key=f"{STEP}s3ckpt.json")["Body"].read() == b"{}"
    s3.head_object(Bucket=bucket, Key=f"{STEP}__0_0.distcp")
    ranged = s3.get_object(Bucket=bucket, Key=f"{STEP}__0_0.distcp", Range="bytes=10-19")
    assert ranged["Body"].read() == b"t" * 10


def test_trainer_cannot_delete(deployment: Deployment, role_clients: dict[str, Any]) -> None:
    s3 = role_clients["trainer"]
    with _fails_with("AccessDenied"):
        s3.delete_object(Bucket=deployment.bucket, Key=f"{STEP}s3ckpt.json")


def test_trainer_cannot_write_outside_the_prefix_nor_pins_nor_the_lease(
    deployment: Deployment, role_clients: dict[str, Any]
) -> None:
    s3 = role_clients["trainer"]
    for key in (
        "elsewhere/x",
        f"{STEP}s3ckpt.pin.json",
        f"{RUN}s3ckpt.lease",
        f"{RUN}s3ckpt.lease.probe-0123456789ab",
    ):
        with _fails_with("AccessDenied", what=key):
            s3.put_object(Bucket=deployment.bucket, Key=key, Body=b"x")


def test_a_failed_save_leaves_debris_the_trainer_cannot_remove(
    deployment: Deployment, role_clients: dict[str, Any]
) -> None:
    """A save that died after writing some objects: the trainer cannot delete them (the
    pruner's `s3ckpt gc` does, below); its unfinished upload stays until gc or the lifecycle
    rule aborts it."""
    s3 = role_clients["trainer"]
    step = f"{RUN}step_000000200/"
    s3.put_object(Bucket=deployment.bucket, Key=f"{step}__0_0.distcp", Body=b"partial")
    s3.create_multipart_upload(Bucket=deployment.bucket, Key=f"{step}__1_0.distcp")
    with _fails_with("AccessDenied"):
        s3.delete_object(Bucket=deployment.bucket, Key=f"{step}__0_0.distcp")


def test_pruner_takes_renews_and_releases_its_lease(
    deployment: Deployment, role_clients: dict[str, Any]
) -> None:
    s3 = role_clients["pruner"]
    # The lease, and the capability probe a pruner process makes beside it before its first
    # lease (s3ckpt.store._capabilities, beside=True): created, replaced, deleted.
    probe = "s3ckpt.lease.probe-0123456789ab"
    for key in (f"{PREFIX}s3ckpt.lease", f"{RUN}s3ckpt.lease", f"{PREFIX}{probe}", f"{RUN}{probe}"):
        etag = s3.put_object(Bucket=deployment.bucket, Key=key, Body=b"{}", IfNoneMatch="*")["ETag"]
        s3.put_object(Bucket=deployment.bucket, Key=key, Body=b'{"renewed": 1}', IfMatch=etag)
        s3.delete_object(Bucket=deployment.bucket, Key=key)


def test_pruner_takes_a_lease_through_s3ckpt(
    deployment: Deployment, role_clients: dict[str, Any]
) -> None:
    """s3ckpt's own lease as the pruner, in a fresh process: it first probes what the store
    enforces on a key of its own beside the lease, then takes and releases the lease. Every
    write it makes must be one the role allows, and it leaves nothing behind."""
    sts = deployment.client(
        "sts",
        aws_access_key_id=role_clients["keys"][deployment.pruner_user]["AccessKeyId"],
        aws_secret_access_key=role_clients["keys"][deployment.pruner_user]["SecretAccessKey"],
    )
    creds = sts.assume_role(
        RoleArn=deployment.outputs["pruner_role_arn"], RoleSessionName="pruner-s3ckpt"
    )["Credentials"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3CKPT_"))}
    env |= {
        "AWS_ACCESS_KEY_ID": creds["AccessKeyId"],
        "AWS_SECRET_ACCESS_KEY": creds["SecretAccessKey"],
        "AWS_SESSION_TOKEN": creds["SessionToken"],
        "AWS_ENDPOINT_URL": deployment.moto.endpoint,
        "AWS_REGION": REGION,
    }
    code = (
        "from s3ckpt.retention._lease import Lease\n"
        "from s3ckpt.store import Location\n"
        f"loc = Location.of('s3://{deployment.bucket}/{RUN}')\n"
        "Lease(loc.store, loc.url).acquire().release()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    left = role_clients["pruner"].list_objects_v2(Bucket=deployment.bucket, Prefix=RUN)
    keys = [o["Key"] for o in left.get("Contents", []) if "s3ckpt.lease" in o["Key"]]
    assert f"{RUN}s3ckpt.lease" in keys  # taken, then marked released
    # The probe deletes its key with DeleteObjects, which moto authorises against the bucket
    # ARN (module docs), so here it stays: the leftover gc reclaims past the grace period.
    assert all(re.fullmatch(rf"{RUN}s3ckpt\.lease(\.probe-[0-9a-f]{{12}})?", k) for k in keys)
    for key in keys:
        role_clients["pruner"].delete_object(Bucket=deployment.bucket, Key=key)


def test_pruner_deletes_a_checkpoint(deployment: Deployment, role_clients: dict[str, Any]) -> None:
    s3 = role_clients["pruner"]
    bucket = deployment.bucket
    assert s3.get_object(Bucket=bucket, Key=f"{STEP}s3ckpt.json")["Body"].read() == b"{}"
    s3.list_objects_v2(Bucket=bucket, Prefix=RUN)
    # Commit marker first, then the data (the pruner's crash-safe order).
    for name in ("s3ckpt.json", ".metadata", "__0_0.distcp"):
        s3.delete_object(Bucket=bucket, Key=f"{STEP}{name}")
    assert s3.list_objects_v2(Bucket=bucket, Prefix=STEP)["KeyCount"] == 0


def test_pruner_collects_a_failed_saves_debris(
    deployment: Deployment, role_clients: dict[str, Any]
) -> None:
    """What `s3ckpt gc` does as the pruner: delete uncommitted objects, abort stale uploads."""
    s3 = role_clients["pruner"]
    bucket, step = deployment.bucket, f"{RUN}step_000000200/"
    s3.delete_object(Bucket=bucket, Key=f"{step}__0_0.distcp")
    uploads = s3.list_multipart_uploads(Bucket=bucket, Prefix=step).get("Uploads", [])
    assert [u["Key"] for u in uploads] == [f"{step}__1_0.distcp"]
    for u in uploads:
        s3.abort_multipart_upload(Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"])
    assert s3.list_objects_v2(Bucket=bucket, Prefix=step)["KeyCount"] == 0
    assert not s3.list_multipart_uploads(Bucket=bucket, Prefix=step).get("Uploads")


def test_pruner_cannot_write_checkpoint_objects_nor_pins(
    deployment: Deployment, role_clients: dict[str, Any]
) -> None:
    s3 = role_clients["pruner"]
    for key in (
        f"{RUN}step_000000300/__0_0.distcp",
        f"{RUN}step_000000300/.metadata.0123abcd",
        f"{RUN}s3ckpt.latest.json",
        f"{STEP}s3ckpt.pin.json",
        "elsewhere/x",
    ):
        with _fails_with("AccessDenied", what=key):
            s3.put_object(Bucket=deployment.bucket, Key=key, Body=b"x")
    with _fails_with("AccessDenied"):
        s3.create_multipart_upload(
            Bucket=deployment.bucket, Key=f"{RUN}step_000000300/__1_0.distcp"
        )


def test_pruner_may_restore_a_stock_metadata_copy(
    deployment: Deployment, role_clients: dict[str, Any]
) -> None:
    """`s3ckpt gc` rolls a commit interrupted before its .metadata copy forward."""
    s3 = role_clients["pruner"]
    s3.put_object(Bucket=deployment.bucket, Key=f"{STEP}.metadata", Body=b"copy")
    assert s3.get_object(Bucket=deployment.bucket, Key=f"{STEP}.metadata")["Body"].read() == b"copy"


def test_pruner_may_record_what_a_check_found(
    deployment: Deployment, role_clients: dict[str, Any]
) -> None:
    """`s3ckpt check` (the cron image's scrub) writes {run}/s3ckpt.check.json, which `ls` reads."""
    s3 = role_clients["pruner"]
    s3.put_object(Bucket=deployment.bucket, Key=f"{RUN}s3ckpt.check.json", Body=b"{}")
    assert s3.get_object(Bucket=deployment.bucket, Key=f"{RUN}s3ckpt.check.json")["Body"].read()
    with _fails_with("AccessDenied"):  # only the record's own name
        s3.put_object(Bucket=deployment.bucket, Key=f"{RUN}s3ckpt.check.json.bak", Body=b"{}")


def test_pruner_may_fence_a_checkpoint(
    deployment: Deployment, role_clients: dict[str, Any]
) -> None:
    """gc, prune and rm put a tombstone on a checkpoint's marker key before deleting any of it."""
    s3 = role_clients["pruner"]
    key = f"{RUN}step_000000400/s3ckpt.json"
    s3.put_object(Bucket=deployment.bucket, Key=key, Body=b"{}", IfNoneMatch="*")
    assert s3.get_object(Bucket=deployment.bucket, Key=key)["Body"].read() == b"{}"


def test_destroy_removes_everything(deployment: Deployment) -> None:
    deployment.destroy()
    s3 = deployment.client("s3")
    with _fails_with("404", "NoSuchBucket"):
        s3.head_bucket(Bucket=deployment.bucket)
    iam = deployment.client("iam")
    roles = {role["RoleName"] for role in iam.list_roles()["Roles"]}
    assert not roles & {"s3ckpt-trainer", "s3ckpt-pruner"}
