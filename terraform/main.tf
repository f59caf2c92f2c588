# The checkpoint bucket: private, owner-enforced, SSE-KMS with a bucket key, optional
# versioning, lifecycle rules for the debris that checkpointing leaves, and TLS-only access.

data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}
data "aws_region" "current" {}

locals {
  # "checkpoints" and "checkpoints/" mean the same prefix; everything below uses the slash form.
  prefix     = "${trimsuffix(var.checkpoint_prefix, "/")}/"
  bucket_arn = "arn:${data.aws_partition.current.partition}:s3:::${var.bucket_name}"
  # Every object under the checkpoint prefix (runs, steps, markers, pins, leases).
  objects_arn = "${local.bucket_arn}/${local.prefix}*"
  # s3ckpt's lease: the retention pruner takes it with a conditional PUT (If-None-Match: *,
  # then If-Match to renew and release) at {run}/s3ckpt.lease. A run may be the prefix itself
  # or any path below it. Before its first lease a pruner process probes what the store
  # enforces on a key of its own beside it, {run}/s3ckpt.lease.probe-<id>, and deletes it
  # (never on the lease another pruner may hold). These are the only keys the pruner may write.
  lease_arns = [
    "${local.bucket_arn}/${local.prefix}s3ckpt.lease",
    "${local.bucket_arn}/${local.prefix}*/s3ckpt.lease",
    "${local.bucket_arn}/${local.prefix}s3ckpt.lease.probe-*",
    "${local.bucket_arn}/${local.prefix}*/s3ckpt.lease.probe-*",
  ]
  # The plain .metadata of a checkpoint: a copy of the committed .metadata.<tag> for stock DCP
  # readers, written after the commit marker. `s3ckpt gc` rolls a commit interrupted before
  # that copy forward by writing it (docs/dcp.md, "The commit protocol"), so the pruner may
  # write these keys, and only these and its lease.
  stock_metadata_arns = ["${local.bucket_arn}/${local.prefix}*/.metadata"]
  # `s3ckpt check` (the cron image's weekly scrub) records what it found per run in
  # {run}/s3ckpt.check.json, which `s3ckpt ls` reads to mark damaged checkpoints.
  check_record_arns = [
    "${local.bucket_arn}/${local.prefix}s3ckpt.check.json",
    "${local.bucket_arn}/${local.prefix}*/s3ckpt.check.json",
  ]
  # gc, prune and rm fence a checkpoint before deleting any of it: a tombstone PUT on its commit
  # marker (If-Match / If-None-Match; gc also rewrites a marker to record reaped saves).
  marker_arns       = ["${local.bucket_arn}/${local.prefix}*/s3ckpt.json"]
  pruner_write_arns = concat(local.lease_arns, local.stock_metadata_arns, local.check_record_arns, local.marker_arns)
  # Pins ({checkpoint}/s3ckpt.pin.json, written by `s3ckpt pin`) are an operator action: neither
  # role may write them (docs/operations.md, "Pins").
  pin_arns = ["${local.bucket_arn}/${local.prefix}*/s3ckpt.pin.json"]
  # S3 calls KMS on the caller's behalf; kms:ViaService pins key use to that path.
  s3_service = "s3.${data.aws_region.current.name}.amazonaws.com"
}

resource "aws_s3_bucket" "this" {
  #checkov:skip=CKV_AWS_18: Server access logs need a second, differently-governed bucket that this module does not own; enable CloudTrail S3 data events or logging to your central log bucket (docs/operations.md).
  #checkov:skip=CKV_AWS_144: Cross-region replication doubles the storage of multi-TB checkpoints; a checkpoint can be re-created by training, and replication is a per-deployment decision.
  #checkov:skip=CKV2_AWS_62: Nothing consumes bucket events: s3ckpt finds checkpoints by listing and by the s3ckpt.json commit marker.
  #checkov:skip=CKV_AWS_21: Versioning is the caller's choice (var.versioning_enabled, default on) and lives in aws_s3_bucket_versioning; see the pruner trade-off in docs/operations.md.
  bucket = var.bucket_name
  tags   = var.tags
}

