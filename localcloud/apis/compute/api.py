"""The local Compute Engine v1 API: instances (GPU VMs, TPU VMs), resource policies, instance templates, managed
instance groups (MIG slices) and their resize requests, as google-cloud-compute calls them over REST.

  zones/Z/instances[/N]                                   insert, get, list (`filter`), delete     zone op
  zones/Z/instances/N/setMetadata                         POST (a MIG's VMs too)                   zone op
  regions/R/resourcePolicies[/N]                          insert, get, list, delete                region op
  global/instanceTemplates[/N]                            insert, get, list, delete                global op
  zones/Z/instanceGroupManagers[/M]                       insert, get, list, delete                zone op
  zones/Z/instanceGroupManagers/M/listManagedInstances    POST
  zones/Z/instanceGroupManagers/M/resize?size=N           POST                                     zone op
  zones/Z/instanceGroupManagers/M/resizeRequests[/RR]     insert, get, list, delete                zone op
  zones/Z|regions/R|global /operations/OP[/wait]          get, wait
  zones/Z/machineTypes/T, zones/Z/acceleratorTypes/T       get (what the zone offers: offerings.py)

What Google documents is enforced, and a request the local API does not understand is refused with a 400 in
Compute's error JSON rather than accepted: a field google.cloud.compute_v1 does not know ("Unknown name"), a field
it knows that this API does not model, an unknown machine type, guestAccelerators on a TPU machine type, a workload
policy whose topology does not hold the MIG's chips, BULK mode for a Spot or standard template, a MIG with repair
on, deleting a template or policy a MIG still uses. Sources are in tests/data/SOURCES.md ("The local TPU / Compute
API").

This module is the router and the one place that knows every collection: each is served by its own module
(instances.py, templates.py for templates and resource policies, migs.py, resize_requests.py, operations.py), all
on one ComputeState (state.py) under the shared CloudCore's lock, and each is given the collections it uses.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from localcloud.apis import offerings
from localcloud.apis.apicore import ApiError, CloudCore, CloudMachine, compute_error_json, snapshot
from localcloud.apis.compute import mig_views
from localcloud.apis.compute.common import NAME, Request, instance_path, key, not_found, url
from localcloud.apis.compute.instances import Instances
from localcloud.apis.compute.migs import BULK_MODELS, Migs
from localcloud.apis.compute.operations import Operations
from localcloud.apis.compute.resize_requests import ResizeRequests
from localcloud.apis.compute.state import ComputeState
from localcloud.apis.compute.templates import TemplatesAndPolicies

_REASONS = {404: "notFound", 409: "alreadyExists", 403: "forbidden", 429: "rateLimitExceeded"}
_PROJECT = f"^/compute/v1/projects/{NAME}"


class ComputeApi:
    """Compute Engine v1 on the shared CloudCore. `bulk_models`: the provisioning models a BULK MIG's template may
    use (by default FLEX_START and RESERVATION_BOUND, as Google's bulk-mode pages say; None: every MIG must be BULK,
    any model). `bulk_stockout`: "wait" (the MIG waits for capacity, as the bulk-mode pages describe) or
    "fail" (its insert operation fails with ZONE_RESOURCE_POOL_EXHAUSTED). `resize_requests`: False refuses resize
    requests in BULK MIGs (the bulk-mode page lists them as unsupported there)."""

    def __init__(
        self,
        core: CloudCore,
        *,
        bulk_models: frozenset[str] | None = BULK_MODELS,
        bulk_stockout: str = "wait",
        resize_requests: bool = True,
    ) -> None:
        self.state = state = ComputeState(core)
        self.operations = operations = Operations(core)
        self.kept = TemplatesAndPolicies(state, operations)
        self.instances = Instances(state, operations)
        self.migs = Migs(state, operations, self.instances, self.kept, bulk_models, bulk_stockout)
        self.resize_requests = ResizeRequests(state, operations, self.migs, resize_requests)
        self._routes: list[tuple[re.Pattern[str], Callable[..., Any]]] = [
            (re.compile(rf"{_PROJECT}/zones/{NAME}/(machineTypes|acceleratorTypes)/{NAME}$"), self._offered),
            (re.compile(rf"{_PROJECT}/zones/{NAME}/instances(?:/{NAME}(?:/(setMetadata))?)?$"), self.instances.route),
            (re.compile(rf"{_PROJECT}/regions/{NAME}/resourcePolicies(?:/{NAME})?$"), self.kept.policies_route),
            (re.compile(rf"{_PROJECT}/global/instanceTemplates(?:/{NAME})?$"), self.kept.templates_route),
            (
                re.compile(rf"{_PROJECT}/zones/{NAME}/instanceGroupManagers/{NAME}/resizeRequests(?:/{NAME})?$"),
                self.resize_requests.route,
            ),
            (
                re.compile(rf"{_PROJECT}/zones/{NAME}/instanceGroupManagers(?:/{NAME}(?:/{NAME})?)?$"),
                self.migs.route,
            ),
            (
                re.compile(rf"{_PROJECT}/((?:zones|regions)/[^/]+|global)/operations/{NAME}(/wait)?$"),
                self.operations.route,
            ),
        ]

    # ================================================================= routes
    def owns(self, path: str) -> bool:
        return path.startswith("/compute/")

    def route(self, method: str, path: str, query: dict[str, str], body: dict[str, Any]) -> Any:
        for pattern, handler in self._routes:
            if m := pattern.match(path):
                return handler(Request(method, query, body), *m.groups())
        return None

    def error_json(self, e: ApiError) -> dict[str, Any]:
        return compute_error_json(e, _REASONS)

    def _offered(self, req: Request, project: str, zone: str, collection: str, name: str) -> Any:
        """machineTypes.get / acceleratorTypes.get: the type in the zone, or NOT_FOUND."""
        if req.method != "GET":
            return None
        where = f"projects/{project}/zones/{zone}/{collection}/{name}"
        if not offerings.compute_offers(self.state.core, zone, collection, name):
            raise not_found(where)
        item: dict[str, Any] = {"kind": f"compute#{collection[:-1]}", "name": name, "zone": zone, "description": name}
        item["selfLink"] = url(where)
        tpu = offerings.TPU_MACHINE_TYPES.get(name)
        if tpu is not None:
            item["accelerators"] = [
                {"guestAcceleratorType": f"tpu-{tpu.generation}", "guestAcceleratorCount": tpu.chips}
            ]
        return item

    # ================================================================= hooks for the server and the local cloud
    def machines(self) -> list[CloudMachine]:
        standalone = [snapshot(m) for m in self.state.standalone()]
        return standalone + [mig_views.slice_of(mig) for mig in self.state.migs.values()]

    def stored(self, name: str) -> CloudMachine | None:
        """The instance record itself (a MIG's VMs too)."""
        return next((m for m in self.state.vms.values() if m.name == name), None)

    def machine(self, name: str) -> CloudMachine | None:
        """A standalone instance or a MIG slice, by its name."""
        mig = self.state.named(name)
        if mig is not None:
            return mig_views.slice_of(mig)
        m = self.stored(name)
        return snapshot(m) if m is not None and key(m) not in self.state.managed else None

    def waiting(self) -> list[tuple[str, str]]:
        """(name, zone) of each machine now waiting for capacity in its zone: a flex-start instance in the queue,
        a MIG whose BULK creation waits, or whose resize request is not yet granted."""
        vms = self.state.vms
        instances = [(vms[k].name, vms[k].zone) for k in vms if k in self.state.flex_waiting]
        migs = [
            (mig.name, mig.zone)
            for mig in self.state.migs.values()
            if mig.progress_error is not None or any(rr.open for rr in mig.resize_requests.values())
        ]
        return instances + migs

    def live_in(self, zone: str) -> int:
        standalone = sum(1 for m in self.state.standalone() if m.zone == zone)
        created = {g for g in self.state.managed.values() if g[1] == zone}  # MIGs with a VM created hold capacity
        return standalone + len(created & self.state.migs.keys())

    def leftovers(self) -> list[str]:
        instances = [instance_path(*k) for k in self.state.vms]
        migs = [mig.path for mig in self.state.migs.values()]
        requests = [f"{mig.path}/resizeRequests/{r}" for mig in self.state.migs.values() for r in mig.resize_requests]
        return instances + migs + requests + self.kept.leftovers()

    def preempt(self, name: str, worker: int | None) -> CloudMachine | None:
        """An instance -> TERMINATED, or deleted when it asked for instanceTerminationAction DELETE (as respawn's
        Spot VMs do). A MIG slice (or one of its VMs by name): every VM, or worker `worker` only, likewise; the
        MIG repairs nothing. None when there is no such machine."""
        return self._each_vm(name, worker, self.instances.preempt)

    def set_state(self, name: str, state: str, worker: int | None) -> CloudMachine | None:
        """An instance's `status`; a MIG slice's VMs' (every VM, or worker `worker` only)."""
        return self._each_vm(name, worker, lambda vm: self.instances.set(vm, state))

    def _each_vm(self, name: str, worker: int | None, act: Callable[[CloudMachine], object]) -> CloudMachine | None:
        mig = self.state.named(name)
        vm = self.stored(name)
        managed = self.state.managed
        if mig is None and vm is not None and key(vm) in managed:  # a MIG's VM by its own name
            mig = self.state.migs[managed[key(vm)]]
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
            if (m := self.state.vms.get((mig.project, mig.zone, vm_name))) is not None:
                act(m)
        self.migs.refresh(mig)
        return mig_views.slice_of(mig)
