"""The local Compute API's managed instance groups: zonal MIGs, a TPU slice's (or a GPU group's) VMs.

  zones/Z/instanceGroupManagers[/M]                       insert, get, list, delete                zone op
  zones/Z/instanceGroupManagers/M/listManagedInstances    POST
  zones/Z/instanceGroupManagers/M/resize?size=N           POST                                     zone op

A MIG (BULK for a flex-start or reservation-bound template only, else in the default mode) creates its `targetSize`
VMs (`BASE-xxxx`) all at once, each with metadata `agent-worker-number` and `worker-network-endpoints`; in a zone
that does not offer the template's machine or GPU type it makes none and says why in `status.bulkInstanceOperation`
(`lastProgressCheck.error`, a refused instance create's words), trying on as a real MIG does. In a zone without
capacity it waits, as `status.bulkInstanceOperation` says (`inProgress`, `lastProgressCheck.error`
ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS), or, with `bulk_stockout="fail"`, its insert operation fails.
`status.appliedAcceleratorTopologies[0].state` is INCOMPLETE while VMs provision, ACTIVE when all run, DEACTIVATING
then INCOMPLETE once one is lost: a slice MIG (defaultActionOnFailure DO_NOTHING) repairs nothing. To the local
cloud a MIG is one machine.
"""

from __future__ import annotations

import copy
import functools
import math
import random
import re
import string
import time
from typing import Any

from google.cloud import compute_v1

from localcloud.apis import offerings
from localcloud.apis.apicore import ApiError, invalid
from localcloud.apis.compute import mig_views
from localcloud.apis.compute.checks import MIG_FIELDS, check_body, check_name
from localcloud.apis.compute.common import (
    COMPUTE,
    Key,
    Request,
    already_exists,
    capacity_error,
    capacity_wait,
    create_fault,
    key,
    kind_of,
    listing,
    not_found,
    spot,
)
from localcloud.apis.compute.instances import Instances
from localcloud.apis.compute.operations import Operations
from localcloud.apis.compute.state import ComputeState, Mig, ResourcePolicy, Template
from localcloud.apis.compute.templates import TEMPLATE_URL, TemplatesAndPolicies
from localcloud.apis.offerings import TPU_MACHINE_TYPES

_MIG_KEYS = frozenset({"instance-template", "created-by", "agent-worker-number", "worker-network-endpoints"})


