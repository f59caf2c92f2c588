# s3ckpt's retention cron as an ECS Fargate task that EventBridge Scheduler starts every hour:
# `s3ckpt-cron retention` (deploy/cron/Dockerfile) prunes every run under the checkpoint root
# with a retention policy, then gcs the debris of dead saves, both with --apply and --json, as
# the terraform module's pruner role (the task role). See docs/operations.md.
#
#   terraform init && terraform apply -var bucket_name=acme-ml-checkpoints \
#     -var image=111122223333.dkr.ecr.eu-west-1.amazonaws.com/s3ckpt-cron:0.1.0 \
#     -var vpc_id=vpc-0123 -var 'subnet_ids=["subnet-0123","subnet-4567"]'
#
# Start with -var apply=false (dry runs: the plan is in the log group) and read a plan or two
# before deleting anything.

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
  description = "Region of the bucket and of the ECS cluster that runs the cron."
  type        = string
  default     = "eu-west-1"
}

variable "bucket_name" {
  description = "Checkpoint bucket name (globally unique)."
  type        = string
}

variable "image" {
  description = "The retention cron's image (deploy/cron/Dockerfile), pushed to a registry the task can pull from."
  type        = string
}

variable "vpc_id" {
  description = "VPC of the task's subnets."
  type        = string
}

variable "subnet_ids" {
  description = "Private subnets for the task. With an S3 gateway endpoint in the VPC no NAT is needed for S3; pulling the image from ECR and writing logs need the ECR and CloudWatch Logs endpoints or a NAT."
  type        = list(string)
}

variable "policy" {
  description = "Retention policy: a built-in name (pretraining, finetuning, archive, keep-last-3) or a file under /etc/s3ckpt/policies/ in the image."
  type        = string
  default     = "pretraining"
}

variable "apply" {
  description = "true: delete (prune --apply, gc --apply); false: dry runs that only log the plan."
  type        = bool
  default     = true
}

variable "schedule" {
  description = "When the cron runs (EventBridge Scheduler expression, UTC)."
  type        = string
  default     = "cron(17 * * * ? *)"
}

provider "aws" {
  region = var.region
  default_tags {
    tags = { "app" = "s3ckpt" }
  }
}

module "checkpoints" {
  source = "../../terraform"

  bucket_name       = var.bucket_name
  checkpoint_prefix = "checkpoints/"
  name              = "ml-checkpoints"

  trainer_trust = {
    services = ["ec2.amazonaws.com"]
  }
  # The retention cron runs as an ECS task: the pruner role is its task role.
  pruner_trust = {
    services = ["ecs-tasks.amazonaws.com"]
  }
}

data "aws_caller_identity" "current" {}

locals {
  # What s3ckpt-cron reads: AWS_REGION and S3CKPT_URL from the module, the policy and mode.
  cron_environment = merge(module.checkpoints.env, {
    POLICY        = var.policy
    APPLY         = var.apply ? "1" : "0"
    GC_OLDER_THAN = "2d" # > your slowest single save
  })
}

resource "aws_ecs_cluster" "retention" {
  name = "s3ckpt-retention"
  setting {
    name  = "containerInsights"
    value = "enabled"
  }
}

resource "aws_cloudwatch_log_group" "retention" {
  name              = "/ecs/s3ckpt-retention"
  retention_in_days = 30
}

# The execution role pulls the image and writes the logs; what the container itself may do
# on S3 is the pruner role's business (task_role_arn).
resource "aws_iam_role" "execution" {
  name = "s3ckpt-retention-execution"
  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect    = "Allow"
      Action    = "sts:AssumeRole"
      Principal = { Service = "ecs-tasks.amazonaws.com" }
    }]
  })
}

resource "aws_iam_role_policy_attachment" "execution" {
  role       = aws_iam_role.execution.name
  policy_arn = "arn:aws:iam::aws:policy/service-role/AmazonECSTaskExecutionRolePolicy"
}

