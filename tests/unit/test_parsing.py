"""Event parsing (SPEC 3.2): captured entries and envelopes -> typed events; garbage is ignored, never raised."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from cloudevents.http import CloudEvent
from hypothesis import given, settings
from hypothesis import strategies as st

from respawn.events import (
    EXIT_CODE,
    CancelRequested,
    CheckpointSaved,
    Event,
    Ignored,
    JobRejected,
    JobSubmitted,
    MachineNoticed,
    MachinePreempted,
    MachinesObserved,
    SweepTicked,
    TrainerCompleted,
    TrainerFailed,
    TrainerProgressed,
    TrainerReady,
    TrainerStarted,
    ZoneWokeUp,
)
from respawn.jobs import MachineState, TpuMachine, parse_instance_name
from respawn.parsing import (
    PubSubMessage,
    event_from_file,
    event_to_json,
    events_event,
    job_event,
    log_entry_event,
    message_from_cloudevent,
    message_from_push,
    rfc3339,
)
from respawn_ops.logfilter import sink_filter

DATA = Path(__file__).parent.parent / "data"
P = "ml-research-4821"
T_PREEMPT = 1741944413.104627  # 2025-03-14T09:26:53.104627Z


def entry(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DATA / name).read_text())
    return loaded


def text(name: str) -> str:
    return (DATA / name).read_text()


def b64(obj: Any) -> str:
    raw = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return base64.b64encode(raw).decode()


def push(data: Any, message_id: str = "42", **message: Any) -> dict[str, Any]:
    return {"message": {"data": b64(data), "messageId": message_id, **message}, "subscription": "projects/p/s/x"}


# ---------------------------------------------------------------------------- captured LogEntries

COMPLETED_SPLIT = {"startup_s": 41.7, "restore_s": 6.2, "productive_s": 3318.4, "checkpoint_s": 4.9, "wasted_s": 12.6,
                   "total_s": 3383.8}  # fmt: skip
EXPECTED: dict[str, Event] = {
    "logentry_gce_preempted.json": MachinePreempted(
        "log:-x3q9v1e2k4fb", T_PREEMPT, "llm-small-001", 2, "llm-small-001-a2", "us-central1-a", P, "preempted"
    ),
    "logentry_gce_preempted_ai_zone.json": MachinePreempted(
        "log:-ai1a7k2m9x4q",
        1742006467.551903,
        "llm-small-001",
        3,
        "llm-small-001-a3",
        "us-central1-ai1a",
        P,
        "preempted",
    ),
    "logentry_tpu_worker_preempted.json": ZoneWokeUp(
        "log:1m5ftq2e7c0jg", 1741950137.58319, "us-west4-a", P, "t1v-n-2f3e9a1b-w-0", "preempted"
    ),
    # the Cloud TPU API's record of Google terminating a node: it names the node, so it names the job and attempt
    "logentry_tpu_node_terminated.json": MachinePreempted(
        "log:tpu-1qv7c2e9xk4a",
        1741950136.904311,
        "gemma-tune-2",
        5,
        "gemma-tune-2-a5",
        "us-central2-b",
        P,
        "terminate: PREEMPTED",
    ),
    # Google's TPU maintenance example has no `resource` block (and so no project label) and no timestamp
    "logentry_tpu_worker_maintenance_no_resource.json": ZoneWokeUp(
        "log:sha256:9cf6ac5a0e438e46b3204fad36b12d70",
        1731643213.12055193,
        "europe-west4-b",
        "cloud-tpu-multipod-dev",
        "t1v-n-9472280f-w-0",
        "terminateOnHostMaintenance",
    ),
    "logentry_host_error.json": MachinePreempted(
        "log:-6mrd68di0ag", 1742075577.411466, "bert-ft-7", 1, "bert-ft-7-a1", "europe-west4-b", P, "hostError"
    ),
    "logentry_terminate_on_host_maintenance.json": MachinePreempted(
        "log:r8b2kfe1nqx6",
        1742098205.229841,
        "llm-small-001",
        3,
        "llm-small-001-a3",
        "us-central1-b",
        P,
        "terminateOnHostMaintenance",
    ),
    "logentry_trainer_started.json": TrainerStarted(
        "log:1c8xk2vf3n9q0a", 1741944588.771402, "llm-small-001", 3, restored_step=1200, startup_s=41.7
    ),
    "logentry_trainer_checkpoint.json": CheckpointSaved(
        "log:1c8xk2vf3n9q7d", 1741945272.038115, "llm-small-001", 3, 1400
    ),
    "logentry_trainer_completed.json": TrainerCompleted(
        "log:1c8xk2vf3nb1z4",
        1741947971.590273,
        "llm-small-001",
        3,
        20000,
        {
            "final_loss": 2.1432,
            "params_sha256": "9f2c4e71d0b8a35e6c1f27d94b0e8a6c3d5f1b29e7a04c86f3b2d19e5a7c0f48",
            "goodput": COMPLETED_SPLIT,
        },
        goodput=COMPLETED_SPLIT,
    ),
    "logentry_trainer_failed.json": TrainerFailed(
        "log:0x7hw4kf2m1p3s",
        1742074803.118462,
        "bert-ft-7",
        1,
        "FloatingPointError: loss is nan at step 350",
        goodput={
            "startup_s": 38.2,
            "restore_s": 0.0,
            "productive_s": 611.5,
            "checkpoint_s": 1.7,
            "wasted_s": 40.1,
            "total_s": 691.5,
        },
    ),
    "logentry_trainer_stopped.json": CheckpointSaved(
        "log:1m5ftq2e7c0k1",
        1741950159.904117,
        "gemma-tune-2",
        4,
        8812,
        {
            "startup_s": 35.0,
            "restore_s": 4.4,
            "productive_s": 1290.7,
            "checkpoint_s": 6.1,
            "wasted_s": 0.0,
            "total_s": 1336.2,
        },
        final=True,
    ),
    "logentry_trainer_notice.json": MachineNoticed("log:1x7kq3f2b9ab4", 1741950151.512774, "gemma-tune-2", 4, 0),
    "logentry_trainer_progress.json": TrainerProgressed(
        "log:1c8xk2vf3n9r2e", 1741945332.041877, "llm-small-001", 3, 1460
    ),
}
IGNORED: dict[str, str] = {
    "logentry_unrelated_vm.json": 'instance "gke-batch-spot-pool-5b909138-nr65" is not a respawn machine',
    "logentry_other_method.json": 'method "compute.instances.migrateOnHostMaintenance" is not a preemption or host',
    "logentry_tpu_upcoming_maintenance.json": 'method "compute.instances.upcomingMaintenance" is not a preemption',
    "logentry_activity_insert.json": 'log "cloudaudit.googleapis.com%2Factivity" is neither',
    "logentry_container_line.json": 'log "gcplogs-docker-driver" is neither',  # `respawn logs` reads it, not on_event
}


def approx_event(event: Event) -> Any:
    """Events compare field by field; times within a microsecond (float seconds since the epoch)."""
    d = event_to_json(event)
    if "time" in d:
        d["time"] = pytest.approx(d["time"], abs=1e-6)
    return d


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_captured_entry_gives_its_event(name: str) -> None:
    got = log_entry_event(entry(name))
    assert type(got) is type(EXPECTED[name])
    assert event_to_json(got) == approx_event(EXPECTED[name])


@pytest.mark.parametrize("name", sorted(IGNORED))
def test_captured_entry_is_ignored_with_a_reason(name: str) -> None:
    got = log_entry_event(entry(name))
    assert isinstance(got, Ignored) and IGNORED[name] in got.reason


def test_every_captured_entry_is_covered() -> None:
    assert {p.name for p in DATA.glob("logentry_*.json")} == set(EXPECTED) | set(IGNORED)


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("logentry_*.json")))
def test_sink_filter_and_parser_agree(name: str) -> None:
    """What the sink routes is exactly what the parser turns into an event (one source of truth: sink_filter.txt)."""
    routed = sink_filter().matches(entry(name))
    parsed = not isinstance(log_entry_event(entry(name)), Ignored)
    assert routed == parsed


def test_rfc3339_keeps_nanoseconds_and_offsets() -> None:
    assert rfc3339("2025-03-14T09:26:53.872291804Z") == pytest.approx(1741944413.872291804, abs=1e-6)
    assert rfc3339("2025-03-14T09:26:53Z") == 1741944413.0
    assert rfc3339("2025-03-14T10:26:53.5+01:00") == 1741944413.5
    for bad in ("2025-03-14", "2025-13-14T09:26:53Z", "yesterday", 17, None, "2025-03-14T09:26:53.1234567890Z"):
        assert rfc3339(bad) is None


# ---------------------------------------------------------------------------- LogEntry variations


def modified(name: str, **changes: Any) -> dict[str, Any]:
    """A captured entry with fields changed (`a__b=v` sets entry["a"]["b"]; None removes the field)."""
    e = entry(name)
    for path, value in changes.items():
        *parents, last = path.split("__")
        target = e
        for p in parents:
            target = target[p]
        if value is None:
            target.pop(last, None)
        else:
            target[last] = value
    return e


def preempted(**changes: Any) -> dict[str, Any]:
    return modified("logentry_gce_preempted.json", **changes)


def trainer(payload: dict[str, Any]) -> dict[str, Any]:
    e = entry("logentry_trainer_checkpoint.json")
    e["jsonPayload"] = payload
    return e


@pytest.mark.parametrize(
    ("changed", "reason"),
    [
        (preempted(protoPayload__methodName="compute.instances.stop"), 'method "compute.instances.stop"'),
        (preempted(protoPayload=None), "method null"),
        (preempted(protoPayload__resourceName="projects/p/global/instances/x"), "does not name an instance"),
        (preempted(protoPayload__resourceName="projects/p/zones/mars/instances/llm-a1"), 'zone "mars"'),
        (preempted(protoPayload__resourceName=f"projects/{P}/zones/us-central1-a/instances/llm-a0"), "not a respawn"),
        (preempted(protoPayload__resourceName=f"projects/{P}/zones/us-central1-a/instances/Llm-a1"), "not a respawn"),
        (preempted(timestamp=None, receiveTimestamp=None), "no valid timestamp"),
        (preempted(timestamp="soon", receiveTimestamp=None), "no valid timestamp"),
        (preempted(logName=None), "no logName"),
        (preempted(logName="projects/p/logs/syslog"), 'log "syslog" is neither'),
        (trainer({"event": "exploded", "job_id": "a", "attempt": 1}), 'trainer event "exploded"'),
        (trainer({"job_id": "a", "attempt": 1}), "trainer event null"),
        (trainer({"event": "started", "job_id": "A B", "attempt": 1}), 'job_id "A B"'),
        (trainer({"event": "started", "attempt": 1}), "job_id null"),
        (trainer({"event": "started", "job_id": "a", "attempt": 0}), "attempt 0"),
        (trainer({"event": "started", "job_id": "a", "attempt": "1"}), 'attempt "1"'),
        (trainer({"event": "started", "job_id": "a", "attempt": True}), "attempt true"),
        (trainer({"event": "started", "job_id": "a", "attempt": 1.5}), "attempt 1.5"),
        (trainer({"event": "checkpoint", "job_id": "a", "attempt": 1}), "checkpoint entry has no step"),
        (trainer({"event": "stopped", "job_id": "a", "attempt": 1}), "stopped entry has no step"),
        (trainer({"event": "progress", "job_id": "a", "attempt": 1}), "progress entry has no step"),
        (trainer({"event": "checkpoint", "job_id": "a", "attempt": 1, "step": -3}), "step -3"),
        (trainer({"event": "checkpoint", "job_id": "a", "attempt": 1, "step": "9"}), 'step "9"'),
        ({**entry("logentry_trainer_started.json"), "jsonPayload": None}, "no jsonPayload"),
        ({**entry("logentry_trainer_started.json"), "jsonPayload": ["started"]}, "no jsonPayload"),
    ],
)
def test_odd_entries_are_ignored_with_the_reason(changed: dict[str, Any], reason: str) -> None:
    got = log_entry_event(changed)
    assert isinstance(got, Ignored) and reason in got.reason


@pytest.mark.parametrize(("worker", "read"), [(3, 3), (3.0, 3), (None, None), (-1, None), ("2", None), (True, None)])
def test_a_notice_names_the_worker_vm_it_reached_when_it_says_which(worker: Any, read: int | None) -> None:
    """The shutdown script's `notice` entry: one per worker VM the notice reached (any worker of a slice)."""
    payload = {"event": "notice", "job_id": "llm", "attempt": 2, **({} if worker is None else {"worker": worker})}
    e = trainer(payload)
    assert log_entry_event(e) == MachineNoticed(
        f"log:{e['insertId']}", rfc3339(e["timestamp"]) or 0.0, "llm", 2, read
    ) and sink_filter().matches(e)


