"""The local Compute API's managed instance groups: zonal BULK MIGs, a TPU slice's (or a GPU group's) VMs.

  zones/Z/instanceGroupManagers[/M]                       insert, get, list, delete                zone op
  zones/Z/instanceGroupManagers/M/listManagedInstances    POST
  zones/Z/instanceGroupManagers/M/resize?size=N           POST                                     zone op

A MIG is BULK: it creates its `targetSize` VMs (`BASE-xxxx`) all at once, each with metadata `agent-worker-number`
and `worker-network-endpoints`. In a zone without capacity it waits, as `status.bulkInstanceOperation` says
(`inProgress`, `lastProgressCheck.error` ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS), or, with
`bulk_stockout="fail"`, its insert operation fails. `status.appliedAcceleratorTopologies[0].state` is INCOMPLETE
while VMs provision, ACTIVE when all run, DEACTIVATING then INCOMPLETE once one is lost: a slice MIG
(defaultActionOnFailure DO_NOTHING) repairs nothing. To the local cloud a MIG is one machine.
"""

from __future__ import annotations

import copy
import math
import random
import re
import string
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from google.cloud import compute_v1

from localcloud.apis import offerings
from localcloud.apis.apicore import ApiError, invalid
from localcloud.apis.compute import mig_views
from localcloud.apis.compute.checks import MIG_FIELDS, TPU_MACHINE_TYPES, check_body, check_name
from localcloud.apis.compute.common import (
    COMPUTE,
    Key,
    Request,
    already_exists,
    capacity_error,
    capacity_wait,
    key,
    kind_of,
    listing,
    not_found,
    spot,
)
from localcloud.apis.compute.templates import TEMPLATE_URL, Kept, ResourcePolicy, Template

if TYPE_CHECKING:
    from localcloud.apis.compute.api import ComputeApi
    from localcloud.apis.compute.resize_requests import ResizeRequest

_MIG_KEYS = frozenset({"instance-template", "created-by", "agent-worker-number", "worker-network-endpoints"})


@dataclass
class Mig:
    """A zonal BULK managed instance group: `vms` are its managed instances in worker order (those not yet
    created wait for capacity); to the local cloud the whole group is one machine."""

    project: str
    zone: str
    name: str
    body: dict[str, Any]
    id: int
    created_at: float
    template: Template
    policy: ResourcePolicy | None
    vms: list[str] = field(default_factory=list)
    bulk_in_progress: bool = False
    progress_error: dict[str, Any] | None = None  # lastProgressCheck.error while waiting for capacity
    topology_state: str = "INCOMPLETE"
    topology_at: float = 0.0
    ready_sent: bool = False
    deleted_at: float | None = None
    resize_requests: dict[str, ResizeRequest] = field(default_factory=dict)
    serial: int = 0  # a capacity timer acts only on the wait it was set for

    @property
    def path(self) -> str:
        return f"projects/{self.project}/zones/{self.zone}/instanceGroupManagers/{self.name}"

    @property
    def key(self) -> Key:
        return (self.project, self.zone, self.name)

    @property
    def target_size(self) -> int:
        return len(self.vms)


