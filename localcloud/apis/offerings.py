"""What each zone of the local cloud offers: the machine types the local APIs know (the TPU machine types by their
chips, the other series by name) and the machine and accelerator types their zones list.

  GET /compute/v1/projects/P/zones/Z/machineTypes/T        Compute Engine machineTypes.get (compute/api.py)
  GET /compute/v1/projects/P/zones/Z/acceleratorTypes/T    Compute Engine acceleratorTypes.get (compute/api.py)
  GET /v2/projects/P/locations/Z/acceleratorTypes/T        Cloud TPU API acceleratorTypes.get

Every zone offers every type the local APIs know (a TPU machine type or another series' machine type, an
`nvidia-*` GPU, a Cloud TPU accelerator type such as v6e-16) but those the CloudCore knob `unoffered` withholds
there (zone -> type names). A type a zone does not offer is NOT_FOUND on these reads, and a create that asks for it
there is refused with a 400 naming the field, the type and the zone, in the words the real APIs use for a machine
type ("Machine type with name 'T' does not exist in zone 'Z'.").
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


def known_machine_type(machine_type: str) -> bool:
    return machine_type in TPU_MACHINE_TYPES or bool(_OTHER_MACHINE_TYPE.fullmatch(machine_type))


def offers(core: CloudCore, zone: str, type_name: str) -> bool:
    return type_name not in core.unoffered.get(zone, ())


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
