"""Status messages: one per status change, kept in the record's outbox under the lease, published once.

Duplicates (sequential and concurrent), a crash at every mutating step, transient and permanent publish failures,
against the in-memory fakes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

import pytest
from fakes import (
    Crash,
    CrashingNotifier,
    CrashingProvider,
    CrashingStore,
    CrashPlan,
    FakeClock,
    FakeProvider,
    InMemoryJobStore,
    RecordingNotifier,
    assert_status_chain,
    deliver_concurrently,
)

from respawn.events import (
    Event,
    JobRejected,
    JobSubmitted,
    MachinePreempted,
    SweepTicked,
    TrainerCompleted,
    TrainerStarted,
)
from respawn.jobs import JobSpec, MachineState, Status, TpuMachine
from respawn.policy import Policy
from respawn.ports import PermanentError, TransientError
from respawn.service import Retryable, Service, ServiceSettings
from respawn.status_messages import message_attributes

A, B = "us-central1-a", "us-west4-a"
T0 = 1_000_000.0
POLICY = Policy()
SETTINGS = ServiceSettings()
SPEC = JobSpec(
    job_id="llm",
    machine=TpuMachine("v5litepod-8", "v2-alpha-tpuv5-lite"),
    zones=(A, B),
    image="us-docker.pkg.dev/p/r/trainer:1",
    checkpoint_uri="gs://b/runs/llm",
)


@dataclass
class World:
    store: InMemoryJobStore
    provider: FakeProvider
    clock: FakeClock
    notifier: RecordingNotifier

    def service(self, plan: CrashPlan | None = None) -> Service:
        if plan is None:
            return Service(self.store, {"tpu": self.provider}, self.clock, POLICY, self.notifier)
        return Service(
            CrashingStore(self.store, plan),
            {"tpu": CrashingProvider(self.provider, plan)},
            self.clock,
            POLICY,
            CrashingNotifier(self.notifier, plan),
        )

    def handle(self, event: Event) -> str:
        return self.service().handle(event).result


def world(capacity: dict[str, int] | None = None) -> World:
    return World(InMemoryJobStore(), FakeProvider(capacity), FakeClock(T0), RecordingNotifier())


def preempted(w: World, attempt: int) -> MachinePreempted:
    name = f"llm-a{attempt}"
    w.provider.set_state(name, MachineState.PREEMPTED)
    return MachinePreempted(f"preempted-{attempt}", w.clock.now(), "llm", attempt, name, A, "p")


def test_a_job_through_two_preemptions_notifies_each_change_once_under_duplicates() -> None:
    w = world()
    submit = JobSubmitted("submit-1", T0, SPEC)
    for _ in range(3):
        assert w.handle(submit) in ("applied", "duplicate")
    for n in (1, 2):
        started = TrainerStarted(f"started-{n}", w.clock.now(), "llm", n)
        for _ in range(3):
            w.handle(started)
        w.clock.advance(60)
        event = preempted(w, n)
        for _ in range(3):
            w.handle(event)
        w.handle(started)  # late: names an attempt that is over
    w.handle(TrainerStarted("started-3", w.clock.now(), "llm", 3))
    done = TrainerCompleted("completed-3", w.clock.now(), "llm", 3, 800)
    for _ in range(3):
        w.handle(done)
    w.handle(SweepTicked("tick-1", w.clock.now()))

    assert w.notifier.changes() == [
        (None, "PROVISIONING"),
        ("PROVISIONING", "RUNNING"),
        ("RUNNING", "RECOVERING"),
        ("RECOVERING", "RUNNING"),
        ("RUNNING", "RECOVERING"),
        ("RECOVERING", "RUNNING"),
        ("RUNNING", "SUCCEEDED"),
    ]
    last = w.notifier.notices[-1]
    assert last["attempt"] == 3 and last["zone"] == A
    assert last["counters"] == {"preemptions": 2, "failures": 0, "capacity_errors": 0}
    assert last["time"].endswith("Z") and last["text"].startswith("respawn: job llm RUNNING -> SUCCEEDED")
    assert len({n["id"] for n in w.notifier.notices}) == 7
    assert message_attributes(last) == {"job_id": "llm", "status": "SUCCEEDED", "notice_id": last["id"]}
    job = w.store.job("llm")
    assert job.outbox == () and job.pending_lease_until is None


@pytest.mark.parametrize("round_", range(5))
def test_the_same_preemption_delivered_five_times_at_once_notifies_once(round_: int) -> None:
    w = world()
    w.handle(JobSubmitted("submit-1", T0, SPEC))
    w.handle(TrainerStarted("started-1", T0, "llm", 1))
    event = preempted(w, 1)
    deliver_concurrently([w.service().handle for _ in range(5)], event)  # each on its own function instance
    assert w.notifier.changes() == [(None, "PROVISIONING"), ("PROVISIONING", "RUNNING"), ("RUNNING", "RECOVERING")]


def test_capacity_in_no_zone_is_two_changes_in_one_handler() -> None:
    w = world({A: 0, B: 0})
    w.handle(JobSubmitted("submit-1", T0, SPEC))
    assert w.notifier.changes() == [(None, "PROVISIONING"), ("PROVISIONING", "PENDING")]
    assert "capacity" in w.notifier.notices[-1]["reason"]


# -- a crash at every mutating step ------------------------------------------------------------------------------------

# scenario -> the mutating calls of its event's handling, uncrashed; the last two are the notice and the clear
CRASH_SCENARIOS = {
    "started": 3,  # save the change with its notice, notify, clear
    "preemption": 5,  # save intent and notice, delete a1, create a2, notify, clear
}


def crash_scenario(name: str) -> tuple[World, Event]:
    w = world()
    w.handle(JobSubmitted("submit-1", T0, SPEC))
    if name == "started":
        return w, TrainerStarted("started-1", T0, "llm", 1)
    w.handle(TrainerStarted("started-1", T0, "llm", 1))
    return w, preempted(w, 1)


def test_the_crash_scenarios_make_the_counted_calls() -> None:
    for name, calls in CRASH_SCENARIOS.items():
        w, event = crash_scenario(name)
        plan = CrashPlan(at=0)
        w.service(plan).handle(event)
        assert plan.seen == calls, (name, plan.log)


@pytest.mark.parametrize(
    ("name", "at", "before", "repair"),
    [
        (name, at, before, repair)
        for name, calls in CRASH_SCENARIOS.items()
        for at in range(1, calls + 1)
        for before in (True, False)
        for repair in ("redelivery", "sweep")
    ],
)
def test_a_crash_at_any_step_loses_no_notice(name: str, at: int, before: bool, repair: str) -> None:
    w, event = crash_scenario(name)
    published = len(w.notifier.notices)
    plan = CrashPlan(at=at, before=before)
    with pytest.raises(Crash):
        w.service(plan).handle(event)
    calls = CRASH_SCENARIOS[name]
    # published, and the outbox not cleared: after the notice took effect, or before the clear did
    published_not_cleared = (at == calls - 1 and not before) or (at == calls and before)

    w.handle(event)  # a redelivery within the lease publishes nothing twice
    w.clock.advance(SETTINGS.lease_s + 1)
    w.handle(event if repair == "redelivery" else SweepTicked("tick-1", w.clock.now()))
    w.handle(SweepTicked("tick-2", w.clock.now()))

    new = w.notifier.notices[published:]
    counts = Counter(n["id"] for n in new)
    assert len(counts) == 1 and new[0]["new_status"] == w.store.job("llm").status.value, new
    # Only a crash between the publish and the clear publishes again, with the same id.
    assert list(counts.values()) == [2 if published_not_cleared else 1], (plan.log, new)
    assert w.store.job("llm").outbox == ()
    assert_status_chain(list(dict.fromkeys(w.notifier.changes())))


# -- publish failures ------------------------------------------------------------------------------------------------


def test_a_transient_publish_failure_is_retried_by_redelivery_and_publishes_once() -> None:
    w = world()
    w.handle(JobSubmitted("submit-1", T0, SPEC))
    w.notifier.errors.append(TransientError("publishing to projects/p/topics/respawn-status: 503"))
    started = TrainerStarted("started-1", T0, "llm", 1)
    with pytest.raises(Retryable, match="status message"):
        w.handle(started)
    job = w.store.job("llm")
    assert job.status is Status.RUNNING and len(job.outbox) == 1  # kept for the next handler, lease given up
    assert w.handle(started) == "duplicate"
    assert w.notifier.changes() == [(None, "PROVISIONING"), ("PROVISIONING", "RUNNING")]
    assert w.store.job("llm").outbox == ()


def test_a_permanent_publish_failure_is_logged_and_never_holds_up_the_job(caplog: pytest.LogCaptureFixture) -> None:
    w = world()
    w.notifier.errors.append(PermanentError("publishing to projects/p/topics/respawn-status: 404 topic not found"))
    with caplog.at_level("ERROR", logger="respawn.service"):
        assert w.handle(JobSubmitted("submit-1", T0, SPEC)) == "applied"
    assert w.provider.live("llm") == ["llm-a1"]
    assert w.notifier.notices == [] and w.store.job("llm").outbox == ()
    assert "status message llm/" in caplog.text and "topic not found" in caplog.text


def test_without_a_notifier_no_notice_is_kept() -> None:
    w = world()
    service = Service(w.store, {"tpu": w.provider}, w.clock, POLICY)
    service.handle(JobSubmitted("submit-1", T0, SPEC))
    service.handle(TrainerStarted("started-1", T0, "llm", 1))
    job = w.store.job("llm")
    assert job.status is Status.RUNNING and job.outbox == ()
    assert replace(job, outbox=()) == job


def test_a_rejected_record_whose_handler_crashed_before_publishing_has_its_notice_published_by_the_sweep() -> None:
    """The REJECTED record was written with its notice in the outbox, then the handler died and its delivery was
    lost: nothing else ever touches a rejected record, so the sweep must drain its outbox."""
    w = world()
    plan = CrashPlan(at=1, before=False)  # the record is written, the notice not yet published
    with pytest.raises(Crash):
        w.service(plan).handle(JobRejected("reject-1", T0, "llm", 'field "zones": must not be empty'))
    assert w.store.job("llm").status is Status.REJECTED and len(w.store.job("llm").outbox) == 1
    w.handle(SweepTicked("tick-1", w.clock.now()))  # within the lease: the handler may still be at work
    assert w.notifier.notices == []
    w.clock.advance(SETTINGS.lease_s + 1)
    w.handle(SweepTicked("tick-2", w.clock.now()))
    assert w.notifier.changes() == [(None, "REJECTED")]
    assert w.store.job("llm").outbox == ()
    w.handle(SweepTicked("tick-3", w.clock.now()))
    assert len(w.notifier.notices) == 1
