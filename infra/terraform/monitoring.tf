# What a team sees of its jobs in Cloud Monitoring: log-based metrics, a dashboard, alerts and an optional budget.
#
# The metrics count the facts the functions log (respawn/facts.py): one line per status change, attempt ended or
# started, recovery and ended job, written only by the handler whose compare-and-set recorded it, so a redelivered
# event counts nothing twice. Their definitions have one source, read here and by the code
# (respawn_ops/log_metrics.json: the local cloud evaluates the same filters over a run's entries, and the
# tests hold each metric to the run's report). docs/operations.md, Monitoring, explains each figure and alert.

locals {
  log_metrics = jsondecode(file("${path.module}/../../respawn_ops/log_metrics.json"))
  # Monitoring's name of each metric, and its PromQL name (logging.googleapis.com/user/respawn/x ->
  # logging_googleapis_com:user_respawn_x), for the alerts below.
  metric_type  = { for m in local.log_metrics.metrics : m.name => "logging.googleapis.com/user/${m.name}" }
  promql       = { for m in local.log_metrics.metrics : m.name => "logging_googleapis_com:user_${replace(m.name, "/", "_")}" }
  on_functions = "resource.type=\"cloud_run_revision\""

  email_channels = [for c in google_monitoring_notification_channel.email : c.id]
  alert_channels = concat(
    local.email_channels,
    [for c in google_monitoring_notification_channel.pubsub : c.id],
    [for c in google_monitoring_notification_channel.webhook : c.id],
  )
  monitoring_notifier = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-monitoring-notification.iam.gserviceaccount.com"
}

resource "google_logging_metric" "respawn" {
  for_each    = { for m in local.log_metrics.metrics : m.name => m }
  name        = each.key
  description = each.value.description
  filter      = "${local.log_metrics.scope} AND (${each.value.where})"
  # A distribution extracts its value; a counter counts matching entries.
  value_extractor  = try(each.value.value_extractor, null)
  label_extractors = each.value.labels

  metric_descriptor {
    metric_kind  = "DELTA"
    value_type   = can(each.value.value_extractor) ? "DISTRIBUTION" : "INT64"
    unit         = each.value.unit
    display_name = each.value.display_name
    dynamic "labels" {
      for_each = keys(each.value.labels)
      content {
        key        = labels.value
        value_type = "STRING"
      }
    }
  }

  dynamic "bucket_options" {
    for_each = can(each.value.buckets) ? [each.value.buckets] : []
    content {
      dynamic "exponential_buckets" {
        for_each = can(bucket_options.value.exponential) ? [bucket_options.value.exponential] : []
        content {
          num_finite_buckets = exponential_buckets.value.num_finite_buckets
          growth_factor      = exponential_buckets.value.growth_factor
          scale              = exponential_buckets.value.scale
        }
      }
      dynamic "linear_buckets" {
        for_each = can(bucket_options.value.linear) ? [bucket_options.value.linear] : []
        content {
          num_finite_buckets = linear_buckets.value.num_finite_buckets
          width              = linear_buckets.value.width
          offset             = linear_buckets.value.offset
        }
      }
    }
  }

  depends_on = [google_project_service.apis]
}

# --- the dashboard ----------------------------------------------------------------------------------------------

resource "google_monitoring_dashboard" "respawn" {
  # Fleet status, recoveries, goodput, cost and savings by job and zone, preemptions per zone over time. The JSON
  # is held to the Monitoring API's published Dashboard schema by tests/contract/test_monitoring_contract.py.
  dashboard_json = file("${path.module}/dashboard.json")
  depends_on     = [google_logging_metric.respawn]
}

# --- notification channels --------------------------------------------------------------------------------------

resource "google_monitoring_notification_channel" "email" {
  for_each     = toset(var.alert_emails)
  display_name = "respawn alerts to ${each.value}"
  type         = "email"
  labels       = { email_address = each.value }
  depends_on   = [google_project_service.apis]
}

# Alerts as JSON messages on a topic, for chat tools and automation (subscribe a push endpoint to it).
resource "google_pubsub_topic" "alerts" {
  #checkov:skip=CKV_GCP_83:Google-managed encryption at rest; alert messages carry policy names, metric labels (job ids, zones) and thresholds, never credentials, so a customer-managed key would add key management without protecting anything more.
  count                      = var.alert_pubsub ? 1 : 0
  name                       = "respawn-alerts"
  message_retention_duration = "604800s"
  depends_on                 = [google_project_service.apis]
}


resource "google_monitoring_notification_channel" "pubsub" {
  count        = var.alert_pubsub ? 1 : 0
  display_name = "respawn alerts on respawn-alerts"
  type         = "pubsub"
  labels       = { topic = google_pubsub_topic.alerts[0].id }
}

