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

# The trainer image next to the machines (docs/operations.md, Machines that start fast): a repository of the same
# name in each region (or multi-region: us, europe, asia) of image_regions but the functions' own, where a copy of
# each trainer image is pushed after the build; a job names the copy in its zones' region. Same tag rules and
# cleanup as the main repository, and the machines' account reads them as it reads that one.
locals {
  image_regions = setsubtract(toset(var.image_regions), [var.region])
}

resource "google_artifact_registry_repository" "trainer_regional" {
  #checkov:skip=CKV_GCP_84:Google-managed encryption at rest, as the main trainer repository (copies of the same images).
  for_each      = local.image_regions
  repository_id = var.artifact_repository
  location      = each.value
  format        = "DOCKER"
  description   = "Copies of the respawn trainer image for machines in ${each.value}."

  docker_config {
    immutable_tags = true
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

resource "google_artifact_registry_repository_iam_member" "machine_pulls_trainer_regional" {
  for_each   = google_artifact_registry_repository.trainer_regional
  location   = each.value.location
  repository = each.value.name
  role       = "roles/artifactregistry.reader"
  member     = google_service_account.machine.member
}

# respawn's trainer image of each machine kind (respawn.machine.TRAINER_IMAGES), without its tag, as cloudbuild.yaml
# builds and pushes them: the outputs name them, and the functions run IMAGE:trainer_tag of its machine's kind for a
# job message without `image` (functions.tf, RESPAWN_TRAINER_IMAGES).
locals {
  trainer_repository = "${var.region}-docker.pkg.dev/${var.project}/${google_artifact_registry_repository.trainer.repository_id}"
  trainer_images = {
    gpu = "${local.trainer_repository}/trainer-cuda"
    tpu = "${local.trainer_repository}/trainer"
  }
}

# The functions' build images. With build_config.docker_repository the builds push here instead of the gcf-artifacts
# repository Cloud Functions would create on first deploy, so the build account's Artifact Registry Writer grant
# can name this repository (iam.tf) instead of a project grant under a condition Artifact Registry does not evaluate.
resource "google_artifact_registry_repository" "functions" {
  #checkov:skip=CKV_GCP_84:Google-managed encryption at rest; the images hold respawn's open-source function code and no secrets, so a customer-managed key would add key management without protecting anything more.
  repository_id = "${var.artifact_repository}-functions"
  location      = var.region
  format        = "DOCKER"
  description   = "Images of the respawn functions, built by Cloud Functions."

  # Each deploy builds new images: those older than 30 days go, but for the 10 most recent (KEEP wins over DELETE).
  cleanup_policies {
    id     = "delete-old"
    action = "DELETE"
    condition {
      tag_state  = "ANY"
      older_than = "2592000s"
    }
  }

  cleanup_policies {
    id     = "keep-last-builds"
    action = "KEEP"
    most_recent_versions {
      keep_count = 10
    }
  }

  depends_on = [google_project_service.apis]
}
