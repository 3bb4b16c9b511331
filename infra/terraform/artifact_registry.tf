resource "google_artifact_registry_repository" "trainer" {
  #checkov:skip=CKV_GCP_84:Google-managed encryption at rest; the image holds the open-source trainer code and no secrets, so a customer-managed key would add key management without protecting anything more.
  repository_id = var.artifact_repository
  location      = var.region
  format        = "DOCKER"
  description   = "The respawn trainer image (tagged with the commit)."

  docker_config {
    immutable_tags = true # a tag names one build forever; jobs that name it get exactly that image
  }

  cleanup_policies {
    id     = "delete-untagged"
    action = "DELETE"
    condition {
      tag_state  = "UNTAGGED"
      older_than = "1209600s"
    }
  }

  cleanup_policies {
    id     = "keep-recent"
    action = "KEEP"
    most_recent_versions {
      keep_count = 20
    }
  }

  depends_on = [google_project_service.apis]
}