@pytest.mark.parametrize(("world", "read"), [(4, 4), (4.0, 4), (None, None), ("4", None)])
def test_a_slices_ready_entry_and_a_failure_name_the_world_they_were_told(world: Any, read: int | None) -> None:
    """A world of several slices (respawn.worlds): the startup script's `ready` on a replacement waiting to be let
    in, and a trainer's `failed` of an older world (the re-forming's, no failure of its slice), each with its world."""
    told = {} if world is None else {"world": world}
    e = trainer({"event": "ready", "job_id": "llm", "attempt": 5, "worker": 0, **told})
    assert log_entry_event(e) == TrainerReady(f"log:{e['insertId']}", rfc3339(e["timestamp"]) or 0.0, "llm", 5, read)
    assert sink_filter().matches(e)
    failed = log_entry_event(trainer({"event": "failed", "job_id": "llm", "attempt": 2, "error": "x", **told}))
    assert isinstance(failed, TrainerFailed) and failed.world == read


def test_only_a_stopped_entry_is_the_trainers_last_save() -> None:
    """`stopped` (saved on the notice, then the trainer exits) ends a drain; `checkpoint` does not."""
    saved = [
        log_entry_event(trainer({"event": kind, "job_id": "a", "attempt": 1, "step": 5}))
        for kind in ("checkpoint", "stopped")
    ]
    assert [(type(e).__name__, getattr(e, "final", None)) for e in saved] == [
        ("CheckpointSaved", False),
        ("CheckpointSaved", True),
    ]


