"""What each zone of the local cloud offers: the machine types the local APIs know (the TPU machine types by their
chips, the other series by name) and, per zone, the TPU and GPU types Google publishes for it.

  GET /compute/v1/projects/P/zones/Z/machineTypes/T        Compute Engine machineTypes.get (compute/api.py)
  GET /compute/v1/projects/P/zones/Z/acceleratorTypes/T    Compute Engine acceleratorTypes.get (compute/api.py)
  GET /v2/projects/P/locations/Z/acceleratorTypes/T        Cloud TPU API acceleratorTypes.get

A TPU type (a Cloud TPU accelerator type such as v6e-16, or a TPU machine type such as ct6e-standard-4t) is offered
in the zones TPU_ZONES lists for its generation, a GPU (`nvidia-l4`, or a machine type that comes with one: g2-, a2-,
a3-, a4-) in those GPU_ZONES lists for that GPU; every other type the local APIs know (general-purpose series, GPUs
the table does not hold) in every zone. The CloudCore knob `unoffered` (zone -> type names, `--unoffered`) withholds
more. A type a zone does not offer is NOT_FOUND on these reads, and a create that asks for it there is refused with a
400 naming the field, the type and the zone, in the words the real APIs use for a machine type ("Machine type with
name 'T' does not exist in zone 'Z'.").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from localcloud.apis.apicore import ApiError, CloudCore, invalid


@dataclass(frozen=True)
class TpuMachineType:
    """A TPU machine type of Compute Engine: its chips and how many dimensions its slices' topology has."""

    name: str
    generation: str
    chips: int
    topology_dims: int  # v6e slices are AxB, v5p and TPU7x AxBxC


# compute/docs/tpus/tpu-machines: "Compute Engine supports ... TPU7x, TPU v6e, TPU v5p" (no v5e: ct5lp is GKE's).
TPU_MACHINE_TYPES = {
    t.name: t
    for t in (
        TpuMachineType("ct5p-hightpu-4t", "v5p", 4, 3),
        TpuMachineType("ct6e-standard-1t", "v6e", 1, 2),
        TpuMachineType("ct6e-standard-4t", "v6e", 4, 2),
        TpuMachineType("ct6e-standard-8t", "v6e", 8, 2),
        TpuMachineType("tpu7x-standard-4t", "tpu7x", 4, 3),
    )
}
# The other machine types the local API knows: the general-purpose, compute-, memory- and accelerator-optimized
# series by name (compute/docs/machine-resource); their sizes are not checked.
_OTHER_MACHINE_TYPE = re.compile(
    r"(e2|n1|n2|n2d|n4|n4d|c2|c2d|c3|c3d|c4|c4a|c4d|t2a|t2d|m1|m2|m3|m4|h3|h4d|z3|a2|a3|a4|a4x|g2|g4)-[a-z0-9-]+"
)
_GPU = re.compile(r"nvidia-[a-z0-9-]+")
_TPU_TYPE = re.compile(r"(v2|v3|v4|v5litepod|v5p|v6e|tpu7x)-[1-9][0-9]*")
_TPU_PATH = re.compile(r"^/v2/projects/([^/]+)/locations/([^/]+)/acceleratorTypes/([^/]+)$")

