"""Service: load, decide, persist intent, act, clear, against in-memory fakes of the store and the provider."""

from __future__ import annotations

import json
import logging
import random
import threading
from dataclasses import dataclass, replace

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
    deliver_concurrently,
)

from respawn.actions import CreateMachine, DeleteMachine
from respawn.events import (
    EXIT_CODE,
    CheckpointSaved,
    Event,
    Ignored,
    JobRejected,
    JobSubmitted,
    MachinePreempted,
    SweepTicked,
    TrainerCompleted,
    TrainerFailed,
    TrainerProgressed,
    TrainerStarted,
    ZoneWokeUp,
)
from respawn.jobs import GpuMachine, JobSpec, MachineState, Status, TpuMachine
from respawn.policy import Policy, backoff_s
from respawn.ports import Machine, PermanentError, TransientError
from respawn.service import Outcome, Result, Retryable, Service, ServiceSettings

A, B = "us-central1-a", "us-west4-a"
T0 = 1_000_000.0
POLICY = Policy()
SETTINGS = ServiceSettings()
DEADLINE = T0 + 48 * 3600  # submitted at T0 with the default ttl


def spec(**overrides: object) -> JobSpec:
    base = JobSpec(
        job_id="llm",
        machine=TpuMachine("v5litepod-8", "v2-alpha-tpuv5-lite"),
        zones=(A, B),
        image="us-docker.pkg.dev/p/r/trainer:1",
        checkpoint_uri="gs://b/runs/llm",
    )
    return replace(base, **overrides)


@dataclass
class World:
    store: InMemoryJobStore
    provider: FakeProvider
    clock: FakeClock
    service: Service

    def handle(self, event: Event) -> Outcome:
        return self.service.handle(event)

    def status(self) -> Status:
        return self.store.job("llm").status

    def crashing(self, plan: CrashPlan) -> Service:
        store, provider = CrashingStore(self.store, plan), {"tpu": CrashingProvider(self.provider, plan)}
        return Service(store, provider, self.clock, index=CrashingIndex(self.store, plan))


def world(capacity: dict[str, int] | None = None, **spec_overrides: object) -> World:
    """A job submitted, on a service with the live index (its marker written before the record)."""
    store, provider, clock = InMemoryJobStore(), FakeProvider(capacity), FakeClock(T0)
    w = World(store, provider, clock, Service(store, {"tpu": provider}, clock, POLICY, index=store))
    w.handle(JobSubmitted("submit-1", T0, spec(**spec_overrides)))
    return w


def running() -> World:
    w = world()
    w.handle(TrainerStarted("started-1", T0, "llm", 1))
    w.clock.advance(100)
    w.provider.calls.clear()
    return w


def preemption(w: World) -> MachinePreempted:
    w.provider.set_state("llm-a1", MachineState.PREEMPTED)
    return MachinePreempted("preempted-1", w.clock.now(), "llm", 1, "llm-a1", A, "p")


def test_submit_creates_the_first_machine() -> None:
    w = world()
    assert w.provider.machines.keys() == {"llm-a1"}
    job = w.store.job("llm")
    assert job.status is Status.PROVISIONING and job.pending == () and job.pending_lease_until is None


def test_the_same_preemption_five_times_gives_one_delete_and_one_create() -> None:
    w = running()
    event = preemption(w)
    results = [w.handle(event).result for _ in range(5)]
    assert results == ["applied"] + ["duplicate"] * 4
    assert w.provider.calls == [("delete", "llm-a1", A), ("create", "llm-a2", A)]
    assert w.provider.live("llm") == ["llm-a2"]
    assert w.status() is Status.RECOVERING


@pytest.mark.parametrize("round_", range(10))
def test_the_same_preemption_five_times_concurrently_gives_one_delete_and_one_create(round_: int) -> None:
    w = running()
    event = preemption(w)
    results = deliver_concurrently([w.handle] * 5, event)
    assert sorted(results) == ["applied"] + ["duplicate"] * 4
    assert w.provider.count("delete", "llm-a1") == 1 and w.provider.count("create", "llm-a2") == 1
    assert w.provider.live("llm") == ["llm-a2"]


