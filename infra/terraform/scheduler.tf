# The sweep tick: every few minutes, reconcile every active job (TTL expiry, missed events, stuck creations, orphans).
# Published as the Cloud Scheduler service agent, which may publish to topics of its own project.
resource "google_cloud_scheduler_job" "sweep" {
  name        = "respawn-sweep"
  description = "Publishes {\"kind\": \"sweep_tick\"} to respawn-events."
  region      = var.region
  schedule    = "*/${var.sweep_every_minutes} * * * *"
  time_zone   = "Etc/UTC"

  pubsub_target {
    topic_name = google_pubsub_topic.events.id
    data       = base64encode(jsonencode({ kind = "sweep_tick" }))
  }

  depends_on = [google_project_service.apis]
}
