"""decide with zones that do not offer the job's machine: each is a stockout that never ends, skipped from the
create it refused on, and a job none of whose zones offers its machine fails saying so."""

from __future__ import annotations

import itertools
from dataclasses import replace

from respawn.actions import Action, CreateMachine
from respawn.decide import decide
from respawn.events import CreateFailed, CreateFailure, JobEvent, JobSubmitted, MachinesObserved
from respawn.jobs import LEGAL_TRANSITIONS, EndReason, Job, JobSpec, Status, Tier, TpuMachine
from respawn.outlook import History, Outlook
from respawn.policy import Policy, backoff_s

A, B, C = "us-east5-a", "us-east5-b", "us-central1-a"
T0 = 1_000_000.0
DEADLINE = T0 + 48 * 3600
POLICY = Policy()
REFUSED = "Machine type with name 'ct6e-standard-4t' does not exist in zone"
_ids = itertools.count(1)


def eid() -> str:
    return f"z{next(_ids)}"


def spec(**overrides: object) -> JobSpec:
    base = JobSpec("llm", TpuMachine("v6e-16", api="compute"), (A, B), "r/trainer:1", "gs://b/runs/llm")
    return replace(base, **overrides)


def submitted(s: JobSpec) -> JobSubmitted:
    return JobSubmitted(eid(), T0, s)


def step(
    job: Job | None, event: JobEvent, now: float = T0, outlook: Outlook | None = None
) -> tuple[Job | None, list[Action]]:
    new, actions = decide(job, event, now, POLICY, outlook=outlook)
    if new is not None and (job is None or new.status != job.status):
        assert new.status in LEGAL_TRANSITIONS[job.status if job else None]
    return new, actions


def run(job: Job | None, *events: JobEvent, now: float = T0) -> Job:
    for event in events:
        job, _ = step(job, event, now)
    assert job is not None
    return job


def capacity(n: int) -> CreateFailed:
    return CreateFailed(eid(), T0, "llm", n, CreateFailure.CAPACITY, "ZONE_RESOURCE_POOL_EXHAUSTED")


def unoffered(n: int) -> CreateFailed:
    return CreateFailed(eid(), T0, "llm", n, CreateFailure.UNOFFERED, REFUSED)


def test_a_zone_that_does_not_offer_the_machine_is_skipped_in_every_later_walk() -> None:
    job = run(None, submitted(spec(zones=(A, B, C))))
    job, actions = step(job, unoffered(1), T0)
    assert job is not None and job.status is Status.PROVISIONING
    assert actions == [CreateMachine("llm", 2, "llm-a2", B, deadline=DEADLINE)]
    first = job.attempts[0]
    assert (first.end_reason, first.error) == (EndReason.UNOFFERED, REFUSED)
    assert job.reason.startswith(f"{A} does not offer the machine: {REFUSED}; trying {B}")
    job = run(job, capacity(2), now=T0)
    assert job.current is not None and job.current.zone == C
    job, actions = step(job, capacity(3), T0)  # B and C walked: A is not waited for
    assert job is not None and job.status is Status.PENDING and actions == []
    wait = backoff_s("llm", 0, POLICY)
    job, actions = step(job, MachinesObserved(eid(), T0, "llm", (), ()), T0 + wait)
    assert actions == [CreateMachine("llm", 4, "llm-a4", B, deadline=DEADLINE)]  # A skipped: B, not A
    job = run(job, capacity(4), capacity(5), now=T0 + wait)
    assert job.status is Status.PENDING and [a.zone for a in job.attempts] == [A, B, C, B, C]


def test_a_job_none_of_whose_zones_offers_its_machine_fails_saying_so() -> None:
    job = run(None, submitted(spec(zones=(A, B))), unoffered(1))
    job, actions = step(job, unoffered(2), T0)
    assert job is not None and job.status is Status.FAILED and actions == []
    assert job.reason.endswith("no zone of the spot tier offers it")
    assert job.counters.capacity_errors == 2


def test_a_tier_whose_zones_do_not_offer_the_machine_gives_way_to_the_next() -> None:
    tiers = (Tier("spot", (A,), after_preemptions=3), Tier("standard", (B,)))
    job = run(None, submitted(spec(tiers=tiers, zones=(A,))))
    job, actions = step(job, unoffered(1), T0)
    assert job is not None and job.status is Status.PROVISIONING and job.tier_index == 1
    assert actions == [CreateMachine("llm", 2, "llm-a2", B, deadline=DEADLINE, tier=1)]


def test_ranked_placement_never_ranks_a_zone_that_does_not_offer_the_machine() -> None:
    """With an outlook (placement ranked, the default), a refused zone, whose refusal decays, is never chosen again:
    not after a full walk of the others, not hours later."""
    even = Outlook(History())  # no data: every zone alike, list order breaks ties
    job, _ = step(None, submitted(spec(zones=(A, B, C))), outlook=even)
    job, actions = step(job, unoffered(1), outlook=even)
    assert [a.zone for a in actions if isinstance(a, CreateMachine)] == [B]
    job, _ = step(job, capacity(2), outlook=even)
    job, _ = step(job, capacity(3), outlook=even)
    assert job is not None and job.status is Status.PENDING and [a.zone for a in job.attempts] == [A, B, C]
    later = T0 + 10 * 3600  # every penalty has decayed
    job, actions = step(job, MachinesObserved(eid(), later, "llm", (), ()), later, outlook=even)
    assert [a.zone for a in actions if isinstance(a, CreateMachine)] == [B]


def test_a_zone_without_one_tiers_machine_is_still_tried_for_a_tier_of_another_machine() -> None:
    """A refusal is of one machine type: the next tier's own machine is asked for in that zone all the same."""
    other = TpuMachine("v6e-8", api="compute")
    tiers = (Tier("spot", (A,)), Tier("spot", (A, B), machine=other))
    job = run(None, submitted(spec(tiers=tiers, zones=(A,))))
    job, actions = step(job, unoffered(1), T0)
    assert job is not None and job.status is Status.PROVISIONING and job.tier_index == 1
    assert actions == [CreateMachine("llm", 2, "llm-a2", A, deadline=DEADLINE, tier=1)]