resource "aws_ecs_task_definition" "retention" {
  family                   = "s3ckpt-retention"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = "256"
  memory                   = "512"
  task_role_arn            = module.checkpoints.pruner_role_arn
  execution_role_arn       = aws_iam_role.execution.arn

  runtime_platform {
    operating_system_family = "LINUX"
    cpu_architecture        = "X86_64"
  }

  volume {
    name = "tmp"
  }

  container_definitions = jsonencode([{
    name                   = "retention"
    image                  = var.image
    essential              = true
    command                = ["retention"]
    user                   = "10001:10001"
    readonlyRootFilesystem = true
    environment            = [for k, v in local.cron_environment : { name = k, value = v }]
    mountPoints            = [{ sourceVolume = "tmp", containerPath = "/tmp", readOnly = false }]
    linuxParameters        = { capabilities = { drop = ["ALL"] } }
    logConfiguration = {
      logDriver = "awslogs"
      options = {
        awslogs-group         = aws_cloudwatch_log_group.retention.name
        awslogs-region        = var.region
        awslogs-stream-prefix = "retention"
      }
    }
  }])
}

resource "aws_security_group" "retention" {
  name        = "s3ckpt-retention"
  description = "s3ckpt retention cron: no inbound, HTTPS out (S3, STS, ECR, logs)"
  vpc_id      = var.vpc_id

  egress {
    description = "HTTPS to AWS APIs"
    from_port   = 443
    to_port     = 443
    protocol    = "tcp"
    cidr_blocks = ["0.0.0.0/0"]
  }
}

# EventBridge Scheduler may start exactly this task family on exactly this cluster, and hand
# it exactly its two roles.
resource "aws_iam_role" "scheduler" {
  name = "s3ckpt-retention-scheduler"
  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect    = "Allow"
      Action    = "sts:AssumeRole"
      Principal = { Service = "scheduler.amazonaws.com" }
      Condition = { StringEquals = { "aws:SourceAccount" = data.aws_caller_identity.current.account_id } }
    }]
  })
}

resource "aws_iam_role_policy" "scheduler" {
  role = aws_iam_role.scheduler.id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        Effect    = "Allow"
        Action    = "ecs:RunTask"
        Resource  = "${aws_ecs_task_definition.retention.arn_without_revision}:*"
        Condition = { ArnEquals = { "ecs:cluster" = aws_ecs_cluster.retention.arn } }
      },
      {
        Effect   = "Allow"
        Action   = "iam:PassRole"
        Resource = [module.checkpoints.pruner_role_arn, aws_iam_role.execution.arn]
      },
    ]
  })
}

resource "aws_scheduler_schedule" "retention" {
  name                         = "s3ckpt-retention"
  schedule_expression          = var.schedule
  schedule_expression_timezone = "UTC"

  flexible_time_window {
    mode = "OFF"
  }

  target {
    arn      = aws_ecs_cluster.retention.arn
    role_arn = aws_iam_role.scheduler.arn

    ecs_parameters {
      task_definition_arn = aws_ecs_task_definition.retention.arn
      launch_type         = "FARGATE"
      task_count          = 1

      network_configuration {
        subnets          = var.subnet_ids
        security_groups  = [aws_security_group.retention.id]
        assign_public_ip = false
      }
    }

    # No retries: the next scheduled run is the retry. Two overlapping runs cannot race
    # (each command takes the lease of every run it changes; the later one exits 4, busy).
    retry_policy {
      maximum_retry_attempts = 0
    }
  }
}

output "pruner_role_arn" {
  description = "The task role the cron runs as."
  value       = module.checkpoints.pruner_role_arn
}

output "log_group" {
  description = "Where each run's JSON plan and result go."
  value       = aws_cloudwatch_log_group.retention.name
}

output "checkpoint_url" {
  value = module.checkpoints.checkpoint_url
}
