"""decide(): every event in every status, stale and duplicate events, zone walk, backoff, TTL, counters."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import replace

import pytest

from respawn.actions import Action, CreateMachine, DeleteMachine
from respawn.decide import decide
from respawn.events import (
    EXIT_CODE,
    CancelRequested,
    CheckpointSaved,
    CreateFailed,
    CreateFailure,
    JobEvent,
    JobRejected,
    JobSubmitted,
    MachineNoticed,
    MachinePreempted,
    MachinesObserved,
    TrainerCompleted,
    TrainerFailed,
    TrainerProgressed,
    TrainerStarted,
)
from respawn.jobs import (
    COUNTED_AS_FAILURE,
    COUNTED_AS_PREEMPTION,
    FLEX_START_MAX_RUN_S,
    LEGAL_TRANSITIONS,
    NO_CAPACITY,
    TERMINAL,
    EndReason,
    GpuMachine,
    Job,
    JobSpec,
    MachineState,
    Status,
    Tier,
    TpuMachine,
    flex_start_run_s,
)
from respawn.machine import exit_code_failure
from respawn.policy import Policy, backoff_s

A, B, C = "us-central1-a", "us-west4-a", "europe-west4-b"
T0 = 1_000_000.0
NOW = T0 + 100  # every machine built below is older than the lost grace at NOW
LATER = T0 + 1000  # past stuck_creating_s and past any first backoff
POLICY = Policy()
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


_ids = iter(range(1, 1_000_000))


def eid() -> str:
    return f"e{next(_ids)}"


def step(job: Job | None, event: JobEvent, now: float = NOW) -> tuple[Job | None, list[Action]]:
    """decide, asserting that the transition is legal."""
    new, actions = decide(job, event, now, POLICY)
    before = job.status if job else None
    if new is not None and (job is None or new.status != job.status):
        assert new.status in LEGAL_TRANSITIONS[before], f"{before} -> {new.status} is not legal"
    return new, actions


def run(job: Job | None, *events: JobEvent, now: float = T0) -> Job:
    for event in events:
        job, _ = step(job, event, now)
    assert job is not None
    return job


def submitted(s: JobSpec | None = None) -> JobSubmitted:
    return JobSubmitted(eid(), T0, s or spec())


def started(n: int, restored: int | None = None) -> TrainerStarted:
    return TrainerStarted(eid(), T0, "llm", n, restored)


def preempted(n: int) -> MachinePreempted:
    return MachinePreempted(eid(), T0, "llm", n, f"llm-a{n}", A, "p")


def capacity(n: int) -> CreateFailed:
    return CreateFailed(eid(), T0, "llm", n, CreateFailure.CAPACITY, "ZONE_RESOURCE_POOL_EXHAUSTED")


def failed(n: int) -> TrainerFailed:
    return TrainerFailed(eid(), T0, "llm", n, "exit 1")


def observed(*machines: tuple[str, str, MachineState], zones: tuple[str, ...] = (A, B)) -> MachinesObserved:
    return MachinesObserved(eid(), T0, "llm", machines, zones)


def build(status: Status) -> Job:
    """A job in `status`, reached through decide itself."""
    provisioning = run(None, submitted())
    running = run(provisioning, started(1))
    jobs: dict[Status, Callable[[], Job]] = {
        Status.PROVISIONING: lambda: provisioning,
        Status.RUNNING: lambda: running,
        Status.RECOVERING: lambda: run(running, preempted(1)),  # a1 ended, a2 requested in A
        Status.PENDING: lambda: run(provisioning, capacity(1), capacity(2), now=NOW - 5),  # backoff not due at NOW
        Status.SUCCEEDED: lambda: run(running, TrainerCompleted(eid(), T0, "llm", 1, 50)),
        Status.FAILED: lambda: run(
            provisioning, CreateFailed(eid(), T0, "llm", 1, CreateFailure.PERMANENT, "403 denied")
        ),
        Status.CANCELLED: lambda: run(running, CancelRequested(eid(), T0, "llm")),
        Status.EXPIRED: lambda: run(running, observed(), now=T0 + spec().ttl_s),
        Status.REJECTED: lambda: run(None, JobRejected(eid(), T0, "llm", "zones: must not be empty")),
    }
    job = jobs[status]()
    assert job.status is status
    return job


def current_n(job: Job) -> int:
    return job.current.n if job.current else 1


def current_machine(job: Job, state: MachineState) -> tuple[str, str, MachineState]:
    current = job.current
    return (current.machine, current.zone, state) if current else ("llm-a1", A, state)


# Each kind builds an event about the job's current attempt, and the time it is decided at.
KINDS: dict[str, Callable[[Job], tuple[JobEvent, float]]] = {
    "submit": lambda j: (submitted(spec(zones=(C,))), NOW),
    "reject": lambda j: (JobRejected(eid(), T0, "llm", "bad"), NOW),
    "cancel": lambda j: (CancelRequested(eid(), T0, "llm"), NOW),
    "preempted": lambda j: (preempted(current_n(j)), NOW),
    "notice": lambda j: (MachineNoticed(eid(), T0, "llm", current_n(j), 0), NOW),  # a head start: the next at once
    "started": lambda j: (started(current_n(j), 40), NOW),
    "checkpoint": lambda j: (CheckpointSaved(eid(), T0, "llm", current_n(j), 70), NOW),
    "completed": lambda j: (TrainerCompleted(eid(), T0, "llm", current_n(j), 100, {"final_loss": 0.1}), NOW),
    "exit_0": lambda j: (TrainerCompleted(eid(), T0, "llm", current_n(j), source=EXIT_CODE), NOW),
    "failed": lambda j: (failed(current_n(j)), NOW),
    "capacity": lambda j: (capacity(current_n(j)), NOW),
    "permanent": lambda j: (CreateFailed(eid(), T0, "llm", current_n(j), CreateFailure.PERMANENT, "403"), NOW),
    "seen_ready": lambda j: (observed(current_machine(j, MachineState.READY)), NOW),
    "seen_preempted": lambda j: (observed(current_machine(j, MachineState.PREEMPTED)), NOW),
    "seen_terminated": lambda j: (observed(current_machine(j, MachineState.TERMINATED)), NOW),
    "seen_failed": lambda j: (observed(current_machine(j, MachineState.FAILED)), NOW),
    "seen_missing": lambda j: (observed(), NOW),
    "seen_stuck": lambda j: (observed(current_machine(j, MachineState.CREATING)), LATER),
    "sweep_later": lambda j: (observed(zones=()), LATER),
}

# Expected outcome per kind and status: "-" = unchanged status and no action; otherwise STATUS:ACTIONS where an
# empty STATUS means unchanged and ACTIONS is a string of d (delete) and c (create), in order.
TABLE = """
kind             PENDING          PROVISIONING   RUNNING        RECOVERING     terminal  REJECTED
submit           -                -              -              -              -         PROVISIONING:c
reject           -                -              -              -              -         -
cancel           CANCELLED:       CANCELLED:d    CANCELLED:d    CANCELLED:d    -         -
preempted        -                RECOVERING:dc  RECOVERING:dc  :dc            -         -
notice           -                -              RECOVERING:c   -              -         -
started          -                RUNNING:       -              RUNNING:       -         -
checkpoint       -                -              -              -              -         -
completed        -                SUCCEEDED:d    SUCCEEDED:d    SUCCEEDED:d    -         -
exit_0           -                SUCCEEDED:d    SUCCEEDED:d    SUCCEEDED:d    -         -
failed           -                RECOVERING:dc  RECOVERING:dc  :dc            -         -
capacity         -                :c             -              :c             -         -
permanent        -                FAILED:d       -              FAILED:d       -         -
seen_ready       :d               -              -              -              :d        -
seen_preempted   :d               RECOVERING:dc  RECOVERING:dc  :dc            :d        -
seen_terminated  :d               RECOVERING:dc  RECOVERING:dc  :dc            :d        -
seen_failed      :d               :dc            RECOVERING:dc  :dc            :d        -
seen_missing     -                RECOVERING:dc  RECOVERING:dc  :dc            -         -
seen_stuck       PROVISIONING:dc  :dc            -              :dc            :d        -
sweep_later      PROVISIONING:c   -              -              -              -         -
"""
# "terminal" is SUCCEEDED, FAILED, CANCELLED and EXPIRED: their attempts held machines. A REJECTED job never had one;
# a valid submit of its job id replaces the record (the user fixed the message).


def _table() -> dict[tuple[str, Status], tuple[Status | None, str]]:
    lines = [line.split() for line in TABLE.strip().splitlines()]
    columns = lines[0][1:]
    expected: dict[tuple[str, Status], tuple[Status | None, str]] = {}
    for kind, *cells in lines[1:]:
        for column, cell in zip(columns, cells, strict=True):
            status_text, _, actions = cell.partition(":") if cell != "-" else ("", "", "")
            statuses = TERMINAL - {Status.REJECTED} if column == "terminal" else {Status(column)}
            for status in statuses:
                expected[(kind, status)] = (Status(status_text) if status_text else None, actions)
    return expected


EXPECTED = _table()


def test_table_covers_every_event_kind_in_every_status() -> None:
    assert {k for k, _ in EXPECTED} == set(KINDS)
    assert {s for _, s in EXPECTED} == set(Status)


def _letters(actions: list[Action]) -> str:
    return "".join("c" if isinstance(a, CreateMachine) else "d" for a in actions)


@pytest.mark.parametrize("status", list(Status), ids=lambda s: s.value)
@pytest.mark.parametrize("kind", list(KINDS))
def test_every_event_in_every_status(kind: str, status: Status) -> None:
    job = build(status)
    event, now = KINDS[kind](job)
    new, actions = step(job, event, now)
    want_status, want_actions = EXPECTED[(kind, status)]
    assert new is not None
    assert new.status is (want_status or status)
    assert _letters(actions) == want_actions
    assert all(a.job_id == "llm" for a in actions)
    if status.terminal and status is not Status.REJECTED:
        assert new.status is status
    if actions or new != job:
        assert new.seen_events[-1] == event.event_id
    else:
        assert new is job  # nothing changed: the same record, the event not even recorded


def test_replacement_stays_in_the_zone_and_gets_the_next_name() -> None:
    job = run(build(Status.RUNNING), preempted(1))
    _, actions = step(build(Status.RUNNING), preempted(1))
    assert actions == [DeleteMachine("llm", 1, "llm-a1", A), CreateMachine("llm", 2, "llm-a2", A, deadline=DEADLINE)]
    assert job.current is not None and (job.current.n, job.current.zone) == (2, A)
    first = job.attempts[0]
    assert (first.end_reason, first.machine_deleted) == ("preempted", True)
    assert job.counters.preemptions == 1 and job.counters.failures == 0


@pytest.mark.parametrize(
    "kind", ["preempted", "notice", "started", "checkpoint", "completed", "exit_0", "failed", "capacity", "permanent"]
)
def test_an_event_for_an_older_attempt_changes_nothing(kind: str) -> None:
    job = run(build(Status.RECOVERING), started(2))  # attempt 2 running; the events below name attempt 1
    event, _ = KINDS[kind](replace(job, attempts=job.attempts[:1]))
    assert getattr(event, "attempt", None) == 1
    new, actions = decide(job, event, NOW, POLICY)
    assert new is job and actions == []


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_duplicate_event_changes_nothing(kind: str) -> None:
    job = build(Status.RUNNING)
    event, now = KINDS[kind](job)
    once, _ = step(job, event, now)
    assert once is not None
    assert decide(once, event, now + 1, POLICY) == (once, [])


def test_submit_of_an_existing_job_keeps_the_record_even_with_another_spec() -> None:
    job = build(Status.RUNNING)
    assert decide(job, submitted(spec(zones=(C,), max_failures=9)), NOW, POLICY) == (job, [])


def test_first_events() -> None:
    job, actions = step(None, submitted(), T0)
    assert job is not None and job.status is Status.PROVISIONING
    assert actions == [CreateMachine("llm", 1, "llm-a1", A, deadline=DEADLINE)]
    rejected, actions = step(None, JobRejected(eid(), T0, "llm", "zones: must not be empty"))
    assert rejected is not None and rejected.status is Status.REJECTED and rejected.spec is None
    assert rejected.reason == "zones: must not be empty" and actions == []
    assert step(None, JobRejected(eid(), T0, None, "not JSON")) == (None, [])
    for event in (CancelRequested(eid(), T0, "llm"), preempted(1), started(1), observed()):
        assert step(None, event) == (None, [])


def test_seen_events_are_bounded_newest_last() -> None:
    job = build(Status.RUNNING)
    ids = []
    for s in range(1, 6):
        event = CheckpointSaved(eid(), T0, "llm", 1, s)
        ids.append(event.event_id)
        new, _ = decide(job, event, NOW, replace(POLICY, seen_events_max=3))
        assert new is not None
        job = new
    assert job.seen_events == tuple(ids[-3:])
    assert job.current is not None and job.current.last_step == 5


def test_checkpoint_step_only_moves_forward() -> None:
    job = run(build(Status.RUNNING), CheckpointSaved(eid(), T0, "llm", 1, 90))
    job = run(job, CheckpointSaved(eid(), T0, "llm", 1, 80))
    assert job.current is not None and job.current.last_step == 90


def test_started_records_time_and_restored_step_and_completed_the_result() -> None:
    job = run(build(Status.RECOVERING), TrainerStarted(eid(), T0 + 7, "llm", 2, 1200))
    current = job.current
    assert current is not None and (current.started_at, current.restored_step, current.last_step) == (
        T0 + 7,
        1200,
        1200,
    )
    done, actions = step(job, TrainerCompleted(eid(), T0, "llm", 2, 2000, {"params_sha256": "ab"}))
    assert done is not None and done.status is Status.SUCCEEDED
    assert done.result == {"params_sha256": "ab", "final_step": 2000}
    assert actions == [DeleteMachine("llm", 2, "llm-a2", A)]
    assert done.attempts[-1].end_reason == "completed"


def test_the_trainers_completed_entry_fills_in_what_the_exit_code_could_not_say_in_either_order() -> None:
    running = run(build(Status.RECOVERING), started(2))
    by_exit = TrainerCompleted(eid(), T0 + 2, "llm", 2, source=EXIT_CODE)
    own = TrainerCompleted(eid(), T0 + 1, "llm", 2, 2000, {"params_sha256": "ab", "goodput": {"total_s": 9.0}})
    exit_first, actions = step(running, by_exit)
    assert exit_first is not None and exit_first.status is Status.SUCCEEDED
    assert exit_first.result == {"source": EXIT_CODE} and exit_first.reason == "the trainer exited with code 0"
    assert actions == [DeleteMachine("llm", 2, "llm-a2", A)]  # the only delete: the late entry only fills in
    filled, actions = step(exit_first, own, NOW + 5)
    own_first = run(running, own, by_exit)
    for job in (filled, own_first):
        assert job is not None and job.status is Status.SUCCEEDED and job.reason == "the trainer completed"
        assert job.result == {"params_sha256": "ab", "goodput": {"total_s": 9.0}, "final_step": 2000}
        assert job.current is not None and (job.current.end_reason, job.current.last_step) == ("completed", 2000)
    assert actions == []
    assert filled is not None and filled.seen_events[-1] == own.event_id
    # filled in once: the same entry again, another exit code or another trainer entry change nothing
    for again in (own, replace(by_exit, event_id=eid()), replace(own, event_id=eid(), result={"params_sha256": "x"})):
        assert decide(filled, again, NOW + 9, POLICY) == (filled, [])
    assert decide(own_first, replace(by_exit, event_id=eid()), NOW, POLICY) == (own_first, [])


def test_a_completed_entry_fills_in_only_a_job_the_exit_code_completed() -> None:
    own = TrainerCompleted(eid(), T0, "llm", 1, 50, {"params_sha256": "ab"})
    for status in TERMINAL - {Status.SUCCEEDED, Status.REJECTED}:
        job = build(status)
        assert decide(job, replace(own, attempt=current_n(job)), NOW, POLICY) == (job, [])
    stale = run(build(Status.RECOVERING), started(2), TrainerCompleted(eid(), T0, "llm", 2, source=EXIT_CODE))
    assert decide(stale, own, NOW, POLICY) == (stale, [])  # attempt 1's entry: not the attempt that completed


# -- zone walk and backoff -------------------------------------------------------------------------------------------


def test_capacity_walks_the_zones_then_backs_off_then_walks_again() -> None:
    job = run(None, submitted(spec(zones=(A, B, C))))
    job, actions = step(job, capacity(1), T0)
    assert actions == [CreateMachine("llm", 2, "llm-a2", B, deadline=DEADLINE)]
    job, actions = step(job, capacity(2), T0)
    assert actions == [CreateMachine("llm", 3, "llm-a3", C, deadline=DEADLINE)]
    job, actions = step(job, capacity(3), T0)
    assert job is not None and job.status is Status.PENDING and actions == []
    first_wait = backoff_s("llm", 0, POLICY)
    assert job.next_attempt_at == T0 + first_wait and job.zone_index == 0
    assert job.counters.capacity_errors == 3

    assert step(job, observed(zones=()), T0 + first_wait - 1) == (job, [])  # not due yet
    job, actions = step(job, observed(zones=()), T0 + first_wait)
    assert job is not None and job.status is Status.PROVISIONING
    assert actions == [CreateMachine("llm", 4, "llm-a4", A, deadline=DEADLINE)]

    t = T0 + first_wait
    job = run(job, capacity(4), capacity(5), capacity(6), now=t)
    assert job.status is Status.PENDING and job.capacity_round == 2
    assert job.next_attempt_at == t + backoff_s("llm", 1, POLICY)
    assert [a.zone for a in job.attempts] == [A, B, C, A, B, C]


def test_a_preempted_machine_in_the_second_zone_is_replaced_there_then_walks_on() -> None:
    job = run(None, submitted(), capacity(1), started(2), preempted(2))
    assert job.current is not None and (job.current.n, job.current.zone) == (3, B)
    job, actions = step(job, capacity(3), T0)
    assert actions == [CreateMachine("llm", 4, "llm-a4", A, deadline=DEADLINE)]
    job, actions = step(job, capacity(4), T0)
    assert job is not None and job.status is Status.PENDING and actions == []


def test_a_started_trainer_resets_the_backoff_round() -> None:
    job = run(None, submitted(), capacity(1), capacity(2))
    assert job.capacity_round == 1
    job = run(job, observed(zones=()), now=LATER)
    job = run(job, started(3))
    assert job.capacity_round == 0 and job.status is Status.RUNNING


def test_backoff_grows_is_capped_and_jittered_deterministically() -> None:
    waits = [backoff_s("llm", r, POLICY) for r in range(10)]
    for r, wait in enumerate(waits):
        nominal = min(30 * 2**r, 600)
        assert nominal * 0.8 <= wait <= nominal * 1.2
    assert waits[:5] == sorted(waits[:5])  # doubling outgrows a 20% jitter
    assert max(waits) <= 600 * 1.2
    assert waits == [backoff_s("llm", r, POLICY) for r in range(10)]  # a pure function of (job, round)
    others = [backoff_s(f"job-{i}", 3, POLICY) for i in range(20)]
    assert len(set(others)) == 20  # jobs do not retry in lockstep
    assert backoff_s("llm", 0, replace(POLICY, jitter=0.0)) == 30


# -- TTL -------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [Status.PENDING, Status.PROVISIONING, Status.RUNNING, Status.RECOVERING])
@pytest.mark.parametrize("kind", list(KINDS))
def test_ttl_expires_a_live_job_on_any_event(kind: str, status: Status) -> None:
    job = build(status)
    event, _ = KINDS[kind](job)
    new, actions = step(job, event, job.deadline)
    assert new is not None and new.status is Status.EXPIRED
    current = job.current
    live = current is not None and not current.ended
    assert actions == ([DeleteMachine("llm", current.n, current.machine, current.zone)] if live and current else [])
    assert new.current is not None and new.current.machine_deleted
    before, _ = step(job, event, job.deadline - 1)
    assert before is not None and before.status is not Status.EXPIRED


# -- counters --------------------------------------------------------------------------------------------------------


def test_max_failures_counts_only_trainer_failures() -> None:
    job = run(None, submitted(spec(max_failures=3)), started(1), failed(1), preempted(2), preempted(3), failed(4))
    assert job.status is Status.RECOVERING
    assert (job.counters.failures, job.counters.preemptions) == (2, 2)
    job, actions = step(job, failed(5))
    assert job is not None and job.status is Status.FAILED and "failure 3 of 3" in job.reason
    assert actions == [DeleteMachine("llm", 5, "llm-a5", A)]


def test_a_permanent_failure_fails_the_job_at_once_whatever_max_failures_allows() -> None:
    """The trainer found no device for the machine's accelerator: any other machine would fail the same way."""
    job = run(None, submitted(spec(max_failures=3)), started(1))
    wrong = TrainerFailed(eid(), T0, "llm", 1, "the machine has a TPU but JAX found only 1 CPU device(s)", 0, None)
    job, actions = step(job, replace(wrong, permanent=True))
    assert job is not None and job.status is Status.FAILED and job.counters.failures == 1
    assert "JAX found only 1 CPU" in job.reason and "not retried" in job.reason
    assert actions == [DeleteMachine("llm", 1, "llm-a1", A)]
    assert step(job, replace(wrong, permanent=True)) == (job, [])  # delivered again: nothing more


