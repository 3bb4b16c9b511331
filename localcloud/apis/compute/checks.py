"""What the local Compute Engine API accepts: the fields it models and the rules Google documents for TPU VMs,
flex-start, workload policies (the machine types it knows: offerings.py). Every check raises a 400 in Compute's
words.

A request google.cloud.compute_v1 cannot read is refused as the real API does ("Invalid JSON payload received.
Unknown name ..."); one that holds a field compute_v1 knows but this API does not model is refused too, since the
local API would not do what the field asks. Sources: tests/data/SOURCES.md ("The local TPU / Compute API").
"""

from __future__ import annotations

import json
import re
from typing import Any

from google.protobuf.json_format import ParseError

from localcloud.apis.apicore import invalid
from localcloud.apis.offerings import TPU_MACHINE_TYPES

_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")  # RFC 1035, as every Compute resource name
_TOPOLOGY = re.compile(r"[1-9][0-9]*(x[1-9][0-9]*){1,2}")
_DAY = 24 * 3600
FLEX_START_MAX_RUN_S = 7 * _DAY  # compute/docs/instances/about-flex-start-vms: up to seven days
# A flex-start VM's requestValidForDuration: from 90 s (compute/docs/instances/instance-lifecycle: "a wait time ...
# that is 90 seconds or longer") to 2 hours (the flex-start VM launch post: requests wait "up to two hours").
FLEX_START_WAIT_S = (90, 2 * 3600)
RESIZE_RUN_S = (600, 7 * _DAY)  # about-resize-requests-mig: requestedRunDuration between 10 minutes and 7 days

# The fields this API models, per resource (None: stored as sent, not looked into). Others that
# google.cloud.compute_v1 knows are refused: the local API would not do what they ask.
_SCHEDULING = dict.fromkeys(
    [
        "provisioningModel",
        "instanceTerminationAction",
        "maxRunDuration",
        "automaticRestart",
        "onHostMaintenance",
        "preemptible",
        "preemptionNoticeDuration",
    ]
)
_PROPERTIES: dict[str, Any] = {
    **dict.fromkeys(
        [
            "description",
            "machineType",
            "guestAccelerators",
            "disks",
            "networkInterfaces",
            "metadata",
            "labels",
            "tags",
            "serviceAccounts",
            "reservationAffinity",
            "shieldedInstanceConfig",
        ]
    ),
    "scheduling": _SCHEDULING,
}
INSTANCE_FIELDS: dict[str, Any] = {
    **_PROPERTIES,
    "name": None,
    "params": {"requestValidForDuration": None},
    "resourcePolicies": None,
}
TEMPLATE_FIELDS: dict[str, Any] = {"name": None, "description": None, "properties": _PROPERTIES}
POLICY_FIELDS: dict[str, Any] = {
    "name": None,
    "description": None,
    "workloadPolicy": dict.fromkeys(("type", "acceleratorTopology", "acceleratorTopologyMode", "maxTopologyDistance")),
}
MIG_FIELDS: dict[str, Any] = {
    **dict.fromkeys(("name", "description", "baseInstanceName", "instanceTemplate", "targetSize")),
    "targetSizePolicy": {"mode": None},
    "instanceLifecyclePolicy": {"defaultActionOnFailure": None, "forceUpdateOnRepair": None},
    "resourcePolicies": {"workloadPolicy": None},
}
RESIZE_REQUEST_FIELDS: dict[str, Any] = dict.fromkeys(("name", "description", "resizeBy", "requestedRunDuration"))
METADATA_FIELDS: dict[str, Any] = {"items": None}  # setMetadata's body (its fingerprint and kind: _OUTPUT_ONLY)
# The Metadata schema's limits (compute.v1 discovery document): keys [a-zA-Z0-9-_]{1,128}, a value at most 256 KiB,
# all keys and values under 512 KB.
_METADATA_KEY = re.compile(r"[a-zA-Z0-9-_]{1,128}")
METADATA_VALUE_MAX, METADATA_TOTAL_MAX = 256 * 1024, 512 * 1024
# Output-only fields a client may send back: the real API ignores them, so does this one.
_OUTPUT_ONLY = frozenset(
    [
        "kind",
        "id",
        "creationTimestamp",
        "selfLink",
        "selfLinkWithId",
        "status",
        "statusMessage",
        "zone",
        "region",
        "fingerprint",
        "labelFingerprint",
        "cpuPlatform",
        "currentActions",
        "instanceGroup",
        "state",
        "resourceStatus",
        "satisfiesPzi",
        "satisfiesPzs",
    ]
)