resource "aws_s3_bucket_public_access_block" "this" {
  bucket                  = aws_s3_bucket.this.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "this" {
  bucket = aws_s3_bucket.this.id
  rule {
    # ACLs off: the bucket owner owns every object, whoever uploaded it.
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_versioning" "this" {
  bucket = aws_s3_bucket.this.id
  versioning_configuration {
    # "Suspended", not "Disabled": a bucket that was ever versioned cannot go back to Disabled,
    # so Suspended is the value that works both on creation and when turning versioning off later.
    status = var.versioning_enabled ? "Enabled" : "Suspended"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "this" {
  bucket = aws_s3_bucket.this.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = aws_kms_key.this.arn
    }
    # One data key per bucket instead of one KMS call per object/part: a sharded save with
    # thousands of parts would otherwise be throttled by KMS request quotas and billed per call.
    bucket_key_enabled = true
  }
}

# The rules cover the whole bucket (an empty prefix): the bucket holds nothing but checkpoints,
# and debris outside the prefix (an upload by an admin, a mis-set prefix) costs the same.
resource "aws_s3_bucket_lifecycle_configuration" "this" {
  bucket = aws_s3_bucket.this.id

  rule {
    # A trainer killed mid-save (OOM, pre-emption, node loss) cannot abort its uploads; their
    # parts are billed but invisible to ListObjects until S3 aborts them here.
    id     = "abort-incomplete-multipart-uploads"
    status = "Enabled"
    filter {
      prefix = ""
    }
    abort_incomplete_multipart_upload {
      days_after_initiation = var.abort_incomplete_multipart_days
    }
  }

  rule {
    # With versioning on, every prune or overwrite leaves a noncurrent version: the recovery
    # window for a wrong prune, removed here so deleted checkpoints stop costing money.
    id     = "expire-noncurrent-versions"
    status = "Enabled"
    filter {
      prefix = ""
    }
    noncurrent_version_expiration {
      noncurrent_days = var.noncurrent_version_expiration_days
    }
  }

  rule {
    # Once the noncurrent versions under a delete marker have expired, the marker alone is left;
    # thousands of them slow every listing s3ckpt does. Remove them.
    id     = "remove-expired-delete-markers"
    status = "Enabled"
    filter {
      prefix = ""
    }
    expiration {
      expired_object_delete_marker = true
    }
  }

  # The lifecycle alternative to copy-based tiers (docs/retention.md): `prune --apply` with a
  # policy's `method = "tag"` tags what a tier selects with s3ckpt-tier = <CLASS>, and S3 moves
  # it at its next daily lifecycle run (IA classes once the object is 30 days old, S3's floor).
  # Only under the checkpoint prefix: a tag elsewhere is not s3ckpt's.
  dynamic "rule" {
    for_each = toset(var.tier_storage_classes)
    content {
      id     = "s3ckpt-tier-${lower(rule.value)}"
      status = "Enabled"
      filter {
        and {
          prefix = local.prefix
          tags   = { "s3ckpt-tier" = rule.value }
        }
      }
      transition {
        days          = contains(["STANDARD_IA", "ONEZONE_IA"], rule.value) ? 30 : 0
        storage_class = rule.value
      }
    }
  }

  # Lifecycle rules about versions need the versioning state settled first.
  depends_on = [aws_s3_bucket_versioning.this]
}

locals {
  # Deny, for every principal, any request that is not TLS 1.2 or newer.
  tls_only_policy = {
    Version = "2012-10-17"
    Statement = [
      {
        Sid       = "DenyInsecureTransport"
        Effect    = "Deny"
        Principal = "*"
        Action    = "s3:*"
        Resource  = [local.bucket_arn, "${local.bucket_arn}/*"]
        Condition = { Bool = { "aws:SecureTransport" = "false" } }
      },
      {
        Sid       = "DenyTLSOlderThan12"
        Effect    = "Deny"
        Principal = "*"
        Action    = "s3:*"
        Resource  = [local.bucket_arn, "${local.bucket_arn}/*"]
        Condition = { NumericLessThan = { "s3:TlsVersion" = "1.2" } }
      },
    ]
  }
}

resource "aws_s3_bucket_policy" "tls_only" {
  count  = var.enforce_tls ? 1 : 0
  bucket = aws_s3_bucket.this.id
  policy = jsonencode(local.tls_only_policy)

  # S3 rejects policy writes that race the public access block being applied.
  depends_on = [aws_s3_bucket_public_access_block.this]
}
