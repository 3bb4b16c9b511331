"""`respawn report JOB --html FILE`: one self-contained HTML page of a job a person can look at.

The page is built from a `View`, which either source fills in: a deployed job's record and its log entries
(`from_record`), or a local run's report.json and timeline (`localcloud/readout/html_report.py`). It shows:

  the attempts on a timeline, one row per zone: a bar per attempt (its machine's request to its end, coloured by
  how it ended), preemptions (red) and notices (amber) as marks, a head start's attempt outlined
  the training step over time
  the goodput split: productive time and each kind of badput
  cost at the price paid against on-demand
  each attempt's reason for its zone

Inline SVG and CSS only: no script, no external asset, so the page opens anywhere (an email attachment, a bucket).
Every figure is also in an element with a `data-figure` attribute, for tests and scrapers.
"""

from __future__ import annotations

import html
import html.parser
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from respawn.accounting import job_accounting
from respawn.jobs import COUNTED_AS_PREEMPTION, Job

END_COLOURS = {
    "completed": "#2e7d32",
    "preempted": "#c62828",
    "lost": "#c62828",
    "failed": "#6a1b9a",
    "hung": "#6a1b9a",
    "capacity": "#9e9e9e",
    "queued": "#9e9e9e",
    "stuck": "#9e9e9e",
    "": "#1565c0",  # live
}
SPLIT_COLOURS = {
    "productive_s": "#2e7d32",
    "startup_s": "#f9a825",
    "restore_s": "#ef6c00",
    "checkpoint_s": "#1565c0",
    "input_s": "#00838f",  # waiting for the data pipeline (a dataset read through Grain)
    "wasted_s": "#6a1b9a",
    "lost_s": "#c62828",
    "waiting_s": "#9e9e9e",
    "idle_s": "#cfd8dc",
}


@dataclass(frozen=True)
class Bar:
    attempt: int
    zone: str
    start: float
    end: float | None  # None: still live
    end_reason: str
    placement: str = ""  # the attempt's reason for its zone (Attempt.zone_reason)
    provisioning: str = ""
    head_start: bool = False  # requested on its predecessor's notice


@dataclass(frozen=True)
class Mark:
    t: float
    kind: str  # preemption | notice
    zone: str
    attempt: int


@dataclass
class View:
    job_id: str
    status: str
    reason: str
    t0: float
    end: float
    bars: list[Bar]
    marks: list[Mark]
    steps: list[tuple[float, int]]
    split: dict[str, float]  # seconds per category
    goodput: float
    figures: dict[str, Any] = field(default_factory=dict)  # attempts, preemptions, wall_s, final_step, ...
    cost: dict[str, Any] | None = None  # {actual_usd, on_demand_usd, priced_as}
    source: str = ""


def from_record(job: Job, entries: Sequence[Mapping[str, Any]], now: float) -> View:
    """A deployed job: its record (attempts, their times and placement) and its trainer's entries (steps)."""
    books = job_accounting(job, now)
    end = books["wall_s"] + job.submitted_at
    tiers = job.spec.all_tiers if job.spec else ()
    bars = [
        Bar(
            a.n,
            a.zone,
            a.requested_at,
            a.ended_at,
            str(a.end_reason or ""),
            a.zone_reason,
            tiers[a.tier].provisioning if a.tier < len(tiers) else "",
            head_start=_requested_on_notice(job, a.n),
        )
        for a in job.attempts
    ]
    marks = []
    for a in job.attempts:
        if a.ended_at is not None and a.end_reason in COUNTED_AS_PREEMPTION:
            marks.append(Mark(a.ended_at, "notice" if a.drain_until is not None else "preemption", a.zone, a.n))
    steps = sorted(
        (t, int(p["step"]))
        for e in entries
        if isinstance(p := e.get("jsonPayload"), Mapping) and isinstance(p.get("step"), int)
        if (t := _seconds(e.get("timestamp"))) is not None
    )
    tiers_cost = [t["cost_usd"] for t in books["tiers"]]
    cost = None
    if books["cost"]:
        actual = round(sum(tiers_cost), 4) if all(c is not None for c in tiers_cost) else books["cost"]["spot_usd"]
        cost = {"actual_usd": actual, "on_demand_usd": books["cost"]["on_demand_usd"], "priced_as": books["cost"]}
    return View(
        job_id=job.job_id,
        status=job.status.value,
        reason=job.reason,
        t0=job.submitted_at,
        end=end,
        bars=bars,
        marks=marks,
        steps=steps,
        split=dict(books["seconds"]),
        goodput=books["goodput"],
        figures={
            "attempts": len(job.attempts),
            "preemptions": job.counters.preemptions,
            "failures": job.counters.failures,
            "wall_s": books["wall_s"],
            "final_step": job.result.get("step"),
            "machine_hours": books["machine_hours"],
        },
        cost=cost,
        source=f"job record and {len(entries)} log entries",
    )


