variable "bucket_name" {
  description = "Name of the checkpoint bucket (created by this module). Lower-case letters, digits and hyphens; no dots, because dotted names break TLS with virtual-hosted addressing."
  type        = string
  nullable    = false

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$", var.bucket_name))
    error_message = "bucket_name must be 3-63 characters of a-z, 0-9 and '-', starting and ending with a letter or digit (dots are refused: they break TLS with virtual-hosted addressing)."
  }

  validation {
    condition = !(
      startswith(var.bucket_name, "xn--") || startswith(var.bucket_name, "sthree-") ||
      endswith(var.bucket_name, "-s3alias") || endswith(var.bucket_name, "--ol-s3") ||
      endswith(var.bucket_name, "--x-s3") || endswith(var.bucket_name, "--table-s3")
    )
    error_message = "bucket_name uses a prefix or suffix that S3 reserves (xn--, sthree-, -s3alias, --ol-s3, --x-s3, --table-s3)."
  }
}

variable "checkpoint_prefix" {
  description = "Key prefix every checkpoint lives under (s3://BUCKET/PREFIX/<run>/<step>/). No leading slash; a missing trailing slash is added. The IAM policies and lifecycle rules are scoped to it."
  type        = string
  default     = "checkpoints/"
  nullable    = false

  validation {
    # Segments of S3's "safe" characters. '*' and '?' are refused because they are IAM wildcards
    # and would widen every policy that embeds the prefix.
    condition     = can(regex("^[A-Za-z0-9!_.'()=-]+(/[A-Za-z0-9!_.'()=-]+)*/?$", var.checkpoint_prefix))
    error_message = "checkpoint_prefix must be non-empty, must not start with '/', must not contain '//', and may use only A-Z a-z 0-9 ! _ . ' ( ) = - and '/' (no IAM wildcards '*' or '?')."
  }

  validation {
    condition     = !anytrue([for s in split("/", trimsuffix(var.checkpoint_prefix, "/")) : s == "." || s == ".."])
    error_message = "checkpoint_prefix must not contain '.' or '..' segments."
  }
}

variable "name" {
  description = "Name stem for the IAM roles (<name>-trainer, <name>-pruner) and the KMS alias (alias/<name>-checkpoints)."
  type        = string
  default     = "s3ckpt"
  nullable    = false

  validation {
    # IAM role names are at most 64 characters; "-trainer" takes 8.
    condition     = can(regex("^[A-Za-z0-9+=,.@_-]{1,56}$", var.name))
    error_message = "name must be 1-56 characters of A-Z a-z 0-9 + = , . @ _ -."
  }
}

variable "versioning_enabled" {
  description = "Turn on bucket versioning. On: a delete (by the pruner, or by mistake) leaves a noncurrent version that can be restored until noncurrent_version_expiration_days pass, at the cost of storing deleted checkpoints that long. Off (Suspended): a pruner delete is final and frees storage at once. See docs/operations.md."
  type        = bool
  default     = true
  nullable    = false
}

variable "noncurrent_version_expiration_days" {
  description = "Days after an object becomes noncurrent (overwritten or deleted in a versioned bucket) before S3 removes that version for good. This is the recovery window for a wrong prune."
  type        = number
  default     = 7
  nullable    = false

  validation {
    condition     = var.noncurrent_version_expiration_days >= 1 && floor(var.noncurrent_version_expiration_days) == var.noncurrent_version_expiration_days
    error_message = "noncurrent_version_expiration_days must be a whole number of days >= 1."
  }
}

variable "abort_incomplete_multipart_days" {
  description = "Days after a multipart upload starts before S3 aborts it if it was never completed (a killed trainer leaves its parts billed and invisible to listings until then). Keep it longer than your slowest single checkpoint save."
  type        = number
  default     = 3
  nullable    = false

  validation {
    condition     = var.abort_incomplete_multipart_days >= 1 && floor(var.abort_incomplete_multipart_days) == var.abort_incomplete_multipart_days
    error_message = "abort_incomplete_multipart_days must be a whole number of days >= 1."
  }
}

variable "enforce_tls" {
  description = "Attach a bucket policy that denies requests not made over TLS and requests using TLS older than 1.2. Leave on everywhere except emulators (moto, MinIO) that ignore policy conditions and would deny every request."
  type        = bool
  default     = true
  nullable    = false
}

