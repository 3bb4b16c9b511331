"""Where a job's time and money went, from its record: goodput, badput by category, machine time and its cost.

The trainer ends every attempt with a split of its own wall time (the `goodput` of its `stopped`, `completed` or
`failed` entry, trainer/goodput.py); decide() keeps one per attempt in the job record. What no trainer reported
is filled in from the record's times. Categories, in seconds of the job's wall time (submit to the end):

  productive_s  training whose result is kept (by a checkpoint or by completion)
  startup_s     the trainer's process start to its first step: imports, initialisation, compilation
  restore_s     reading the checkpoint
  checkpoint_s  training blocked by saves
  input_s       training waiting for its data iterator (a trainer that times it: respawn_trainer's `Run.data`)
  wasted_s      steps trained after the last save of an attempt that failed (the trainer's own count)
  lost_s        an attempt that ended without its trainer's split (killed before it could report: a save cut
                short by the hard stop, a host error, a machine that vanished): from its last checkpoint entry
                (or its `started`) to its end. Those steps are trained again by the next attempt
  waiting_s     an attempt's request to its trainer's process start: the queue, machine creation, boot, image
                pull; the whole attempt when no trainer started (no capacity, stuck)
  idle_s        the rest: a capacity backoff with no request out, and the moments between a trainer's last entry
                and the control plane ending its attempt

goodput = productive_s / wall. Machine time runs from the trainer's process start to the attempt's end (the
record does not know when the machine came up, so boot is not priced). Pure functions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from respawn.jobs import Attempt, EndReason, Job, machine_to_dict
from respawn.prices import LIST_SOURCE, cost, machine_price, rate_per_h

TRAINER_KEYS = ("startup_s", "restore_s", "productive_s", "checkpoint_s", "input_s", "wasted_s", "total_s")
CATEGORIES = (
    "productive_s",
    "startup_s",
    "restore_s",
    "checkpoint_s",
    "input_s",
    "wasted_s",
    "lost_s",
    "waiting_s",
    "idle_s",
)
MAX_SECONDS = 1e8  # about three years: anything larger is not a duration a trainer measured


def parse_split(value: Any) -> dict[str, float] | None:
    """A trainer's `goodput` field -> {key: seconds} of the keys it has right, or None when it has none.

    Tolerant: a user's own trainer may send nothing, a partial split or garbage. A key whose value is not a
    finite number from 0 to MAX_SECONDS is dropped; a missing total_s is the sum of the rest."""
    if not isinstance(value, Mapping):
        return None
    split: dict[str, float] = {}
    for key in TRAINER_KEYS:
        v = value.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= MAX_SECONDS:
            split[key] = round(float(v), 3)
    if not split:
        return None
    split.setdefault("total_s", round(sum(split.values()), 3))
    return split


def later_split(new: Mapping[str, float], old: Mapping[str, float] | None) -> bool:
    """Whether `new` replaces `old` as an attempt's split: the one covering more of the trainer's time wins (a
    summary is sent once, at the end), so the kept split does not depend on delivery order or duplicates."""
    if old is None:
        return True
    return (new.get("total_s", 0.0), sorted(new.items())) > (old.get("total_s", 0.0), sorted(old.items()))


def sum_splits(splits: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """The trainer's categories summed over attempts (one split per attempt)."""
    total = dict.fromkeys(TRAINER_KEYS, 0.0)
    for split in splits:
        for key in TRAINER_KEYS:
            total[key] += float(split.get(key) or 0.0)
    return total


def trainer_start(a: Attempt) -> float | None:
    """When the attempt's trainer process started: its `started` entry less the startup it reported."""
    if a.started_at is None:
        return None
    return max(a.requested_at, a.started_at - (a.startup_s or 0.0))


def machine_seconds(a: Attempt, now: float) -> float:
    """The attempt's machine time: its trainer's process start to the attempt's end (or now)."""
    start = trainer_start(a)
    return 0.0 if start is None else max(0.0, (a.ended_at if a.ended_at is not None else now) - start)


