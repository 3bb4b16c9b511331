# The two Cloud Functions (2nd gen) and how Pub/Sub delivers to them.
#
# Delivery, a deliberate choice: each function is fed by a push subscription that Terraform owns, not by an
# event_trigger. An event_trigger makes Eventarc create and own the subscription, and neither the function nor the
# Eventarc trigger resource can set a dead-letter policy on it (hashicorp/terraform-provider-google#25069, #17697);
# patching it afterwards with gcloud is undone by the next deploy. With our own subscription, retry with backoff,
# dead-lettering after max_delivery_attempts and the ack deadline are all declared here. The entry points are
# @functions_framework.cloud_event functions: the framework turns the raw push body into a messagePublished
# CloudEvent carrying the same message (unlike Eventarc's, its source names no topic and its data no subscription;
# respawn reads neither), so the code is identical either way. Pub/Sub
# authenticates with an OIDC token of the respawn-push account, the only principal allowed to invoke them, and the
# functions accept internal traffic only (Pub/Sub push from the same project counts as internal).

locals {
  functions = {
    on_job_message = {
      name          = "respawn-on-job-message"
      description   = "Job messages from respawn-jobs: submit or cancel."
      topic         = google_pubsub_topic.jobs.id
      max_instances = var.on_job_message_max_instances
    }
    on_event = {
      name          = "respawn-on-event"
      description   = "Preemption and lifecycle log entries and sweep ticks from respawn-events."
      topic         = google_pubsub_topic.events.id
      max_instances = var.on_event_max_instances
    }
  }

  function_environment = {
    RESPAWN_PROJECT                 = var.project
    RESPAWN_STATE_BUCKET            = google_storage_bucket.state.name
    RESPAWN_JOBS_TOPIC              = google_pubsub_topic.jobs.name
    RESPAWN_EVENTS_TOPIC            = google_pubsub_topic.events.name
    RESPAWN_STATUS_TOPIC            = google_pubsub_topic.status.name
    RESPAWN_MACHINE_SERVICE_ACCOUNT = google_service_account.machine.email
    # The machines' network (network.tf). The providers read these to fill every create's network interface.
    RESPAWN_NETWORK     = local.machine_network
    RESPAWN_SUBNETWORK  = local.machine_subnetwork
    RESPAWN_EXTERNAL_IP = tostring(local.external_ip)
    # A job message without `image` runs the trainer image of its machine's kind at trainer_tag (the tag Cloud Build
    # pushed), {"gpu": ".../trainer-cuda:TAG", "tpu": ".../trainer:TAG"}; empty (no trainer_tag): every job names one.
    RESPAWN_TRAINER_IMAGES = var.trainer_tag == "" ? "" : jsonencode({
      for kind, image in local.trainer_images : kind => "${image}:${var.trainer_tag}"
    })
  }
}

# functions/ as uploaded by `gcloud functions deploy --source=functions` (same exclusions as its .gcloudignore): all of
# it but what is built or cached locally. functions/ holds main.py, requirements.txt, the modules main.py imports and
# the files they read (the machine's scripts), nothing else: the command line, the local cloud and the files Terraform
# reads (respawn_ops/) live beside it. tests/infra/test_deployed_source.py holds both.
data "archive_file" "functions" {
  type        = "zip"
  source_dir  = "${path.module}/../../functions"
  output_path = "${path.module}/.build/functions.zip"
  excludes = [
    ".gcloudignore",
    "**/__pycache__/**",
    "**/*.pyc",
    "**/*.egg-info/**",
  ]
}

resource "google_storage_bucket_object" "functions_source" {
  name   = "functions/${data.archive_file.functions.output_sha256}.zip"
  bucket = google_storage_bucket.source.name
  source = data.archive_file.functions.output_path
}

resource "google_cloudfunctions2_function" "respawn" {
  for_each    = local.functions
  name        = each.value.name
  location    = var.region
  description = each.value.description

  build_config {
    runtime           = var.python_runtime
    entry_point       = each.key
    service_account   = google_service_account.build.id
    docker_repository = google_artifact_registry_repository.functions.id
    source {
      storage_source {
        bucket = google_storage_bucket.source.name
        object = google_storage_bucket_object.functions_source.name
      }
    }
  }

  service_config {
    service_account_email          = google_service_account.orchestrator.email
    ingress_settings               = "ALLOW_INTERNAL_ONLY"
    all_traffic_on_latest_revision = true
    # One event per instance: handlers are short and CPU-light; concurrency between instances is made safe by the
    # job store's compare-and-set, and a burst beyond max_instance_count waits in Pub/Sub instead of failing.
    available_memory                 = var.function_memory
    timeout_seconds                  = var.function_timeout_seconds
    min_instance_count               = 0
    max_instance_count               = each.value.max_instances
    max_instance_request_concurrency = 1
    environment_variables            = local.function_environment
  }

  depends_on = [
    google_project_service.apis,
    google_project_iam_member.build_logs,
    google_project_iam_member.build_sources,
    google_artifact_registry_repository_iam_member.build_pushes_images,
  ]
}

resource "google_pubsub_subscription" "push" {
  for_each = local.functions
  name     = "${each.value.name}-push"
  topic    = each.value.topic

  # A delivery that outlives the function's timeout has failed anyway.
  ack_deadline_seconds       = min(600, var.function_timeout_seconds + 30)
  message_retention_duration = "604800s"

  push_config {
    push_endpoint = google_cloudfunctions2_function.respawn[each.key].service_config[0].uri
    oidc_token {
      service_account_email = google_service_account.push.email
      audience              = google_cloudfunctions2_function.respawn[each.key].service_config[0].uri
    }
  }

  # Retry on: a non-2xx answer (the handlers raise on transient errors and on another handler's intent in flight)
  # is redelivered with exponential backoff, and after max_delivery_attempts the message is dead-lettered.
  retry_policy {
    minimum_backoff = "10s"
    maximum_backoff = "600s"
  }

  dead_letter_policy {
    dead_letter_topic     = google_pubsub_topic.dead_letter.id
    max_delivery_attempts = var.max_delivery_attempts
  }

  expiration_policy {
    ttl = "" # never expires, however quiet it stays
  }

  depends_on = [google_cloud_run_v2_service_iam_member.push_invokes]
}

# Dead-lettering needs the Pub/Sub service agent to acknowledge on the source subscription.
resource "google_pubsub_subscription_iam_member" "dead_letter_forwarding" {
  for_each     = google_pubsub_subscription.push
  subscription = each.value.name
  role         = "roles/pubsub.subscriber"
  member       = local.pubsub_service_agent
}
