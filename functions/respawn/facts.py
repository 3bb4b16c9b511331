"""Facts for Cloud Monitoring: one structured log line per thing that happened to a job, written once.

The log-based metrics (`respawn_ops/log_metrics.json`, deployed by infra/terraform/monitoring.tf) count these lines.
A fact is what changed between the record a handler read and the record it wrote, and it is logged only by the
handler whose compare-and-set wrote it: a duplicate, late or redelivered event changes nothing (decide has it
recorded already), so it writes nothing and logs nothing. A crash between the write and the log line loses that
line (the metrics undercount; the record, and `respawn status`, stay right); nothing is ever counted twice.

  job_status      a status change: old_status, status (jobs by status; FAILED and EXPIRED alert)
  attempt_ended   an attempt ended: zone, machine, provisioning, end (preempted and lost are preemptions, failed
                  and hung failures, capacity/queued/stuck stockouts), machine_hours, cost_usd at the price it ran
                  at, on_demand_usd at on-demand
  attempt_started an attempt's trainer reported `started`: wait_s, its request to the trainer's process start
                  (the queue, machine creation, boot, image pull)
  recovered       the first attempt to start after a preemption (or its notice, with a head start): recovery_s,
                  from the moment the control plane ended the preempted attempt to the new trainer's `started`
                  entry (restored, about to take its first step)
  job_ended       the job reached a terminal status: goodput, badput_s and the seconds per category, machine_hours,
                  cost_usd and on_demand_usd for the whole job (respawn/accounting.py)
  job_waiting     written by each sweep tick for every live job (a gauge, not a count: a repeated tick repeats it,
                  and the alert reads its maximum): status and progress_s, the time since the newest sign of
                  training (a `started`, `progress` or `checkpoint` entry; the submit when none): a job stuck queued
                  and a job whose trainer stopped making progress both grow it

Each line carries job_id, and machine and provisioning where the job has a spec.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from respawn.accounting import job_accounting, machine_seconds, trainer_start
from respawn.jobs import COUNTED_AS_PREEMPTION, NO_CAPACITY, Attempt, Job, Status
from respawn.prices import MachinePrice, machine_price, rate_per_h

log = logging.getLogger("respawn.facts")  # beside respawn.service: the same handler, its own lines

LIVE = frozenset({Status.PENDING, Status.PROVISIONING, Status.RUNNING, Status.RECOVERING})


def facts(old: Job | None, new: Job, now: float) -> list[dict[str, Any]]:
    """The facts of the change `old` -> `new`, written at `now` (pure)."""
    found: list[dict[str, Any]] = []
    if old is None or old.status is not new.status:
        found.append(_fact("job_status", new, old_status=old.status.value if old else None, status=new.status.value))
    before = {a.n: a for a in old.attempts} if old is not None else {}
    for a in new.attempts:
        was = before.get(a.n)
        if a.ended and (was is None or not was.ended):
            found.append(_attempt_ended(new, a, now))
        if a.started_at is not None and (was is None or was.started_at is None):
            found.append(_fact("attempt_started", new, a, wait_s=_round(_wait_s(a))))
            recovered = recoveries(new.attempts).get(a.n)
            if recovered is not None:
                found.append(_fact("recovered", new, a, recovery_s=recovered))
    if new.status.terminal and (old is None or not old.status.terminal):
        found.append(_job_ended(new, now))
    return found


def waiting(job: Job, now: float) -> dict[str, Any] | None:
    """The sweep's gauge of a live job (None for one that is over)."""
    if job.status not in LIVE:
        return None
    signs = (t for a in job.attempts for t in (a.started_at, a.progress_at, a.checkpoint_at) if t is not None)
    newest = max(signs, default=job.submitted_at)
    return _fact("job_waiting", job, job.current, status=job.status.value, progress_s=_round(max(0.0, now - newest)))


def log_facts(old: Job | None, new: Job, now: float) -> None:
    """Log the facts of a change this handler's compare-and-set just wrote."""
    write(facts(old, new, now))


