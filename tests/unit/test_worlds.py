"""decide for a job of several slices (respawn.worlds): the membership rules, with duplicated and reordered events.

The job message refuses slices > 1 until the machines run worlds end to end; these rules are decide's already, and
held here on records built through decide itself."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from test_decide import POLICY, T0, eid, spec, step

from respawn.actions import Action, CreateMachine, DeleteMachine, SetWorld
from respawn.decide import decide
from respawn.events import (
    CancelRequested,
    CheckpointSaved,
    CreateFailed,
    CreateFailure,
    JobEvent,
    JobSubmitted,
    MachineNoticed,
    MachinePreempted,
    MachinesObserved,
    TrainerCompleted,
    TrainerFailed,
    TrainerReady,
    TrainerStarted,
)
from respawn.jobs import Job, MachineState, Status, TpuMachine, World

A = "us-central1-a"


def world_spec(slices: int = 3, min_slices: int = 2) -> object:
    return spec(machine=TpuMachine("v5litepod-8", "v2-alpha-tpuv5-lite", slices=slices, min_slices=min_slices))


def submitted(slices: int = 3, min_slices: int = 2) -> tuple[Job, list[Action]]:
    job, actions = step(None, JobSubmitted(eid(), T0, world_spec(slices, min_slices)))  # type: ignore[arg-type]
    assert job is not None
    return job, actions


def running(slices: int = 3, min_slices: int = 2) -> Job:
    job, _ = submitted(slices, min_slices)
    for n in range(1, slices + 1):
        job = after(job, TrainerStarted(eid(), T0, "llm", n))
    return job


def after(job: Job, *events: JobEvent) -> Job:
    for event in events:
        new, _ = step(job, event)
        assert new is not None
        job = new
    return job


def told(actions: list[Action]) -> dict[str, dict[str, object]]:
    return {a.machine: json.loads(a.world) for a in actions if isinstance(a, SetWorld)}


def test_a_submit_requests_every_slice_in_one_zone_each_told_the_first_world() -> None:
    job, actions = submitted()
    assert job.status is Status.PROVISIONING and job.world == World(1, (0, 1, 2))
    creates = [a for a in actions if isinstance(a, CreateMachine)]
    assert [(c.machine, c.slice) for c in creates] == [("llm-a1", 0), ("llm-a2", 1), ("llm-a3", 2)]
    assert len({c.zone for c in creates}) == 1
    assert {json.loads(c.world or "")["version"] for c in creates} == {1}
    assert [a.slice for a in job.attempts] == [0, 1, 2]


def test_a_notice_re_forms_the_survivors_and_requests_the_replacement_which_joins_when_ready() -> None:
    job = running()
    noticed, actions = step(job, MachineNoticed(eid(), T0 + 10, "llm", 2))
    assert noticed is not None and noticed.status is Status.RUNNING
    assert noticed.world == World(2, (0, 2))
    assert told(actions) == {m: {"version": 2, "members": [0, 2], "step": None} for m in ("llm-a1", "llm-a3")}
    create = next(a for a in actions if isinstance(a, CreateMachine))
    assert (create.machine, create.slice, json.loads(create.world or "")["members"]) == ("llm-a4", 1, [0, 2])
    assert not [a for a in actions if isinstance(a, DeleteMachine)]  # the noticed machine drains: the world saves
    assert noticed.counters.preemptions == 1
    # its trainer's last word (the world's save) ends the drain
    saved, actions = step(noticed, CheckpointSaved(eid(), T0 + 20, "llm", 2, 500, final=True))
    assert saved is not None and actions == [DeleteMachine("llm", 2, "llm-a2", A)]
    ready, actions = step(saved, TrainerReady(eid(), T0 + 60, "llm", 4, 2))
    assert ready is not None and ready.world == World(3, (0, 1, 2))
    assert set(told(actions)) == {"llm-a1", "llm-a3", "llm-a4"}


def test_events_told_twice_or_late_change_nothing_more() -> None:
    job = running()
    notice = MachineNoticed(eid(), T0 + 10, "llm", 2)
    once = after(job, notice)
    again, actions = decide(once, notice, T0 + 11, POLICY)  # the same delivery again
    assert (again, actions) == (once, [])
    preempted, actions = step(once, MachinePreempted(eid(), T0 + 40, "llm", 2, "llm-a2", A, "p"))  # after the notice
    assert preempted is not None and preempted.world == once.world and not told(actions)
    ready = TrainerReady(eid(), T0 + 60, "llm", 4, 2)
    joined = after(preempted, ready)
    twice, actions = step(joined, TrainerReady(eid(), T0 + 61, "llm", 4, 2))  # a second ready: already in
    assert twice is not None and twice.world == joined.world and not told(actions)
    stale = TrainerFailed(eid(), T0 + 62, "llm", 1, "collective failed", world=1)  # the old world's survivor
    assert step(joined, stale) == (joined, [])


def test_a_crash_breaks_the_world_once_and_its_members_form_the_next_in_place() -> None:
    job = running()
    crashed, actions = step(job, TrainerFailed(eid(), T0 + 10, "llm", 2, "exit 137", world=1))
    assert crashed is not None and crashed.world == World(2, (0, 1, 2)) and crashed.counters.failures == 1
    assert set(told(actions)) == {"llm-a1", "llm-a2", "llm-a3"}
    assert not [a for a in actions if isinstance(a, (CreateMachine, DeleteMachine))]  # no machine made or deleted
    echo, actions = step(crashed, TrainerFailed(eid(), T0 + 11, "llm", 1, "gloo: connection reset", world=1))
    assert (echo, actions) == (crashed, [])  # a peer's broken collective: the same break


def test_below_min_slices_the_whole_job_recovers_a_version_up() -> None:
    job = running(slices=2, min_slices=2)
    lost, actions = step(job, MachinePreempted(eid(), T0 + 10, "llm", 1, "llm-a1", A, "p"))
    assert lost is not None and lost.status is Status.RECOVERING
    assert lost.world == World(2, (0, 1))
    deleted = sorted(a.machine for a in actions if isinstance(a, DeleteMachine))
    created = [(a.machine, a.slice) for a in actions if isinstance(a, CreateMachine)]
    assert deleted == ["llm-a1", "llm-a2"] and created == [("llm-a3", 0), ("llm-a4", 1)]


def test_a_replacement_that_never_comes_leaves_the_world_training_on_and_a_listing_asks_again() -> None:
    job = after(running(), MachinePreempted(eid(), T0 + 10, "llm", 3, "llm-a3", A, "p"))
    stockout, actions = step(job, CreateFailed(eid(), T0 + 11, "llm", 4, CreateFailure.CAPACITY, "STOCKOUT"))
    assert stockout is not None and stockout.status is Status.RUNNING and stockout.world == World(2, (0, 1))
    assert not [a for a in actions if isinstance(a, CreateMachine)]
    listing = MachinesObserved(
        eid(), T0 + 300, "llm", (("llm-a1", A, MachineState.READY), ("llm-a2", A, MachineState.READY)), (A,)
    )
    asked, actions = step(stockout, listing)
    assert asked is not None
    assert [(a.machine, a.slice) for a in actions if isinstance(a, CreateMachine)] == [("llm-a5", 2)]
    done, actions = step(asked, TrainerCompleted(eid(), T0 + 900, "llm", 1, 1000, {"final_loss": 1.0}))
    assert done is not None and done.status is Status.SUCCEEDED
    assert sorted(a.machine for a in actions if isinstance(a, DeleteMachine)) == ["llm-a1", "llm-a2", "llm-a5"]


def test_a_world_that_cannot_form_backs_off_and_a_listing_makes_every_slice_when_it_is_over() -> None:
    job, _ = submitted(slices=2, min_slices=2)
    waiting, actions = step(job, CreateFailed(eid(), T0 + 1, "llm", 2, CreateFailure.CAPACITY, "STOCKOUT"))
    assert waiting is not None and waiting.status is Status.PENDING and waiting.next_attempt_at is not None
    assert actions == [DeleteMachine("llm", 1, "llm-a1", A)]  # the slice that got a machine gives it back
    early, actions = step(waiting, MachinesObserved(eid(), T0 + 2, "llm", (), (A,)), now=T0 + 2)
    assert (early, actions) == (waiting, [])  # no storm of creates: nothing before the backoff is over
    due = waiting.next_attempt_at + 1
    again, actions = step(waiting, MachinesObserved(eid(), due, "llm", (), (A,)), now=due)
    assert again is not None and again.status is Status.PROVISIONING
    assert [(a.machine, a.slice) for a in actions if isinstance(a, CreateMachine)] == [("llm-a3", 0), ("llm-a4", 1)]


def test_a_dead_member_in_a_listing_is_lost_and_cancel_deletes_every_machine() -> None:
    job = running()
    listing = MachinesObserved(
        eid(),
        T0 + 300,
        "llm",
        (("llm-a1", A, MachineState.READY), ("llm-a2", A, MachineState.PREEMPTED), ("llm-a3", A, MachineState.READY)),
        (A,),
    )
    lost, actions = step(job, listing)
    assert lost is not None and lost.world == World(2, (0, 2)) and lost.status is Status.RUNNING
    assert DeleteMachine("llm", 2, "llm-a2", A) in actions
    cancelled, actions = step(lost, CancelRequested(eid(), T0 + 400, "llm"))
    assert cancelled is not None and cancelled.status is Status.CANCELLED
    live = {a.machine for a in lost.attempts if not a.machine_deleted}
    assert {a.machine for a in actions if isinstance(a, DeleteMachine)} == live


SLICE_EVENTS = st.lists(
    st.tuples(st.sampled_from(["notice", "preempted", "ready", "failed", "saved"]), st.integers(1, 8)), max_size=25
)


@settings(max_examples=150, deadline=None)
@given(SLICE_EVENTS)
def test_any_order_and_any_repeat_keeps_the_invariants(events: list[tuple[str, int]]) -> None:
    """Versions only rise; members are slices with a live attempt, one at most per slice; a job holds at most a
    machine per slice and one draining per noticed member; every event delivered twice changes nothing more."""
    job = running()
    k = 3
    for i, (kind, n) in enumerate(events):
        t = T0 + 10 + i
        event: JobEvent = {
            "notice": MachineNoticed(eid(), t, "llm", n),
            "preempted": MachinePreempted(eid(), t, "llm", n, f"llm-a{n}", A, "p"),
            "ready": TrainerReady(eid(), t, "llm", n, None),
            "failed": TrainerFailed(eid(), t, "llm", n, "exit 1"),
            "saved": CheckpointSaved(eid(), t, "llm", n, i, final=True),
        }[kind]
        before = job.world
        new, _ = decide(job, event, t, POLICY)
        assert new is not None
        again, actions = decide(new, event, t, POLICY)
        assert (again, actions) == (new, [])
        job = new
        if job.status.terminal:
            break
        assert job.world is not None and before is not None and job.world.version >= before.version
        live = {a.slice for a in job.attempts if not a.ended}
        assert set(job.world.members) <= live
        assert len(live) == sum(1 for a in job.attempts if not a.ended)
        assert sum(1 for a in job.attempts if not a.machine_deleted) <= 2 * k
