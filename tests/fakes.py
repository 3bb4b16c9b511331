"""In-memory fakes of the ports, for unit tests of the pure core and the service only.

InMemoryJobStore keeps records as JSON (so the round-trip is exercised) with a
generation per record. FakeProvider keeps machines in a dict keyed by their
deterministic name, so a duplicate machine is impossible by construction and a
test checks what was *called* instead. Crash injection: `CrashPlan` counts every
mutating call (store saves, machine creates, deletes and world writes) made through
`CrashingStore` / `CrashingProvider` and raises `Crash` (a BaseException, like
a process dying) just before or just after the Nth one.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from respawn.actions import CreateMachine
from respawn.adapters.world_metadata import world_version
from respawn.events import Event
from respawn.jobs import LABEL_ATTEMPT, LABEL_JOB, LABEL_MANAGED, Job, JobSpec, MachineState, parse_machine_name
from respawn.outlook import History, Observation
from respawn.ports import (
    CapacityError,
    ConflictError,
    HistoryStore,
    IndexState,
    JobStore,
    LiveIndex,
    Machine,
    MachineProvider,
    Marker,
    StatusNotifier,
)
from respawn.service import Outcome, Retryable


class FakeClock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class InMemoryJobStore:
    """JobStore and LiveIndex: records as JSON with a generation each; the live index's markers (a generation from
    one counter, as GCS generations never repeat, and the `clock`'s time when written: 0 without one) and state."""

    def __init__(self, clock: FakeClock | None = None) -> None:
        self._records: dict[str, tuple[str, int]] = {}
        self._lock = threading.Lock()
        self.clock = clock
        self.conflicts = 0  # the next N saves raise ConflictError (as if another writer won)
        self.errors: list[Exception] = []  # raised by the next calls but list_ids (e.g. a TransientError)
        self.saves = 0
        self.loads = 0
        self._markers: dict[str, Marker] = {}
        self._state: tuple[str, int] = ("", 0)
        self._generations = 0
        self.entered = 0  # marker writes
        self.left = 0  # marker deletes

    def load(self, job_id: str) -> tuple[Job | None, int]:
        with self._lock:
            self.loads += 1
            if self.errors:
                raise self.errors.pop(0)
            if job_id not in self._records:
                return None, 0
            text, gen = self._records[job_id]
        return Job.from_dict(json.loads(text)), gen

    def save(self, job: Job, generation: int) -> int:
        text = json.dumps(job.to_dict())
        with self._lock:
            if self.errors:
                raise self.errors.pop(0)
            stored = self._records.get(job.job_id, ("", 0))[1]
            if self.conflicts > 0 or stored != generation:
                self.conflicts = max(0, self.conflicts - 1)
                raise ConflictError(f"{job.job_id}: generation {generation} is not {stored}")
            self._records[job.job_id] = (text, stored + 1)
            self.saves += 1
            return stored + 1

    def list_ids(self) -> list[str]:
        with self._lock:
            return sorted(self._records)

    def _fail(self) -> None:
        if self.errors:
            raise self.errors.pop(0)

    def enter(self, job_id: str) -> None:
        with self._lock:
            self._fail()
            self._generations += 1
            self._markers[job_id] = Marker(self._generations, self.clock.now() if self.clock else 0.0)
            self.entered += 1

    def markers(self) -> dict[str, Marker]:
        with self._lock:
            self._fail()
            return dict(self._markers)

    def leave(self, job_id: str, generation: int) -> None:
        with self._lock:
            self._fail()
            marker = self._markers.get(job_id)
            if marker is None:
                return
            if marker.generation != generation:
                raise ConflictError(f"marker {job_id}: generation {generation} is not {marker.generation}")
            del self._markers[job_id]
            self.left += 1

    def load_state(self) -> tuple[IndexState | None, int]:
        with self._lock:
            self._fail()
            text, generation = self._state
            return (IndexState.from_json(json.loads(text)) if generation else None), generation

    def save_state(self, state: IndexState, generation: int) -> int:
        text = json.dumps(state.to_json())
        with self._lock:
            self._fail()
            if self._state[1] != generation:
                raise ConflictError(f"index state: generation {generation} is not {self._state[1]}")
            self._state = (text, generation + 1)
            return generation + 1

    def marked(self) -> set[str]:
        """The job ids with a marker (no error, no count)."""
        with self._lock:
            return set(self._markers)

    def job(self, job_id: str) -> Job:
        job, _ = self.load(job_id)
        assert job is not None
        return job