def terminated(**changes: Any) -> dict[str, Any]:
    return modified("logentry_tpu_node_terminated.json", **changes)


def node(name: str, zone: str = "us-central2-b", collection: str = "locations") -> dict[str, Any]:
    return terminated(protoPayload__resourceName=f"projects/{P}/{collection}/{zone}/nodes/{name}")


ACTIVITY = f"projects/{P}/logs/cloudaudit.googleapis.com%2Factivity"


@pytest.mark.parametrize(
    ("changed", "cause"),
    [
        (terminated(), "terminate: PREEMPTED"),
        (terminated(logName=ACTIVITY), "terminate: PREEMPTED"),  # which audit log carries it is not documented
        (terminated(protoPayload__metadata__terminateReason="MAINTENANCE"), "terminate: MAINTENANCE"),  # any reason
        (terminated(protoPayload__metadata__terminateReason="a\nb"), "terminate: a\\nb"),  # kept on one line
        (terminated(protoPayload__metadata=None), "terminate"),  # no reason given
        (terminated(protoPayload__metadata__terminateReason=7), "terminate"),
        (terminated(resource=None), "terminate: PREEMPTED"),  # the resource is read only for its project
        (terminated(resource__type="tpu_node"), "terminate: PREEMPTED"),
        (
            terminated(
                protoPayload__resourceName=f"//tpu.googleapis.com/projects/{P}/locations/us-central2-b/nodes/gemma-tune-2-a5"
            ),
            "terminate: PREEMPTED",
        ),
    ],
)
def test_a_terminated_tpu_node_wakes_its_job_and_attempt(changed: dict[str, Any], cause: str) -> None:
    got = log_entry_event(changed)
    assert isinstance(got, MachinePreempted), got
    assert (got.job_id, got.attempt, got.machine, got.zone, got.project, got.cause) == (
        "gemma-tune-2",
        5,
        "gemma-tune-2-a5",
        "us-central2-b",
        P,
        cause,
    )
    assert sink_filter().matches(changed)


