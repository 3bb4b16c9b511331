"""The live index: the sweep reads the records of live jobs only, whatever the number that ended; markers written
before the records they index, removed safely against any crash or racing handler; a store of today's layout
migrated by the sweep."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
from fakes import (
    Crash,
    CrashingIndex,
    CrashingProvider,
    CrashingStore,
    CrashPlan,
    FakeClock,
    FakeProvider,
    InMemoryJobStore,
    RecordingNotifier,
)

from respawn.events import CancelRequested, JobRejected, JobSubmitted, SweepTicked
from respawn.jobs import Job, JobSpec, MachineState, Status, TpuMachine
from respawn.live_index import ORPHAN_MARKER_S
from respawn.ports import IndexState, Machine, Marker
from respawn.service import Service, ServiceSettings

A, B, C = "us-central1-a", "us-west4-a", "europe-west4-b"
T0 = 1_000_000.0
SETTLE_S = ServiceSettings().index_settle_s


def spec(job_id: str, zones: tuple[str, ...] = (A, B)) -> JobSpec:
    return JobSpec(job_id, TpuMachine("v5litepod-8", "v2-alpha-tpuv5-lite"), zones, "img", f"gs://b/runs/{job_id}")


class HookedIndex(InMemoryJobStore):
    """An in-memory store whose `hooks["before save"]` (`"after enter"`, ...) runs once, just before (after) that call:
    another handler's steps slipped in between two of this one's."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.hooks: dict[str, Callable[[], None]] = {}

    def _hook(self, when: str) -> None:
        hook = self.hooks.pop(when, None)
        if hook is not None:
            hook()

    def enter(self, job_id: str) -> None:
        self._hook("before enter")
        super().enter(job_id)
        self._hook("after enter")

    def leave(self, job_id: str, generation: int) -> None:
        self._hook("before leave")
        super().leave(job_id, generation)

    def save(self, job: Job, generation: int) -> int:
        self._hook("before save")
        return super().save(job, generation)


class World:
    def __init__(self, *, notifier: bool = False) -> None:
        self.clock = FakeClock(T0)
        self.store = HookedIndex(self.clock)
        self.provider = FakeProvider(creating_reads=0)
        self.notifier = RecordingNotifier() if notifier else None
        self.service = self.instance()

    def instance(self) -> Service:
        """A function instance of its own (its own cache of records) on the same store."""
        return Service(self.store, {"tpu": self.provider}, self.clock, notifier=self.notifier, index=self.store)

    def sweep(self, service: Service | None = None) -> int:
        """One sweep; returns the records it read."""
        loads = self.store.loads
        (service or self.service).handle(SweepTicked(f"tick-{self.clock.now()}", self.clock.now()))
        return self.store.loads - loads

    def trust(self) -> None:
        """The sweep that builds the index, the settle time, and the sweep that completes it."""
        self.sweep()
        self.clock.advance(SETTLE_S + 1)
        self.sweep()

    def ended(self, job_id: str, zones: tuple[str, ...] = (A, B)) -> None:
        self.service.handle(JobSubmitted(f"submit-{job_id}", self.clock.now(), spec(job_id, zones)))
        self.service.handle(CancelRequested(f"cancel-{job_id}", self.clock.now(), job_id))
        assert self.store.job(job_id).status is Status.CANCELLED


@pytest.mark.parametrize("ended", [10, 400])
def test_records_read_per_sweep_are_the_live_jobs_whatever_the_number_ended(ended: int) -> None:
    w = World()
    for i in range(ended):
        w.ended(f"done-{i}")
    for i in range(3):
        w.service.handle(JobSubmitted(f"submit-live-{i}", T0, spec(f"live-{i}")))
    assert w.sweep() == ended + 3  # the sweep that builds the index reads every record
    w.clock.advance(SETTLE_S + 1)
    assert w.sweep() == ended + 3  # ... and the one that completes it
    w.sweep()  # reads the markers' records, and removes those of the ended jobs
    assert w.store.marked() == {"live-0", "live-1", "live-2"}
    assert w.sweep() == 3 and w.sweep() == 3  # then: the live jobs, nothing else
    assert w.store.job("done-7").status is Status.CANCELLED  # an ended job is still read by its id


