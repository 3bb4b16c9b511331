locals {
  state_bucket      = coalesce(var.state_bucket_name, "${var.project}-respawn-state")
  checkpoint_bucket = coalesce(var.checkpoint_bucket_name, "${var.project}-respawn-checkpoints")
}

# Job records, written only with generation preconditions. Versioned so an overwritten record can be recovered.
resource "google_storage_bucket" "state" {
  name                        = local.state_bucket
  location                    = var.region
  storage_class               = "STANDARD"
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = var.force_destroy_buckets

  versioning {
    enabled = true
  }

  lifecycle_rule {
    action {
      type = "Delete"
    }
    condition {
      days_since_noncurrent_time = var.state_noncurrent_retention_days
      with_state                 = "ARCHIVED"
    }
  }

  #checkov:skip=CKV_GCP_62:Access logs would record every compare-and-set of every job record; Cloud Audit Logs (data access) can be turned on for the bucket when an audit trail is wanted.
  depends_on = [google_project_service.apis]
}

# Orbax checkpoints. The trainer keeps the newest N itself; the age rule removes what jobs left behind under runs/,
# where job messages put their checkpoint_uri. A SUCCEEDED job's final checkpoint is copied to final/ (the same path
# after it), which no rule deletes: `respawn status JOB` says where.
resource "google_storage_bucket" "checkpoints" {
  name                        = local.checkpoint_bucket
  location                    = var.region
  storage_class               = "STANDARD"
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = var.force_destroy_buckets

  lifecycle_rule {
    action {
      type = "Delete"
    }
    condition {
      age            = var.checkpoint_retention_days
      matches_prefix = ["runs/"]
    }
  }

  lifecycle_rule {
    action {
      type = "AbortIncompleteMultipartUpload"
    }
    condition {
      age = 1
    }
  }

  #checkov:skip=CKV_GCP_62:Checkpoints are written in bursts of many objects by the trainer; access logs would cost more than the data and add nothing the trainer's own lifecycle log entries do not say.
  #checkov:skip=CKV_GCP_78:Versioning would keep every checkpoint Orbax deletes when it rotates to the newest N; recovery from a corrupt newest checkpoint uses the previous one, which Orbax keeps.
  depends_on = [google_project_service.apis]
}

# The zipped functions/ source that the function builds read. Objects are named by content hash.
resource "google_storage_bucket" "source" {
  name                        = "${var.project}-respawn-source"
  location                    = var.region
  storage_class               = "STANDARD"
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = true # only build inputs, reproducible from the repository

  #checkov:skip=CKV_GCP_62:Holds only build inputs reproducible from the repository; access logs add nothing.
  #checkov:skip=CKV_GCP_78:Each source archive is named by its content hash, so nothing is ever overwritten; versioning would keep nothing extra.
  depends_on = [google_project_service.apis]
}