@pytest.mark.parametrize("order", range(8))
def test_the_exit_codes_and_the_trainers_completed_entries_concurrently_and_twice_give_one_delete_and_its_result(
    order: int,
) -> None:
    w = running()
    own = TrainerCompleted("completed-1", w.clock.now(), "llm", 1, 300, {"params_sha256": "ab", "final_loss": 1.5})
    by_exit = TrainerCompleted("completed-exit-1", w.clock.now(), "llm", 1, source=EXIT_CODE)
    events = [own, by_exit] * 2
    random.Random(order).shuffle(events)
    barrier = threading.Barrier(len(events))

    def deliver(event: Event) -> None:
        barrier.wait()
        for _ in range(50):  # what Pub/Sub does with a Retryable
            try:
                w.handle(event)
                return
            except Retryable:
                continue

    threads = [threading.Thread(target=deliver, args=(e,)) for e in events]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    job = w.store.job("llm")
    assert job.status is Status.SUCCEEDED and job.reason == "the trainer completed"
    assert job.result == {"params_sha256": "ab", "final_loss": 1.5, "final_step": 300}
    assert w.provider.calls == [("delete", "llm-a1", A)] and job.pending == ()


# -- a crash between any two steps ------------------------------------------------------------------------------------

# Each scenario: how to set it up, the event whose handling crashes, the machine that must end up live, and how many
# mutating calls (marker writes, record saves, creates, deletes) its uncrashed handling makes.
SCENARIOS = {
    "submit": 4,  # write the marker, save intent, create a1, clear
    "preemption": 4,  # save intent, delete a1, create a2, clear (the marker is there)
    "capacity": 6,  # write the marker, save intent, create a1 (no capacity), save feedback, create a2 in B, clear
}


def scenario(name: str) -> tuple[World, Event, str]:
    if name == "submit":
        store, provider, clock = InMemoryJobStore(), FakeProvider(), FakeClock(T0)
        w = World(store, provider, clock, Service(store, {"tpu": provider}, clock, POLICY, index=store))
        return w, JobSubmitted("submit-1", T0, spec()), "llm-a1"
    if name == "capacity":
        store, provider, clock = InMemoryJobStore(), FakeProvider({A: 0}), FakeClock(T0)
        w = World(store, provider, clock, Service(store, {"tpu": provider}, clock, POLICY, index=store))
        return w, JobSubmitted("submit-1", T0, spec()), "llm-a2"
    w = running()
    return w, preemption(w), "llm-a2"


def test_the_scenarios_make_the_counted_calls() -> None:
    for name, calls in SCENARIOS.items():
        w, event, _ = scenario(name)
        plan = CrashPlan(at=0)
        w.crashing(plan).handle(event)
        assert plan.seen == calls, (name, plan.log)


# A sweep cannot know of a job whose submit crashed before its record was written (at its marker, or before its
# first save): only redelivery repairs that.
CRASHES = [
    (name, at, before, repair)
    for name, calls in SCENARIOS.items()
    for at in range(1, calls + 1)
    for before in (1, 0)
    for repair in ("redelivery", "sweep")
    if not (repair == "sweep" and name != "preemption" and (at == 1 or (at == 2 and before)))
]


@pytest.mark.parametrize(("name", "at", "before", "repair"), CRASHES)
def test_a_crash_between_any_two_steps_is_repaired_without_a_duplicate_machine(
    name: str, at: int, before: int, repair: str
) -> None:
    w, event, survivor = scenario(name)
    plan = CrashPlan(at=at, before=bool(before))
    with pytest.raises(Crash):
        w.crashing(plan).handle(event)
    assert len(w.provider.live("llm")) <= 1

    w.clock.advance(SETTINGS.lease_s + 1)
    w.handle(event if repair == "redelivery" else SweepTicked("tick-1", w.clock.now()))

    job = w.store.job("llm")
    assert w.provider.live("llm") == [survivor]
    assert w.provider.machines.keys() == {survivor}
    assert job.current is not None and job.current.machine == survivor
    assert job.pending == () and job.status in (Status.PROVISIONING, Status.RECOVERING)
    assert w.provider.count("delete", survivor) == 0
    calls = list(w.provider.calls)
    w.handle(SweepTicked("tick-2", w.clock.now()))
    w.handle(event)
    assert w.provider.calls == calls  # repaired for good: nothing more to do
    assert w.store.marked() == {"llm"}  # and the sweep watches it