def test_a_job_that_ends_leaves_the_index_at_the_next_sweep_and_its_zones_are_still_listed() -> None:
    w = World()
    w.service.handle(JobSubmitted("submit-live", T0, spec("live")))
    w.trust()
    w.ended("far", zones=(C,))
    assert w.store.marked() == {"live", "far"}
    w.sweep()
    assert w.store.marked() == {"live"}
    assert (("tpu", C)) in w.store.load_state()[0].zones  # type: ignore[union-attr]
    # a machine of the ended job turns up in a zone no live job uses (a delete that did not stick): the sweep lists
    # that zone still, reads the job's record and deletes the machine
    w.provider.machines["far-a1"] = Machine("far-a1", C, MachineState.READY, {"respawn-job": "far"})
    w.provider.calls.clear()
    assert w.sweep() == 2  # the live job's record, and the one the listing names
    assert w.provider.calls == [("delete", "far-a1", C)] and "far-a1" not in w.provider.machines
    w.sweep()
    assert w.store.marked() == {"live"}  # its intent carried out, it leaves again


def test_a_store_of_todays_layout_is_migrated_by_the_sweep_and_served_throughout() -> None:
    """Records written before the index (no marker, no state): the sweep reads every record until the index is
    trusted, writing the markers of those it watches; then only those."""
    w = World()
    old = Service(w.store, {"tpu": w.provider}, w.clock)  # the code before the index
    for i in range(5):
        old.handle(JobSubmitted(f"submit-done-{i}", T0, spec(f"done-{i}")))
        old.handle(CancelRequested(f"cancel-done-{i}", T0, f"done-{i}"))
    old.handle(JobSubmitted("submit-live", T0, spec("live")))
    old.handle(JobRejected("rejected-bad", T0, "bad", "field zones: expected a list"))
    assert w.store.marked() == set() and w.store.load_state() == (None, 0)

    assert w.sweep() == 7
    assert w.store.marked() == {"live"}
    state, _ = w.store.load_state()
    assert state == IndexState(T0, complete=False, zones=frozenset({("tpu", A), ("tpu", B)}))
    old.handle(JobSubmitted("submit-late", T0, spec("late")))  # the old code still runs while a deploy settles
    w.clock.advance(SETTLE_S - 1)
    assert w.sweep() == 8  # still every record, and the late one is indexed
    assert w.store.marked() == {"live", "late"}
    w.clock.advance(1)
    assert w.sweep() == 8  # the first sweep the settle time after: every record once more, then complete
    assert w.store.load_state()[0] == replace(state, complete=True)
    assert w.sweep() == 2
    assert {job_id: w.store.job(job_id).status for job_id in ("done-3", "bad", "live")} == {
        "done-3": Status.CANCELLED,
        "bad": Status.REJECTED,
        "live": Status.PROVISIONING,
    }


def test_a_store_without_records_needs_no_migration() -> None:
    w = World()
    w.sweep()
    state, _ = w.store.load_state()
    assert state is not None and state.complete
    w.service.handle(JobSubmitted("submit-llm", T0, spec("llm")))
    assert w.store.marked() == {"llm"} and w.sweep() == 1


def test_a_marker_a_crash_left_without_its_record_goes_once_older_than_any_delivery() -> None:
    w = World()
    w.trust()
    plan = CrashPlan(at=1, before=False)  # the submit's marker written, then the crash: the delivery is lost
    crashing = Service(
        CrashingStore(w.store, plan),
        {"tpu": CrashingProvider(w.provider, plan)},
        w.clock,
        index=CrashingIndex(w.store, plan),
    )
    with pytest.raises(Crash):
        crashing.handle(JobSubmitted("submit-lost", w.clock.now(), spec("lost")))
    assert w.store.marked() == {"lost"} and w.store.load("lost") == (None, 0)
    w.clock.advance(ORPHAN_MARKER_S - 1)
    w.sweep()
    assert w.store.marked() == {"lost"}  # its handler might still be writing the record
    w.clock.advance(2)
    w.sweep()
    assert w.store.marked() == set()


# -- a handler that makes a record the sweep's again, racing the sweep that removes its marker -------------------------


