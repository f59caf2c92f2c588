terraform {
  # 1.9: variable validations may refer to other variables; 1.7: mock providers in tests.
  required_version = ">= 1.9.0"

  required_providers {
    aws = {
      source = "hashicorp/aws"
      # Verified with 5.100.0. 6.x renames data.aws_region's "name"; pin below it until checked.
      version = ">= 5.40, < 6.0"
    }
  }
}
