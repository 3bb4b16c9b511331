"""The local Compute API's instances: GPU VMs, TPU VMs, and the VMs of a MIG.

  zones/Z/instances[/N]                                   insert, get, list (`filter`), delete     zone op
  zones/Z/instances/N/setMetadata                         POST                                     zone op

A GPU VM goes PROVISIONING -> RUNNING, a TPU VM PENDING -> STAGING -> RUNNING, in `create_delay_s`; the insert
operation is done then. A stockout ends the insert operation with ZONE_RESOURCE_POOL_EXHAUSTED; a flex-start
instance instead waits PENDING for its zone's `queue_waits` (failing so when its requestValidForDuration ends first).

`setMetadata` replaces an instance's metadata (a MIG's VM's too) when the request's fingerprint is the instance's
current `metadata.fingerprint`, which changes with every write; a stale or missing one is refused with 412
conditionNotMet, as the Metadata schema's `fingerprint` says (compute.v1 discovery document;
https://cloud.google.com/compute/docs/reference/rest/v1/instances/setMetadata). The new metadata reaches the
instance's running VM's metadata server (CloudCore.metadata_written).
"""

from __future__ import annotations

import base64
import copy
import functools
import hashlib
import json
import re
import time
from collections.abc import Callable
from typing import Any

from google.cloud import compute_v1

from localcloud.apis import offerings
from localcloud.apis.apicore import TPU, ApiError, CloudMachine, MachineCall, invalid, rfc3339, snapshot
from localcloud.apis.compute.checks import (
    FLEX_START_WAIT_S,
    INSTANCE_FIELDS,
    METADATA_FIELDS,
    check_body,
    check_metadata_items,
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
    create_fault,
    instance_path,
    key,
    kind_of,
    listing,
    not_found,
    spot,
    vm_id,
)
from localcloud.apis.compute.operations import Operations
from localcloud.apis.compute.state import ComputeState

_MACHINE_TYPE_URL = re.compile(rf"(?:(?:{re.escape(COMPUTE)}/)?projects/([^/]+)/)?zones/([^/]+)/machineTypes/([^/]+)")