@pytest.mark.parametrize(
    ("changed", "reason", "routed"),
    [
        (node("my-dev-vm"), "not a respawn", False),
        (node("llm-a0"), "not a respawn", False),
        (node("llm-a1", collection="zones"), "not name a TPU node", False),
        (terminated(logName=f"projects/{P}/logs/cloudaudit.googleapis.com%2Fdata_access"), "is neither", False),
        (terminated(protoPayload__methodName="google.cloud.tpu.v2.Tpu.DeleteNode", logName=ACTIVITY), "neither", False),
        # the filter leaves zones to the parser (no real entry names a zone that is not one)
        (node("llm-a1", zone="mars"), 'zone "mars"', True),
    ],
)
def test_other_tpu_node_entries_are_ignored(changed: dict[str, Any], reason: str, routed: bool) -> None:
    got = log_entry_event(changed)
    assert isinstance(got, Ignored) and reason in got.reason, got
    assert sink_filter().matches(changed) is routed


@pytest.mark.parametrize(
    "changed",
    [
        preempted(resource=None),  # as in Google's TPU maintenance example
        preempted(resource__type="tpu_worker"),
        preempted(resource__type="audited_resource"),
        preempted(resource="gce_instance"),
    ],
)
def test_a_system_event_is_read_from_its_resource_name_whatever_its_resource(changed: dict[str, Any]) -> None:
    got = log_entry_event(changed)
    assert isinstance(got, MachinePreempted), got
    assert (got.job_id, got.attempt, got.zone, got.project) == ("llm-small-001", 2, "us-central1-a", P)
    assert sink_filter().matches(changed)


@pytest.mark.parametrize(
    ("changed", "kind"),
    [
        (node("llm-a1", zone="us-central1-ai1a"), MachinePreempted),
        (
            preempted(protoPayload__resourceName=f"projects/{P}/zones/us-south1-ai1b/instances/llm-a1-w-x7k2"),
            MachinePreempted,
        ),
        (
            preempted(protoPayload__resourceName=f"projects/{P}/zones/us-central1-ai1a/instances/t1v-n-2f3e9a1b-w-1"),
            ZoneWokeUp,
        ),
    ],
)
def test_events_in_ai_zones_name_their_zone(changed: dict[str, Any], kind: type) -> None:
    got = log_entry_event(changed)
    assert isinstance(got, kind) and got.zone.split("-")[-1].startswith("ai"), got
    assert sink_filter().matches(changed)