def _requested_on_notice(job: Job, n: int) -> bool:
    before = next((a for a in job.attempts if a.n == n - 1), None)
    return before is not None and before.drain_until is not None


def _seconds(value: Any) -> float | None:
    from respawn.parsing import rfc3339

    return rfc3339(value) if isinstance(value, str) else None


# -- the page ----------------------------------------------------------------------------------------------------


def page(v: View) -> str:
    """The whole page: HTML with inline CSS and SVG."""
    esc = html.escape
    title = f"respawn job {v.job_id}: {v.status}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{esc(title)}</title>",
        f"<style>{CSS}</style></head><body>",
        f'<h1>job <span data-figure="job_id">{esc(v.job_id)}</span>: '
        f'<span data-figure="status" class="status">{esc(v.status)}</span></h1>',
        f'<p class="reason">{esc(v.reason)}</p>' if v.reason else "",
        _figures(v),
        "<h2>Attempts by zone</h2>",
        _timeline(v),
        "<h2>Training step</h2>",
        _steps(v),
        "<h2>Where the time went</h2>",
        _split(v),
        "<h2>Cost</h2>",
        _cost(v),
        "<h2>Placement</h2>",
        _placement(v),
        f'<p class="source">from the {esc(v.source)}</p>' if v.source else "",
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p)


CSS = (
    "body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#212121;max-width:1100px}"
    "h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #e0e0e0}"
    ".figures{display:flex;flex-wrap:wrap;gap:12px}.figure{border:1px solid #e0e0e0;border-radius:6px;"
    "padding:8px 14px;min-width:110px}.figure b{display:block;font-size:20px}"
    "table{border-collapse:collapse}td,th{border-bottom:1px solid #eee;padding:3px 10px;text-align:left}"
    "td.n{text-align:right;font-variant-numeric:tabular-nums}svg text{font:11px system-ui,sans-serif}"
    ".legend span{display:inline-block;margin-right:12px}.legend i{display:inline-block;width:10px;height:10px;"
    "margin-right:4px}.reason,.source{color:#616161}"
)


def _figures(v: View) -> str:
    shown = [
        ("attempts", "attempts", v.figures.get("attempts")),
        ("preemptions", "preemptions", v.figures.get("preemptions")),
        ("failures", "failures", v.figures.get("failures")),
        ("goodput", "goodput", f"{100 * v.goodput:.1f}%"),
        ("wall_s", "wall time (s)", _num(v.figures.get("wall_s"), 1)),
        ("final_step", "final step", v.figures.get("final_step")),
        ("machine_hours", "machine hours", _num(v.figures.get("machine_hours"), 4)),
    ]
    cells = "".join(
        f'<div class="figure">{html.escape(label)}<b data-figure="{key}">{html.escape(_text(value))}</b></div>'
        for key, label, value in shown
    )
    return f'<div class="figures">{cells}</div>'