def test_a_redelivery_while_the_intent_lease_is_live_waits_for_it() -> None:
    w = running()
    event = preemption(w)
    with pytest.raises(Crash):
        w.crashing(CrashPlan(at=2)).handle(event)  # intent saved, then the handler died before deleting
    assert w.handle(event).result == "duplicate"  # the delivery that took the lease is the one that died
    other = CheckpointSaved("ckpt-9", w.clock.now(), "llm", 1, 9)
    with pytest.raises(Retryable, match="another delivery"):
        w.handle(other)
    assert w.provider.calls == []
    w.clock.advance(SETTINGS.lease_s)
    outcome = w.handle(other)  # lease over: the crashed intent is carried out first
    assert outcome.actions == (
        DeleteMachine("llm", 1, "llm-a1", A),
        CreateMachine("llm", 2, "llm-a2", A, deadline=DEADLINE),
    )
    assert outcome.result == "stale"  # and the checkpoint of attempt 1 changes nothing
    assert w.provider.live("llm") == ["llm-a2"]


# -- ordering, capacity, errors --------------------------------------------------------------------------------------


def test_an_event_for_an_older_attempt_after_the_next_started_changes_nothing() -> None:
    w = running()
    w.handle(preemption(w))
    w.handle(TrainerStarted("started-2", w.clock.now(), "llm", 2))
    _, generation = w.store.load("llm")
    w.provider.calls.clear()
    for event in (
        MachinePreempted("late-preempt", w.clock.now(), "llm", 1, "llm-a1", A, "p"),
        TrainerStarted("late-start", w.clock.now(), "llm", 1),
        CheckpointSaved("late-ckpt", w.clock.now(), "llm", 1, 500),
    ):
        assert w.handle(event).result == "stale"
    assert w.store.load("llm")[1] == generation
    assert w.provider.calls == [] and w.status() is Status.RUNNING


def test_a_late_stopped_entry_keeps_its_split_on_its_own_attempt_and_acts_on_nothing() -> None:
    w = running()
    w.handle(preemption(w))
    w.handle(TrainerStarted("started-2", w.clock.now(), "llm", 2))
    before = w.store.job("llm")
    w.provider.calls.clear()
    split = {"startup_s": 4.0, "productive_s": 90.0, "total_s": 95.0}
    stopped = CheckpointSaved("late-stopped", w.clock.now(), "llm", 1, 500, split)

    assert w.handle(stopped).result == "applied"
    assert w.handle(stopped).result == "duplicate"
    after = w.store.job("llm")
    assert after.attempts[0].goodput == split and after.attempts[1] == before.attempts[1]
    assert (after.status, after.counters, after.attempts[0].last_step) == (before.status, before.counters, None)
    assert w.provider.calls == []


def test_no_capacity_in_the_first_zone_creates_in_the_second() -> None:
    w = world(capacity={A: 0})
    job = w.store.job("llm")
    assert [(a.machine, a.zone, a.end_reason) for a in job.attempts] == [
        ("llm-a1", A, "capacity"),
        ("llm-a2", B, None),
    ]
    assert w.provider.live("llm") == ["llm-a2"] and job.pending == ()
    assert job.counters.capacity_errors == 1 and job.status is Status.PROVISIONING