def test_system_event_falls_back_to_the_resource_name_and_receive_time() -> None:
    got = log_entry_event(preempted(resource__labels=None, timestamp=None))
    assert isinstance(got, MachinePreempted)
    assert got.project == P and got.time == pytest.approx(1741944413.872291804, abs=1e-6)


def test_unencoded_system_event_log_name_is_accepted() -> None:
    got = log_entry_event(preempted(logName=f"projects/{P}/logs/cloudaudit.googleapis.com/system_event"))
    assert isinstance(got, MachinePreempted)


def test_entry_without_insert_id_gets_a_stable_content_id() -> None:
    a, b = log_entry_event(preempted(insertId=None)), log_entry_event(preempted(insertId=None))
    other = log_entry_event(preempted(insertId=None, timestamp="2025-03-14T09:27:00Z"))
    assert isinstance(a, MachinePreempted) and isinstance(other, MachinePreempted)
    assert a.event_id == b.event_id != other.event_id and a.event_id.startswith("log:sha256:")


def test_trainer_numbers_stored_as_doubles_are_accepted() -> None:
    """Cloud Logging keeps jsonPayload numbers as doubles; 3.0 is attempt 3."""
    got = log_entry_event(trainer({"event": "checkpoint", "job_id": "llm", "attempt": 3.0, "step": 1400.0}))
    assert got == CheckpointSaved("log:1c8xk2vf3n9q7d", pytest.approx(1741945272.038115), "llm", 3, 1400)
    started = log_entry_event(trainer({"event": "started", "job_id": "llm", "attempt": 1, "step": 0}))
    assert started == TrainerStarted("log:1c8xk2vf3n9q7d", pytest.approx(1741945272.038115), "llm", 1, None, None)


@pytest.mark.parametrize(("worker", "parsed"), [(3, 3), (0.0, 0), (-1, None), ("2", None), (None, None)])
def test_a_failed_entry_names_its_worker_when_it_can(worker: Any, parsed: int | None) -> None:
    got = log_entry_event(trainer({"event": "failed", "job_id": "llm", "attempt": 2, "worker": worker, "error": "x"}))
    assert isinstance(got, TrainerFailed) and got.worker == parsed and got.machine_state is None


def test_failed_entry_with_odd_error_keeps_a_readable_error() -> None:
    got = log_entry_event(trainer({"event": "failed", "job_id": "llm", "attempt": 2, "error": {"code": 1}}))
    assert isinstance(got, TrainerFailed) and got.error == '{"code": 1}'
    got = log_entry_event(trainer({"event": "failed", "job_id": "llm", "attempt": 2}))
    assert isinstance(got, TrainerFailed) and got.error == "null"


def test_a_completed_entry_from_the_exit_code_carries_no_result() -> None:
    """The startup script's `completed` (source exit-code) cannot vouch for parameters or goodput, whatever it says."""
    said = {"event": "completed", "job_id": "llm", "attempt": 2, "source": "exit-code", "params_sha256": "ab"}
    got = log_entry_event(trainer(said))
    assert isinstance(got, TrainerCompleted) and (got.source, got.result, got.step) == (EXIT_CODE, {}, None)
    own = log_entry_event(trainer({**said, "source": "mine", "step": 7}))
    assert isinstance(own, TrainerCompleted) and (own.source, own.result, own.step) == (
        "trainer",
        {"params_sha256": "ab"},
        7,
    )


@pytest.mark.parametrize(
    ("kept", "result"),
    [("gs://b/final/runs/llm/7", {"final_weights": "gs://b/final/runs/llm/7"}), (7, {}), ("s3://b/x", {})],
)
def test_a_completed_entry_says_where_the_final_weights_are_kept(kept: Any, result: dict[str, str]) -> None:
    said = {"event": "completed", "job_id": "llm", "attempt": 2, "step": 7, "final_weights": kept}
    got = log_entry_event(trainer(said))
    assert isinstance(got, TrainerCompleted) and got.result == result


@pytest.mark.parametrize(("said", "permanent"), [(True, True), (False, False), ("yes", False), (None, False)])
def test_only_a_failed_entry_that_says_permanent_true_is_permanent(said: Any, permanent: bool) -> None:
    got = log_entry_event(trainer({"event": "failed", "job_id": "llm", "attempt": 2, "permanent": said}))
    assert isinstance(got, TrainerFailed) and got.permanent is permanent


