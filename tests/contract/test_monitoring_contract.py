"""The dashboard, the alert policies and the log-based metrics of infra/terraform/monitoring.tf, held to Google's
published definitions of the Monitoring (v1 dashboards, v3 alert policies) and Logging (v2 log metrics) APIs, the
discovery documents google-api-python-client ships, as the local APIs are (discovery.py).

Terraform's google provider sends each resource as the API's JSON with its snake_case names in camelCase and a
nested block as an object (an array where the API has one); the alert policies are read from the .tf file that way.
A Terraform expression (`${...}`) stands for a value the check cannot know, and passes. Beyond the schemas: every
metric an alert or a chart names is one of respawn's log-based metrics, with the labels it groups by."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import hcl2
import pytest
from discovery import Api
from hcl2 import SerializationOptions

from respawn_ops import log_metrics

REPO = Path(__file__).resolve().parents[2]
TF = REPO / "infra" / "terraform"
MONITORING_V1 = Api.load("monitoring.v1")
MONITORING_V3 = Api.load("monitoring.v3")
LOGGING_V2 = Api.load("logging.v2")
TERRAFORM_ONLY = {"depends_on", "count", "for_each", "lifecycle", "provider", "project", "timeouts"}
METRICS = {d["name"]: d for d in log_metrics.definitions()["metrics"]}
_METRIC_TYPE = re.compile(r'metric\.type="logging\.googleapis\.com/user/(?P<name>[^"]+)"')
_METRIC_TYPE_EXPR = re.compile(r'metric\.type="\$\{local\.metric_type\["(?P<name>[^"]+)"\]\}')
_PROMQL = re.compile(r"logging_googleapis_com:user_(?P<name>[a-z0-9_]+)")


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.title() for w in rest)


def as_api_json(api: Api, schema: str, body: dict[str, Any]) -> dict[str, Any]:
    """A resource body as python-hcl2 reads it (blocks are lists of dicts) -> the API's JSON, guided by `schema`."""
    properties = api.schemas[schema]["properties"]
    out: dict[str, Any] = {}
    for key, value in body.items():
        if key in TERRAFORM_ONLY:
            continue
        name = camel(key)
        spec = properties.get(name, {})
        out[name] = _value(api, spec, value)
    return out


def _value(api: Api, spec: dict[str, Any], value: Any) -> Any:
    if unknowable(value):  # computed by Terraform: a value of the right type stands in for it
        return PLACEHOLDERS.get(spec.get("type", "string"), value)
    if isinstance(value, str) and "${" in value:  # a template: "${max(300, var.x)}s" -> "1s"
        return re.sub(r"\$\{[^}]*\}", "1", value)
    ref = spec.get("$ref") or (spec.get("items") or {}).get("$ref")
    is_block = isinstance(value, list) and value and all(isinstance(v, dict) for v in value)
    if is_block and ref and spec.get("type") != "array":
        assert len(value) == 1, f"one block expected for {ref}"
        return as_api_json(api, ref, value[0])
    if is_block and ref:
        return [as_api_json(api, ref, v) for v in value]
    return value


PLACEHOLDERS: dict[str, Any] = {"number": 1.0, "integer": 1, "boolean": True, "array": ["x"]}


