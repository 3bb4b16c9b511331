"""`respawn plan`'s figures (respawn_cli/plan.py) on a given outlook; prices with their source (respawn/prices.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from respawn.jobs import GpuMachine, JobSpec, Tier, TpuMachine
from respawn.outlook import HOUR, Advice, History, Key, Outlook, ZoneAdvice, useful_fraction
from respawn.prices import LIST_SOURCE, Priced, machine_price, priced
from respawn_cli import plan

NOW = 1_800_000_000.0  # 2027-01-15 UTC
A, B, C = "us-central1-a", "us-central1-b", "us-central1-c"
GPU = GpuMachine("a2-highgpu-1g", "nvidia-tesla-a100", 1)


def spec(machine: GpuMachine | TpuMachine = GPU, zones: tuple[str, ...] = (A, B, C)) -> JobSpec:
    tiers = (Tier("spot", zones, after_preemptions=2), Tier("standard", (A,)))
    return JobSpec("j", machine, zones, "img", "gs://bucket/j", tiers=tiers)


def test_sources_of_each_figure() -> None:
    history = History().observe(Key(A, "a2-highgpu-1g", "spot"), NOW, seconds=10 * HOUR, interruptions=5)
    advice = Advice({C: ZoneAdvice(estimated_uptime_s=8 * HOUR, obtainability=0.9, price_per_hour=3.5)}, NOW)
    outlook = Outlook(history, {("a2-highgpu-1g", "spot"): advice})
    built = plan.build(spec(), outlook, NOW, history="test", restart_cost_s=300)
    spot, standard = built.tiers
    by_zone = {z.zone: z for z in spot.zones}
    assert by_zone[A].mtbi_source == "history"
    assert by_zone[B].mtbi_source == "pooled history"
    assert by_zone[C].mtbi_source == "pooled history + advice"
    assert by_zone[C].price == Priced(3.5, "Advice API price history (2027-01-15)")
    assert by_zone[C].obtainability == 0.9
    listed = machine_price(dict(GPU.__dict__))
    assert listed is not None
    assert by_zone[A].price == Priced(listed.spot_per_h, listed.source) and by_zone[A].obtainability is None
    order = [z.zone for z in spot.zones]
    assert order.index(B) < order.index(A)  # five interruptions in ten hours: A has the worst MTBI
    for z in spot.zones:
        assert z.mtbi_s == outlook.mtbi_s(z.zone, "a2-highgpu-1g", "spot", NOW)
        assert z.cost_per_productive_hour is not None and z.price is not None
        assert abs(z.cost_per_productive_hour - z.price.rate_per_h / z.goodput) < 1e-9
    (only,) = standard.zones
    assert (only.mtbi_source, only.price) == ("prior (no history)", Priced(listed.on_demand_per_h, listed.source))
    json = plan.to_json(built)
    assert json["tiers"][0]["order"] == [z.zone for z in spot.zones]
    assert json["tiers"][0]["zones"][0]["price_source"] in (listed.source, "Advice API price history (2027-01-15)")


def test_a_machine_without_a_price_is_ranked_on_goodput_alone() -> None:
    unknown = GpuMachine("a9-megagpu-1g", "nvidia-future", 1)
    built = plan.build(spec(unknown), Outlook(), NOW, history="test", restart_cost_s=300)
    zone = built.tiers[0].zones[0]
    assert (zone.price, zone.cost_per_productive_hour) == (None, None)
    assert "no price known" in plan.text(built, lambda headers, rows: "\n".join(str(r) for r in rows))


def test_priced_prefers_the_advice_price() -> None:
    table = machine_price({"kind": "gpu", "accelerator_type": "nvidia-l4", "accelerator_count": 2})
    assert priced("spot", table) == Priced(0.44, LIST_SOURCE)
    assert priced("standard", table) == Priced(1.12, LIST_SOURCE)
    assert priced("spot", table, 0.61, NOW) == Priced(0.61, "Advice API price history (2027-01-15)")
    assert priced("spot", table, 0.0, NOW) == Priced(0.44, LIST_SOURCE)
    assert priced("spot", None) is None
    assert Priced(0.61, LIST_SOURCE).text() == "$0.61/h (list price table 2025-06)"


def test_a_gpu_machine_of_several_vms_costs_every_vms_gpus() -> None:
    one = machine_price({"kind": "gpu", "accelerator_type": "nvidia-h100-80gb", "accelerator_count": 8})
    two = machine_price({"kind": "gpu", "accelerator_type": "nvidia-h100-80gb", "accelerator_count": 8, "vms": 2})
    assert one is not None and two is not None and "(2 VMs)" in two.label
    assert (two.spot_per_h, two.on_demand_per_h) == pytest.approx((2 * one.spot_per_h, 2 * one.on_demand_per_h))


def test_a_tier_on_its_own_machine_is_planned_with_that_machines_history_and_price() -> None:
    h100 = GpuMachine("a3-highgpu-8g", "nvidia-h100-80gb", 8)
    tiers = (Tier("spot", (A, B), after_stockout_s=900), Tier("spot", (A, B), machine=GPU))
    job = JobSpec("j", h100, (A, B), "img", "gs://bucket/j", tiers=tiers)
    history = History().observe(Key(A, "a2-highgpu-1g", "spot"), NOW, seconds=10 * HOUR, interruptions=5)
    built = plan.build(job, Outlook(history, {}), NOW, history="test", restart_cost_s=300)
    first, second = built.tiers
    assert first.machine is None and second.machine == plan.describe_machine(replace(job, machine=GPU))
    assert {z.mtbi_source for z in first.zones} == {"prior (no history)"}  # no H100 history
    assert {z.zone: z.mtbi_source for z in second.zones}[A] == "history"  # the A100's own
    h100_price, a100_price = (machine_price(dict(m.__dict__)) for m in (h100, GPU))
    assert first.zones[0].price == priced("spot", h100_price) and second.zones[0].price == priced("spot", a100_price)
    assert "tier 1: spot on gpu a2-highgpu-1g" in plan.text(built, lambda headers, rows: "")


def test_placement_ordered_keeps_the_list() -> None:
    history = History().observe(Key(A, "a2-highgpu-1g", "spot"), NOW, seconds=HOUR, interruptions=9)
    ordered = replace(spec(), placement="ordered")
    built = plan.build(ordered, Outlook(history), NOW, history="test", restart_cost_s=300)
    assert [z.zone for z in built.tiers[0].zones] == [A, B, C]
    assert built.tiers[0].placement == "ordered"
    ranked = plan.build(spec(), Outlook(history), NOW, history="test", restart_cost_s=300)
    assert [z.zone for z in ranked.tiers[0].zones] == [B, C, A]
    assert "in list order (ordered)" in plan.text(built, lambda headers, rows: "")


def test_a_job_of_several_slices_shows_what_they_cost_and_earn_each_way_to_recover() -> None:
    """K slices cost K machines an hour and meet a preemption K times as often; re-formed in place a preemption costs
    the survivors two re-formings and the lost slice's share while its replacement comes, recreated whole every
    slice's restart: at a 2 h MTBI per slice and an 8-minute restart, 4 slices earn about 1.25x re-formed."""
    tpu = TpuMachine("v5litepod-8", "v2-alpha-tpuv5-lite")
    history = History().observe(Key(A, "v5litepod-8", "spot"), NOW, seconds=40 * HOUR, interruptions=20)
    outlook = Outlook(history, {})
    built = plan.build(spec(replace(tpu, slices=4), (A,)), outlook, NOW, history="test", restart_cost_s=480)
    one = plan.build(spec(tpu, (A,)), outlook, NOW, history="test", restart_cost_s=480)
    zone, alone = built.tiers[0].zones[0], one.tiers[0].zones[0]
    assert zone.world is not None and alone.world is None and alone.price is not None
    assert zone.world.price_per_hour == pytest.approx(4 * alone.price.rate_per_h)
    every = zone.mtbi_s / 4
    assert zone.world.goodput_recreated == useful_fraction(every, 30.0, 480)
    assert zone.world.goodput_reformed == useful_fraction(every, 30.0, 2 * plan.REFORM_S + 480 / 4)
    assert 1.5 * HOUR < zone.mtbi_s < 2.5 * HOUR
    assert zone.world.goodput_reformed / zone.world.goodput_recreated > 1.2
    shown = plan.to_json(built)["tiers"][0]["zones"][0]["slices"]
    assert shown["slices"] == 4 and shown["goodput_reformed"] > shown["goodput_recreated"]
    assert "4 slices" in plan.text(built, lambda headers, rows: "")