def log_waiting(jobs: Iterable[Job | None], now: float) -> None:
    """The sweep's gauges of the live jobs it read."""
    write(w for job in jobs if job is not None and (w := waiting(job, now)) is not None)


def write(lines: Iterable[dict[str, Any]]) -> None:
    for line in lines:
        message = f"{line['fact']} {line['job_id']}"
        log.info(json.dumps({"severity": "INFO", "message": message, **line}))


# -- the parts ---------------------------------------------------------------------------------------------------


def _fact(kind: str, job: Job, attempt: Attempt | None = None, **fields: Any) -> dict[str, Any]:
    line: dict[str, Any] = {"fact": kind, "job_id": job.job_id}
    if job.spec is not None:
        tiers = job.spec.all_tiers
        tier = attempt.tier if attempt is not None and attempt.tier < len(tiers) else 0
        line["machine"] = job.spec.machine_of(tier).type_name
        line["provisioning"] = tiers[tier].provisioning
    if attempt is not None:
        line.update(attempt=attempt.n, zone=attempt.zone)
    line.update(fields)
    return line


def _price(job: Job) -> MachinePrice | None:
    if job.spec is None:
        return None
    from respawn.spec import spec_to_message

    return machine_price(spec_to_message(job.spec)["machine"])


def _attempt_ended(job: Job, a: Attempt, now: float) -> dict[str, Any]:
    hours = machine_seconds(a, now) / 3600
    line = _fact("attempt_ended", job, a, end=str(a.end_reason or ""), machine_hours=round(hours, 6))
    price = _price(job)
    rate = float(a.price["per_h"]) if a.price is not None else rate_per_h(line.get("provisioning", "spot"), price)
    if rate is not None:
        line["cost_usd"] = round(hours * rate, 6)
    if price is not None:
        line["on_demand_usd"] = round(hours * price.on_demand_per_h, 6)
    line["preemption"] = a.end_reason in COUNTED_AS_PREEMPTION
    line["stockout"] = a.end_reason in NO_CAPACITY
    return line


def _job_ended(job: Job, now: float) -> dict[str, Any]:
    books = job_accounting(job, now)
    seconds = books["seconds"]
    tiers = [t["cost_usd"] for t in books["tiers"]]
    line = _fact(
        "job_ended",
        job,
        status=job.status.value,
        goodput=books["goodput"],
        wall_s=books["wall_s"],
        badput_s=round(books["wall_s"] - seconds["productive_s"], 3),
        seconds=seconds,
        machine_hours=books["machine_hours"],
    )
    if tiers and all(c is not None for c in tiers):
        line["cost_usd"] = round(sum(tiers), 6)
    if books["cost"]:
        line["on_demand_usd"] = books["cost"]["on_demand_usd"]
    return line


def _wait_s(a: Attempt) -> float:
    start = trainer_start(a)
    return 0.0 if start is None else max(0.0, start - a.requested_at)


def recoveries(attempts: Sequence[Attempt]) -> dict[int, float]:
    """Attempt -> its recovery_s, for every attempt that recovered from a preemption: what the `recovered` facts of
    the job's history said, once each (the local report shows them beside the metric's values)."""
    found = {}
    for a in attempts:
        since = _recovering_since(attempts, a) if a.started_at is not None else None
        if a.started_at is not None and since is not None:
            found[a.n] = _round(max(0.0, a.started_at - since))
    return found


def _recovering_since(attempts: Sequence[Attempt], started: Attempt) -> float | None:
    """When the preemption this attempt recovers from ended its predecessor: the newest earlier attempt whose trainer
    ran (attempts between that never started, stockouts, are part of the recovery); None when that one was not
    preempted (a failure, the first attempt)."""
    earlier = [a for a in attempts if a.n < started.n and a.started_at is not None]
    if not earlier or earlier[-1].end_reason not in COUNTED_AS_PREEMPTION:
        return None
    return earlier[-1].ended_at


def _round(v: float) -> float:
    return round(v, 3)