def attempt_seconds(a: Attempt, now: float) -> dict[str, float]:
    """One attempt's seconds per category (idle_s is the job's, never an attempt's)."""
    end = a.ended_at if a.ended_at is not None else now
    out = dict.fromkeys(CATEGORIES, 0.0)
    start = trainer_start(a)
    out["waiting_s"] = max(0.0, (end if start is None else min(start, end)) - a.requested_at)
    if a.goodput:
        for key in TRAINER_KEYS[:-1]:
            out[key] = float(a.goodput.get(key, 0.0))
    elif a.started_at is not None and start is not None:
        out["startup_s"] = max(0.0, min(a.started_at, end) - start)
        ran = max(0.0, end - a.started_at)
        if a.ended_at is None or a.end_reason is EndReason.COMPLETED:
            out["productive_s"] = ran  # as the trainer counts it: unsaved steps are kept unless the attempt is lost
        else:
            kept = min(ran, max(0.0, (a.checkpoint_at or a.started_at) - a.started_at))
            out["productive_s"], out["lost_s"] = kept, ran - kept
    return out


def job_end(job: Job, now: float) -> float:
    """Now for a live job; for a terminal one, the end of its last attempt (its submission when it had none)."""
    if not job.status.terminal:
        return now
    return max((a.ended_at for a in job.attempts if a.ended_at is not None), default=job.submitted_at)


def _priced(
    attempts: list[Attempt], used: dict[int, float], rate: float | None, listed: str
) -> tuple[float | None, list[str]]:
    """The cost of the attempts' machine seconds `used`: each at its Advice API price where it was placed with one,
    else at the table's `rate` (from the row `listed` names); and the sources used. None when some hours have no
    price."""
    total, sources = 0.0, set()
    for a in attempts:
        if a.price is not None:
            total += used[a.n] / 3600 * float(a.price["per_h"])
            sources.add(str(a.price["source"]))
        elif rate is None:
            return None, []
        else:
            total += used[a.n] / 3600 * rate
            sources.add(listed)
    if not sources:  # no attempts in this tier
        return (None, []) if rate is None else (0.0, [listed])
    return round(total, 4), sorted(sources)


def job_accounting(job: Job, now: float) -> dict[str, Any]:
    """{wall_s, goodput, seconds: {category: s}, machine_hours, cost, tiers}: the job's goodput, badput and cost.

    `cost` prices all machine time at Spot and at on-demand (None when prices.py has no row for the machine);
    `tiers` prices each tier's machine time at its own rate (of its own machine, where it names one): an attempt
    placed with the Advice API's price of its zone (Attempt.price) at that price, the others at the dated table's;
    each tier says which sources it used."""
    end = job_end(job, now)
    wall = max(0.0, end - job.submitted_at)
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    for a in job.attempts:
        for key, value in attempt_seconds(a, end).items():
            seconds[key] += value
    seconds["idle_s"] = max(0.0, wall - sum(seconds.values()))
    used = {a.n: machine_seconds(a, end) for a in job.attempts}
    hours = sum(used.values()) / 3600
    price = None
    if job.spec is not None:
        from respawn.spec import spec_to_message

        price = machine_price(spec_to_message(job.spec)["machine"])
    tiers = []
    for i, tier in enumerate(job.spec.all_tiers if job.spec else ()):
        mine = [a for a in job.attempts if a.tier == i]
        own = machine_price(machine_to_dict(tier.machine)) if tier.machine is not None else price  # a tier's machine
        listed = own.source if own is not None else LIST_SOURCE
        cost_usd, sources = _priced(mine, used, rate_per_h(tier.provisioning, own), listed)
        tiers.append(
            {
                "tier": i,
                "provisioning": tier.provisioning,
                "machine_hours": round(sum(used[a.n] for a in mine) / 3600, 5),
                "cost_usd": cost_usd,
                "price_sources": sources,
            }
        )
    return {
        "wall_s": round(wall, 3),
        "goodput": round(seconds["productive_s"] / wall, 4) if wall else 0.0,
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "machine_hours": round(hours, 5),
        "cost": cost(hours, price),
        "tiers": tiers,
    }
