# Unit tests of the rendered resources and policies, against a mock AWS provider: no account,
# no network. Run with `terraform test` in terraform/ (scripts/terraform-env.sh check).
#
# Cost: every run block starts the AWS provider plugin (a 675 MB binary whose schema takes tens
# of CPU seconds to load), so the file has few runs, each with many assertions, and they all
# plan (no apply, so no teardown): `override_during = plan` (Terraform >= 1.11) makes the mocked
# computed values (key ARN, bucket id) known at plan time.

mock_provider "aws" {
  override_during = plan

  mock_data "aws_caller_identity" {
    defaults = {
      account_id = "111122223333"
      arn        = "arn:aws:iam::111122223333:user/ci"
      user_id    = "AIDAEXAMPLE"
    }
  }
  mock_data "aws_partition" {
    defaults = {
      partition          = "aws"
      dns_suffix         = "amazonaws.com"
      reverse_dns_prefix = "com.amazonaws"
    }
  }
  mock_data "aws_region" {
    defaults = {
      name = "eu-west-1"
    }
  }
  mock_resource "aws_kms_key" {
    defaults = {
      arn    = "arn:aws:kms:eu-west-1:111122223333:key/00000000-0000-0000-0000-000000000000"
      key_id = "00000000-0000-0000-0000-000000000000"
    }
  }
  mock_resource "aws_s3_bucket" {
    defaults = {
      id  = "s3ckpt-unit-test"
      arn = "arn:aws:s3:::s3ckpt-unit-test"
    }
  }
  mock_resource "aws_iam_role" {
    defaults = {
      arn = "arn:aws:iam::111122223333:role/mocked"
    }
  }
}

variables {
  bucket_name       = "s3ckpt-unit-test"
  checkpoint_prefix = "checkpoints/"
  trainer_trust = {
    aws_principals = ["arn:aws:iam::111122223333:role/gpu-nodes"]
  }
  pruner_trust = {
    aws_principals = ["arn:aws:iam::111122223333:role/retention-cron"]
  }
}

# One plan with the defaults and one with every setting changed; each assertion has its own
# message.

