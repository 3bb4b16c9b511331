"""What each zone of the local cloud offers: the machine and accelerator types its APIs list there.

  GET /compute/v1/projects/P/zones/Z/machineTypes/T        Compute Engine machineTypes.get
  GET /compute/v1/projects/P/zones/Z/acceleratorTypes/T    Compute Engine acceleratorTypes.get
  GET /v2/projects/P/locations/Z/acceleratorTypes/T        Cloud TPU API acceleratorTypes.get

Every zone offers every type the local APIs know (a TPU machine type or another series' machine type, an
`nvidia-*` GPU, a Cloud TPU accelerator type such as v6e-16) but those the CloudCore knob `unoffered` withholds
there (zone -> type names). A type a zone does not offer is NOT_FOUND on these reads, and a create that asks for it
there is refused with a 400 naming the field, the type and the zone, in the words the real APIs use for a machine
type ("Machine type with name 'T' does not exist in zone 'Z'.").
"""

from __future__ import annotations

import re
from typing import Any

from localcloud.apis.apicore import ApiError, CloudCore, invalid
from localcloud.apis.compute.checks import TPU_MACHINE_TYPES, known_machine_type
from localcloud.apis.compute.common import COMPUTE, not_found

_GPU = re.compile(r"nvidia-[a-z0-9-]+")
_TPU_TYPE = re.compile(r"(v2|v3|v4|v5litepod|v5p|v6e|tpu7x)-[1-9][0-9]*")
_COMPUTE_PATH = re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/(machineTypes|acceleratorTypes)/([^/]+)$")
_TPU_PATH = re.compile(r"^/v2/projects/([^/]+)/locations/([^/]+)/acceleratorTypes/([^/]+)$")


def offers(core: CloudCore, zone: str, type_name: str) -> bool:
    return type_name not in core.unoffered.get(zone, ())


def compute_route(core: CloudCore, method: str, path: str) -> dict[str, Any] | None:
    """machineTypes.get / acceleratorTypes.get: the type in the zone, or NOT_FOUND."""
    m = _COMPUTE_PATH.match(path)
    if m is None or method != "GET":
        return None
    project, zone, collection, name = m.groups()
    where = f"projects/{project}/zones/{zone}/{collection}/{name}"
    known = known_machine_type(name) if collection == "machineTypes" else bool(_GPU.fullmatch(name))
    if not known or not offers(core, zone, name):
        raise not_found(where)
    item: dict[str, Any] = {
        "kind": f"compute#{collection[:-1]}",
        "name": name,
        "zone": zone,
        "description": name,
        "selfLink": f"{COMPUTE}/{where}",
    }
    tpu = TPU_MACHINE_TYPES.get(name)
    if tpu is not None:
        item["accelerators"] = [{"guestAcceleratorType": f"tpu-{tpu.generation}", "guestAcceleratorCount": tpu.chips}]
    return item


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


def check_offered(core: CloudCore, zone: str, type_name: str, field_name: str, value: str, kind: str) -> None:
    """A create in `zone` that asks for `type_name` (a machine or accelerator type) is refused where the zone does
    not offer it."""
    if not offers(core, zone, type_name):
        raise invalid(
            f"Invalid value for field '{field_name}': '{value}'. {kind} with name '{type_name}' does not exist in "
            f"zone '{zone}'."
        )
