"""The local Compute Engine v1 API: instances (GPU VMs, TPU VMs), resource policies, instance templates, managed
instance groups (MIG slices) and their resize requests, as google-cloud-compute calls them over REST.

  zones/Z/instances[/N]                                   insert, get, list (`filter`), delete     zone op
  regions/R/resourcePolicies[/N]                          insert, get, list, delete                region op
  global/instanceTemplates[/N]                            insert, get, list, delete                global op
  zones/Z/instanceGroupManagers[/M]                       insert, get, list, delete                zone op
  zones/Z/instanceGroupManagers/M/listManagedInstances    POST
  zones/Z/instanceGroupManagers/M/resize?size=N           POST                                     zone op
  zones/Z/instanceGroupManagers/M/resizeRequests[/RR]     insert, get, list, delete                zone op
  zones/Z|regions/R|global /operations/OP[/wait]          get, wait

What Google documents is enforced, and a request the local API does not understand is refused with a 400 in
Compute's error JSON rather than accepted: a field google.cloud.compute_v1 does not know ("Unknown name"), a field
it knows that this API does not model, an unknown machine type, guestAccelerators on a TPU machine type, a workload
policy whose topology does not hold the MIG's chips, a MIG without BULK mode or with repair on, deleting a template
or policy a MIG still uses. Sources are in tests/data/SOURCES.md ("The local TPU / Compute API").

Instances: a GPU VM goes PROVISIONING -> RUNNING, a TPU VM PENDING -> STAGING -> RUNNING, in `create_delay_s`; the
insert operation is done then. A stockout ends the insert operation with ZONE_RESOURCE_POOL_EXHAUSTED; a flex-start
instance instead waits PENDING for its zone's `queue_waits` (failing so when its requestValidForDuration ends first).

A MIG is BULK: it creates its `targetSize` VMs (`BASE-xxxx`) all at once, each with metadata `agent-worker-number`
and `worker-network-endpoints`. In a zone without capacity it waits, as `status.bulkInstanceOperation` says
(`inProgress`, `lastProgressCheck.error` ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS), or, with
`bulk_stockout="fail"`, its insert operation fails. `status.appliedAcceleratorTopologies[0].state` is INCOMPLETE
while VMs provision, ACTIVE when all run, DEACTIVATING then INCOMPLETE once one is lost: a slice MIG
(defaultActionOnFailure DO_NOTHING) repairs nothing. A resize request goes CREATING -> ACCEPTED (waiting for the
zone's `queue_waits`) -> SUCCEEDED (its VMs created) or FAILED. To the local cloud a MIG is one machine.
"""

from __future__ import annotations

import copy
import math
import random
import re
import string
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from google.cloud import compute_v1

from localcloud.apis.apicore import (
    GPU,
    TPU,
    WAIT_MAX_S,
    ApiError,
    CloudCore,
    CloudMachine,
    MachineCall,
    compute_error_json,
    invalid,
    list_filter,
    rfc3339,
    snapshot,
)
from localcloud.apis.compute_checks import (
    FLEX_START_WAIT_S,
    INSTANCE_FIELDS,
    MIG_FIELDS,
    POLICY_FIELDS,
    RESIZE_REQUEST_FIELDS,
    RESIZE_RUN_S,
    TEMPLATE_FIELDS,
    TPU_MACHINE_TYPES,
    check_body,
    check_machine_type,
    check_name,
    check_properties,
    check_workload_policy,
    seconds,
)
from localcloud.services.logentries import instance_id

COMPUTE = "https://www.googleapis.com/compute/v1"
_REASONS = {404: "notFound", 409: "alreadyExists", 403: "forbidden", 429: "rateLimitExceeded"}
_CREATING = ("PENDING", "PROVISIONING", "STAGING")


@dataclass(frozen=True)
class Request:
    """An HTTP request to a route: its method, query parameters and JSON body."""

    method: str
    query: dict[str, str]
    body: dict[str, Any]


@dataclass
class Kept:
    """An object the API keeps as the body it was given: a global instance template (scope `global`) or a regional
    resource policy with a workload policy (scope `regions/REGION`)."""

    project: str
    scope: str
    collection: str  # instanceTemplates | resourcePolicies
    name: str
    body: dict[str, Any]
    id: int
    created_at: float

    @property
    def path(self) -> str:
        return f"projects/{self.project}/{self.scope}/{self.collection}/{self.name}"

    @property
    def machine_type(self) -> str:
        """A template's machine type."""
        return str(self.body["properties"]["machineType"])

    @property
    def topology(self) -> str | None:
        """A policy's accelerator topology."""
        return (self.body.get("workloadPolicy") or {}).get("acceleratorTopology")


Template = Kept
Policy = Kept


@dataclass
class ResizeRequest:
    """A MIG resize request: `names` are the VMs it adds, created all at once when capacity comes."""

    name: str
    body: dict[str, Any]
    id: int
    created_at: float
    names: list[str]
    state: str = "CREATING"  # CREATING | ACCEPTED | SUCCEEDED | FAILED
    error: dict[str, Any] | None = None  # FAILED: Compute's {"errors": [{"code", "message"}]}
    last_attempt: dict[str, Any] | None = None  # why it still waits (status.lastAttempt.error)


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
    policy: Policy | None
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
    def target_size(self) -> int:
        return len(self.vms)