run "defaults" {
  command = plan

  assert {
    condition = alltrue([
      aws_s3_bucket_public_access_block.this.block_public_acls,
      aws_s3_bucket_public_access_block.this.block_public_policy,
      aws_s3_bucket_public_access_block.this.ignore_public_acls,
      aws_s3_bucket_public_access_block.this.restrict_public_buckets,
    ])
    error_message = "all four public access blocks must be on"
  }

  assert {
    condition     = one(aws_s3_bucket_ownership_controls.this.rule).object_ownership == "BucketOwnerEnforced"
    error_message = "ownership must be BucketOwnerEnforced (ACLs disabled)"
  }

  assert {
    condition = (
      one(one(aws_s3_bucket_server_side_encryption_configuration.this.rule).apply_server_side_encryption_by_default).sse_algorithm == "aws:kms" &&
      one(one(aws_s3_bucket_server_side_encryption_configuration.this.rule).apply_server_side_encryption_by_default).kms_master_key_id == aws_kms_key.this.arn
    )
    error_message = "default encryption must be SSE-KMS with the module's key"
  }

  assert {
    condition     = one(aws_s3_bucket_server_side_encryption_configuration.this.rule).bucket_key_enabled == true
    error_message = "the S3 bucket key must be enabled"
  }

  assert {
    condition     = aws_kms_key.this.enable_key_rotation == true
    error_message = "KMS key rotation must be on"
  }

  assert {
    condition     = one(aws_s3_bucket_versioning.this.versioning_configuration).status == "Enabled"
    error_message = "versioning is on by default"
  }

  assert {
    condition     = output.checkpoint_url == "s3://s3ckpt-unit-test/checkpoints/"
    error_message = "checkpoint_url must be s3://bucket/prefix/"
  }

  assert {
    condition     = output.env["S3CKPT_URL"] == output.checkpoint_url && output.env["AWS_REGION"] == "eu-west-1"
    error_message = "env must carry the region and the checkpoint URL"
  }

  assert {
    condition     = length(aws_s3_bucket_policy.tls_only) == 1
    error_message = "enforce_tls defaults to true"
  }

  assert {
    condition = anytrue([
      for s in jsondecode(aws_s3_bucket_policy.tls_only[0].policy).Statement :
      s.Effect == "Deny" && s.Principal == "*" && s.Action == "s3:*" && s.Condition == { Bool = { "aws:SecureTransport" = "false" } }
    ])
    error_message = "the bucket policy must deny every request with aws:SecureTransport = false"
  }

  assert {
    condition = anytrue([
      for s in jsondecode(aws_s3_bucket_policy.tls_only[0].policy).Statement :
      s.Effect == "Deny" && s.Action == "s3:*" && s.Condition == { NumericLessThan = { "s3:TlsVersion" = "1.2" } }
    ])
    error_message = "the bucket policy must deny TLS versions below 1.2"
  }

  assert {
    condition = alltrue([
      for s in jsondecode(aws_s3_bucket_policy.tls_only[0].policy).Statement :
      toset(s.Resource) == toset(["arn:aws:s3:::s3ckpt-unit-test", "arn:aws:s3:::s3ckpt-unit-test/*"])
    ])
    error_message = "the TLS denies must cover the bucket and every object"
  }

  assert {
    condition = !anytrue(flatten([
      for s in jsondecode(aws_iam_role_policy.trainer.policy).Statement : [
        for a in flatten([s.Action]) : can(regex("(?i)delete|^s3:\\*$|^\\*$", a))
      ] if s.Effect == "Allow"
    ]))
    error_message = "the trainer must not be allowed any delete (nor s3:* / *)"
  }

  assert {
    condition = anytrue([
      for s in jsondecode(aws_iam_role_policy.trainer.policy).Statement :
      s.Effect == "Allow" && contains(flatten([s.Action]), "s3:PutObject") && s.Resource == "arn:aws:s3:::s3ckpt-unit-test/checkpoints/*"
    ])
    error_message = "the trainer must be allowed s3:PutObject under the prefix"
  }

  assert {
    condition = alltrue([
      for s in jsondecode(aws_iam_role_policy.trainer.policy).Statement :
      alltrue([for r in flatten([s.Resource]) : startswith(r, "arn:aws:s3:::s3ckpt-unit-test/checkpoints/") || r == "arn:aws:s3:::s3ckpt-unit-test" || r == aws_kms_key.this.arn])
    ])
    error_message = "every trainer resource must be the bucket, an object under the prefix, or the key"
  }

  assert {
    condition = length([
      for s in jsondecode(aws_iam_role_policy.trainer.policy).Statement : s
      if s.Sid == "ReadWriteCheckpointObjects" && length(setsubtract(
        ["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"],
        flatten([s.Action]),
      )) == 0
    ]) == 1
    error_message = "the trainer needs get, put and the multipart actions on checkpoint objects"
  }

  assert {
    condition = anytrue([
      for s in jsondecode(aws_iam_role_policy.trainer.policy).Statement :
      s.Action == "s3:ListBucket" && try(s.Condition, null) == { StringLike = { "s3:prefix" = ["checkpoints/*"] } }
    ])
    error_message = "the trainer may list only under the prefix"
  }

  assert {
    condition = anytrue([
      for s in jsondecode(aws_iam_role_policy.trainer.policy).Statement :
      s.Resource == aws_kms_key.this.arn && try(s.Condition.StringEquals["kms:ViaService"], null) == "s3.eu-west-1.amazonaws.com"
    ])
    error_message = "the trainer may use the key only through S3 in the bucket's region"
  }

  assert {
    condition = anytrue([
      for s in jsondecode(aws_iam_role_policy.pruner.policy).Statement :
      s.Effect == "Allow" && contains(flatten([s.Action]), "s3:DeleteObject") && try(s.Resource, null) == "arn:aws:s3:::s3ckpt-unit-test/checkpoints/*"
    ])
    error_message = "the pruner must be allowed s3:DeleteObject under the prefix"
  }

  assert {
    condition = anytrue([
      for s in jsondecode(aws_iam_role_policy.pruner.policy).Statement :
      s.Effect == "Deny" && contains(flatten([s.Action]), "s3:Put*") && toset(try(s.NotResource, [])) == toset([
        "arn:aws:s3:::s3ckpt-unit-test/checkpoints/s3ckpt.lease",
        "arn:aws:s3:::s3ckpt-unit-test/checkpoints/*/s3ckpt.lease",
        "arn:aws:s3:::s3ckpt-unit-test/checkpoints/s3ckpt.lease.probe-*",
        "arn:aws:s3:::s3ckpt-unit-test/checkpoints/*/s3ckpt.lease.probe-*",
        "arn:aws:s3:::s3ckpt-unit-test/checkpoints/*/.metadata",
        "arn:aws:s3:::s3ckpt-unit-test/checkpoints/s3ckpt.check.json",
        "arn:aws:s3:::s3ckpt-unit-test/checkpoints/*/s3ckpt.check.json",
        "arn:aws:s3:::s3ckpt-unit-test/checkpoints/*/s3ckpt.json",
      ])
    ])
    error_message = "the pruner needs an explicit Deny on s3:Put* for everything but its lease keys, the stock .metadata copies, check records and commit markers (fences)"
  }

  assert {
    condition = alltrue([
      for s in jsondecode(aws_iam_role_policy.pruner.policy).Statement :
      alltrue([for r in flatten([s.Resource]) : endswith(r, "/s3ckpt.lease") || endswith(r, "/s3ckpt.lease.probe-*") || endswith(r, "/*/.metadata") || endswith(r, "/s3ckpt.check.json") || endswith(r, "/*/s3ckpt.json")])
      if s.Effect == "Allow" && contains(flatten([s.Action]), "s3:PutObject")
    ])
    error_message = "the pruner's only allowed PutObject must be on lease keys, stock .metadata copies, check records and commit markers (fences)"
  }

  assert {
    condition = !anytrue(flatten([
      for s in jsondecode(aws_iam_role_policy.pruner.policy).Statement : contains(flatten([s.Action]), "s3:DeleteObjectVersion") if s.Effect == "Allow"
    ]))
    error_message = "by default the pruner must not delete versions (versioning keeps prunes recoverable)"
  }

  assert {
    condition = anytrue([
      for s in jsondecode(aws_iam_role_policy.pruner.policy).Statement :
      s.Effect == "Allow" && toset(flatten([s.Action])) == toset(["s3:GetBucketVersioning", "s3:GetLifecycleConfiguration"]) && try(s.Resource, null) == "arn:aws:s3:::s3ckpt-unit-test"
    ])
    error_message = "the pruner must read the bucket's versioning and lifecycle (prune reports noncurrent bytes)"
  }

  assert {
    condition = alltrue([
      for r in aws_s3_bucket_lifecycle_configuration.this.rule : r.filter[0].prefix == "" if r.id == "expire-noncurrent-versions"
    ]) && var.noncurrent_version_expiration_days == 7
    error_message = "noncurrent versions of every object (checkpoints included) expire, after 7 days by default"
  }

  assert {
    condition = [
      for r in aws_s3_bucket_lifecycle_configuration.this.rule : r.abort_incomplete_multipart_upload[0].days_after_initiation
      if r.id == "abort-incomplete-multipart-uploads"
    ] == [3]
    error_message = "abort_incomplete_multipart_days defaults to 3"
  }

  assert {
    condition     = alltrue([for r in aws_s3_bucket_lifecycle_configuration.this.rule : r.status == "Enabled" && r.filter[0].prefix == ""])
    error_message = "every lifecycle rule must be enabled and cover the whole bucket (empty prefix)"
  }

  assert {
    condition = anytrue([
      for s in jsondecode(aws_iam_role_policy.trainer.policy).Statement :
      s.Effect == "Deny" && s.Action == "s3:PutObject" && toset(flatten([s.Resource])) == toset([
        "arn:aws:s3:::s3ckpt-unit-test/checkpoints/*/s3ckpt.pin.json",
        "arn:aws:s3:::s3ckpt-unit-test/checkpoints/s3ckpt.lease",
        "arn:aws:s3:::s3ckpt-unit-test/checkpoints/*/s3ckpt.lease",
        "arn:aws:s3:::s3ckpt-unit-test/checkpoints/s3ckpt.lease.probe-*",
        "arn:aws:s3:::s3ckpt-unit-test/checkpoints/*/s3ckpt.lease.probe-*",
      ])
    ])
    error_message = "the trainer must be explicitly denied writing pins and the pruner's lease"
  }

  assert {
    condition     = length(aws_iam_role_policy.trainer_prune) == 0
    error_message = "trainer_may_prune defaults to false: no delete policy on the trainer"
  }

  assert {
    condition = alltrue([
      for s in jsondecode(aws_iam_role_policy.pruner.policy).Statement :
      !contains(flatten([try(s.Resource, [])]), "arn:aws:s3:::s3ckpt-unit-test/checkpoints/*/s3ckpt.pin.json")
      if s.Effect == "Allow"
    ])
    error_message = "the pruner must not be allowed anything on pin keys specifically (its Put* deny covers them)"
  }

  assert {
    condition = [
      for s in jsondecode(output.pin_policy_json).Statement : s.Resource
      if s.Effect == "Allow" && contains(flatten([s.Action]), "s3:PutObject")
    ] == [["arn:aws:s3:::s3ckpt-unit-test/checkpoints/*/s3ckpt.pin.json"]]
    error_message = "pin_policy_json may write pin keys and nothing else"
  }
}

