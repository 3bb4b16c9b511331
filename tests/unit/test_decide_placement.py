"""decide with an outlook: the zone of each attempt (first create, after a preemption, after a stockout, a crash), the
reason and MTBI it records, placement ordered, back to Spot from a fallback tier, and the observations it leaves."""

from __future__ import annotations

from dataclasses import replace

from respawn.actions import Action, CreateMachine, DeleteMachine
from respawn.decide import decide
from respawn.events import (
    CreateFailed,
    CreateFailure,
    JobEvent,
    JobSubmitted,
    MachinePreempted,
    MachinesObserved,
    TrainerFailed,
    TrainerStarted,
)
from respawn.jobs import LEGAL_TRANSITIONS, EndReason, Job, JobSpec, MachineState, Status, Tier, TpuMachine
from respawn.outlook import HOUR, Advice, History, Key, Observation, Outlook, ZoneAdvice
from respawn.policy import Policy

A, B, C = "us-central1-a", "us-central1-b", "us-central1-c"
TPU = "v5litepod-8"
T0 = 1_000_000.0
POLICY = Policy()


def spec(**overrides: object) -> JobSpec:
    base = JobSpec("llm", TpuMachine(TPU, "v2-alpha-tpuv5-lite"), (A, B, C), "img", "gs://b/runs/llm")
    return replace(base, **overrides)


def history(*rates: tuple[str, float, int], provisioning: str = "spot") -> History:
    """Each (zone, machine-hours, interruptions) observed at T0."""
    h = History()
    for zone, hours, interruptions in rates:
        h = h.observe(Key(zone, TPU, provisioning), T0, seconds=hours * HOUR, interruptions=interruptions)
    return h


# C lasts, A is interrupted hourly: ranked puts C first, then B (no data: the pooled prior), then A.
LEARNED = Outlook(history((A, 10, 10), (C, 100, 1)))

_ids = iter(range(1, 1_000_000))


def eid() -> str:
    return f"e{next(_ids)}"


def step(
    job: Job | None, event: JobEvent, now: float = T0, outlook: Outlook | None = LEARNED
) -> tuple[Job, list[Action]]:
    new, actions = decide(job, event, now, POLICY, outlook=outlook)
    assert new is not None
    if job is not None and new.status is not job.status:
        assert new.status in LEGAL_TRANSITIONS[job.status]
    return new, actions


def creates(actions: list[Action]) -> list[CreateMachine]:
    return [a for a in actions if isinstance(a, CreateMachine)]


def started(n: int, at: float = T0) -> TrainerStarted:
    return TrainerStarted(eid(), at, "llm", n, None)


def preempted(n: int, zone: str) -> MachinePreempted:
    return MachinePreempted(eid(), T0, "llm", n, f"llm-a{n}", zone, "p")


def capacity(n: int) -> CreateFailed:
    return CreateFailed(eid(), T0, "llm", n, CreateFailure.CAPACITY, "ZONE_RESOURCE_POOL_EXHAUSTED")


def ready(job: Job, now: float) -> MachinesObserved:
    live = job.current
    assert live is not None
    return MachinesObserved(eid(), now, "llm", ((live.machine, live.zone, MachineState.READY),), (A, B, C))


def test_the_first_machine_goes_to_the_best_ranked_zone_with_its_reason_and_mtbi() -> None:
    job, actions = step(None, JobSubmitted(eid(), T0, spec()))
    attempt = job.attempts[0]
    assert attempt.zone == C and job.reason == f"machine requested in {C}"
    assert attempt.zone_reason.startswith(f"{C}: MTBI") and f"runner-up {B}" in attempt.zone_reason
    assert creates(actions)[0].mtbi_s == attempt.mtbi_s == LEARNED.mtbi_s(C, TPU, "spot", T0)


def test_an_attempt_placed_with_the_advice_apis_price_keeps_it_with_its_date_and_others_none() -> None:
    """The attempt's hours are priced at what the Advice API said of its zone when it was placed (accounting)."""
    fetched = 1_795_000_000.0  # 2026-11-18 UTC
    advice = Advice({C: ZoneAdvice(None, None, 2.5)}, fetched)
    job, _ = step(None, JobSubmitted(eid(), T0, spec()), outlook=replace(LEARNED, advice={(TPU, "spot"): advice}))
    assert job.attempts[0].zone == C
    assert job.attempts[0].price == {"per_h": 2.5, "source": "Advice API price history (2026-11-18)"}
    job, _ = step(None, JobSubmitted(eid(), T0, spec()))
    assert job.attempts[0].price is None


def test_without_an_outlook_the_first_machine_takes_the_first_zone_and_records_no_reason() -> None:
    job, actions = step(None, JobSubmitted(eid(), T0, spec()), outlook=None)
    assert job.attempts[0].zone == A and job.attempts[0].zone_reason == "" and creates(actions)[0].mtbi_s is None


