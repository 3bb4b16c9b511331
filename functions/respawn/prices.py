"""Hourly prices of the machine types respawn runs, to price a job at Spot vs on-demand.

Used by `respawn status` (a job's machine time from its record) and the local cloud's report (a run's machine
time from its timeline).

List prices in USD for us-central1, each row dated by when it was read (`Price.as_of`). The TPU rows and the GPUs of
N1 VMs were read in 2025-06 from the public pricing pages (https://cloud.google.com/tpu/pricing,
https://cloud.google.com/compute/gpus-pricing and https://cloud.google.com/spot-vms/pricing); the GPU series' rows are
their records' prices (respawn.gpus, each with its date and source). TPU prices are per chip-hour and are multiplied
by the chips of the slice; GPU prices are per GPU-hour and cover the accelerator only (the host machine type is billed
on top and is left out here). Spot prices are dynamic (Google may change them up to once a day, always 60-91% below
on-demand), so treat the figures as indicative: the report prints which row it used and its date.

Where Google's Advice API answers (respawn/adapters/advice.py: the newest Spot list price of the machine type's
price history), that price is used instead; `Priced` carries a rate with its source, so that every cost printed
says which it came from: "Advice API price history (DATE)" or "list price table 2025-06" (the row's date). The
Advice API's price is
for the whole machine type (an accelerator-optimized type's GPUs included); the table's GPU rows are the GPUs alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from respawn.gpus import GPU_SERIES
from respawn.jobs import SPOT_MODELS
from respawn.topology import UnknownTpuType, tpu_topology

TABLE_AS_OF = "2025-06"  # the date of the rows that name none


def list_source(as_of: str = TABLE_AS_OF) -> str:
    """The source of a price from this table's row read on `as_of`."""
    return f"list price table {as_of}"


LIST_SOURCE = list_source()


def advice_source(fetched_at: float) -> str:
    """The source of a price from the Advice API's price history, dated by when respawn read it (UTC)."""
    return f"Advice API price history ({time.strftime('%Y-%m-%d', time.gmtime(fetched_at))})"


@dataclass(frozen=True)
class Priced:
    """An hourly rate and where it comes from (LIST_SOURCE or advice_source(...))."""

    rate_per_h: float
    source: str  # LIST_SOURCE, or advice_source(when the Advice API was read)

    def text(self) -> str:
        return f"${self.rate_per_h:.2f}/h ({self.source})"


@dataclass(frozen=True)
class Price:
    on_demand: float  # USD per unit-hour
    spot: float  # USD per unit-hour (Spot, or preemptible where Spot is not offered)
    unit: str  # "chip" | "gpu" | "device"
    as_of: str = TABLE_AS_OF  # when the row was read


# TPU generation (accelerator_type prefix) -> price per chip-hour.
TPU_PRICES: dict[str, Price] = {
    "v2": Price(on_demand=4.50, spot=1.35, unit="device"),  # v2-8 device (4 chips), preemptible
    "v3": Price(on_demand=8.00, spot=2.40, unit="device"),  # v3-8 device (4 chips), preemptible
    "v4": Price(on_demand=3.22, spot=0.97, unit="chip"),
    "v5litepod": Price(on_demand=1.20, spot=0.48, unit="chip"),  # TPU v5e
    "v5p": Price(on_demand=4.20, spot=1.68, unit="chip"),
    "v6e": Price(on_demand=2.70, spot=1.08, unit="chip"),  # Trillium
}

# GPU accelerator type (as the Compute Engine API names it) -> price per GPU-hour (the accelerator alone): the GPUs
# of N1 VMs, and each priced series' of respawn.gpus.
GPU_PRICES: dict[str, Price] = {
    "nvidia-tesla-t4": Price(on_demand=0.35, spot=0.11, unit="gpu"),  # N1 only
    "nvidia-tesla-v100": Price(on_demand=2.48, spot=0.74, unit="gpu"),  # N1 only
    **{
        s.accelerator_type: Price(s.price.on_demand, s.price.spot, "gpu", s.price.as_of)
        for s in GPU_SERIES
        if s.price is not None
    },
}


