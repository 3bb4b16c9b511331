"""The service and the preemption history: observations drained under the lease (once, whatever crashes), the
history read for placement through a 60 s cache, and a history that cannot be read or written never failing a job."""

from __future__ import annotations

import contextlib

import pytest
from fakes import (
    Crash,
    CrashingHistoryStore,
    CrashingProvider,
    CrashingStore,
    CrashPlan,
    FakeClock,
    FakeProvider,
    InMemoryHistoryStore,
    InMemoryJobStore,
)

from respawn.events import Event, JobSubmitted, MachinePreempted, SweepTicked, TrainerProgressed, TrainerStarted
from respawn.jobs import JobSpec, MachineState, Status, TpuMachine
from respawn.outlook import HOUR, History, Key, Observation
from respawn.ports import PermanentError, TransientError
from respawn.service import Retryable, Service, ServiceSettings

A, B = "us-central1-a", "us-west4-a"
TPU = "v5litepod-8"
T0 = 1_000_000.0
LEASE_S = ServiceSettings().lease_s


def spec() -> JobSpec:
    return JobSpec("llm", TpuMachine(TPU, "v2-alpha-tpuv5-lite"), (A, B), "img", "gs://b/runs/llm")


class World:
    def __init__(self, history: History | None = None) -> None:
        self.store, self.provider, self.clock = InMemoryJobStore(), FakeProvider(), FakeClock(T0)
        self.history = InMemoryHistoryStore(history)
        self.service = Service(self.store, {"tpu": self.provider}, self.clock, history=self.history)

    def handle(self, event: Event, service: Service | None = None) -> None:
        (service or self.service).handle(event)

    def crashing(self, plan: CrashPlan) -> Service:
        return Service(
            CrashingStore(self.store, plan),
            {"tpu": CrashingProvider(self.provider, plan)},
            self.clock,
            history=CrashingHistoryStore(self.history, plan),
        )


def running(history: History | None = None) -> World:
    w = World(history)
    w.handle(JobSubmitted("submit-1", T0, spec()))
    w.handle(TrainerStarted("started-1", T0, "llm", 1))
    w.clock.advance(100)
    return w


def preemption(w: World, zone: str) -> MachinePreempted:
    w.provider.set_state("llm-a1", MachineState.PREEMPTED)
    return MachinePreempted("preempted-1", w.clock.now(), "llm", 1, "llm-a1", zone, "p")


def counted(w: World, zone: str) -> tuple[float, float]:
    """The zone's machine-seconds and interruptions as of its newest observation (so undecayed here)."""
    seen = w.history.history.exposures[Key(zone, TPU, "spot")]
    return round(seen.seconds, 6), round(seen.interruptions, 6)


def test_a_preempted_attempt_is_counted_in_the_history_and_cleared_from_the_record() -> None:
    w = running()
    w.handle(preemption(w, A))
    job = w.store.job("llm")
    assert job.observations == () and job.pending_lease_until is None
    assert counted(w, A) == (100.0, 1.0) and w.history.history.seen == ("llm/1",)


def test_placement_reads_the_history_first_creates_go_where_spot_lasts() -> None:
    lasting = History().observe(Key(B, TPU, "spot"), T0, seconds=100 * HOUR, interruptions=0)
    w = World(lasting.observe(Key(A, TPU, "spot"), T0, seconds=HOUR, interruptions=5))
    w.handle(JobSubmitted("submit-1", T0, spec()))
    job = w.store.job("llm")
    assert job.attempts[0].zone == B and job.attempts[0].zone_reason.startswith(f"{B}: MTBI")
    assert w.provider.machines["llm-a1"].zone == B


def test_the_history_is_read_at_most_once_a_minute_and_not_for_progress() -> None:
    w = running()
    loads = w.history.loads
    for i in range(5):
        w.handle(TrainerProgressed(f"progress-{i}", w.clock.now(), "llm", 1, i))
    assert w.history.loads == loads  # progress places nothing: no read
    w.clock.advance(61)
    w.handle(SweepTicked("sweep-1", w.clock.now()))
    w.handle(SweepTicked("sweep-2", w.clock.now()))
    assert w.history.loads == loads + 1


def test_an_unreadable_history_ranks_on_no_data_and_says_so_without_failing_the_event() -> None:
    w = World()
    w.history.errors.append(PermanentError("403 storage.objects.get denied"))
    w.handle(JobSubmitted("submit-1", T0, spec()))
    job = w.store.job("llm")
    assert job.status is Status.PROVISIONING and job.attempts[0].zone == A
    assert (
        "preemption history unreadable (PermanentError: 403 storage.objects.get denied)" in job.attempts[0].zone_reason
    )