class Migs:
    """The MIGs of the state (`migs`), their VMs made by `instances` from the templates `kept` holds.
    `bulk_models`, `bulk_stockout`: see ComputeApi."""

    def __init__(
        self,
        state: ComputeState,
        operations: Operations,
        instances: Instances,
        kept: TemplatesAndPolicies,
        bulk_models: frozenset[str] | None,
        bulk_stockout: str,
    ) -> None:
        if bulk_stockout not in ("wait", "fail"):
            raise ValueError(f"bulk_stockout: {bulk_stockout!r} is not allowed; allowed: wait, fail")
        self.state, self.core, self.operations = state, state.core, operations
        self.instances, self.kept = instances, kept
        self.bulk_models, self.bulk_stockout = bulk_models, bulk_stockout

    def route(self, req: Request, project: str, zone: str, name: str | None, action: str | None) -> Any:
        state = self.state
        if action == "listManagedInstances" and req.method == "POST" and name:
            with self.core.lock:
                mig = self.get("get", project, zone, name)
                return {"managedInstances": [mig_views.managed_json(mig, vm, state) for vm in mig.vms]}
        if action == "resize" and req.method == "POST" and name:
            return self.resize(project, zone, name, req.query.get("size"))
        if action:
            return None
        if req.method == "POST" and not name:
            return self.insert(project, zone, req.body)
        if req.method == "GET" and name:
            with self.core.lock:
                return mig_views.mig_json(self.get("get", project, zone, name), state)
        if req.method == "GET":
            with self.core.lock:
                self.core.check("list", "", "", zone, "instanceGroupManagers")
                items = [
                    mig_views.mig_json(g, state) for k, g in sorted(state.migs.items()) if k[:2] == (project, zone)
                ]
            path = f"projects/{project}/zones/{zone}/instanceGroupManagers"
            return listing("compute#instanceGroupManagerList", path, items, req.query)
        if req.method == "DELETE" and name:
            return self.delete(project, zone, name)
        return None

    # ================================================================= insert, grow
    def insert(self, project: str, zone: str, body: dict[str, Any]) -> dict[str, Any]:
        core, operations, kept = self.core, self.operations, self.kept
        with core.lock:
            name = str(body.get("name") or "")
            template = kept.referenced_template(project, body.get("instanceTemplate"))
            kind = kind_of(template.machine_type if template else None)
            fault = create_fault(core, kind, name, zone, "instanceGroupManagers")
            check_body(compute_v1.InstanceGroupManager, body, MIG_FIELDS)
            check_name(body, "resource.name")
            mig_key = (project, zone, name)
            if mig_key in self.state.migs:  # before the checks that look at other resources: a redelivered insert
                raise already_exists(f"projects/{project}/zones/{zone}/instanceGroupManagers/{name}")
            base = str(body.get("baseInstanceName") or "")
            if not re.fullmatch(r"[a-z][-a-z0-9]{0,57}", base):
                raise invalid(
                    f"Invalid value for field 'resource.baseInstanceName': '{base}'. Must be a lowercase letter "
                    "followed by up to 57 lowercase letters, digits or hyphens."
                )
            url = str(body.get("instanceTemplate") or "")
            if not TEMPLATE_URL.fullmatch(url):
                raise invalid(
                    f"Invalid value for field 'resource.instanceTemplate': '{url}'. A global instance template URL "
                    "is required: projects/PROJECT/global/instanceTemplates/NAME."
                )
            if template is None:
                raise not_found(url.removeprefix(f"{COMPUTE}/"))
            policy = kept.referenced_policy(project, zone, body)
            check_mig(body, template, policy, self.bulk_models)
            target = body.get("targetSize", 0)
            if not isinstance(target, int) or target < 0:
                raise invalid(f"Invalid value for field 'resource.targetSize': '{target}'. Must be 0 or more.")
            check_topology_holds(policy, template, target, "resource.targetSize")
            op = operations.new(project, f"zones/{zone}", f"zones/{zone}/instanceGroupManagers/{name}", "insert")
            if fault:
                return operations.finish(op, ApiError.of(fault))
            if target and self._stockout_fails(template, zone):
                return operations.finish(op, capacity_error(project, zone))
            mig = Mig(project, zone, name, copy.deepcopy(body), core.next_id(), time.time(), template, policy)
            mig.topology_at = mig.created_at
            self.state.migs[mig_key] = mig
            if target:
                self.grow(mig, target)
            return operations.finish(op, None)

    def add(self, mig: Mig, n: int) -> list[str]:
        """Add `n` managed instances, to be created all at once; their names. Called with the lock held."""
        names = [self._new_vm_name(mig) for _ in range(n)]
        mig.vms.extend(names)
        mig.bulk_in_progress = True
        mig.serial = self.core.next_id()
        self.refresh(mig)
        return names

    def _stockout_fails(self, template: Template, zone: str) -> bool:
        """Whether an insert or resize operation fails on a stockout now (bulk_stockout "fail"; not flex-start)."""
        fails = self.bulk_stockout == "fail" and not _flex(template)
        return fails and self.core.stocked_out(zone, _spot(template), template.machine_type)

    def _unoffered(self, mig: Mig) -> dict[str, Any] | None:
        """Why the MIG's zone cannot make its VMs, as a refused instance create says it, or None: the template's
        machine type or a GPU type that the zone does not offer. Called with the lock held."""
        zone, properties = mig.zone, mig.template.body["properties"]
        asked = [("resource.machineType", "machineTypes", mig.template.machine_type, "Machine type")]
        for i, accelerator in enumerate(properties.get("guestAccelerators") or []):
            name = str(accelerator.get("acceleratorType") or "").rpartition("/")[2]
            field_name = f"resource.guestAccelerators[{i}].acceleratorType"
            asked.append((field_name, "acceleratorTypes", name, "Accelerator type"))
        for field_name, collection, name, kind in asked:
            try:
                offerings.check_offered(self.core, zone, name, field_name, f"zones/{zone}/{collection}/{name}", kind)
            except ApiError as e:
                return {"errors": [{"code": "INVALID_FIELD_VALUE", "message": e.message}]}
        return None

    def grow(self, mig: Mig, n: int) -> None:
        """Add `n` managed instances and create them all at once when the zone has capacity: at once, after the
        zone's queue wait, or never (until deleted). A FLEX_START template waits only for `queue_waits`; others
        meet stockouts and capacity first (unless `_stockout_fails` did), then wait like a queued request. Called
        with the lock held."""
        names = self.add(mig, n)
        refused = self._unoffered(mig)
        if refused is not None:  # the zone does not offer its type: no VM is ever made, and the MIG says why
            mig.progress_error = refused
            return
        spot = _spot(mig.template)
        if _flex(mig.template):
            waits, wait = self.core.queue_wait(mig.zone, spot=False)
        elif self.bulk_stockout == "wait" and self.core.stocked_out(mig.zone, spot, mig.template.machine_type):
            queued, wait = self.core.queue_wait(mig.zone, spot)
            waits, wait = True, wait if queued else None  # no queue wait set: until deleted
        else:
            waits, wait = False, 0.0
        if not waits:
            self.create_vms(mig, names)
            return
        mig.progress_error = capacity_wait(mig.project, mig.zone)  # its bulk operation's last check says why
        if wait is not None:
            self.core.later(wait, self._capacity_came, mig.key, mig.serial, names)

    def _capacity_came(self, mig_key: Key, serial: int, names: list[str]) -> None:
        with self.core.lock:
            mig = self.state.migs.get(mig_key)
            if mig is not None and mig.serial == serial:
                self.create_vms(mig, [n for n in names if n in mig.vms])

    def create_vms(self, mig: Mig, names: list[str]) -> None:
        """Create the managed instances `names` at once, from the template, each knowing its worker number and
        its peers. Called with the lock held."""
        properties = mig.template.body["properties"]
        machine_type = mig.template.machine_type
        tpu = TPU_MACHINE_TYPES.get(machine_type)
        mig.progress_error = None
        for name in names:
            body = copy.deepcopy(properties)
            body["name"] = name
            body["machineType"] = f"zones/{mig.zone}/machineTypes/{machine_type}"
            items = [i for i in (body.get("metadata") or {}).get("items", []) if i.get("key") not in _MIG_KEYS]
            items += [
                {"key": "instance-template", "value": mig.template.path},
                {"key": "created-by", "value": mig.path},
                {"key": "agent-worker-number", "value": str(mig.vms.index(name))},
                {"key": "worker-network-endpoints", "value": ",".join(mig.vms)},
            ]
            body["metadata"] = {**(body.get("metadata") or {}), "items": items}
            m = self.instances.make(mig.project, mig.zone, name, body, chips=tpu.chips if tpu else 0)
            self.state.managed[key(m)] = mig.key
            self.instances.start(m, functools.partial(self.refresh, mig))
        self.refresh(mig)

    def refresh(self, mig: Mig) -> None:
        """The topology state after a VM changed: ACTIVE when every VM runs (on_ready the first time), else
        DEACTIVATING (for a while, after ACTIVE) then INCOMPLETE. Called with the lock held."""
        vms = [self.state.vms.get((mig.project, mig.zone, n)) for n in mig.vms]
        running = bool(vms) and all(m is not None and m.state == "RUNNING" for m in vms)
        before = mig.topology_state
        if running:
            mig.bulk_in_progress, mig.progress_error = False, None
            mig.topology_state = "ACTIVE"
            if not mig.ready_sent:
                mig.ready_sent = True
                self.core.ready(mig_views.slice_of(mig))
        elif before in ("ACTIVE", "DEACTIVATING"):
            mig.topology_state = "DEACTIVATING"
            if before == "ACTIVE":
                self.core.later(self.core.create_delay_s, self._deactivated, mig.key, mig.id)
        else:
            mig.topology_state = "INCOMPLETE"
        if mig.topology_state != before:
            mig.topology_at = time.time()
        self.core.changed()

    def _deactivated(self, mig_key: Key, mig_id: int) -> None:
        with self.core.lock:
            mig = self.state.migs.get(mig_key)
            if mig is not None and mig.id == mig_id and mig.topology_state == "DEACTIVATING":
                mig.topology_state, mig.topology_at = "INCOMPLETE", time.time()
                self.core.changed()

    # ================================================================= get, delete, resize
    def get(self, verb: str, project: str, zone: str, name: str, collection: str = "instanceGroupManagers") -> Mig:
        mig = self.state.migs.get((project, zone, name))
        self.core.check(verb, kind_of(mig.template.machine_type) if mig else "", name, zone, collection)
        if mig is None:
            raise not_found(f"projects/{project}/zones/{zone}/instanceGroupManagers/{name}")
        return mig

    def delete(self, project: str, zone: str, name: str) -> dict[str, Any]:
        """Delete the MIG and its VMs; to the local cloud, the slice is deleted."""
        core = self.core
        with core.lock:
            mig = self.get("delete", project, zone, name)
            del self.state.migs[(project, zone, name)]
            self._drop_vms(mig)
            slice_ = mig_views.slice_of(mig)
            core.deleted(slice_)
            mig.deleted_at = slice_.deleted_at
            target = f"zones/{zone}/instanceGroupManagers/{name}"
            return self.operations.done(project, f"zones/{zone}", target, "delete")

    def resize(self, project: str, zone: str, name: str, size: str | None) -> dict[str, Any]:
        """instanceGroupManagers.resize of a BULK MIG: from 0 to the full size at once, or back to 0."""
        core, operations = self.core, self.operations
        with core.lock:
            mig = self.get("resize", project, zone, name)
            if size is None or not size.isdigit():
                raise invalid(f"Invalid value for field 'size': '{size}'. Must be 0 or more.")
            new = int(size)
            if new and mig.target_size and new != mig.target_size:
                raise invalid(
                    f"A MIG in bulk mode grows only from 0 and shrinks only to 0: '{mig.path}' has targetSize "
                    f"{mig.target_size}."
                )
            check_topology_holds(mig.policy, mig.template, new, "size")
            op = operations.new(project, f"zones/{zone}", f"zones/{zone}/instanceGroupManagers/{name}", "resize")
            if new == mig.target_size:
                return operations.finish(op, None)
            if new == 0:
                self._drop_vms(mig)
                mig.vms, mig.bulk_in_progress, mig.progress_error = [], False, None
                mig.serial = core.next_id()
                self.refresh(mig)
                return operations.finish(op, None)
            if self._stockout_fails(mig.template, zone):
                return operations.finish(op, capacity_error(project, zone))
            self.grow(mig, new)
            return operations.finish(op, None)

    def _drop_vms(self, mig: Mig) -> None:
        for vm in mig.vms:
            self.state.managed.pop((mig.project, mig.zone, vm), None)
            self.state.vms.pop((mig.project, mig.zone, vm), None)

    def _new_vm_name(self, mig: Mig) -> str:
        """BASE-xxxx, four random lowercase letters or digits, as a MIG names its VMs; unique in the zone."""
        base = str(mig.body["baseInstanceName"])
        while True:
            name = f"{base}-{''.join(random.choices(string.ascii_lowercase + string.digits, k=4))}"
            if name not in mig.vms and (mig.project, mig.zone, name) not in self.state.vms:
                return name