def test_a_permanent_failure_fails_the_job_once_in_either_order_of_the_trainers_entry_and_the_exit_codes() -> None:
    """The trainer exits with PERMANENT_RC after its own `failed` entry, so its startup script's entry says permanent
    too; whichever comes first fails the job without a retry, and the trainer's own puts its error in the reason."""
    running = run(None, submitted(spec(max_failures=3)), started(1))
    own = TrainerFailed(eid(), T0, "llm", 1, "the machine has a TPU but JAX found only 1 CPU device(s)", permanent=True)
    by_exit = TrainerFailed(eid(), T0, "llm", 1, "the trainer exited with code 78", 0, permanent=True, source=EXIT_CODE)
    exit_first, actions = step(running, by_exit)
    assert exit_first is not None and exit_first.status is Status.FAILED and "code 78" in exit_first.reason
    assert exit_first.result == {"source": EXIT_CODE, "error": "the trainer exited with code 78"}
    assert actions == [DeleteMachine("llm", 1, "llm-a1", A)]
    filled, actions = step(exit_first, own, NOW + 5)
    own_first = run(running, own, by_exit)
    for job in (filled, own_first):
        assert job is not None and job.status is Status.FAILED and job.result == {}
        assert job.reason.startswith("trainer failed on llm-a1") and "code 78" not in job.reason
        assert job.reason.endswith(
            ": the machine has a TPU but JAX found only 1 CPU device(s) (permanent: not retried)"
        )
        assert (len(job.attempts), job.counters.failures) == (1, 1)
    assert actions == []  # the late entry only fills in
    for again in (own, replace(own, event_id=eid(), error="another"), replace(by_exit, event_id=eid())):
        assert decide(filled, again, NOW + 9, POLICY) == (filled, [])  # filled in once


