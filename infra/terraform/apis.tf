# The APIs respawn uses, and those `respawn doctor` asks about the project (respawn_cli/doctor/clients.py). Disabling
# them on destroy could break other things in the project, so it is left alone.
locals {
  apis = [
    "artifactregistry.googleapis.com", # trainer image
    "billingbudgets.googleapis.com",   # the optional budget (monitoring.tf)
    "cloudbuild.googleapis.com",       # function builds, the pipeline
    "cloudfunctions.googleapis.com",
    "cloudresourcemanager.googleapis.com", # project IAM bindings
    "cloudscheduler.googleapis.com",       # sweep tick
    "compute.googleapis.com",              # Spot GPU VMs
    "iam.googleapis.com",
    "logging.googleapis.com",              # the sink
    "monitoring.googleapis.com",           # log-based metrics, dashboard, alerts
    "orgpolicy.googleapis.com",            # doctor: the organisation policies on the project
    "policytroubleshooter.googleapis.com", # doctor: whether each account holds each permission
    "pubsub.googleapis.com",
    "run.googleapis.com",           # 2nd gen functions run on Cloud Run
    "secretmanager.googleapis.com", # jobs' secrets, read on the machines
    "serviceusage.googleapis.com",  # doctor: which APIs are on (and Terraform's own google_project_service)
    "storage.googleapis.com",
    "tpu.googleapis.com",
  ]
}

resource "google_project_service" "apis" {
  for_each           = toset(local.apis)
  service            = each.value
  disable_on_destroy = false
}
