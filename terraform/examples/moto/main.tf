# The module against a local moto server, for tests/terraform/test_terraform_moto.py.
# Credentials come from the environment (AWS_ACCESS_KEY_ID=testing ...), never from here.
#
#   terraform init -backend-config=path=/tmp/moto.tfstate
#   terraform apply -var endpoint=http://127.0.0.1:5000 \
#     -var trainer_principal_arn=arn:aws:iam::123456789012:user/trainer \
#     -var pruner_principal_arn=arn:aws:iam::123456789012:user/pruner

terraform {
  required_version = ">= 1.9.0"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.40, < 6.0"
    }
  }
  # State goes wherever the caller points -backend-config=path=..., never into the checkout.
  backend "local" {}
}

variable "endpoint" {
  description = "moto server URL, e.g. http://127.0.0.1:5000."
  type        = string

  validation {
    # This configuration must never reach a real account.
    condition     = can(regex("^http://(127\\.0\\.0\\.1|localhost)(:[0-9]+)?$", var.endpoint))
    error_message = "endpoint must be a loopback http URL (a local moto server)."
  }
}

variable "bucket_name" {
  type    = string
  default = "s3ckpt-moto-example"
}

variable "checkpoint_prefix" {
  type    = string
  default = "checkpoints/"
}

variable "versioning_enabled" {
  type    = bool
  default = true
}

variable "trainer_principal_arn" {
  description = "IAM user or role allowed to assume the trainer role."
  type        = string
}

variable "pruner_principal_arn" {
  description = "IAM user or role allowed to assume the pruner role."
  type        = string
}

provider "aws" {
  region                      = "us-east-1"
  skip_credentials_validation = true
  skip_requesting_account_id  = true
  skip_metadata_api_check     = true
  skip_region_validation      = true
  s3_use_path_style           = true

  endpoints {
    s3  = var.endpoint
    iam = var.endpoint
    kms = var.endpoint
    sts = var.endpoint
  }
}

module "s3ckpt" {
  source = "../.."

  bucket_name        = var.bucket_name
  checkpoint_prefix  = var.checkpoint_prefix
  versioning_enabled = var.versioning_enabled
  # moto does not evaluate bucket-policy conditions: the TLS-only deny would refuse every
  # object request on plain-http loopback. Real deployments keep the default (true).
  enforce_tls              = false
  kms_deletion_window_days = 7

  trainer_trust = { aws_principals = [var.trainer_principal_arn] }
  pruner_trust  = { aws_principals = [var.pruner_principal_arn] }
}

output "bucket_name" {
  value = module.s3ckpt.bucket_name
}

output "checkpoint_prefix" {
  value = module.s3ckpt.checkpoint_prefix
}

output "checkpoint_url" {
  value = module.s3ckpt.checkpoint_url
}

output "kms_key_arn" {
  value = module.s3ckpt.kms_key_arn
}

output "trainer_role_arn" {
  value = module.s3ckpt.trainer_role_arn
}

output "pruner_role_arn" {
  value = module.s3ckpt.pruner_role_arn
}

output "env" {
  value = module.s3ckpt.env
}