class Instances:
    """The VMs of the state (`vms`): standalone instances and, made and started for their MIG, a MIG's VMs."""

    def __init__(self, state: ComputeState, operations: Operations) -> None:
        self.state, self.core, self.operations = state, state.core, operations

    def route(self, req: Request, project: str, zone: str, name: str | None, action: str | None = None) -> Any:
        if action == "setMetadata":
            return self.set_metadata(project, zone, str(name), req.body) if req.method == "POST" else None

        def instance_name() -> str:
            check_name(req.body, "resource.name")
            return str(req.body["name"])

        def list_reply(items: list[dict[str, Any]]) -> dict[str, Any]:
            return listing("compute#instanceList", f"projects/{project}/zones/{zone}/instances", items, req.query)

        return MachineCall(req.method, project, zone, name, req.body).answer(self, instance_name, list_reply)

    # ================================================================= insert
    def create_machine(self, project: str, zone: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """instances.insert."""
        core, operations = self.core, self.operations
        with core.lock:
            fault = create_fault(core, kind_of(body.get("machineType")), name, zone, "instances")
            check_body(compute_v1.Instance, body, INSTANCE_FIELDS)
            self._check(project, zone, body)
            vm = (project, zone, name)
            if vm in self.state.vms:
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
        self.state.flex_waiting.add(key(m))
        if wait is not None and (valid is None or wait <= valid):
            self.core.later(wait, self._flex_granted, key(m), m.created_at)
        if valid is not None and (wait is None or wait > valid):
            self.core.later(valid, self._flex_expired, key(m), m.created_at)
        return copy.deepcopy(op["json"])

    def _flex_granted(self, vm: Key, created_at: float) -> None:
        with self.core.lock:
            m = self.state.vms.get(vm)
            if m is not None and m.created_at == created_at and vm in self.state.flex_waiting:
                self.state.flex_waiting.discard(vm)
                self.start(m)

    def _flex_expired(self, vm: Key, created_at: float) -> None:
        with self.core.lock:
            m = self.state.vms.get(vm)
            if m is None or m.created_at != created_at or vm not in self.state.flex_waiting:
                return
            self.state.flex_waiting.discard(vm)
            del self.state.vms[vm]
            self.core.deleted(m)
            self.operations.finish_waiting(vm, capacity_error(m.project, m.zone))

    def _check(self, project: str, zone: str, body: dict[str, Any]) -> None:
        check_name(body, "resource.name")
        value = str(body.get("machineType") or "")
        found = _MACHINE_TYPE_URL.fullmatch(value)
        if found is None or found[1] not in (None, project) or found[2] != zone:
            raise invalid(
                f"Invalid value for field 'resource.machineType': '{value}'. "
                f"A machine type URL in zone '{zone}' is required: zones/{zone}/machineTypes/TYPE."
            )
        offerings.check_offered(self.core, zone, found[3], "resource.machineType", value)
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
            if any(policy_url.endswith(p.path) for p in self.state.policies.values()):
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
        tpu = offerings.TPU_MACHINE_TYPES.get(machine_type)
        m = CloudMachine(
            kind,
            name,
            zone,
            project,
            labels,
            metadata,
            first,
            time.time(),
            _without_fingerprint(body),
            api="compute",
            workers=(name,),
            chips_per_host=chips or (tpu.chips if tpu else 0),
        )
        self.state.vms[(project, zone, name)] = m
        self.core.changed()
        return m

    def start(self, m: CloudMachine, running: Callable[[], None] | None = None) -> None:
        """Provision the instance: a TPU VM goes through STAGING halfway, RUNNING after `create_delay_s`. Then
        `running` is called (a MIG's VM: the MIG looks at its VMs again); without it the local cloud hears that the
        instance is ready."""
        delay, then = self.core.create_delay_s, running or functools.partial(self.core.ready, m)
        if m.kind == TPU:
            self.core.later(delay / 2, self._progress, key(m), m.created_at, "STAGING", then)
        self.core.later(delay, self._progress, key(m), m.created_at, "RUNNING", then)

    def _progress(self, vm: Key, created_at: float, status: str, running: Callable[[], None]) -> None:
        core = self.core
        with core.lock:
            m = self.state.vms.get(vm)
            if m is None or m.created_at != created_at or m.state not in CREATING:  # preempted, set meanwhile
                return
            m.state = status
            if status == "RUNNING":
                running()
                self.operations.finish_waiting(vm, None)
            core.changed()

    # ================================================================= get, list, delete
    def get_machine(self, project: str, zone: str, name: str) -> dict[str, Any]:
        with self.core.lock:
            m = self.state.vms.get((project, zone, name))
            self.core.check("get", m.kind if m else "", name, zone, "instances")
            if m is None:
                raise not_found(instance_path(project, zone, name))
            return instance_json(m)

    def list_machines(self, project: str, zone: str) -> list[dict[str, Any]]:
        with self.core.lock:
            self.core.check("list", "", "", zone, "instances")
            return [instance_json(m) for (p, z, _), m in sorted(self.state.vms.items()) if (p, z) == (project, zone)]

    def delete_machine(self, project: str, zone: str, name: str) -> dict[str, Any]:
        core = self.core
        with core.lock:
            vm = (project, zone, name)
            m = self.state.vms.get(vm)
            core.check("delete", m.kind if m else "", name, zone, "instances")
            if m is None:
                raise not_found(instance_path(*vm))
            if vm in self.state.managed:
                raise invalid(
                    f"The local Compute API does not delete '{instance_path(*vm)}' on its own: it belongs to "
                    f"'{self.state.migs[self.state.managed[vm]].path}'; delete the managed instance group."
                )
            del self.state.vms[vm]
            self.state.flex_waiting.discard(vm)
            m.state = "STOPPING"
            self.operations.finish_waiting(vm, None)  # an insert still in flight completes
            core.deleted(m)
            return self.operations.done(project, f"zones/{zone}", f"zones/{zone}/instances/{name}", "delete")

    # ================================================================= setMetadata
    def set_metadata(self, project: str, zone: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """instances.setMetadata: the instance's metadata becomes `body`'s items, if its fingerprint is current."""
        core = self.core
        with core.lock:
            vm = (project, zone, name)
            m = self.state.vms.get(vm)
            core.check("update", m.kind if m else "", name, zone, "instances")
            check_body(compute_v1.Metadata, body, METADATA_FIELDS)
            items = check_metadata_items(body.get("items") or [])
            if m is None:
                raise not_found(instance_path(*vm))
            current = metadata_json(m)["fingerprint"]
            if body.get("fingerprint") != current:
                raise ApiError(
                    412,
                    "FAILED_PRECONDITION",
                    "Supplied fingerprint does not match current metadata fingerprint.",
                    "conditionNotMet",
                )
            m.metadata = items
            fingerprint = base64.b64encode(hashlib.sha256(f"{current}:{core.next_id()}".encode()).digest()[:8])
            kept = {"items": [{"key": k, "value": v} for k, v in items.items()], "fingerprint": fingerprint.decode()}
            m.resource = {**m.resource, "metadata": kept}  # a new dict: snapshots handed out share the old one
            core.metadata_written(m)
            core.changed()
            return self.operations.done(project, f"zones/{zone}", f"zones/{zone}/instances/{name}", "setMetadata")

    # ================================================================= the local cloud's hooks
    def preempt(self, m: CloudMachine) -> CloudMachine:
        """TERMINATED, or deleted when the VM asked for instanceTerminationAction DELETE."""
        self.state.flex_waiting.discard(key(m))
        if (m.resource.get("scheduling") or {}).get("instanceTerminationAction") == "DELETE":
            del self.state.vms[key(m)]
            if key(m) not in self.state.managed:
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
    body["metadata"] = metadata_json(m)
    return body


def _without_fingerprint(body: dict[str, Any]) -> dict[str, Any]:
    """An insert body as the instance keeps it: a metadata fingerprint sent with it is output only, ignored."""
    kept = copy.deepcopy(body)
    if isinstance(kept.get("metadata"), dict):
        kept["metadata"].pop("fingerprint", None)
    return kept


def metadata_json(m: CloudMachine) -> dict[str, Any]:
    """An instance's Metadata: its items and their fingerprint (the one its last setMetadata made, or, never
    written, a hash of the metadata it was created with)."""
    items = [{"key": k, "value": v} for k, v in m.metadata.items()]
    fingerprint = (m.resource.get("metadata") or {}).get("fingerprint")
    if not fingerprint:
        made = json.dumps([m.name, m.created_at, items]).encode()
        fingerprint = base64.b64encode(hashlib.sha256(made).digest()[:8]).decode()
    return {"kind": "compute#metadata", "fingerprint": fingerprint, "items": items}