def _timeline(v: View) -> str:
    zones = list(dict.fromkeys(b.zone for b in v.bars)) or ["-"]
    width, left, row = 1000, 140, 34
    height = 30 + row * len(zones) + 24
    span = max(v.end - v.t0, 1e-6)

    def x(t: float) -> float:
        return left + (width - left - 10) * min(max(t - v.t0, 0.0), span) / span

    out = [f'<svg id="timeline" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">']
    out.append(f"<title>attempts of {html.escape(v.job_id)} by zone</title>")
    for i, zone in enumerate(zones):
        y = 20 + i * row
        out.append(f'<text x="4" y="{y + 18}" data-zone="{html.escape(zone)}">{html.escape(zone)}</text>')
        out.append(f'<line x1="{left}" y1="{y + row - 4}" x2="{width - 10}" y2="{y + row - 4}" stroke="#eee"/>')
    for b in v.bars:
        y = 20 + zones.index(b.zone) * row + 4
        x0, x1 = x(b.start), x(b.end if b.end is not None else v.end)
        colour = END_COLOURS.get(b.end_reason, "#455a64")
        dash = ' stroke="#000" stroke-dasharray="4 2" stroke-width="1.5"' if b.head_start else ""
        label = f"a{b.attempt} {b.end_reason or 'live'}" + (" (head start)" if b.head_start else "")
        out.append(
            f'<rect class="attempt" data-attempt="{b.attempt}" data-end="{html.escape(b.end_reason)}" '
            f'x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 2):.1f}" height="20" fill="{colour}" '
            f'fill-opacity="0.8"{dash}><title>{html.escape(label)}</title></rect>'
        )
        out.append(f'<text x="{x0 + 3:.1f}" y="{y + 14}" fill="#fff">a{b.attempt}</text>')
    for m in v.marks:
        if m.zone not in zones:
            continue
        y = 20 + zones.index(m.zone) * row
        colour = "#c62828" if m.kind == "preemption" else "#ff8f00"
        px = x(m.t)
        out.append(
            f'<path class="mark" data-kind="{m.kind}" d="M{px:.1f},{y + 2} l-6,-10 h12 z" fill="{colour}">'
            f"<title>{m.kind} of a{m.attempt} at {m.t - v.t0:.1f}s</title></path>"
        )
    axis_y = 20 + row * len(zones) + 14
    for k in range(6):
        t = v.t0 + span * k / 5
        out.append(f'<text x="{x(t) - 10:.1f}" y="{axis_y}">{t - v.t0:.0f}s</text>')
    out.append("</svg>")
    legend = "".join(
        f'<span><i style="background:{c}"></i>{html.escape(name)}</span>'
        for name, c in (
            ("completed", END_COLOURS["completed"]),
            ("preempted / lost", END_COLOURS["preempted"]),
            ("failed / hung", END_COLOURS["failed"]),
            ("no capacity", END_COLOURS["capacity"]),
            ("live", END_COLOURS[""]),
            ("notice", "#ff8f00"),
        )
    )
    return "\n".join(out) + f'<div class="legend">{legend} <span>dashed: a head start</span></div>'


def _steps(v: View) -> str:
    if not v.steps:
        return "<p>No training steps reported.</p>"
    width, height, left = 1000, 220, 60
    span = max(v.end - v.t0, 1e-6)
    top = max(s for _, s in v.steps) or 1
    points = " ".join(
        f"{left + (width - left - 10) * (t - v.t0) / span:.1f},{height - 24 - (height - 40) * s / top:.1f}"
        for t, s in v.steps
    )
    return (
        f'<svg id="steps" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">'
        f"<title>training step over time</title>"
        f'<polyline points="{points}" fill="none" stroke="#1565c0" stroke-width="2"/>'
        f'<text x="4" y="20">step {top}</text><text x="4" y="{height - 24}">0</text>'
        f'<text x="{left}" y="{height - 6}">0s</text><text x="{width - 60}" y="{height - 6}">{span:.0f}s</text>'
        "</svg>"
    )


