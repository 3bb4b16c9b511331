"""The local Cloud TPU v2 API: nodes, queued resources and their operations, as google-cloud-tpu calls them.

  POST   /v2/projects/P/locations/Z/nodes?nodeId=N      -> Operation
  GET    /v2/projects/P/locations/Z/nodes[/N]
  PATCH  /v2/projects/P/locations/Z/nodes/N?updateMask=M -> Operation
  DELETE /v2/projects/P/locations/Z/nodes/N              -> Operation
  POST   /v2/projects/P/locations/Z/queuedResources?queuedResourceId=N -> Operation
  GET    /v2/projects/P/locations/Z/queuedResources[/N]
  DELETE /v2/projects/P/locations/Z/queuedResources/N[?force=true] -> Operation
  GET    /v2/projects/P/locations/Z/operations/OP
  GET    /v2/projects/P/locations/Z/acceleratorTypes/T   (what the zone offers: offerings.py)

A node goes CREATING -> READY after `create_delay_s` (its create operation is done then, like the real one). A
queued resource is ACCEPTED and provisioned at once, or waits WAITING_FOR_RESOURCES for its zone's `queue_waits`
seconds (None: until deleted); provisioning creates its node (CREATING -> READY, the queued resource ACTIVE). A
preempted node is PREEMPTED and its queued resource SUSPENDED, as in the cloud; deleting a queued resource that
still has a node needs `force`. A stockout ends the create operation with code 8 "There is no more capacity in the
zone ...". Errors are google.rpc.Status JSON, so the client raises the matching exceptions.

`nodes.patch` changes the fields its `updateMask` names, of those the v2 method lists (tpu.v2 discovery document:
"Supported fields: [description, tags, labels, metadata, network_config.enable_external_ips]"); a mask naming any other
field, or none, is refused with INVALID_ARGUMENT. A masked field the body leaves out is cleared
(https://google.aip.dev/134). A node's new metadata reaches the metadata servers of its running worker VMs
(CloudCore.metadata_written).
"""

from __future__ import annotations

import copy
import functools
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from localcloud.apis import offerings
from localcloud.apis.apicore import (
    GRPC_CODES,
    TPU,
    ApiError,
    CloudCore,
    CloudMachine,
    Fault,
    MachineCall,
    rfc3339,
    snapshot,
)

_PATH = re.compile(r"^/v2/projects/([^/]+)/locations/([^/]+)/(nodes|queuedResources|operations)(?:/([^/:]+))?$")
_QR_STATE_DATA = {
    "ACCEPTED": "acceptedData",
    "WAITING_FOR_RESOURCES": "waitingForResourcesData",
    "PROVISIONING": "provisioningData",
    "ACTIVE": "activeData",
    "SUSPENDED": "suspendedData",
    "FAILED": "failedData",
}


@dataclass
class QueuedResource:
    """A TPU queued resource: one node request waiting in the zone's queue, then holding its node."""

    name: str
    zone: str
    project: str
    body: dict[str, Any]  # the JSON body as created
    state: str  # WAITING_FOR_RESOURCES | ACCEPTED | PROVISIONING | ACTIVE | SUSPENDED | FAILED
    created_at: float
    error: dict[str, Any] | None = None  # FAILED: {"code", "message"}

    @property
    def path(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}/queuedResources/{self.name}"