def test_no_capacity_anywhere_waits_in_pending_then_a_sweep_creates_after_the_backoff() -> None:
    w = world(capacity={A: 0, B: 0})
    job = w.store.job("llm")
    assert job.status is Status.PENDING and w.provider.machines == {}
    assert job.next_attempt_at == T0 + backoff_s("llm", 0, POLICY)
    w.provider.calls.clear()
    w.clock.t = job.next_attempt_at - 1
    assert w.handle(SweepTicked("tick-early", w.clock.now())).result == "ignored"
    assert w.provider.calls == []
    w.provider.capacity[A] = 1
    w.clock.t = job.next_attempt_at
    outcome = w.handle(SweepTicked("tick-due", w.clock.now()))
    assert outcome.actions == (CreateMachine("llm", 3, "llm-a3", A, deadline=DEADLINE),)
    assert w.provider.live("llm") == ["llm-a3"] and w.status() is Status.PROVISIONING


def test_a_transient_error_asks_for_redelivery_and_the_redelivery_finishes() -> None:
    w = running()
    event = preemption(w)
    w.provider.fail_next("create", TransientError("503 backend error"))
    with pytest.raises(Retryable, match="503"):
        w.handle(event)
    job = w.store.job("llm")
    assert job.pending and job.pending_lease_until == w.clock.now()  # lease released at once
    outcome = w.handle(event)
    assert outcome.result == "duplicate" and outcome.actions == (
        CreateMachine("llm", 2, "llm-a2", A, deadline=DEADLINE),
    )
    assert w.provider.count("delete", "llm-a1") == 1
    assert w.provider.live("llm") == ["llm-a2"] and w.store.job("llm").pending == ()


def test_a_transient_store_error_asks_for_redelivery() -> None:
    w = running()
    event = preemption(w)
    w.store.errors.append(TransientError("503 from the store"))
    with pytest.raises(Retryable, match="503 from the store"):
        w.handle(event)
    assert w.provider.calls == []
    assert w.handle(event).result == "applied"
    assert w.provider.calls == [("delete", "llm-a1", A), ("create", "llm-a2", A)]


def test_a_permanent_error_fails_the_job_with_the_reason() -> None:
    w = running()
    w.provider.fail_next("create", PermanentError("403 the service account lacks tpu.nodes.create"))
    w.handle(preemption(w))
    job = w.store.job("llm")
    assert job.status is Status.FAILED and "tpu.nodes.create" in job.reason
    assert job.pending == () and w.provider.machines == {}


def test_a_job_for_an_api_without_provider_fails_clearly() -> None:
    store, provider, clock = InMemoryJobStore(), FakeProvider(), FakeClock(T0)
    service = Service(store, {"tpu": provider}, clock, POLICY)
    service.handle(JobSubmitted("s", T0, spec(machine=GpuMachine("g2-standard-8", "nvidia-l4", 1))))
    job = store.job("llm")
    assert job.status is Status.FAILED and "no machine provider for api 'compute'" in job.reason


def test_compare_and_set_conflicts_reload_and_decide_again() -> None:
    w = running()
    event = preemption(w)
    w.store.conflicts = 3
    assert w.handle(event).result == "applied"
    assert w.provider.calls == [("delete", "llm-a1", A), ("create", "llm-a2", A)]
    w.store.conflicts = 100
    with pytest.raises(Retryable, match="kept changing"):
        w.handle(CheckpointSaved("ckpt", w.clock.now(), "llm", 2, 5))


def test_the_service_settings_bound_the_compare_and_set_tries_and_the_intent_lease() -> None:
    w = running()
    settings = ServiceSettings(lease_s=10.0, max_conflicts=2)
    w.store.conflicts = 2
    with pytest.raises(Retryable, match="kept changing under 2 tries"):
        Service(w.store, {"tpu": w.provider}, w.clock, POLICY, settings=settings).handle(
            CheckpointSaved("ckpt", w.clock.now(), "llm", 1, 5)
        )
    event, plan = preemption(w), CrashPlan(at=2)  # intent saved under a 10 s lease, then the handler died
    crashing = CrashingStore(w.store, plan), {"tpu": CrashingProvider(w.provider, plan)}
    with pytest.raises(Crash):
        Service(*crashing, w.clock, POLICY, settings=settings).handle(event)
    other = CheckpointSaved("ckpt-9", w.clock.now(), "llm", 1, 9)
    with pytest.raises(Retryable, match="another delivery"):
        w.handle(other)
    w.clock.advance(settings.lease_s)
    assert w.handle(other).actions == (
        DeleteMachine("llm", 1, "llm-a1", A),
        CreateMachine("llm", 2, "llm-a2", A, deadline=DEADLINE),
    )