def test_placement_ordered_follows_the_list_and_stays_in_the_zone_after_a_preemption_yet_hands_the_mtbi() -> None:
    job, actions = step(None, JobSubmitted(eid(), T0, spec(placement="ordered")))
    assert job.attempts[0].zone == A and "list order (placement ordered)" in job.attempts[0].zone_reason
    assert creates(actions)[0].mtbi_s == LEARNED.mtbi_s(A, TPU, "spot", T0)
    job, _ = step(job, started(1))
    job, actions = step(job, preempted(1, A))
    assert job.attempts[-1].zone == A and creates(actions)[0].zone == A


def test_after_a_preemption_the_zone_that_took_the_machine_is_penalised() -> None:
    even = Outlook(History())  # no data: every zone alike, so only the penalty tells them apart
    job, _ = step(None, JobSubmitted(eid(), T0, spec()), outlook=even)
    assert job.attempts[0].zone == A  # ties keep the list order
    job, _ = step(job, started(1), outlook=even)
    job, actions = step(job, preempted(1, A), T0 + 60, outlook=even)
    assert job.status is Status.RECOVERING and job.attempts[-1].zone == B
    assert f"replacing it in {B}" in job.reason
    assert actions == [DeleteMachine("llm", 1, "llm-a1", A), creates(actions)[0]]
    assert f"{B}: MTBI" in job.attempts[-1].zone_reason and f"runner-up {C}" in job.attempts[-1].zone_reason


def test_a_zone_that_just_had_no_capacity_for_the_job_is_avoided_more_than_one_that_just_preempted_it() -> None:
    """Two zones: A refused the job's first request, B's machine is then preempted. A gave nothing at all: the
    replacement stays in B (x0.2 for the preemption, against A's x0.02 for the refusal two minutes ago)."""
    even = Outlook(History())
    job, _ = step(None, JobSubmitted(eid(), T0, spec(zones=(A, B))), outlook=even)
    job, _ = step(job, capacity(1), T0 + 30, outlook=even)
    assert job.attempts[-1].zone == B
    job, _ = step(job, started(2, T0 + 90), T0 + 90, outlook=even)
    job, actions = step(job, preempted(2, B), T0 + 150, outlook=even)
    assert creates(actions)[0].zone == B and f"runner-up {A} at 0.006" in job.attempts[-1].zone_reason
    job, _ = step(job, started(3, T0 + 200), T0 + 200, outlook=even)
    job, actions = step(job, preempted(3, B), T0 + 12 * HOUR, outlook=even)
    assert creates(actions)[0].zone == A  # half a day on, A's refusal has faded and B just took the machine


def test_the_penalty_fades_so_a_long_lived_zone_that_preempted_long_ago_is_chosen_again() -> None:
    job, _ = step(None, JobSubmitted(eid(), T0, spec()))
    job, _ = step(job, started(1))
    job, _ = step(job, preempted(1, C), T0 + 60)
    assert job.attempts[-1].zone == B  # C just took the machine: x0.2 for now
    job, _ = step(job, started(2, T0 + 120), T0 + 120)
    job, _ = step(job, preempted(2, B), T0 + 12 * HOUR)
    assert job.attempts[-1].zone == C  # 12 hours on, C's penalty is gone; B's is fresh


def test_after_a_stockout_the_best_untried_zone_then_a_backoff_once_every_zone_was_tried() -> None:
    job, _ = step(None, JobSubmitted(eid(), T0, spec()))
    job, _ = step(job, capacity(1))
    assert [a.zone for a in job.attempts] == [C, B] and f"no capacity this walk in {C}" in job.attempts[-1].zone_reason
    job, _ = step(job, capacity(2))
    assert [a.zone for a in job.attempts] == [C, B, A]
    job, actions = step(job, capacity(3))
    assert job.status is Status.PENDING and actions == [] and job.next_attempt_at is not None
    due = job.next_attempt_at
    job, actions = step(job, MachinesObserved(eid(), due, "llm", (), (A, B, C)), due)
    assert job.status is Status.PROVISIONING and creates(actions)[0].zone == C  # a new walk: the best zone again


def test_a_crash_is_retried_in_the_same_zone() -> None:
    job, _ = step(None, JobSubmitted(eid(), T0, spec()))
    job, _ = step(job, started(1))
    job, actions = step(job, TrainerFailed(eid(), T0, "llm", 1, "exit 1"))
    assert creates(actions)[0].zone == C and "a crash says nothing of the zone" in job.attempts[-1].zone_reason


def test_the_ranking_note_is_said_in_the_reason() -> None:
    job, _ = step(None, JobSubmitted(eid(), T0, spec()), outlook=Outlook(History(), note="history unreadable: 503"))
    assert job.attempts[0].zone_reason.endswith("; history unreadable: 503")


