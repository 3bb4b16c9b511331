# Least privilege. No primitive roles, no allUsers / allAuthenticatedUsers, resource-level grants wherever the
# resource exists: buckets, the image repository, the machines' service account, the functions, the topics.

resource "google_service_account" "orchestrator" {
  account_id   = "respawn-orchestrator"
  display_name = "respawn orchestrator (the functions' runtime identity)"
  depends_on   = [google_project_service.apis]
}

resource "google_service_account" "machine" {
  account_id   = "respawn-machine"
  display_name = "respawn machines (TPU VMs and Spot GPU VMs running the trainer)"
  depends_on   = [google_project_service.apis]
}

resource "google_service_account" "push" {
  account_id   = "respawn-push"
  display_name = "respawn Pub/Sub push identity (invokes the functions)"
  depends_on   = [google_project_service.apis]
}

resource "google_service_account" "build" {
  account_id   = "respawn-functions-build"
  display_name = "respawn function builds"
  depends_on   = [google_project_service.apis]
}

# --- the orchestrator -------------------------------------------------------------------------------------------
# Predefined roles (tpu.admin, compute.instanceAdmin.v1) also grant updating, starting, attaching disks and more;
# the functions only create, look at and delete machines.
resource "google_project_iam_custom_role" "orchestrator" {
  role_id     = "respawnOrchestrator"
  title       = "respawn orchestrator"
  description = "Create, get, list and delete Cloud TPU queued resources, nodes and Spot GPU VMs."
  permissions = [
    "tpu.nodes.create",
    "tpu.nodes.delete",
    "tpu.nodes.get",
    "tpu.nodes.list",
    # machine.request "queued" (the default). Consuming a reservation (a reservation tier) needs no permission
    # beyond creating the machine (Compute Engine "Consume reservations": compute.instances.create).
    "tpu.queuedResources.create",
    "tpu.queuedResources.delete",
    "tpu.queuedResources.get",
    "tpu.queuedResources.list",
    "tpu.operations.get",
    "tpu.operations.list",
    "compute.instances.create",
    "compute.instances.delete",
    "compute.instances.get",
    "compute.instances.list",
    "compute.instances.setLabels",
    "compute.instances.setMetadata",
    "compute.instances.setScheduling",
    "compute.instances.setServiceAccount",
    "compute.disks.create",
    "compute.disks.setLabels",
    "compute.images.useReadOnly",
    "compute.subnetworks.use",
    "compute.subnetworks.useExternalIp",
    "compute.zoneOperations.get",
  ]
  depends_on = [google_project_service.apis]
}

resource "google_project_iam_member" "orchestrator_machines" {
  project = var.project
  role    = google_project_iam_custom_role.orchestrator.id
  member  = google_service_account.orchestrator.member
}

resource "google_project_iam_member" "orchestrator_logs" {
  project = var.project
  role    = "roles/logging.logWriter"
  member  = google_service_account.orchestrator.member
}

# Job records: this bucket only.
resource "google_storage_bucket_iam_member" "orchestrator_state" {
  bucket = google_storage_bucket.state.name
  role   = "roles/storage.objectAdmin"
  member = google_service_account.orchestrator.member
}

# Status notices: publish to that one topic.
resource "google_pubsub_topic_iam_member" "orchestrator_publishes_status" {
  topic  = google_pubsub_topic.status.id
  role   = "roles/pubsub.publisher"
  member = google_service_account.orchestrator.member
}

# Creating a machine that runs as the machines' account needs actAs on that one account, not on the project.
resource "google_service_account_iam_member" "orchestrator_acts_as_machine" {
  service_account_id = google_service_account.machine.name
  role               = "roles/iam.serviceAccountUser"
  member             = google_service_account.orchestrator.member
}

# --- the machines -----------------------------------------------------------------------------------------------

resource "google_storage_bucket_iam_member" "machine_checkpoints" {
  bucket = google_storage_bucket.checkpoints.name
  role   = "roles/storage.objectAdmin"
  member = google_service_account.machine.member
}

resource "google_project_iam_member" "machine_logs" {
  project = var.project
  role    = "roles/logging.logWriter"
  member  = google_service_account.machine.member
}

# Jobs' `secrets`: the startup script reads them as the machines' account. Only the secrets listed, one grant each;
# nothing project-wide, so a job cannot name a secret nobody listed.
resource "google_secret_manager_secret_iam_member" "machine_reads_secret" {
  for_each  = toset(var.machine_secret_ids)
  project   = var.project
  secret_id = each.value
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.machine.member
}

resource "google_artifact_registry_repository_iam_member" "machine_pulls_trainer" {
  location   = google_artifact_registry_repository.trainer.location
  repository = google_artifact_registry_repository.trainer.name
  role       = "roles/artifactregistry.reader"
  member     = google_service_account.machine.member
}

# --- Pub/Sub push into the functions ----------------------------------------------------------------------------

resource "google_cloud_run_v2_service_iam_member" "push_invokes" {
  for_each = google_cloudfunctions2_function.respawn
  location = each.value.location
  name     = each.value.name
  role     = "roles/run.invoker"
  member   = google_service_account.push.member
}

# Pub/Sub mints the push OIDC tokens as its service agent (needed explicitly in projects created before 2021-04-08).
resource "google_service_account_iam_member" "pubsub_signs_push_tokens" {
  service_account_id = google_service_account.push.name
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = local.pubsub_service_agent
}

# --- function builds --------------------------------------------------------------------------------------------
# Cloud Functions copies the uploaded source to its gcf-v2-sources-* bucket and pushes the built image to the
# gcf-artifacts repository; the builds need exactly those, so the grants are conditioned on those names.

resource "google_project_iam_member" "build_logs" {
  project = var.project
  role    = "roles/logging.logWriter"
  member  = google_service_account.build.member
}

resource "google_project_iam_member" "build_reads_sources" {
  project = var.project
  role    = "roles/storage.objectViewer"
  member  = google_service_account.build.member
  condition {
    title      = "gcf-sources-only"
    expression = "resource.name.startsWith(\"projects/_/buckets/gcf-v2-sources-${data.google_project.this.number}-\")"
  }
}

resource "google_project_iam_member" "build_pushes_images" {
  project = var.project
  role    = "roles/artifactregistry.writer"
  member  = google_service_account.build.member
  condition {
    title      = "gcf-artifacts-only"
    expression = "resource.name.startsWith(\"projects/${var.project}/locations/${var.region}/repositories/gcf-artifacts\")"
  }
}