class Migs:
    """The MIGs by (project, zone, name). `bulk_models`, `bulk_stockout`: see ComputeApi."""

    def __init__(self, api: ComputeApi, bulk_models: frozenset[str] | None, bulk_stockout: str) -> None:
        if bulk_stockout not in ("wait", "fail"):
            raise ValueError(f"bulk_stockout: {bulk_stockout!r} is not allowed; allowed: wait, fail")
        self.api = api
        self.core = api.core
        self.bulk_models = bulk_models
        self.bulk_stockout = bulk_stockout
        self.groups: dict[Key, Mig] = {}

    def named(self, name: str) -> Mig | None:
        return next((mig for mig in self.groups.values() if mig.name == name), None)

    def users(self, kept: Kept) -> list[str]:
        """The MIGs that use a template or policy."""
        return [mig.path for mig in self.groups.values() if mig.template is kept or mig.policy is kept]

    def route(self, req: Request, project: str, zone: str, name: str | None, action: str | None) -> Any:
        instances = self.api.instances
        if action == "listManagedInstances" and req.method == "POST" and name:
            with self.core.lock:
                mig = self.get("get", project, zone, name)
                return {"managedInstances": [mig_views.managed_json(mig, vm, instances) for vm in mig.vms]}
        if action == "resize" and req.method == "POST" and name:
            return self.resize(project, zone, name, req.query.get("size"))
        if action:
            return None
        if req.method == "POST" and not name:
            return self.insert(project, zone, req.body)
        if req.method == "GET" and name:
            with self.core.lock:
                return mig_views.mig_json(self.get("get", project, zone, name), instances)
        if req.method == "GET":
            with self.core.lock:
                self.core.check("list", "", "", zone, "instanceGroupManagers")
                items = [
                    mig_views.mig_json(g, instances) for k, g in sorted(self.groups.items()) if k[:2] == (project, zone)
                ]
            path = f"projects/{project}/zones/{zone}/instanceGroupManagers"
            return listing("compute#instanceGroupManagerList", path, items, req.query)
        if req.method == "DELETE" and name:
            return self.delete(project, zone, name)
        return None

    # ================================================================= insert, grow
    def insert(self, project: str, zone: str, body: dict[str, Any]) -> dict[str, Any]:
        core, operations, kept = self.core, self.api.operations, self.api.kept
        with core.lock:
            name = str(body.get("name") or "")
            template = kept.referenced_template(project, body.get("instanceTemplate"))
            fault = core.record(
                "create", kind_of(template.machine_type if template else None), name, zone, "instanceGroupManagers"
            )
            if fault and not fault.in_operation:
                raise ApiError.of(fault)
            check_body(compute_v1.InstanceGroupManager, body, MIG_FIELDS)
            check_name(body, "resource.name")
            mig_key = (project, zone, name)
            if mig_key in self.groups:  # before the checks that look at other resources: a redelivered insert
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
            offerings.check_offered(core, zone, template.machine_type, "resource.instanceTemplate", url, "Machine type")
            target = body.get("targetSize", 0)
            if not isinstance(target, int) or target < 0:
                raise invalid(f"Invalid value for field 'resource.targetSize': '{target}'. Must be 0 or more.")
            check_topology_holds(policy, template, target, "resource.targetSize")
            op = operations.new(project, f"zones/{zone}", f"zones/{zone}/instanceGroupManagers/{name}", "insert")
            if fault:
                return operations.finish(op, ApiError.of(fault))
            stockout_fails = self.bulk_stockout == "fail" and not _flex(template)
            if target and stockout_fails and core.stocked_out(zone, _spot(template), template.machine_type):
                return operations.finish(op, capacity_error(project, zone))
            mig = Mig(project, zone, name, copy.deepcopy(body), core.next_id(), time.time(), template, policy)
            mig.topology_at = mig.created_at
            self.groups[mig_key] = mig
            if target:
                self.grow(mig, target, stocked_checked=self.bulk_stockout == "fail")
            return operations.finish(op, None)

    def grow(self, mig: Mig, n: int, request: ResizeRequest | None = None, stocked_checked: bool = False) -> None:
        """Add `n` managed instances and create them all at once when the zone has capacity: at once, after the
        zone's queue wait, or never (until deleted). Flex-start (a FLEX_START template or a resize request) waits
        only for `queue_waits`; others meet stockouts and capacity first, and then wait like a queued request.
        Called with the lock held."""
        names = [self._new_vm_name(mig) for _ in range(n)]
        mig.vms.extend(names)
        if request is not None:
            request.names = names
        mig.bulk_in_progress = True
        mig.serial = self.core.next_id()
        self.refresh(mig)
        if request is not None:  # accepted next, then waits for capacity
            self.core.later(0, self.api.resize_requests.accept, mig.key, request.name, request.id)
            return
        spot = _spot(mig.template)
        if _flex(mig.template):
            waits, wait = self.core.queue_wait(mig.zone, spot=False)
        elif not stocked_checked and self.core.stocked_out(mig.zone, spot, mig.template.machine_type):
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
            mig = self.groups.get(mig_key)
            if mig is not None and mig.serial == serial:
                self.create_vms(mig, [n for n in names if n in mig.vms])

    def create_vms(self, mig: Mig, names: list[str]) -> None:
        """Create the managed instances `names` at once, from the template, each knowing its worker number and
        its peers. Called with the lock held."""
        properties = mig.template.body["properties"]
        machine_type = mig.template.machine_type
        tpu = TPU_MACHINE_TYPES.get(machine_type)
        mig.progress_error = None
        instances = self.api.instances
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
            m = instances.make(mig.project, mig.zone, name, body, chips=tpu.chips if tpu else 0)
            instances.managed[key(m)] = mig.key
            instances.start(m)
        self.refresh(mig)

    def refresh(self, mig: Mig) -> None:
        """The topology state after a VM changed: ACTIVE when every VM runs (on_ready the first time), else
        DEACTIVATING (for a while, after ACTIVE) then INCOMPLETE. Called with the lock held."""
        vms = [self.api.instances.vms.get((mig.project, mig.zone, n)) for n in mig.vms]
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
            mig = self.groups.get(mig_key)
            if mig is not None and mig.id == mig_id and mig.topology_state == "DEACTIVATING":
                mig.topology_state, mig.topology_at = "INCOMPLETE", time.time()
                self.core.changed()

    # ================================================================= get, delete, resize
    def get(self, verb: str, project: str, zone: str, name: str, collection: str = "instanceGroupManagers") -> Mig:
        mig = self.groups.get((project, zone, name))
        self.core.check(verb, kind_of(mig.template.machine_type) if mig else "", name, zone, collection)
        if mig is None:
            raise not_found(f"projects/{project}/zones/{zone}/instanceGroupManagers/{name}")
        return mig

    def delete(self, project: str, zone: str, name: str) -> dict[str, Any]:
        """Delete the MIG and its VMs; to the local cloud, the slice is deleted."""
        core = self.core
        with core.lock:
            mig = self.get("delete", project, zone, name)
            del self.groups[(project, zone, name)]
            self._drop_vms(mig)
            slice_ = mig_views.slice_of(mig)
            core.deleted(slice_)
            mig.deleted_at = slice_.deleted_at
            target = f"zones/{zone}/instanceGroupManagers/{name}"
            return self.api.operations.done(project, f"zones/{zone}", target, "delete")

    def resize(self, project: str, zone: str, name: str, size: str | None) -> dict[str, Any]:
        """instanceGroupManagers.resize of a BULK MIG: from 0 to the full size at once, or back to 0."""
        core, operations = self.core, self.api.operations
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
            if (
                self.bulk_stockout == "fail"
                and not _flex(mig.template)
                and core.stocked_out(zone, _spot(mig.template), mig.template.machine_type)
            ):
                return operations.finish(op, capacity_error(project, zone))
            self.grow(mig, new, stocked_checked=self.bulk_stockout == "fail")
            return operations.finish(op, None)

    def _drop_vms(self, mig: Mig) -> None:
        instances = self.api.instances
        for vm in mig.vms:
            instances.managed.pop((mig.project, mig.zone, vm), None)
            instances.vms.pop((mig.project, mig.zone, vm), None)

    def _new_vm_name(self, mig: Mig) -> str:
        """BASE-xxxx, four random lowercase letters or digits, as a MIG names its VMs; unique in the zone."""
        base = str(mig.body["baseInstanceName"])
        while True:
            name = f"{base}-{''.join(random.choices(string.ascii_lowercase + string.digits, k=4))}"
            if name not in mig.vms and (mig.project, mig.zone, name) not in self.api.instances.vms:
                return name


def check_mig(
    body: dict[str, Any], template: Template, policy: ResourcePolicy | None, bulk_models: frozenset[str] | None
) -> None:
    """`bulk_models` None: every MIG is BULK (a user's bring-up of a v6e slice MIG: "MIGs with TPU accelerator
    topology require BULK mode"). Otherwise BULK takes only those models (the bulk-mode page) and a MIG of any other
    model is INDIVIDUAL (the default mode, unset or named), as the TPU Spot page's Spot slice MIGs must then be; the
    local API creates an INDIVIDUAL MIG's VMs as it does a BULK one's."""
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