@pytest.mark.parametrize(("rc", "oom_killed"), [(2, False), (126, False), (127, False), (137, True)])
def test_an_exit_code_no_other_machine_would_change_fails_the_job_at_once_naming_the_cause(
    rc: int, oom_killed: bool
) -> None:
    """A bad flag (a usage error), a command the image lacks, the kernel's OOM killer: the startup script's entry
    (respawn/machine.py's one table) says permanent, the cause and the fix; one attempt, FAILED. On a machine the API
    shows dead the same entry is the preemption's, never counted."""
    error, permanent = exit_code_failure(rc, oom_killed=oom_killed)
    running = run(None, submitted(spec(max_failures=3)), started(1))
    entry = TrainerFailed(eid(), T0, "llm", 1, error, 0, permanent=permanent, source=EXIT_CODE)
    job, actions = step(running, entry)
    assert job is not None and job.status is Status.FAILED and (len(job.attempts), job.counters.failures) == (1, 1)
    assert f"code {rc}: " in job.reason and "; fix: " in job.reason and job.reason.endswith("(permanent: not retried)")
    assert actions == [DeleteMachine("llm", 1, "llm-a1", A)]
    lost, _ = step(running, replace(entry, machine_state=MachineState.PREEMPTED))
    assert lost is not None and lost.status is Status.RECOVERING
    assert (lost.counters.failures, lost.counters.preemptions) == (0, 1)