class ComputeApi:
    """Compute Engine v1 on the shared CloudCore. `bulk_models`: the provisioning models a BULK MIG's template may
    use (None: any; Google's bulk-mode page names only FLEX_START and RESERVATION_BOUND, its TPU Spot page makes
    Spot slice MIGs). `bulk_stockout`: "wait" (the MIG waits for capacity, as the bulk-mode pages describe) or
    "fail" (its insert operation fails with ZONE_RESOURCE_POOL_EXHAUSTED). `resize_requests`: False refuses resize
    requests in BULK MIGs (the bulk-mode page lists them as unsupported there)."""

    def __init__(
        self,
        core: CloudCore,
        *,
        bulk_models: frozenset[str] | None = None,
        bulk_stockout: str = "wait",
        resize_requests: bool = True,
    ) -> None:
        if bulk_stockout not in ("wait", "fail"):
            raise ValueError(f"bulk_stockout: {bulk_stockout!r} is not allowed; allowed: wait, fail")
        self.core = core
        self.bulk_models = bulk_models
        self.bulk_stockout = bulk_stockout
        self.resize_requests = resize_requests
        self.instances: dict[tuple[str, str, str], CloudMachine] = {}  # (project, zone, name): every VM
        self.managed: dict[tuple[str, str, str], tuple[str, str, str]] = {}  # a MIG's VM -> the MIG's key
        self.flex_waiting: set[tuple[str, str, str]] = set()  # flex-start instances in their zone's queue
        self.templates: dict[tuple[str, str], Template] = {}  # (project, name)
        self.policies: dict[tuple[str, str, str], Policy] = {}  # (project, region, name)
        self.migs: dict[tuple[str, str, str], Mig] = {}  # (project, zone, name)
        self.ops: dict[str, dict[str, Any]] = {}  # name -> {"scope", "zone", "target", "json", "waiting"}
        self._routes: list[tuple[re.Pattern[str], Callable[..., Any]]] = [
            (re.compile(rf"^/compute/v1/projects/{_S}/zones/{_S}/instances(?:/{_S})?$"), self._instances),
            (re.compile(rf"^/compute/v1/projects/{_S}/regions/{_S}/resourcePolicies(?:/{_S})?$"), self._policies),
            (re.compile(rf"^/compute/v1/projects/{_S}/global/instanceTemplates(?:/{_S})?$"), self._templates),
            (
                re.compile(
                    rf"^/compute/v1/projects/{_S}/zones/{_S}/instanceGroupManagers/{_S}/resizeRequests(?:/{_S})?$"
                ),
                self._resize_requests,
            ),
            (
                re.compile(rf"^/compute/v1/projects/{_S}/zones/{_S}/instanceGroupManagers(?:/{_S}(?:/{_S})?)?$"),
                self._migs,
            ),
            (
                re.compile(rf"^/compute/v1/projects/{_S}/((?:zones|regions)/[^/]+|global)/operations/{_S}(/wait)?$"),
                self._ops,
            ),
        ]

    # ================================================================= hooks for the server and the local cloud
    def owns(self, path: str) -> bool:
        return path.startswith("/compute/")

    def machines(self) -> list[CloudMachine]:
        standalone = [snapshot(m) for k, m in self.instances.items() if k not in self.managed]
        return standalone + [self._slice(mig) for mig in self.migs.values()]

    def stored(self, name: str) -> CloudMachine | None:
        """The instance record itself (a MIG's VMs too)."""
        return next((m for m in self.instances.values() if m.name == name), None)

    def machine(self, name: str) -> CloudMachine | None:
        """A standalone instance or a MIG slice, by its name."""
        mig = self._mig_named(name)
        if mig is not None:
            return self._slice(mig)
        m = self.stored(name)
        return snapshot(m) if m is not None and self._key(m) not in self.managed else None

    def waiting(self) -> list[tuple[str, str]]:
        """(name, zone) of each machine now waiting for capacity in its zone: a flex-start instance in the queue,
        a MIG whose BULK creation waits, or whose resize request is not yet granted."""
        instances = [(m.name, m.zone) for k, m in self.instances.items() if k in self.flex_waiting]
        migs = [
            (mig.name, mig.zone)
            for mig in self.migs.values()
            if mig.progress_error is not None
            or any(rr.state in ("CREATING", "ACCEPTED") for rr in mig.resize_requests.values())
        ]
        return instances + migs

    def live_in(self, zone: str) -> int:
        standalone = sum(1 for k, m in self.instances.items() if m.zone == zone and k not in self.managed)
        return standalone + sum(1 for mig in self.migs.values() if mig.zone == zone and self._created(mig))

    def leftovers(self) -> list[str]:
        instances = [_instance_path(*k) for k in self.instances]
        migs = [mig.path for mig in self.migs.values()]
        requests = [f"{mig.path}/resizeRequests/{r}" for mig in self.migs.values() for r in mig.resize_requests]
        return (
            instances
            + migs
            + requests
            + [t.path for t in self.templates.values()]
            + [p.path for p in self.policies.values()]
        )

    def preempt(self, name: str, worker: int | None) -> CloudMachine | None:
        """An instance -> TERMINATED, or deleted when it asked for instanceTerminationAction DELETE (as respawn's
        Spot VMs do). A MIG slice (or one of its VMs by name): every VM, or worker `worker` only, likewise; the
        MIG repairs nothing. None when there is no such machine."""
        return self._each_vm(name, worker, self._preempt_vm)

    def set_state(self, name: str, state: str, worker: int | None) -> CloudMachine | None:
        """An instance's `status`; a MIG slice's VMs' (every VM, or worker `worker` only)."""
        return self._each_vm(name, worker, lambda vm: self._set(vm, state))

    def _each_vm(self, name: str, worker: int | None, act: Callable[[CloudMachine], object]) -> CloudMachine | None:
        mig = self._mig_named(name)
        vm = self.stored(name)
        if mig is None and vm is not None and self._key(vm) in self.managed:  # a MIG's VM by its own name
            mig = self.migs[self.managed[self._key(vm)]]
            worker = mig.vms.index(vm.name)
        if mig is None:
            if vm is None:
                return None
            result = act(vm)
            return result if isinstance(result, CloudMachine) else snapshot(vm)
        if worker is not None and not 0 <= worker < len(mig.vms):
            return None
        names = mig.vms if worker is None else mig.vms[worker : worker + 1]
        for vm_name in names:
            if (m := self.instances.get((mig.project, mig.zone, vm_name))) is not None:
                act(m)
        self._refresh(mig)
        return self._slice(mig)

    def _preempt_vm(self, m: CloudMachine) -> CloudMachine:
        self.flex_waiting.discard(self._key(m))
        if (m.resource.get("scheduling") or {}).get("instanceTerminationAction") == "DELETE":
            del self.instances[self._key(m)]
            if self._key(m) not in self.managed:
                self.core.deleted(m)
            return self._set(m, "STOPPING")
        return self._set(m, "TERMINATED")

    def _set(self, m: CloudMachine, state: str) -> CloudMachine:
        m.state = state
        self.core.changed()
        return snapshot(m)

    # ================================================================= routes
    def route(self, method: str, path: str, query: dict[str, str], body: dict[str, Any]) -> Any:
        for pattern, handler in self._routes:
            if m := pattern.match(path):
                return handler(Request(method, query, body), *m.groups())
        return None

    def error_json(self, e: ApiError) -> dict[str, Any]:
        return compute_error_json(e, _REASONS)

    def _listing(self, kind: str, path: str, items: list[dict[str, Any]], query: dict[str, str]) -> dict[str, Any]:
        if query.get("filter"):
            items = [i for i in items if list_filter(query["filter"])(i)]
        return {"kind": kind, "id": path, "items": items, "selfLink": f"{COMPUTE}/{path}"}

    def _instances(self, req: Request, project: str, zone: str, name: str | None) -> Any:
        def instance_name() -> str:
            check_name(req.body, "resource.name")
            return str(req.body["name"])

        def listing(items: list[dict[str, Any]]) -> dict[str, Any]:
            return self._listing("compute#instanceList", f"projects/{project}/zones/{zone}/instances", items, req.query)

        return MachineCall(req.method, project, zone, name, req.body).answer(self, instance_name, listing)

    def _policies(self, req: Request, project: str, region: str, name: str | None) -> Any:
        if req.method == "POST" and not name:
            return self.insert_policy(project, region, req.body)
        if req.method == "GET" and name:
            with self.core.lock:
                return _kept_json(self._policy("get", project, region, name), "compute#resourcePolicy")
        if req.method == "GET":
            with self.core.lock:
                self.core.check("list", "", "", region, "resourcePolicies")
                items = [
                    _kept_json(p, "compute#resourcePolicy")
                    for k, p in sorted(self.policies.items())
                    if k[:2] == (project, region)
                ]
            path = f"projects/{project}/regions/{region}/resourcePolicies"
            return self._listing("compute#resourcePolicyList", path, items, req.query)
        if req.method == "DELETE" and name:
            return self.delete_policy(project, region, name)
        return None

    def _templates(self, req: Request, project: str, name: str | None) -> Any:
        if req.method == "POST" and not name:
            return self.insert_template(project, req.body)
        if req.method == "GET" and name:
            with self.core.lock:
                return _kept_json(self._template("get", project, name), "compute#instanceTemplate")
        if req.method == "GET":
            with self.core.lock:
                self.core.check("list", "", "", "global", "instanceTemplates")
                items = [
                    _kept_json(t, "compute#instanceTemplate")
                    for k, t in sorted(self.templates.items())
                    if k[0] == project
                ]
            path = f"projects/{project}/global/instanceTemplates"
            return self._listing("compute#instanceTemplateList", path, items, req.query)
        if req.method == "DELETE" and name:
            return self.delete_template(project, name)
        return None

    def _migs(self, req: Request, project: str, zone: str, name: str | None, action: str | None) -> Any:
        if action == "listManagedInstances" and req.method == "POST" and name:
            with self.core.lock:
                mig = self._mig("get", project, zone, name)
                return {"managedInstances": [self._managed_json(mig, vm) for vm in mig.vms]}
        if action == "resize" and req.method == "POST" and name:
            return self.resize_mig(project, zone, name, req.query.get("size"))
        if action:
            return None
        if req.method == "POST" and not name:
            return self.insert_mig(project, zone, req.body)
        if req.method == "GET" and name:
            with self.core.lock:
                return self._mig_json(self._mig("get", project, zone, name))
        if req.method == "GET":
            with self.core.lock:
                self.core.check("list", "", "", zone, "instanceGroupManagers")
                items = [self._mig_json(g) for k, g in sorted(self.migs.items()) if k[:2] == (project, zone)]
            path = f"projects/{project}/zones/{zone}/instanceGroupManagers"
            return self._listing("compute#instanceGroupManagerList", path, items, req.query)
        if req.method == "DELETE" and name:
            return self.delete_mig(project, zone, name)
        return None

    def _resize_requests(self, req: Request, project: str, zone: str, mig_name: str, name: str | None) -> Any:
        if req.method == "POST" and not name:
            return self.insert_resize_request(project, zone, mig_name, req.body)
        if req.method == "GET" and name:
            with self.core.lock:
                mig, rr = self._resize_request("get", project, zone, mig_name, name)
                return _resize_request_json(mig, rr)
        if req.method == "GET":
            with self.core.lock:
                mig = self._mig("list", project, zone, mig_name, "resizeRequests")
                items = [_resize_request_json(mig, rr) for _, rr in sorted(mig.resize_requests.items())]
            return self._listing(
                "compute#instanceGroupManagerResizeRequestList", f"{mig.path}/resizeRequests", items, req.query
            )
        if req.method == "DELETE" and name:
            return self.delete_resize_request(project, zone, mig_name, name)
        return None

    def _ops(self, req: Request, project: str, scope: str, name: str, wait: str | None) -> Any:
        if (req.method, bool(wait)) in (("GET", False), ("POST", True)):
            return self.operation(project, scope, name, wait=bool(wait))
        return None

    # ================================================================= instances
    def create_machine(self, project: str, zone: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """instances.insert."""
        core = self.core
        with core.lock:
            fault = core.record("create", _kind_of(body.get("machineType")), name, zone, "instances")
            if fault and not fault.in_operation:
                raise ApiError.of(fault)
            check_body(compute_v1.Instance, body, INSTANCE_FIELDS)
            self._check_instance(project, zone, body)
            key = (project, zone, name)
            if key in self.instances:
                raise ApiError(409, "ALREADY_EXISTS", f"The resource '{_instance_path(*key)}' already exists")
            op = self._new_op(project, f"zones/{zone}", f"zones/{zone}/instances/{name}", "insert")
            if fault:
                return self._finish(op, ApiError.of(fault))
            scheduling = body.get("scheduling") or {}
            if scheduling.get("provisioningModel") == "FLEX_START":
                return self._insert_flex(op, project, zone, name, body)
            if core.stocked_out(zone, _spot(scheduling)):
                return self._finish(op, _capacity_error(project, zone))
            m = self._make(project, zone, name, body)
            self._start(m)
            op["waiting"] = key
            return copy.deepcopy(op["json"])

    def _insert_flex(
        self, op: dict[str, Any], project: str, zone: str, name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """A flex-start instance: PENDING until its zone's queue wait ends (then it starts), or until its
        requestValidForDuration does first (then its creation fails, as a stockout, and it is gone)."""
        m = self._make(project, zone, name, body, status="PENDING")
        op["waiting"] = self._key(m)
        waits, wait = self.core.queue_wait(zone, spot=False)
        valid = seconds((body.get("params") or {}).get("requestValidForDuration"))
        if not waits:
            self._start(m)
            return copy.deepcopy(op["json"])
        self.flex_waiting.add(self._key(m))
        if wait is not None and (valid is None or wait <= valid):
            self.core.later(wait, self._flex_granted, self._key(m), m.created_at)
        if valid is not None and (wait is None or wait > valid):
            self.core.later(valid, self._flex_expired, self._key(m), m.created_at)
        return copy.deepcopy(op["json"])

    def _flex_granted(self, key: tuple[str, str, str], created_at: float) -> None:
        with self.core.lock:
            m = self.instances.get(key)
            if m is not None and m.created_at == created_at and key in self.flex_waiting:
                self.flex_waiting.discard(key)
                self._start(m)

    def _flex_expired(self, key: tuple[str, str, str], created_at: float) -> None:
        with self.core.lock:
            m = self.instances.get(key)
            if m is None or m.created_at != created_at or key not in self.flex_waiting:
                return
            self.flex_waiting.discard(key)
            del self.instances[key]
            self.core.deleted(m)
            self._finish_waiting(key, _capacity_error(m.project, m.zone))

    def _check_instance(self, project: str, zone: str, body: dict[str, Any]) -> None:
        check_name(body, "resource.name")
        value = str(body.get("machineType") or "")
        found = re.fullmatch(
            rf"(?:(?:{re.escape(COMPUTE)}/)?projects/([^/]+)/)?zones/([^/]+)/machineTypes/([^/]+)", value
        )
        if found is None or found[1] not in (None, project) or found[2] != zone:
            raise invalid(
                f"Invalid value for field 'resource.machineType': '{value}'. "
                f"A machine type URL in zone '{zone}' is required: zones/{zone}/machineTypes/TYPE."
            )
        check_machine_type(found[3], "resource.machineType", value, zone)
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
        for url in body.get("resourcePolicies") or []:
            if any(url.endswith(p.path) for p in self.policies.values()):
                raise invalid(
                    "Invalid resource usage: 'Resource policy must have one of [VmMaintenancePolicy, "
                    "GroupPlacementPolicy, InstanceSchedulePolicy]'."
                )
            raise invalid("Field 'resource.resourcePolicies' is not supported by the local Compute API.")

    def _make(
        self, project: str, zone: str, name: str, body: dict[str, Any], status: str | None = None, chips: int = 0
    ) -> CloudMachine:
        """A new instance record. Called with the lock held."""
        machine_type = str(body.get("machineType") or "").rpartition("/")[2]
        kind = _kind_of(machine_type)
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
        self.instances[(project, zone, name)] = m
        self.core.changed()
        return m

    def _start(self, m: CloudMachine) -> None:
        """Provision the instance: a TPU VM goes through STAGING halfway, RUNNING after `create_delay_s`."""
        delay = self.core.create_delay_s
        if m.kind == TPU:
            self.core.later(delay / 2, self._progress, self._key(m), m.created_at, "STAGING")
        self.core.later(delay, self._progress, self._key(m), m.created_at, "RUNNING")

    def _progress(self, key: tuple[str, str, str], created_at: float, status: str) -> None:
        core = self.core
        with core.lock:
            m = self.instances.get(key)
            if m is None or m.created_at != created_at or m.state not in _CREATING:  # preempted, set meanwhile
                return
            m.state = status
            if status == "RUNNING":
                if key in self.managed:
                    self._refresh(self.migs[self.managed[key]])
                else:
                    core.ready(m)
                self._finish_waiting(key, None)
            core.changed()

    def get_machine(self, project: str, zone: str, name: str) -> dict[str, Any]:
        with self.core.lock:
            m = self.instances.get((project, zone, name))
            self.core.check("get", m.kind if m else "", name, zone, "instances")
            if m is None:
                raise _not_found(_instance_path(project, zone, name))
            return _instance_json(m)

    def list_machines(self, project: str, zone: str) -> list[dict[str, Any]]:
        with self.core.lock:
            self.core.check("list", "", "", zone, "instances")
            return [_instance_json(m) for (p, z, _), m in sorted(self.instances.items()) if (p, z) == (project, zone)]

    def delete_machine(self, project: str, zone: str, name: str) -> dict[str, Any]:
        core = self.core
        with core.lock:
            key = (project, zone, name)
            m = self.instances.get(key)
            core.check("delete", m.kind if m else "", name, zone, "instances")
            if m is None:
                raise _not_found(_instance_path(*key))
            if key in self.managed:
                raise invalid(
                    f"The local Compute API does not delete '{_instance_path(*key)}' on its own: it belongs to "
                    f"'{self.migs[self.managed[key]].path}'; delete the managed instance group."
                )
            del self.instances[key]
            self.flex_waiting.discard(key)
            m.state = "STOPPING"
            self._finish_waiting(key, None)  # an insert still in flight completes
            core.deleted(m)
            op = self._new_op(project, f"zones/{zone}", f"zones/{zone}/instances/{name}", "delete")
            return self._finish(op, None)

    # ================================================================= resource policies
    def insert_policy(self, project: str, region: str, body: dict[str, Any]) -> dict[str, Any]:
        core = self.core
        with core.lock:
            name = str(body.get("name") or "")
            topology = (body.get("workloadPolicy") or {}).get("acceleratorTopology")
            fault = core.record("create", TPU if topology else GPU, name, region, "resourcePolicies")
            if fault and not fault.in_operation:
                raise ApiError.of(fault)
            check_body(compute_v1.ResourcePolicy, body, POLICY_FIELDS)
            check_name(body, "resource.name")
            check_workload_policy(body)
            key = (project, region, name)
            if key in self.policies:
                raise _already_exists(f"projects/{project}/regions/{region}/resourcePolicies/{name}")
            op = self._new_op(project, f"regions/{region}", f"regions/{region}/resourcePolicies/{name}", "insert")
            if fault:
                return self._finish(op, ApiError.of(fault))
            self.policies[key] = Kept(
                project, f"regions/{region}", "resourcePolicies", name, copy.deepcopy(body), core.next_id(), time.time()
            )
            return self._finish(op, None)

    def _policy(self, verb: str, project: str, region: str, name: str) -> Policy:
        policy = self.policies.get((project, region, name))
        self.core.check(verb, TPU if policy and policy.topology else "", name, region, "resourcePolicies")
        if policy is None:
            raise _not_found(f"projects/{project}/regions/{region}/resourcePolicies/{name}")
        return policy

    def delete_policy(self, project: str, region: str, name: str) -> dict[str, Any]:
        with self.core.lock:
            policy = self._policy("delete", project, region, name)
            users = [mig.path for mig in self.migs.values() if mig.policy is policy]
            if users:
                raise _in_use("resource_policy", policy.path, users[0])
            del self.policies[(project, region, name)]
            op = self._new_op(project, f"regions/{region}", f"regions/{region}/resourcePolicies/{name}", "delete")
            return self._finish(op, None)

    # ================================================================= instance templates
    def insert_template(self, project: str, body: dict[str, Any]) -> dict[str, Any]:
        core = self.core
        with core.lock:
            name = str(body.get("name") or "")
            properties = body.get("properties") or {}
            fault = core.record("create", _kind_of(properties.get("machineType")), name, "global", "instanceTemplates")
            if fault and not fault.in_operation:
                raise ApiError.of(fault)
            check_body(compute_v1.InstanceTemplate, body, TEMPLATE_FIELDS)
            check_name(body, "resource.name")
            machine_type = str(properties.get("machineType") or "")
            if not re.fullmatch(r"[a-z0-9-]+", machine_type):
                raise invalid(
                    f"Invalid value for field 'resource.properties.machineType': '{machine_type}'. "
                    "An instance template takes the machine type's name, e.g. ct6e-standard-4t."
                )
            check_machine_type(machine_type, "resource.properties.machineType", machine_type, None)
            check_properties(properties, "resource.properties", machine_type)
            key = (project, name)
            if key in self.templates:
                raise _already_exists(f"projects/{project}/global/instanceTemplates/{name}")
            op = self._new_op(project, "global", f"global/instanceTemplates/{name}", "insert")
            if fault:
                return self._finish(op, ApiError.of(fault))
            self.templates[key] = Kept(
                project, "global", "instanceTemplates", name, copy.deepcopy(body), core.next_id(), time.time()
            )
            return self._finish(op, None)

    def _template(self, verb: str, project: str, name: str) -> Template:
        template = self.templates.get((project, name))
        kind = _kind_of(template.machine_type) if template else ""
        self.core.check(verb, kind, name, "global", "instanceTemplates")
        if template is None:
            raise _not_found(f"projects/{project}/global/instanceTemplates/{name}")
        return template

    def delete_template(self, project: str, name: str) -> dict[str, Any]:
        with self.core.lock:
            template = self._template("delete", project, name)
            users = [mig.path for mig in self.migs.values() if mig.template is template]
            if users:
                raise _in_use("instance_template", template.path, users[0])
            del self.templates[(project, name)]
            op = self._new_op(project, "global", f"global/instanceTemplates/{name}", "delete")
            return self._finish(op, None)

    # ================================================================= managed instance groups
    def insert_mig(self, project: str, zone: str, body: dict[str, Any]) -> dict[str, Any]:
        core = self.core
        with core.lock:
            name = str(body.get("name") or "")
            template = self._referenced_template(project, body.get("instanceTemplate"))
            fault = core.record(
                "create", _kind_of(template.machine_type if template else None), name, zone, "instanceGroupManagers"
            )
            if fault and not fault.in_operation:
                raise ApiError.of(fault)
            check_body(compute_v1.InstanceGroupManager, body, MIG_FIELDS)
            check_name(body, "resource.name")
            key = (project, zone, name)
            if key in self.migs:  # before the checks that look at other resources: a redelivered insert
                raise _already_exists(f"projects/{project}/zones/{zone}/instanceGroupManagers/{name}")
            base = str(body.get("baseInstanceName") or "")
            if not re.fullmatch(r"[a-z][-a-z0-9]{0,57}", base):
                raise invalid(
                    f"Invalid value for field 'resource.baseInstanceName': '{base}'. Must be a lowercase letter "
                    "followed by up to 57 lowercase letters, digits or hyphens."
                )
            url = str(body.get("instanceTemplate") or "")
            if not _TEMPLATE_URL.fullmatch(url):
                raise invalid(
                    f"Invalid value for field 'resource.instanceTemplate': '{url}'. A global instance template URL "
                    "is required: projects/PROJECT/global/instanceTemplates/NAME."
                )
            if template is None:
                raise _not_found(url.removeprefix(f"{COMPUTE}/"))
            policy = self._referenced_policy(project, zone, body)
            self._check_mig(body, template, policy)
            target = body.get("targetSize", 0)
            if not isinstance(target, int) or target < 0:
                raise invalid(f"Invalid value for field 'resource.targetSize': '{target}'. Must be 0 or more.")
            _check_topology_holds(policy, template, target, "resource.targetSize")
            op = self._new_op(project, f"zones/{zone}", f"zones/{zone}/instanceGroupManagers/{name}", "insert")
            if fault:
                return self._finish(op, ApiError.of(fault))
            spot = _spot(template.body["properties"].get("scheduling") or {})
            if target and self.bulk_stockout == "fail" and not _flex(template) and core.stocked_out(zone, spot):
                return self._finish(op, _capacity_error(project, zone))
            mig = Mig(project, zone, name, copy.deepcopy(body), core.next_id(), time.time(), template, policy)
            mig.topology_at = mig.created_at
            self.migs[key] = mig
            if target:
                self._grow(mig, target, stocked_checked=self.bulk_stockout == "fail")
            return self._finish(op, None)

    def _referenced_template(self, project: str, url: object) -> Template | None:
        """The template a MIG names; None when it names none the API holds (or no template URL at all)."""
        found = _TEMPLATE_URL.fullmatch(str(url or ""))
        return self.templates.get((found[1] or project, found[2])) if found else None

    def _referenced_policy(self, project: str, zone: str, body: dict[str, Any]) -> Policy | None:
        url = (body.get("resourcePolicies") or {}).get("workloadPolicy")
        if not url:
            return None
        region = _region(zone)
        found = re.fullmatch(
            rf"(?:{re.escape(COMPUTE)}/)?projects/([^/]+)/regions/([^/]+)/resourcePolicies/([^/]+)", str(url)
        )
        if found is None:  # a bare name: "The URL is malformed." (reported by a user of the real API)
            raise invalid(
                f"Invalid value for field 'resource.resourcePolicies.workloadPolicy': '{url}'. The URL is malformed."
            )
        if found[2] != region:
            raise invalid(
                f"Invalid value for field 'resource.resourcePolicies.workloadPolicy': '{url}'. The workload policy "
                f"must be in the MIG's region '{region}'."
            )
        policy = self.policies.get((found[1], found[2], found[3]))
        if policy is None:
            raise _not_found(f"projects/{found[1]}/regions/{found[2]}/resourcePolicies/{found[3]}")
        return policy

    def _check_mig(self, body: dict[str, Any], template: Template, policy: Policy | None) -> None:
        mode = (body.get("targetSizePolicy") or {}).get("mode")
        if policy is not None and policy.topology and mode != "BULK":
            raise invalid("MIGs with TPU accelerator topology require BULK mode in target size policy")
        if mode != "BULK":
            raise invalid(
                f"Invalid value for field 'resource.targetSizePolicy.mode': '{mode}'. The local Compute API "
                "serves BULK MIGs only (all VMs created at once)."
            )
        model = (template.body["properties"].get("scheduling") or {}).get("provisioningModel") or "STANDARD"
        if self.bulk_models is not None and model not in self.bulk_models:
            allowed = ", ".join(sorted(self.bulk_models))
            raise invalid(
                f"Invalid value for field 'resource.targetSizePolicy.mode': 'BULK'. Bulk mode supports instance "
                f"templates with provisioning model {allowed}; '{template.path}' has {model}."
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

    def _grow(self, mig: Mig, n: int, request: ResizeRequest | None = None, stocked_checked: bool = False) -> None:
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
        self._refresh(mig)
        if request is not None:  # accepted next, then waits for capacity
            self.core.later(0, self._accept, self._key_of(mig), request.name, request.id)
            return
        spot = _spot(mig.template.body["properties"].get("scheduling") or {})
        if _flex(mig.template):
            waits, wait = self.core.queue_wait(mig.zone, spot=False)
        elif not stocked_checked and self.core.stocked_out(mig.zone, spot):
            queued, wait = self.core.queue_wait(mig.zone, spot)
            waits, wait = True, wait if queued else None  # no queue wait set: until deleted
        else:
            waits, wait = False, 0.0
        if not waits:
            self._create_vms(mig, names)
            return
        _waiting(mig)
        if wait is not None:
            self.core.later(wait, self._capacity_came, self._key_of(mig), mig.serial, names)

    def _capacity_came(self, key: tuple[str, str, str], serial: int, names: list[str]) -> None:
        with self.core.lock:
            mig = self.migs.get(key)
            if mig is not None and mig.serial == serial:
                self._create_vms(mig, [n for n in names if n in mig.vms])

    def _create_vms(self, mig: Mig, names: list[str]) -> None:
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
            m = self._make(mig.project, mig.zone, name, body, chips=tpu.chips if tpu else 0)
            self.managed[self._key(m)] = self._key_of(mig)
            self._start(m)
        self._refresh(mig)

    def _refresh(self, mig: Mig) -> None:
        """The topology state after a VM changed: ACTIVE when every VM runs (on_ready the first time), else
        DEACTIVATING (for a while, after ACTIVE) then INCOMPLETE. Called with the lock held."""
        vms = [self.instances.get((mig.project, mig.zone, n)) for n in mig.vms]
        running = bool(vms) and all(m is not None and m.state == "RUNNING" for m in vms)
        before = mig.topology_state
        if running:
            mig.bulk_in_progress, mig.progress_error = False, None
            mig.topology_state = "ACTIVE"
            if not mig.ready_sent:
                mig.ready_sent = True
                self.core.ready(self._slice(mig))
        elif before in ("ACTIVE", "DEACTIVATING"):
            mig.topology_state = "DEACTIVATING"
            if before == "ACTIVE":
                self.core.later(self.core.create_delay_s, self._deactivated, self._key_of(mig), mig.id)
        else:
            mig.topology_state = "INCOMPLETE"
        if mig.topology_state != before:
            mig.topology_at = time.time()
        self.core.changed()

    def _deactivated(self, key: tuple[str, str, str], mig_id: int) -> None:
        with self.core.lock:
            mig = self.migs.get(key)
            if mig is not None and mig.id == mig_id and mig.topology_state == "DEACTIVATING":
                mig.topology_state, mig.topology_at = "INCOMPLETE", time.time()
                self.core.changed()

    def _mig(self, verb: str, project: str, zone: str, name: str, collection: str = "instanceGroupManagers") -> Mig:
        mig = self.migs.get((project, zone, name))
        self.core.check(verb, _kind_of(mig.template.machine_type) if mig else "", name, zone, collection)
        if mig is None:
            raise _not_found(f"projects/{project}/zones/{zone}/instanceGroupManagers/{name}")
        return mig

    def delete_mig(self, project: str, zone: str, name: str) -> dict[str, Any]:
        """Delete the MIG and its VMs; to the local cloud, the slice is deleted."""
        core = self.core
        with core.lock:
            mig = self._mig("delete", project, zone, name)
            del self.migs[(project, zone, name)]
            for vm in mig.vms:
                self.managed.pop((project, zone, vm), None)
                self.instances.pop((project, zone, vm), None)
            slice_ = self._slice(mig)
            core.deleted(slice_)
            mig.deleted_at = slice_.deleted_at
            op = self._new_op(project, f"zones/{zone}", f"zones/{zone}/instanceGroupManagers/{name}", "delete")
            return self._finish(op, None)

    def resize_mig(self, project: str, zone: str, name: str, size: str | None) -> dict[str, Any]:
        """instanceGroupManagers.resize of a BULK MIG: from 0 to the full size at once, or back to 0."""
        core = self.core
        with core.lock:
            mig = self._mig("resize", project, zone, name)
            if size is None or not size.isdigit():
                raise invalid(f"Invalid value for field 'size': '{size}'. Must be 0 or more.")
            new = int(size)
            if new and mig.target_size and new != mig.target_size:
                raise invalid(
                    f"A MIG in bulk mode grows only from 0 and shrinks only to 0: '{mig.path}' has targetSize "
                    f"{mig.target_size}."
                )
            _check_topology_holds(mig.policy, mig.template, new, "size")
            op = self._new_op(project, f"zones/{zone}", f"zones/{zone}/instanceGroupManagers/{name}", "resize")
            if new == mig.target_size:
                return self._finish(op, None)
            if new == 0:
                for vm in mig.vms:
                    self.managed.pop((project, zone, vm), None)
                    self.instances.pop((project, zone, vm), None)
                mig.vms, mig.bulk_in_progress, mig.progress_error = [], False, None
                mig.serial = core.next_id()
                self._refresh(mig)
                return self._finish(op, None)
            spot = _spot(mig.template.body["properties"].get("scheduling") or {})
            if self.bulk_stockout == "fail" and not _flex(mig.template) and core.stocked_out(zone, spot):
                return self._finish(op, _capacity_error(project, zone))
            self._grow(mig, new, stocked_checked=self.bulk_stockout == "fail")
            return self._finish(op, None)

    # ================================================================= resize requests
    def insert_resize_request(self, project: str, zone: str, mig_name: str, body: dict[str, Any]) -> dict[str, Any]:
        core = self.core
        with core.lock:
            name = str(body.get("name") or "")
            mig = self.migs.get((project, zone, mig_name))
            kind = _kind_of(mig.template.machine_type) if mig else ""
            fault = core.record("create", kind, name, zone, "resizeRequests")
            if fault and not fault.in_operation:
                raise ApiError.of(fault)
            if mig is None:
                raise _not_found(f"projects/{project}/zones/{zone}/instanceGroupManagers/{mig_name}")
            check_body(compute_v1.InstanceGroupManagerResizeRequest, body, RESIZE_REQUEST_FIELDS)
            check_name(body, "resource.name")
            if name in mig.resize_requests:  # before the checks that depend on the MIG's size: a redelivery
                raise _already_exists(f"{mig.path}/resizeRequests/{name}")
            if not self.resize_requests:
                raise invalid(
                    "Creating resize requests for managed instance group with TPU is not allowed"
                    if kind == TPU
                    else "Resize requests are not supported in a MIG whose targetSizePolicy.mode is BULK"
                )
            model = (mig.template.body["properties"].get("scheduling") or {}).get("provisioningModel") or "STANDARD"
            if model not in ("FLEX_START", "RESERVATION_BOUND"):  # about-resize-requests-mig: these two only
                raise invalid(
                    f"Resize requests take instance templates with provisioning model FLEX_START or "
                    f"RESERVATION_BOUND; '{mig.template.path}' has {model}."
                )
            by = body.get("resizeBy")
            if not isinstance(by, int) or by < 1:
                raise invalid(f"Invalid value for field 'resource.resizeBy': '{by}'. Must be 1 or more.")
            run = seconds(body.get("requestedRunDuration"))
            if run is None or not RESIZE_RUN_S[0] <= run <= RESIZE_RUN_S[1]:
                raise invalid(
                    f"Invalid value for field 'resource.requestedRunDuration': {run} s. Must be between "
                    f"{RESIZE_RUN_S[0]} s (10 minutes) and {RESIZE_RUN_S[1]} s (7 days)."
                )
            _check_topology_holds(mig.policy, mig.template, mig.target_size + by, "resource.resizeBy")
            target = f"zones/{zone}/instanceGroupManagers/{mig_name}/resizeRequests/{name}"
            op = self._new_op(project, f"zones/{zone}", target, "insert")
            rr = ResizeRequest(name, copy.deepcopy(body), core.next_id(), time.time(), [])
            mig.resize_requests[name] = rr
            if fault:  # taken, and then failed: nothing was added
                rr.state = "FAILED"
                rr.error = {"errors": [{"code": fault.reason or fault.status, "message": fault.message}]}
                return self._finish(op, None)
            self._grow(mig, by, request=rr)
            return self._finish(op, None)

    def _request_in(
        self, key: tuple[str, str, str], name: str, rr_id: int, state: str
    ) -> tuple[Mig | None, ResizeRequest | None]:
        """The MIG and its resize request `name` (the one with id `rr_id`) while the request is in `state`; Nones
        once it moved on or is gone (a timer set for it is then moot). Called with the lock held."""
        mig = self.migs.get(key)
        rr = mig.resize_requests.get(name) if mig else None
        if mig is None or rr is None or rr.id != rr_id or rr.state != state:
            return None, None
        return mig, rr

    def _accept(self, key: tuple[str, str, str], name: str, rr_id: int) -> None:
        """CREATING -> ACCEPTED; then the request waits for its zone's queue (flex-start capacity)."""
        with self.core.lock:
            mig, rr = self._request_in(key, name, rr_id, "CREATING")
            if mig is None or rr is None:
                return
            rr.state = "ACCEPTED"
            waits, wait = self.core.queue_wait(mig.zone, spot=False)
            if not waits:
                self._request_granted(key, name, rr_id)
            else:  # the request, not the MIG's bulk operation, says why it waits
                rr.last_attempt = _capacity_wait(mig)
                if wait is not None:
                    self.core.later(wait, self._request_granted, key, name, rr_id)
            self.core.changed()

    def _request_granted(self, key: tuple[str, str, str], name: str, rr_id: int) -> None:
        with self.core.lock:
            mig, rr = self._request_in(key, name, rr_id, "ACCEPTED")
            if mig is None or rr is None:
                return
            rr.state, rr.last_attempt = "SUCCEEDED", None
            self._create_vms(mig, rr.names)

    def _resize_request(
        self, verb: str, project: str, zone: str, mig_name: str, name: str
    ) -> tuple[Mig, ResizeRequest]:
        mig = self._mig(verb, project, zone, mig_name, "resizeRequests")
        rr = mig.resize_requests.get(name)
        if rr is None:
            raise _not_found(f"{mig.path}/resizeRequests/{name}")
        return mig, rr

    def delete_resize_request(self, project: str, zone: str, mig_name: str, name: str) -> dict[str, Any]:
        """Delete the request; one not yet SUCCEEDED is cancelled (its managed instances go with it)."""
        with self.core.lock:
            mig, rr = self._resize_request("delete", project, zone, mig_name, name)
            del mig.resize_requests[name]
            if rr.state in ("CREATING", "ACCEPTED"):
                mig.vms = [vm for vm in mig.vms if vm not in rr.names]
                mig.bulk_in_progress = any(r.state in ("CREATING", "ACCEPTED") for r in mig.resize_requests.values())
                mig.progress_error = mig.progress_error if mig.bulk_in_progress else None
                self._refresh(mig)
            target = f"zones/{zone}/instanceGroupManagers/{mig_name}/resizeRequests/{name}"
            return self._finish(self._new_op(project, f"zones/{zone}", target, "delete"), None)

    # ================================================================= operations
    def operation(self, project: str, scope: str, name: str, wait: bool = False) -> dict[str, Any]:
        core = self.core
        with core.lock:
            op = self.ops.get(name)
            if op is None or op["scope"] != (project, scope):
                raise _not_found(f"projects/{project}/{scope}/operations/{name}")
            core.record("operation", "", op["target"], op["zone"], "operations")
            if wait:
                core.wait_until(lambda: op["waiting"] is None, WAIT_MAX_S)
            return copy.deepcopy(op["json"])

    def _new_op(self, project: str, scope: str, target: str, verb: str) -> dict[str, Any]:
        """A RUNNING operation on `target` ("zones/Z/instances/N") in `scope` (zones/Z, regions/R or global)."""
        n = self.core.next_id()
        now = time.time()
        name = f"operation-{int(now * 1000)}-{n:08x}"
        base = f"{COMPUTE}/projects/{project}"
        body: dict[str, Any] = {
            "kind": "compute#operation",
            "id": str(n),
            "name": name,
            "operationType": verb,
            "targetLink": f"{base}/{target}",
            "status": "RUNNING",
            "progress": 0,
            "insertTime": rfc3339(now),
            "startTime": rfc3339(now),
            "selfLink": f"{base}/{scope}/operations/{name}",
            "user": "anonymous",
        }
        where, _, location = scope.partition("/")
        if where == "zones":
            body["zone"] = f"{base}/{scope}"
        elif where == "regions":
            body["region"] = f"{base}/{scope}"
        op: dict[str, Any] = {"scope": (project, scope), "zone": location or "global", "json": body, "waiting": None}
        op["target"] = target.rpartition("/")[2]
        self.ops[name] = op
        return op

    def _finish(self, op: dict[str, Any], error: ApiError | None) -> dict[str, Any]:
        body = op["json"]
        body.update(status="DONE", progress=100, endTime=rfc3339(time.time()))
        if error:
            code = error.reason or error.status
            body["error"] = {"errors": [{"code": code, "message": error.message}]}
            body["httpErrorStatusCode"] = error.code
            body["httpErrorMessage"] = HTTPStatus(error.code).phrase.upper()
        op["waiting"] = None
        self.core.changed()
        return copy.deepcopy(body)

    def _finish_waiting(self, key: tuple[str, str, str], error: ApiError | None) -> None:
        """Finish the insert operations waiting for instance `key`."""
        for op in self.ops.values():
            if op.get("waiting") == key:
                self._finish(op, error)

    # ================================================================= JSON
    def _slice(self, mig: Mig) -> CloudMachine:
        """The MIG as one machine: its VMs are the workers; `state` is its topology state."""
        properties = mig.template.body["properties"]
        tpu = TPU_MACHINE_TYPES.get(mig.template.machine_type)
        metadata = {i["key"]: i.get("value", "") for i in (properties.get("metadata") or {}).get("items", [])}
        return CloudMachine(
            _kind_of(mig.template.machine_type),
            mig.name,
            mig.zone,
            mig.project,
            dict(properties.get("labels") or {}),
            metadata,
            mig.topology_state,
            mig.created_at,
            properties,
            mig.deleted_at,
            api="compute",
            workers=tuple(mig.vms),
            chips_per_host=tpu.chips if tpu else 1,
        )

    def _managed_json(self, mig: Mig, name: str) -> dict[str, Any]:
        """A managed instance: the VM's status, or CREATING while it waits to be created. A VM lost for good (a
        Spot VM deleted on preemption) stays listed, with no status: the MIG repairs nothing."""
        m = self.instances.get((mig.project, mig.zone, name))
        url = f"{COMPUTE}/{_instance_path(mig.project, mig.zone, name)}"
        item: dict[str, Any] = {"instance": url, "name": name, "version": {"instanceTemplate": _url(mig.template.path)}}
        if m is None:
            item["currentAction"] = "CREATING" if mig.bulk_in_progress and name not in self._lost(mig) else "NONE"
            return item
        item.update(id=_instance_id(m), instanceStatus=m.state)
        item["currentAction"] = "CREATING" if m.state in _CREATING else "NONE"
        return item

    def _lost(self, mig: Mig) -> set[str]:
        """VMs that were created and are gone (deleted on preemption)."""
        created = {k[2] for k, g in self.managed.items() if g == self._key_of(mig)}
        return {n for n in created if (mig.project, mig.zone, n) not in self.instances}

    def _created(self, mig: Mig) -> bool:
        return any(g == self._key_of(mig) for g in self.managed.values())

    def _mig_json(self, mig: Mig) -> dict[str, Any]:
        managed = [self._managed_json(mig, n) for n in mig.vms]
        creating = sum(1 for i in managed if i["currentAction"] == "CREATING")
        actions = dict.fromkeys(_ACTIONS, 0)
        actions.update(creating=creating, none=len(managed) - creating)
        statuses = dict.fromkeys(_STATUS_SUMMARY, 0)
        for item in managed:
            key = _STATUS_KEYS.get(item.get("instanceStatus", ""), "nonExistent")
            statuses[key] += 1
        status: dict[str, Any] = {
            "isStable": creating == 0 and not mig.bulk_in_progress,
            "versionTarget": {"isReached": True},
            "stateful": {"hasStatefulConfig": False, "perInstanceConfigs": {"allEffective": True}},
            "bulkInstanceOperation": {"inProgress": mig.bulk_in_progress},
            "currentInstanceStatuses": statuses,
        }
        if mig.bulk_in_progress:
            check: dict[str, Any] = {"timestamp": rfc3339(time.time())}
            if mig.progress_error:
                check["error"] = copy.deepcopy(mig.progress_error)
            status["bulkInstanceOperation"]["lastProgressCheck"] = check
        if mig.policy is not None and mig.policy.topology:
            status["appliedAcceleratorTopologies"] = [
                {
                    "acceleratorTopology": mig.policy.topology,
                    "state": mig.topology_state,
                    "stateDetails": {"timestamp": rfc3339(mig.topology_at)},
                }
            ]
        base = f"{COMPUTE}/projects/{mig.project}/zones/{mig.zone}"
        body = copy.deepcopy(mig.body)
        body.update(
            kind="compute#instanceGroupManager",
            id=str(mig.id),
            creationTimestamp=rfc3339(mig.created_at),
            zone=base,
            selfLink=f"{base}/instanceGroupManagers/{mig.name}",
            instanceGroup=f"{base}/instanceGroups/{mig.name}",
            instanceTemplate=_url(mig.template.path),
            versions=[{"instanceTemplate": _url(mig.template.path), "targetSize": {"calculated": mig.target_size}}],
            targetSize=mig.target_size,
            currentActions=actions,
            status=status,
            fingerprint="bG9jYWw=",
            listManagedInstancesResults="PAGELESS",
        )
        if mig.policy is not None:
            body["resourcePolicies"] = {"workloadPolicy": _url(mig.policy.path)}
        return body

    # ================================================================= helpers
    def _new_vm_name(self, mig: Mig) -> str:
        """BASE-xxxx, four random lowercase letters or digits, as a MIG names its VMs; unique in the zone."""
        base = str(mig.body["baseInstanceName"])
        while True:
            name = f"{base}-{''.join(random.choices(string.ascii_lowercase + string.digits, k=4))}"
            if name not in mig.vms and (mig.project, mig.zone, name) not in self.instances:
                return name

    def _mig_named(self, name: str) -> Mig | None:
        return next((mig for mig in self.migs.values() if mig.name == name), None)

    @staticmethod
    def _key(m: CloudMachine) -> tuple[str, str, str]:
        return (m.project, m.zone, m.name)

    @staticmethod
    def _key_of(mig: Mig) -> tuple[str, str, str]:
        return (mig.project, mig.zone, mig.name)


_S = r"([^/]+)"
_TEMPLATE_URL = re.compile(rf"(?:{re.escape(COMPUTE)}/)?(?:projects/([^/]+)/)?global/instanceTemplates/([^/]+)")
_MIG_KEYS = frozenset({"instance-template", "created-by", "agent-worker-number", "worker-network-endpoints"})
# InstanceGroupManagerActionsSummary's counters, and InstanceGroupManagerStatusInstanceStatusSummary's per status.
_ACTIONS = [
    "abandoning",
    "creating",
    "creatingWithoutRetries",
    "deleting",
    "none",
    "recreating",
    "refreshing",
    "restarting",
    "resuming",
    "starting",
    "stopping",
    "suspending",
    "verifying",
]
_STATUSES = [
    "DEPROVISIONING",
    "PENDING",
    "PENDING_STOP",
    "PROVISIONING",
    "REPAIRING",
    "RUNNING",
    "STAGING",
    "STOPPED",
    "STOPPING",
    "SUSPENDED",
    "SUSPENDING",
    "TERMINATED",
]
_STATUS_KEYS = {s: re.sub(r"_(.)", lambda m: m[1].upper(), s.lower()) for s in _STATUSES}  # PENDING_STOP: pendingStop
_STATUS_SUMMARY = (*_STATUS_KEYS.values(), "nonExistent")


def _check_topology_holds(policy: Policy | None, template: Template, vms: int, field_name: str) -> None:
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


def _waiting(mig: Mig) -> None:
    """The MIG waits for capacity: its bulk operation's last progress check says why."""
    mig.progress_error = _capacity_wait(mig)


def _capacity_wait(mig: Mig) -> dict[str, Any]:
    """Why a BULK creation or a resize request still waits (view-cancel-vm-bulk-creation-in-migs names the code)."""
    message = _capacity_error(mig.project, mig.zone).message
    return {"errors": [{"code": "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "message": message}]}


# --------------------------------------------------------------------- small parts
def _kind_of(machine_type: object) -> str:
    name = str(machine_type or "").rpartition("/")[2]
    return TPU if name in TPU_MACHINE_TYPES else GPU if name else ""


def _spot(scheduling: dict[str, Any]) -> bool:
    return scheduling.get("provisioningModel") == "SPOT" or bool(scheduling.get("preemptible"))


def _flex(template: Template) -> bool:
    return (template.body["properties"].get("scheduling") or {}).get("provisioningModel") == "FLEX_START"


def _region(zone: str) -> str:
    return zone.rpartition("-")[0]


def _url(path: str) -> str:
    return f"{COMPUTE}/{path}"


def _instance_path(project: str, zone: str, name: str) -> str:
    return f"projects/{project}/zones/{zone}/instances/{name}"


def _instance_id(m: CloudMachine) -> str:
    return instance_id(m.name)  # the id the local cloud's system events carry for this VM


def _not_found(path: str) -> ApiError:
    return ApiError(404, "NOT_FOUND", f"The resource '{path}' was not found", "notFound")


def _already_exists(path: str) -> ApiError:
    return ApiError(409, "ALREADY_EXISTS", f"The resource '{path}' already exists", "alreadyExists")


def _in_use(kind: str, path: str, user: str) -> ApiError:
    """Compute's refusal to delete what another resource uses."""
    return ApiError(
        400,
        "INVALID_ARGUMENT",
        f"The {kind} resource '{path}' is already being used by '{user}'",
        "resourceInUseByAnotherResource",
    )


def _capacity_error(project: str, zone: str) -> ApiError:
    return ApiError(
        503,
        "UNAVAILABLE",
        f"The zone 'projects/{project}/zones/{zone}' does not have enough resources available to "
        "fulfill the request.  Try a different zone, or try again later.",
        "ZONE_RESOURCE_POOL_EXHAUSTED",
    )


def _instance_json(m: CloudMachine) -> dict[str, Any]:
    body = copy.deepcopy(m.resource)
    base = f"{COMPUTE}/projects/{m.project}/zones/{m.zone}"
    machine_type = str(body.get("machineType") or "").rpartition("/")[2]
    body.update(
        kind="compute#instance",
        id=_instance_id(m),
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


def _kept_json(k: Kept, kind: str) -> dict[str, Any]:
    """A template or policy as the API returns it: its body, with what the API adds."""
    body = copy.deepcopy(k.body)
    body.update(kind=kind, id=str(k.id), creationTimestamp=rfc3339(k.created_at), selfLink=_url(k.path))
    if k.collection == "resourcePolicies":
        body.update(region=f"{COMPUTE}/projects/{k.project}/{k.scope}", status="READY")
    return body


def _resize_request_json(mig: Mig, rr: ResizeRequest) -> dict[str, Any]:
    base = f"{COMPUTE}/projects/{mig.project}/zones/{mig.zone}"
    body = copy.deepcopy(rr.body)
    link = f"{base}/instanceGroupManagers/{mig.name}/resizeRequests"
    body.update(
        kind="compute#instanceGroupManagerResizeRequest",
        id=str(rr.id),
        creationTimestamp=rfc3339(rr.created_at),
        zone=base,
        state=rr.state,
        selfLink=f"{link}/{rr.name}",
        selfLinkWithId=f"{link}/{rr.id}",
    )
    if rr.error:
        body["status"] = {"error": copy.deepcopy(rr.error), "lastAttempt": {"error": copy.deepcopy(rr.error)}}
    elif rr.last_attempt:
        body["status"] = {"lastAttempt": {"error": copy.deepcopy(rr.last_attempt)}}
    return body