run "tiers" {
  command = plan

  variables {
    tier_storage_classes = ["STANDARD_IA", "GLACIER_IR", "GLACIER"]
    pruner_tier_method   = "tag"
  }

  assert {
    condition = {
      for r in aws_s3_bucket_lifecycle_configuration.this.rule : r.id => [
        r.filter[0].and[0].prefix, r.filter[0].and[0].tags["s3ckpt-tier"],
        one(r.transition).storage_class, one(r.transition).days,
      ] if startswith(r.id, "s3ckpt-tier-")
      } == {
      "s3ckpt-tier-standard_ia" = ["checkpoints/", "STANDARD_IA", "STANDARD_IA", 30]
      "s3ckpt-tier-glacier_ir"  = ["checkpoints/", "GLACIER_IR", "GLACIER_IR", 0]
      "s3ckpt-tier-glacier"     = ["checkpoints/", "GLACIER", "GLACIER", 0]
    }
    error_message = "one rule per tier class: objects under the prefix tagged s3ckpt-tier = CLASS move to CLASS (IA after S3's 30 days)"
  }

  assert {
    condition = anytrue([
      for s in jsondecode(aws_iam_role_policy.pruner.policy).Statement :
      s.Effect == "Allow" && toset(flatten([s.Action])) == toset(["s3:GetObjectTagging", "s3:PutObjectTagging"]) && try(s.Resource, null) == "arn:aws:s3:::s3ckpt-unit-test/checkpoints/*"
    ])
    error_message = "with pruner_tier_method = tag the pruner may tag checkpoint objects"
  }

  assert {
    condition = anytrue([
      for s in jsondecode(aws_iam_role_policy.pruner.policy).Statement :
      s.Effect == "Deny" && contains(flatten([s.Action]), "s3:PutObject") && contains(flatten([s.Action]), "s3:RestoreObject") && toset(try(s.NotResource, [])) == toset([
        "arn:aws:s3:::s3ckpt-unit-test/checkpoints/s3ckpt.lease",
        "arn:aws:s3:::s3ckpt-unit-test/checkpoints/*/s3ckpt.lease",
        "arn:aws:s3:::s3ckpt-unit-test/checkpoints/s3ckpt.lease.probe-*",
        "arn:aws:s3:::s3ckpt-unit-test/checkpoints/*/s3ckpt.lease.probe-*",
        "arn:aws:s3:::s3ckpt-unit-test/checkpoints/*/.metadata",
        "arn:aws:s3:::s3ckpt-unit-test/checkpoints/s3ckpt.check.json",
        "arn:aws:s3:::s3ckpt-unit-test/checkpoints/*/s3ckpt.check.json",
        "arn:aws:s3:::s3ckpt-unit-test/checkpoints/*/s3ckpt.json",
      ])
    ])
    error_message = "a tagging pruner must still be denied every object write under the prefix but its lease, .metadata copies, check records and commit markers (fences)"
  }

  assert {
    condition = alltrue([
      for s in jsondecode(aws_iam_role_policy.pruner.policy).Statement :
      alltrue([for r in flatten([s.Resource]) : endswith(r, "/s3ckpt.lease") || endswith(r, "/s3ckpt.lease.probe-*") || endswith(r, "/*/.metadata") || endswith(r, "/s3ckpt.check.json") || endswith(r, "/*/s3ckpt.json")])
      if s.Effect == "Allow" && contains(flatten([s.Action]), "s3:PutObject")
    ])
    error_message = "tagging gives the pruner no PutObject on checkpoint data"
  }

  assert {
    condition = [
      for s in jsondecode(output.restore_policy_json).Statement : flatten([s.Action])
      if s.Effect == "Allow" && contains(flatten([s.Action]), "s3:RestoreObject")
    ] == [["s3:GetObject", "s3:RestoreObject"]]
    error_message = "restore_policy_json restores and reads checkpoint objects"
  }
}