def check_body(message: type[Any], body: dict[str, Any], spec: dict[str, Any]) -> None:
    """Refuse a body google.cloud.compute_v1 cannot read (an unknown field name, a wrong type), then one that
    holds a field this API does not model."""
    try:
        message.from_json(json.dumps(body), ignore_unknown_fields=False)
    except ParseError as e:
        unknown = re.search(r'has no field named "([^"]+)" at "([^"]+)"', str(e))
        if unknown:
            where = ".".join(["resource", *unknown[2].split(".")[1:]])
            raise invalid(
                f"Invalid JSON payload received. Unknown name \"{unknown[1]}\" at '{where}': Cannot find field."
            ) from e
        raise invalid(f"Invalid JSON payload received. {str(e).splitlines()[0]}") from e
    _modelled(body, spec, "resource")


def _modelled(body: dict[str, Any], spec: dict[str, Any], where: str) -> None:
    for key, value in body.items():
        if key in _OUTPUT_ONLY or value in (None, [], {}):
            continue
        if key not in spec:
            raise invalid(f"Field '{where}.{key}' is not supported by the local Compute API.")
        if spec[key] is not None and isinstance(value, dict):
            _modelled(value, spec[key], f"{where}.{key}")


def check_metadata_items(items: list[dict[str, Any]]) -> dict[str, str]:
    """A Metadata body's items as {key: value}, held to the schema's limits; a key given twice is refused."""
    found: dict[str, str] = {}
    for i, item in enumerate(items):
        key, value = str(item.get("key") or ""), str(item.get("value") or "")
        if not _METADATA_KEY.fullmatch(key):
            raise invalid(
                f"Invalid value for field 'resource.items[{i}].key': '{key}'. Must be a match of regex "
                "'[a-zA-Z0-9-_]{1,128}'"
            )
        if key in found:
            raise invalid(f"Invalid value for field 'resource.items[{i}].key': '{key}'. Duplicate metadata key.")
        if len(value.encode()) > METADATA_VALUE_MAX:
            raise invalid(
                f"Invalid value for field 'resource.items[{i}].value': longer than {METADATA_VALUE_MAX} bytes."
            )
        found[key] = value
    if sum(len(k.encode()) + len(v.encode()) for k, v in found.items()) >= METADATA_TOTAL_MAX:
        raise invalid(f"Invalid value for field 'resource.items': {METADATA_TOTAL_MAX} bytes or more in all.")
    return found


def check_name(body: dict[str, Any], field_name: str) -> None:
    name = body.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise invalid(
            f"Invalid value for field '{field_name}': '{name or ''}'. Must be a match of regex "
            "'(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'"
        )