def test_results_are_named_and_compare_as_strings() -> None:
    w = running()
    outcome = w.handle(CheckpointSaved("ckpt", w.clock.now(), "llm", 1, 5))
    assert outcome.result is Result.APPLIED and outcome.result == "applied" and f"{outcome.result}" == "applied"
    assert {str(r) for r in Result} == {"applied", "duplicate", "stale", "ignored", "rejected", "retry"}


def test_rejected_messages() -> None:
    store, provider, clock = InMemoryJobStore(), FakeProvider(), FakeClock(T0)
    service = Service(store, {"tpu": provider}, clock, POLICY)
    assert service.handle(JobRejected("r1", T0, "bad-job", "zones: must not be empty")).result == "rejected"
    assert store.job("bad-job").status is Status.REJECTED
    assert service.handle(JobRejected("r2", T0, None, "not JSON")).result == "rejected"
    assert store.list_ids() == ["bad-job"]
    assert service.handle(Ignored("not ours")).result == "ignored"


# -- wake-ups and sweeps ---------------------------------------------------------------------------------------------


def test_a_tpu_worker_event_in_a_zone_replaces_the_preempted_node_there_once() -> None:
    w = running()
    w.provider.set_state("llm-a1", MachineState.PREEMPTED)
    assert w.handle(ZoneWokeUp("wake-b", w.clock.now(), B, "p", "t1v-n-1-w-0")).result == "ignored"
    outcome = w.handle(ZoneWokeUp("wake-a", w.clock.now(), A, "p", "t1v-n-2-w-0"))
    assert outcome.result == "applied" and outcome.job_ids == ("llm",)
    assert outcome.actions == (
        DeleteMachine("llm", 1, "llm-a1", A),
        CreateMachine("llm", 2, "llm-a2", A, deadline=DEADLINE),
    )
    w.handle(ZoneWokeUp("wake-a", w.clock.now(), A, "p", "t1v-n-2-w-0"))
    assert w.provider.count("create") == 1 and w.provider.live("llm") == ["llm-a2"]


def test_a_sweep_replaces_a_machine_that_vanished_without_an_event() -> None:
    w = running()
    w.provider.vanish("llm-a1")
    w.handle(SweepTicked("tick", w.clock.now()))
    job = w.store.job("llm")
    assert job.attempts[0].end_reason == "lost" and job.counters.preemptions == 1
    assert w.provider.live("llm") == ["llm-a2"]


def test_a_sweep_deletes_orphans_and_leaves_healthy_jobs_alone() -> None:
    w = running()
    w.handle(preemption(w))
    w.provider.machines["llm-a1"] = replace(w.provider.machines["llm-a2"], name="llm-a1")  # a delete that did not stick
    w.provider.calls.clear()
    generation = w.store.load("llm")[1]
    w.handle(SweepTicked("tick-1", w.clock.now()))
    assert w.provider.calls == [("delete", "llm-a1", A)]
    w.provider.calls.clear()
    w.handle(SweepTicked("tick-2", w.clock.now()))
    assert w.provider.calls == []
    assert w.store.load("llm")[1] > generation


def test_a_sweep_expires_a_job_at_its_ttl_and_cleans_up_after_terminal_jobs() -> None:
    w = running()
    w.clock.t = w.store.job("llm").deadline
    w.handle(SweepTicked("tick-ttl", w.clock.now()))
    assert w.status() is Status.EXPIRED and w.provider.machines == {}
    w.provider.machines["llm-a1"] = Machine("llm-a1", A, MachineState.READY, {"respawn-job": "llm"})
    w.handle(SweepTicked("tick-after", w.clock.now()))
    assert w.provider.machines == {} and w.status() is Status.EXPIRED


def test_a_stuck_creation_moves_to_the_next_zone() -> None:
    w = world()
    w.provider.set_state("llm-a1", MachineState.CREATING)
    w.clock.advance(POLICY.stuck_creating_s + 1)
    w.handle(SweepTicked("tick", w.clock.now()))
    assert w.provider.live("llm") == ["llm-a2"] and w.provider.machines["llm-a2"].zone == B