# Monitoring creates its notification service agent with the first Pub/Sub channel of the project, so the grant
# comes after the channel (docs: Cloud Monitoring, "Create a Pub/Sub notification channel").
resource "google_pubsub_topic_iam_member" "alerts_publisher" {
  count      = var.alert_pubsub ? 1 : 0
  topic      = google_pubsub_topic.alerts[0].id
  role       = "roles/pubsub.publisher"
  member     = local.monitoring_notifier
  depends_on = [google_monitoring_notification_channel.pubsub]
}

# A chat tool's incoming webhook (its URL carries its secret: keep it in a tfvars file out of version control).
resource "google_monitoring_notification_channel" "webhook" {
  count        = var.alert_webhook_url == null ? 0 : 1
  display_name = "respawn alerts to a webhook"
  type         = "webhook_tokenauth"
  labels       = { url = var.alert_webhook_url }
  depends_on   = [google_project_service.apis]
}

# --- alerts -----------------------------------------------------------------------------------------------------

# Cloud Monitoring learns of a new log-based metric some minutes after Logging created it: until then, an alert policy
# that names it is refused with 404 "Cannot find metric(s) that match type = ... If a metric was created recently, it
# could take up to 10 minutes to become available" (https://github.com/hashicorp/terraform-provider-google/issues/11102).
# depends_on orders the policies after the metrics but does not wait, so the first apply would fail there. Every alert
# policy waits for this sleep, which sleeps only when it is created: on the first apply, and again on an apply that
# adds a metric (its triggers name them all); an apply that adds none does not wait.
resource "time_sleep" "metric_descriptors" {
  create_duration = "10m" # the bound Monitoring's own message gives
  triggers = {
    metrics = join(",", sort([for m in google_logging_metric.respawn : m.id]))
  }
}

# The alerts on a threshold of one metric: one policy each, all built the same way (below). Each names its metric, a
# filter on its labels, how its series are aligned and reduced, the threshold variable, and what the notice says.
locals {
  threshold_alerts = {
    job_failed = {
      display_name = "respawn: a job FAILED or EXPIRED"
      severity     = "ERROR"
      condition    = "jobs that came to FAILED or EXPIRED"
      metric       = "respawn/job_status"
      labels       = " AND metric.label.status=one_of(\"FAILED\", \"EXPIRED\")"
      comparison   = "COMPARISON_GT"
      threshold    = var.alert_failed_jobs
      period       = "300s"
      aligner      = "ALIGN_SUM"
      reducer      = "REDUCE_SUM"
      group_by     = ["metric.label.job_id", "metric.label.status"]
      auto_close   = "1800s"
      subject      = "respawn: job $${metric.label.job_id} is $${metric.label.status}"
      content      = "Job $${metric.label.job_id} ended $${metric.label.status}. `respawn status $${metric.label.job_id}` says why; `respawn report $${metric.label.job_id} --html report.html` shows its attempts. Threshold: var.alert_failed_jobs."
    }
    no_progress = {
      display_name = "respawn: a job stuck queued or without training progress"
      severity     = "WARNING"
      condition    = "seconds since the job's newest sign of training, per sweep"
      metric       = "respawn/progress_age"
      labels       = ""
      comparison   = "COMPARISON_GT"
      threshold    = var.alert_no_progress_seconds
      period       = "${max(300, var.sweep_every_minutes * 120)}s" # two sweeps at least
      aligner      = "ALIGN_MEAN"
      reducer      = "REDUCE_MAX"
      group_by     = ["metric.label.job_id", "metric.label.status"]
      auto_close   = "3600s"
      subject      = "respawn: job $${metric.label.job_id} has made no progress ($${metric.label.status})"
      content      = "Job $${metric.label.job_id} has shown no training progress for longer than var.alert_no_progress_seconds while $${metric.label.status}: queued for capacity (PENDING, PROVISIONING) or a trainer that stopped reporting. `respawn status` shows its attempts and placement."
    }
    low_goodput = {
      display_name = "respawn: a job ended with low goodput"
      severity     = "WARNING"
      condition    = "goodput of ended jobs below the threshold"
      metric       = "respawn/job_goodput"
      labels       = ""
      comparison   = "COMPARISON_LT"
      threshold    = var.alert_goodput_below
      period       = "300s"
      aligner      = "ALIGN_MEAN"
      reducer      = "REDUCE_MIN"
      group_by     = ["metric.label.job_id"]
      auto_close   = "3600s"
      subject      = "respawn: job $${metric.label.job_id} spent too little of its time training"
      content      = "Job $${metric.label.job_id} ended with goodput below var.alert_goodput_below. `respawn report $${metric.label.job_id} --html report.html` splits its time (startup, restore, checkpoints, waiting, lost work)."
    }
    function_errors = {
      display_name = "respawn: function errors"
      severity     = "ERROR"
      condition    = "error entries of the functions in 5 minutes"
      metric       = "respawn/function_errors"
      labels       = ""
      comparison   = "COMPARISON_GT"
      threshold    = var.alert_function_errors
      period       = "300s"
      aligner      = "ALIGN_SUM"
      reducer      = "REDUCE_SUM"
      group_by     = ["metric.label.function"]
      auto_close   = "1800s"
      subject      = "respawn: errors in $${metric.label.function}"
      content      = "More than var.alert_function_errors error entries in 5 minutes from $${metric.label.function}. Read them with `gcloud logging read 'resource.type=\"cloud_run_revision\" AND resource.labels.service_name=\"$${metric.label.function}\" AND severity>=ERROR' --freshness=1h`; see docs/operations.md, Monitoring."
    }
  }
}