def _split(v: View) -> str:
    total = sum(v.split.get(k, 0.0) for k in SPLIT_COLOURS) or 1.0
    width, x = 1000, 0.0
    rects = []
    for key, colour in SPLIT_COLOURS.items():
        w = width * v.split.get(key, 0.0) / total
        if w > 0:
            rects.append(
                f'<rect x="{x:.1f}" y="0" width="{w:.1f}" height="26" fill="{colour}"><title>{key}</title></rect>'
            )
        x += w
    rows = "".join(
        f'<tr><td><i style="display:inline-block;width:10px;height:10px;background:{c}"></i> '
        f'{key.removesuffix("_s")}</td><td class="n" data-figure="split.{key}">{v.split.get(key, 0.0):.3f}</td></tr>'
        for key, c in SPLIT_COLOURS.items()
        if key in v.split
    )
    return (
        f'<svg id="split" width="{width}" height="26" viewBox="0 0 {width} 26" role="img">'
        f"<title>goodput split</title>{''.join(rects)}</svg>"
        f"<table><tr><th>seconds</th><th></th></tr>{rows}</table>"
    )


def _cost(v: View) -> str:
    if not v.cost:
        return "<p>No price for this machine type (respawn/prices.py).</p>"
    actual, on_demand = v.cost["actual_usd"], v.cost["on_demand_usd"]
    saved = 100 * (1 - actual / on_demand) if on_demand else 0.0
    most = max(actual, on_demand, 1e-9)
    bars = "".join(
        f'<rect x="150" y="{y}" width="{740 * value / most:.1f}" height="22" fill="{c}"></rect>'
        f'<text x="4" y="{y + 15}">{label}</text><text x="{156 + 740 * value / most:.1f}" y="{y + 15}">'
        f"${value:.4f}</text>"
        for y, label, value, c in (
            (4, "at the price paid", actual, "#2e7d32"),
            (32, "at on-demand", on_demand, "#9e9e9e"),
        )
    )
    return (
        f'<svg id="cost" width="1000" height="60" viewBox="0 0 1000 60" role="img"><title>cost</title>{bars}</svg>'
        f'<p>Paid <b data-figure="cost.actual_usd">{actual:.4f}</b> USD against '
        f'<b data-figure="cost.on_demand_usd">{on_demand:.4f}</b> USD on-demand: '
        f'<b data-figure="cost.saved_percent">{saved:.0f}</b>% less. '
        f"{html.escape(_text(v.cost.get('priced_as_text', '')))}</p>"
    )


def _placement(v: View) -> str:
    rows = "".join(
        f'<tr data-attempt="{b.attempt}"><td>a{b.attempt}</td><td>{html.escape(b.zone)}</td>'
        f"<td>{html.escape(b.provisioning)}</td><td>{html.escape(b.end_reason or 'live')}"
        f"{' (head start)' if b.head_start else ''}</td>"
        f'<td data-figure="placement.a{b.attempt}">{html.escape(b.placement or "list order")}</td></tr>'
        for b in v.bars
    )
    return (
        f"<table><tr><th>attempt</th><th>zone</th><th>model</th><th>end</th><th>why this zone</th></tr>{rows}</table>"
    )


def _num(value: Any, digits: int) -> str:
    return "-" if value is None else f"{float(value):.{digits}f}"


def _text(value: Any) -> str:
    return "-" if value is None else str(value)


class _Figures(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.figures: dict[str, str] = {}
        self._open: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        key = dict(attrs).get("data-figure")
        if key:
            self._open = key
            self.figures[key] = ""

    def handle_endtag(self, tag: str) -> None:
        self._open = None

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self.figures[self._open] += data


def read_figures(dom: str) -> dict[str, str]:
    """Every `data-figure` of a page (as written, or as a browser rendered it): {name: text}."""
    reader = _Figures()
    reader.feed(dom)
    return reader.figures
