"""`--plot FILE.png`: the timeline of a local run (attempts per zone, preemptions, training step over time)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from localcloud.readout.report import LIVE_STATES


def _spans(events: list[dict[str, Any]], t0: float, end: float) -> list[dict[str, Any]]:
    """One span per machine: requested (its first create call), READY, and its end; in the zone it came up in."""
    spans: dict[str, dict[str, Any]] = {}
    for e in events:
        name = str(e.get("machine"))
        if e["kind"] == "create_call":
            spans.setdefault(name, {"machine": name, "zone": e.get("zone"), "start": e["t"] - t0})
        elif e["kind"] == "state" and name in spans:
            s = spans[name]
            s["zone"] = e.get("zone") or s["zone"]  # a slice's first call may be regional (its workload policy)
            if e["state"] == "READY":
                s.setdefault("ready", e["t"] - t0)
            elif e["state"] not in LIVE_STATES:
                s.setdefault("end", e["t"] - t0)
                s.setdefault("how", e["state"])
        elif e["kind"] in ("deleted", "preempted") and name in spans:
            spans[name].setdefault("end", e["t"] - t0)
            spans[name].setdefault("how", e["kind"].upper())
    for s in spans.values():
        s.setdefault("end", end - t0)
        s.setdefault("how", "live")
    return list(spans.values())


def plot_timeline(events: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = sorted(events, key=lambda e: e["t"])
    t0 = next((e["t"] for e in events if e["kind"] == "submitted"), events[0]["t"])
    end = events[-1]["t"]
    spans = _spans(events, t0, end)
    zones = sorted({s["zone"] for s in spans if s["zone"]})
    fig, (ax1, ax2) = plt.subplots(2, 1, sharex=True, figsize=(11, 6), height_ratios=[1, 2])
    for s in spans:
        y = zones.index(s["zone"]) if s["zone"] in zones else 0
        ready = s.get("ready")
        booting_end = ready if ready is not None else s["end"]
        ax1.barh(y, booting_end - s["start"], left=s["start"], height=0.5, color="#cfd8e3", edgecolor="#7a8aa0")
        if ready is not None:
            ax1.barh(y, s["end"] - ready, left=ready, height=0.5, color="#4c78a8", edgecolor="#2f4b6e")
        label = s["machine"].rsplit("-", 1)[-1]
        ax1.text(s["start"], y + 0.32, label, fontsize=8, va="bottom")
    preempted = [e["t"] - t0 for e in events if e["kind"] == "preempted"]
    notices = [e["t"] - t0 for e in events if e["kind"] == "notice"]
    for ax in (ax1, ax2):
        for t in notices:
            ax.axvline(t, color="#e45756", linestyle=":", linewidth=1)
        for t in preempted:
            ax.axvline(t, color="#e45756", linewidth=1.5)
    ax1.set_yticks(range(len(zones)), zones)
    ax1.set_ylim(-0.6, max(len(zones), 1) - 0.2)
    ax1.set_title(f"{title}  (light: creating/booting, dark: READY; red: preemption notice ··· and preempted —)")

    by_attempt: dict[int, list[tuple[float, int]]] = {}
    for e in events:
        if e["kind"] == "step":
            by_attempt.setdefault(int(e.get("attempt") or 0), []).append((e["t"] - t0, int(e["step"])))
    for attempt, points in sorted(by_attempt.items()):
        xs, ys = zip(*points, strict=True)
        ax2.plot(xs, ys, marker=".", markersize=3, linewidth=1, label=f"attempt {attempt}")
    ax2.set_xlabel("seconds since submit")
    ax2.set_ylabel("training step")
    if by_attempt:
        ax2.legend(loc="upper left", fontsize=7, ncol=1 + len(by_attempt) // 7)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