resource "google_monitoring_alert_policy" "threshold" {
  for_each              = local.threshold_alerts
  display_name          = each.value.display_name
  combiner              = "OR"
  severity              = each.value.severity
  notification_channels = local.alert_channels
  conditions {
    display_name = each.value.condition
    condition_threshold {
      filter          = "metric.type=\"${local.metric_type[each.value.metric]}\" AND ${local.on_functions}${each.value.labels}"
      comparison      = each.value.comparison
      threshold_value = each.value.threshold
      duration        = "0s"
      aggregations {
        alignment_period     = each.value.period
        per_series_aligner   = each.value.aligner
        cross_series_reducer = each.value.reducer
        group_by_fields      = each.value.group_by
      }
      trigger {
        count = 1
      }
    }
  }
  documentation {
    mime_type = "text/markdown"
    subject   = each.value.subject
    content   = each.value.content
  }
  alert_strategy {
    auto_close = each.value.auto_close
  }
  depends_on = [time_sleep.metric_descriptors]
}

resource "google_monitoring_alert_policy" "zone_preemptions" {
  display_name          = "respawn: preemptions in a zone well above its history"
  combiner              = "OR"
  severity              = "WARNING"
  notification_channels = local.alert_channels
  conditions {
    display_name = "preemptions in the last hour against the zone's hourly mean of the week before"
    condition_prometheus_query_language {
      # A zone with no week of history compares with 0, so its floor alone applies.
      query               = <<-EOT
        sum by (zone) (increase(${local.promql["respawn/preemptions"]}{monitored_resource="cloud_run_revision"}[1h]))
        > ${var.alert_preemption_factor} * (
            sum by (zone) (increase(${local.promql["respawn/preemptions"]}{monitored_resource="cloud_run_revision"}[7d] offset 1h)) / 168
            or 0 * sum by (zone) (increase(${local.promql["respawn/preemptions"]}{monitored_resource="cloud_run_revision"}[1h]))
          ) + ${var.alert_preemption_floor}
      EOT
      duration            = "0s"
      evaluation_interval = "300s"
    }
  }
  documentation {
    mime_type = "text/markdown"
    subject   = "respawn: preemptions in a zone well above its history"
    content   = "A zone had more than var.alert_preemption_factor times its hourly mean of the week before, plus var.alert_preemption_floor, preemptions in the last hour. respawn's placement ranks zones by this history and moves new attempts away on its own; the dashboard's preemptions per zone shows the trend."
  }
  alert_strategy {
    auto_close = "7200s"
  }
  depends_on = [time_sleep.metric_descriptors]
}

# --- the budget -------------------------------------------------------------------------------------------------

# Spend on the machines respawn creates: they all carry the label respawn-managed=true. Off by default: a budget
# lives on the billing account, which needs roles/billing.costsManager there (docs/operations.md, Monitoring).
#
# Its notices go to the email channels only, the first five: "For Cloud Billing budget alerts, you must use email
# notification channels", at most 5 (billingbudgets v1, NotificationsRule.monitoringNotificationChannels:
# https://cloud.google.com/billing/docs/reference/budget/rest/v1/billingAccounts.budgets). The billing account's
# administrators and users get them as well (its default IAM recipients). It is created through the provider
# configuration that names a quota project (versions.tf, google.billing), once the Budget API is on.
resource "google_billing_budget" "machines" {
  provider        = google.billing
  count           = var.budget_enabled ? 1 : 0
  billing_account = var.billing_account
  display_name    = "respawn machines"

  budget_filter {
    projects        = ["projects/${data.google_project.this.number}"]
    labels          = { "respawn-managed" = "true" }
    calendar_period = "MONTH"
  }

  amount {
    specified_amount {
      currency_code = var.budget_currency
      units         = tostring(var.budget_amount)
    }
  }

  dynamic "threshold_rules" {
    for_each = var.budget_thresholds
    content {
      threshold_percent = threshold_rules.value
    }
  }

  all_updates_rule {
    monitoring_notification_channels = slice(local.email_channels, 0, min(5, length(local.email_channels)))
  }

  lifecycle {
    precondition {
      condition     = var.billing_account != null
      error_message = "budget_enabled needs billing_account (the billing account id, like 012345-6789AB-CDEF01)."
    }
  }

  depends_on = [google_project_service.apis]
}
