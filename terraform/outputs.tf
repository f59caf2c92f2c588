output "bucket_name" {
  description = "Name of the checkpoint bucket."
  value       = aws_s3_bucket.this.id
}

output "bucket_arn" {
  description = "ARN of the checkpoint bucket."
  value       = aws_s3_bucket.this.arn
}

output "region" {
  description = "Region of the bucket (AWS_REGION for s3ckpt's S3Config.region)."
  value       = data.aws_region.current.name
}

output "checkpoint_prefix" {
  description = "The normalised key prefix (always ends in '/')."
  value       = local.prefix
}

output "checkpoint_url" {
  description = "s3://BUCKET/PREFIX/ — the root to give s3ckpt (Checkpointer(f\"{url}{run}\"), s3ckpt prune URL)."
  value       = "s3://${aws_s3_bucket.this.id}/${local.prefix}"
}

output "kms_key_arn" {
  description = "ARN of the customer-managed key the bucket encrypts with by default. s3ckpt need not send it (S3Config.sse_kms_key_id may stay None): the bucket default applies to every upload."
  value       = aws_kms_key.this.arn
}

output "kms_alias_name" {
  description = "Alias of the KMS key."
  value       = aws_kms_alias.this.name
}

output "trainer_role_arn" {
  description = "ARN of the trainer role (IRSA annotation, Pod Identity association, ECS task role, instance profile)."
  value       = aws_iam_role.trainer.arn
}

output "trainer_role_name" {
  description = "Name of the trainer role (for aws_iam_instance_profile and policy attachments)."
  value       = aws_iam_role.trainer.name
}

output "pruner_role_arn" {
  description = "ARN of the pruner role (the retention cron's identity)."
  value       = aws_iam_role.pruner.arn
}

output "pruner_role_name" {
  description = "Name of the pruner role."
  value       = aws_iam_role.pruner.name
}

output "pin_policy_json" {
  description = "An IAM policy (JSON) for whoever runs `s3ckpt pin` / `s3ckpt unpin`: read the checkpoints and write or remove {checkpoint}/s3ckpt.pin.json, nothing else. Neither module role may write pins; attach this to an operator role or permission set."
  value       = jsonencode(local.pin_policy)
}

output "restore_policy_json" {
  description = "An IAM policy (JSON) for whoever runs `s3ckpt restore` (an operator: a restore of GLACIER / DEEP_ARCHIVE objects is billed per GB): list and read the checkpoints and issue s3:RestoreObject on them, nothing else. Neither module role may restore; attach this to an operator role or permission set (or to the trainer role, for jobs that restore before they resume)."
  value       = jsonencode(local.restore_policy)
}

output "env" {
  description = "Environment for training jobs and the retention cron. AWS_REGION is read by boto3 (and so by s3ckpt); S3CKPT_URL is the checkpoint root for your job script or CronJob command line."
  value = {
    AWS_REGION = data.aws_region.current.name
    S3CKPT_URL = "s3://${aws_s3_bucket.this.id}/${local.prefix}"
  }
}

output "env_snippet" {
  description = "The same as `env`, as KEY=value lines (a Docker/ECS env file, or `set -a; . file`)."
  value       = <<-EOT
    AWS_REGION=${data.aws_region.current.name}
    S3CKPT_URL=s3://${aws_s3_bucket.this.id}/${local.prefix}
  EOT
}
