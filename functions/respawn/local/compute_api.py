"""The local Compute Engine v1 API: the instances respawn's GPU VMs are, as google-cloud-compute calls them.

  POST   /compute/v1/projects/P/zones/Z/instances        -> Operation
  GET    /compute/v1/projects/P/zones/Z/instances[/N]    (list takes `filter`)
  DELETE /compute/v1/projects/P/zones/Z/instances/N      -> Operation
  GET    /compute/v1/projects/P/zones/Z/operations/OP
  POST   /compute/v1/projects/P/zones/Z/operations/OP/wait

An instance goes PROVISIONING -> RUNNING after `create_delay_s`; its insert operation is done then. A stockout
ends the insert operation with ZONE_RESOURCE_POOL_EXHAUSTED. Errors carry `errors[].reason` as Compute's do, so
the client raises the matching exceptions.
"""

from __future__ import annotations

import copy
import re
import time
from http import HTTPStatus
from typing import Any

from respawn.local.apicore import (
    GPU,
    WAIT_MAX_S,
    ApiError,
    CloudCore,
    CloudMachine,
    MachineCall,
    list_filter,
    rfc3339,
    snapshot,
)

COMPUTE = "https://www.googleapis.com/compute/v1"
_REASONS = {404: "notFound", 409: "alreadyExists", 403: "forbidden", 429: "rateLimitExceeded"}
_PATH = re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/(instances|operations)(?:/([^/]+))?(/wait)?$")


