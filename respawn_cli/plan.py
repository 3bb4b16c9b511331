"""`respawn plan JOB_FILE`: before anything is spent, each tier and zone of a job as respawn would place it.

For every allowed (tier, zone): the expected time to interruption (MTBI) and where it comes from (the deployment's
history, Google's Advice API uptime estimate, or the prior when neither has seen the zone), the goodput it allows
(placement.useful_fraction: the share of machine time that becomes kept training, Young/Daly), the price of one
machine-hour and its source (prices.Priced), the cost of one productive hour (price / goodput), the Advice API's
obtainability where it answered, and the order respawn would try the zones in (Outlook.rank, as decide ranks them;
the list's order with `placement: ordered`). Pure: the CLI reads the history and asks the Advice API (main.py).

A job of K slices (docs/several-slices.md) is preempted K times as often as one slice, at the zone's MTBI / K. Each
zone then also shows what the K slices cost an hour and the goodput of the two ways to recover, on the same
Young/Daly model: re-forming in place (each preemption costs the survivors REFORM_S twice, when the slice leaves and
when its replacement joins, and the world trains without the slice's share, 1/K, while the replacement comes: the
restart cost / K), and recreating the whole job (each preemption costs every slice the restart cost).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from respawn.jobs import JobSpec, TpuMachine, machine_to_dict
from respawn.outlook import HOUR, Key, Outlook, useful_fraction
from respawn.prices import Priced, machine_price, priced, rate_per_h


@dataclass(frozen=True)
class ZonePlan:
    zone: str
    mtbi_s: float
    mtbi_source: str  # "history", "history + advice", "prior + advice", "pooled history", "prior (no history)"
    goodput: float  # useful fraction of machine time
    price: Priced | None  # None: no price known for the machine
    obtainability: float | None  # the Advice API's, when it answered
    reason: str  # the ranking's one line (decide's wording)
    world: WorldPlan | None = None  # a job of several slices

    @property
    def cost_per_productive_hour(self) -> float | None:
        if self.price is None or self.goodput <= 0:
            return None
        return self.price.rate_per_h / self.goodput


# One save, JAX's runtime started again in the trainer's own process and one restore, on machines that run already:
# what a world's re-forming costs its survivors, per change (bench_worlds.py: 0.9-1.1 min when a slice leaves,
# 1.5-1.9 min when its replacement joins, the replacement restoring from the bucket)
REFORM_S = 60.0


@dataclass(frozen=True)
class WorldPlan:
    """A zone's figures for a job of `slices` slices: their price an hour and each way's goodput."""

    slices: int
    price_per_hour: float | None
    goodput_reformed: float  # re-forming in place
    goodput_recreated: float  # recreating every slice

    @staticmethod
    def of(slices: int, mtbi_s: float, price: Priced | None, checkpoint_s: float, restart_s: float) -> WorldPlan:
        every = mtbi_s / slices  # a preemption of any of the slices
        return WorldPlan(
            slices,
            None if price is None else price.rate_per_h * slices,
            useful_fraction(every, checkpoint_s, 2 * REFORM_S + restart_s / slices),
            useful_fraction(every, checkpoint_s, restart_s),
        )


@dataclass(frozen=True)
class TierPlan:
    tier: int
    provisioning: str
    placement: str  # ranked | ordered
    zones: tuple[ZonePlan, ...]  # in the order respawn would try them
    note: str | None  # what the tier's figures lacked (advice unavailable, not asked, ...)
    machine: str | None = None  # the tier's own machine (describe_machine), None: the job's


@dataclass(frozen=True)
class Plan:
    job_id: str
    machine: str  # "gpu a2-highgpu-1g (1 x nvidia-tesla-a100)"
    machine_type: str  # the history key's machine type
    history: str  # where the history came from, or why it is empty
    tiers: tuple[TierPlan, ...]


def describe_machine(spec: JobSpec) -> str:
    machine = spec.machine
    if isinstance(machine, TpuMachine):
        return f"tpu {machine.accelerator_type} (api {machine.api})"
    vms = f", {machine.vms} VMs" if machine.vms > 1 else ""
    return f"gpu {machine.machine_type} ({machine.accelerator_count} x {machine.accelerator_type}{vms})"


def build(spec: JobSpec, outlook: Outlook, now: float, *, history: str, restart_cost_s: float) -> Plan:
    """The plan of `spec` on `outlook`, its figures as of `now`; `history` says where the outlook's history came
    from. The restart cost is decide's (Policy.restart_cost_s), so the order is the one decide would use."""
    tiers = []
    for index, tier in enumerate(spec.all_tiers):
        on_tier = spec.on_tier(index)  # a tier may name its own machine: its history, advice and price are that one's
        kind, table_price = on_tier.machine.type_name, machine_price(machine_to_dict(on_tier.machine))
        ranking = outlook.rank(
            tier.zones,
            now,
            machine_type=kind,
            provisioning=tier.provisioning,
            list_price_per_hour=rate_per_h(tier.provisioning, table_price),
            restart_cost_s=restart_cost_s,
        )
        advice = outlook.advice.get((kind, tier.provisioning))
        placed = {p.zone: p for p in ranking.placed}
        order = ranking.zones if spec.placement == "ranked" else tier.zones
        zones = []
        for zone in order:
            p = placed[zone]
            said = advice.zones.get(zone) if advice is not None else None
            advised = said is not None and bool(said.estimated_uptime_s)
            price = priced(
                tier.provisioning,
                table_price,
                said.price_per_hour if said is not None else None,
                advice.fetched_at if advice is not None else 0.0,
            )
            source = _mtbi_source(outlook, Key(zone, kind, tier.provisioning), now, advised)
            obtainability = said.obtainability if said is not None else None
            k = spec.machine.slices
            world = WorldPlan.of(k, p.mtbi_s, price, outlook.checkpoint_cost_s, restart_cost_s) if k > 1 else None
            zones.append(ZonePlan(zone, p.mtbi_s, source, p.useful, price, obtainability, p.reason, world))
        note = advice.note if advice is not None else None
        own = describe_machine(on_tier) if tier.machine is not None else None
        tiers.append(TierPlan(index, tier.provisioning, spec.placement, tuple(zones), note, own))
    return Plan(spec.job_id, describe_machine(spec), spec.machine.type_name, history, tuple(tiers))