# ---------------------------------------------------------------------------- envelopes


def test_push_body_job_message() -> None:
    msg = message_from_push(entry("pubsub_push_job.json"))
    assert msg.message_id == "13875096262734531" and msg.publish_time == pytest.approx(1741944004.517)
    assert msg.problem == ""
    event = job_event(msg)
    assert isinstance(event, JobSubmitted) and event.event_id == "13875096262734531"
    assert event.spec.job_id == "llm-small-001" and event.spec.machine == TpuMachine(
        "v5litepod-8", "v2-alpha-tpuv5-lite"
    )
    assert event.time == pytest.approx(1741944004.517)


def test_cloudevent_job_message_object_and_structured_json_agree() -> None:
    structured = entry("cloudevent_job.json")
    attributes = {k: v for k, v in structured.items() if k != "data"}
    ce = CloudEvent(attributes, structured["data"])
    assert message_from_cloudevent(ce) == message_from_cloudevent(structured)
    assert message_from_cloudevent(ce) == message_from_push(entry("pubsub_push_job.json"))
    assert job_event(message_from_cloudevent(ce)) == event_from_file(text("cloudevent_job.json"))


def test_cloudevent_with_a_sink_log_entry() -> None:
    structured = entry("cloudevent_logentry_preempted.json")
    msg = message_from_cloudevent(CloudEvent({k: v for k, v in structured.items() if k != "data"}, structured["data"]))
    assert msg.attributes == {"logging.googleapis.com/timestamp": "2025-03-14T09:26:53.104627Z"}
    assert events_event(msg) == log_entry_event(entry("logentry_gce_preempted.json"))


def test_sweep_tick() -> None:
    structured = entry("sweep_tick.json")
    ce = CloudEvent({k: v for k, v in structured.items() if k != "data"}, structured["data"])
    got = events_event(message_from_cloudevent(ce))
    assert got == SweepTicked("13875311905471262", pytest.approx(1741944300.31))
    assert event_from_file(text("sweep_tick.json")) == got


def test_cloudevent_without_message_id_uses_the_cloudevent_id_and_time() -> None:
    ce = CloudEvent(
        {"type": "t", "source": "s", "id": "ce-7", "time": "2025-03-14T09:25:00Z"},
        {"message": {"data": b64({"kind": "sweep_tick"})}},
    )
    assert events_event(message_from_cloudevent(ce)) == SweepTicked("ce-7", 1741944300.0)


def test_cloudevent_with_json_text_data() -> None:
    ce = CloudEvent({"type": "t", "source": "s", "id": "9"}, json.dumps(push({"kind": "sweep_tick"}, "9")).encode())
    assert isinstance(events_event(message_from_cloudevent(ce)), SweepTicked)


def test_cancel_message() -> None:
    got = job_event(message_from_push(push({"action": "cancel", "job_id": "llm-small-001"}, "77")))
    assert got == CancelRequested("77", 0.0, "llm-small-001")


def test_rejected_job_keeps_a_usable_job_id() -> None:
    job = json.loads(base64.b64decode(entry("pubsub_push_job.json")["message"]["data"]))
    job["zones"] = ["us-central1"]
    got = job_event(message_from_push(push(job, "5")))
    assert isinstance(got, JobRejected) and got.job_id == "llm-small-001" and got.event_id == "5"
    assert got.error == (
        'job message: field "zones[0]": "us-central1" is not a zone; allowed: a zone name like us-central1-a'
    )
    job["job_id"] = "Not Usable"
    got = job_event(message_from_push(push(job, "6")))
    assert isinstance(got, JobRejected) and got.job_id is None and 'field "job_id"' in got.error


def test_a_job_without_image_takes_the_deployments_image_of_its_kind_or_is_rejected_naming_image() -> None:
    job = json.loads(base64.b64decode(entry("pubsub_push_job.json")["message"]["data"]))
    del job["image"]
    images = {"tpu": "us-docker.pkg.dev/p/respawn/trainer:abc1234"}
    got = job_event(message_from_push(push(job, "7")), images)
    assert isinstance(got, JobSubmitted) and got.spec.image == images["tpu"]
    rejected = job_event(message_from_push(push(job, "8")))
    assert isinstance(rejected, JobRejected) and rejected.job_id == "llm-small-001"
    assert rejected.error == (
        'job message: field "image": missing; allowed: required for action submit unless the deployment sets '
        "RESPAWN_TRAINER_IMAGES with an image for kind tpu"
    )


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({}, "no message object"),
        ({"message": "x"}, "no message object"),
        ([], "no message object"),
        (None, "no message object"),
        ({"message": {"data": "%%%not base64%%%", "messageId": "1"}}, "not valid base64"),
        ({"message": {"data": 12, "messageId": "1"}}, "not a base64 string"),
    ],
)
def test_broken_envelopes_are_rejected_or_ignored(body: Any, problem: str) -> None:
    msg = message_from_push(body)
    assert msg.data == b"" and problem in msg.problem
    rejected = job_event(msg)
    assert isinstance(rejected, JobRejected) and problem in rejected.error and rejected.job_id is None
    ignored = events_event(msg)
    assert isinstance(ignored, Ignored) and problem in ignored.reason


