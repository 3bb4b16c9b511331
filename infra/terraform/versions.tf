terraform {
  required_version = ">= 1.5.0"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 6.0, < 8.0"
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