class InMemoryHistoryStore:
    """HistoryStore: the history as JSON with a generation, and the pending observations as JSON by id; `conflicts`
    (saves of the history) and `errors` (every call) as InMemoryJobStore's."""

    def __init__(self, history: History | None = None) -> None:
        self._text, self._generation = ("", 0) if history is None else (json.dumps(history.to_json()), 1)
        self._pending: dict[str, str] = {}
        self._lock = threading.Lock()
        self.conflicts = 0
        self.errors: list[Exception] = []
        self.loads = 0
        self.saves = 0
        self.adds = 0  # observation objects created
        self.lists = 0
        self.drops = 0  # observation objects deleted

    def load(self) -> tuple[History, int]:
        with self._lock:
            self.loads += 1
            if self.errors:
                raise self.errors.pop(0)
            if not self._generation:
                return History(), 0
            return History.from_json(json.loads(self._text)), self._generation

    def save(self, history: History, generation: int) -> int:
        text = json.dumps(history.to_json())
        with self._lock:
            if self.errors:
                raise self.errors.pop(0)
            if self.conflicts > 0 or self._generation != generation:
                self.conflicts = max(0, self.conflicts - 1)
                raise ConflictError(f"history: generation {generation} is not {self._generation}")
            self._text, self._generation = text, self._generation + 1
            self.saves += 1
            return self._generation

    def add(self, observations: Sequence[Observation]) -> None:
        with self._lock:
            if self.errors:
                raise self.errors.pop(0)
            for o in observations:
                if o.id not in self._pending:  # create-only: a duplicate is a 412, nothing written
                    self._pending[o.id] = json.dumps(o.to_dict())
                    self.adds += 1

    def pending(self) -> list[Observation]:
        with self._lock:
            self.lists += 1
            if self.errors:
                raise self.errors.pop(0)
            return [Observation.from_dict(json.loads(text)) for _, text in sorted(self._pending.items())]

    def drop(self, ids: Sequence[str]) -> None:
        with self._lock:
            if self.errors:
                raise self.errors.pop(0)
            for i in ids:
                self.drops += self._pending.pop(i, None) is not None

    @property
    def folded(self) -> History:
        """The history object alone (no error, no count)."""
        with self._lock:
            return History.from_json(json.loads(self._text)) if self._generation else History()

    @property
    def waiting(self) -> list[str]:
        """The ids of the observations not folded yet (no error, no count)."""
        with self._lock:
            return sorted(self._pending)

    @property
    def history(self) -> History:
        """The history placement reads: the object with the pending observations merged in (no error, no count)."""
        with self._lock:
            pending = [Observation.from_dict(json.loads(text)) for _, text in sorted(self._pending.items())]
        return self.folded.record(pending)


