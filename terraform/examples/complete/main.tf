# A production-shaped deployment: trainers on EKS (IRSA) and on plain EC2 (instance profile),
# the retention cron as an ECS scheduled task. See docs/operations.md for the walk-through.
#
#   terraform init && terraform apply -var bucket_name=acme-ml-checkpoints \
#     -var eks_oidc_provider_arn=arn:aws:iam::111122223333:oidc-provider/oidc.eks.eu-west-1.amazonaws.com/id/EXAMPLE

terraform {
  required_version = ">= 1.9.0"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.40, < 6.0"
    }
  }
}

variable "region" {
  description = "Region of the bucket; put it next to the GPUs."
  type        = string
  default     = "eu-west-1"
}

variable "bucket_name" {
  description = "Checkpoint bucket name (globally unique)."
  type        = string
}

variable "eks_oidc_provider_arn" {
  description = "IAM OIDC provider of the EKS cluster that runs training (IRSA)."
  type        = string
}

provider "aws" {
  region = var.region
  default_tags {
    tags = { "app" = "s3ckpt" }
  }
}

module "checkpoints" {
  source = "../.."

  bucket_name       = var.bucket_name
  checkpoint_prefix = "checkpoints/"
  name              = "ml-checkpoints"

  # Keep deleted checkpoints restorable for a week.
  versioning_enabled                 = true
  noncurrent_version_expiration_days = 7
  abort_incomplete_multipart_days    = 3

  trainer_trust = {
    # EC2 training hosts (instance profile below) ...
    services = ["ec2.amazonaws.com"]
    # ... and pods using the "trainer" service account in namespace "ml".
    oidc = [{
      provider_arn = var.eks_oidc_provider_arn
      subjects     = ["system:serviceaccount:ml:trainer"]
    }]
  }

  pruner_trust = {
    # The retention cron runs as an ECS task (task role).
    services = ["ecs-tasks.amazonaws.com"]
  }
}

# For training on plain EC2 instances: attach this profile at launch.
resource "aws_iam_instance_profile" "trainer" {
  name = "ml-checkpoints-trainer"
  role = module.checkpoints.trainer_role_name
}

output "checkpoint_url" {
  value = module.checkpoints.checkpoint_url
}

output "trainer_role_arn" {
  value = module.checkpoints.trainer_role_arn
}

output "trainer_instance_profile" {
  value = aws_iam_instance_profile.trainer.name
}

output "pruner_role_arn" {
  value = module.checkpoints.pruner_role_arn
}

output "kms_key_arn" {
  value = module.checkpoints.kms_key_arn
}

output "env" {
  value = module.checkpoints.env
}
