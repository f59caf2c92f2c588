# Two least-privilege roles:
#
#   trainer  read, write and multipart-upload checkpoints under the prefix; never delete
#            (unless trainer_may_prune); never write pins or the pruner's lease.
#   pruner   list, read and delete under the prefix; every write is explicitly denied except
#            its lease objects ({run}/s3ckpt.lease, a conditional PUT that keeps two pruners
#            from racing, and the capability probe beside it, {run}/s3ckpt.lease.probe-<id>)
#            and the plain {checkpoint}/.metadata copy that gc rolls forward.
#   neither  writes pins ({checkpoint}/s3ckpt.pin.json): `s3ckpt pin` is an operator action.
#
# s3ckpt's request -> IAM action map (S3 authorises multipart parts as s3:PutObject):
#   PutObject, CreateMultipartUpload, UploadPart, CompleteMultipartUpload  s3:PutObject
#   GetObject, HeadObject (ranged or not)                                  s3:GetObject
#   AbortMultipartUpload                                                   s3:AbortMultipartUpload
#   ListParts                                                              s3:ListMultipartUploadParts
#   ListObjectsV2                                                          s3:ListBucket
#   ListMultipartUploads                                                   s3:ListBucketMultipartUploads
#   DeleteObject, DeleteObjects (checked per key)                          s3:DeleteObject
#   CopyObject onto itself, UploadPartCopy (a tier's move)                 s3:GetObject + s3:PutObject
#   PutObjectTagging, GetObjectTagging (lifecycle tiers; a copy's tags)    s3:PutObjectTagging, s3:GetObjectTagging
#   RestoreObject (`s3ckpt restore`, an operator: output restore_policy_json) s3:RestoreObject
#   GetBucketVersioning, GetBucketLifecycleConfiguration (prune/ls/report)  s3:GetBucketVersioning, s3:GetLifecycleConfiguration
#   ListObjectVersions (noncurrent bytes under a run; versioned buckets)    s3:ListBucketVersions
#
# Policies are plain jsonencode() documents rather than aws_iam_policy_document data sources,
# so `terraform test` with a mock provider can read and assert on them (tests/*.tftest.hcl).