def test_message_without_data_is_an_empty_message() -> None:
    msg = message_from_push({"message": {"messageId": "3", "attributes": {"a": "b", "n": 1}}})
    assert msg == PubSubMessage(b"", {"a": "b"}, "3", 0.0)
    assert isinstance(job_event(msg), JobRejected)
    assert events_event(msg) == Ignored("message data is not JSON")


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"not json", "not JSON"),
        (json.dumps({"kind": "sweep"}).encode(), "neither a LogEntry nor a sweep tick"),
        (json.dumps([1]).encode(), "neither a LogEntry nor a sweep tick"),
        (json.dumps({"logName": 5, "timestamp": "2025-03-14T09:25:00Z"}).encode(), "no logName"),
        (json.dumps({"action": "submit"}).encode(), "neither a LogEntry nor a sweep tick"),
    ],
)
def test_other_events_topic_messages_are_ignored(data: bytes, reason: str) -> None:
    got = events_event(PubSubMessage(data, {}, "1", 0.0))
    assert isinstance(got, Ignored) and reason in got.reason


def test_cloudevent_that_is_not_one() -> None:
    assert isinstance(job_event(message_from_cloudevent(object())), JobRejected)
    assert isinstance(events_event(message_from_cloudevent(42)), Ignored)


# ---------------------------------------------------------------------------- files


def test_event_from_file_accepts_every_shape() -> None:
    expected = log_entry_event(entry("logentry_gce_preempted.json"))
    log_entry = entry("logentry_gce_preempted.json")
    pulled = {
        "ackId": "x",
        "message": {"data": b64(log_entry), "messageId": "8", "publishTime": "2025-03-14T09:27:00Z"},
    }
    shapes = [
        text("logentry_gce_preempted.json"),  # a LogEntry
        json.dumps([log_entry]),  # `gcloud logging read --format=json`
        json.dumps(pulled),  # `gcloud pubsub subscriptions pull --format=json` item
        json.dumps(pulled["message"]),  # a bare Pub/Sub message
        text("cloudevent_logentry_preempted.json"),  # a CloudEvent
    ]
    for shape in shapes:
        assert event_from_file(shape) == expected


def test_event_from_file_job_messages() -> None:
    assert isinstance(event_from_file(text("pubsub_push_job.json")), JobSubmitted)
    bare = event_from_file(json.dumps({"action": "cancel", "job_id": "llm"}))
    assert isinstance(bare, CancelRequested) and bare.job_id == "llm" and bare.event_id.startswith("sha256:")
    rejected = event_from_file(json.dumps({"action": "submit", "job_id": "llm"}))
    assert isinstance(rejected, JobRejected) and rejected.job_id == "llm" and 'field "machine"' in rejected.error
    assert isinstance(event_from_file('{"kind": "sweep_tick"}'), SweepTicked)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("", "not JSON"),
        ("{{", "not JSON"),
        ("[]", "a list of 0 items"),
        ("[1, 2]", "a list of 2 items"),
        ("3", "does not hold a JSON object"),
        ('{"hello": "world"}', "not a LogEntry, Pub/Sub message, push body, CloudEvent or job message"),
    ],
)
def test_event_from_file_garbage(content: str, reason: str) -> None:
    got = event_from_file(content)
    assert isinstance(got, Ignored) and reason in got.reason


# ---------------------------------------------------------------------------- event_to_json


def test_event_to_json() -> None:
    got = event_to_json(log_entry_event(entry("logentry_gce_preempted.json")))
    assert got == {
        "kind": "machine_preempted",
        "event_id": "log:-x3q9v1e2k4fb",
        "time": pytest.approx(T_PREEMPT),
        "job_id": "llm-small-001",
        "attempt": 2,
        "machine": "llm-small-001-a2",
        "zone": "us-central1-a",
        "project": P,
        "cause": "preempted",
    }
    assert event_to_json(Ignored("why not")) == {"kind": "ignored", "reason": "why not"}
    assert event_to_json(ZoneWokeUp("e", 1.0, "z", "p", "i"))["kind"] == "zone_woke_up"
    observed = MachinesObserved("e", 1.0, "llm", (("llm-a1", "us-central1-a", MachineState.PREEMPTED),))
    assert json.loads(json.dumps(event_to_json(observed)))["machines"] == [["llm-a1", "us-central1-a", "PREEMPTED"]]


