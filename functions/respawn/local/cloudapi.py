"""A local Cloud TPU v2 + Compute Engine REST server: the subset respawn's providers call.

The real google-cloud-tpu and google-cloud-compute clients talk to it with
``transport="rest"``, anonymous credentials and ``api_endpoint=server.url``:

  TPU v2    POST   /v2/projects/P/locations/Z/nodes?nodeId=N      -> Operation
            GET    /v2/projects/P/locations/Z/nodes[/N]
            DELETE /v2/projects/P/locations/Z/nodes/N              -> Operation
            POST   /v2/projects/P/locations/Z/queuedResources?queuedResourceId=N -> Operation
            GET    /v2/projects/P/locations/Z/queuedResources[/N]
            DELETE /v2/projects/P/locations/Z/queuedResources/N[?force=true] -> Operation
            GET    /v2/projects/P/locations/Z/operations/OP
  Compute   POST   /compute/v1/projects/P/zones/Z/instances        -> Operation
            GET    /compute/v1/projects/P/zones/Z/instances[/N]    (list takes `filter`)
            DELETE /compute/v1/projects/P/zones/Z/instances/N      -> Operation
            GET    /compute/v1/projects/P/zones/Z/operations/OP
            POST   /compute/v1/projects/P/zones/Z/operations/OP/wait

Machines go CREATING -> READY after `create_delay_s` (the create operation is
done then, like the real ones). A queued resource is ACCEPTED and provisioned at
once, or waits WAITING_FOR_RESOURCES for its zone's `queue_waits` seconds (None:
until deleted); provisioning creates its node (CREATING -> READY, the queued
resource ACTIVE). A preempted node is PREEMPTED and its queued resource SUSPENDED,
as in the cloud; deleting a queued resource that still has a node needs `force`.
Stockouts of node creates fail the way the real services do:
the TPU create operation ends with code 8 "There is no more capacity in the
zone ...", the Compute insert operation with ZONE_RESOURCE_POOL_EXHAUSTED.
Errors use the Google JSON error format so the client libraries raise the
matching exceptions. States are the APIs' own strings (TPU `state`: CREATING,
READY, PREEMPTED, ...; Compute `status`: PROVISIONING, RUNNING, TERMINATED, ...).
"""

from __future__ import annotations

import copy
import itertools
import json
import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

TPU = "tpu"
GPU = "gpu"
WAIT_MAX_S = 5.0  # the longest a Compute operations.wait call blocks (the real service: 2 minutes)
GRPC_CODES = {
    "CANCELLED": 1,
    "UNKNOWN": 2,
    "INVALID_ARGUMENT": 3,
    "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5,
    "ALREADY_EXISTS": 6,
    "PERMISSION_DENIED": 7,
    "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9,
    "ABORTED": 10,
    "INTERNAL": 13,
    "UNAVAILABLE": 14,
    "UNAUTHENTICATED": 16,
}
_COMPUTE_REASONS = {404: "notFound", 409: "alreadyExists", 403: "forbidden", 429: "rateLimitExceeded"}
_READY = {TPU: "READY", GPU: "RUNNING"}
_CREATING = {TPU: "CREATING", GPU: "PROVISIONING"}
_PREEMPTED = {TPU: "PREEMPTED", GPU: "TERMINATED"}


@dataclass
class CloudMachine:
    """A TPU node (kind tpu) or a GCE instance (kind gpu) as the local cloud sees it."""

    kind: str
    name: str
    zone: str
    project: str
    labels: dict[str, str]
    metadata: dict[str, str]
    state: str  # the API's own string: TPU `state` or Compute `status`
    created_at: float
    resource: dict[str, Any] = field(default_factory=dict)  # the JSON body as created
    deleted_at: float | None = None  # stamped under the API's lock: hooks run later, on their own thread


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


@dataclass(frozen=True)
class Call:
    verb: str  # create | delete | get | list | operation
    kind: str
    name: str
    zone: str
    time: float


@dataclass(frozen=True)
class Fault:
    """An injected failure for the next matching call (see CloudApiServer.fail_next)."""

    verb: str
    kind: str | None
    code: int
    status: str
    message: str
    in_operation: bool
    reason: str | None


