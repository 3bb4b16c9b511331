"""decide's head start: a running machine's notice requests its replacement at once, and the noticed machine drains.

The noticed attempt ends PREEMPTED (counted once), its machine is kept for the final save until its trainer's last
entry, a listing after drain_until, or the end of the job; the replacement goes to another zone and starts its
trainer after drain_until. Never more than one attempt drains.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from respawn.actions import Action, CreateMachine, DeleteMachine, action_from_dict, action_to_dict
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
    TrainerStarted,
)
from respawn.jobs import LEGAL_TRANSITIONS, EndReason, GpuMachine, Job, JobSpec, MachineState, Status, Tier, TpuMachine
from respawn.machine import NOTICE_S
from respawn.outlook import History, Key, Outlook
from respawn.policy import Policy
from respawn.spec import parse_job_message, spec_to_message

A, B, C = "us-central1-a", "us-west4-a", "europe-west4-b"
T0 = 1_000_000.0
NOTICED_AT = T0 + 500  # the shutdown script's entry
POLICY = Policy()
TPU = TpuMachine("v5litepod-8", "v2-alpha-tpuv5-lite")
DRAIN = NOTICED_AT + NOTICE_S["tpu"] + POLICY.drain_margin_s
DEADLINE = T0 + 48 * 3600


def spec(**overrides: object) -> JobSpec:
    base = JobSpec("llm", TPU, (A, B, C), "us-docker.pkg.dev/p/r/trainer:1", "gs://b/runs/llm")
    return replace(base, **overrides)


_ids = iter(range(1, 1_000_000))


def eid() -> str:
    return f"h{next(_ids)}"


def step(job: Job | None, event: JobEvent, now: float, outlook: Outlook | None = None) -> tuple[Job, list[Action]]:
    """decide, asserting a legal transition and that the same event again changes nothing."""
    new, actions = decide(job, event, now, POLICY, outlook=outlook)
    assert new is not None
    if job is not None and new.status != job.status:
        assert new.status in LEGAL_TRANSITIONS[job.status], f"{job.status} -> {new.status}"
    assert decide(new, event, now + 1, POLICY, outlook=outlook) == (new, [])
    return new, actions


def running(s: JobSpec | None = None, outlook: Outlook | None = None) -> Job:
    """Attempt 1 in zone A, its trainer started."""
    job, _ = step(None, JobSubmitted(eid(), T0, s or spec()), T0, outlook)
    job, _ = step(job, TrainerStarted(eid(), T0 + 60, "llm", 1, None), T0 + 60, outlook)
    assert job.status is Status.RUNNING and job.current is not None
    return job


def notice(n: int = 1, worker: int | None = 0, at: float = NOTICED_AT) -> MachineNoticed:
    return MachineNoticed(eid(), at, "llm", n, worker)


def listing(*machines: tuple[str, str, MachineState]) -> MachinesObserved:
    return MachinesObserved(eid(), T0, "llm", machines, (A, B, C))


def stopped(n: int) -> CheckpointSaved:
    return CheckpointSaved(eid(), NOTICED_AT + 6, "llm", n, 410, {"productive_s": 400.0, "total_s": 440.0}, final=True)


def head_started(s: JobSpec | None = None) -> Job:
    job, _ = step(running(s), notice(), NOTICED_AT + 1)
    return job


def test_the_notice_ends_the_attempt_keeps_its_machine_and_requests_the_next_in_another_zone_at_once() -> None:
    job, actions = step(running(), notice(), NOTICED_AT + 1)

    first, second = job.attempts
    assert (first.end_reason, first.ended_at, first.drain_until) == (EndReason.PREEMPTED, NOTICED_AT + 1, DRAIN)
    assert first.draining and not first.machine_deleted  # kept for its final save: no delete
    assert actions == [CreateMachine("llm", 2, "llm-a2", B, deadline=DEADLINE, start_after=DRAIN)]
    assert (second.zone, second.ended) == (B, False)
    assert job.status is Status.RECOVERING and job.counters.preemptions == 1
    assert job.reason == "llm-a1 noticed; its replacement is requested now in us-west4-a, to start after its final save"


def test_the_start_after_travels_with_the_create_as_intent() -> None:
    _, (create,) = step(running(), notice(), NOTICED_AT + 1)
    assert action_to_dict(create)["start_after"] == DRAIN and action_from_dict(action_to_dict(create)) == create
    assert "start_after" not in action_to_dict(replace(create, start_after=None))  # as creates were written before


def test_a_gpu_vms_longer_notice_window_drains_longer() -> None:
    gpu = spec(machine=GpuMachine("g2-standard-8", "nvidia-l4", 1))
    job = head_started(gpu)
    assert job.attempts[0].drain_until == NOTICED_AT + 30 + POLICY.drain_margin_s


def test_a_spot_vms_metadata_notice_before_its_soft_off_drains_that_much_longer() -> None:
    """The notice comes with the metadata flag, the job's preemption_notice before the soft off; on a standard
    tier there is no such notice to wait out."""
    gpu = spec(machine=GpuMachine("g2-standard-8", "nvidia-l4", 1), preemption_notice_s=120)
    assert head_started(gpu).attempts[0].drain_until == NOTICED_AT + 120 + 30 + POLICY.drain_margin_s
    standard = replace(gpu, tiers=(Tier("standard", (A, B)),))
    assert head_started(standard).attempts[0].drain_until == NOTICED_AT + 30 + POLICY.drain_margin_s


def test_a_local_cloud_replaying_real_timings_faster_drains_as_much_shorter() -> None:
    job = running()
    noticed, _ = decide(job, notice(), NOTICED_AT + 1, replace(POLICY, time_scale=1 / 60))
    assert noticed is not None
    assert noticed.attempts[0].drain_until == pytest.approx(NOTICED_AT + (NOTICE_S["tpu"] + POLICY.drain_margin_s) / 60)


@pytest.mark.parametrize(
    ("zones", "placement", "then"),
    [((A,), "ranked", A), ((A, B, C), "ordered", B), ((C, A, B), "ordered", A), ((B, C, A), "ordered", C)],
)
def test_the_replacement_goes_to_the_next_zone_in_list_order_or_the_same_when_it_is_the_only_one(
    zones: tuple[str, ...], placement: str, then: str
) -> None:
    job, _ = step(running(spec(zones=zones, placement=placement)), notice(), NOTICED_AT + 1)
    assert job.attempts[0].zone == zones[0] and job.attempts[1].zone == then


def test_ranked_the_replacement_goes_to_the_best_zone_other_than_the_dying_machines() -> None:
    """Zone A lasts by far the longest, and (no penalty for a zone that just interrupted the job) would be chosen
    again after a preemption's event; C is better than B."""
    kind = "v5litepod-8"
    history = (
        History()
        .observe(Key(A, kind, "spot"), T0, seconds=2000 * 3600)
        .observe(Key(B, kind, "spot"), T0, seconds=3600, interruptions=30)
        .observe(Key(C, kind, "spot"), T0, seconds=100 * 3600, interruptions=1)
    )
    outlook = Outlook(history, penalty=0.0)
    job = running(outlook=outlook)
    _, preempted = step(job, MachinePreempted(eid(), NOTICED_AT, "llm", 1, "llm-a1", A, "p"), NOTICED_AT + 1, outlook)
    assert [a.zone for a in preempted if isinstance(a, CreateMachine)] == [A]  # without a notice: A again

    noticed, actions = step(job, notice(), NOTICED_AT + 1, outlook)
    assert [a.zone for a in actions if isinstance(a, CreateMachine)] == [C]
    assert noticed.attempts[1].zone_reason.endswith(f"not {A}: its machine is on notice")


