"""The preemption history with no hot object: each ended attempt's observation its own create-only object, read merged
with the history object, folded into it by the sweep in one write; nothing counted twice whatever crashes or
repeats."""

from __future__ import annotations

import pytest
from fakes import (
    Crash,
    CrashingHistoryStore,
    CrashPlan,
    FakeClock,
    FakeProvider,
    InMemoryHistoryStore,
    InMemoryJobStore,
)

from respawn.events import JobSubmitted, MachinePreempted, SweepTicked, TrainerStarted
from respawn.histories import FOLD_MAX, Histories, current
from respawn.jobs import JobSpec, MachineState, TpuMachine
from respawn.outlook import History, Key, Observation
from respawn.ports import TransientError
from respawn.service import Service

A, B = "us-central1-a", "us-west4-a"
TPU = "v5litepod-8"
T0 = 1_000_000.0
KEY = Key(A, TPU, "spot")


def spec(job_id: str) -> JobSpec:
    return JobSpec(job_id, TpuMachine(TPU, "v2-alpha-tpuv5-lite"), (A, B), "img", f"gs://b/runs/{job_id}")


def observation(i: int, at: float = T0) -> Observation:
    return Observation(f"job-{i:04d}/1", KEY, 3600.0, 1, at)


def interruptions(history: History) -> float:
    return round(sum(e.interruptions for e in history.exposures.values()), 6)


def test_a_wave_of_preemptions_writes_no_shared_object_until_the_sweep_folds_it_in_one_write() -> None:
    clock, provider, history = FakeClock(T0), FakeProvider(creating_reads=0), InMemoryHistoryStore()
    store = InMemoryJobStore(clock)
    service = Service(store, {"tpu": provider}, clock, history=history, index=store)
    jobs = [f"job-{i}" for i in range(50)]
    for job in jobs:
        service.handle(JobSubmitted(f"submit-{job}", T0, spec(job)))
        service.handle(TrainerStarted(f"started-{job}", T0, job, 1))
    clock.advance(600)
    for job in jobs:  # every machine taken back within a minute, each event delivered twice
        provider.set_state(f"{job}-a1", MachineState.PREEMPTED)
        event = MachinePreempted(f"preempted-{job}", clock.now(), job, 1, f"{job}-a1", A, "p")
        service.handle(event)
        service.handle(event)
    assert history.saves == 0 and history.adds == 50  # one object per ended attempt, each written once
    assert interruptions(history.history) == 50 and len(history.waiting) == 50
    service.handle(SweepTicked("tick-1", clock.now()))
    assert history.saves == 1 and history.waiting == []  # one write of the history object
    assert interruptions(history.folded) == 50 and sorted(history.folded.seen) == [f"{job}/1" for job in sorted(jobs)]
    service.handle(SweepTicked("tick-2", clock.now()))
    assert history.saves == 1  # nothing pending: no write


def test_placement_reads_the_pending_observations_within_a_minute() -> None:
    store = InMemoryHistoryStore()
    writer, reader = Histories(store), Histories(store)
    assert reader.outlook(T0).history.seen == () and writer.outlook(T0).history.seen == ()
    writer.record([observation(1).to_dict()], T0)
    assert writer.outlook(T0).history.seen == ("job-0001/1",)  # the writer's cache counts it at once
    assert reader.outlook(T0 + 59).history.seen == ()  # another instance's cache: at most a minute old
    assert reader.outlook(T0 + 60).history.seen == ("job-0001/1",)
    assert store.loads == 3 and store.lists == 3  # one read and one listing per refresh


def test_an_observation_written_twice_is_one_object_counted_once() -> None:
    store = InMemoryHistoryStore()
    histories = Histories(store)
    for _ in range(3):
        histories.record([observation(1).to_dict()], T0)
    assert store.adds == 1 and interruptions(store.history) == 1
    histories.fold()
    histories.record([observation(1).to_dict()], T0)  # a redelivery after the fold: a new object, already counted
    assert store.waiting == ["job-0001/1"] and interruptions(store.history) == 1
    histories.fold()
    assert store.waiting == [] and store.saves == 1 and interruptions(store.folded) == 1


@pytest.mark.parametrize("at", [1, 2])
@pytest.mark.parametrize("before", [True, False])
def test_a_fold_that_crashes_at_any_write_counts_nothing_twice(at: int, before: bool) -> None:
    """A fold's writes: the history object, then the folded observations' deletes."""
    store = InMemoryHistoryStore(History().record([observation(0)]))
    Histories(store).record([observation(i).to_dict() for i in range(1, 6)], T0)
    plan = CrashPlan(at=at, before=before)
    with pytest.raises(Crash):
        Histories(CrashingHistoryStore(store, plan)).fold()
    assert interruptions(store.history) == 6  # what placement reads, at any moment
    Histories(store).fold()
    assert store.waiting == [] and interruptions(store.folded) == 6
    assert len(store.folded.seen) == len(set(store.folded.seen)) == 6


def test_a_fold_takes_at_most_its_share_and_the_next_the_rest() -> None:
    store = InMemoryHistoryStore()
    histories = Histories(store)
    histories.record([observation(i).to_dict() for i in range(FOLD_MAX + 88)], T0)
    assert histories.fold() == FOLD_MAX and len(store.waiting) == 88
    assert interruptions(store.history) == FOLD_MAX + 88
    assert histories.fold() == 88 and store.waiting == [] and store.saves == 2


def test_a_fold_that_loses_the_compare_and_set_reloads_and_counts_once() -> None:
    store = InMemoryHistoryStore()
    histories = Histories(store)
    histories.record([observation(1).to_dict()], T0)
    store.conflicts = 2  # two other writers of the history object (an older version's handlers, another sweep)
    histories.fold()
    assert store.saves == 1 and interruptions(store.folded) == 1 and store.waiting == []


def test_a_fold_that_fails_leaves_the_observations_pending_and_the_sweep_goes_on() -> None:
    clock, history = FakeClock(T0), InMemoryHistoryStore()
    store = InMemoryJobStore(clock)
    service = Service(store, {"tpu": FakeProvider()}, clock, history=history, index=store)
    Histories(history).record([observation(1).to_dict()], T0)
    history.errors.append(TransientError("503"))  # the fold's listing
    service.handle(SweepTicked("tick-1", T0))
    assert history.waiting == ["job-0001/1"]
    service.handle(SweepTicked("tick-2", T0))
    assert history.waiting == [] and interruptions(history.folded) == 1


def test_current_is_the_object_with_the_pending_merged() -> None:
    store = InMemoryHistoryStore(History().record([observation(0)]))
    Histories(store).record([observation(1).to_dict(), observation(0).to_dict()], T0)
    history, generation, pending = current(store)
    assert generation == 1 and pending == 2 and interruptions(history) == 2
