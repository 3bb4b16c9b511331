"""What the local Cloud TPU and Compute Engine APIs share: errors, faults, the call log, callbacks and capacity.

`CloudCore` holds the state both APIs (tpu_api.py, compute/) act on under one lock: the knobs that decide
capacity (stockouts, zone capacity, queue waits), injected faults, the call log, and the one worker thread that
runs the local cloud's `on_ready` / `on_deleted` hooks in order, never while the lock is held. `CloudMachine` is a
machine as the local cloud sees it: a TPU node, a Compute Engine instance, or a MIG slice (one machine, many VMs).
"""

from __future__ import annotations

import itertools
import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

if TYPE_CHECKING:
    from typing_extensions import Unpack

TPU = "tpu"
GPU = "gpu"
WAIT_MAX_S = 5.0  # the longest an operations.wait call blocks (the real Compute one: 2 minutes)
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

Hook = Callable[["CloudMachine"], None]


@dataclass
class CloudMachine:
    """A machine as the local cloud sees it: a TPU node (api tpu), or on Compute Engine (api compute) an instance
    or a MIG slice, which is one machine whose `workers` are its VMs in `agent-worker-number` order.

    `kind` is what it computes with ("tpu" chips or "gpu"); `state` is the API's own string (TPU node `state`,
    instance `status`, a slice's applied topology state). `workers` defaults to the TPU node's hidden worker VM
    names or, on Compute Engine, the instance itself; hosts = len(workers)."""

    kind: str
    name: str
    zone: str
    project: str
    labels: dict[str, str]
    metadata: dict[str, str]
    state: str
    created_at: float
    resource: dict[str, Any] = field(default_factory=dict)  # the JSON body as created (a slice: its template's)
    deleted_at: float | None = None  # stamped under the API's lock: hooks run later, on their own thread
    api: str = ""  # "tpu" | "compute"; "" = TPU for a TPU node, compute otherwise
    workers: tuple[str, ...] = ()
    chips_per_host: int = 0  # 0 = from the accelerator type or machine type

    def __post_init__(self) -> None:
        if not self.api:
            self.api = "tpu" if self.kind == TPU else "compute"
        if not self.workers or not self.chips_per_host:
            workers, chips = _default_shape(self)
            self.workers = self.workers or workers
            self.chips_per_host = self.chips_per_host or chips


def _default_shape(m: CloudMachine) -> tuple[tuple[str, ...], int]:
    """A TPU node's hidden worker VMs and chips per host from its accelerator type (one host when the type is
    unknown); a Compute Engine instance is its own one worker, with its GPUs (or 1) as its chips."""
    if m.api == "tpu":
        from localcloud.services.logentries import tpu_worker_name
        from respawn.topology import UnknownTpuType, tpu_topology

        try:
            shape = tpu_topology(str(m.resource.get("acceleratorType") or ""))
            hosts, chips = shape.hosts, shape.chips_per_host
        except UnknownTpuType:
            hosts, chips = 1, 1
        return tuple(tpu_worker_name(m.name, i) for i in range(hosts)), chips
    return (m.name,), gpus(m.resource) or 1


def gpus(properties: dict[str, Any]) -> int:
    """The GPUs of each VM of an instance's body or a template's properties (guestAccelerators)."""
    return sum(int(a.get("acceleratorCount") or 0) for a in properties.get("guestAccelerators") or [])


def snapshot(m: CloudMachine) -> CloudMachine:
    """A copy safe to hand out (`resource` is never changed after creation, so it is shared)."""
    return replace(m, labels=dict(m.labels), metadata=dict(m.metadata))


@dataclass(frozen=True)
class Call:
    verb: str  # create | delete | get | list | operation
    kind: str  # tpu | gpu: what the target computes with; "" when the call names nothing the API holds
    name: str
    zone: str  # a zone, or the region / "global" of a regional / global resource
    time: float
    collection: str = ""  # nodes | queuedResources | instances | instanceGroupManagers | resizeRequests | ...


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
    collection: str | None = None


