"""The outlook: where Spot lasts. A decayed preemption history per (zone, machine type, provisioning model) and a
zone ranking.

The history keeps, per key, machine-seconds and interruptions, both decayed exponentially with the time since they
were seen (half-life a parameter): interruption rates drift over days, so old evidence should fade. It is one small
JSON object, meant to live in the state bucket and be updated under compare-and-set, cheap to read on every create.

The expected time to interruption (MTBI) of a key is a Gamma-Poisson posterior mean: the key's own decayed counts on
top of a prior worth `prior_interruptions` interruptions at the pooled MTBI of its machine type and provisioning
model (all zones together), so a zone with no data sits at the pooled figure, neither best nor worst; with no data
at all the pooled figure is `prior_hours` per `prior_interruptions`.

`rank` orders zones by expected useful training per dollar: the useful fraction of a machine-hour from a Young/Daly
model (checkpoint every sqrt(2 * checkpoint_cost * MTBI); waste = checkpoint_cost / interval, plus per interruption
the restart cost and half an interval of lost work), over the price. A zone that just interrupted this job is
penalised by a factor that fades with a half-life (interruptions cluster: a zone that just preempted one machine
tends to preempt the next soon after), and one that just had no capacity for it more. Ties keep the given zone order.

`Outlook` is what decide reads: the history plus, for GPU machine types, what Google's Advice API said (an estimated
uptime that enters a zone's MTBI as extra prior evidence, a price that replaces the list price). Every figure in a
ranking's reason names its source.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from respawn.jobs import COUNTED_AS_PREEMPTION, Attempt, Job

HOUR = 3600.0
DAY = 24 * HOUR
# Where a price comes from when the Advice API gave none (respawn.prices' table).
LIST_PRICE = "list price 2025-06"
# How many interruptions' worth of evidence an Advice API uptime estimate counts for in a zone's MTBI.
ADVICE_WEIGHT = 1.0


@dataclass(frozen=True)
class Key:
    """What a preemption rate is kept for: Spot in us-central1-a is not Spot in us-central1-b, nor standard."""

    zone: str
    machine_type: str  # the machine's type_name: a TPU's accelerator type (`v6e-8`), a GPU's machine type
    provisioning: str

    def text(self) -> str:
        return f"{self.zone}|{self.machine_type}|{self.provisioning}"

    @staticmethod
    def parse(text: str) -> Key:
        parts = text.split("|")
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"history key {text!r}: expected ZONE|MACHINE_TYPE|PROVISIONING, all three non-empty")
        return Key(*parts)


@dataclass(frozen=True)
class Exposure:
    """Decayed machine-seconds and interruptions of one key, as of `at` (the time of the last observation)."""

    seconds: float
    interruptions: float
    at: float

    def decayed_to(self, now: float, half_life_s: float) -> Exposure:
        """The same evidence seen from `now`: both counts scaled by 0.5 ** (elapsed / half-life); never grows."""
        factor = 0.5 ** (max(0.0, now - self.at) / half_life_s)
        return Exposure(self.seconds * factor, self.interruptions * factor, max(now, self.at))


@dataclass(frozen=True)
class Observation:
    """What one ended attempt adds to the history: its machine time and whether it was interrupted. `id` (JOB/N)
    makes adding it idempotent: a history remembers the ids it has counted (History.seen)."""

    id: str
    key: Key
    seconds: float
    interruptions: int
    at: float  # when the attempt ended

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "key": self.key.text(),
            "seconds": self.seconds,
            "interruptions": self.interruptions,
            "at": self.at,
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Observation:
        return Observation(
            str(d["id"]), Key.parse(str(d["key"])), float(d["seconds"]), int(d["interruptions"]), float(d["at"])
        )


SEEN_MAX = 1024  # observation ids a history remembers: far more than can wait in the records at once


@dataclass(frozen=True)
class History:
    """The preemption history of a deployment: per key, its decayed exposure, and the parameters that read it."""

    exposures: Mapping[Key, Exposure] = field(default_factory=dict)
    half_life_s: float = 3 * DAY
    prior_interruptions: float = 1.0
    prior_hours: float = 24.0
    seen: tuple[str, ...] = ()  # the newest SEEN_MAX observation ids counted, newest last

    def __post_init__(self) -> None:
        for name in ("half_life_s", "prior_interruptions", "prior_hours"):
            if not getattr(self, name) > 0:
                raise ValueError(f"history {name}: {getattr(self, name)!r} must be a positive number")

    def observe(self, key: Key, now: float, *, seconds: float, interruptions: int = 0) -> History:
        """A new history with `seconds` more machine time and `interruptions` more interruptions of `key` at `now`."""
        if seconds < 0 or interruptions < 0:
            raise ValueError(f"observation of {key.text()}: seconds and interruptions must be >= 0")
        old = self.exposures.get(key, Exposure(0.0, 0.0, now)).decayed_to(now, self.half_life_s)
        late = Exposure(float(seconds), float(interruptions), now).decayed_to(old.at, self.half_life_s)
        new = Exposure(old.seconds + late.seconds, old.interruptions + late.interruptions, old.at)
        return replace(self, exposures={**self.exposures, key: new})

    def record(self, observations: Sequence[Observation]) -> History:
        """The history with each observation not counted yet: a duplicate (its id seen) changes nothing, and evidence
        older than the key's newest is decayed to it, so any order of the same observations gives the same counts."""
        history, seen = self, list(self.seen)
        for observation in observations:
            if observation.id in seen:
                continue
            history = history.observe(
                observation.key,
                observation.at,
                seconds=observation.seconds,
                interruptions=observation.interruptions,
            )
            seen.append(observation.id)
        return history if history is self else replace(history, seen=tuple(seen[-SEEN_MAX:]))

    def exposure(self, key: Key, now: float) -> Exposure:
        """The key's evidence as of `now` (zero when never observed)."""
        seen = self.exposures.get(key)
        return Exposure(0.0, 0.0, now) if seen is None else seen.decayed_to(now, self.half_life_s)

    def pooled_mtbi_s(self, machine_type: str, provisioning: str, now: float) -> float:
        """The MTBI of every zone of this machine type and provisioning model together, on the fixed prior."""
        seconds, interruptions = self.prior_hours * HOUR, self.prior_interruptions
        for key in self.exposures:
            if key.machine_type == machine_type and key.provisioning == provisioning:
                seen = self.exposure(key, now)
                seconds, interruptions = seconds + seen.seconds, interruptions + seen.interruptions
        return seconds / interruptions

    def mtbi_s(self, key: Key, now: float) -> float:
        """Expected seconds to the next interruption in `key`: its own evidence on the pooled prior."""
        pooled = self.pooled_mtbi_s(key.machine_type, key.provisioning, now)
        seen = self.exposure(key, now)
        return (self.prior_interruptions * pooled + seen.seconds) / (self.prior_interruptions + seen.interruptions)

    def to_json(self) -> dict[str, Any]:
        return {
            "half_life_s": self.half_life_s,
            "prior_interruptions": self.prior_interruptions,
            "prior_hours": self.prior_hours,
            "seen": list(self.seen),
            "exposures": {
                key.text(): {"seconds": e.seconds, "interruptions": e.interruptions, "at": e.at}
                for key, e in sorted(self.exposures.items(), key=lambda item: item[0].text())
            },
        }

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> History:
        exposures = {
            Key.parse(text): Exposure(float(e["seconds"]), float(e["interruptions"]), float(e["at"]))
            for text, e in dict(d.get("exposures", {})).items()
        }
        return History(
            exposures=exposures,
            half_life_s=float(d.get("half_life_s", 3 * DAY)),
            prior_interruptions=float(d.get("prior_interruptions", 1.0)),
            prior_hours=float(d.get("prior_hours", 24.0)),
            seen=tuple(str(i) for i in d.get("seen", ())),
        )