def test_the_preemption_that_follows_is_stale_and_counts_nothing_more() -> None:
    job = head_started()
    for late in (
        MachinePreempted(eid(), NOTICED_AT + 12, "llm", 1, "llm-a1", A, "p"),
        TrainerFailed(eid(), NOTICED_AT + 12, "llm", 1, "", None, MachineState.PREEMPTED),
    ):
        new, actions = step(job, late, NOTICED_AT + 20) if late is not None else (job, [])
        assert new.counters.preemptions == 1 and new.attempts[1] == job.attempts[1]
        assert [a for a in actions if isinstance(a, CreateMachine)] == []


def test_each_worker_vms_notice_and_duplicates_change_nothing_more() -> None:
    job = head_started()
    for again in (notice(worker=1), notice(worker=2), notice(worker=None, at=NOTICED_AT + 3)):
        assert decide(job, again, NOTICED_AT + 2, POLICY) == (job, [])


@pytest.mark.parametrize(
    "last",
    [
        stopped(1),
        TrainerCompleted(eid(), NOTICED_AT + 6, "llm", 1, 1000, {"final_loss": 1.0}),
        TrainerFailed(eid(), NOTICED_AT + 6, "llm", 1, "exit 1", 0),
    ],
    ids=["stopped", "completed", "failed"],
)
def test_the_trainers_last_entry_deletes_the_draining_machine_once(last: JobEvent) -> None:
    job = head_started()
    drained, actions = step(job, last, NOTICED_AT + 7)

    assert actions == [DeleteMachine("llm", 1, "llm-a1", A)]
    assert drained.attempts[0].machine_deleted and not drained.attempts[0].draining
    assert drained.attempts[1] == job.attempts[1] and drained.status is Status.RECOVERING
    assert drained.attempts[0].goodput == getattr(last, "goodput", None)  # the split is kept, as for any stale entry
    assert step(drained, stopped(1), NOTICED_AT + 8)[1] == []  # another last word: nothing left to delete


