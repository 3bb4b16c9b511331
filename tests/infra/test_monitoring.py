"""What the first `terraform apply` of infra/terraform/monitoring.tf needs of Google, read offline: the alert policies
wait until Cloud Monitoring knows the log-based metrics they name, the budget names only what the Budget API takes
and is created once its API is on, with a quota project for a person's credentials, and the metrics' units are
units Monitoring reads (UCUM, as MetricDescriptor.unit defines them)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from tfconfig import TF_DIR, Config, parse, strings

from respawn_ops import log_metrics

SLEEP = "${time_sleep.metric_descriptors}"


@pytest.fixture(scope="module")
def config() -> Config:
    return Config.load()


# --- the alerts wait for the metrics' descriptors ------------------------------------------------------------------


def seconds(duration: str) -> int:
    """A time_sleep duration (Go's time.ParseDuration: 30s, 10m, 1h5m) in seconds."""
    parts = re.findall(r"(\d+)([hms])", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, f"not a duration of h, m, s: {duration!r}"
    return sum(int(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)


def test_every_alert_policy_waits_until_monitoring_knows_the_log_based_metrics(config: Config) -> None:
    """Monitoring refuses an alert policy on a log-based metric created moments before (404 "Cannot find metric(s)
    ... could take up to 10 minutes to become available"; terraform-provider-google#11102), and depends_on only
    orders: every policy waits for a time_sleep of 10 minutes or more, created after the metrics, that sleeps
    again when a metric is added (its triggers name them all)."""
    policies = config.of_type("google_monitoring_alert_policy")
    assert len(policies) >= 2
    for name, policy in policies.items():
        assert any("local.metric_type[" in s or "local.promql[" in s for s in strings(policy)), name  # a log metric
        assert policy.get("depends_on") == [SLEEP], name
    sleep = config.resource("time_sleep", "metric_descriptors")
    assert seconds(sleep["create_duration"]) >= 600
    assert sleep["triggers"] == {"metrics": '${join(",", sort([for m in google_logging_metric.respawn : m.id]))}'}
    providers = parse(TF_DIR / "versions.tf")["terraform"][0]["required_providers"][0]
    assert providers["time"]["source"] == "hashicorp/time"


def test_the_duration_reader() -> None:
    assert seconds("10m") == 600 and seconds("1h5m") == 3900 and seconds("90s") == 90
    with pytest.raises(AssertionError):
        seconds("10 minutes")


# --- the budget ------------------------------------------------------------------------------------------------


def test_the_budget_names_email_channels_only_and_at_most_five(config: Config) -> None:
    """billingbudgets v1 NotificationsRule.monitoringNotificationChannels: "For Cloud Billing budget alerts, you must
    use email notification channels", at most 5."""
    budget = config.resource("google_billing_budget", "machines")
    (rule,) = budget["all_updates_rule"]
    assert rule["monitoring_notification_channels"] == (
        "${slice(local.email_channels, 0, min(5, length(local.email_channels)))}"
    )
    assert config.locals["email_channels"] == "${[for c in google_monitoring_notification_channel.email : c.id]}"
    assert config.resource("google_monitoring_notification_channel", "email")["type"] == "email"
    named = " ".join(strings(budget))
    for other in ("pubsub", "webhook", "alert_channels"):
        assert other not in named, other


def test_the_budget_is_created_once_the_budget_api_is_on(config: Config) -> None:
    budget = config.resource("google_billing_budget", "machines")
    assert "${google_project_service.apis}" in budget["depends_on"]
    assert "billingbudgets.googleapis.com" in config.locals["apis"]


def provider_configurations() -> dict[str, dict[str, Any]]:
    """versions.tf's google provider configurations by alias ("" for the default one)."""
    found: dict[str, dict[str, Any]] = {}
    for entry in parse(TF_DIR / "versions.tf")["provider"]:
        for name, body in entry.items():
            if name == "google":
                found[body.get("alias", "")] = body
    return found


def test_the_budget_is_created_with_a_quota_project_for_a_persons_credentials(config: Config) -> None:
    """The Budget API answers 403 to user credentials (Application Default Credentials) without a quota project: the
    google provider's page for google_billing_budget asks for billing_project and user_project_override. Only the
    budget goes through that configuration."""
    budget = config.resource("google_billing_budget", "machines")
    assert budget["provider"] == "${google.billing}"
    billing = provider_configurations()["billing"]
    assert billing["billing_project"] == "${var.project}"
    assert billing["user_project_override"] is True
    assert "user_project_override" not in provider_configurations()[""]
    others = [name for (type_, name), body in config.resources.items() if body.get("provider") == "${google.billing}"]
    assert others == ["machines"]


# --- units -----------------------------------------------------------------------------------------------------

# The units Cloud Monitoring takes (MetricDescriptor.unit, monitoring v3 and logging v2): a subset of UCUM.
#   Expression = Component { "." Component } { "/" Component } ;
#   Component = ( [ PREFIX ] UNIT | "%" ) [ Annotation ] | Annotation | "1" ;
#   Annotation = "{" NAME "}" ;  NAME: non-blank printable ASCII without { or }
_UNIT = r"(?:bit|By|s|min|h|d|1)"
_PREFIX = r"(?:[kMGTPEZYmunpfazy]|Ki|Mi|Gi|Ti|Pi)"
_ANNOTATION = r"\{[!-z|~]+\}"
# A prefixed annotation (k{watt}) is not in the grammar but in Google's own examples (k{watt}.h, k{page_views}/d).
_COMPONENT = rf"(?:(?:{_PREFIX}?{_UNIT}|%)(?:{_ANNOTATION})?|{_PREFIX}?{_ANNOTATION}|\d+)"
UCUM = re.compile(rf"{_COMPONENT}(?:\.{_COMPONENT})*(?:/{_COMPONENT})*")


def is_monitoring_unit(unit: str) -> bool:
    return UCUM.fullmatch(unit) is not None


def test_every_log_based_metric_has_a_unit_monitoring_reads() -> None:
    """Money is a dimensionless count annotated with its currency: {USD}, not USD (which UCUM does not define)."""
    units = {d["name"]: d["unit"] for d in log_metrics.definitions()["metrics"]}
    assert [f"{name}: {unit}" for name, unit in units.items() if not is_monitoring_unit(unit)] == []
    assert units["respawn/cost"] == units["respawn/on_demand_cost"] == "{USD}"


def test_monitoring_tf_sends_each_metrics_unit_as_written(config: Config) -> None:
    metric = config.resource("google_logging_metric", "respawn")
    (descriptor,) = metric["metric_descriptor"]
    assert descriptor["unit"] == "${each.value.unit}"


@pytest.mark.parametrize(
    ("unit", "ok"),
    [
        ("1", True),
        ("s", True),
        ("h", True),
        ("{USD}", True),
        ("By/s", True),
        ("kBy", True),
        ("s{CPU}", True),
        ("k{watt}.h", True),
        ("%", True),
        ("{request}/s", True),
        ("USD", False),
        ("usd", False),
        ("seconds", False),
        ("{}", False),
        ("{US D}", False),
        ("", False),
    ],
)
def test_the_unit_reader(unit: str, ok: bool) -> None:
    assert is_monitoring_unit(unit) is ok
