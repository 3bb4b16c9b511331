"""Acceptance: the submit path through the Pub/Sub emulator, duplicate and stale deliveries, crash repair.

Everything real except the cloud itself: google-cloud-storage on fake-gcs-server,
the TPU/Compute client libraries (transport="rest") on the local REST server,
functions-framework, and the official Pub/Sub emulator pushing into it.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes import Crash, CrashingProvider, CrashingStore, CrashPlan, FakeClock
from google.api_core import exceptions
from google.cloud import pubsub_v1

from localcloud.apis.cloudapi import CloudApiServer
from localcloud.cloud import TRAINER_IMAGES as LOCAL_IMAGES
from localcloud.services.emulators import PubSubEmulator, start_group, stop_group, wait_http
from localcloud.services.functions import functions_framework_argv
from respawn import parsing
from respawn.adapters.compute import GcpComputeProvider
from respawn.adapters.gcs_store import GcsJobStore
from respawn.adapters.tpu import GcpTpuProvider
from respawn.bootstrap import service_from_env
from respawn.deployment import IMAGES
from respawn.events import Event, SweepTicked
from respawn.jobs import Job, Status
from respawn.policy import Policy
from respawn.service import Outcome, Retryable, Service, ServiceSettings
from respawn_trainer.slice_env import free_port

pytestmark = pytest.mark.emulator

DATA = Path(__file__).resolve().parents[1] / "data"
PROJECT = "ml-research-4821"
A, B = "us-central1-a", "us-west4-a"


def job_message(job_id: str, kind: str = "gpu", zones: tuple[str, ...] = (A, B)) -> dict[str, Any]:
    machine: dict[str, Any] = (
        {"kind": "gpu", "machine_type": "g2-standard-8", "accelerator_type": "nvidia-l4", "accelerator_count": 1}
        if kind == "gpu"
        else {"kind": "tpu", "accelerator_type": "v5litepod-8", "runtime_version": "v2-alpha-tpuv5-lite"}
    )
    return {
        "action": "submit",
        "job_id": job_id,
        "machine": machine,
        "zones": list(zones),
        "image": "us-docker.pkg.dev/ml-research-4821/respawn/trainer:1",
        "args": ["--steps=100"],
        "checkpoint_uri": f"gs://ml-research-4821-ckpt/runs/{job_id}",
    }


def now_rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1e6) % 1_000_000:06d}Z"


def captured(name: str) -> dict[str, Any]:
    entry: dict[str, Any] = json.loads((DATA / name).read_text())
    entry["timestamp"] = entry["receiveTimestamp"] = now_rfc3339()
    entry["insertId"] = uuid.uuid4().hex[:14]
    return entry


def preempted_entry(machine: str, zone: str) -> dict[str, Any]:
    """The compute.instances.preempted system event (tests/data) for `machine`."""
    entry = captured("logentry_gce_preempted.json")
    entry["protoPayload"]["resourceName"] = f"projects/{PROJECT}/zones/{zone}/instances/{machine}"
    entry["resource"]["labels"]["zone"] = zone
    return entry


def tpu_worker_entry(zone: str) -> dict[str, Any]:
    entry = captured("logentry_tpu_worker_preempted.json")
    entry["protoPayload"]["resourceName"] = f"projects/{PROJECT}/zones/{zone}/instances/t1v-n-0a1b2c3d-w-0"
    entry["resource"]["labels"]["zone"] = zone
    return entry


def trainer_entry(event: str, job_id: str, attempt: int, **payload: Any) -> dict[str, Any]:
    entry = captured(f"logentry_trainer_{event}.json")
    entry["jsonPayload"] = {"event": event, "job_id": job_id, "attempt": attempt, "step": 0, **payload}
    entry["labels"] = {"respawn-job": job_id, "respawn-attempt": str(attempt)}
    return entry


def as_event(body: dict[str, Any], topic: str = "respawn-events") -> Event:
    """What the entry point makes of one Pub/Sub delivery of `body`."""
    msg = parsing.PubSubMessage(json.dumps(body).encode(), {}, uuid.uuid4().hex, time.time())
    return parsing.job_event(msg) if topic == "respawn-jobs" else parsing.events_event(msg)


def redelivered(service: Service, event: Event, tries: int = 50) -> Outcome:
    """Pub/Sub redelivers a message whose handler raised Retryable; do the same, a little later."""
    for _ in range(tries):
        try:
            return service.handle(event)
        except Retryable:
            time.sleep(0.05)
    raise AssertionError(f"still Retryable after {tries} deliveries")


def machine_calls(cloud: CloudApiServer, job_id: str, since: int = 0) -> list[tuple[str, str]]:
    return [
        (c.verb, c.name) for c in cloud.calls[since:] if c.verb in ("create", "delete") and c.name.startswith(job_id)
    ]


def live_machines(cloud: CloudApiServer, job_id: str) -> list[str]:
    return sorted(m.name for m in cloud.machines() if m.name.startswith(f"{job_id}-a"))


@pytest.fixture
def cloud(bucket: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[CloudApiServer]:
    """The local TPU/Compute REST server; the environment points service_from_env() at it and at the bucket."""
    with CloudApiServer() as server:
        for name, value in {
            "RESPAWN_PROJECT": PROJECT,
            "RESPAWN_STATE_BUCKET": bucket,
            "RESPAWN_TPU_ENDPOINT": server.url,
            "RESPAWN_COMPUTE_ENDPOINT": server.url,
        }.items():
            monkeypatch.setenv(name, value)
        yield server


# -- (a) the whole submit path through the official Pub/Sub emulator ------------------------------------------------


@pytest.mark.slow
def test_submit_through_the_pubsub_emulator_push_subscription(
    pubsub_emulator: PubSubEmulator, cloud: CloudApiServer, bucket: str
) -> None:
    project = pubsub_emulator.project
    port = free_port()
    server = start_group(
        functions_framework_argv("on_job_message", port),
        env={**os.environ, "RESPAWN_PROJECT": PROJECT, IMAGES: json.dumps(LOCAL_IMAGES)},  # as the local cloud's
        cwd=str(Path(__file__).resolve().parents[2] / "functions"),
    )
    publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    topic = publisher.topic_path(project, "respawn-jobs")
    subscription = subscriber.subscription_path(project, f"on-job-message-{uuid.uuid4().hex[:8]}")
    try:
        wait_http(f"http://127.0.0.1:{port}/", timeout=60, proc=server)
        with contextlib.suppress(exceptions.AlreadyExists):
            publisher.create_topic(name=topic)
        push = pubsub_v1.types.PushConfig(
            push_endpoint=f"http://127.0.0.1:{port}/projects/{project}/topics/respawn-jobs"
        )
        subscriber.create_subscription(name=subscription, topic=topic, push_config=push, ack_deadline_seconds=30)

        job_id = f"push-{uuid.uuid4().hex[:6]}"
        message = job_message(job_id)  # a GPU job
        del message["image"]  # it runs the deployment's trainer image of its kind, trainer-cuda
        publisher.publish(topic, json.dumps(message).encode()).result(timeout=30)

        store, job = GcsJobStore(bucket), None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            job, _ = store.load(job_id)
            if machine_calls(cloud, job_id) and job is not None and not job.pending:
                break
            time.sleep(0.2)
        assert machine_calls(cloud, job_id) == [("create", f"{job_id}-a1")]
        assert job is not None
        assert job.status == Status.PROVISIONING
        assert live_machines(cloud, job_id) == [f"{job_id}-a1"]
        assert job.spec.image == LOCAL_IMAGES["gpu"] == "us-docker.pkg.dev/respawn-local/respawn/trainer-cuda:latest"
        (machine,) = [m for m in cloud.machines() if m.name == f"{job_id}-a1"]
        assert machine.metadata["respawn-image"] == LOCAL_IMAGES["gpu"]  # the image its startup script runs
    finally:
        subscriber.delete_subscription(subscription=subscription)
        stop_group(server)


# -- (b) the same preemption delivered 5 times concurrently ---------------------------------------------------------


def deliver_concurrently(event: Event, times: int = 5) -> list[str]:
    service = service_from_env()
    barrier = threading.Barrier(times)
    results: list[str] = []
    errors: list[BaseException] = []

    def deliver() -> None:
        barrier.wait()
        try:
            results.append(redelivered(service, event).result)
        except BaseException as e:  # surfaced below, with the thread's error
            errors.append(e)

    threads = [threading.Thread(target=deliver) for _ in range(times)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    return results


def test_a_gce_preemption_delivered_five_times_concurrently_acts_once(cloud: CloudApiServer, bucket: str) -> None:
    job_id = "dup-gpu"
    service_from_env().handle(as_event(job_message(job_id), "respawn-jobs"))
    service_from_env().handle(as_event(trainer_entry("started", job_id, 1)))
    cloud.preempt(f"{job_id}-a1")
    since = len(cloud.calls)

    results = deliver_concurrently(as_event(preempted_entry(f"{job_id}-a1", A)))

    assert machine_calls(cloud, job_id, since) == [("delete", f"{job_id}-a1"), ("create", f"{job_id}-a2")]
    assert results.count("applied") == 1
    assert live_machines(cloud, job_id) == [f"{job_id}-a2"]
    job, _ = GcsJobStore(bucket).load(job_id)
    assert job is not None
    assert (job.status, job.counters.preemptions, job.pending) == (Status.RECOVERING, 1, ())


def test_a_tpu_worker_wake_up_delivered_five_times_concurrently_acts_once(cloud: CloudApiServer, bucket: str) -> None:
    job_id = "dup-tpu"
    service_from_env().handle(as_event(job_message(job_id, "tpu", zones=(B, A)), "respawn-jobs"))
    service_from_env().handle(as_event(trainer_entry("started", job_id, 1)))
    cloud.preempt(f"{job_id}-a1")
    since = len(cloud.calls)

    deliver_concurrently(as_event(tpu_worker_entry(B)))

    assert machine_calls(cloud, job_id, since) == [("delete", f"{job_id}-a1"), ("create", f"{job_id}-a2")]
    assert live_machines(cloud, job_id) == [f"{job_id}-a2"]
    job, _ = GcsJobStore(bucket).load(job_id)
    assert job is not None
    assert (job.status, job.counters.preemptions, job.pending) == (Status.RECOVERING, 1, ())


# -- (c) a crash between any two steps, repaired by redelivery or the sweep -----------------------------------------


def crash_rig(bucket: str, cloud: CloudApiServer) -> tuple[Service, CrashPlan, FakeClock]:
    """The real store and provider, each mutating call counted by a CrashPlan (armed later), and a clock we move."""
    plan, clock = CrashPlan(at=0), FakeClock(time.time())
    store = CrashingStore(GcsJobStore(bucket), plan)
    provider = CrashingProvider(GcpComputeProvider(PROJECT, endpoint=cloud.url), plan)
    tpu = GcpTpuProvider(PROJECT, endpoint=cloud.url)
    return Service(store, {"compute": provider, "tpu": tpu}, clock, Policy()), plan, clock


def run_scenario(
    service: Service, plan: CrashPlan, cloud: CloudApiServer, job_id: str, scenario: str
) -> tuple[Event, int]:
    """Bring the job to where `scenario` starts. Returns the event to crash on and the mutating calls made so far."""
    submit = as_event(job_message(job_id), "respawn-jobs")
    if scenario == "submit":
        return submit, plan.seen
    service.handle(submit)
    service.handle(as_event(trainer_entry("started", job_id, 1)))
    cloud.preempt(f"{job_id}-a1")
    return as_event(preempted_entry(f"{job_id}-a1", A)), plan.seen


EXPECTED = {  # scenario -> (status, the one live machine, machines that must be gone)
    "submit": (Status.PROVISIONING, "a1", ()),
    "preempt": (Status.RECOVERING, "a2", ("a1",)),
}


def assert_repaired(cloud: CloudApiServer, store: GcsJobStore, job_id: str, scenario: str, where: str) -> Job:
    status, live, gone = EXPECTED[scenario]
    job, _ = store.load(job_id)
    assert job is not None, where
    assert (job.status, job.pending) == (status, ()), where
    assert live_machines(cloud, job_id) == [f"{job_id}-{live}"], where
    assert all(cloud.machine(f"{job_id}-{g}") is None for g in gone), where
    return job


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["submit", "preempt"])
@pytest.mark.parametrize("repair", ["redelivery", "sweep"])
def test_a_crash_at_every_step_is_repaired_without_a_duplicate_machine(
    cloud: CloudApiServer, bucket: str, scenario: str, repair: str
) -> None:
    store = GcsJobStore(bucket)
    # Count the mutating calls of an undisturbed run: those are the steps to crash at.
    service, plan, _ = crash_rig(bucket, cloud)
    event, before = run_scenario(service, plan, cloud, f"count-{scenario}-{repair[0]}", scenario)
    service.handle(event)
    steps = plan.log[before:]
    assert len(steps) >= 3, steps  # persist intent, act, clear intent at least

    for at in range(1, len(steps) + 1):
        for crash_before in (True, False):
            job_id = f"crash-{scenario[0]}{repair[0]}-{at}{'b' if crash_before else 'a'}"
            where = f"{scenario}: crash {'before' if crash_before else 'after'} step {at} ({steps[at - 1]}), {repair}"
            service, plan, clock = crash_rig(bucket, cloud)
            event, seen = run_scenario(service, plan, cloud, job_id, scenario)
            plan.at, plan.before = seen + at, crash_before
            with pytest.raises(Crash):
                service.handle(event)
            clock.advance(ServiceSettings().lease_s + 1)  # the dead handler's lease runs out
            since = len(cloud.calls)
            sweep = SweepTicked(f"tick-{job_id}", clock.now())
            first, second = (sweep, event) if repair == "sweep" else (event, sweep)
            redelivered(service, first)
            intent_saved = at > 1 or not crash_before
            if repair == "redelivery" or scenario == "preempt" or intent_saved:
                assert_repaired(cloud, store, job_id, scenario, where + " (first repair)")
            redelivered(service, second)
            assert_repaired(cloud, store, job_id, scenario, where)
            created = [n for v, n in machine_calls(cloud, job_id) if v == "create"]
            assert len(set(created)) == {"submit": 1, "preempt": 2}[scenario], where
            assert all(v == "create" or n.endswith("-a1") for v, n in machine_calls(cloud, job_id, since)), where


# -- (d) an event for attempt N after N+1 started -------------------------------------------------------------------


def test_events_for_an_older_attempt_change_nothing(cloud: CloudApiServer, bucket: str) -> None:
    job_id = "stale-gpu"
    service, store = service_from_env(), GcsJobStore(bucket)
    service.handle(as_event(job_message(job_id), "respawn-jobs"))
    service.handle(as_event(trainer_entry("started", job_id, 1)))
    cloud.preempt(f"{job_id}-a1")
    service.handle(as_event(preempted_entry(f"{job_id}-a1", A)))
    service.handle(as_event(trainer_entry("started", job_id, 2, restored_step=40)))
    before, generation = store.load(job_id)
    assert before is not None
    assert (before.status, before.current.n if before.current else 0) == (Status.RUNNING, 2)
    since = len(cloud.calls)

    late = [
        preempted_entry(f"{job_id}-a1", A),  # a second copy of the old preemption, a new insertId
        trainer_entry("checkpoint", job_id, 1, step=50, blocking_s=0.1, total_s=1.0),
        trainer_entry("failed", job_id, 1, error="RuntimeError: boom"),
        trainer_entry("completed", job_id, 1, step=60, final_loss=1.0),
    ]
    results = [service.handle(as_event(entry)).result for entry in late]

    assert results == ["stale"] * len(late)
    assert store.load(job_id) == (before, generation)  # not even rewritten
    assert machine_calls(cloud, job_id, since) == []
    assert live_machines(cloud, job_id) == [f"{job_id}-a2"]