def test_a_periodic_checkpoint_of_the_draining_attempt_does_not_end_its_drain() -> None:
    job = head_started()
    new, actions = decide(job, CheckpointSaved(eid(), NOTICED_AT + 2, "llm", 1, 400), NOTICED_AT + 3, POLICY)
    assert new is job and actions == []


def test_a_listing_spares_the_draining_machine_until_drain_until_then_deletes_it() -> None:
    job = head_started()
    seen = listing(("llm-a1", A, MachineState.READY), ("llm-a2", B, MachineState.READY))
    assert decide(job, seen, DRAIN - 1, POLICY) == (job, [])

    late, actions = step(job, seen, DRAIN)
    assert actions == [DeleteMachine("llm", 1, "llm-a1", A)] and late.attempts[0].machine_deleted


def test_a_listing_after_drain_until_deletes_the_machine_even_where_it_no_longer_shows() -> None:
    """A Spot VM that deletes itself on preemption (instanceTerminationAction DELETE) is gone from the listing: the
    delete is a NotFound, and the record stops holding a machine that would keep its job in every sweep."""
    job = head_started()
    late, actions = step(job, listing(("llm-a2", B, MachineState.READY)), DRAIN + 60)
    assert actions == [DeleteMachine("llm", 1, "llm-a1", A)] and late.attempts[0].machine_deleted


@pytest.mark.parametrize(
    "ending",
    [
        CancelRequested(eid(), NOTICED_AT + 2, "llm"),
        TrainerCompleted(eid(), NOTICED_AT + 2, "llm", 2, 1000, {"final_loss": 1.0}),
    ],
    ids=["cancelled", "completed"],
)
def test_the_end_of_the_job_deletes_the_draining_machine_with_the_live_one(ending: JobEvent) -> None:
    job = head_started()
    over, actions = step(job, ending, NOTICED_AT + 3)
    assert over.status.terminal
    assert sorted(a.machine for a in actions if isinstance(a, DeleteMachine)) == ["llm-a1", "llm-a2"]
    assert all(a.machine_deleted for a in over.attempts)


def test_the_ttl_running_out_deletes_the_draining_machine_too() -> None:
    job = head_started()
    over, actions = step(job, stopped(2), DEADLINE)
    assert over.status is Status.EXPIRED
    assert sorted(a.machine for a in actions if isinstance(a, DeleteMachine)) == ["llm-a1", "llm-a2"]


def test_the_last_preemption_allowed_fails_the_job_and_deletes_the_noticed_machine_at_once() -> None:
    job, actions = step(running(spec(max_preemptions=0)), notice(), NOTICED_AT + 1)
    assert job.status is Status.FAILED and actions == [DeleteMachine("llm", 1, "llm-a1", A)]
    assert job.attempts[0].machine_deleted and len(job.attempts) == 1


def test_head_start_off_or_a_trainer_not_started_leaves_the_notice_to_the_preemption_event() -> None:
    off = running(spec(head_start=False))
    assert decide(off, notice(), NOTICED_AT + 1, POLICY) == (off, [])
    provisioning, _ = step(None, JobSubmitted(eid(), T0, spec()), T0)
    assert decide(provisioning, notice(), NOTICED_AT + 1, POLICY) == (provisioning, [])