def test_the_trainers_failed_entry_fills_in_the_exit_codes_once_it_failed_the_job_after_max_failures() -> None:
    job = run(None, submitted(spec(max_failures=1)), started(1))
    job = run(job, TrainerFailed(eid(), T0, "llm", 1, "the trainer exited with code 1", 0, source=EXIT_CODE))
    assert job.status is Status.FAILED and job.reason.endswith("code 1 (failure 1 of 1)")
    job = run(job, TrainerFailed(eid(), T0, "llm", 1, "OOM in step 7", 0))
    assert job.reason == "trainer failed on llm-a1 worker 0: OOM in step 7 (failure 1 of 1)" and job.result == {}


def test_preemptions_never_count_as_failures() -> None:
    job = run(None, submitted(spec(max_failures=1)))
    for n in range(1, 11):
        job = run(job, started(n), preempted(n))
    assert job.status is Status.RECOVERING
    assert (job.counters.failures, job.counters.preemptions) == (0, 10)


def test_max_preemptions_counts_preempted_and_lost_machines() -> None:
    job = run(None, submitted(spec(max_preemptions=1)), preempted(1))
    assert job.status is Status.RECOVERING
    job, actions = step(job, observed())  # attempt 2 vanished: lost
    assert job is not None and job.status is Status.FAILED and "max_preemptions=1" in job.reason
    assert actions == [DeleteMachine("llm", 2, "llm-a2", A)]
    assert job.attempts[-1].end_reason == "lost"


