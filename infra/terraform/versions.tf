terraform {
  required_version = ">= 1.5.0"

  required_providers {
    google = {
      source  = "hashicorp/google"
      # The newest provider the offline schema check (tests/infra/test_terraform_schema.py) reads is 6.50.0: the
      # Terraform CDK's prebuilt schemas stop at 6.x, so 7.x (a major release, with removals) is not allowed untested.
      version = "~> 6.50"
    }
    archive = {
      source  = "hashicorp/archive"
      version = "~> 2.5" # 2.5 added glob patterns to archive_file excludes
    }
  }

  # State lives in a bucket created once by hand (docs/deploy.md, step 2):
  #   terraform init -backend-config="bucket=PROJECT-tfstate" -backend-config="prefix=respawn"
  backend "gcs" {}
}

provider "google" {
  project        = var.project
  region         = var.region
  default_labels = merge({ app = "respawn" }, var.labels)
}

data "google_project" "this" {}