class FakeProvider:
    """Machines by name. `capacity[zone]` is how many more creates succeed there (absent: unlimited).

    A new machine is CREATING for its first `creating_reads` observations (get or list), then READY, as the real
    adapters report a machine still booting (TPU CREATING, Compute PROVISIONING/STAGING) before it runs; the provider
    contract suite (tests/contract/test_provider_contract.py) holds the fake and the real adapters to the same
    cases.

    `set_world` is recorded in `calls` ("set_world") and in `worlds_told` (name, world) on every call, and kept per
    machine in `worlds` as the real adapters keep the metadata key: a newer or equal version stays, a machine that is
    gone is done (nothing kept)."""

    def __init__(self, capacity: dict[str, int] | None = None, creating_reads: int = 1) -> None:
        self.machines: dict[str, Machine] = {}
        self.creating_reads = creating_reads
        self._booting: dict[str, int] = {}  # name -> observations left before READY
        self.capacity: dict[str, int] = dict(capacity or {})
        self.errors: dict[str, list[Exception]] = {}  # method -> errors raised by its next calls
        self.calls: list[tuple[str, str, str]] = []  # (method, name, zone) of creates, deletes and set_worlds
        self.worlds: dict[str, str] = {}  # machine name -> the world its metadata key holds
        self.worlds_told: list[tuple[str, str]] = []  # (name, world) of every set_world, in order
        self._lock = threading.Lock()

    def fail_next(self, method: str, *errors: Exception) -> None:
        self.errors.setdefault(method, []).extend(errors)

    def _maybe_fail(self, method: str) -> None:
        queued = self.errors.get(method)
        if queued:
            raise queued.pop(0)

    def create(self, action: CreateMachine, spec: JobSpec) -> None:
        with self._lock:
            self.calls.append(("create", action.machine, action.zone))
            self._maybe_fail("create")
            if action.machine in self.machines:
                return  # AlreadyExists is success
            if self.capacity.get(action.zone, 1) <= 0:
                raise CapacityError(f"ZONE_RESOURCE_POOL_EXHAUSTED in {action.zone}")
            if action.zone in self.capacity:
                self.capacity[action.zone] -= 1
            labels = {LABEL_MANAGED: "true", LABEL_JOB: action.job_id, LABEL_ATTEMPT: str(action.attempt)}
            state = MachineState.CREATING if self.creating_reads > 0 else MachineState.READY
            self.machines[action.machine] = Machine(action.machine, action.zone, state, labels)
            self._booting[action.machine] = self.creating_reads

    def delete(self, name: str, zone: str, spec: JobSpec | None = None) -> None:
        with self._lock:
            self.calls.append(("delete", name, zone))
            self._maybe_fail("delete")
            self.machines.pop(name, None)  # NotFound is success
            self._booting.pop(name, None)
            self.worlds.pop(name, None)

    def set_world(self, name: str, zone: str, spec: JobSpec, world: str) -> None:
        with self._lock:
            self.calls.append(("set_world", name, zone))
            self.worlds_told.append((name, world))
            self._maybe_fail("set_world")
            machine = self.machines.get(name)
            if machine is None or machine.zone != zone:
                return  # a machine that is gone is done
            version = world_version(world)
            assert version is not None, f"not a world: {world!r}"
            held = world_version(self.worlds.get(name))
            if held is None or held < version:
                self.worlds[name] = world

    def get(self, name: str, zone: str, spec: JobSpec | None = None) -> Machine | None:
        with self._lock:
            self._maybe_fail("get")
            machine = self.machines.get(name)
            return self._observe(machine) if machine is not None and machine.zone == zone else None

    def list(self, zone: str, job_id: str | None = None) -> list[Machine]:
        with self._lock:
            self._maybe_fail("list")
            return [
                self._observe(m)
                for m in list(self.machines.values())
                if m.zone == zone and (job_id is None or m.labels.get(LABEL_JOB) == job_id)
            ]

    def _observe(self, m: Machine) -> Machine:
        """The machine as this read sees it: a booting one counts the read, and is READY once it has none left."""
        left = self._booting.get(m.name)
        if left is None:
            return m
        if left > 0:
            self._booting[m.name] = left - 1
            return m
        del self._booting[m.name]
        self.machines[m.name] = Machine(m.name, m.zone, MachineState.READY, m.labels)
        return self.machines[m.name]

    # -- what the cloud does on its own --

    def set_state(self, name: str, state: MachineState) -> None:
        self._booting.pop(name, None)
        m = self.machines[name]
        self.machines[name] = Machine(m.name, m.zone, state, m.labels)

    def vanish(self, name: str) -> None:
        """A Spot VM with instanceTerminationAction=DELETE: preempted and gone."""
        self.machines.pop(name, None)
        self._booting.pop(name, None)
        self.worlds.pop(name, None)

    # -- what tests ask --

    def count(self, method: str, name: str | None = None) -> int:
        return sum(1 for m, n, _ in self.calls if m == method and (name is None or n == name))

    def world(self, name: str) -> dict[str, Any] | None:
        """The world machine `name` holds, parsed; None when it holds none."""
        text = self.worlds.get(name)
        return json.loads(text) if text is not None else None

    def live(self, job_id: str) -> list[str]:
        """Names of the job's machines that hold (or will hold) a running trainer."""
        alive = (MachineState.CREATING, MachineState.READY)
        return sorted(
            m.name
            for m in self.machines.values()
            if m.state in alive and (parse_machine_name(m.name) or ("",))[0] == job_id
        )


