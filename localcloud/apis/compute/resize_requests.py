"""The local Compute API's MIG resize requests: VMs added to a flex-start or reservation-bound MIG all at once.

  zones/Z/instanceGroupManagers/M/resizeRequests[/RR]     insert, get, list, delete                zone op

A resize request goes CREATING -> ACCEPTED (waiting for the zone's `queue_waits`) -> SUCCEEDED (its VMs created) or
FAILED; deleting one not yet SUCCEEDED cancels it.
"""

from __future__ import annotations

import copy
import time
from typing import Any

from google.cloud import compute_v1

from localcloud.apis.apicore import TPU, invalid, rfc3339
from localcloud.apis.compute.checks import RESIZE_REQUEST_FIELDS, RESIZE_RUN_S, check_body, check_name, seconds
from localcloud.apis.compute.common import (
    COMPUTE,
    Key,
    Request,
    already_exists,
    capacity_wait,
    create_fault,
    kind_of,
    listing,
    not_found,
)
from localcloud.apis.compute.migs import Migs, check_topology_holds
from localcloud.apis.compute.operations import Operations
from localcloud.apis.compute.state import ComputeState, Mig, ResizeRequest


class ResizeRequests:
    """The resize requests of every MIG (each kept in its MIG's `resize_requests`), which add VMs to `migs`.
    `enabled`: False refuses them in BULK MIGs (see ComputeApi)."""

    def __init__(self, state: ComputeState, operations: Operations, migs: Migs, enabled: bool) -> None:
        self.state, self.core, self.operations = state, state.core, operations
        self.migs, self.enabled = migs, enabled

    def route(self, req: Request, project: str, zone: str, mig_name: str, name: str | None) -> Any:
        if req.method == "POST" and not name:
            return self.insert(project, zone, mig_name, req.body)
        if req.method == "GET" and name:
            with self.core.lock:
                mig, rr = self._get("get", project, zone, mig_name, name)
                return resize_request_json(mig, rr)
        if req.method == "GET":
            with self.core.lock:
                mig = self.migs.get("list", project, zone, mig_name, "resizeRequests")
                items = [resize_request_json(mig, rr) for _, rr in sorted(mig.resize_requests.items())]
            kind = "compute#instanceGroupManagerResizeRequestList"
            return listing(kind, f"{mig.path}/resizeRequests", items, req.query)
        if req.method == "DELETE" and name:
            return self.delete(project, zone, mig_name, name)
        return None

    def insert(self, project: str, zone: str, mig_name: str, body: dict[str, Any]) -> dict[str, Any]:
        core, operations = self.core, self.operations
        with core.lock:
            name = str(body.get("name") or "")
            mig = self.state.migs.get((project, zone, mig_name))
            kind = kind_of(mig.template.machine_type) if mig else ""
            fault = create_fault(core, kind, name, zone, "resizeRequests")
            if mig is None:
                raise not_found(f"projects/{project}/zones/{zone}/instanceGroupManagers/{mig_name}")
            check_body(compute_v1.InstanceGroupManagerResizeRequest, body, RESIZE_REQUEST_FIELDS)
            check_name(body, "resource.name")
            if name in mig.resize_requests:  # before the checks that depend on the MIG's size: a redelivery
                raise already_exists(f"{mig.path}/resizeRequests/{name}")
            if not self.enabled:
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
            check_topology_holds(mig.policy, mig.template, mig.target_size + by, "resource.resizeBy")
            target = f"zones/{zone}/instanceGroupManagers/{mig_name}/resizeRequests/{name}"
            op = operations.new(project, f"zones/{zone}", target, "insert")
            rr = ResizeRequest(name, copy.deepcopy(body), core.next_id(), time.time(), [])
            mig.resize_requests[name] = rr
            if fault:  # taken, and then failed: nothing was added
                rr.state = "FAILED"
                rr.error = {"errors": [{"code": fault.reason or fault.status, "message": fault.message}]}
                return operations.finish(op, None)
            rr.names = self.migs.add(mig, by)
            core.later(0, self.accept, mig.key, name, rr.id)  # accepted next, then waits for capacity
            return operations.finish(op, None)

    def _in(self, mig_key: Key, name: str, rr_id: int, state: str) -> tuple[Mig | None, ResizeRequest | None]:
        """The MIG and its resize request `name` (the one with id `rr_id`) while the request is in `state`; Nones
        once it moved on or is gone (a timer set for it is then moot). Called with the lock held."""
        mig = self.state.migs.get(mig_key)
        rr = mig.resize_requests.get(name) if mig else None
        if mig is None or rr is None or rr.id != rr_id or rr.state != state:
            return None, None
        return mig, rr

    def accept(self, mig_key: Key, name: str, rr_id: int) -> None:
        """CREATING -> ACCEPTED; then the request waits for its zone's queue (flex-start capacity)."""
        with self.core.lock:
            mig, rr = self._in(mig_key, name, rr_id, "CREATING")
            if mig is None or rr is None:
                return
            rr.state = "ACCEPTED"
            waits, wait = self.core.queue_wait(mig.zone, spot=False)
            if not waits:
                self._granted(mig_key, name, rr_id)
            else:  # the request, not the MIG's bulk operation, says why it waits
                rr.last_attempt = capacity_wait(mig.project, mig.zone)
                if wait is not None:
                    self.core.later(wait, self._granted, mig_key, name, rr_id)
            self.core.changed()

    def _granted(self, mig_key: Key, name: str, rr_id: int) -> None:
        with self.core.lock:
            mig, rr = self._in(mig_key, name, rr_id, "ACCEPTED")
            if mig is None or rr is None:
                return
            rr.state, rr.last_attempt = "SUCCEEDED", None
            self.migs.create_vms(mig, rr.names)

    def _get(self, verb: str, project: str, zone: str, mig_name: str, name: str) -> tuple[Mig, ResizeRequest]:
        mig = self.migs.get(verb, project, zone, mig_name, "resizeRequests")
        rr = mig.resize_requests.get(name)
        if rr is None:
            raise not_found(f"{mig.path}/resizeRequests/{name}")
        return mig, rr

    def delete(self, project: str, zone: str, mig_name: str, name: str) -> dict[str, Any]:
        """Delete the request; one not yet SUCCEEDED is cancelled (its managed instances go with it)."""
        with self.core.lock:
            mig, rr = self._get("delete", project, zone, mig_name, name)
            del mig.resize_requests[name]
            if rr.open:
                mig.vms = [vm for vm in mig.vms if vm not in rr.names]
                mig.bulk_in_progress = any(r.open for r in mig.resize_requests.values())
                mig.progress_error = mig.progress_error if mig.bulk_in_progress else None
                self.migs.refresh(mig)
            target = f"zones/{zone}/instanceGroupManagers/{mig_name}/resizeRequests/{name}"
            return self.operations.done(project, f"zones/{zone}", target, "delete")


def resize_request_json(mig: Mig, rr: ResizeRequest) -> dict[str, Any]:
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
