"""A local run's job report as an HTML page (respawn_ops/job_report.py), from its report.json and timeline.jsonl.

Every figure is the report's own (report.json); the timeline adds when each machine was requested and ended, the
notices, preemptions and head starts, and the training steps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from respawn_ops.job_report import Bar, Mark, View, page

REPORT_HTML = "report.html"


def events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "timeline.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return sorted((json.loads(line) for line in lines if line.strip()), key=lambda e: e["t"])


def view(run_dir: Path, report: dict[str, Any]) -> View:
    timeline = events(run_dir)
    t0 = next((e["t"] for e in timeline if e["kind"] == "submitted"), timeline[0]["t"] if timeline else 0.0)
    end = t0 + float(report.get("wall_s") or 0.0)
    end = max([end, *(e["t"] for e in timeline if e["kind"] in ("deleted", "preempted"))])
    job = report.get("job_id") or ""
    bars = []
    tiers = report.get("tiers") or []
    for row in report.get("zones") or ():
        machine = f"{job}-a{row['attempt']}"
        start = _first(timeline, machine, ("create_call",)) or _first(timeline, machine, ("state",)) or t0
        stop = _first(timeline, machine, ("deleted", "preempted"))
        tier = row.get("tier", 0)
        bars.append(
            Bar(
                attempt=row["attempt"],
                zone=row["zone"],
                start=start,
                end=stop,
                end_reason=row.get("end") or "",
                placement=row.get("placement") or "",
                provisioning=tiers[tier]["provisioning"] if tier < len(tiers) else "",
                head_start=_first(timeline, machine, ("start_after",)) is not None,
            )
        )
    zone_of = {f"{job}-a{r['attempt']}": r["zone"] for r in report.get("zones") or ()}
    attempt_of = {f"{job}-a{r['attempt']}": r["attempt"] for r in report.get("zones") or ()}
    marks = [
        Mark(
            e["t"], "notice" if e["kind"] == "notice" else "preemption", zone_of[e["machine"]], attempt_of[e["machine"]]
        )
        for e in timeline
        if e["kind"] in ("notice", "preempted") and e.get("machine") in zone_of
    ]
    steps = [(e["t"], int(e["step"])) for e in timeline if e["kind"] == "step"]
    cost = report.get("cost")
    priced = None
    if cost:
        tier_costs = [t["cost_usd"] for t in tiers]
        actual = round(sum(tier_costs), 4) if tier_costs and None not in tier_costs else cost["spot_usd"]
        priced = {
            "actual_usd": actual,
            "on_demand_usd": cost["on_demand_usd"],
            "priced_as_text": f"{cost['priced_as']} [{cost['prices_as_of']}]",
        }
    return View(
        job_id=job,
        status=str(report.get("status")),
        reason=str(report.get("reason") or ""),
        t0=t0,
        end=end,
        bars=bars,
        marks=marks,
        steps=steps,
        split=dict(report.get("goodput_s") or {}),
        goodput=float(report.get("goodput") or 0.0),
        figures={
            k: report.get(k) for k in ("attempts", "preemptions", "failures", "wall_s", "final_step", "machine_hours")
        },
        cost=priced,
        source=f"local run {run_dir.name}: report.json and timeline.jsonl",
    )


def write(run_dir: Path, report: dict[str, Any], path: Path | None = None) -> Path:
    """Write the page (beside report.json unless `path`); returns where."""
    path = path or run_dir / REPORT_HTML
    path.write_text(page(view(run_dir, report)), encoding="utf-8")
    return path


def _first(timeline: list[dict[str, Any]], machine: str, kinds: tuple[str, ...]) -> float | None:
    return next((e["t"] for e in timeline if e["kind"] in kinds and e.get("machine") == machine), None)