def test_one_json_line_per_handled_event_without_env_values(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="respawn")
    w = world(env=(("WANDB_API_KEY", "s3cr3t-value"),), args=("--token=t0ps3cret",))
    w.handle(preemption(w))
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "respawn.service"]
    assert [(line["event"], line["result"], line["job_id"]) for line in lines] == [
        ("job_submitted", "applied", "llm"),
        ("machine_preempted", "applied", "llm"),
    ]
    assert lines[1]["actions"] == [
        {"kind": "delete", "job_id": "llm", "attempt": 1, "machine": "llm-a1", "zone": A},
        {
            "kind": "create",
            "job_id": "llm",
            "attempt": 2,
            "machine": "llm-a2",
            "zone": A,
            "deadline": DEADLINE,
            "tier": 0,
        },
    ]
    assert "s3cr3t" not in caplog.text and "t0ps3cret" not in caplog.text


# -- the record cache: two function instances on one store ---------------------------------------------------------


def test_a_stale_cached_record_never_drops_an_event() -> None:
    """Instance A cached attempt 1; instance B moved the job to attempt 2; A still applies attempt 2's `started`."""
    w = running()
    other = Service(w.store, {"tpu": w.provider}, w.clock, POLICY)
    other.handle(preemption(w))  # B: attempt 1 preempted, attempt 2 created
    assert w.store.job("llm").current.n == 2
    outcome = w.handle(TrainerStarted("started-2", T0 + 200, "llm", 2))  # A decides on a fresh read, not its cache
    assert outcome.result == "applied"
    job = w.store.job("llm")
    assert job.status is Status.RUNNING and job.current.n == 2 and job.current.started_at is not None


def test_a_stale_cached_record_loses_its_write_and_decides_again() -> None:
    w = running()
    other = Service(w.store, {"tpu": w.provider}, w.clock, POLICY)
    other.handle(CheckpointSaved("ckpt-1", T0 + 150, "llm", 1, 40))  # B writes: A's cached generation is now old
    w.handle(CheckpointSaved("ckpt-2", T0 + 160, "llm", 1, 50))  # A's write conflicts, reloads, applies
    job = w.store.job("llm")
    assert job.current.last_step == 50 and {"ckpt-1", "ckpt-2"} <= set(job.seen_events)


def test_the_cache_saves_the_read_of_an_event_that_writes() -> None:
    w = running()
    loads = w.store.loads
    w.handle(CheckpointSaved("ckpt-1", T0 + 150, "llm", 1, 40))
    assert w.store.loads == loads  # the cached generation was current: the compare-and-set proved it


def test_a_new_job_is_written_create_only_without_a_read_and_a_known_one_is_read_after_the_conflict() -> None:
    w = world()  # submits "llm"
    assert w.store.loads == 0 and [c[0] for c in w.provider.calls] == ["create"]
    other = Service(w.store, {"tpu": w.provider}, w.clock, POLICY)  # an instance that never saw "llm"
    assert other.handle(JobSubmitted("submit-1", T0 + 1, spec())).result == "duplicate"
    assert w.store.loads == 1 and [c[0] for c in w.provider.calls] == ["create"]
    assert w.status() is Status.PROVISIONING


def test_a_tpu_worker_event_reads_only_the_records_of_machines_the_api_shows_dead() -> None:
    w = running()
    for i in range(5):
        w.handle(JobSubmitted(f"submit-other-{i}", w.clock.now(), spec(job_id=f"other-{i}")))
    w.provider.set_state("llm-a1", MachineState.PREEMPTED)
    loads = w.store.loads
    outcome = w.handle(ZoneWokeUp("wake-a", w.clock.now(), A, "p", "t1v-n-2-w-0"))
    assert outcome.job_ids == ("llm",) and w.store.loads - loads == 1


# -- slices: N worker VMs, one node ----------------------------------------------------------------------------------

SLICE = TpuMachine("v5litepod-16", "v2-alpha-tpuv5-lite")  # 4 worker VMs


