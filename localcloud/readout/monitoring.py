"""What a local run writes beside its report.json for a person and for Cloud Monitoring's figures:

report.html   the job report page (respawn_ops/job_report.py), as `respawn report JOB --html FILE` writes it
metrics.json  every log-based metric of the deployment (respawn_ops/log_metrics.json) over the entries the run's
              functions wrote: what Cloud Monitoring would have counted of this run
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from localcloud.readout import html_report
from localcloud.readout.function_entries import run_metrics

METRICS_JSON = "metrics.json"


def write_beside_report(run_dir: Path, report: dict[str, Any]) -> dict[str, str]:
    """Write both files into the run directory; returns the report's keys naming them."""
    page = html_report.write(run_dir, report)
    metrics = run_dir / METRICS_JSON
    metrics.write_text(json.dumps(run_metrics(run_dir), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return {"html": str(page), "metrics": str(metrics)}
