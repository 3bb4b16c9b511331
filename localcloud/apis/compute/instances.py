"""The local Compute API's instances: GPU VMs, TPU VMs, and the VMs of a MIG.

  zones/Z/instances[/N]                                   insert, get, list (`filter`), delete     zone op

A GPU VM goes PROVISIONING -> RUNNING, a TPU VM PENDING -> STAGING -> RUNNING, in `create_delay_s`; the insert
operation is done then. A stockout ends the insert operation with ZONE_RESOURCE_POOL_EXHAUSTED; a flex-start
instance instead waits PENDING for its zone's `queue_waits` (failing so when its requestValidForDuration ends first).
"""

from __future__ import annotations

import copy
import re
import time
from typing import TYPE_CHECKING, Any

from google.cloud import compute_v1

from localcloud.apis import offerings
from localcloud.apis.apicore import TPU, ApiError, CloudMachine, MachineCall, invalid, rfc3339, snapshot
from localcloud.apis.compute.checks import (
    FLEX_START_WAIT_S,
    INSTANCE_FIELDS,
    TPU_MACHINE_TYPES,
    check_body,
    check_machine_type,
    check_name,
    check_properties,
    seconds,
)
from localcloud.apis.compute.common import (
    COMPUTE,
    CREATING,
    Key,
    Request,
    capacity_error,
    instance_path,
    key,
    kind_of,
    listing,
    not_found,
    spot,
    vm_id,
)

if TYPE_CHECKING:
    from localcloud.apis.compute.api import ComputeApi

_MACHINE_TYPE_URL = re.compile(rf"(?:(?:{re.escape(COMPUTE)}/)?projects/([^/]+)/)?zones/([^/]+)/machineTypes/([^/]+)")