run "copy_tiers" {
  command = plan

  variables {
    pruner_tier_method = "copy"
  }

  assert {
    condition = anytrue([
      for s in jsondecode(aws_iam_role_policy.pruner.policy).Statement :
      s.Effect == "Allow" && contains(flatten([s.Action]), "s3:PutObject") && try(s.Resource, null) == "arn:aws:s3:::s3ckpt-unit-test/checkpoints/*"
      ]) && anytrue([
      for s in jsondecode(aws_iam_role_policy.pruner.policy).Statement :
      s.Effect == "Deny" && s.Action == "s3:PutObject" && try(s.Resource, null) == ["arn:aws:s3:::s3ckpt-unit-test/checkpoints/*/s3ckpt.pin.json"]
    ])
    error_message = "copy tiers: the pruner may copy checkpoint objects (PutObject under the prefix) and still never write pins"
  }

  assert {
    condition     = length([for r in aws_s3_bucket_lifecycle_configuration.this.rule : r if startswith(r.id, "s3ckpt-tier-")]) == 0
    error_message = "no tier lifecycle rules unless tier_storage_classes names classes"
  }
}

run "settings_follow_variables" {
  command = plan

  variables {
    checkpoint_prefix                  = "teams/llm"
    abort_incomplete_multipart_days    = 5
    noncurrent_version_expiration_days = 11
    enforce_tls                        = false
    versioning_enabled                 = false
    pruner_can_delete_versions         = true
    trainer_may_prune                  = true
    trainer_trust = {
      aws_principals = ["arn:aws:iam::111122223333:role/gpu-nodes"]
      services       = ["ec2.amazonaws.com", "pods.eks.amazonaws.com"]
      oidc = [{
        provider_arn = "arn:aws:iam::111122223333:oidc-provider/oidc.eks.eu-west-1.amazonaws.com/id/ABC"
        subjects     = ["system:serviceaccount:ml:trainer"]
      }]
    }
  }

  assert {
    condition = [
      for r in aws_s3_bucket_lifecycle_configuration.this.rule : r.abort_incomplete_multipart_upload[0].days_after_initiation
      if r.id == "abort-incomplete-multipart-uploads"
    ] == [5]
    error_message = "abort-incomplete-multipart-uploads must use abort_incomplete_multipart_days"
  }

  assert {
    condition = [
      for r in aws_s3_bucket_lifecycle_configuration.this.rule : r.noncurrent_version_expiration[0].noncurrent_days
      if r.id == "expire-noncurrent-versions"
    ] == [11]
    error_message = "expire-noncurrent-versions must use noncurrent_version_expiration_days"
  }

  assert {
    condition = [
      for r in aws_s3_bucket_lifecycle_configuration.this.rule : r.expiration[0].expired_object_delete_marker
      if r.id == "remove-expired-delete-markers"
    ] == [true]
    error_message = "remove-expired-delete-markers must remove expired delete markers"
  }

  assert {
    condition     = length(aws_s3_bucket_policy.tls_only) == 0
    error_message = "enforce_tls = false must not attach the bucket policy"
  }

  assert {
    condition = anytrue([
      for s in jsondecode(aws_iam_role_policy.pruner.policy).Statement : contains(flatten([s.Action]), "s3:DeleteObjectVersion") if s.Effect == "Allow"
    ])
    error_message = "pruner_can_delete_versions = true must grant s3:DeleteObjectVersion"
  }

  assert {
    condition     = one(aws_s3_bucket_versioning.this.versioning_configuration).status == "Suspended"
    error_message = "versioning_enabled = false must suspend versioning"
  }

  assert {
    condition     = output.checkpoint_prefix == "teams/llm/" && output.checkpoint_url == "s3://s3ckpt-unit-test/teams/llm/"
    error_message = "a prefix without a trailing slash must get one"
  }

  assert {
    condition = anytrue([
      for s in jsondecode(aws_iam_role_policy.trainer.policy).Statement : try(s.Resource, null) == "arn:aws:s3:::s3ckpt-unit-test/teams/llm/*"
    ])
    error_message = "policies must use the normalised prefix"
  }

  assert {
    condition = jsondecode(aws_iam_role.pruner.assume_role_policy).Statement == [{
      Sid       = "AssumeFromNamedPrincipals"
      Effect    = "Allow"
      Action    = "sts:AssumeRole"
      Principal = { AWS = ["arn:aws:iam::111122223333:role/retention-cron"] }
    }]
    error_message = "the pruner trust must name exactly the given role"
  }

  assert {
    condition = anytrue([
      for s in jsondecode(aws_iam_role.trainer.assume_role_policy).Statement :
      try(s.Principal.Service, null) != null && contains(flatten([s.Action]), "sts:TagSession")
    ])
    error_message = "EKS Pod Identity needs sts:TagSession"
  }

  assert {
    condition = anytrue([
      for s in jsondecode(aws_iam_role.trainer.assume_role_policy).Statement :
      s.Action == "sts:AssumeRoleWithWebIdentity" &&
      try(s.Condition.StringEquals["oidc.eks.eu-west-1.amazonaws.com/id/ABC:sub"], null) == ["system:serviceaccount:ml:trainer"] &&
      try(s.Condition.StringEquals["oidc.eks.eu-west-1.amazonaws.com/id/ABC:aud"], null) == "sts.amazonaws.com"
    ])
    error_message = "IRSA trust must pin the service account subject and the STS audience"
  }

  assert {
    condition     = !strcontains(aws_iam_role.trainer.assume_role_policy, ":root") && !strcontains(aws_iam_role.pruner.assume_role_policy, ":root")
    error_message = "no role may trust an account root"
  }

  assert {
    condition = length(aws_iam_role_policy.trainer_prune) == 1 && anytrue([
      for s in jsondecode(aws_iam_role_policy.trainer_prune[0].policy).Statement :
      s.Effect == "Allow" && s.Resource == "arn:aws:s3:::s3ckpt-unit-test/teams/llm/*" &&
      contains(s.Action, "s3:DeleteObject") && contains(s.Action, "s3:DeleteObjectVersion")
    ])
    error_message = "trainer_may_prune = true must give the trainer the pruner's delete statement"
  }

  assert {
    condition = anytrue([
      for s in jsondecode(aws_iam_role_policy.trainer.policy).Statement :
      s.Effect == "Deny" && flatten([s.Resource]) == ["arn:aws:s3:::s3ckpt-unit-test/teams/llm/*/s3ckpt.pin.json"]
    ])
    error_message = "a trainer that prunes may write the lease but still not pins"
  }
}