def useful_fraction(mtbi_s: float, checkpoint_cost_s: float, restart_cost_s: float) -> float:
    """The share of machine time that becomes kept training, first order (Young 1974, Daly 2006): checkpoint every
    tau = sqrt(2 * C * M); waste = C / tau for saving, plus (R + tau / 2) / M for each interruption's restart and
    lost work. Clamped to [0, 1]."""
    tau = math.sqrt(2 * checkpoint_cost_s * mtbi_s) if checkpoint_cost_s > 0 else 0.0
    saving = checkpoint_cost_s / tau if tau > 0 else 0.0
    return min(1.0, max(0.0, 1.0 - saving - (restart_cost_s + tau / 2) / mtbi_s))


@dataclass(frozen=True)
class ZoneAdvice:
    """What Google's Advice API said of one zone for one machine type and provisioning model."""

    estimated_uptime_s: float | None = None  # expected seconds a Spot VM runs before it is preempted
    obtainability: float | None = None  # 0..1: how likely a create gets a machine now
    price_per_hour: float | None = None  # newest price of the capacity history, where it answers


@dataclass(frozen=True)
class Advice:
    """What the Advice API said for one (machine type, provisioning model), or why it said nothing (`note`)."""

    zones: Mapping[str, ZoneAdvice]
    fetched_at: float
    note: str | None = None  # e.g. "Advice API does not cover TPUs; history only"