# "Bulk mode in MIGs is only supported with instance templates that specify either a reservation-bound or flex-start
# provisioning model" (compute/docs/instance-groups/bulk-create-instances-in-mig): the local API's default.
BULK_MODELS = frozenset({"FLEX_START", "RESERVATION_BOUND"})


def check_mig(
    body: dict[str, Any], template: Template, policy: ResourcePolicy | None, bulk_models: frozenset[str] | None
) -> None:
    """BULK takes only `bulk_models` (by default BULK_MODELS, the bulk-mode page's) and a MIG of any other model is
    INDIVIDUAL (the default mode, unset or named), as a Spot or standard slice's is; the local API creates an
    INDIVIDUAL MIG's VMs as it does a BULK one's. `bulk_models` None: every MIG is BULK instead (a user's bring-up
    of a v6e slice MIG: "MIGs with TPU accelerator topology require BULK mode"), a reading no Google page states."""
    mode = (body.get("targetSizePolicy") or {}).get("mode")
    model = (template.body["properties"].get("scheduling") or {}).get("provisioningModel") or "STANDARD"
    if bulk_models is None and policy is not None and policy.topology and mode != "BULK":
        raise invalid("MIGs with TPU accelerator topology require BULK mode in target size policy")
    if bulk_models is None and mode != "BULK":
        raise invalid(
            f"Invalid value for field 'resource.targetSizePolicy.mode': '{mode}'. The local Compute API "
            "serves BULK MIGs only (all VMs created at once)."
        )
    if bulk_models is not None and mode == "BULK" and model not in bulk_models:
        allowed = ", ".join(sorted(bulk_models))
        raise invalid(
            f"Invalid value for field 'resource.targetSizePolicy.mode': 'BULK'. Bulk mode supports instance "
            f"templates with provisioning model {allowed}; '{template.path}' has {model}."
        )
    if bulk_models is not None and mode != "BULK" and model in bulk_models:
        raise invalid(
            f"Invalid value for field 'resource.targetSizePolicy.mode': '{mode or 'INDIVIDUAL'}'. Instance "
            f"templates with provisioning model {model} need BULK mode."
        )
    action = (body.get("instanceLifecyclePolicy") or {}).get("defaultActionOnFailure")
    if action != "DO_NOTHING":
        raise invalid(
            f"Invalid value for field 'resource.instanceLifecyclePolicy.defaultActionOnFailure': '{action}'. "
            "The local Compute API repairs no VM: DO_NOTHING is required."
        )
    if policy is not None and policy.topology and template.machine_type not in TPU_MACHINE_TYPES:
        raise invalid(
            f"Invalid value for field 'resource.resourcePolicies.workloadPolicy': '{policy.path}'. An "
            f"accelerator topology needs a TPU machine type; '{template.path}' has {template.machine_type}."
        )


