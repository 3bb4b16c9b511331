"""Events and end reasons as plain data: their fields in order (events are built positionally) and the strings
that records on disk hold."""

from __future__ import annotations

import dataclasses
import json

import pytest

from respawn.decide import decide
from respawn.events import (
    EXIT_CODE,
    CancelRequested,
    CheckpointSaved,
    CreateFailed,
    CreateFailure,
    JobRejected,
    JobSubmitted,
    MachineNoticed,
    MachinePreempted,
    MachinesObserved,
    ResultSource,
    SweepTicked,
    TrainerCompleted,
    TrainerFailed,
    TrainerProgressed,
    TrainerReady,
    TrainerStarted,
    ZoneWokeUp,
)
from respawn.jobs import (
    COUNTED_AS_FAILURE,
    COUNTED_AS_PREEMPTION,
    NO_CAPACITY,
    Attempt,
    EndReason,
    Job,
    JobSpec,
    TpuMachine,
)
from respawn.policy import Policy

LEGACY_END_REASONS = {
    "preempted", "lost", "terminated", "failed", "hung", "capacity", "queued", "stuck", "completed", "cancelled",
    "expired", "error",
}  # fmt: skip
NEW_END_REASONS = {"back-to-spot", "unoffered"}  # added since: records before never hold them


def test_end_reasons_are_the_strings_records_hold() -> None:
    assert {r.value for r in EndReason} == LEGACY_END_REASONS | NEW_END_REASONS
    assert all(r == r.value and str(r) == r.value and json.dumps(r) == f'"{r.value}"' for r in EndReason)


def test_the_groups_of_end_reasons_do_not_overlap() -> None:
    assert {"capacity", "queued", "stuck", "unoffered"} == NO_CAPACITY
    assert {"preempted", "lost"} == COUNTED_AS_PREEMPTION
    assert {"failed", "hung"} == COUNTED_AS_FAILURE
    assert not (NO_CAPACITY & COUNTED_AS_PREEMPTION or NO_CAPACITY & COUNTED_AS_FAILURE)
    assert not COUNTED_AS_PREEMPTION & COUNTED_AS_FAILURE


@pytest.mark.parametrize("reason", sorted(LEGACY_END_REASONS))
def test_a_record_reads_and_writes_the_same_json_for_every_end_reason(reason: str) -> None:
    spec = JobSpec("llm", TpuMachine("v5litepod-8", "v2-alpha-tpuv5-lite"), ("z",), "img", "gs://b/c")
    job, _ = decide(None, JobSubmitted("e1", 1.0, spec), 1.0, Policy())
    assert job is not None
    on_disk = json.loads(json.dumps(job.to_dict()))
    on_disk["attempts"][0].update(ended_at=2.0, end_reason=reason, machine_deleted=True)
    text = json.dumps(on_disk, sort_keys=True)
    read = Job.from_dict(json.loads(text))
    assert read.attempts[0].end_reason is EndReason(reason)
    assert json.dumps(read.to_dict(), sort_keys=True) == text


def test_an_attempt_built_from_a_string_holds_the_end_reason() -> None:
    attempt = Attempt(1, "z", "llm-a1", 0.0, end_reason="lost")  # type: ignore[arg-type]  # as JSON gives it
    assert attempt.end_reason is EndReason.LOST
    assert dataclasses.replace(attempt, end_reason=None).end_reason is None


# Events are built positionally (parsing, the service, the tests): the order of their fields is part of them.
FIELDS = {
    JobSubmitted: ["event_id", "time", "spec"],
    JobRejected: ["event_id", "time", "job_id", "error"],
    CancelRequested: ["event_id", "time", "job_id"],
    MachinePreempted: ["event_id", "time", "job_id", "attempt", "machine", "zone", "project", "cause"],
    ZoneWokeUp: ["event_id", "time", "zone", "project", "instance", "cause"],
    TrainerStarted: ["event_id", "time", "job_id", "attempt", "restored_step", "startup_s"],
    MachineNoticed: ["event_id", "time", "job_id", "attempt", "worker"],
    CheckpointSaved: ["event_id", "time", "job_id", "attempt", "step", "goodput", "final"],
    TrainerProgressed: ["event_id", "time", "job_id", "attempt", "step"],
    TrainerCompleted: ["event_id", "time", "job_id", "attempt", "step", "result", "goodput", "source"],
    TrainerFailed: [
        "event_id",
        "time",
        "job_id",
        "attempt",
        "error",
        "worker",
        "machine_state",
        "goodput",
        "permanent",
        "source",
        "world",
    ],
    TrainerReady: ["event_id", "time", "job_id", "attempt", "world"],
    SweepTicked: ["event_id", "time"],
    CreateFailed: ["event_id", "time", "job_id", "attempt", "kind", "error"],
    MachinesObserved: ["event_id", "time", "job_id", "machines", "zones", "details"],
}


@pytest.mark.parametrize("kind", list(FIELDS), ids=lambda k: k.__name__)
def test_an_events_fields_keep_their_order(kind: type) -> None:
    assert [f.name for f in dataclasses.fields(kind)] == FIELDS[kind]


def test_results_and_create_failures_are_named_by_their_old_strings() -> None:
    assert (ResultSource.TRAINER, ResultSource.EXIT_CODE, EXIT_CODE) == ("trainer", "exit-code", "exit-code")
    assert TrainerCompleted("e", 1.0, "llm", 1).source is ResultSource.TRAINER
    assert (CreateFailure.CAPACITY, CreateFailure.PERMANENT) == ("capacity", "permanent")