@dataclass(frozen=True)
class Placed:
    """One zone in a ranking, with its score (useful hours per dollar after the penalty), its figures and why."""

    zone: str
    score: float
    reason: str
    mtbi_s: float = 0.0
    useful: float = 0.0
    price_per_hour: float = 0.0


@dataclass(frozen=True)
class Ranking:
    placed: tuple[Placed, ...]
    note: str | None = None  # what the ranking lacked (advice unavailable, history unreadable), said once

    @property
    def zones(self) -> tuple[str, ...]:
        return tuple(p.zone for p in self.placed)


@dataclass(frozen=True)
class Outlook:
    """History + advice + prices: everything decide reads to rank zones. Pure data, built by the service."""

    history: History = field(default_factory=History)
    advice: Mapping[tuple[str, str], Advice] = field(default_factory=dict)  # (machine_type, provisioning) -> Advice
    note: str | None = None  # why the history is missing (e.g. the store could not be read)
    checkpoint_cost_s: float = 30.0  # seconds one checkpoint save costs, for the Young/Daly useful fraction
    penalty: float = 0.8  # how much a zone that just interrupted the job loses, fading with penalty_half_life_s
    # ... and a zone that just had no capacity for the job: more, as it gave nothing at all, fading alike
    refusal_penalty: float = 1.0
    penalty_half_life_s: float = HOUR

    def _zone_advice(self, zone: str, machine_type: str, provisioning: str) -> ZoneAdvice | None:
        advice = self.advice.get((machine_type, provisioning))
        return advice.zones.get(zone) if advice is not None else None

    def advised_price(self, zone: str, machine_type: str, provisioning: str) -> tuple[float, float] | None:
        """The Advice API's price per hour for the zone's machine and when it was read; None where it gave none."""
        advice = self.advice.get((machine_type, provisioning))
        said = advice.zones.get(zone) if advice is not None else None
        if advice is None or said is None or said.price_per_hour is None or not said.price_per_hour > 0:
            return None
        return said.price_per_hour, advice.fetched_at

    def mtbi_s(self, zone: str, machine_type: str, provisioning: str, now: float) -> float:
        """Expected seconds to the next interruption: the history's posterior, with an Advice API uptime estimate
        added as ADVICE_WEIGHT interruptions' worth of prior evidence at that uptime."""
        key = Key(zone, machine_type, provisioning)
        history = self.history
        seen = history.exposure(key, now)
        seconds = history.prior_interruptions * history.pooled_mtbi_s(machine_type, provisioning, now) + seen.seconds
        interruptions = history.prior_interruptions + seen.interruptions
        said = self._zone_advice(zone, machine_type, provisioning)
        if said is not None and said.estimated_uptime_s is not None and said.estimated_uptime_s > 0:
            seconds, interruptions = seconds + ADVICE_WEIGHT * said.estimated_uptime_s, interruptions + ADVICE_WEIGHT
        return seconds / interruptions

    def rank(
        self,
        zones: Sequence[str],
        now: float,
        *,
        machine_type: str,
        provisioning: str,
        list_price_per_hour: float | Mapping[str, float] | None,
        restart_cost_s: float,
        just_interrupted: Mapping[str, float] | None = None,
        just_refused: Mapping[str, float] | None = None,
    ) -> Ranking:
        """`zones` best first by expected useful training per dollar; `just_interrupted` maps a zone to when it
        last interrupted this job, which scales its score by 1 - penalty * 0.5 ** (age / penalty_half_life_s);
        `just_refused` when it last had no capacity for it, likewise with refusal_penalty.
        An Advice API price replaces the list price; without either every zone costs the same (ranked by useful
        fraction alone). Equal scores keep the order of `zones`. Each reason names its figures' sources."""
        for name in ("penalty", "refusal_penalty"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"placement {name}: {getattr(self, name)!r} must be between 0 and 1")
        recent, refused = just_interrupted or {}, just_refused or {}
        advice = self.advice.get((machine_type, provisioning))
        placed = []
        for zone in zones:
            said = advice.zones.get(zone) if advice is not None else None
            listed = list_price_per_hour.get(zone) if isinstance(list_price_per_hour, Mapping) else list_price_per_hour
            if said is not None and said.price_per_hour is not None and said.price_per_hour > 0:
                price, price_source = said.price_per_hour, "advice"
            elif listed is not None:
                price, price_source = listed, LIST_PRICE
            else:
                price, price_source = 1.0, "no price"
            if not price > 0:
                raise ValueError(f"placement price_per_hour of {zone}: {price!r} must be a positive number")
            key = Key(zone, machine_type, provisioning)
            mtbi, seen = self.mtbi_s(zone, machine_type, provisioning, now), self.history.exposure(key, now)
            useful = useful_fraction(mtbi, self.checkpoint_cost_s, restart_cost_s)
            uptime = said.estimated_uptime_s if said is not None else None
            sources = "history" + (f" + advice uptime {uptime / HOUR:.1f}h" if uptime else "")
            reason = (
                f"{zone}: MTBI {mtbi / HOUR:.1f}h ({sources}: {seen.interruptions:.1f} interruptions in "
                f"{seen.seconds / HOUR:.1f} machine-hours, decayed), useful {useful:.0%}"
            )
            reason += f" at ${price:.2f}/h ({price_source})" if price_source != "no price" else " (no price known)"
            if said is not None and said.obtainability is not None:
                reason += f", obtainability {said.obtainability:.2f} (advice)"
            factor = 1.0
            for seen_at, penalty, what in (
                (recent, self.penalty, "interrupted"),
                (refused, self.refusal_penalty, "had no capacity for"),
            ):
                if zone in seen_at:
                    age = max(0.0, now - seen_at[zone])
                    scaled = 1.0 - penalty * 0.5 ** (age / self.penalty_half_life_s)
                    factor *= scaled
                    reason += f"; {what} this job {age / 60:.0f} min ago (x{scaled:.2f})"
            score = useful / price * factor
            placed.append(Placed(zone, score, f"{reason} -> {score:.3f} useful h/$", mtbi, useful, price))
        order = sorted(range(len(placed)), key=lambda i: (-placed[i].score, i))
        notes = [n for n in (self.note, advice.note if advice is not None else None) if n]
        return Ranking(tuple(placed[i] for i in order), "; ".join(notes) or None)