def check_properties(props: dict[str, Any], where: str, machine_type: str) -> None:
    """What an instance and a template's properties share: TPU machine types take no guestAccelerators and do not
    live-migrate; provisioning models and their run durations."""
    tpu = TPU_MACHINE_TYPES.get(machine_type)
    if tpu is not None and props.get("guestAccelerators"):
        raise invalid(
            f"Invalid value for field '{where}.guestAccelerators': machine type {machine_type} comes with its "
            f"{tpu.chips} TPU chips; it takes no guestAccelerators."
        )
    scheduling = props.get("scheduling") or {}
    model = scheduling.get("provisioningModel")
    one_of(model, ("STANDARD", "SPOT", "FLEX_START", "RESERVATION_BOUND"), f"{where}.scheduling.provisioningModel")
    one_of(
        scheduling.get("instanceTerminationAction"), ("DELETE", "STOP"), f"{where}.scheduling.instanceTerminationAction"
    )
    maintenance = scheduling.get("onHostMaintenance")
    one_of(maintenance, ("MIGRATE", "TERMINATE"), f"{where}.scheduling.onHostMaintenance")
    live_migrates = maintenance == "MIGRATE" or (
        maintenance is None and model in (None, "STANDARD") and not scheduling.get("preemptible")
    )
    if tpu is not None and live_migrates:
        raise invalid(
            f"Invalid value for field '{where}.scheduling.onHostMaintenance': '{maintenance or 'MIGRATE'}'. "
            "Instances with TPU machine types do not support live migration: set TERMINATE."
        )
    run = seconds(scheduling.get("maxRunDuration")) if "maxRunDuration" in scheduling else None
    if "maxRunDuration" in scheduling and (run is None or run <= 0):
        raise invalid(f"Invalid value for field '{where}.scheduling.maxRunDuration': must be a positive duration.")
    if "preemptionNoticeDuration" in scheduling:  # "for Spot VMs only" (the field's description)
        notice = seconds(scheduling.get("preemptionNoticeDuration"))
        if model != "SPOT" or notice is None or notice <= 0:
            raise invalid(
                f"Invalid value for field '{where}.scheduling.preemptionNoticeDuration': a positive duration, "
                "for Spot VMs only (provisioningModel SPOT)."
            )
    affinity = props.get("reservationAffinity") or {}
    if model == "RESERVATION_BOUND" and (
        affinity.get("consumeReservationType") != "SPECIFIC_RESERVATION" or not affinity.get("values")
    ):  # calendar-mode reservations: "you must specify the reservation" (compute/docs/instances/reservations-consume)
        raise invalid(
            f"Invalid value for field '{where}.reservationAffinity': a RESERVATION_BOUND instance consumes a "
            "specific reservation: consumeReservationType SPECIFIC_RESERVATION with the reservation's name."
        )
    if model == "FLEX_START" and (run is None or run > FLEX_START_MAX_RUN_S):
        raise invalid(
            f"Invalid value for field '{where}.scheduling.maxRunDuration': a FLEX_START instance needs a "
            f"maxRunDuration of at most {FLEX_START_MAX_RUN_S} s (7 days)."
        )


def check_workload_policy(body: dict[str, Any]) -> None:
    workload = body.get("workloadPolicy")
    if not workload:
        raise invalid("The local Compute API serves resource policies with a workloadPolicy only.")
    one_of(
        workload.get("type"), ("HIGH_THROUGHPUT", "HIGH_AVAILABILITY"), "resource.workloadPolicy.type", required=True
    )
    one_of(
        workload.get("acceleratorTopologyMode"),
        ("AUTO_CONNECT", "PROVISION_ONLY"),
        "resource.workloadPolicy.acceleratorTopologyMode",
    )
    topology = workload.get("acceleratorTopology")
    if topology is not None and not _TOPOLOGY.fullmatch(str(topology)):
        raise invalid(
            f"Invalid value for field 'resource.workloadPolicy.acceleratorTopology': '{topology}'. Must be AxB or "
            "AxBxC, e.g. 4x4 or 2x2x2."
        )


def one_of(value: object, allowed: tuple[str, ...], field_name: str, required: bool = False) -> None:
    if (value is None and not required) or value in allowed:
        return
    raise invalid(f"Invalid value for field '{field_name}': '{value}'. Allowed: {', '.join(allowed)}.")


def seconds(duration: object) -> int | None:
    """A Compute Duration ({"seconds": "600"}) in whole seconds; None when it is not one."""
    if not isinstance(duration, dict):
        return None
    try:
        return int(duration.get("seconds") or 0)
    except (TypeError, ValueError):
        return None