def test_a_second_notice_while_one_drains_goes_the_way_without_a_head_start() -> None:
    """At most one attempt drains, so a job never has more than two machines."""
    job = head_started()
    job, _ = step(job, TrainerStarted(eid(), DRAIN + 1, "llm", 2, 410), NOTICED_AT + 2)  # came up early
    assert decide(job, notice(2), NOTICED_AT + 3, POLICY) == (job, [])  # attempt 1 still drains

    job, actions = step(job, MachinePreempted(eid(), NOTICED_AT + 4, "llm", 2, "llm-a2", B, "p"), NOTICED_AT + 4)
    assert actions == [
        DeleteMachine("llm", 2, "llm-a2", B),
        CreateMachine("llm", 3, "llm-a3", B, deadline=DEADLINE, start_after=DRAIN),  # still after attempt 1's save
    ]
    assert [a.draining for a in job.attempts] == [True, False, False] and job.counters.preemptions == 2


def test_a_head_start_refused_for_capacity_walks_the_zones_as_any_create_does() -> None:
    job = head_started()
    refused = CreateFailed(eid(), NOTICED_AT + 2, "llm", 2, CreateFailure.CAPACITY, "ZONE_RESOURCE_POOL_EXHAUSTED")
    job, actions = step(job, refused, NOTICED_AT + 2)
    assert actions == [CreateMachine("llm", 3, "llm-a3", C, deadline=DEADLINE, start_after=DRAIN)]
    assert job.attempts[0].draining and job.counters.capacity_errors == 1


def test_a_stopped_entry_before_the_notice_is_a_save_of_the_live_attempt() -> None:
    """Entries arrive in any order: the machine still drains, until a listing after drain_until."""
    job, actions = step(running(), stopped(1), NOTICED_AT + 7)
    assert actions == [] and job.current is not None and job.current.checkpoint_at == NOTICED_AT + 6
    job, actions = step(job, notice(), NOTICED_AT + 8)
    assert job.attempts[0].draining and [type(a) for a in actions] == [CreateMachine]


def test_the_option_is_on_by_default_and_a_job_message_may_turn_it_off() -> None:
    message = {
        "action": "submit",
        "job_id": "llm",
        "machine": {"kind": "tpu", "accelerator_type": "v5litepod-8", "runtime_version": "v2-alpha-tpuv5-lite"},
        "zones": [A, B],
        "image": "us-docker.pkg.dev/p/r/trainer:1",
        "checkpoint_uri": "gs://bkt/runs/llm",
    }
    on = parse_job_message(message)
    off = parse_job_message({**message, "head_start": False})
    assert isinstance(on, JobSpec) and isinstance(off, JobSpec)
    assert (on.head_start, off.head_start) == (True, False)
    assert "head_start" not in spec_to_message(on) and spec_to_message(off)["head_start"] is False
    assert JobSpec.from_dict(off.to_dict()) == off
    job = head_started()
    assert Job.from_dict(job.to_dict()) == job  # drain_until reads back


@pytest.mark.parametrize(("refused_ago_h", "then"), [(0.1, B), (3.0, A)])
def test_a_head_start_stays_in_the_dying_zone_while_the_other_just_had_no_capacity(
    refused_ago_h: float, then: str
) -> None:
    """Ranked, two zones alike: A refused the job, B took it and is noticed. A refusal under about 20 minutes old
    outweighs the notice (penalties 1.0 and 0.8, each halving hourly): the next machine would wait in A's queue while
    B had capacity a moment ago. One hours old does not."""
    outlook = Outlook(History())
    at = NOTICED_AT + refused_ago_h * 3600
    job, _ = step(None, JobSubmitted(eid(), T0, spec(zones=(A, B))), T0, outlook)
    job, _ = step(job, CreateFailed(eid(), T0, "llm", 1, CreateFailure.CAPACITY, "ZONE_RESOURCE_POOL_EXHAUSTED"), T0)
    assert job.current is not None and job.current.zone == B
    job, _ = step(job, TrainerStarted(eid(), T0 + 60, "llm", 2, None), T0 + 60, outlook)
    job, actions = step(job, notice(2, at=at), at + 1, outlook)
    assert [a.zone for a in actions if isinstance(a, CreateMachine)] == [then]
    said = f"{B} again, its machine on notice" if then == B else f"not {B}: its machine is on notice"
    assert said in job.attempts[2].zone_reason


def test_ranked_with_one_zone_the_replacement_stays_and_its_reason_says_nothing_of_leaving_it() -> None:
    outlook = Outlook(History())
    job, actions = step(running(spec(zones=(A,)), outlook), notice(), NOTICED_AT + 1, outlook)
    assert [a.zone for a in actions if isinstance(a, CreateMachine)] == [A]
    assert "on notice" not in job.attempts[1].zone_reason