class Instances:
    """Every VM by (project, zone, name): standalone instances and a MIG's VMs (`managed`: the VM's key -> its
    MIG's key); `flex_waiting`: the flex-start instances in their zone's queue."""

    def __init__(self, api: ComputeApi) -> None:
        self.api = api
        self.core = api.core
        self.vms: dict[Key, CloudMachine] = {}
        self.managed: dict[Key, Key] = {}
        self.flex_waiting: set[Key] = set()

    def standalone(self) -> list[CloudMachine]:
        return [m for k, m in self.vms.items() if k not in self.managed]

    def route(self, req: Request, project: str, zone: str, name: str | None) -> Any:
        def instance_name() -> str:
            check_name(req.body, "resource.name")
            return str(req.body["name"])

        def list_reply(items: list[dict[str, Any]]) -> dict[str, Any]:
            return listing("compute#instanceList", f"projects/{project}/zones/{zone}/instances", items, req.query)

        return MachineCall(req.method, project, zone, name, req.body).answer(self, instance_name, list_reply)

    # ================================================================= insert
    def create_machine(self, project: str, zone: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """instances.insert."""
        core, operations = self.core, self.api.operations
        with core.lock:
            fault = core.record("create", kind_of(body.get("machineType")), name, zone, "instances")
            if fault and not fault.in_operation:
                raise ApiError.of(fault)
            check_body(compute_v1.Instance, body, INSTANCE_FIELDS)
            self._check(project, zone, body)
            vm = (project, zone, name)
            if vm in self.vms:
                raise ApiError(409, "ALREADY_EXISTS", f"The resource '{instance_path(*vm)}' already exists")
            op = operations.new(project, f"zones/{zone}", f"zones/{zone}/instances/{name}", "insert")
            if fault:
                return operations.finish(op, ApiError.of(fault))
            scheduling = body.get("scheduling") or {}
            if scheduling.get("provisioningModel") == "FLEX_START":
                return self._insert_flex(op, project, zone, name, body)
            if core.stocked_out(zone, spot(scheduling), str(body.get("machineType") or "").rpartition("/")[2]):
                return operations.finish(op, capacity_error(project, zone))
            m = self.make(project, zone, name, body)
            self.start(m)
            op["waiting"] = vm
            return copy.deepcopy(op["json"])

    def _insert_flex(
        self, op: dict[str, Any], project: str, zone: str, name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """A flex-start instance: PENDING until its zone's queue wait ends (then it starts), or until its
        requestValidForDuration does first (then its creation fails, as a stockout, and it is gone)."""
        m = self.make(project, zone, name, body, status="PENDING")
        op["waiting"] = key(m)
        waits, wait = self.core.queue_wait(zone, spot=False)
        valid = seconds((body.get("params") or {}).get("requestValidForDuration"))
        if not waits:
            self.start(m)
            return copy.deepcopy(op["json"])
        self.flex_waiting.add(key(m))
        if wait is not None and (valid is None or wait <= valid):
            self.core.later(wait, self._flex_granted, key(m), m.created_at)
        if valid is not None and (wait is None or wait > valid):
            self.core.later(valid, self._flex_expired, key(m), m.created_at)
        return copy.deepcopy(op["json"])

    def _flex_granted(self, vm: Key, created_at: float) -> None:
        with self.core.lock:
            m = self.vms.get(vm)
            if m is not None and m.created_at == created_at and vm in self.flex_waiting:
                self.flex_waiting.discard(vm)
                self.start(m)

    def _flex_expired(self, vm: Key, created_at: float) -> None:
        with self.core.lock:
            m = self.vms.get(vm)
            if m is None or m.created_at != created_at or vm not in self.flex_waiting:
                return
            self.flex_waiting.discard(vm)
            del self.vms[vm]
            self.core.deleted(m)
            self.api.operations.finish_waiting(vm, capacity_error(m.project, m.zone))

    def _check(self, project: str, zone: str, body: dict[str, Any]) -> None:
        check_name(body, "resource.name")
        value = str(body.get("machineType") or "")
        found = _MACHINE_TYPE_URL.fullmatch(value)
        if found is None or found[1] not in (None, project) or found[2] != zone:
            raise invalid(
                f"Invalid value for field 'resource.machineType': '{value}'. "
                f"A machine type URL in zone '{zone}' is required: zones/{zone}/machineTypes/TYPE."
            )
        check_machine_type(found[3], "resource.machineType", value, zone)
        offerings.check_offered(self.core, zone, found[3], "resource.machineType", value, "Machine type")
        for i, accelerator in enumerate(body.get("guestAccelerators") or []):
            url = str(accelerator.get("acceleratorType") or "")
            field_name = f"resource.guestAccelerators[{i}].acceleratorType"
            offerings.check_offered(self.core, zone, url.rpartition("/")[2], field_name, url, "Accelerator type")
        check_properties(body, "resource", found[3])
        scheduling = body.get("scheduling") or {}
        if "requestValidForDuration" in (body.get("params") or {}):
            if scheduling.get("provisioningModel") != "FLEX_START":
                raise invalid(
                    "Invalid value for field 'resource.params.requestValidForDuration': only a FLEX_START "
                    "instance waits for capacity."
                )
            valid = seconds(body["params"]["requestValidForDuration"])
            low, high = FLEX_START_WAIT_S
            if valid is None or not low <= valid <= high:
                raise invalid(
                    f"Invalid value for field 'resource.params.requestValidForDuration': {valid} s. Must be between "
                    f"{low} s and {high} s."
                )
        for policy_url in body.get("resourcePolicies") or []:
            if any(policy_url.endswith(p.path) for p in self.api.kept.policies.values()):
                raise invalid(
                    "Invalid resource usage: 'Resource policy must have one of [VmMaintenancePolicy, "
                    "GroupPlacementPolicy, InstanceSchedulePolicy]'."
                )
            raise invalid("Field 'resource.resourcePolicies' is not supported by the local Compute API.")

    def make(
        self, project: str, zone: str, name: str, body: dict[str, Any], status: str | None = None, chips: int = 0
    ) -> CloudMachine:
        """A new instance record. Called with the lock held."""
        machine_type = str(body.get("machineType") or "").rpartition("/")[2]
        kind = kind_of(machine_type)
        labels = dict(body.get("labels") or {})
        metadata = {i["key"]: i.get("value", "") for i in (body.get("metadata") or {}).get("items", [])}
        first = status or ("PENDING" if kind == TPU else "PROVISIONING")
        tpu = TPU_MACHINE_TYPES.get(machine_type)
        m = CloudMachine(
            kind,
            name,
            zone,
            project,
            labels,
            metadata,
            first,
            time.time(),
            copy.deepcopy(body),
            api="compute",
            workers=(name,),
            chips_per_host=chips or (tpu.chips if tpu else 0),
        )
        self.vms[(project, zone, name)] = m
        self.core.changed()
        return m

    def start(self, m: CloudMachine) -> None:
        """Provision the instance: a TPU VM goes through STAGING halfway, RUNNING after `create_delay_s`."""
        delay = self.core.create_delay_s
        if m.kind == TPU:
            self.core.later(delay / 2, self._progress, key(m), m.created_at, "STAGING")
        self.core.later(delay, self._progress, key(m), m.created_at, "RUNNING")

    def _progress(self, vm: Key, created_at: float, status: str) -> None:
        core = self.core
        with core.lock:
            m = self.vms.get(vm)
            if m is None or m.created_at != created_at or m.state not in CREATING:  # preempted, set meanwhile
                return
            m.state = status
            if status == "RUNNING":
                if vm in self.managed:
                    self.api.migs.refresh(self.api.migs.groups[self.managed[vm]])
                else:
                    core.ready(m)
                self.api.operations.finish_waiting(vm, None)
            core.changed()

    # ================================================================= get, list, delete
    def get_machine(self, project: str, zone: str, name: str) -> dict[str, Any]:
        with self.core.lock:
            m = self.vms.get((project, zone, name))
            self.core.check("get", m.kind if m else "", name, zone, "instances")
            if m is None:
                raise not_found(instance_path(project, zone, name))
            return instance_json(m)

    def list_machines(self, project: str, zone: str) -> list[dict[str, Any]]:
        with self.core.lock:
            self.core.check("list", "", "", zone, "instances")
            return [instance_json(m) for (p, z, _), m in sorted(self.vms.items()) if (p, z) == (project, zone)]

    def delete_machine(self, project: str, zone: str, name: str) -> dict[str, Any]:
        core = self.core
        with core.lock:
            vm = (project, zone, name)
            m = self.vms.get(vm)
            core.check("delete", m.kind if m else "", name, zone, "instances")
            if m is None:
                raise not_found(instance_path(*vm))
            if vm in self.managed:
                raise invalid(
                    f"The local Compute API does not delete '{instance_path(*vm)}' on its own: it belongs to "
                    f"'{self.api.migs.groups[self.managed[vm]].path}'; delete the managed instance group."
                )
            del self.vms[vm]
            self.flex_waiting.discard(vm)
            m.state = "STOPPING"
            self.api.operations.finish_waiting(vm, None)  # an insert still in flight completes
            core.deleted(m)
            return self.api.operations.done(project, f"zones/{zone}", f"zones/{zone}/instances/{name}", "delete")

    # ================================================================= the local cloud's hooks
    def preempt(self, m: CloudMachine) -> CloudMachine:
        """TERMINATED, or deleted when the VM asked for instanceTerminationAction DELETE."""
        self.flex_waiting.discard(key(m))
        if (m.resource.get("scheduling") or {}).get("instanceTerminationAction") == "DELETE":
            del self.vms[key(m)]
            if key(m) not in self.managed:
                self.core.deleted(m)
            return self.set(m, "STOPPING")
        return self.set(m, "TERMINATED")

    def set(self, m: CloudMachine, state: str) -> CloudMachine:
        m.state = state
        self.core.changed()
        return snapshot(m)


def instance_json(m: CloudMachine) -> dict[str, Any]:
    body = copy.deepcopy(m.resource)
    base = f"{COMPUTE}/projects/{m.project}/zones/{m.zone}"
    machine_type = str(body.get("machineType") or "").rpartition("/")[2]
    body.update(
        kind="compute#instance",
        id=vm_id(m),
        name=m.name,
        zone=base,
        machineType=f"{base}/machineTypes/{machine_type}",
        status=m.state,
        labels=dict(m.labels),
        creationTimestamp=rfc3339(m.created_at),
        selfLink=f"{base}/instances/{m.name}",
    )
    body.setdefault("metadata", {})["fingerprint"] = "bG9jYWw="
    return body