# --- variable validation -------------------------------------------------------------------
# Each run sets several bad variables at once; expect_failures fails the run unless every listed
# variable's validation fires (and nothing else fails).

run "rejects_invalid_values" {
  command = plan

  variables {
    bucket_name                        = "My.Bucket"
    checkpoint_prefix                  = "/checkpoints/"
    abort_incomplete_multipart_days    = 0
    noncurrent_version_expiration_days = 1.5
    trainer_trust = {
      aws_principals = ["arn:aws:iam::111122223333:root"]
    }
    pruner_trust = {
      aws_principals = ["111122223333"]
    }
    kms_deletion_window_days = 3
  }

  expect_failures = [
    var.bucket_name,
    var.checkpoint_prefix,
    var.abort_incomplete_multipart_days,
    var.noncurrent_version_expiration_days,
    var.trainer_trust,
    var.pruner_trust,
    var.kms_deletion_window_days,
  ]
}

run "rejects_more_invalid_values" {
  command = plan

  variables {
    bucket_name                        = "xn--checkpoints"
    checkpoint_prefix                  = "checkpoints/*"
    noncurrent_version_expiration_days = 0
    trainer_trust = {
      oidc = [{
        provider_arn = "arn:aws:iam::111122223333:oidc-provider/oidc.eks.eu-west-1.amazonaws.com/id/ABC"
        subjects     = ["*"]
      }]
    }
    pruner_trust = {}
  }

  expect_failures = [
    var.bucket_name,
    var.checkpoint_prefix,
    var.noncurrent_version_expiration_days,
    var.trainer_trust,
    var.pruner_trust,
  ]
}
