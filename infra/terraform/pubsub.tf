# Topic names are contracts (the CLI, the functions and the log sink use them).
locals {
  pubsub_service_agent = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-pubsub.iam.gserviceaccount.com"
}

resource "google_pubsub_topic" "jobs" {
  #checkov:skip=CKV_GCP_83:Google-managed encryption at rest; these messages carry job specs, log entries and ticks, never credentials (job messages are validated to hold none), so a customer-managed key would add a key ring, rotation and service-agent grants without protecting anything more.
  name       = "respawn-jobs"
  depends_on = [google_project_service.apis]
}

resource "google_pubsub_topic" "events" {
  #checkov:skip=CKV_GCP_83:Google-managed encryption at rest; these messages carry job specs, log entries and ticks, never credentials (job messages are validated to hold none), so a customer-managed key would add a key ring, rotation and service-agent grants without protecting anything more.
  name       = "respawn-events" # LogEntries from the sink and the sweep ticks
  depends_on = [google_project_service.apis]
}

# One message per status change of a job (respawn/status_messages.py), published by the functions. Subscribe to route it:
# docs/operations.md, Status notices.
resource "google_pubsub_topic" "status" {
  #checkov:skip=CKV_GCP_83:Google-managed encryption at rest; status notices carry job ids, statuses, reasons and counters, never credentials, so a customer-managed key would add a key ring, rotation and service-agent grants without protecting anything more.
  name                       = "respawn-status"
  message_retention_duration = "604800s" # a subscription created later can seek back a week
  depends_on                 = [google_project_service.apis]
}

# Messages that failed max_delivery_attempts deliveries land here, kept for a week for inspection and replay.
resource "google_pubsub_topic" "dead_letter" {
  #checkov:skip=CKV_GCP_83:Google-managed encryption at rest; these messages carry job specs, log entries and ticks, never credentials (job messages are validated to hold none), so a customer-managed key would add a key ring, rotation and service-agent grants without protecting anything more.
  name                       = "respawn-dead-letter"
  message_retention_duration = "604800s"
  depends_on                 = [google_project_service.apis]
}

resource "google_pubsub_subscription" "dead_letter" {
  name                       = "respawn-dead-letter"
  topic                      = google_pubsub_topic.dead_letter.id
  ack_deadline_seconds       = 60
  message_retention_duration = "604800s"
  retain_acked_messages      = false
  expiration_policy {
    ttl = "" # never expires, however quiet it stays
  }
}

# Pub/Sub forwards undeliverable messages as its own service agent: it must publish to the dead-letter topic
# and acknowledge on the source subscriptions (functions.tf).
resource "google_pubsub_topic_iam_member" "dead_letter_publisher" {
  topic  = google_pubsub_topic.dead_letter.id
  role   = "roles/pubsub.publisher"
  member = local.pubsub_service_agent
}