def _mtbi_source(outlook: Outlook, key: Key, now: float, advised: bool) -> str:
    history = outlook.history
    if history.exposure(key, now).seconds > 0:
        return "history + advice" if advised else "history"
    pooled = any(
        k.machine_type == key.machine_type and k.provisioning == key.provisioning and k != key
        for k in history.exposures
    )
    base = "pooled history" if pooled else "prior"
    return f"{base} + advice" if advised else (base if pooled else "prior (no history)")


def to_json(plan: Plan) -> dict[str, Any]:
    return {
        "job_id": plan.job_id,
        "machine": plan.machine,
        "machine_type": plan.machine_type,
        "history": plan.history,
        "tiers": [
            {
                "tier": t.tier,
                "provisioning": t.provisioning,
                "placement": t.placement,
                "machine": t.machine,
                "order": [z.zone for z in t.zones],
                "note": t.note,
                "zones": [
                    {
                        "zone": z.zone,
                        "mtbi_s": round(z.mtbi_s, 1),
                        "mtbi_source": z.mtbi_source,
                        "goodput": round(z.goodput, 4),
                        "price_per_hour": None if z.price is None else z.price.rate_per_h,
                        "price_source": None if z.price is None else z.price.source,
                        "cost_per_productive_hour": _round(z.cost_per_productive_hour),
                        "obtainability": z.obtainability,
                        "reason": z.reason,
                        **({"slices": _world_json(z.world)} if z.world is not None else {}),
                    }
                    for z in t.zones
                ],
            }
            for t in plan.tiers
        ],
    }


def _world_json(w: WorldPlan) -> dict[str, Any]:
    return {
        "slices": w.slices,
        "price_per_hour": _round(w.price_per_hour),
        "goodput_reformed": round(w.goodput_reformed, 4),
        "goodput_recreated": round(w.goodput_recreated, 4),
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def text(plan: Plan, table: Any) -> str:
    """The plan as the CLI prints it; `table(headers, rows)` is the CLI's table layout."""
    lines = [f"job      {plan.job_id}: {plan.machine}", f"history  {plan.history}"]
    for t in plan.tiers:
        how = "ranked by expected useful hours per dollar" if t.placement == "ranked" else "in list order (ordered)"
        on = f" on {t.machine}" if t.machine else ""
        lines += ["", f"tier {t.tier}: {t.provisioning}{on}, zones {how}: {', '.join(z.zone for z in t.zones)}"]
        if t.note:
            lines.append(f"  note: {t.note}")
        rows = [
            (
                n,
                z.zone,
                f"{z.mtbi_s / HOUR:.1f}h",
                z.mtbi_source,
                f"{z.goodput:.1%}",
                "-" if z.obtainability is None else f"{z.obtainability:.2f}",
                "-" if z.price is None else f"${z.price.rate_per_h:.2f}/h",
                "-" if z.cost_per_productive_hour is None else f"${z.cost_per_productive_hour:.2f}",
                "no price known" if z.price is None else z.price.source,
            )
            for n, z in enumerate(t.zones, 1)
        ]
        headers = ("#", "zone", "MTBI", "MTBI from", "goodput", "obtainability", "price", "per productive h",
                   "price from")  # fmt: skip
        lines += ["  " + line for line in table(headers, rows).splitlines()]
        lines += _world_lines(t)
    return "\n".join(lines)


def _world_lines(t: TierPlan) -> list[str]:
    """Per zone, what the job's K slices cost an hour and earn re-formed in place against recreated whole."""
    lines = []
    for z in t.zones:
        w = z.world
        if w is None:
            continue
        price = "-" if w.price_per_hour is None else f"${w.price_per_hour:.2f}/h"
        lines.append(
            f"  {z.zone}: {w.slices} slices {price}, a preemption every {z.mtbi_s / w.slices / HOUR:.1f}h; goodput "
            f"{w.goodput_reformed:.1%} re-formed in place, {w.goodput_recreated:.1%} recreated whole"
        )
    return lines