class TpuApi:
    """Cloud TPU v2 nodes and queued resources, on the shared CloudCore."""

    def __init__(self, core: CloudCore) -> None:
        self.core = core
        self.nodes: dict[tuple[str, str, str], CloudMachine] = {}  # (project, zone, name)
        self.queued: dict[tuple[str, str, str], QueuedResource] = {}  # (project, zone, name)
        self.ops: dict[str, dict[str, Any]] = {}  # operation name -> {"zone", "target", "json", "waiting": key}

    # ----------------------------------------------------------------- hooks
    def owns(self, path: str) -> bool:
        return path.startswith("/v2/")

    def machines(self) -> list[CloudMachine]:
        return [snapshot(m) for m in self.nodes.values()]

    def stored(self, name: str) -> CloudMachine | None:
        return next((m for m in self.nodes.values() if m.name == name), None)

    def machine(self, name: str) -> CloudMachine | None:
        m = self.stored(name)
        return snapshot(m) if m else None

    def queued_resources(self) -> list[QueuedResource]:
        return [replace(q, body=q.body) for q in self.queued.values()]

    def live_in(self, zone: str) -> int:
        return sum(1 for m in self.nodes.values() if m.zone == zone)

    def leftovers(self) -> list[str]:
        nodes = [f"projects/{p}/locations/{z}/nodes/{n}" for p, z, n in self.nodes]
        return nodes + [q.path for q in self.queued.values()]

    def preempt(self, name: str, worker: int | None) -> CloudMachine | None:
        """The node -> PREEMPTED, whichever worker was hit (a slice is lost whole), its queued resource
        SUSPENDED."""
        m = self.stored(name)
        if m is None:
            return None
        qr = self.queued.get((m.project, m.zone, m.name))
        if qr is not None:  # a preempted Spot queued resource: SUSPENDING -> SUSPENDED
            qr.state = "SUSPENDED"
        return self._set(m, "PREEMPTED")

    def set_state(self, name: str, state: str, worker: int | None) -> CloudMachine | None:
        """The node's `state` (one for the whole node, whichever worker)."""
        m = self.stored(name)
        return self._set(m, state) if m else None

    def _set(self, m: CloudMachine, state: str) -> CloudMachine:
        m.state = state
        self.core.changed()
        return snapshot(m)

    # ----------------------------------------------------------------- routes
    def route(self, method: str, path: str, query: dict[str, str], body: dict[str, Any]) -> Any:
        offered = offerings.tpu_route(self.core, method, path)
        if offered is not None:
            return offered
        m = _PATH.match(path)
        if m is None:
            return None
        project, zone, collection, name = m.groups()
        if collection == "operations" and method == "GET" and name:
            return self.operation(f"projects/{project}/locations/{zone}/operations/{name}")
        if collection == "nodes" and method == "PATCH" and name:
            return patch_node(self, project, zone, name, query.get("updateMask", ""), body)
        if collection == "nodes":
            node_id = functools.partial(_node_id, query)
            return MachineCall(method, project, zone, name, body).answer(self, node_id, lambda n: {"nodes": n})
        if collection == "queuedResources":
            if method == "POST" and not name:
                if not query.get("queuedResourceId"):
                    raise ApiError(400, "INVALID_ARGUMENT", "queuedResourceId is required")
                return self.create_queued(project, zone, query["queuedResourceId"], body)
            if method == "GET" and name:
                return self.get_queued(project, zone, name)
            if method == "GET":
                return {"queuedResources": self.list_queued(project, zone)}
            if method == "DELETE" and name:
                return self.delete_queued(project, zone, name, query.get("force") == "true")
        return None

    def error_json(self, e: ApiError) -> dict[str, Any]:
        """google.rpc.Status style: code, message, status."""
        return {"error": {"code": e.code, "message": e.message, "status": e.status}}

    def _admitted(
        self, key: tuple[str, str, str], collection: str, kept: Mapping[Any, object], path: str
    ) -> Fault | None:
        """Record a create call; raise its injected fault (but one that fails the operation, returned) or
        ALREADY_EXISTS for a name `kept` holds. Called with the lock held."""
        fault = self.core.record("create", TPU, key[2], key[1], collection)
        if fault and not fault.in_operation:
            raise ApiError.of(fault)
        if key in kept:
            raise ApiError(409, "ALREADY_EXISTS", f"Resource '{path}' already exists")
        return fault

    # ----------------------------------------------------------------- nodes
    def create_machine(self, project: str, zone: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        core = self.core
        with core.lock:
            key = (project, zone, name)
            fault = self._admitted(key, "nodes", self.nodes, _node_path(*key))
            accelerator = str(body.get("acceleratorType") or "")
            offerings.check_offered(core, zone, accelerator, "node.acceleratorType", accelerator, "Accelerator type")
            op = self._new_op(project, zone, name, "create")
            if fault:
                return self._finish(op, ApiError.of(fault))
            if core.stocked_out(zone, _spot(body)):
                return self._finish(op, _capacity_error(zone))
            self._make(project, zone, name, body)
            op["waiting"] = key
            return copy.deepcopy(op["json"])

    def _make(self, project: str, zone: str, name: str, body: dict[str, Any]) -> CloudMachine:
        """A new node, CREATING, READY after `create_delay_s`. Called with the lock held."""
        now = time.time()
        labels = dict(body.get("labels") or {})
        metadata = dict(body.get("metadata") or {})
        m = CloudMachine(TPU, name, zone, project, labels, metadata, "CREATING", now, copy.deepcopy(body), api="tpu")
        key = (project, zone, name)
        self.nodes[key] = m
        self.core.later(self.core.create_delay_s, self._become_ready, key, now)
        self.core.changed()
        return m

    def _become_ready(self, key: tuple[str, str, str], created_at: float) -> None:
        core = self.core
        with core.lock:
            m = self.nodes.get(key)
            if m is None or m.created_at != created_at:
                return
            if m.state == "CREATING":  # not moved on by set_state / preempt meanwhile
                m.state = "READY"
                qr = self.queued.get(key)
                if qr is not None and qr.state == "PROVISIONING":
                    qr.state = "ACTIVE"
                core.ready(m)
            for op in self.ops.values():
                if op.get("waiting") == key:
                    op["waiting"] = None
                    self._finish(op, None, m)
            core.changed()

    def get_machine(self, project: str, zone: str, name: str) -> dict[str, Any]:
        with self.core.lock:
            self.core.check("get", TPU, name, zone, "nodes")
            m = self.nodes.get((project, zone, name))
            if m is None:
                raise ApiError(404, "NOT_FOUND", f"Resource '{_node_path(project, zone, name)}' was not found")
            return _node_json(m)

    def list_machines(self, project: str, zone: str) -> list[dict[str, Any]]:
        with self.core.lock:
            self.core.check("list", TPU, "", zone, "nodes")
            return [_node_json(m) for (p, z, _), m in sorted(self.nodes.items()) if (p, z) == (project, zone)]

    def delete_machine(self, project: str, zone: str, name: str) -> dict[str, Any]:
        core = self.core
        with core.lock:
            core.check("delete", TPU, name, zone, "nodes")
            key = (project, zone, name)
            m = self.nodes.pop(key, None)
            if m is None:
                raise ApiError(404, "NOT_FOUND", f"Resource '{_node_path(*key)}' was not found")
            m.state = "DELETING"
            for op in self.ops.values():
                if op.get("waiting") == key:  # a create still in flight completes
                    op["waiting"] = None
                    self._finish(op, None, m)
            core.deleted(m)
            op = self._new_op(project, zone, name, "delete")
            core.changed()
            return self._finish(op, None)

    # ----------------------------------------------------------------- queued resources
    def create_queued(self, project: str, zone: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        core = self.core
        with core.lock:
            key = (project, zone, name)
            fault = self._admitted(key, "queuedResources", self.queued, _qr_path(*key))
            specs = (body.get("tpu") or {}).get("nodeSpec") or []
            if len(specs) != 1 or not specs[0].get("nodeId") or not isinstance(specs[0].get("node"), dict):
                raise ApiError(400, "INVALID_ARGUMENT", "tpu.nodeSpec must hold one node with a nodeId")
            accelerator = str(specs[0]["node"].get("acceleratorType") or "")
            offerings.check_offered(
                core, zone, accelerator, "tpu.nodeSpec[0].node.acceleratorType", accelerator, "Accelerator type"
            )
            qr = QueuedResource(name, zone, project, copy.deepcopy(body), "ACCEPTED", time.time())
            self.queued[key] = qr
            waits, wait = core.queue_wait(zone, "spot" in body)
            if fault:  # the request was taken, and then the queued resource failed
                qr.state, qr.error = "FAILED", {"code": GRPC_CODES.get(fault.status, 2), "message": fault.message}
            elif waits:
                qr.state = "WAITING_FOR_RESOURCES"
                if wait is not None:
                    core.later(wait, self._provision, key, qr.created_at)
            else:
                self._provision(key, qr.created_at)
            op = self._new_op(project, zone, name, "create", "queuedResources")
            core.changed()
            return self._finish(op, None, None, qr)

    def _provision(self, key: tuple[str, str, str], created_at: float) -> None:
        """The queue gave the request its capacity: PROVISIONING, and its node is created."""
        with self.core.lock:
            qr = self.queued.get(key)
            if qr is None or qr.created_at != created_at or qr.state not in ("ACCEPTED", "WAITING_FOR_RESOURCES"):
                return
            qr.state = "PROVISIONING"
            spec = qr.body["tpu"]["nodeSpec"][0]
            node = {**spec["node"], "queuedResource": qr.path}
            self.nodes.pop((qr.project, qr.zone, spec["nodeId"]), None)
            self._make(qr.project, qr.zone, spec["nodeId"], node)

    def _queued_resource(self, verb: str, project: str, zone: str, name: str) -> QueuedResource:
        """Record the call; the queued resource, or the injected fault or a 404. Called with the lock held."""
        self.core.check(verb, TPU, name, zone, "queuedResources")
        qr = self.queued.get((project, zone, name))
        if qr is None:
            raise ApiError(404, "NOT_FOUND", f"Resource '{_qr_path(project, zone, name)}' was not found")
        return qr

    def delete_queued(self, project: str, zone: str, name: str, force: bool) -> dict[str, Any]:
        core = self.core
        with core.lock:
            qr = self._queued_resource("delete", project, zone, name)
            node = self.nodes.get((project, zone, qr.body["tpu"]["nodeSpec"][0]["nodeId"]))
            if node is not None and not force:
                raise ApiError(
                    400, "FAILED_PRECONDITION", f"Queued resource '{qr.path}' has a node; delete it or use force"
                )
            del self.queued[(project, zone, name)]
            if node is not None:
                self.nodes.pop((project, zone, node.name), None)
                node.state = "DELETING"
                core.deleted(node)
            op = self._new_op(project, zone, name, "delete", "queuedResources")
            core.changed()
            return self._finish(op, None)

    def get_queued(self, project: str, zone: str, name: str) -> dict[str, Any]:
        with self.core.lock:
            return _queued_json(self._queued_resource("get", project, zone, name))

    def list_queued(self, project: str, zone: str) -> list[dict[str, Any]]:
        with self.core.lock:
            self.core.check("list", TPU, "", zone, "queuedResources")
            return [_queued_json(q) for (p, z, _), q in sorted(self.queued.items()) if (p, z) == (project, zone)]

    # ----------------------------------------------------------------- operations
    def operation(self, name: str) -> dict[str, Any]:
        with self.core.lock:
            op = self.ops.get(name)
            if op is None:
                raise ApiError(404, "NOT_FOUND", f"Resource '{name}' was not found")
            self.core.record("operation", TPU, op["target"], op["zone"], "operations")
            return copy.deepcopy(op["json"])

    def _new_op(self, project: str, zone: str, target: str, verb: str, collection: str = "nodes") -> dict[str, Any]:
        name = f"projects/{project}/locations/{zone}/operations/operation-{self.core.next_id()}"
        body: dict[str, Any] = {
            "name": name,
            "done": False,
            "metadata": {
                "@type": "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata",
                "createTime": rfc3339(time.time()),
                "target": f"projects/{project}/locations/{zone}/{collection}/{target}",
                "verb": verb,
                "apiVersion": "v2",
            },
        }
        op = {"zone": zone, "target": target, "json": body, "waiting": None}
        self.ops[name] = op
        return op

    def _finish(
        self,
        op: dict[str, Any],
        error: ApiError | None,
        m: CloudMachine | None = None,
        qr: QueuedResource | None = None,
    ) -> dict[str, Any]:
        body = op["json"]
        body["done"] = True
        if error:
            body["error"] = {"code": GRPC_CODES.get(error.status, 2), "message": error.message}
        elif qr is not None:
            body["response"] = {"@type": "type.googleapis.com/google.cloud.tpu.v2.QueuedResource", **_queued_json(qr)}
        elif m is not None:
            body["response"] = {"@type": "type.googleapis.com/google.cloud.tpu.v2.Node", **_node_json(m)}
        else:
            body["response"] = {"@type": "type.googleapis.com/google.protobuf.Empty"}
        self.core.changed()
        return copy.deepcopy(body)


def _node_path(project: str, zone: str, name: str) -> str:
    return f"projects/{project}/locations/{zone}/nodes/{name}"


def _qr_path(project: str, zone: str, name: str) -> str:
    return f"projects/{project}/locations/{zone}/queuedResources/{name}"


def patch_node(api: TpuApi, project: str, zone: str, name: str, mask: str, body: dict[str, Any]) -> dict[str, Any]:
    """nodes.patch: the fields `mask` names, from `body`; an operation, done at once, whose response is the node."""
    core = api.core
    with core.lock:
        core.check("update", TPU, name, zone, "nodes")
        paths = _update_paths(mask)
        m = api.nodes.get((project, zone, name))
        if m is None:
            raise ApiError(404, "NOT_FOUND", f"Resource '{_node_path(project, zone, name)}' was not found")
        resource = copy.deepcopy(m.resource)
        for path in paths:
            if path == "labels":
                m.labels = _string_map(body, "labels")
            elif path == "metadata":
                m.metadata = _string_map(body, "metadata")
            elif path == "networkConfig.enableExternalIps":
                enable = (body.get("networkConfig") or {}).get("enableExternalIps", False)
                resource["networkConfig"] = {**(resource.get("networkConfig") or {}), "enableExternalIps": enable}
            elif path in body:  # description, tags
                resource[path] = copy.deepcopy(body[path])
            else:
                resource.pop(path, None)
        m.resource = resource  # a new dict: snapshots handed out share the old one
        if "metadata" in paths:
            core.metadata_written(m)
        return api._finish(api._new_op(project, zone, name, "update"), None, m)


def _node_id(query: dict[str, str]) -> str:
    """A node create's nodeId (required)."""
    if not query.get("nodeId"):
        raise ApiError(400, "INVALID_ARGUMENT", "nodeId is required")
    return query["nodeId"]


# nodes.patch's updateMask: the fields tpu.v2's discovery document lists, as JSON (camelCase) paths
_PATCHABLE = ("description", "tags", "labels", "metadata", "networkConfig.enableExternalIps")


def _update_paths(mask: str) -> list[str]:
    """The paths of an updateMask (google-fieldmask: comma-separated, snake_case or camelCase), each one nodes.patch
    updates; else INVALID_ARGUMENT."""
    paths = [_camel(p.strip()) for p in mask.split(",") if p.strip()]
    if not paths:
        raise ApiError(400, "INVALID_ARGUMENT", "updateMask is required: the fields of the node to update")
    for path in paths:
        if path not in _PATCHABLE:
            raise ApiError(
                400,
                "INVALID_ARGUMENT",
                f"Invalid field mask path '{path}': nodes.patch updates only description, tags, labels, metadata "
                "and network_config.enable_external_ips",
            )
    return paths


def _camel(path: str) -> str:
    return ".".join(re.sub(r"_([a-z])", lambda g: g[1].upper(), part) for part in path.split("."))


def _string_map(body: dict[str, Any], field: str) -> dict[str, str]:
    """A map<string, string> field of a Node body (absent: empty, the field cleared); else INVALID_ARGUMENT."""
    value = body.get(field) or {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ApiError(400, "INVALID_ARGUMENT", f"Invalid value at 'node.{field}': a map of strings to strings")
    return dict(value)


def _capacity_error(zone: str) -> ApiError:
    return ApiError(
        429,
        "RESOURCE_EXHAUSTED",
        f'There is no more capacity in the zone "{zone}"; you can try in another zone where '
        "Cloud TPU Nodes are offered (see https://cloud.google.com/tpu/docs/regions)",
    )


def _spot(body: dict[str, Any]) -> bool:
    """A node body asking for Spot or preemptible capacity."""
    config = body.get("schedulingConfig") or {}
    return bool(config.get("spot") or config.get("preemptible"))


def _queued_json(qr: QueuedResource) -> dict[str, Any]:
    """The v2 QueuedResource: name, createTime, tpu.nodeSpec, spot|guaranteed, queueingPolicy, state."""
    state: dict[str, Any] = {"state": qr.state, "stateInitiator": "SERVICE"}
    data = _QR_STATE_DATA.get(qr.state)
    if data is not None and data != "waitingForResourcesData":
        state[data] = {"error": qr.error} if qr.state == "FAILED" and qr.error else {}
    return {**copy.deepcopy(qr.body), "name": qr.path, "createTime": rfc3339(qr.created_at), "state": state}


def _node_json(m: CloudMachine) -> dict[str, Any]:
    body = copy.deepcopy(m.resource)
    body.update(
        name=_node_path(m.project, m.zone, m.name),
        state=m.state,
        labels=dict(m.labels),
        metadata=dict(m.metadata),
        createTime=rfc3339(m.created_at),
        apiVersion="V2",
        networkEndpoints=[{"ipAddress": "127.0.0.1", "port": 8470}],
    )
    return body