# ---- Which zones offer which TPU and GPU, as Google publishes it (read 2026-11-28) --------------------------------
#
# TPUs: https://cloud.google.com/tpu/docs/regions-zones ("You can create TPU VMs in the zones shown in the following
# table"; the same page as tpu/docs/types-zones), for every slice size of a generation (v2 and v3 by size). The
# stored copies hold North America in full and Europe's first row (v6e); an older copy holds v2 and v3 in Europe and
# Asia. The page's newest copy lists v6e in "us-central1-ai1", which is no zone name (an AI zone is REGION-aiNX):
# left out.
_PUBLISHED_TPU_ZONES: dict[str, tuple[str, ...]] = {
    "tpu7x": ("us-central1-ai1a", "us-central1-c"),
    "v6e": ("us-central1-b", "us-east1-d", "us-east5-a", "us-east5-b", "us-south1-ai1b", "europe-west4-a"),
    "v5p": ("us-central1-a", "us-east5-a"),
    "v5litepod": ("us-central1-a", "us-south1-a", "us-west1-c", "us-west4-a"),
    "v4": ("us-central2-b",),
    "v3-8": ("us-central1-a", "us-central1-b", "europe-west4-a"),
    **{f"v3-{n}": ("europe-west4-a",) for n in (32, 64, 128, 256, 512, 1024, 2048)},
    "v2-8": ("us-central1-b", "us-central1-c", "europe-west4-a", "asia-east1-c"),
    **{f"v2-{n}": ("us-central1-a", "europe-west4-a") for n in (32, 128, 256, 512)},
}
# Not settled by the stored copies (the rows after Europe's first were cut off): kept so that a job there is not
# refused locally where the cloud may take it, to verify once (docs/cloud-contracts.md).
UNSETTLED_TPU_ZONES: dict[str, tuple[str, ...]] = {
    "v6e": ("asia-northeast1-b",),
    "v5p": ("europe-west4-b",),
    "v5litepod": ("europe-west4-b", "asia-southeast1-b"),
}
TPU_ZONES = {key: (*zones, *UNSETTLED_TPU_ZONES.get(key, ())) for key, zones in _PUBLISHED_TPU_ZONES.items()}
# GPUs: Google's GPU regions-and-zones page (https://cloud.google.com/compute/docs/gpus/gpu-regions-zones) is not
# among the stored copies, so none of these zones is settled by it (docs/cloud-contracts.md). They are the zones
# whose Compute Engine machine type listings hold each GPU's machine series, as SkyPilot's public catalog has them
# (https://github.com/skypilot-org/skypilot-catalog, catalogs/v8/gcp/vms.csv, read 2026-11-28): G2 for L4, A2
# Standard (a2-highgpu) for A100 40GB, A2 Ultra for A100 80GB, A3 High for H100, A3 Mega for H100 Mega, A3 Ultra
# for H200, A4 for B200. The GPUs of N1 (T4, V100, P4, P100), GB200 (A4X) and G4 are not in the table: every zone.
GPU_ZONES: dict[str, tuple[str, ...]] = {
    "nvidia-l4": (
        *("asia-east1-a", "asia-east1-b", "asia-east1-c", "asia-northeast1-a", "asia-northeast1-b"),
        *("asia-northeast1-c", "asia-northeast3-a", "asia-northeast3-b", "asia-south1-a", "asia-south1-b"),
        *("asia-south1-c", "asia-southeast1-a", "asia-southeast1-b", "asia-southeast1-c", "europe-west1-b"),
        *("europe-west1-c", "europe-west2-a", "europe-west2-b", "europe-west3-a", "europe-west3-b"),
        *("europe-west4-a", "europe-west4-b", "europe-west4-c", "europe-west6-b", "europe-west6-c"),
        *("me-central2-a", "me-central2-c", "northamerica-northeast1-b", "northamerica-northeast1-c"),
        *("northamerica-northeast2-a", "northamerica-northeast2-b", "us-central1-a", "us-central1-b"),
        *("us-central1-c", "us-east1-b", "us-east1-c", "us-east1-d", "us-east4-a", "us-east4-c", "us-west1-a"),
        *("us-west1-b", "us-west1-c", "us-west4-a", "us-west4-c"),
    ),
    "nvidia-tesla-a100": (
        *("asia-northeast1-a", "asia-northeast1-c", "asia-northeast3-a", "asia-northeast3-b", "asia-southeast1-a"),
        *("asia-southeast1-b", "asia-southeast1-c", "europe-west4-a", "europe-west4-b", "me-west1-a", "me-west1-c"),
        *("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f", "us-east1-b", "us-west1-b"),
        *("us-west3-b", "us-west4-b"),
    ),
    "nvidia-a100-80gb": (
        *("asia-southeast1-c", "europe-west4-a", "us-central1-a", "us-central1-c", "us-east4-c", "us-east5-a"),
        "us-east5-b",
    ),
    "nvidia-h100-80gb": (
        *("asia-east1-c", "asia-northeast1-b", "asia-south1-c", "asia-south2-b", "asia-southeast1-b"),
        *("asia-southeast1-c", "australia-southeast1-c", "europe-north1-c", "europe-west1-b", "europe-west1-c"),
        *("europe-west3-c", "europe-west4-b", "europe-west4-c", "europe-west9-c", "us-central1-a", "us-central1-b"),
        *("us-central1-c", "us-east4-a", "us-east4-b", "us-east4-c", "us-east5-a", "us-west1-a", "us-west1-b"),
        "us-west4-a",
    ),
    "nvidia-h100-mega-80gb": (
        *("asia-east1-c", "asia-northeast1-b", "asia-southeast1-b", "asia-southeast1-c", "australia-southeast1-c"),
        *("europe-north1-c", "europe-west1-b", "europe-west1-c", "europe-west3-c", "europe-west4-b"),
        *("europe-west4-c", "us-central1-a", "us-central1-b", "us-central1-c", "us-east4-a", "us-east4-b"),
        *("us-east4-c", "us-east5-a", "us-west1-a", "us-west1-b", "us-west4-a"),
    ),
    "nvidia-h200-141gb": (
        *("asia-south1-b", "asia-south2-c", "europe-west1-b", "europe-west4-a", "us-central1-b", "us-east4-b"),
        *("us-east5-a", "us-south1-b", "us-west1-c"),
    ),
    "nvidia-b200": (
        *("asia-northeast1-b", "asia-southeast1-b", "europe-north1-b", "europe-west4-b", "us-central1-b"),
        *("us-east1-b", "us-east4-b", "us-south1-b", "us-west2-c", "us-west3-b", "us-west3-c"),
    ),
}
# The GPU machine series (compute/docs/accelerator-optimized-machines) and the GPU that comes with each.
GPU_MACHINE_SERIES = {
    "g2-": "nvidia-l4",
    "a2-highgpu-": "nvidia-tesla-a100",
    "a2-megagpu-": "nvidia-tesla-a100",
    "a2-ultragpu-": "nvidia-a100-80gb",
    "a3-highgpu-": "nvidia-h100-80gb",
    "a3-edgegpu-": "nvidia-h100-80gb",
    "a3-megagpu-": "nvidia-h100-mega-80gb",
    "a3-ultragpu-": "nvidia-h200-141gb",
    "a4-highgpu-": "nvidia-b200",
}