def unknowable(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("${") and value.endswith("}")


MONITORING_TF = hcl2.loads(
    (TF / "monitoring.tf").read_text(encoding="utf-8"),
    serialization_options=SerializationOptions(strip_string_quotes=True, explicit_blocks=False, with_comments=False),
)


def resources(type_: str) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for block in MONITORING_TF.get("resource", []):
        found.update(block.get(type_, {}))
    return found


# ------------------------------------------------------------------------------------------------ the dashboard


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((TF / "dashboard.json").read_text(encoding="utf-8"))
    return loaded


def test_the_dashboard_is_a_dashboard_of_the_monitoring_api() -> None:
    assert MONITORING_V1.check("Dashboard", dashboard()) == []


def test_every_chart_reads_one_of_respawns_metrics_by_labels_it_has() -> None:
    charts = [t["widget"] for t in dashboard()["mosaicLayout"]["tiles"]]
    assert len(charts) >= 10
    read = set()
    for chart in charts:
        for data in chart["xyChart"]["dataSets"]:
            query = data["timeSeriesQuery"]
            if "prometheusQuery" in query:
                names = {_promql_metric(n) for n in _PROMQL.findall(query["prometheusQuery"])}
            else:
                series = query["timeSeriesFilter"]
                names = set(_METRIC_TYPE.findall(series["filter"]))
                for field in series["aggregation"].get("groupByFields", []):
                    label = field.removeprefix("metric.label.")
                    assert all(label in METRICS[n]["labels"] for n in names), (chart["title"], field)
            assert names and names <= METRICS.keys(), (chart["title"], names)
            read |= names
    # the issue's figures: fleet status, recoveries, goodput, cost and savings, preemptions per zone
    assert {"respawn/job_status", "respawn/recovery_duration", "respawn/job_goodput", "respawn/cost"} <= read
    assert {"respawn/on_demand_cost", "respawn/preemptions", "respawn/function_errors"} <= read


def _promql_metric(name: str) -> str:
    """logging_googleapis_com:user_respawn_cost_sum -> respawn/cost (a distribution's _sum, _count, _bucket)."""
    for suffix in ("", "_sum", "_count", "_bucket"):
        base = name.removesuffix(suffix) if suffix else name
        candidate = base.replace("respawn_", "respawn/", 1)
        if candidate in METRICS and (not suffix or "value_extractor" in METRICS[candidate]):
            return candidate
    return name


def test_a_dashboard_with_a_wrong_field_fails_the_check() -> None:
    wrong = dashboard()
    tile = wrong["mosaicLayout"]["tiles"][0]
    tile["widget"]["xyChart"]["dataSets"][0]["plotType"] = "PIE"
    tile["widget"]["xyChart"]["yAxs"] = {}
    problems = MONITORING_V1.check("Dashboard", wrong)
    assert len(problems) == 2 and any("PIE" in p for p in problems) and any("yAxs" in p for p in problems), problems


# ------------------------------------------------------------------------------------------------ the alerts


def locals_block(name: str) -> Any:
    return next(block[name] for block in MONITORING_TF.get("locals", []) if name in block)


def expanded(body: Any, values: dict[str, Any]) -> Any:
    """A for_each resource's body for one `each.value`: `${each.value.X}` replaced by X's value (whole, or spliced
    into a longer string), as Terraform does; `${local.metric_type[each.value.metric]}` names the metric."""
    if isinstance(body, dict):
        return {k: expanded(v, values) for k, v in body.items()}
    if isinstance(body, list):
        return [expanded(v, values) for v in body]
    if not isinstance(body, str):
        return body
    whole = re.fullmatch(r"\$\{each\.value\.([a-z_]+)\}", body)
    if whole:
        return values[whole[1]]
    body = body.replace("${local.metric_type[each.value.metric]}", f'${{local.metric_type["{values.get("metric")}"]}}')
    return re.sub(r"\$\{each\.value\.([a-z_]+)\}", lambda m: str(values[m[1]]), body)


def alert_policies() -> dict[str, dict[str, Any]]:
    """Every alert policy of monitoring.tf by name: the threshold alerts one per entry of local.threshold_alerts."""
    found = resources("google_monitoring_alert_policy")
    template = found.pop("threshold")
    assert template["for_each"] == "${local.threshold_alerts}"
    for name, values in locals_block("threshold_alerts").items():
        found[name] = {k: v for k, v in expanded(template, values).items() if k != "for_each"}
    return found


ALERTS = alert_policies()


def test_there_is_an_alert_for_each_of_the_issues_conditions() -> None:
    assert set(ALERTS) == {"job_failed", "no_progress", "low_goodput", "function_errors", "zone_preemptions"}


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_each_alert_policy_is_an_alert_policy_of_the_monitoring_api(name: str) -> None:
    assert ALERTS[name]["notification_channels"] == "${local.alert_channels}"
    policy = as_api_json(MONITORING_V3, "AlertPolicy", ALERTS[name])
    assert policy["conditions"] and policy["documentation"]["content"]
    assert MONITORING_V3.check("AlertPolicy", policy) == []


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_each_alert_reads_respawns_metrics_and_a_documented_threshold(name: str) -> None:
    text = "\n".join(strings(ALERTS[name]))
    names = set(_METRIC_TYPE_EXPR.findall(text)) | {_promql_metric(f"respawn_{n}") for n in _promql_names(text)}
    assert names and names <= METRICS.keys(), names
    for condition in ALERTS[name]["conditions"]:
        for threshold in condition.get("condition_threshold", []):
            for aggregation in threshold["aggregations"]:
                for field in aggregation.get("group_by_fields", []):
                    assert all(field.removeprefix("metric.label.") in METRICS[n]["labels"] for n in names), field
    variables = set(re.findall(r"var\.(alert_[a-z_]+)", text))
    assert variables, f"{name}: no threshold variable"
    declared = (TF / "variables_monitoring.tf").read_text()
    assert all(f'variable "{v}"' in declared for v in variables), variables


def _promql_names(text: str) -> list[str]:
    found: list[str] = re.findall(r'local\.promql\["respawn/([a-z_]+)"\]', text)
    return found


def strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return [value] if isinstance(value, str) else []


def test_an_alert_with_a_wrong_field_fails_the_check() -> None:
    policy = as_api_json(MONITORING_V3, "AlertPolicy", ALERTS["job_failed"])
    policy["conditions"][0]["conditionThreshold"]["comparison"] = "GREATER"
    policy["combiner"] = "XOR"
    problems = MONITORING_V3.check("AlertPolicy", policy)
    assert len(problems) == 2, problems


# ------------------------------------------------------------------------------------------------ the metrics


def log_metric_json(d: dict[str, Any], scope: str) -> dict[str, Any]:
    """A metric of log_metrics.json as monitoring.tf makes it, in the Logging API's JSON."""
    body: dict[str, Any] = {
        "name": d["name"],
        "description": d["description"],
        "filter": log_metrics.full_filter(scope, d["where"]),
        "labelExtractors": d["labels"],
        "metricDescriptor": {
            "metricKind": "DELTA",
            "valueType": "DISTRIBUTION" if "value_extractor" in d else "INT64",
            "unit": d["unit"],
            "displayName": d["display_name"],
            "labels": [{"key": k, "valueType": "STRING"} for k in d["labels"]],
        },
    }
    if "value_extractor" in d:
        body["valueExtractor"] = d["value_extractor"]
        kind, options = next(iter(d["buckets"].items()))
        body["bucketOptions"] = {f"{kind}Buckets": {camel(k): v for k, v in options.items()}}
    return body


def test_each_log_metric_is_a_log_metric_of_the_logging_api() -> None:
    doc = log_metrics.definitions()
    for d in doc["metrics"]:
        assert LOGGING_V2.check("LogMetric", log_metric_json(d, doc["scope"])) == [], d["name"]
    assert len(log_metrics.metrics()) == len(doc["metrics"]) >= 12  # each filter and extractor parses here too


def test_monitoring_tf_builds_each_metric_from_the_one_file() -> None:
    metric = resources("google_logging_metric")["respawn"]
    assert "log_metrics.json" in metric["for_each"] or "log_metrics" in metric["for_each"]
    assert metric["filter"] == "${local.log_metrics.scope} AND (${each.value.where})"
    # the code composes it the same way
    assert log_metrics.full_filter("S", "W") == "S AND (W)"