def fake_providers(creating_reads: int = 1) -> dict[str, FakeProvider]:
    """A FakeProvider per API, keyed as bootstrap.machine_providers keys the real ones (`spec.machine.api`)."""
    return {api: FakeProvider(creating_reads=creating_reads) for api in ("tpu", "compute")}


class RecordingNotifier:
    """Status messages in the order they were published. `errors` are raised by the next notify calls."""

    def __init__(self) -> None:
        self.notices: list[dict[str, Any]] = []
        self.errors: list[Exception] = []
        self._lock = threading.Lock()

    def notify(self, notice: dict[str, Any]) -> None:
        with self._lock:
            if self.errors:
                raise self.errors.pop(0)
            self.notices.append(json.loads(json.dumps(notice)))  # what a subscriber gets

    def changes(self, job_id: str | None = None) -> list[tuple[str | None, str]]:
        return [(n["old_status"], n["new_status"]) for n in self.notices if job_id in (None, n["job_id"])]


def deliver_concurrently(handlers: list[Callable[[Event], Outcome]], event: Event, tries: int = 50) -> list[str]:
    """The same event delivered once per handler, all at once; each delivery that raises Retryable is delivered
    again, as Pub/Sub does. Returns the results."""
    barrier = threading.Barrier(len(handlers))
    results: list[str] = []

    def deliver(handle: Callable[[Event], Outcome]) -> None:
        barrier.wait()
        for _ in range(tries):
            try:
                results.append(handle(event).result)
                return
            except Retryable:
                continue

    threads = [threading.Thread(target=deliver, args=(handle,)) for handle in handlers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


class Crash(BaseException):
    """The process died (not an Exception: nothing in the service may catch it)."""


@dataclass
class CrashPlan:
    """Crash at the `at`-th mutating call (1-based), `before` or after it took effect."""

    at: int
    before: bool = True
    seen: int = 0
    crashed: bool = False
    log: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def step(self, name: str, call: Any) -> Any:
        with self._lock:
            self.seen += 1
            self.log.append(name)
            hit = self.seen == self.at
        if hit and self.before:
            self.crashed = True
            raise Crash(f"before {name}")
        try:
            result = call()
        except Exception:
            if hit:  # the call failed, and then the process died before it could react
                self.crashed = True
                raise Crash(f"after {name} failed") from None
            raise
        if hit:
            self.crashed = True
            raise Crash(f"after {name}")
        return result


class CrashingStore:
    def __init__(self, store: JobStore, plan: CrashPlan) -> None:
        self.store, self.plan = store, plan

    def load(self, job_id: str) -> tuple[Job | None, int]:
        return self.store.load(job_id)

    def save(self, job: Job, generation: int) -> int:
        result: int = self.plan.step(f"save {job.job_id}", lambda: self.store.save(job, generation))
        return result

    def list_ids(self) -> list[str]:
        return self.store.list_ids()


class CrashingIndex:
    """The live index of a store, crashing at its writes as CrashingStore does at the store's."""

    def __init__(self, index: LiveIndex, plan: CrashPlan) -> None:
        self.index, self.plan = index, plan

    def enter(self, job_id: str) -> None:
        self.plan.step(f"enter {job_id}", lambda: self.index.enter(job_id))

    def markers(self) -> dict[str, Marker]:
        return self.index.markers()

    def leave(self, job_id: str, generation: int) -> None:
        self.plan.step(f"leave {job_id}", lambda: self.index.leave(job_id, generation))

    def load_state(self) -> tuple[IndexState | None, int]:
        return self.index.load_state()

    def save_state(self, state: IndexState, generation: int) -> int:
        result: int = self.plan.step("save index state", lambda: self.index.save_state(state, generation))
        return result


class CrashingHistoryStore:
    def __init__(self, store: HistoryStore, plan: CrashPlan) -> None:
        self.store, self.plan = store, plan

    def load(self) -> tuple[History, int]:
        return self.store.load()

    def save(self, history: History, generation: int) -> int:
        result: int = self.plan.step("save history", lambda: self.store.save(history, generation))
        return result

    def add(self, observations: Sequence[Observation]) -> None:
        self.plan.step(f"add {','.join(o.id for o in observations)}", lambda: self.store.add(observations))

    def pending(self) -> list[Observation]:
        return self.store.pending()

    def drop(self, ids: Sequence[str]) -> None:
        self.plan.step(f"drop {','.join(ids)}", lambda: self.store.drop(ids))


class CrashingProvider:
    def __init__(self, provider: MachineProvider, plan: CrashPlan) -> None:
        self.provider, self.plan = provider, plan

    def create(self, action: CreateMachine, spec: JobSpec) -> None:
        self.plan.step(f"create {action.machine}", lambda: self.provider.create(action, spec))

    def delete(self, name: str, zone: str, spec: JobSpec | None = None) -> None:
        self.plan.step(f"delete {name}", lambda: self.provider.delete(name, zone, spec))

    def set_world(self, name: str, zone: str, spec: JobSpec, world: str) -> None:
        self.plan.step(f"set world {name}", lambda: self.provider.set_world(name, zone, spec, world))

    def get(self, name: str, zone: str, spec: JobSpec | None = None) -> Machine | None:
        return self.provider.get(name, zone, spec)

    def list(self, zone: str, job_id: str | None = None) -> list[Machine]:
        return self.provider.list(zone, job_id)


class FakeLogReader:
    """Cloud Logging's entries.list over a list of LogEntry dicts: the query's selection is evaluated with
    respawn_ops.logfilter and its `timestamp>=` bound (respawn_ops.joblogs.since_filter) compared, oldest first.
    `filters` records every query; tests append to `stored` between reads, as Cloud Logging ingests."""

    def __init__(self, entries: list[dict[str, Any]] | None = None) -> None:
        self.stored = list(entries or [])
        self.filters: list[str] = []

    def entries(self, filter_: str) -> list[dict[str, Any]]:
        from respawn.parsing import rfc3339
        from respawn_ops.logfilter import LogFilter

        self.filters.append(filter_)
        selection, _, bound = filter_.rpartition('\nAND timestamp>="')
        since = rfc3339(bound.rstrip('"'))
        assert selection.startswith("(") and since is not None, f"not a since_filter: {filter_}"
        query = LogFilter.parse(selection)
        found = [e for e in self.stored if query.matches(e) and (rfc3339(e.get("timestamp")) or 0.0) >= since]
        return sorted(found, key=lambda e: rfc3339(e.get("timestamp")) or 0.0)


class CrashingNotifier:
    def __init__(self, notifier: StatusNotifier, plan: CrashPlan) -> None:
        self.notifier, self.plan = notifier, plan

    def notify(self, notice: dict[str, Any]) -> None:
        self.plan.step(f"notify {notice['id']}", lambda: self.notifier.notify(notice))


def assert_status_chain(changes: list[tuple[str | None, str]]) -> None:
    """Status changes as notices tell them: each starts where the one before ended, by a legal transition, so a
    notice sent twice or never breaks the chain."""
    from respawn.jobs import LEGAL_TRANSITIONS, Status

    before: str | None = None
    for old, new in changes:
        assert old == before, changes
        assert Status(new) in LEGAL_TRANSITIONS[Status(old) if old else None], changes
        before = new