class ComputeApi:
    """Compute Engine v1 instances and zone operations, on the shared CloudCore."""

    def __init__(self, core: CloudCore) -> None:
        self.core = core
        self.instances: dict[tuple[str, str, str], CloudMachine] = {}  # (project, zone, name)
        self.ops: dict[str, dict[str, Any]] = {}  # operation name -> {"zone", "target", "json", "waiting": key}

    # ----------------------------------------------------------------- hooks
    def owns(self, path: str) -> bool:
        return path.startswith("/compute/")

    def machines(self) -> list[CloudMachine]:
        return [snapshot(m) for m in self.instances.values()]

    def stored(self, name: str) -> CloudMachine | None:
        return next((m for m in self.instances.values() if m.name == name), None)

    def machine(self, name: str) -> CloudMachine | None:
        m = self.stored(name)
        return snapshot(m) if m else None

    def live_in(self, zone: str) -> int:
        return sum(1 for m in self.instances.values() if m.zone == zone)

    def leftovers(self) -> list[str]:
        return [f"projects/{p}/zones/{z}/instances/{n}" for p, z, n in self.instances]

    def preempt(self, name: str, worker: int | None) -> CloudMachine | None:
        """The instance -> TERMINATED, or deleted when it asked for instanceTerminationAction DELETE (as respawn's
        Spot VMs do). None when there is none."""
        core = self.core
        m = self.stored(name)
        if m is None:
            return None
        if (m.resource.get("scheduling") or {}).get("instanceTerminationAction") == "DELETE":
            del self.instances[(m.project, m.zone, m.name)]
            core.deleted(m)
            return self._set(m, "STOPPING")
        return self._set(m, "TERMINATED")

    def set_state(self, name: str, state: str, worker: int | None) -> CloudMachine | None:
        m = self.stored(name)
        return self._set(m, state) if m else None

    def _set(self, m: CloudMachine, state: str) -> CloudMachine:
        m.state = state
        self.core.changed()
        return snapshot(m)

    # ----------------------------------------------------------------- routes
    def route(self, method: str, path: str, query: dict[str, str], body: dict[str, Any]) -> Any:
        m = _PATH.match(path)
        if m is None:
            return None
        project, zone, collection, name, wait = m.groups()
        if collection == "operations" and name and (method, bool(wait)) in (("GET", False), ("POST", True)):
            return self.operation(name, wait=bool(wait))
        if collection == "instances" and not wait:

            def instance_name() -> str:
                if not body.get("name"):
                    raise ApiError(400, "INVALID_ARGUMENT", "Invalid value for field 'resource.name': ''")
                return str(body["name"])

            def instance_list(items: list[dict[str, Any]]) -> dict[str, Any]:
                if query.get("filter"):
                    items = [i for i in items if list_filter(query["filter"])(i)]
                listing = f"projects/{project}/zones/{zone}/instances"
                return {"kind": "compute#instanceList", "id": listing, "items": items}

            return MachineCall(method, project, zone, name, body).answer(self, instance_name, instance_list)
        return None

    def error_json(self, e: ApiError) -> dict[str, Any]:
        """Compute's error: code, message and errors[].reason."""
        reason = e.reason or _REASONS.get(e.code, e.status.lower())
        return {
            "error": {
                "code": e.code,
                "message": e.message,
                "errors": [{"message": e.message, "domain": "global", "reason": reason}],
            }
        }

    # ----------------------------------------------------------------- instances
    def create_machine(self, project: str, zone: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        core = self.core
        with core._lock:
            fault = core.record("create", GPU, name, zone, "instances")
            if fault and not fault.in_operation:
                raise ApiError.of(fault)
            key = (project, zone, name)
            if key in self.instances:
                raise ApiError(409, "ALREADY_EXISTS", f"The resource '{_instance_path(*key)}' already exists")
            op = self._new_op(project, zone, name, "insert")
            if fault:
                return self._finish(op, ApiError.of(fault))
            if core.stocked_out(zone, _spot(body)):
                return self._finish(op, _capacity_error(project, zone))
            self._make(project, zone, name, body)
            op["waiting"] = key
            return copy.deepcopy(op["json"])

    def _make(self, project: str, zone: str, name: str, body: dict[str, Any]) -> CloudMachine:
        """A new instance, PROVISIONING, RUNNING after `create_delay_s`. Called with the lock held."""
        now = time.time()
        labels = dict(body.get("labels") or {})
        metadata = {i["key"]: i.get("value", "") for i in (body.get("metadata") or {}).get("items", [])}
        m = CloudMachine(GPU, name, zone, project, labels, metadata, "PROVISIONING", now, copy.deepcopy(body))
        key = (project, zone, name)
        self.instances[key] = m
        self.core.later(self.core.create_delay_s, self._become_ready, key, now)
        self.core.changed()
        return m

    def _become_ready(self, key: tuple[str, str, str], created_at: float) -> None:
        core = self.core
        with core._lock:
            m = self.instances.get(key)
            if m is None or m.created_at != created_at:
                return
            if m.state == "PROVISIONING":  # not moved on by set_state / preempt meanwhile
                m.state = "RUNNING"
                core.ready(m)
            for op in self.ops.values():
                if op.get("waiting") == key:
                    op["waiting"] = None
                    self._finish(op, None)
            core.changed()

    def get_machine(self, project: str, zone: str, name: str) -> dict[str, Any]:
        with self.core._lock:
            self.core.check("get", GPU, name, zone, "instances")
            m = self.instances.get((project, zone, name))
            if m is None:
                raise ApiError(404, "NOT_FOUND", f"The resource '{_instance_path(project, zone, name)}' was not found")
            return _instance_json(m)

    def list_machines(self, project: str, zone: str) -> list[dict[str, Any]]:
        with self.core._lock:
            self.core.check("list", GPU, "", zone, "instances")
            return [_instance_json(m) for (p, z, _), m in sorted(self.instances.items()) if (p, z) == (project, zone)]

    def delete_machine(self, project: str, zone: str, name: str) -> dict[str, Any]:
        core = self.core
        with core._lock:
            core.check("delete", GPU, name, zone, "instances")
            key = (project, zone, name)
            m = self.instances.pop(key, None)
            if m is None:
                raise ApiError(404, "NOT_FOUND", f"The resource '{_instance_path(*key)}' was not found")
            m.state = "STOPPING"
            for op in self.ops.values():
                if op.get("waiting") == key:  # an insert still in flight completes
                    op["waiting"] = None
                    self._finish(op, None)
            core.deleted(m)
            op = self._new_op(project, zone, name, "delete")
            core.changed()
            return self._finish(op, None)

    # ----------------------------------------------------------------- operations
    def operation(self, name: str, wait: bool = False) -> dict[str, Any]:
        core = self.core
        with core._lock:
            op = self.ops.get(name)
            if op is None:
                raise ApiError(404, "NOT_FOUND", f"The resource '{name}' was not found", "notFound")
            core.record("operation", GPU, op["target"], op["zone"], "operations")
            if wait:
                core.wait_until(lambda: op["waiting"] is None, WAIT_MAX_S)
            return copy.deepcopy(op["json"])

    def _new_op(self, project: str, zone: str, target: str, verb: str) -> dict[str, Any]:
        n = self.core.next_id()
        now = time.time()
        name = f"operation-{int(now * 1000)}-{n:08x}"
        base = f"{COMPUTE}/projects/{project}/zones/{zone}"
        body: dict[str, Any] = {
            "kind": "compute#operation",
            "id": str(n),
            "name": name,
            "zone": base,
            "operationType": verb,
            "targetLink": f"{base}/instances/{target}",
            "status": "RUNNING",
            "progress": 0,
            "insertTime": rfc3339(now),
            "startTime": rfc3339(now),
            "selfLink": f"{base}/operations/{name}",
            "user": "anonymous",
        }
        op = {"zone": zone, "target": target, "json": body, "waiting": None}
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
        self.core.changed()
        return copy.deepcopy(body)


def _instance_path(project: str, zone: str, name: str) -> str:
    return f"projects/{project}/zones/{zone}/instances/{name}"


def _capacity_error(project: str, zone: str) -> ApiError:
    return ApiError(
        503,
        "UNAVAILABLE",
        f"The zone 'projects/{project}/zones/{zone}' does not have enough resources available to "
        "fulfill the request.  Try a different zone, or try again later.",
        "ZONE_RESOURCE_POOL_EXHAUSTED",
    )


def _spot(body: dict[str, Any]) -> bool:
    """An instance body asking for Spot or preemptible capacity."""
    scheduling = body.get("scheduling") or {}
    return scheduling.get("provisioningModel") == "SPOT" or bool(scheduling.get("preemptible"))


def _instance_json(m: CloudMachine) -> dict[str, Any]:
    body = copy.deepcopy(m.resource)
    base = f"{COMPUTE}/projects/{m.project}/zones/{m.zone}"
    body.update(
        kind="compute#instance",
        name=m.name,
        zone=base,
        status=m.state,
        labels=dict(m.labels),
        creationTimestamp=rfc3339(m.created_at),
        selfLink=f"{base}/instances/{m.name}",
    )
    body.setdefault("metadata", {})["fingerprint"] = "bG9jYWw="
    return body
