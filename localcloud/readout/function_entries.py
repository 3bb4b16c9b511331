"""The functions' log lines of a local run as the LogEntries Cloud Run makes of them, and the metrics they give.

Deployed, each function is a Cloud Run service (respawn-on-event, respawn-on-job-message: infra/terraform) and
every JSON line it writes on stderr becomes a structured entry: resource `cloud_run_revision` labelled with the
service name, `severity` lifted out of the line, the rest as `jsonPayload`; any other line a `textPayload`
entry. Locally functions-framework writes the same lines to the run's `functions/TARGET.log`; this reads them
back into those entries, so `respawn_ops/log_metrics.py` evaluates the deployed metrics' filters over what the run
really wrote.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from localcloud.services.logentries import insert_id
from respawn_ops import log_metrics

SERVICES = {"on_event": "respawn-on-event", "on_job_message": "respawn-on-job-message"}
REGION = "us-central1"


def function_entries(run_dir: Path, project: str = "respawn-local") -> list[dict[str, Any]]:
    """Every line the run's functions wrote, as Cloud Run's LogEntries, function by function, in order."""
    entries = []
    for target, service in SERVICES.items():
        path = run_dir / "functions" / f"{target}.log"
        if not path.exists():
            continue
        for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if raw.strip():
                entries.append(_entry(raw, service, project))
    return entries


def _entry(line: str, service: str, project: str) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "insertId": insert_id("f"),
        "logName": f"projects/{project}/logs/run.googleapis.com%2Fstderr",
        "resource": {
            "type": "cloud_run_revision",
            "labels": {
                "project_id": project,
                "service_name": service,
                "revision_name": f"{service}-00001-loc",
                "configuration_name": service,
                "location": REGION,
            },
        },
    }
    try:
        payload = json.loads(line)
    except ValueError:
        payload = None
    if isinstance(payload, dict):
        entry["severity"] = str(payload.pop("severity", "DEFAULT")).upper()
        entry["jsonPayload"] = payload
    else:
        entry["severity"] = "DEFAULT"
        entry["textPayload"] = line
    return entry


def run_metrics(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Every log-based metric over the run's function entries (what Cloud Monitoring would have counted)."""
    return log_metrics.evaluate(function_entries(run_dir))
