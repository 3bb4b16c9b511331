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
# the functions only create, look at and delete machines. Each permission is the one Google's API reference names
# under "IAM Permissions" for a method respawn calls (compute/docs/reference/rest/v1/RESOURCE/METHOD,
# tpu/docs/reference/rest/v2/...); the names are those of the Compute Engine roles reference
# (iam/docs/roles-permissions/compute). docs/compute-engine.md lists which call needs which.
locals {
  orchestrator_permissions = [for line in split("\n", file("${path.module}/../../respawn_ops/orchestrator_role.txt")) : trimspace(line) if trimspace(line) != "" && !startswith(trimspace(line), "#")]
}

resource "google_project_iam_custom_role" "orchestrator" {
  role_id     = "respawnOrchestrator"
  title       = "respawn orchestrator"
  description = "Create, get, list and delete Cloud TPU nodes and queued resources, and Compute Engine TPU and GPU VMs, slice MIGs, their templates and workload policies; read the Advice API."

  # One permission a line of respawn_ops/orchestrator_role.txt, where each one's reason is written beside it;
  # `respawn doctor` reads the same file (respawn_ops/needs.py).
  permissions = local.orchestrator_permissions

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

# Creating a machine that runs as the machines' account needs iam.serviceAccounts.actAs on that one account, not on
# the project: an instance, and equally an instance template and the MIG built from it, names it in
# serviceAccounts (compute/docs/access/iam "Managed instance groups and IAM", iam/docs/service-accounts-actas).
# Service Account User granted on this account alone carries actAs (plus get/list) for this account and no other.
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

# A GPU machine of several VMs (machine.vms) finds its peers by listing its MIG's VMs as the machines' account
# (startup.sh, ready_gpu_workers: instanceGroupManagers.listManagedInstances, which the REST reference authorizes by
# compute.instanceGroupManagers.get). That one permission, read-only; nothing else of Compute Engine.
resource "google_project_iam_custom_role" "machine_peers" {
  role_id     = "respawnMachinePeers"
  title       = "respawn machine peers"
  description = "Read a managed instance group and list its VMs: a multi-VM GPU machine's VMs find each other."
  permissions = ["compute.instanceGroupManagers.get"]
  depends_on  = [google_project_service.apis]
}

resource "google_project_iam_member" "machine_peers" {
  project = var.project
  role    = google_project_iam_custom_role.machine_peers.id
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
# The roles are the ones Google lists for a custom build service account (Logs Writer, Artifact Registry Writer, and
# Storage Object Admin, which holds Storage Object Viewer): https://cloud.google.com/functions/1stgendocs/securing/build-custom-sa
# (the page for `--build-service-account`, which 2nd gen's build_config.service_account is too). Object Viewer alone
# is less than documented, and a first `terraform apply` on a fresh project may fail on it.
#
# Each is granted on the one resource the builds touch, and an IAM condition is used only where the service
# evaluates it: Google's "Resource attributes for IAM Conditions" page lists the services that recognise
# resource.name (Cloud Storage does, Artifact Registry does not), and tests/infra/test_iam_support.py checks every
# condition here against that list (tests/data/iam_condition_services.json).

resource "google_project_iam_member" "build_logs" {
  project = var.project
  role    = "roles/logging.logWriter"
  member  = google_service_account.build.member
}

# Cloud Functions copies the uploaded source to its gcf-v2-sources-* bucket, which it creates itself: no bucket
# resource to grant on, so a project grant narrowed by a condition Cloud Storage evaluates.
resource "google_project_iam_member" "build_sources" {
  project = var.project
  role    = "roles/storage.objectAdmin"
  member  = google_service_account.build.member
  condition {
    title      = "gcf-sources-only"
    expression = "resource.name.startsWith(\"projects/_/buckets/gcf-v2-sources-${data.google_project.this.number}-\")"
  }
}

# The built images go to the functions' own repository (artifact_registry.tf, build_config.docker_repository),
# which Terraform creates: Artifact Registry Writer on that repository alone, no condition.
resource "google_artifact_registry_repository_iam_member" "build_pushes_images" {
  location   = google_artifact_registry_repository.functions.location
  repository = google_artifact_registry_repository.functions.name
  role       = "roles/artifactregistry.writer"
  member     = google_service_account.build.member
}