def check_topology_holds(policy: ResourcePolicy | None, template: Template, vms: int, field_name: str) -> None:
    """A slice's topology holds exactly its VMs' chips: the product of its dimensions = VMs x chips per VM, in
    as many dimensions as the generation's slices have (v6e AxB, v5p and TPU7x AxBxC). 0 VMs wait for more."""
    tpu = TPU_MACHINE_TYPES.get(template.machine_type)
    if policy is None or not policy.topology or tpu is None or vms == 0:
        return
    dims = [int(d) for d in policy.topology.split("x")]
    if len(dims) != tpu.topology_dims:
        shape = "AxB" if tpu.topology_dims == 2 else "AxBxC"
        raise invalid(
            f"Invalid value for field '{field_name}': {tpu.generation} slices have an {shape} topology; "
            f"'{policy.path}' has {policy.topology}."
        )
    if math.prod(dims) != vms * tpu.chips:
        raise invalid(
            f"Invalid value for field '{field_name}': {vms}. The accelerator topology {policy.topology} of "
            f"'{policy.path}' has {math.prod(dims)} chips; {vms} VMs of {template.machine_type} have "
            f"{vms * tpu.chips}."
        )


def _spot(template: Template) -> bool:
    return spot(template.body["properties"].get("scheduling") or {})


def _flex(template: Template) -> bool:
    return (template.body["properties"].get("scheduling") or {}).get("provisioningModel") == "FLEX_START"