locals {
  # Both roles may use the key only through S3 and only for this bucket. With a bucket key the
  # encryption context is the bucket ARN; objects written before it carry their own ARN.
  kms_via_s3_condition = {
    StringEquals = { "kms:ViaService" = local.s3_service }
    StringLike   = { "kms:EncryptionContext:aws:s3:arn" = [local.bucket_arn, local.objects_arn] }
  }

  list_prefix_condition = {
    StringLike = { "s3:prefix" = ["${local.prefix}*"] }
  }

  trust_policies = {
    for role, trust in { trainer = var.trainer_trust, pruner = var.pruner_trust } : role => {
      Version                    = "2012-10-17"
      # One statement per principal type, each with the actions that type needs.
      Statement = concat(
        length(trust.aws_principals) == 0 ? [] : [{
          Sid       = "AssumeFromNamedPrincipals"
          Effect    = "Allow"
          Action    = "sts:AssumeRole"
          Principal = { AWS = trust.aws_principals }
        }],
        length(trust.services) == 0 ? [] : [{
          Sid    = "AssumeFromServices"
          Effect = "Allow"
          # EKS Pod Identity tags the session it creates, so it needs sts:TagSession as well.
          Action    = contains(trust.services, "pods.eks.amazonaws.com") ? ["sts:AssumeRole", "sts:TagSession"] : ["sts:AssumeRole"]
          Principal = { Service = trust.services }
        }],
        [for i, o in trust.oidc : {
          Sid       = "AssumeFromOidc${i}"
          Effect    = "Allow"
          Action    = "sts:AssumeRoleWithWebIdentity"
          Principal = { Federated = o.provider_arn }
          Condition = {
            StringEquals = {
              "${split("oidc-provider/", o.provider_arn)[1]}:sub" = o.subjects
              "${split("oidc-provider/", o.provider_arn)[1]}:aud" = "sts.amazonaws.com"
            }
          }
        }],
      )
    }
  }

  trainer_policy = {
    Version = "2012-10-17"
    Statement = [
      {
        Sid       = "ListCheckpointPrefix"
        Effect    = "Allow"
        Action    = "s3:ListBucket"
        Resource  = local.bucket_arn
        Condition = local.list_prefix_condition
      },
      {
        # ListMultipartUploads has no s3:prefix condition key. It reveals the key names of
        # uploads in progress, nothing more, and lets a restarted trainer find its leftovers.
        Sid      = "ListMultipartUploads"
        Effect   = "Allow"
        Action   = "s3:ListBucketMultipartUploads"
        Resource = local.bucket_arn
      },
      {
        Sid    = "ReadWriteCheckpointObjects"
        Effect = "Allow"
        Action = [
          "s3:GetObject",
          "s3:PutObject",
          "s3:AbortMultipartUpload",
          "s3:ListMultipartUploadParts",
        ]
        Resource = local.objects_arn
      },
      {
        # Pins are an operator action, and the lease belongs to the pruner (a trainer that
        # prunes in-process, trainer_may_prune, takes the lease too).
        Sid      = "DenyPinAndLeaseWrites"
        Effect   = "Deny"
        Action   = "s3:PutObject"
        Resource = var.trainer_may_prune ? local.pin_arns : concat(local.pin_arns, local.lease_arns)
      },
      {
        Sid       = "UseCheckpointKeyThroughS3"
        Effect    = "Allow"
        Action    = ["kms:GenerateDataKey", "kms:Decrypt"]
        Resource  = aws_kms_key.this.arn
        Condition = local.kms_via_s3_condition
      },
    ]
  }

  # The pruner's deletes, shared with the trainer when trainer_may_prune is set.
  delete_statement = {
    Sid    = "DeleteCheckpointObjects"
    Effect = "Allow"
    Action = concat(
      ["s3:DeleteObject", "s3:AbortMultipartUpload"],
      var.pruner_can_delete_versions ? ["s3:DeleteObjectVersion"] : [],
    )
    Resource = local.objects_arn
  }

  trainer_prune_policy = {
    Version   = "2012-10-17"
    Statement = [local.delete_statement]
  }

  # For the people (or the admin automation) who run `s3ckpt pin` / `s3ckpt unpin`: attach to
  # their own role. Not attached to anything by this module (output pin_policy_json).
  pin_policy = {
    Version = "2012-10-17"
    Statement = [
      {
        Sid       = "ListCheckpointPrefix"
        Effect    = "Allow"
        Action    = "s3:ListBucket"
        Resource  = local.bucket_arn
        Condition = local.list_prefix_condition
      },
      {
        Sid      = "ReadCheckpointObjects"
        Effect   = "Allow"
        Action   = "s3:GetObject"
        Resource = local.objects_arn
      },
      {
        Sid      = "WriteAndRemovePins"
        Effect   = "Allow"
        Action   = ["s3:PutObject", "s3:DeleteObject"]
        Resource = local.pin_arns
      },
      {
        Sid       = "UseCheckpointKeyThroughS3"
        Effect    = "Allow"
        Action    = ["kms:GenerateDataKey", "kms:Decrypt"]
        Resource  = aws_kms_key.this.arn
        Condition = local.kms_via_s3_condition
      },
    ]
  }

  # Storage tiers (var.pruner_tier_method): "tag" lets the pruner tag checkpoint objects for
  # the lifecycle rules; "copy" also lets it copy them onto themselves with a new class.
  pruner_tiers     = var.pruner_tier_method != "none"
  pruner_tier_acts = concat(["s3:GetObjectTagging", "s3:PutObjectTagging"], var.pruner_tier_method == "copy" ? ["s3:PutObject"] : [])
  # Object writes the pruner is denied under the prefix when it applies tiers (the bucket-wide
  # Deny then stops at the prefix): every write of bytes, ACLs and locks but its own.
  pruner_tier_denied = concat(
    var.pruner_tier_method == "copy" ? [] : ["s3:PutObject"],
    ["s3:PutObjectAcl", "s3:PutObjectVersionAcl", "s3:PutObjectRetention", "s3:PutObjectLegalHold", "s3:PutObjectVersionTagging", "s3:Replicate*", "s3:RestoreObject"],
  )

  pruner_tier_statements = [
    for st in [
      {
        Sid      = "TierCheckpointObjects"
        Effect   = "Allow"
        Action   = local.pruner_tier_acts
        Resource = local.objects_arn
      },
      {
        Sid         = "DenyObjectWritesButTiers"
        Effect      = "Deny"
        Action      = local.pruner_tier_denied
        NotResource = local.pruner_write_arns
      },
      {
        Sid      = "DenyPinWrites"
        Effect   = "Deny"
        Action   = "s3:PutObject"
        Resource = local.pin_arns
      },
    ] : st if local.pruner_tiers && (st.Sid != "DenyPinWrites" || var.pruner_tier_method == "copy")
  ]

  # For whoever runs `s3ckpt restore` (an operator: a restore is billed per GB retrieved and
  # is a decision, like a pin). Not attached to anything by this module (output
  # restore_policy_json). HEAD and the load afterwards are s3:GetObject.
  restore_policy = {
    Version = "2012-10-17"
    Statement = [
      {
        Sid       = "ListCheckpointPrefix"
        Effect    = "Allow"
        Action    = "s3:ListBucket"
        Resource  = local.bucket_arn
        Condition = local.list_prefix_condition
      },
      {
        Sid      = "RestoreCheckpointObjects"
        Effect   = "Allow"
        Action   = ["s3:GetObject", "s3:RestoreObject"]
        Resource = local.objects_arn
      },
      {
        Sid       = "UseCheckpointKeyThroughS3"
        Effect    = "Allow"
        Action    = "kms:Decrypt"
        Resource  = aws_kms_key.this.arn
        Condition = local.kms_via_s3_condition
      },
    ]
  }

  pruner_policy = {
    Version = "2012-10-17"
    Statement = concat([
      {
        Sid       = "ListCheckpointPrefix"
        Effect    = "Allow"
        Action    = ["s3:ListBucket", "s3:ListBucketVersions"]
        Resource  = local.bucket_arn
        Condition = local.list_prefix_condition
      },
      {
        Sid      = "ListMultipartUploads"
        Effect   = "Allow"
        Action   = "s3:ListBucketMultipartUploads"
        Resource = local.bucket_arn
      },
      {
        # prune, ls and report say what a versioned bucket keeps as noncurrent versions and
        # when the lifecycle rule expires them (read only; the pruner deletes no versions).
        Sid      = "ReadVersioningAndLifecycle"
        Effect   = "Allow"
        Action   = ["s3:GetBucketVersioning", "s3:GetLifecycleConfiguration"]
        Resource = local.bucket_arn
      },
      {
        # Commit markers (s3ckpt.json) to plan from, pins to honour, the lease to check.
        Sid      = "ReadCheckpointObjects"
        Effect   = "Allow"
        Action   = "s3:GetObject"
        Resource = local.objects_arn
      },
      # Checkpoints, `s3ckpt gc` debris (a failed save's partial objects, stale uploads), and
      # the lease when released.
      local.delete_statement,
      {
        # The lease, the stock .metadata copy gc restores from the committed .metadata.<tag>
        # after an interrupted commit (checked against the marker first), check records, and
        # commit markers: the tombstone that fences a checkpoint before its deletion.
        Sid      = "WriteLeaseAndStockMetadata"
        Effect   = "Allow"
        Action   = "s3:PutObject"
        Resource = local.pruner_write_arns
      },
      {
        # Explicit, so no policy attached to this role later (a broad managed policy, a
        # copy-paste) can let the retention job write or reconfigure anything. NotResource
        # keeps those keys writable and matches every other resource in every bucket.
        Sid    = "DenyAllWritesExceptLease"
        Effect = "Deny"
        Action = [
          "s3:Put*",
          "s3:Replicate*",
          "s3:RestoreObject",
          "s3:CreateBucket",
          "s3:DeleteBucket*",
        ]
        # With tiers the pruner writes tags (or copies) under the prefix: this Deny stops there,
        # and DenyObjectWritesButTiers keeps every other object write under it denied.
        NotResource = local.pruner_tiers ? tolist([local.objects_arn]) : tolist(local.pruner_write_arns)
      },
      {
        # Decrypt to read markers; GenerateDataKey because the lease object is encrypted too.
        Sid       = "UseCheckpointKeyThroughS3"
        Effect    = "Allow"
        Action    = ["kms:GenerateDataKey", "kms:Decrypt"]
        Resource  = aws_kms_key.this.arn
        Condition = local.kms_via_s3_condition
      },
    ], local.pruner_tier_statements)
  }
}

