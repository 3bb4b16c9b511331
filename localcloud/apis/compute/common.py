"""What every collection of the local Compute API uses: its URLs, a request, its errors and a machine's kind."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from localcloud.apis.apicore import GPU, TPU, ApiError, CloudCore, CloudMachine, Fault, list_filter
from localcloud.apis.offerings import TPU_MACHINE_TYPES
from localcloud.services.logentries import instance_id

COMPUTE = "https://www.googleapis.com/compute/v1"
CREATING = ("PENDING", "PROVISIONING", "STAGING")
NAME = r"([^/]+)"  # one path segment of a route
Key = tuple[str, str, str]  # (project, zone or region, name)


@dataclass(frozen=True)
class Request:
    """An HTTP request to a route: its method, query parameters and JSON body."""

    method: str
    query: dict[str, str]
    body: dict[str, Any]


def listing(kind: str, path: str, items: list[dict[str, Any]], query: dict[str, str]) -> dict[str, Any]:
    """A list reply: the items the `filter` query parameter selects."""
    if query.get("filter"):
        items = [i for i in items if list_filter(query["filter"])(i)]
    return {"kind": kind, "id": path, "items": items, "selfLink": f"{COMPUTE}/{path}"}


def kind_of(machine_type: object) -> str:
    name = str(machine_type or "").rpartition("/")[2]
    return TPU if name in TPU_MACHINE_TYPES else GPU if name else ""


def spot(scheduling: dict[str, Any]) -> bool:
    return scheduling.get("provisioningModel") == "SPOT" or bool(scheduling.get("preemptible"))


def region_of(zone: str) -> str:
    return zone.rpartition("-")[0]


def url(path: str) -> str:
    return f"{COMPUTE}/{path}"


def instance_path(project: str, zone: str, name: str) -> str:
    return f"projects/{project}/zones/{zone}/instances/{name}"


def key(m: CloudMachine) -> Key:
    return (m.project, m.zone, m.name)


def vm_id(m: CloudMachine) -> str:
    return instance_id(m.name)  # the id the local cloud's system events carry for this VM


def create_fault(core: CloudCore, kind: str, name: str, zone: str, collection: str) -> Fault | None:
    """Record a create call: a fault set for it fails the call at once, or comes back to end its operation."""
    fault = core.record("create", kind, name, zone, collection)
    if fault and not fault.in_operation:
        raise ApiError.of(fault)
    return fault


def not_found(path: str) -> ApiError:
    return ApiError(404, "NOT_FOUND", f"The resource '{path}' was not found", "notFound")


def already_exists(path: str) -> ApiError:
    return ApiError(409, "ALREADY_EXISTS", f"The resource '{path}' already exists", "alreadyExists")


def in_use(kind: str, path: str, user: str) -> ApiError:
    """Compute's refusal to delete what another resource uses."""
    return ApiError(
        400,
        "INVALID_ARGUMENT",
        f"The {kind} resource '{path}' is already being used by '{user}'",
        "resourceInUseByAnotherResource",
    )


def capacity_error(project: str, zone: str) -> ApiError:
    return ApiError(
        503,
        "UNAVAILABLE",
        f"The zone 'projects/{project}/zones/{zone}' does not have enough resources available to "
        "fulfill the request.  Try a different zone, or try again later.",
        "ZONE_RESOURCE_POOL_EXHAUSTED",
    )


def capacity_wait(project: str, zone: str) -> dict[str, Any]:
    """Why a BULK creation or a resize request still waits (view-cancel-vm-bulk-creation-in-migs names the code)."""
    message = capacity_error(project, zone).message
    return {"errors": [{"code": "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "message": message}]}