# -- back to Spot ------------------------------------------------------------------------------------------------


def tiered(back_after: int | None = 2 * 3600) -> JobSpec:
    return spec(
        zones=(A, B),
        hang_timeout_s=None,  # the trainer's silence on these sightings is not what they are about
        tiers=(
            Tier("spot", (A, B), after_preemptions=1),
            Tier("standard", (C,), back_to_spot_after_s=back_after),
        ),
    )


def on_standard(outlook: Outlook | None, back_after: int | None = 2 * 3600) -> Job:
    """Preempted once on Spot at T0 + 60, so on the standard tier in C, its trainer running since T0 + 120."""
    job, _ = step(None, JobSubmitted(eid(), T0, tiered(back_after)), outlook=outlook)
    job, _ = step(job, started(1), outlook=outlook)
    job, _ = step(job, preempted(1, job.attempts[0].zone), T0 + 60, outlook=outlook)
    assert job.tier_index == 1 and job.attempts[-1].zone == C
    job, _ = step(job, started(2, T0 + 120), T0 + 120, outlook=outlook)
    return job


SPOT_LASTS = Outlook(history((A, 100, 1), (B, 100, 1)))  # about 50 h between interruptions


def test_a_fallback_goes_back_to_spot_on_a_sweep_once_it_ran_its_time_and_spot_lasts() -> None:
    job = on_standard(SPOT_LASTS)
    assert step(job, ready(job, T0 + 60 + 2 * HOUR - 1), T0 + 60 + 2 * HOUR - 1, SPOT_LASTS)[1] == []  # too soon
    now = T0 + 60 + 2 * HOUR
    new, actions = step(job, ready(job, now), now, SPOT_LASTS)
    assert new.status is Status.RECOVERING and new.tier_index == 0 and new.counters == job.counters
    assert new.attempts[1].end_reason is EndReason.BACK_TO_SPOT
    assert actions == [DeleteMachine("llm", 2, "llm-a2", C), creates(actions)[0]]
    assert creates(actions)[0].tier == 0 and new.reason.startswith("back to Spot after 2.0h on the standard tier")


def test_no_back_to_spot_while_spot_is_short_lived_or_without_an_outlook_or_when_the_tier_says_never() -> None:
    now = T0 + 10 * HOUR
    short = Outlook(history((A, 4, 4), (B, 4, 4)))  # hourly interruptions
    job = on_standard(short)
    assert step(job, ready(job, now), now, short)[1] == []
    job = on_standard(None)
    assert step(job, ready(job, now), now, None)[1] == []
    job = on_standard(SPOT_LASTS, back_after=None)
    assert step(job, ready(job, now), now, SPOT_LASTS)[1] == []


def test_a_fallback_attempt_that_ends_after_its_time_is_replaced_on_spot() -> None:
    job = on_standard(SPOT_LASTS)
    now = T0 + 3 * HOUR
    new, actions = step(job, TrainerFailed(eid(), now, "llm", 2, "exit 1"), now, SPOT_LASTS)
    assert new.tier_index == 0 and creates(actions)[0].tier == 0 and new.counters.failures == 1


def test_back_on_spot_the_move_on_rule_counts_afresh() -> None:
    job = on_standard(SPOT_LASTS)
    now = T0 + 3 * HOUR
    job, _ = step(job, ready(job, now), now, SPOT_LASTS)
    job, _ = step(job, started(3, now), now, SPOT_LASTS)
    assert job.tier_index == 0
    job, _ = step(job, preempted(3, job.attempts[-1].zone), now + 60, SPOT_LASTS)
    assert job.tier_index == 1  # one preemption since it came back, as after_preemptions says


# -- observations for the history ----------------------------------------------------------------------------------


def test_an_ended_attempt_that_ran_leaves_one_observation_and_a_stockout_none() -> None:
    job, _ = step(None, JobSubmitted(eid(), T0, spec()))
    job, _ = step(job, capacity(1))
    assert job.observations == ()
    job, _ = step(job, started(2, T0 + 10), T0 + 10)
    job, _ = step(job, preempted(2, B), T0 + 3610)
    assert [Observation.from_dict(o) for o in job.observations] == [
        Observation("llm/2", Key(B, TPU, "spot"), 3600.0, 1, T0 + 3610)
    ]
    assert step(job, preempted(2, B), T0 + 3700)[0].observations == job.observations  # stale: nothing more


def test_without_an_outlook_no_observation_is_kept() -> None:
    job, _ = step(None, JobSubmitted(eid(), T0, spec()), outlook=None)
    job, _ = step(job, started(1), outlook=None)
    job, _ = step(job, preempted(1, A), T0 + 60, outlook=None)
    assert job.observations == ()