# -- observations ----------------------------------------------------------------------------------------------------


def test_a_missing_machine_is_lost_only_when_its_zone_was_listed_and_it_is_old_enough() -> None:
    job = build(Status.RUNNING)
    assert step(job, observed(zones=(B,))) == (job, [])  # A was not listed
    assert step(job, observed(), T0 + POLICY.lost_grace_s - 1) == (job, [])  # may not be listed yet
    assert step(replace(job, pending=({"kind": "create"},)), observed()) == (
        replace(job, pending=({"kind": "create"},)),
        [],
    )
    lost, actions = step(job, observed())
    assert lost is not None and lost.status is Status.RECOVERING and _letters(actions) == "dc"


def test_orphans_are_deleted_and_newer_or_foreign_machines_left_alone() -> None:
    job = run(build(Status.RECOVERING), started(2))
    seen = observed(
        ("llm-a1", A, MachineState.PREEMPTED),
        ("llm-a2", A, MachineState.READY),
        ("llm-a7", A, MachineState.READY),
        ("llm-x-a1", A, MachineState.READY),
        ("other-a1", A, MachineState.PREEMPTED),
        ("llm-a1", B, MachineState.DELETING),
    )
    _, actions = step(job, seen)
    assert actions == [DeleteMachine("llm", 1, "llm-a1", A)]