class ApiError(Exception):
    def __init__(self, code: int, status: str, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.code, self.status, self.message, self.reason = code, status, message, reason

    @classmethod
    def of(cls, fault: Fault) -> ApiError:
        return cls(fault.code, fault.status, fault.message, fault.reason)


def invalid(message: str) -> ApiError:
    """A 400 the way both APIs refuse a request they do not accept."""
    return ApiError(400, "INVALID_ARGUMENT", message, "invalid")


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


_FILTER_TERM = re.compile(r'([\w.-]+)\s*(!=|=)\s*("[^"]*"|[^\s()"]+)')


def list_filter(expr: str) -> Callable[[dict[str, Any]], bool]:
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


class MachineCollection(Protocol):
    """A collection of machines one API serves (TPU nodes, Compute instances)."""

    def create_machine(self, project: str, zone: str, name: str, body: dict[str, Any]) -> dict[str, Any]: ...
    def get_machine(self, project: str, zone: str, name: str) -> dict[str, Any]: ...
    def list_machines(self, project: str, zone: str) -> list[dict[str, Any]]: ...
    def delete_machine(self, project: str, zone: str, name: str) -> dict[str, Any]: ...


@dataclass(frozen=True)
class MachineCall:
    """A request to a collection of machines (TPU nodes, Compute instances): create, get, list or delete alike in
    both APIs but for how a new machine is named and how a listing is wrapped."""

    method: str
    project: str
    zone: str
    name: str | None
    body: dict[str, Any]

    def answer(
        self,
        collection: MachineCollection,
        new_name: Callable[[], str],
        listing: Callable[[list[dict[str, Any]]], dict[str, Any]],
    ) -> dict[str, Any] | None:
        """The reply; None when the call is none of the four (the caller answers 404)."""
        where = (self.project, self.zone)
        if self.method == "POST" and not self.name:
            return collection.create_machine(*where, new_name(), self.body)
        if self.method == "GET" and self.name:
            return collection.get_machine(*where, self.name)
        if self.method == "GET":
            return listing(collection.list_machines(*where))
        if self.method == "DELETE" and self.name:
            return collection.delete_machine(*where, self.name)
        return None


class ApiPart(Protocol):
    """What the server asks of each API it serves."""

    def owns(self, path: str) -> bool: ...
    def route(self, method: str, path: str, query: dict[str, str], body: dict[str, Any]) -> Any: ...
    def error_json(self, e: ApiError) -> dict[str, Any]: ...
    def machines(self) -> list[CloudMachine]: ...
    def machine(self, name: str) -> CloudMachine | None: ...
    def stored(self, name: str) -> CloudMachine | None: ...
    def preempt(self, name: str, worker: int | None) -> CloudMachine | None: ...
    def set_state(self, name: str, state: str, worker: int | None) -> CloudMachine | None: ...
    def live_in(self, zone: str) -> int: ...
    def leftovers(self) -> list[str]: ...


class NoMachines:
    """The ApiPart hooks of an API that holds no machines (the Advice API, a project's APIs): all empty."""

    def machines(self) -> list[CloudMachine]:
        return []

    def machine(self, name: str) -> CloudMachine | None:
        return None

    def stored(self, name: str) -> CloudMachine | None:
        return None

    def preempt(self, name: str, worker: int | None) -> CloudMachine | None:
        return None

    def set_state(self, name: str, state: str, worker: int | None) -> CloudMachine | None:
        return None

    def live_in(self, zone: str) -> int:
        return 0

    def leftovers(self) -> list[str]:
        return []


class CoreKnobs(TypedDict, total=False):
    """CloudCore's knobs, each optional (CloudCore's docstring says what each does)."""

    create_delay_s: float
    capacity: dict[str, int | None]
    stockouts: dict[str, int]
    queue_waits: dict[str, float | None]
    spot_stockouts: dict[str, int | None]
    spot_queue_waits: dict[str, float | None]
    unoffered: dict[str, tuple[str, ...]]
    on_ready: Hook | None
    on_deleted: Hook | None
    on_metadata: Hook | None


class CloudCore:
    """The state both APIs share, behind one lock.

    Knobs: `capacity` (zone -> max machines in the zone, None = unlimited; a machine holds capacity until deleted,
    like quota; a MIG slice is one machine), `stockouts` (zone, or ZONE@MACHINE_TYPE for one machine type there -> the
    next K creates there fail with capacity),
    `spot_stockouts` (the same for Spot/preemptible requests only, None = all), `queue_waits` /
    `spot_queue_waits` (zone -> seconds a queued request waits for capacity there, None = until deleted),
    `create_delay_s` (CREATING -> READY), `unoffered` (zone -> the machine and accelerator types it does not offer:
    Compute Engine machine types such as ct6e-standard-4t, GPU types such as nvidia-l4, Cloud TPU accelerator types
    such as v6e-16; see offerings.py).

    `lock` (reentrant) guards all of it, and everything the APIs keep: each API's request handlers and timers take
    it, and so may a test that changes what an API holds."""

    def __init__(self, **knobs: Unpack[CoreKnobs]) -> None:
        self.create_delay_s = knobs.get("create_delay_s", 0.0)
        self.capacity: dict[str, int | None] = dict(knobs.get("capacity") or {})
        self.stockouts: dict[str, int] = dict(knobs.get("stockouts") or {})
        self.queue_waits: dict[str, float | None] = dict(knobs.get("queue_waits") or {})
        self.spot_stockouts: dict[str, int | None] = dict(knobs.get("spot_stockouts") or {})
        self.spot_queue_waits: dict[str, float | None] = dict(knobs.get("spot_queue_waits") or {})
        self.unoffered: dict[str, frozenset[str]] = {
            zone: frozenset(types) for zone, types in (knobs.get("unoffered") or {}).items()
        }
        self.on_ready = knobs.get("on_ready")
        self.on_deleted = knobs.get("on_deleted")
        self.on_metadata = knobs.get("on_metadata")
        self.lock = threading.RLock()
        self._changed = threading.Condition(self.lock)
        self._calls: list[Call] = []
        self._requests: list[str] = []
        self._faults: list[Fault] = []
        self._ids = itertools.count(1)
        self._callbacks: queue.Queue[tuple[Hook, CloudMachine] | None] = queue.Queue()
        self.apis: list[ApiPart] = []

    def next_id(self) -> int:
        return next(self._ids)

    def record(self, verb: str, kind: str, name: str, zone: str, collection: str) -> Fault | None:
        """Log the call; the injected fault it meets, if any. Called with the lock held."""
        self._calls.append(Call(verb, kind, name, zone, time.time(), collection))
        for i, f in enumerate(self._faults):
            if f.verb == verb and f.kind in (None, kind) and f.collection in (None, collection):
                return self._faults.pop(i)
        return None

    def check(self, verb: str, kind: str, name: str, zone: str, collection: str) -> None:
        """Log the call and raise the fault it meets (every fault but a create's in-operation one)."""
        fault = self.record(verb, kind, name, zone, collection)
        if fault:
            raise ApiError.of(fault)

    def notify(self, hook: Hook | None, m: CloudMachine) -> None:
        """Queue `hook(snapshot of m)` for the callback thread."""
        if hook is not None:
            self._callbacks.put((hook, snapshot(m)))

    def ready(self, m: CloudMachine) -> None:
        self.notify(self.on_ready, m)

    def deleted(self, m: CloudMachine) -> None:
        """Stamp the deletion now (the timeline orders by it) and queue on_deleted."""
        m.deleted_at = time.time()
        self.notify(self.on_deleted, m)

    def metadata_written(self, m: CloudMachine) -> None:
        """Queue on_metadata: `m`'s metadata was written (a TPU node's `nodes.patch`, an instance's `setMetadata`, a
        MIG's VM's too), so that the VMs running on it serve the new metadata."""
        self.notify(self.on_metadata, m)

    def run_callbacks(self) -> None:
        while (item := self._callbacks.get()) is not None:
            hook, m = item
            try:
                hook(m)
            except Exception as e:  # a failing hook must not take the server down
                print(f"cloudapi: callback {getattr(hook, '__name__', hook)} failed: {e!r}", flush=True)

    def stop_callbacks(self) -> None:
        self._callbacks.put(None)

    def changed(self) -> None:
        self._changed.notify_all()

    def wait_until(self, done: Callable[[], bool], timeout: float) -> None:
        """Block (lock held) until `done()` or `timeout` seconds pass."""
        deadline = time.monotonic() + timeout
        while not done() and (left := deadline - time.monotonic()) > 0:
            self._changed.wait(left)

    def later(self, delay: float, fn: Callable[..., None], *args: Any) -> None:
        """Run `fn(*args)` on a timer thread after `delay` seconds (fn takes the lock itself)."""
        timer = threading.Timer(delay, fn, args)
        timer.daemon = True
        timer.start()

    def stocked_out(self, zone: str, spot: bool = False, machine_type: str = "") -> bool:
        """Whether a create in `zone` meets a stockout now (and uses it up) or the zone's capacity is full. A stockout
        is the zone's (key ZONE), or only of one machine type there (key ZONE@MACHINE_TYPE: a GPU or TPU type that is
        scarce while others are not)."""
        keys = (zone, f"{zone}@{machine_type}") if machine_type else (zone,)
        for key in keys:
            if self.stockouts.get(key, 0) > 0:
                self.stockouts[key] -= 1
                return True
        for key in keys if spot else ():
            if key in self.spot_stockouts:
                left = self.spot_stockouts[key]
                if left is None:
                    return True
                if left > 0:
                    self.spot_stockouts[key] = left - 1
                    return True
        cap = self.capacity.get(zone)
        return cap is not None and sum(api.live_in(zone) for api in self.apis) >= cap

    def queue_wait(self, zone: str, spot: bool) -> tuple[bool, float | None]:
        """(waits, seconds) for a queued request in `zone`: whether the zone has a queue wait, and how long (None:
        until deleted). Spot requests also wait in a zone short of Spot capacity (`spot_queue_waits`)."""
        if zone in self.queue_waits:
            return True, self.queue_waits[zone]
        if spot and zone in self.spot_queue_waits:
            return True, self.spot_queue_waits[zone]
        return False, 0.0


def compute_error_json(e: ApiError, reasons: dict[int, str]) -> dict[str, Any]:
    """Compute's error format: code, message and errors[].reason (`reasons` by HTTP code where `e` names none)."""
    reason = e.reason or reasons.get(e.code, e.status.lower())
    return {
        "error": {
            "code": e.code,
            "message": e.message,
            "errors": [{"message": e.message, "domain": "global", "reason": reason}],
        }
    }