variable "pruner_can_delete_versions" {
  description = "Also grant the pruner s3:DeleteObjectVersion, so its deletes are immediate and permanent even when versioning is on. Default false: with versioning on, a buggy or mis-configured prune stays recoverable until the noncurrent-version rule expires it."
  type        = bool
  default     = false
  nullable    = false
}

variable "trainer_may_prune" {
  description = "Also give the trainer role the pruner's delete permissions (s3:DeleteObject under the prefix, and s3:DeleteObjectVersion if pruner_can_delete_versions) and let it write the pruner's lease. Needed only by a training job that runs retention in-process (Checkpointer(policy=...)); the default (false) keeps training jobs unable to delete, and retention runs from the pruner role's cron."
  type        = bool
  default     = false
  nullable    = false
}

variable "trainer_trust" {
  description = <<-EOT
    Who may assume the trainer role; give at least one principal, never an account root.
      aws_principals: IAM role or user ARNs (arn:aws:iam::<account>:role/<name>).
      services:       AWS service principals, e.g. ec2.amazonaws.com (instance profile),
                      ecs-tasks.amazonaws.com (ECS task role), pods.eks.amazonaws.com (EKS Pod Identity),
                      sagemaker.amazonaws.com.
      oidc:           IRSA / web identity: the OIDC provider ARN and the exact subjects allowed,
                      e.g. system:serviceaccount:<namespace>:<serviceaccount>.
  EOT
  type = object({
    aws_principals = optional(list(string), [])
    services       = optional(list(string), [])
    oidc = optional(list(object({
      provider_arn = string
      subjects     = list(string)
    })), [])
  })
  nullable = false

  validation {
    condition     = length(var.trainer_trust.aws_principals) + length(var.trainer_trust.services) + length(var.trainer_trust.oidc) > 0
    error_message = "trainer_trust must name at least one principal (aws_principals, services or oidc)."
  }

  validation {
    condition     = !anytrue([for p in var.trainer_trust.aws_principals : endswith(p, ":root") || can(regex("^[0-9]{12}$", p))])
    error_message = "trainer_trust.aws_principals must not contain an account root (':root' or a bare account id): that would let every principal in the account with sts:AssumeRole take the role."
  }

  validation {
    condition     = alltrue([for p in var.trainer_trust.aws_principals : can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:(role|user)/[A-Za-z0-9+=,.@_/-]+$", p))])
    error_message = "trainer_trust.aws_principals entries must be IAM role or user ARNs (arn:aws:iam::<12 digits>:role/<name> or :user/<name>)."
  }

  validation {
    condition     = alltrue([for s in var.trainer_trust.services : can(regex("^[a-z0-9.-]+\\.amazonaws\\.com$", s))])
    error_message = "trainer_trust.services entries must be service principals such as ec2.amazonaws.com."
  }

  validation {
    condition = alltrue([for o in var.trainer_trust.oidc : can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:oidc-provider/.+$", o.provider_arn)) && length(o.subjects) > 0 && alltrue([for s in o.subjects : length(trimspace(s)) > 0 && s != "*"])
    ])
    error_message = "trainer_trust.oidc entries need an oidc-provider ARN and at least one non-empty, non-'*' subject."
  }
}

variable "pruner_trust" {
  description = "Who may assume the pruner role (the retention cron). Same shape and rules as trainer_trust."
  type = object({
    aws_principals = optional(list(string), [])
    services       = optional(list(string), [])
    oidc = optional(list(object({
      provider_arn = string
      subjects     = list(string)
    })), [])
  })
  nullable = false

  validation {
    condition     = length(var.pruner_trust.aws_principals) + length(var.pruner_trust.services) + length(var.pruner_trust.oidc) > 0
    error_message = "pruner_trust must name at least one principal (aws_principals, services or oidc)."
  }

  validation {
    condition     = !anytrue([for p in var.pruner_trust.aws_principals : endswith(p, ":root") || can(regex("^[0-9]{12}$", p))])
    error_message = "pruner_trust.aws_principals must not contain an account root (':root' or a bare account id): that would let every principal in the account with sts:AssumeRole take the role."
  }

  validation {
    condition     = alltrue([for p in var.pruner_trust.aws_principals : can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:(role|user)/[A-Za-z0-9+=,.@_/-]+$", p))])
    error_message = "pruner_trust.aws_principals entries must be IAM role or user ARNs (arn:aws:iam::<12 digits>:role/<name> or :user/<name>)."
  }

  validation {
    condition     = alltrue([for s in var.pruner_trust.services : can(regex("^[a-z0-9.-]+\\.amazonaws\\.com$", s))])
    error_message = "pruner_trust.services entries must be service principals such as ecs-tasks.amazonaws.com."
  }

  validation {
    condition = alltrue([for o in var.pruner_trust.oidc : can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:oidc-provider/.+$", o.provider_arn)) && length(o.subjects) > 0 && alltrue([for s in o.subjects : length(trimspace(s)) > 0 && s != "*"])
    ])
    error_message = "pruner_trust.oidc entries need an oidc-provider ARN and at least one non-empty, non-'*' subject."
  }
}

variable "max_session_duration" {
  description = "Maximum session length in seconds for both roles (3600-43200). SDKs refresh role credentials on their own; raise it only for tools that cannot."
  type        = number
  default     = 3600
  nullable    = false

  validation {
    condition     = var.max_session_duration >= 3600 && var.max_session_duration <= 43200
    error_message = "max_session_duration must be between 3600 and 43200 seconds."
  }
}

variable "permissions_boundary_arn" {
  description = "Optional permissions boundary policy ARN attached to both roles."
  type        = string
  default     = null

  validation {
    condition     = var.permissions_boundary_arn == null || can(regex("^arn:aws[a-z-]*:iam::([0-9]{12}|aws):policy/.+$", var.permissions_boundary_arn))
    error_message = "permissions_boundary_arn must be an IAM policy ARN."
  }
}

variable "kms_deletion_window_days" {
  description = "Waiting period (7-30 days) before a destroyed KMS key is deleted. Every checkpoint encrypted under it becomes unreadable once the key is gone."
  type        = number
  default     = 30
  nullable    = false

  validation {
    condition     = var.kms_deletion_window_days >= 7 && var.kms_deletion_window_days <= 30 && floor(var.kms_deletion_window_days) == var.kms_deletion_window_days
    error_message = "kms_deletion_window_days must be a whole number between 7 and 30."
  }
}

variable "tags" {
  description = "Tags for every resource that takes them."
  type        = map(string)
  default     = {}
  nullable    = false
}

variable "tier_storage_classes" {
  description = "Storage classes the lifecycle alternative to s3ckpt's copy-based tiers moves to (docs/retention.md, \"The lifecycle alternative\"): one rule per class transitions every object under the prefix tagged s3ckpt-tier = <CLASS> (the tags `prune --apply` puts with a policy's `method = \"tag\"`). STANDARD_IA and ONEZONE_IA transition 30 days after the object was written (S3's minimum); the others at the next daily lifecycle run. Empty (the default): no tier rules."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    condition = alltrue([
      for c in var.tier_storage_classes :
      contains(["STANDARD_IA", "ONEZONE_IA", "INTELLIGENT_TIERING", "GLACIER_IR", "GLACIER", "DEEP_ARCHIVE"], c)
    ])
    error_message = "tier_storage_classes may name STANDARD_IA, ONEZONE_IA, INTELLIGENT_TIERING, GLACIER_IR, GLACIER and DEEP_ARCHIVE (a lifecycle rule cannot move objects back to STANDARD)."
  }
}

variable "pruner_tier_method" {
  description = "How the pruner applies a retention policy's storage tiers. \"none\" (default): it may not (its writes stay its lease and the stock .metadata copies). \"tag\": it may tag checkpoint objects (s3:PutObjectTagging / s3:GetObjectTagging) for the rules of tier_storage_classes; it still cannot change an object's bytes. \"copy\": it may also copy checkpoint objects onto themselves with a new class (s3:PutObject under the prefix, pins still denied): immediate moves, at the price of a pruner that can write checkpoint data."
  type        = string
  default     = "none"
  nullable    = false

  validation {
    condition     = contains(["none", "tag", "copy"], var.pruner_tier_method)
    error_message = "pruner_tier_method must be \"none\", \"tag\" or \"copy\"."
  }
}
