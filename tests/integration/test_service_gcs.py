"""The service with the real GcsJobStore on fake-gcs-server: concurrent duplicate deliveries and crash repair."""

from __future__ import annotations

import pytest
from fakes import Crash, CrashingProvider, CrashingStore, CrashPlan, FakeClock, FakeProvider, deliver_concurrently

from respawn.adapters.gcs_store import GcsJobStore
from respawn.events import JobSubmitted, MachinePreempted, SweepTicked, TrainerStarted
from respawn.jobs import JobSpec, MachineState, Status, TpuMachine
from respawn.policy import Policy
from respawn.service import Service, ServiceSettings

pytestmark = pytest.mark.emulator

A = "us-central1-a"
T0 = 1_000_000.0
POLICY = Policy()
SETTINGS = ServiceSettings()


def running(bucket: str) -> tuple[Service, GcsJobStore, FakeProvider, FakeClock]:
    store, provider, clock = GcsJobStore(bucket), FakeProvider(), FakeClock(T0)
    service = Service(store, {"tpu": provider}, clock, POLICY)
    spec = JobSpec(
        job_id="llm",
        machine=TpuMachine("v5litepod-8", "v2-alpha-tpuv5-lite"),
        zones=(A, "us-west4-a"),
        image="us-docker.pkg.dev/p/r/trainer:1",
        checkpoint_uri="gs://b/runs/llm",
    )
    service.handle(JobSubmitted("submit-1", T0, spec))
    service.handle(TrainerStarted("started-1", T0, "llm", 1))
    clock.advance(100)
    provider.calls.clear()
    provider.set_state("llm-a1", MachineState.PREEMPTED)
    return service, store, provider, clock


def test_the_same_preemption_delivered_five_times_concurrently_acts_once(bucket: str) -> None:
    service, store, provider, clock = running(bucket)
    event = MachinePreempted("preempted-1", clock.now(), "llm", 1, "llm-a1", A, "p")
    results = deliver_concurrently([service.handle] * 5, event)
    assert sorted(results) == ["applied"] + ["duplicate"] * 4
    assert provider.calls == [("delete", "llm-a1", A), ("create", "llm-a2", A)]
    job, _ = store.load("llm")
    assert job is not None and job.status is Status.RECOVERING and job.pending == ()


def test_a_crash_after_persisting_intent_is_repaired_by_the_sweep(bucket: str) -> None:
    service, store, provider, clock = running(bucket)
    event = MachinePreempted("preempted-1", clock.now(), "llm", 1, "llm-a1", A, "p")
    plan = CrashPlan(at=2)  # the intent is saved; the handler dies before deleting
    crashing = Service(CrashingStore(store, plan), {"tpu": CrashingProvider(provider, plan)}, clock, POLICY)
    with pytest.raises(Crash):
        crashing.handle(event)
    assert provider.calls == []
    clock.advance(SETTINGS.lease_s)
    service.handle(SweepTicked("tick-1", clock.now()))
    assert provider.calls == [("delete", "llm-a1", A), ("create", "llm-a2", A)]
    assert service.handle(event).result == "duplicate"
    assert provider.live("llm") == ["llm-a2"]