@dataclass(frozen=True)
class MachinePrice:
    label: str  # what the row priced, e.g. "v5litepod-8: 8 chips x $1.20/chip-h on-demand"
    on_demand_per_h: float
    spot_per_h: float
    as_of: str = TABLE_AS_OF  # when the row was read

    @property
    def source(self) -> str:
        return list_source(self.as_of)


def tpu_units(accelerator_type: str) -> tuple[str, int] | None:
    """`v5litepod-8` -> ("v5litepod", 8 chips); v2/v3 are priced per 4-chip device (respawn/topology.py's chips)."""
    try:
        shape = tpu_topology(accelerator_type)
    except UnknownTpuType:
        return None
    generation = accelerator_type.rpartition("-")[0]
    return generation, max(1, shape.chips // 4) if generation in ("v2", "v3") else shape.chips


def machine_price(machine: dict[str, object]) -> MachinePrice | None:
    """The hourly price of one machine of the job's `machine` block, or None when the table lacks it."""
    if machine.get("kind") == "tpu":
        accelerator = str(machine.get("accelerator_type", ""))
        units = tpu_units(accelerator)
        if units is None or units[0] not in TPU_PRICES:
            return None
        generation, n = units
        p = TPU_PRICES[generation]
        label = f"{accelerator}: {n} {p.unit}(s) x ${p.on_demand:.2f} on-demand / ${p.spot:.2f} Spot per {p.unit}-hour"
        return MachinePrice(label, n * p.on_demand, n * p.spot, p.as_of)
    accelerator = str(machine.get("accelerator_type", ""))
    vms = int(str(machine.get("vms", 1)))  # a GPU machine of several VMs (machine.vms) costs each one's GPUs
    count = int(str(machine.get("accelerator_count", 1))) * vms
    gpu = GPU_PRICES.get(accelerator)
    if gpu is None:
        return None
    label = f"{count} x {accelerator}: ${gpu.on_demand:.2f} on-demand / ${gpu.spot:.2f} Spot per GPU-hour"
    label += f" ({vms} VMs)" if vms > 1 else ""
    label += " (host VM not included)"
    return MachinePrice(label, count * gpu.on_demand, count * gpu.spot, gpu.as_of)


def rate_per_h(provisioning: str, price: MachinePrice | None) -> float | None:
    """What one machine-hour of a tier costs: the Spot price for spot/preemptible, on-demand otherwise."""
    if price is None:
        return None
    return price.spot_per_h if provisioning in SPOT_MODELS else price.on_demand_per_h


def priced(
    provisioning: str, price: MachinePrice | None, advice_per_h: float | None = None, advice_at: float = 0.0
) -> Priced | None:
    """One machine-hour of a tier: the Advice API's price when it gave one (`advice_per_h`, read at `advice_at`),
    else the table's rate for the provisioning model (rate_per_h); None when neither knows the machine."""
    if advice_per_h is not None and advice_per_h > 0:
        return Priced(advice_per_h, advice_source(advice_at))
    rate = rate_per_h(provisioning, price)
    return None if rate is None or price is None else Priced(rate, price.source)


def cost(hours: float, price: MachinePrice | None) -> dict[str, Any] | None:
    """`hours` of machine time at the Spot and at the on-demand price, and which row priced them; None unpriced."""
    if price is None:
        return None
    return {
        "spot_usd": round(hours * price.spot_per_h, 4),
        "on_demand_usd": round(hours * price.on_demand_per_h, 4),
        "spot_per_h": price.spot_per_h,
        "on_demand_per_h": price.on_demand_per_h,
        "priced_as": price.label,
        "prices_as_of": f"{price.as_of} (us-central1 list prices)",
        "price_source": price.source,
    }