def listed_zones(type_name: str) -> tuple[str, ...] | None:
    """The zones the table lists for a TPU or GPU type (a Cloud TPU accelerator type, a TPU or GPU machine type, a
    GPU); None for a type it does not hold, which every zone offers."""
    tpu = TPU_MACHINE_TYPES.get(type_name)
    if tpu is not None:
        return TPU_ZONES[tpu.generation]
    if m := _TPU_TYPE.fullmatch(type_name):
        return TPU_ZONES.get(type_name, ()) if m[1] in ("v2", "v3") else TPU_ZONES[m[1]]
    gpu = next((g for prefix, g in GPU_MACHINE_SERIES.items() if type_name.startswith(prefix)), type_name)
    return GPU_ZONES.get(gpu)


def zones_offering(type_names: list[str]) -> list[str] | None:
    """The zones the table lists for every one of `type_names` (sorted), None when it holds none of them."""
    listed = [set(zones) for zones in map(listed_zones, type_names) if zones is not None]
    return sorted(set.intersection(*listed)) if listed else None


def known_machine_type(machine_type: str) -> bool:
    return machine_type in TPU_MACHINE_TYPES or bool(_OTHER_MACHINE_TYPE.fullmatch(machine_type))


def offers(core: CloudCore, zone: str, type_name: str) -> bool:
    """Whether `zone` offers `type_name`: the table lists it there (or holds no such type) and `unoffered` does not
    withhold it."""
    zones = listed_zones(type_name)
    return (zones is None or zone in zones) and type_name not in core.unoffered.get(zone, ())


def compute_offers(core: CloudCore, zone: str, collection: str, name: str) -> bool:
    """Whether Compute lists machine or accelerator type `name` (`collection`: machineTypes | acceleratorTypes)."""
    known = known_machine_type(name) if collection == "machineTypes" else bool(_GPU.fullmatch(name))
    return known and offers(core, zone, name)


def tpu_route(core: CloudCore, method: str, path: str) -> dict[str, Any] | None:
    """The Cloud TPU API's acceleratorTypes.get: the type in the zone, or NOT_FOUND."""
    m = _TPU_PATH.match(path)
    if m is None or method != "GET":
        return None
    project, zone, name = m.groups()
    where = f"projects/{project}/locations/{zone}/acceleratorTypes/{name}"
    if not _TPU_TYPE.fullmatch(name) or not offers(core, zone, name):
        raise ApiError(404, "NOT_FOUND", f"Resource '{where}' was not found")
    return {"name": where, "type": name}


def check_offered(
    core: CloudCore, zone: str | None, type_name: str, field_name: str, value: str, kind: str = "Machine type"
) -> None:
    """A create in `zone` that asks for `type_name` (a machine or accelerator type) is refused where the zone does
    not offer it, and a machine type the local APIs do not know anywhere (zone None: a global template's)."""
    known = kind != "Machine type" or known_machine_type(type_name)
    if known and (zone is None or offers(core, zone, type_name)):
        return
    where = f" in zone '{zone}'" if zone else ""
    raise invalid(
        f"Invalid value for field '{field_name}': '{value}'. {kind} with name '{type_name}' does not exist{where}."
    )