def test_a_terminal_job_deletes_any_machine_still_there() -> None:
    job = build(Status.SUCCEEDED)
    new, actions = step(job, observed(("llm-a1", A, MachineState.READY)))
    assert new is not None and new.status is Status.SUCCEEDED
    assert actions == [DeleteMachine("llm", 1, "llm-a1", A)]
    assert step(job, observed(("llm-a1", A, MachineState.DELETING))) == (job, [])


def test_decide_is_pure() -> None:
    job = build(Status.RUNNING)
    snapshot = job.to_dict()
    event = preempted(1)
    assert decide(job, event, NOW, POLICY) == decide(job, event, NOW, POLICY)
    assert job.to_dict() == snapshot


RECORD_KEYS = {"zone_reason": "placement"}


def test_a_record_is_json_with_every_field_and_reads_back_equal() -> None:
    job, _ = step(build(Status.RUNNING), preempted(1))
    assert job is not None and job.pending == () and job.attempts
    notice = {"id": "llm/1/RECOVERING", "job_id": "llm", "new_status": "RECOVERING"}
    job = replace(job, pending=({"kind": "delete", "machine": "llm-a2"},), outbox=(notice,), result={"final_loss": 1.5})
    d = job.to_dict()
    assert d == json.loads(json.dumps(d))  # plain JSON types only
    generic = {k: v for k, v in dataclasses.asdict(job).items() if k != "world"}  # one slice: no world written
    assert d == generic | {  # the generic form, with enums and tuples as JSON has them
        "spec": job.spec.to_dict() if job.spec else None,
        "status": job.status.value,
        "pending": [dict(p) for p in job.pending],
        "outbox": [dict(n) for n in job.outbox],
        "observations": [dict(o) for o in job.observations],
        "seen_events": list(job.seen_events),
        # an attempt's zone_reason is kept under the key records have always held it by
        "attempts": [
            {RECORD_KEYS.get(k, k): v for k, v in dataclasses.asdict(a).items() if k != "slice"}  # slice 0: unwritten
            for a in job.attempts
        ],
        "hosts": 1,  # shown for the reader; derived from the spec, not read back
    }
    assert Job.from_dict(d) == job
    assert job.spec is not None
    tiers = (Tier("spot", (A, B), after_preemptions=2, after_stockout_s=600), Tier("reservation", (A,), "r-1"))
    secrets = (("HF_TOKEN", "projects/p-123456/secrets/hf/versions/latest"),)
    spec = replace(
        job.spec, args=("--steps=9",), env=(("A", "1"),), secrets=secrets, labels=(("team", "nlp"),), tiers=tiers
    )
    assert spec.to_dict() == dataclasses.asdict(spec) | {
        "zones": list(spec.zones),
        "args": list(spec.args),
        "env": dict(spec.env),
        "secrets": dict(spec.secrets),
        "labels": dict(spec.labels),
        "tiers": [dataclasses.asdict(t) | {"zones": list(t.zones)} for t in tiers],
    }
    assert JobSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_a_compute_engine_tpu_and_a_flex_start_tier_read_back_equal() -> None:
    job = build(Status.RUNNING)
    assert job.spec is not None
    machine = TpuMachine("v6e-16", api="compute", image="projects/p/global/images/family/f", queue_timeout_s=600)
    tiers = (Tier("flex-start", (A,), max_run_duration_s=3600, after_stockout_s=600), Tier("spot", (B,)))
    spec = replace(job.spec, machine=machine, tiers=tiers, provisioning="flex-start", max_run_duration_s=3600)
    d = json.loads(json.dumps(spec.to_dict()))
    assert (d["machine"]["api"], d["machine"]["runtime_version"], d["tiers"][0]["max_run_duration_s"]) == (
        "compute",
        None,
        3600,
    )
    assert JobSpec.from_dict(d) == spec
    assert GpuMachine("g2-standard-8", "nvidia-l4", 1).api == "compute"  # a class constant, not a record field
    assert "api" not in replace(spec, machine=GpuMachine("g2-standard-8", "nvidia-l4", 1)).to_dict()["machine"]


def test_a_record_written_before_compute_engine_tpus_reads_as_the_tpu_api() -> None:
    job = build(Status.RUNNING)
    assert job.spec is not None
    d = json.loads(json.dumps(job.spec.to_dict()))
    del d["machine"]["api"], d["machine"]["image"], d["max_run_duration_s"]
    for tier in d["tiers"]:
        tier.pop("max_run_duration_s")
    read = JobSpec.from_dict(d)
    assert isinstance(read.machine, TpuMachine) and (read.machine.api, read.machine.image) == ("tpu", None)
    assert read == job.spec and read.all_tiers[0].max_run_duration_s is None


def test_a_flex_start_machine_runs_for_its_tier_s_duration_or_until_the_ttl_within_seven_days() -> None:
    assert flex_start_run_s(Tier("flex-start", (A,), max_run_duration_s=3600), DEADLINE, T0) == 3600
    assert flex_start_run_s(Tier("flex-start", (A,)), T0 + 5 * 3600, T0) == 5 * 3600
    assert flex_start_run_s(Tier("flex-start", (A,)), T0 + 14 * 86400, T0) == FLEX_START_MAX_RUN_S == 7 * 86400


# -- slices: progress, hangs, a failed worker on a dead node ---------------------------------------------------------


def progress(n: int, at: float, step: int = 10) -> TrainerProgressed:
    return TrainerProgressed(eid(), at, "llm", n, step)