resource "aws_iam_role" "trainer" {
  name                 = "${var.name}-trainer"
  description          = "s3ckpt trainer: read/write checkpoints under s3://${var.bucket_name}/${local.prefix}, ${var.trainer_may_prune ? "and prune them" : "no deletes"}"
  assume_role_policy   = jsonencode(local.trust_policies["trainer"])
  max_session_duration = var.max_session_duration
  permissions_boundary = var.permissions_boundary_arn
  tags                 = var.tags
}

resource "aws_iam_role_policy" "trainer" {
  name   = "s3ckpt-trainer"
  role   = aws_iam_role.trainer.id
  policy = jsonencode(local.trainer_policy)
}

# In-process retention (Checkpointer(policy=...)) in the training job: the pruner's deletes.
resource "aws_iam_role_policy" "trainer_prune" {
  count  = var.trainer_may_prune ? 1 : 0
  name   = "s3ckpt-trainer-prune"
  role   = aws_iam_role.trainer.id
  policy = jsonencode(local.trainer_prune_policy)
}

resource "aws_iam_role" "pruner" {
  name                 = "${var.name}-pruner"
  description          = "s3ckpt pruner: list/read/delete checkpoints under s3://${var.bucket_name}/${local.prefix}, writes denied except its lease"
  assume_role_policy   = jsonencode(local.trust_policies["pruner"])
  max_session_duration = var.max_session_duration
  permissions_boundary = var.permissions_boundary_arn
  tags                 = var.tags
}

resource "aws_iam_role_policy" "pruner" {
  name   = "s3ckpt-pruner"
  role   = aws_iam_role.pruner.id
  policy = jsonencode(local.pruner_policy)
}