def test_a_transient_history_failure_keeps_the_observations_for_the_next_handler() -> None:
    w = running()
    event = preemption(w, A)
    w.history.errors.extend([TransientError("503"), TransientError("503")])  # placement's read, then the drain's
    w.clock.advance(61)  # the cached history is stale: both read it
    with pytest.raises(Retryable):
        w.handle(event)
    job = w.store.job("llm")
    assert len(job.observations) == 1 and w.provider.live("llm") == ["llm-a2"]
    w.handle(event)  # the redelivery takes the handed-back intent over
    assert w.store.job("llm").observations == () and counted(w, A)[1] == 1.0


def test_a_history_that_refuses_for_good_drops_the_observations_and_the_job_goes_on() -> None:
    w = running()
    event = preemption(w, A)
    w.history.errors.extend([PermanentError("403"), PermanentError("403")])
    w.clock.advance(61)
    w.handle(event)
    job = w.store.job("llm")
    assert job.observations == () and job.status is Status.RECOVERING and w.history.history.seen == ()


def test_conflicting_writers_of_the_history_each_count_their_own_once() -> None:
    w = running()
    w.history.conflicts = 2  # two other jobs wrote it in between
    w.handle(preemption(w, A))
    assert counted(w, A) == (100.0, 1.0)


# Every mutating call of handling a preemption: save (intent), delete, create, save history, save (cleared).
CALLS = 5


@pytest.mark.parametrize("before", [True, False], ids=["before", "after"])
@pytest.mark.parametrize("at", range(1, CALLS + 1))
def test_a_crash_at_any_call_counts_the_preemption_exactly_once(at: int, before: bool) -> None:
    w = running()
    event = preemption(w, A)
    plan = CrashPlan(at, before)
    with contextlib.suppress(Crash):
        w.handle(event, w.crashing(plan))
    assert plan.crashed, plan.log
    w.clock.advance(LEASE_S + 1)
    w.handle(event)  # redelivery after the lease: whatever intent is left is carried out
    w.handle(SweepTicked("sweep-1", w.clock.now()))
    job = w.store.job("llm")
    assert job.observations == () and w.provider.live("llm") == ["llm-a2"]
    # the attempt ran from T0 to its preemption: handled at T0 + 100, or on the redelivery when the crash came first
    ended = job.attempts[0].ended_at
    assert ended in (T0 + 100, T0 + 101 + LEASE_S)
    assert counted(w, A) == (ended - T0, 1.0) and w.history.history.seen == ("llm/1",)


def test_observations_in_any_order_and_repeated_give_the_same_history() -> None:
    first = Observation("a/1", Key(A, TPU, "spot"), 3600.0, 1, T0)
    second = Observation("b/1", Key(A, TPU, "spot"), 7200.0, 0, T0 + HOUR)
    one = History().record([first, second])
    other = History().record([second]).record([first, second, first])
    assert one.seen == ("a/1", "b/1") and other.seen == ("b/1", "a/1")
    a, b = one.exposure(first.key, T0 + 24 * HOUR), other.exposure(first.key, T0 + 24 * HOUR)
    assert (a.seconds, a.interruptions) == pytest.approx((b.seconds, b.interruptions))
    assert a.seconds == pytest.approx((3600 * 0.5 ** (1 / 72) + 7200) * 0.5 ** (23 / 72))


def test_advice_for_the_jobs_machines_joins_the_history_in_its_outlook() -> None:
    from respawn.outlook import Advice, ZoneAdvice

    asked: list[str] = []

    def advice(spec: JobSpec) -> dict[tuple[str, str], Advice]:
        asked.append(spec.job_id)
        return {(TPU, "spot"): Advice({B: ZoneAdvice(price_per_hour=0.01)}, T0, note="seeded figures")}

    store, provider, clock = InMemoryJobStore(), FakeProvider(), FakeClock(T0)
    service = Service(store, {"tpu": provider}, clock, history=InMemoryHistoryStore(), advice=advice)
    service.handle(JobSubmitted("submit-1", T0, spec()))
    service.handle(TrainerProgressed("progress-1", T0, "llm", 1, 5))  # places nothing: no advice asked
    placement = store.job("llm").attempts[0].zone_reason
    assert asked == ["llm"] and placement.startswith(f"{B}: MTBI") and "$0.01/h (advice)" in placement
    assert placement.endswith("; seeded figures")