def test_progress_entries_move_the_attempts_progress_time_forward_only() -> None:
    job = run(build(Status.RUNNING), progress(1, T0 + 300, 40), progress(1, T0 + 200, 30))
    assert job.current is not None
    assert (job.current.progress_at, job.current.last_step) == (T0 + 300, 40)
    assert job.status is Status.RUNNING and job.counters == build(Status.RUNNING).counters


@pytest.mark.parametrize(
    ("timeout", "last_sign", "at", "hung"),
    [
        (1800, T0, T0 + 1800, False),  # exactly the timeout: not yet
        (1800, T0, T0 + 1801, True),
        (1800, T0 + 900, T0 + 2000, False),  # a progress entry 900 s in restarts the clock
        (1800, T0 + 900, T0 + 2701, True),
        (None, T0, T0 + 40 * 3600, False),  # hang_timeout off
    ],
)
def test_a_running_attempt_silent_past_the_hang_timeout_is_hung(
    timeout: int | None, last_sign: float, at: float, hung: bool
) -> None:
    job = run(None, submitted(spec(hang_timeout_s=timeout)), started(1))
    if last_sign > T0:
        job = run(job, progress(1, last_sign))
    new, actions = step(job, observed(("llm-a1", A, MachineState.READY)), at)
    assert new is not None
    if not hung:
        assert (new.status, actions) == (Status.RUNNING, [])
        return
    silent = at - last_sign
    assert new.status is Status.RECOVERING and new.counters.failures == 1 and new.counters.preemptions == 0
    assert new.attempts[0].end_reason == "hung"
    assert new.reason == f"hung: no training progress for {silent:.0f}s on llm-a1; retrying"
    assert actions == [DeleteMachine("llm", 1, "llm-a1", A), CreateMachine("llm", 2, "llm-a2", A, deadline=DEADLINE)]


def test_a_hang_is_a_failure_and_the_last_allowed_one_fails_the_job() -> None:
    job = run(None, submitted(spec(max_failures=1, hang_timeout_s=120)), started(1))
    new, actions = step(job, observed(("llm-a1", A, MachineState.READY)), T0 + 121)
    assert new is not None and new.status is Status.FAILED
    assert new.reason == "hung: no training progress for 121s on llm-a1 (failure 1 of 1)"
    assert actions == [DeleteMachine("llm", 1, "llm-a1", A)]


def test_the_counters_count_the_end_reasons_of_their_group() -> None:
    job = run(build(Status.RUNNING), preempted(1))  # a2 in A
    job = run(job, started(2), failed(2))  # a3 in A
    job = run(job, capacity(3))  # a4 in B
    job = run(job, observed(), now=NOW)  # a4 not in a complete listing: lost; a5 in B
    job = run(job, started(5), now=NOW)
    job = run(job, observed(("llm-a5", B, MachineState.READY)), now=NOW + 1801)  # silent past the hang timeout
    reasons = [a.end_reason for a in job.attempts if a.ended]
    assert reasons == [EndReason.PREEMPTED, EndReason.FAILED, EndReason.CAPACITY, EndReason.LOST, EndReason.HUNG]
    assert job.counters.preemptions == sum(r in COUNTED_AS_PREEMPTION for r in reasons) == 2
    assert job.counters.failures == sum(r in COUNTED_AS_FAILURE for r in reasons) == 2
    assert job.counters.capacity_errors == sum(r in NO_CAPACITY for r in reasons) == 1


def test_only_a_running_attempt_can_hang() -> None:
    provisioning = run(None, submitted(spec(hang_timeout_s=120)))  # no trainer yet: stuck creation decides
    new, actions = step(provisioning, observed(("llm-a1", A, MachineState.READY)), T0 + 600)
    assert new is not None and (new.status, actions) == (Status.PROVISIONING, [])


@pytest.mark.parametrize(
    ("state", "counted"),
    [
        (None, "failure"),  # not read: the entry alone
        (MachineState.READY, "failure"),
        (MachineState.PREEMPTED, "preemption"),
        (MachineState.TERMINATED, "preemption"),  # one worker VM of the slice died (host error)
    ],
)
def test_a_failed_worker_on_a_machine_the_api_shows_dead_is_a_loss(state: MachineState | None, counted: str) -> None:
    job = build(Status.RUNNING)
    event = TrainerFailed(eid(), T0, "llm", 1, "the trainer exited with code 1", worker=2, machine_state=state)
    new, actions = step(job, event)
    assert new is not None and new.status is Status.RECOVERING
    assert (new.counters.failures, new.counters.preemptions) == ((1, 0) if counted == "failure" else (0, 1))
    assert actions == [DeleteMachine("llm", 1, "llm-a1", A), CreateMachine("llm", 2, "llm-a2", A, deadline=DEADLINE)]
    if counted == "failure":
        assert new.reason == "trainer failed on llm-a1 worker 2: the trainer exited with code 1; retrying"


# -- queued resources and tiers --------------------------------------------------------------------------------------

QUEUED_TPU = TpuMachine("v5litepod-8", "v2-alpha-tpuv5-lite", request="queued", queue_timeout_s=600)
SPOT_THEN_STANDARD = (Tier("spot", (A, B), after_preemptions=2, after_stockout_s=900), Tier("standard", (C,)))


def test_a_queued_request_waits_in_the_queue_until_its_timeout_then_tries_the_next_zone() -> None:
    job = run(None, submitted(spec(machine=QUEUED_TPU)))
    waiting = observed(("llm-a1", A, MachineState.QUEUED))
    new, actions = step(job, waiting, T0 + 600)
    assert new is not None and (new.status, actions) == (Status.PROVISIONING, [])
    new, actions = step(job, waiting, T0 + 601)
    assert new is not None and new.attempts[0].end_reason == "queued" and new.counters.capacity_errors == 1
    assert new.reason == "llm-a1 waited 601s in the queue of us-central1-a; trying us-west4-a"
    assert actions == [
        DeleteMachine("llm", 1, "llm-a1", A),
        CreateMachine("llm", 2, "llm-a2", B, deadline=DEADLINE),
    ]


