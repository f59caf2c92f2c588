# Customer-managed key for the bucket's default encryption. Key *use* is granted to the
# trainer and pruner roles by their IAM policies (iam.tf), and only through S3; the key policy
# delegates to this account's IAM, which is AWS's default and keeps the key manageable.

locals {
  kms_policy = {
    Version = "2012-10-17"
    Statement = [{
      # In a key policy, Resource "*" means "this key"; it cannot be narrower.
      Sid       = "DelegateKeyAccessToAccountIAM"
      Effect    = "Allow"
      Action    = "kms:*"
      Resource  = "*"
      Principal = { AWS = "arn:${data.aws_partition.current.partition}:iam::${data.aws_caller_identity.current.account_id}:root" }
    }]
  }
}

resource "aws_kms_key" "this" {
  description             = "s3ckpt checkpoints in s3://${var.bucket_name}/${local.prefix}"
  enable_key_rotation     = true
  deletion_window_in_days = var.kms_deletion_window_days
  policy                  = jsonencode(local.kms_policy)
  tags                    = var.tags
}

resource "aws_kms_alias" "this" {
  name          = "alias/${var.name}-checkpoints"
  target_key_id = aws_kms_key.this.key_id
}