def rejected_and_swept(w: World) -> None:
    """A rejected job's record (its notice published, so nothing more to watch) and a trusted index: the next sweep
    removes its marker."""
    w.service.handle(JobRejected("rejected-1", w.clock.now(), "llm", "field zones: expected a list"))
    assert w.store.marked() == {"llm"} and not w.store.job("llm").swept
    w.store.save_state(IndexState(w.clock.now(), complete=True), 0)


@pytest.mark.parametrize(
    ("hook", "handler"),
    [
        ("before save", "fresh"),  # the whole resubmit between the sweep's listing and its rewrite of the record
        ("before save", "cached"),
        ("before leave", "fresh"),  # ... between the sweep's rewrite and its delete of the marker
        ("before leave", "cached"),
    ],
)
def test_a_resubmit_while_the_sweep_removes_the_marker_keeps_one(hook: str, handler: str) -> None:
    w = World(notifier=True)
    rejected_and_swept(w)
    other = w.instance() if handler == "fresh" else w.service  # "cached": the instance that wrote the record
    w.store.hooks[hook] = lambda: other.handle(JobSubmitted("submit-2", w.clock.now(), spec("llm")))
    w.sweep(w.instance())
    assert w.store.job("llm").status is Status.PROVISIONING
    assert w.store.marked() == {"llm"}


@pytest.mark.parametrize("handler", ["fresh", "cached"])
def test_a_sweep_between_a_resubmits_marker_and_its_record_leaves_the_marker(handler: str) -> None:
    """The handler writes the marker; a whole sweep runs, listing that marker and reading the record before the
    handler's write: the sweep's rewrite of the record makes the handler's write conflict, and its next try writes
    the marker again."""
    w = World(notifier=True)
    rejected_and_swept(w)
    other = w.instance() if handler == "fresh" else w.service
    sweeper = w.instance()
    w.store.hooks["after enter"] = lambda: w.sweep(sweeper)
    other.handle(JobSubmitted("submit-2", w.clock.now(), spec("llm")))
    assert w.store.job("llm").status is Status.PROVISIONING
    assert w.store.marked() == {"llm"} and w.store.left == 1  # the sweep did remove it, and it was written again


@pytest.mark.parametrize("at", [1, 2, 3])
@pytest.mark.parametrize("before", [True, False])
def test_a_sweep_that_crashes_while_removing_a_marker_leaves_it_to_the_next(at: int, before: bool) -> None:
    """The sweep's writes for an ended job: the index's zones, the record rewritten, the marker deleted."""
    w = World()
    w.trust()
    w.ended("gone", zones=(C,))
    plan = CrashPlan(at=at, before=before)
    crashing = Service(
        CrashingStore(w.store, plan),
        {"tpu": CrashingProvider(w.provider, plan)},
        w.clock,
        index=CrashingIndex(w.store, plan),
    )
    with pytest.raises(Crash):
        crashing.handle(SweepTicked("tick-crash", w.clock.now()))
    assert plan.log[-1] == ["save index state", "save gone", "leave gone"][at - 1]
    assert w.store.marked() == (set() if at == 3 and not before else {"gone"})
    w.sweep()
    assert w.store.marked() == set() and w.store.job("gone").status is Status.CANCELLED
    assert ("tpu", C) in w.store.load_state()[0].zones  # type: ignore[union-attr]


def test_markers_listed_are_what_the_store_holds() -> None:
    store = InMemoryJobStore(FakeClock(T0))
    store.enter("a")
    first = store.markers()["a"]
    store.enter("a")  # written again: a new generation
    second = store.markers()["a"]
    assert second.generation > first.generation and second == Marker(second.generation, T0)
    with pytest.raises(Exception, match="generation"):
        store.leave("a", first.generation)
    store.leave("a", second.generation)
    store.leave("a", second.generation)  # gone: no error
    assert store.markers() == {}


def test_the_index_state_round_trips() -> None:
    state = IndexState(T0, complete=True, zones=frozenset({("tpu", A), ("compute", B)}))
    assert IndexState.from_json(state.to_json()) == state
    assert replace(state, zones=frozenset()).to_json() == {"since": T0, "complete": True, "zones": []}