def test_event_to_json_redacts_env_values() -> None:
    submitted = event_from_file(text("pubsub_push_job.json"))
    assert isinstance(submitted, JobSubmitted) and submitted.spec.env == (("KEY", "value"),)
    out = event_to_json(submitted)
    assert out["kind"] == "job_submitted" and out["spec"]["env"] == {"KEY": "<redacted>"}
    assert "value" not in json.dumps(out["spec"]["env"])
    assert out["spec"]["zones"] == ["us-central1-a", "us-west4-a"]


# ---------------------------------------------------------------------------- never raises

JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(JSONISH, st.sampled_from(["", "protoPayload", "resource", "jsonPayload", "timestamp", "logName", "insertId"]))
def test_log_entries_never_raise(value: Any, field: str) -> None:
    for base in (entry("logentry_gce_preempted.json"), entry("logentry_trainer_completed.json")):
        changed = value if not field else {**base, field: value}
        event_to_json(log_entry_event(changed))


@settings(max_examples=300, deadline=None)
@given(JSONISH)
def test_envelopes_and_files_never_raise(value: Any) -> None:
    msg = message_from_push(value)
    assert isinstance(job_event(msg), JobRejected)
    assert isinstance(events_event(msg), Ignored)
    event_to_json(event_from_file(json.dumps(value)))
    data = push(value)
    event_to_json(job_event(message_from_push(data)))
    event_to_json(events_event(message_from_push(data)))


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("llm-a3", ("llm", 3)),  # an instance respawn created: a GPU VM, a single-host TPU VM
        ("llm-a3-w-x7k2", ("llm", 3)),  # a VM of slice llm-a3's MIG
        ("llm-a1-a12-w-0000", ("llm-a1", 12)),
        ("llm-w-x7k2", None),  # a MIG VM of no respawn machine
        ("llm-a3-w-x7k", None),  # not a MIG's suffix
        ("llm-a3-w-X7K2", None),
        ("t1v-n-0a1b2c3d-w-0", None),
    ],
)
def test_an_instance_name_maps_to_its_job_and_attempt(name: str, parsed: tuple[str, int] | None) -> None:
    assert parse_instance_name(name) == parsed


def slice_vm_event(vm: str, method: str = "compute.instances.preempted", insert_id: str = "") -> dict[str, Any]:
    """A Compute Engine system event on a VM of a slice's MIG (the captured GCE entry, renamed)."""
    return preempted(
        protoPayload__resourceName=f"projects/{P}/zones/us-central1-a/instances/{vm}",
        protoPayload__methodName=method,
        insertId=insert_id or f"id-{vm}",
    )


@pytest.mark.parametrize(
    ("method", "cause"),
    [
        ("compute.instances.preempted", "preempted"),
        ("compute.instances.hostError", "hostError"),
        ("compute.instances.terminateOnHostMaintenance", "terminateOnHostMaintenance"),
    ],
)
def test_a_system_event_on_a_slice_vm_is_its_attempts_and_the_sink_routes_it(method: str, cause: str) -> None:
    e = slice_vm_event("llm-small-001-a2-w-x7k2", method)
    assert log_entry_event(e) == MachinePreempted(
        "log:id-llm-small-001-a2-w-x7k2",
        T_PREEMPT,
        "llm-small-001",
        2,
        "llm-small-001-a2-w-x7k2",
        "us-central1-a",
        P,
        cause,
    )
    assert sink_filter().matches(e)


@pytest.mark.parametrize("vm", ["llm-a2-w-X7K2", "llm-a2-w-x7k", "llm-a2-w-x7k2z", "llm-w-x7k2", "llm-a0-w-x7k2"])
def test_a_vm_that_is_no_slice_of_respawns_is_neither_routed_nor_parsed(vm: str) -> None:
    e = slice_vm_event(vm)
    assert isinstance(log_entry_event(e), Ignored) and not sink_filter().matches(e)


def test_the_trainer_log_is_named_once_on_each_side_of_the_protocol() -> None:
    """The service reads, `respawn logs` queries and the startup script writes respawn.machine.TRAINER_LOG; the
    trainer library (a package of its own, which imports nothing of respawn) writes its LOG_NAME: the same log."""
    from respawn.machine import TRAINER_LOG
    from respawn_trainer.lifecycle import LOG_NAME

    assert LOG_NAME == TRAINER_LOG
    entry = json.loads((DATA / "logentry_trainer_started.json").read_text())
    assert entry["logName"].endswith(f"/logs/{TRAINER_LOG}")