def test_a_flex_start_gpu_waits_queued_until_its_timeout_then_tries_the_next_zone() -> None:
    gpu = GpuMachine("g2-standard-8", "nvidia-l4", 1, queue_timeout_s=900)
    job = run(None, submitted(spec(machine=gpu, provisioning="flex-start")))
    waiting = observed(("llm-a1", A, MachineState.QUEUED))
    new, actions = step(job, waiting, T0 + 900)
    assert new is not None and (new.status, actions) == (Status.PROVISIONING, [])
    new, actions = step(job, waiting, T0 + 901)
    assert new is not None and new.attempts[0].end_reason == "queued"
    assert actions == [DeleteMachine("llm", 1, "llm-a1", A), CreateMachine("llm", 2, "llm-a2", B, deadline=DEADLINE)]


def test_a_failed_queued_resource_says_why_in_the_apis_words() -> None:
    job = run(None, submitted(spec(machine=QUEUED_TPU)))
    event = MachinesObserved(
        eid(), T0, "llm", (("llm-a1", A, MachineState.FAILED),), (A, B), (("llm-a1", "Invalid runtime version"),)
    )
    new, _ = step(job, event)
    assert new is not None and new.reason.startswith("llm-a1 failed to come up in us-central1-a: Invalid runtime")


def test_after_two_preemptions_on_spot_the_third_attempt_is_standard() -> None:
    job = run(None, submitted(spec(tiers=SPOT_THEN_STANDARD)), started(1), preempted(1))
    assert job.current is not None and (job.current.tier, job.current.zone) == (0, A)
    job, actions = step(run(job, started(2)), preempted(2))
    assert job is not None and job.current is not None and job.tier_index == 1
    assert (job.current.n, job.current.tier, job.current.zone) == (3, 1, C)
    assert actions[-1] == CreateMachine("llm", 3, "llm-a3", C, deadline=DEADLINE, tier=1)
    assert job.reason == "llm-a2 preempted; replacing it in europe-west4-b (standard tier)"
    job = run(job, started(3), preempted(3))  # the last tier stays, however often it is preempted
    assert job.current is not None and (job.current.tier, job.tier_index) == (1, 1)


def test_a_stockout_longer_than_the_limit_moves_on_instead_of_backing_off() -> None:
    job = run(None, submitted(spec(tiers=SPOT_THEN_STANDARD)), capacity(1), capacity(2), now=T0)
    assert job.status is Status.PENDING and job.tier_index == 0  # a whole walk of spot, 0 s of stockout so far
    job = run(job, observed(), now=job.next_attempt_at or 0)
    assert job.current is not None and job.current.tier == 0  # the backoff is over: spot again
    job, actions = step(job, capacity(3), T0 + 900)  # spot has had no capacity for 900 s
    assert job is not None and job.current is not None and job.status is not Status.PENDING
    assert (job.current.tier, job.current.zone) == (1, C) and actions[-1].tier == 1  # type: ignore[union-attr]


def test_a_deadline_at_risk_moves_on() -> None:
    tiers = (Tier("spot", (A,), deadline_within_s=3600), Tier("standard", (A,)))
    job = run(None, submitted(spec(tiers=tiers)), started(1))
    job, _ = step(job, preempted(1), DEADLINE - 3601)
    assert job is not None and job.current is not None and job.current.tier == 0
    job, _ = step(run(job, started(2), now=DEADLINE - 3601), preempted(2), DEADLINE - 3600)
    assert job is not None and job.current is not None and job.current.tier == 1


def test_every_vm_of_a_slice_preempted_recovers_the_slice_once() -> None:
    """A MIG slice of 4 VMs: each VM's system event is a separate event naming attempt 1; the first ends it and
    replaces the slice, the others find the attempt ended and do nothing (in any order, delivered twice)."""
    from respawn.parsing import log_entry_event

    slice_job = spec(machine=TpuMachine("v6e-16", api="compute"))
    job = run(None, submitted(slice_job), started(1))
    events = []
    for vm in ("llm-a1-w-0a9z", "llm-a1-w-x7k2", "llm-a1-w-b3c4", "llm-a1-w-qq11"):
        entry = {
            "logName": "projects/p/logs/cloudaudit.googleapis.com%2Fsystem_event",
            "resource": {"type": "gce_instance", "labels": {"project_id": "p", "zone": A}},
            "protoPayload": {
                "methodName": "compute.instances.preempted",
                "resourceName": f"projects/p/zones/{A}/instances/{vm}",
            },
            "insertId": f"id-{vm}",
            "timestamp": "2025-03-14T09:26:53Z",
        }
        event = log_entry_event(entry)
        assert isinstance(event, MachinePreempted) and (event.job_id, event.attempt) == ("llm", 1)
        events.append(event)
    all_actions: list[Action] = []
    for event in [*events, *reversed(events)]:
        new, actions = step(job, event)
        assert new is not None
        job, all_actions = new, all_actions + actions
    assert all_actions == [
        DeleteMachine("llm", 1, "llm-a1", A),
        CreateMachine("llm", 2, "llm-a2", A, deadline=DEADLINE),
    ]
    assert (job.status, job.counters.preemptions, [a.n for a in job.attempts]) == (Status.RECOVERING, 1, [1, 2])