def running_slice() -> World:
    w = world(machine=SLICE)
    w.handle(TrainerStarted("started-1", T0, "llm", 1))
    w.clock.advance(100)
    w.provider.calls.clear()
    return w


@pytest.mark.parametrize("order", range(8))
def test_every_workers_preemption_event_in_any_order_and_twice_gives_one_delete_and_one_create(order: int) -> None:
    w = running_slice()
    w.provider.set_state("llm-a1", MachineState.PREEMPTED)
    events = [ZoneWokeUp(f"wake-w{i}", w.clock.now(), A, "p", f"t1v-n-9f3a-w-{i}") for i in range(4)] * 2
    random.Random(order).shuffle(events)
    for event in events:
        w.handle(event)
    assert w.provider.calls == [("delete", "llm-a1", A), ("create", "llm-a2", A)]
    job = w.store.job("llm")
    assert job.counters.preemptions == 1 and job.status is Status.RECOVERING


def test_failed_entries_from_every_worker_count_one_failure_and_read_the_node_once() -> None:
    w = running_slice()
    reads = []
    get = w.provider.get
    w.provider.get = lambda name, zone, spec=None: reads.append(name) or get(name, zone, spec)  # type: ignore[method-assign]
    for i in (2, 0, 3, 1, 2):
        w.handle(TrainerFailed(f"failed-w{i}", w.clock.now(), "llm", 1, "the trainer exited with code 1", i))
    job = w.store.job("llm")
    assert (job.counters.failures, job.counters.preemptions) == (1, 0)
    assert job.attempts[0].end_reason == "failed" and job.reason.startswith("trainer failed on llm-a1 worker 2:")
    assert w.provider.calls == [("delete", "llm-a1", A), ("create", "llm-a2", A)]
    assert reads == ["llm-a1"]  # the other workers' entries are about an attempt that is over


def test_a_host_error_on_one_worker_is_a_loss_even_when_its_peers_failed_entries_come_first() -> None:
    w = running_slice()
    w.provider.set_state("llm-a1", MachineState.TERMINATED)  # worker 3's VM died; the API shows the node so
    for i in (0, 1, 2):  # their collectives broke: their startup scripts report `failed`
        w.handle(TrainerFailed(f"failed-w{i}", w.clock.now(), "llm", 1, "the trainer exited with code 1", i))
    w.handle(ZoneWokeUp("host-error-w3", w.clock.now(), A, "p", "t1v-n-9f3a-w-3", "hostError"))
    job = w.store.job("llm")
    assert (job.counters.failures, job.counters.preemptions) == (0, 1)
    assert w.provider.calls == [("delete", "llm-a1", A), ("create", "llm-a2", A)]


def test_a_failed_entry_waits_for_redelivery_when_the_node_cannot_be_read() -> None:
    w = running_slice()
    w.provider.fail_next("get", TransientError("503 backend error"))
    event = TrainerFailed("failed-w1", w.clock.now(), "llm", 1, "the trainer exited with code 1", 1)
    with pytest.raises(Retryable):
        w.handle(event)
    assert w.provider.calls == [] and w.store.job("llm").status is Status.RUNNING
    assert w.handle(event).result == "applied" and w.store.job("llm").counters.failures == 1


def test_a_sweep_finds_a_hung_slice_and_replaces_it_as_a_failure() -> None:
    w = running_slice()
    w.handle(TrainerProgressed("progress-1", T0 + 60, "llm", 1, 40))
    w.clock.t = T0 + 60 + 1800  # exactly the default hang timeout after the last progress entry: not yet
    assert w.handle(SweepTicked("tick-1", w.clock.now())).result == "ignored"
    w.clock.advance(5)
    w.handle(SweepTicked("tick-2", w.clock.now()))
    job = w.store.job("llm")
    assert job.attempts[0].end_reason == "hung" and job.counters.failures == 1
    assert job.reason == "hung: no training progress for 1805s on llm-a1; retrying"
    assert w.provider.calls == [("delete", "llm-a1", A), ("create", "llm-a2", A)]