class ApiError(Exception):
    def __init__(self, code: int, status: str, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.code, self.status, self.message, self.reason = code, status, message, reason


def _snapshot(m: CloudMachine) -> CloudMachine:
    """A copy safe to hand out (`resource` is never changed after creation, so it is shared)."""
    return replace(m, labels=dict(m.labels), metadata=dict(m.metadata))


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


_FILTER_TERM = re.compile(r'([\w.-]+)\s*(!=|=)\s*("[^"]*"|[^\s()"]+)')


def _compute_filter(expr: str) -> Callable[[dict[str, Any]], bool]:
    """The subset of the Compute list filter respawn uses: `a.b = v` / `a.b != v` terms, ANDed."""
    terms = [(path, op, want.strip('"')) for path, op, want in _FILTER_TERM.findall(expr)]
    if not terms or re.sub(r"\bAND\b|[()\s]", "", _FILTER_TERM.sub("", expr)):
        raise ApiError(400, "INVALID_ARGUMENT", f"Invalid list filter expression: {expr!r}", "invalid")

    def lookup(resource: dict[str, Any], path: str) -> str | None:
        value: Any = resource
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return None if value is None else str(value)

    return lambda resource: all((lookup(resource, p) == want) == (op == "=") for p, op, want in terms)


class CloudApiServer:
    """Thread-safe local TPU v2 + Compute REST server with hooks for the local cloud and tests.

    Knobs: `capacity` (zone -> max machines in the zone, None = unlimited; a machine holds
    capacity until deleted, like quota), `stockouts` (zone -> the next K creates there fail
    with capacity), `create_delay_s`. Callbacks `on_ready(machine)` / `on_deleted(machine)`
    run in order on one worker thread, never while the server holds its lock.
    """

    def __init__(
        self,
        port: int = 0,
        create_delay_s: float = 0.0,
        capacity: dict[str, int | None] | None = None,
        stockouts: dict[str, int] | None = None,
        on_ready: Callable[[CloudMachine], None] | None = None,
        on_deleted: Callable[[CloudMachine], None] | None = None,
        queue_waits: dict[str, float | None] | None = None,
        spot_stockouts: dict[str, int | None] | None = None,
        spot_queue_waits: dict[str, float | None] | None = None,
    ) -> None:
        self.create_delay_s = create_delay_s
        self.capacity: dict[str, int | None] = dict(capacity or {})
        self.stockouts: dict[str, int] = dict(stockouts or {})
        self.queue_waits: dict[str, float | None] = dict(queue_waits or {})  # zone -> seconds in the queue
        # Spot (and preemptible) requests only: a zone short of Spot capacity, on-demand still there.
        self.spot_stockouts: dict[str, int | None] = dict(spot_stockouts or {})  # zone -> next K fail (None: all)
        self.spot_queue_waits: dict[str, float | None] = dict(spot_queue_waits or {})
        self.on_ready = on_ready
        self.on_deleted = on_deleted
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._machines: dict[tuple[str, str, str, str], CloudMachine] = {}  # (kind, project, zone, name)
        self._queued: dict[tuple[str, str, str], QueuedResource] = {}  # (project, zone, name)
        self._ops: dict[str, dict[str, Any]] = {}  # operation name -> {"kind", "json", "waiting": key|None}
        self._calls: list[Call] = []
        self._requests: list[str] = []
        self._faults: list[Fault] = []
        self._ids = itertools.count(1)
        self._callbacks: queue.Queue[tuple[Callable[[CloudMachine], None], CloudMachine] | None] = queue.Queue()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), _handler_class(self))
        self._httpd.daemon_threads = True
        self._threads: list[threading.Thread] = []

    # ----------------------------------------------------------------- lifecycle
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> CloudApiServer:
        for target in (lambda: self._httpd.serve_forever(poll_interval=0.05), self._run_callbacks):
            t = threading.Thread(target=target, name="cloudapi", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        if self._threads:  # shutdown() waits for serve_forever, which only runs after start()
            self._httpd.shutdown()
            self._callbacks.put(None)
        self._httpd.server_close()
        for t in self._threads:
            t.join(timeout=5)
        self._threads.clear()

    def __enter__(self) -> CloudApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----------------------------------------------------------------- hooks
    @property
    def calls(self) -> list[Call]:
        with self._lock:
            return list(self._calls)

    @property
    def requests(self) -> list[str]:
        """Every request as "METHOD /path" (query string left off), in arrival order."""
        with self._lock:
            return list(self._requests)

    def machines(self) -> list[CloudMachine]:
        with self._lock:
            return [_snapshot(m) for m in self._machines.values()]

    def queued_resources(self) -> list[QueuedResource]:
        with self._lock:
            return [replace(q, body=q.body) for q in self._queued.values()]

    def machine(self, name: str) -> CloudMachine | None:
        with self._lock:
            found = self._find(name)
            return _snapshot(found) if found else None

    def preempt(self, name: str) -> CloudMachine | None:
        """TPU node -> PREEMPTED (its queued resource SUSPENDED); GCE instance -> TERMINATED, or deleted when it
        asked for instanceTerminationAction DELETE (as respawn's Spot VMs do). Returns the machine, None when
        there is none."""
        with self._lock:
            m = self._find(name)
            if m is None:
                return None
            if m.kind == GPU and (m.resource.get("scheduling") or {}).get("instanceTerminationAction") == "DELETE":
                del self._machines[(m.kind, m.project, m.zone, m.name)]
                self._deleted(m)
                return self._set(m, "STOPPING")
            qr = self._queued.get((m.project, m.zone, m.name))
            if qr is not None:  # a preempted Spot queued resource: SUSPENDING -> SUSPENDED
                qr.state = "SUSPENDED"
            return self._set(m, _PREEMPTED[m.kind])

    def connect(
        self,
        *,
        on_ready: Callable[[CloudMachine], None] | None,
        on_deleted: Callable[[CloudMachine], None] | None,
    ) -> None:
        """Set the machine hooks once whoever runs the machines exists: the local cloud's nodes call this API back
        (preempt, set_state), so they are built after it."""
        with self._lock:
            self.on_ready, self.on_deleted = on_ready, on_deleted

    def set_state(self, name: str, state: str) -> CloudMachine | None:
        """Set the API state string (TPU `state` / Compute `status`). None when there is no such machine."""
        with self._lock:
            m = self._find(name)
            return self._set(m, state) if m else None

    def fail_next(
        self,
        verb: str,
        *,
        code: int,
        status: str,
        message: str,
        kind: str | None = None,
        in_operation: bool = False,
        reason: str | None = None,
    ) -> None:
        """Fail the next `verb` (create | delete | get | list) call with this error.

        in_operation=True (create only): the call succeeds and its operation ends with the error,
        as capacity and (on Compute) quota failures do for real. `reason` is the Compute error
        reason / operation error code (e.g. QUOTA_EXCEEDED); it defaults from `code`.
        """
        with self._lock:
            self._faults.append(Fault(verb, kind, code, status, message, in_operation, reason))

    # ----------------------------------------------------------------- internals
    def _find(self, name: str) -> CloudMachine | None:
        return next((m for m in self._machines.values() if m.name == name), None)

    def _set(self, m: CloudMachine, state: str) -> CloudMachine:
        m.state = state
        self._changed.notify_all()
        return _snapshot(m)

    def _record(self, verb: str, kind: str, name: str, zone: str) -> Fault | None:
        self._calls.append(Call(verb, kind, name, zone, time.time()))
        for i, f in enumerate(self._faults):
            if f.verb == verb and f.kind in (None, kind):
                return self._faults.pop(i)
        return None

    def _notify(self, callback: Callable[[CloudMachine], None] | None, m: CloudMachine) -> None:
        if callback is not None:
            self._callbacks.put((callback, _snapshot(m)))

    def _deleted(self, m: CloudMachine) -> None:
        m.deleted_at = time.time()
        self._notify(self.on_deleted, m)

    def _run_callbacks(self) -> None:
        while (item := self._callbacks.get()) is not None:
            callback, m = item
            try:
                callback(m)
            except Exception as e:  # a failing hook must not take the server down
                print(f"cloudapi: callback {getattr(callback, '__name__', callback)} failed: {e!r}", flush=True)

    def _stocked_out(self, zone: str, spot: bool = False) -> bool:
        if self.stockouts.get(zone, 0) > 0:
            self.stockouts[zone] -= 1
            return True
        if spot and zone in self.spot_stockouts:
            left = self.spot_stockouts[zone]
            if left is None:
                return True
            if left > 0:
                self.spot_stockouts[zone] = left - 1
                return True
        cap = self.capacity.get(zone)
        return cap is not None and sum(1 for m in self._machines.values() if m.zone == zone) >= cap

    def _become_ready(self, key: tuple[str, str, str, str], created_at: float) -> None:
        with self._lock:
            m = self._machines.get(key)
            if m is None or m.created_at != created_at:
                return
            if m.state == _CREATING[m.kind]:  # not moved on by set_state / preempt meanwhile
                m.state = _READY[m.kind]
                qr = self._queued.get((m.project, m.zone, m.name))
                if qr is not None and qr.state == "PROVISIONING":
                    qr.state = "ACTIVE"
                self._notify(self.on_ready, m)
            for op in self._ops.values():
                if op.get("waiting") == key:
                    op["waiting"] = None
                    self._finish(op, None, m)
            self._changed.notify_all()

    def _create(self, kind: str, project: str, zone: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            fault = self._record("create", kind, name, zone)
            if fault and not fault.in_operation:
                raise ApiError(fault.code, fault.status, fault.message, fault.reason)
            key = (kind, project, zone, name)
            if key in self._machines:
                raise ApiError(409, "ALREADY_EXISTS", _already_exists(kind, project, zone, name), "alreadyExists")
            op = self._new_op(kind, project, zone, name, "create" if kind == TPU else "insert")
            if fault:
                return self._finish(op, ApiError(fault.code, fault.status, fault.message, fault.reason), None)
            if self._stocked_out(zone, _spot(kind, body)):
                return self._finish(op, _capacity_error(kind, project, zone), None)
            self._make(kind, project, zone, name, body)
            op["waiting"] = key
            return copy.deepcopy(op["json"])

    def _make(self, kind: str, project: str, zone: str, name: str, body: dict[str, Any]) -> CloudMachine:
        """A new machine, CREATING, READY after `create_delay_s`. Called with the lock held."""
        now = time.time()
        labels = dict(body.get("labels") or {})
        if kind == TPU:
            metadata = dict(body.get("metadata") or {})
        else:
            metadata = {i["key"]: i.get("value", "") for i in (body.get("metadata") or {}).get("items", [])}
        m = CloudMachine(kind, name, zone, project, labels, metadata, _CREATING[kind], now, copy.deepcopy(body))
        key = (kind, project, zone, name)
        self._machines[key] = m
        timer = threading.Timer(self.create_delay_s, self._become_ready, (key, now))
        timer.daemon = True
        timer.start()
        self._changed.notify_all()
        return m

    # ----------------------------------------------------------------- queued resources
    def _create_queued(self, project: str, zone: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            fault = self._record("create", TPU, name, zone)
            if fault and not fault.in_operation:
                raise ApiError(fault.code, fault.status, fault.message, fault.reason)
            key = (project, zone, name)
            if key in self._queued:
                raise ApiError(409, "ALREADY_EXISTS", f"Resource '{_qr_path(project, zone, name)}' already exists")
            specs = (body.get("tpu") or {}).get("nodeSpec") or []
            if len(specs) != 1 or not specs[0].get("nodeId") or not isinstance(specs[0].get("node"), dict):
                raise ApiError(400, "INVALID_ARGUMENT", "tpu.nodeSpec must hold one node with a nodeId")
            qr = QueuedResource(name, zone, project, copy.deepcopy(body), "ACCEPTED", time.time())
            self._queued[key] = qr
            if fault:  # the request was taken, and then the queued resource failed
                qr.state, qr.error = "FAILED", {"code": GRPC_CODES.get(fault.status, 2), "message": fault.message}
            elif zone in self.queue_waits or ("spot" in body and zone in self.spot_queue_waits):
                qr.state = "WAITING_FOR_RESOURCES"
                wait = self.queue_waits[zone] if zone in self.queue_waits else self.spot_queue_waits[zone]
                if wait is not None:
                    timer = threading.Timer(wait, self._provision, (key, qr.created_at))
                    timer.daemon = True
                    timer.start()
            else:
                self._provision(key, qr.created_at)
            op = self._new_op(TPU, project, zone, name, "create", "queuedResources")
            self._changed.notify_all()
            return self._finish(op, None, None, qr)

    def _provision(self, key: tuple[str, str, str], created_at: float) -> None:
        """The queue gave the request its capacity: PROVISIONING, and its node is created."""
        with self._lock:
            qr = self._queued.get(key)
            if qr is None or qr.created_at != created_at or qr.state not in ("ACCEPTED", "WAITING_FOR_RESOURCES"):
                return
            qr.state = "PROVISIONING"
            spec = qr.body["tpu"]["nodeSpec"][0]
            node = {**spec["node"], "queuedResource": qr.path}
            self._machines.pop((TPU, qr.project, qr.zone, spec["nodeId"]), None)
            self._make(TPU, qr.project, qr.zone, spec["nodeId"], node)

    def _queued_resource(self, verb: str, project: str, zone: str, name: str) -> QueuedResource:
        """Record the call; the queued resource, or the injected fault or a 404. Called with the lock held."""
        fault = self._record(verb, TPU, name, zone)
        if fault:
            raise ApiError(fault.code, fault.status, fault.message, fault.reason)
        qr = self._queued.get((project, zone, name))
        if qr is None:
            raise ApiError(404, "NOT_FOUND", f"Resource '{_qr_path(project, zone, name)}' was not found")
        return qr

    def _delete_queued(self, project: str, zone: str, name: str, force: bool) -> dict[str, Any]:
        with self._lock:
            qr = self._queued_resource("delete", project, zone, name)
            node = self._machines.get((TPU, project, zone, qr.body["tpu"]["nodeSpec"][0]["nodeId"]))
            if node is not None and not force:
                raise ApiError(
                    400, "FAILED_PRECONDITION", f"Queued resource '{qr.path}' has a node; delete it or use force"
                )
            del self._queued[(project, zone, name)]
            if node is not None:
                self._machines.pop((TPU, project, zone, node.name), None)
                node.state = "DELETING"
                self._deleted(node)
            op = self._new_op(TPU, project, zone, name, "delete", "queuedResources")
            self._changed.notify_all()
            return self._finish(op, None, None)

    def _get_queued(self, project: str, zone: str, name: str) -> dict[str, Any]:
        with self._lock:
            return _queued_json(self._queued_resource("get", project, zone, name))

    def _list_queued(self, project: str, zone: str) -> list[dict[str, Any]]:
        with self._lock:
            fault = self._record("list", TPU, "", zone)
            if fault:
                raise ApiError(fault.code, fault.status, fault.message, fault.reason)
            return [_queued_json(q) for (p, z, _), q in sorted(self._queued.items()) if (p, z) == (project, zone)]

    def _delete(self, kind: str, project: str, zone: str, name: str) -> dict[str, Any]:
        with self._lock:
            fault = self._record("delete", kind, name, zone)
            if fault:
                raise ApiError(fault.code, fault.status, fault.message, fault.reason)
            m = self._machines.pop((kind, project, zone, name), None)
            if m is None:
                raise ApiError(404, "NOT_FOUND", _not_found(kind, project, zone, name), "notFound")
            m.state = "DELETING" if kind == TPU else "STOPPING"
            for op in self._ops.values():
                if op.get("waiting") == (kind, project, zone, name):  # a create still in flight completes
                    op["waiting"] = None
                    self._finish(op, None, m)
            self._deleted(m)
            op = self._new_op(kind, project, zone, name, "delete")
            self._changed.notify_all()
            return self._finish(op, None, None)

    def _get(self, kind: str, project: str, zone: str, name: str) -> dict[str, Any]:
        with self._lock:
            fault = self._record("get", kind, name, zone)
            if fault:
                raise ApiError(fault.code, fault.status, fault.message, fault.reason)
            m = self._machines.get((kind, project, zone, name))
            if m is None:
                raise ApiError(404, "NOT_FOUND", _not_found(kind, project, zone, name), "notFound")
            return _resource_json(m)

    def _list(self, kind: str, project: str, zone: str) -> list[dict[str, Any]]:
        with self._lock:
            fault = self._record("list", kind, "", zone)
            if fault:
                raise ApiError(fault.code, fault.status, fault.message, fault.reason)
            return [
                _resource_json(m)
                for (k, p, z, _), m in sorted(self._machines.items())
                if (k, p, z) == (kind, project, zone)
            ]

    def _operation(self, name: str, wait: bool = False) -> dict[str, Any]:
        with self._lock:
            op = self._ops.get(name)
            if op is None:
                raise ApiError(404, "NOT_FOUND", f"The resource '{name}' was not found", "notFound")
            self._calls.append(Call("operation", op["kind"], op["target"], op["zone"], time.time()))
            deadline = time.monotonic() + WAIT_MAX_S
            while wait and op["waiting"] is not None and (left := deadline - time.monotonic()) > 0:
                self._changed.wait(left)
            return copy.deepcopy(op["json"])

    def _new_op(
        self, kind: str, project: str, zone: str, target: str, verb: str, collection: str = "nodes"
    ) -> dict[str, Any]:
        n = next(self._ids)
        now = time.time()
        if kind == TPU:
            name = f"projects/{project}/locations/{zone}/operations/operation-{n}"
            body: dict[str, Any] = {
                "name": name,
                "done": False,
                "metadata": {
                    "@type": "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata",
                    "createTime": _rfc3339(now),
                    "target": f"projects/{project}/locations/{zone}/{collection}/{target}",
                    "verb": verb,
                    "apiVersion": "v2",
                },
            }
        else:
            name = f"operation-{int(now * 1000)}-{n:08x}"
            base = f"{_COMPUTE}/projects/{project}/zones/{zone}"
            body = {
                "kind": "compute#operation",
                "id": str(n),
                "name": name,
                "zone": base,
                "operationType": verb,
                "targetLink": f"{base}/instances/{target}",
                "status": "RUNNING",
                "progress": 0,
                "insertTime": _rfc3339(now),
                "startTime": _rfc3339(now),
                "selfLink": f"{base}/operations/{name}",
                "user": "anonymous",
            }
        op = {"kind": kind, "zone": zone, "target": target, "json": body, "waiting": None}
        self._ops[name] = op
        return op

    def _finish(
        self, op: dict[str, Any], error: ApiError | None, m: CloudMachine | None, qr: QueuedResource | None = None
    ) -> dict[str, Any]:
        body = op["json"]
        if op["kind"] == TPU:
            body["done"] = True
            if error:
                body["error"] = {"code": GRPC_CODES.get(error.status, 2), "message": error.message}
            elif qr is not None:
                body["response"] = {
                    "@type": "type.googleapis.com/google.cloud.tpu.v2.QueuedResource",
                    **_queued_json(qr),
                }
            else:
                response = _resource_json(m) if m else {}
                body["response"] = {
                    "@type": "type.googleapis.com/google.cloud.tpu.v2.Node"
                    if m
                    else "type.googleapis.com/google.protobuf.Empty",
                    **response,
                }
        else:
            body.update(status="DONE", progress=100, endTime=_rfc3339(time.time()))
            if error:
                code = error.reason or error.status
                body["error"] = {"errors": [{"code": code, "message": error.message}]}
                body["httpErrorStatusCode"] = error.code
                body["httpErrorMessage"] = HTTPStatus(error.code).phrase.upper()
        self._changed.notify_all()
        return copy.deepcopy(body)


_COMPUTE = "https://www.googleapis.com/compute/v1"


def _not_found(kind: str, project: str, zone: str, name: str) -> str:
    if kind == TPU:
        return f"Resource 'projects/{project}/locations/{zone}/nodes/{name}' was not found"
    return f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found"


def _already_exists(kind: str, project: str, zone: str, name: str) -> str:
    if kind == TPU:
        return f"Resource 'projects/{project}/locations/{zone}/nodes/{name}' already exists"
    return f"The resource 'projects/{project}/zones/{zone}/instances/{name}' already exists"


def _capacity_error(kind: str, project: str, zone: str) -> ApiError:
    if kind == TPU:
        return ApiError(
            429,
            "RESOURCE_EXHAUSTED",
            f'There is no more capacity in the zone "{zone}"; you can try in another zone where '
            "Cloud TPU Nodes are offered (see https://cloud.google.com/tpu/docs/regions)",
        )
    return ApiError(
        503,
        "UNAVAILABLE",
        f"The zone 'projects/{project}/zones/{zone}' does not have enough resources available to "
        "fulfill the request.  Try a different zone, or try again later.",
        "ZONE_RESOURCE_POOL_EXHAUSTED",
    )


def _spot(kind: str, body: dict[str, Any]) -> bool:
    """A node or instance body asking for Spot or preemptible capacity."""
    if kind == TPU:
        config = body.get("schedulingConfig") or {}
        return bool(config.get("spot") or config.get("preemptible"))
    scheduling = body.get("scheduling") or {}
    return scheduling.get("provisioningModel") == "SPOT" or bool(scheduling.get("preemptible"))


def _qr_path(project: str, zone: str, name: str) -> str:
    return f"projects/{project}/locations/{zone}/queuedResources/{name}"


_QR_STATE_DATA = {
    "ACCEPTED": "acceptedData",
    "WAITING_FOR_RESOURCES": "waitingForResourcesData",
    "PROVISIONING": "provisioningData",
    "ACTIVE": "activeData",
    "SUSPENDED": "suspendedData",
    "FAILED": "failedData",
}


def _queued_json(qr: QueuedResource) -> dict[str, Any]:
    """The v2 QueuedResource: name, createTime, tpu.nodeSpec, spot|guaranteed, queueingPolicy, state."""
    state: dict[str, Any] = {"state": qr.state, "stateInitiator": "SERVICE"}
    data = _QR_STATE_DATA.get(qr.state)
    if data is not None and data != "waitingForResourcesData":
        state[data] = {"error": qr.error} if qr.state == "FAILED" and qr.error else {}
    return {**copy.deepcopy(qr.body), "name": qr.path, "createTime": _rfc3339(qr.created_at), "state": state}


def _resource_json(m: CloudMachine) -> dict[str, Any]:
    body = copy.deepcopy(m.resource)
    if m.kind == TPU:
        body.update(
            name=f"projects/{m.project}/locations/{m.zone}/nodes/{m.name}",
            state=m.state,
            labels=dict(m.labels),
            metadata=dict(m.metadata),
            createTime=_rfc3339(m.created_at),
            apiVersion="V2",
            networkEndpoints=[{"ipAddress": "127.0.0.1", "port": 8470}],
        )
    else:
        base = f"{_COMPUTE}/projects/{m.project}/zones/{m.zone}"
        body.update(
            kind="compute#instance",
            name=m.name,
            zone=base,
            status=m.state,
            labels=dict(m.labels),
            creationTimestamp=_rfc3339(m.created_at),
            selfLink=f"{base}/instances/{m.name}",
        )
        body.setdefault("metadata", {})["fingerprint"] = "bG9jYWw="
    return body


_TPU_PATH = re.compile(r"^/v2/projects/([^/]+)/locations/([^/]+)/(nodes|queuedResources|operations)(?:/([^/:]+))?$")
_GCE_PATH = re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/(instances|operations)(?:/([^/]+))?(/wait)?$")


@dataclass(frozen=True)
class MachineCall:
    """A request to a collection of machines (TPU nodes, Compute instances): create, get, list or delete alike in
    both APIs but for how a new machine is named and how a listing is wrapped."""

    kind: str
    method: str
    project: str
    zone: str
    name: str | None
    body: dict[str, Any]

    def answer(
        self,
        server: CloudApiServer,
        new_name: Callable[[], Any],
        listing: Callable[[list[dict[str, Any]]], dict[str, Any]],
    ) -> dict[str, Any] | None:
        """The reply; None when the call is none of the four (the caller answers 404)."""
        where = (self.kind, self.project, self.zone)
        if self.method == "POST" and not self.name:
            return server._create(*where, new_name(), self.body)
        if self.method == "GET" and self.name:
            return server._get(*where, self.name)
        if self.method == "GET":
            return listing(server._list(*where))
        if self.method == "DELETE" and self.name:
            return server._delete(*where, self.name)
        return None


def _handler_class(server: CloudApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # header and body go out in two writes: no 40 ms delayed-ACK stall

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self._dispatch("GET")

        def do_POST(self) -> None:
            self._dispatch("POST")

        def do_DELETE(self) -> None:
            self._dispatch("DELETE")

        def _dispatch(self, method: str) -> None:
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            kind = TPU if url.path.startswith("/v2/") else GPU
            with server._lock:
                server._requests.append(f"{method} {url.path}")
            try:
                body = json.loads(raw) if raw else {}
                status, payload = HTTPStatus.OK, self._route(method, url.path, query, body)
            except ApiError as e:
                status, payload = HTTPStatus(e.code), _error_json(kind, e)
            except (ValueError, KeyError, TypeError) as e:
                err = ApiError(400, "INVALID_ARGUMENT", f"Invalid request: {e}", "invalid")
                status, payload = HTTPStatus.BAD_REQUEST, _error_json(kind, err)
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up waiting (e.g. operations.wait)
                self.close_connection = True

        def _route(self, method: str, path: str, query: dict[str, str], body: dict[str, Any]) -> Any:
            if m := _TPU_PATH.match(path):
                project, zone, collection, name = m.groups()
                if collection == "operations" and method == "GET" and name:
                    return server._operation(f"projects/{project}/locations/{zone}/operations/{name}")
                if collection == "nodes":

                    def node_id() -> str:
                        if not query.get("nodeId"):
                            raise ApiError(400, "INVALID_ARGUMENT", "nodeId is required")
                        return query["nodeId"]

                    call = MachineCall(TPU, method, project, zone, name, body)
                    if (reply := call.answer(server, node_id, lambda nodes: {"nodes": nodes})) is not None:
                        return reply
                if collection == "queuedResources":
                    if method == "POST" and not name:
                        if not query.get("queuedResourceId"):
                            raise ApiError(400, "INVALID_ARGUMENT", "queuedResourceId is required")
                        return server._create_queued(project, zone, query["queuedResourceId"], body)
                    if method == "GET" and name:
                        return server._get_queued(project, zone, name)
                    if method == "GET":
                        return {"queuedResources": server._list_queued(project, zone)}
                    if method == "DELETE" and name:
                        return server._delete_queued(project, zone, name, query.get("force") == "true")
            elif m := _GCE_PATH.match(path):
                project, zone, collection, name, wait = m.groups()
                if collection == "operations" and name and (method, bool(wait)) in (("GET", False), ("POST", True)):
                    return server._operation(name, wait=bool(wait))
                if collection == "instances" and not wait:

                    def instance_name() -> Any:
                        if not body.get("name"):
                            raise ApiError(400, "INVALID_ARGUMENT", "Invalid value for field 'resource.name': ''")
                        return body["name"]

                    def instance_list(items: list[dict[str, Any]]) -> dict[str, Any]:
                        if query.get("filter"):
                            items = [i for i in items if _compute_filter(query["filter"])(i)]
                        return {
                            "kind": "compute#instanceList",
                            "id": f"projects/{project}/zones/{zone}/instances",
                            "items": items,
                        }

                    call = MachineCall(GPU, method, project, zone, name, body)
                    if (reply := call.answer(server, instance_name, instance_list)) is not None:
                        return reply
            raise ApiError(404, "NOT_FOUND", f"{method} {path} is not part of the local cloud API")

    return Handler


def _error_json(kind: str, e: ApiError) -> dict[str, Any]:
    """TPU: google.rpc.Status style (code, message, status). Compute: code, message and errors[].reason."""
    if kind == TPU:
        return {"error": {"code": e.code, "message": e.message, "status": e.status}}
    reason = e.reason or _COMPUTE_REASONS.get(e.code, e.status.lower())
    return {
        "error": {
            "code": e.code,
            "message": e.message,
            "errors": [{"message": e.message, "domain": "global", "reason": reason}],
        }
    }