def rank(
    zones: Sequence[str],
    history: History,
    now: float,
    *,
    machine_type: str,
    provisioning: str,
    price_per_hour: float | Mapping[str, float],
    restart_cost_s: float,
    checkpoint_cost_s: float = 30.0,
    just_interrupted: Mapping[str, float] | None = None,
    penalty: float = 0.8,
    penalty_half_life_s: float = HOUR,
) -> Ranking:
    """The ranking of `zones` on `history` alone (Outlook.rank without advice)."""
    outlook = Outlook(
        history, checkpoint_cost_s=checkpoint_cost_s, penalty=penalty, penalty_half_life_s=penalty_half_life_s
    )
    return outlook.rank(
        zones,
        now,
        machine_type=machine_type,
        provisioning=provisioning,
        list_price_per_hour=price_per_hour,
        restart_cost_s=restart_cost_s,
        just_interrupted=just_interrupted,
    )


def observation(job: Job, ended: Attempt) -> Observation | None:
    """The evidence of an ended attempt: its trainer's running time and whether the cloud took the machine. An
    attempt that never ran and was not taken (a stockout, a create error) says nothing of how long machines last."""
    interrupted = ended.end_reason in COUNTED_AS_PREEMPTION
    if job.spec is None or ended.ended_at is None or (ended.started_at is None and not interrupted):
        return None
    key = Key(ended.zone, job.spec.machine_of(ended.tier).type_name, job.spec.all_tiers[ended.tier].provisioning)
    seconds = max(0.0, ended.ended_at - ended.started_at) if ended.started_at is not None else 0.0
    return Observation(f"{job.job_id}/{ended.n}", key, seconds, int(interrupted), ended.ended_at)


def with_observations(old: Job, new: Job) -> Job:
    """`new` with the evidence of each attempt this decision ended, for the preemption history (Job.observations:
    intent, carried out under the lease like the machine actions)."""
    before = {a.n: a.ended for a in old.attempts}
    ended = [a for a in new.attempts if a.ended and not before.get(a.n, False)]
    observations = [o.to_dict() for o in (observation(new, a) for a in ended) if o is not None]
    return replace(new, observations=(*new.observations, *observations)) if observations else new
