# The log sink: GCE system events about respawn's machines and TPU workers, and the trainer's lifecycle entries,
# routed to respawn-events. The filter has one source, read here and by the code (respawn_ops/logfilter.py: the local
# log router and the tests), so the two cannot drift. Cloud Logging's comment syntax is not relied on in the file;
# its clauses are explained in docs/deploy.md.
resource "google_logging_project_sink" "events" {
  name                   = "respawn-events"
  destination            = "pubsub.googleapis.com/${google_pubsub_topic.events.id}"
  filter                 = file("${path.module}/../../respawn_ops/sink_filter.txt")
  unique_writer_identity = true
}

# The sink's own writer identity may publish to respawn-events and nowhere else.
resource "google_pubsub_topic_iam_member" "sink_publisher" {
  topic  = google_pubsub_topic.events.id
  role   = "roles/pubsub.publisher"
  member = google_logging_project_sink.events.writer_identity
}
