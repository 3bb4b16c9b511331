output "cli_environment" {
  description = "Environment for the respawn CLI (export these, then `respawn doctor JOB.yaml` and `respawn submit JOB.yaml`)."
  # The functions' own settings (functions.tf) and the orchestrator's account: what `respawn doctor` checks.
  value = merge(local.function_environment, {
    RESPAWN_ORCHESTRATOR_SERVICE_ACCOUNT = google_service_account.orchestrator.email
  })
}

output "checkpoint_bucket" {
  description = "Use gs://THIS/runs/JOB_ID as a job's checkpoint_uri."
  value       = google_storage_bucket.checkpoints.name
}

output "trainer_image_repository" {
  description = "Push the trainer image here; name it in job messages as REPOSITORY/trainer:TAG (TPU machines) or REPOSITORY/trainer-cuda:TAG (GPU machines)."
  value       = "${var.region}-docker.pkg.dev/${var.project}/${google_artifact_registry_repository.trainer.repository_id}"
}

# respawn's trainer image per machine kind, as cloudbuild.yaml builds it (respawn.machine.TRAINER_IMAGES): a job
# names IMAGE:TAG for its machine's kind.
output "trainer_images" {
  description = "The trainer image of each machine kind, without its tag: name IMAGE:TAG in a job of that kind (TAG: the commit cloudbuild.yaml built)."
  value = {
    gpu = "${var.region}-docker.pkg.dev/${var.project}/${google_artifact_registry_repository.trainer.repository_id}/trainer-cuda"
    tpu = "${var.region}-docker.pkg.dev/${var.project}/${google_artifact_registry_repository.trainer.repository_id}/trainer"
  }
}

output "trainer_image_regional_repositories" {
  description = "Per region of image_regions: copy the trainer image here and name the copy in jobs whose zones are in that region."
  value = {
    for region, repo in google_artifact_registry_repository.trainer_regional :
    region => "${region}-docker.pkg.dev/${var.project}/${repo.repository_id}"
  }
}

output "machine_service_account" {
  description = "The account the TPU VMs and GPU VMs run as."
  value       = google_service_account.machine.email
}

output "orchestrator_service_account" {
  description = "The functions' runtime account."
  value       = google_service_account.orchestrator.email
}

output "status_topic" {
  description = "One message per status change of a job: subscribe to it to route notices (docs/operations.md)."
  value       = google_pubsub_topic.status.id
}

output "dead_letter_subscription" {
  description = "Pull from here to see messages that failed every delivery attempt."
  value       = google_pubsub_subscription.dead_letter.name
}

output "function_uris" {
  description = "Internal-only endpoints the push subscriptions deliver to."
  value       = { for key, fn in google_cloudfunctions2_function.respawn : key => fn.service_config[0].uri }
}
