"""Preemption -> first step, from the notice, split into the steps of a recovery (pure functions of the timeline).

The steps, each ending where the next begins, so that they add up to the whole:

  detect   the notice -> the create call of the next machine (the old trainer's save, the VM off, its event
           through the log router to respawn; a head start makes it short)
  queue    the create call -> the machine exists (CREATING): a queued resource's or flex-start's wait for capacity
  create   CREATING -> READY
  boot     READY -> its startup script runs (on a slice: on its last VM)
  install  -> Docker is installed (0 on a boot image that has it)
  pull     -> the trainer image is on the machine (the pull, or the refresh of an image it has; 0 when reused)
  start    -> the first training step of the new attempt (the container, the trainer's start, restore, compile)

A slice's VMs do each step in parallel: a step ends when its last VM has done it. A boundary never comes before
the one before it (a step that did not happen lasts 0). `first_step_s` is the notice -> the first step.

`gap_s` is the time no trainer of the job trained: the noticed attempt's last step -> the new attempt's first, and
`after_notice_s` how long the noticed attempt trained on after its notice (a Spot VM's longer metadata notice: the
job's preemption_notice, during which the next machine is already booting).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

PHASES = ("detect_s", "queue_s", "create_s", "boot_s", "install_s", "pull_s", "start_s")


def _attempt(e: dict[str, Any]) -> int:
    return int(e.get("attempt") or 0)


def _worker(e: dict[str, Any]) -> int:
    return int(e.get("worker") or 0)


def _last_per_worker(ends: dict[int, float], fallback: dict[int, float]) -> float | None:
    """The latest of each worker's end of a step, a worker without one ending it where it began (`fallback`)."""
    times = [ends.get(w, t) for w, t in fallback.items()]
    return max(times) if times else None


def split(events: list[dict[str, Any]], notice: dict[str, Any]) -> dict[str, Any] | None:
    """One recovery: the steps from `notice` to the first step of a later attempt; None when there was none."""
    events = sorted(events, key=lambda e: e["t"])
    tn = float(notice["t"])
    old = next((_attempt(e) for e in events if e["kind"] == "trainer_start" and e["machine"] == notice["machine"]), 0)
    first = next((e for e in events if e["kind"] == "step" and e["t"] >= tn and _attempt(e) > old), None)
    if first is None:
        return None
    new = first["machine"]
    mine = [e for e in events if e.get("machine") == new]
    call = next((e["t"] for e in events if e["kind"] == "create_call" and e["t"] >= tn), None)
    creating = next((e["t"] for e in mine if e["kind"] == "state" and e["state"] == "CREATING"), None)
    ready = next((e["t"] for e in mine if e["kind"] == "state" and e["state"] == "READY"), None)
    scripts = {_worker(e): e["t"] for e in mine if e["kind"] == "trainer_start"}
    installed = {_worker(e): e["t"] for e in mine if e["kind"] == "machine_step" and e["step"] == "install"}
    docker = {w: installed.get(w, t) for w, t in scripts.items()}
    pulled = {_worker(e): e["t"] for e in mine if e["kind"] == "machine_step" and e["step"] == "pull"}
    boundaries = [
        call,
        creating,
        ready,
        max(scripts.values()) if scripts else None,
        _last_per_worker(installed, scripts),
        _last_per_worker(pulled, docker),
        float(first["t"]),
    ]
    times = [tn]
    for b in boundaries:  # monotone: a missing or earlier boundary is where the one before it was
        times.append(min(times[-1] if b is None else max(b, times[-1]), float(first["t"])))
    steps = {name: round(times[i + 1] - times[i], 3) for i, name in enumerate(PHASES)}
    trained = [float(e["t"]) for e in events if e["kind"] == "step" and _attempt(e) == old and e["t"] <= first["t"]]
    last = max(trained, default=tn)
    return {
        "machine": notice["machine"],
        "next": new,
        "first_step_s": round(first["t"] - tn, 3),
        **steps,
        "gap_s": round(float(first["t"]) - last, 3),
        "after_notice_s": round(max(0.0, last - tn), 3),
    }


def recoveries(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per notice that a later attempt's first step followed (split)."""
    rows = (split(events, n) for n in events if n["kind"] == "notice")
    return [r for r in rows if r is not None]


def percentile(values: Iterable[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100), as the run report's; None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    return round(ordered[max(1, min(len(ordered), math.ceil(q / 100 * len(ordered)))) - 1], 3)


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """p50 and p95 of the notice -> first step, each step's p50, and the p50 of the gap and of the training after
    the notice."""
    return {
        "first_step_p50_s": percentile((r["first_step_s"] for r in rows), 50),
        "first_step_p95_s": percentile((r["first_step_s"] for r in rows), 95),
        "split_p50_s": {k: percentile((r[k] for r in rows), 50) for k in PHASES},
        "gap_p50_s": percentile((r["gap_s"] for r in rows), 50),
        "after_notice_p50_s": percentile((r["after_notice_s"] for r in rows), 50),
    }


def goodput_at(mtbi_s: float, gap_s: float, boot_to_step_s: float, lost_s: float, after_notice_s: float = 0.0) -> float:
    """Goodput at a mean time between interruptions of `mtbi_s` (a machine's READY -> its notice), from one
    recovery's figures: `gap_s` the noticed trainer's last step -> the next trainer's first, `boot_to_step_s` the
    next machine's READY -> first step (part of its lifetime, not training), `lost_s` the work trained again per
    preemption and `after_notice_s` the training the noticed machine still did after its notice.

    A cycle is one machine's training, mtbi - boot_to_step + after_notice, and the gap before the next, of which
    all but the lost work counts. What periodic checkpoints cost a running trainer is left out: that is the job's
    own interval, not its recoveries'."""
    training = mtbi_s - boot_to_step_s + after_notice_s
    if training <= 0:
        return 0.0
    return round(max(0.0, training - lost_s) / (training + gap_s), 4)


def programs_written(cache: Path, since: float, processes: int) -> dict[str, int]:
    """Per trainer process of a run (`p0` .. `pN-1`): the compiled programs it stored in the compilation cache
    after `since` (seconds since the epoch), in any of the cache's directories (one per device shape and JAX). A
    process stores a program only when it compiled it (trainer respawn_trainer/runtime.py, `compiled`): 0
    everywhere means every process read its programs from the cache."""
    counts = {f"p{i}": 0 for i in range(processes)}
    for name in counts:
        for directory in cache.glob(f"*/respawn-programs/{name}"):
            counts[name] += sum(1 for f in directory.iterdir() if f.is_file() and f.stat().st_mtime > since)
    return counts
