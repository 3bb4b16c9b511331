terraform {
  required_version = ">= 1.5.0"

  required_providers {
    google = {
      source = "hashicorp/google"
      # The newest provider the offline schema check (tests/infra/test_terraform_schema.py) reads is 6.50.0: the
      # Terraform CDK's prebuilt schemas stop at 6.x, so 7.x (a major release, with removals) is not allowed untested.
      version = "~> 6.50"
    }
    archive = {
      source  = "hashicorp/archive"
      version = "~> 2.5" # 2.5 added glob patterns to archive_file excludes
    }
    time = {
      source  = "hashicorp/time"
      version = "~> 0.13" # time_sleep (monitoring.tf); the offline schema check reads 0.13.1
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

# The Billing Budget API, called with a person's own credentials (Application Default Credentials from
# `gcloud auth application-default login`), needs a quota project named on each request, or it answers 403: the
# provider's page for google_billing_budget asks for billing_project and user_project_override
# (https://registry.terraform.io/providers/hashicorp/google/latest/docs/resources/billing_budget). Only the budget uses
# this configuration, so nothing else changes which project its calls are counted against. The caller needs
# serviceusage.services.use on the project (roles/serviceusage.serviceUsageConsumer, or the deployer's
# roles/serviceusage.serviceUsageAdmin: docs/deploy.md, step 1).
provider "google" {
  alias                 = "billing"
  project               = var.project
  region                = var.region
  billing_project       = var.project
  user_project_override = true
}

data "google_project" "this" {}
