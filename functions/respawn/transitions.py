"""How a decision ends the live attempt and what comes next: the transitions decide's rules and the listing's end in.

A machine lost (`lost`: preempted or vanished, replaced), a trainer that crashed (`crashed`: retried in the same
zone), no capacity (`no_capacity`: another zone, the next tier, or a backoff), the job over (`finish`). Each ends the
live attempt and returns the record with the actions it takes, a machine's delete before any create. Where the
replacement goes is respawn.next_attempt's. Pure, like decide.
"""

from __future__ import annotations

from dataclasses import replace

from respawn.actions import Action, CreateMachine, DeleteMachine
from respawn.jobs import Attempt, EndReason, Job, Status, World
from respawn.next_attempt import new_attempt, next_tier, offered_zones, spot_tier_to_return_to, walk_over
from respawn.policy import Context, backoff_s

Decision = tuple[Job, list[Action]]


def lost(job: Job, now: float, end_reason: EndReason, ctx: Context, *, drain_until: float | None = None) -> Decision:
    """The live machine was preempted or vanished: delete it, replace it (the same zone in list order, else where
    the outlook ranks best with this zone penalised). Counts against max_preemptions, never against max_failures:
    the cloud took it, the trainer did nothing wrong. With `drain_until` (a head start on its notice) the machine is
    kept for its final save until its drain is over (decide's _drain_over), and the replacement goes to another zone."""
    live, spec = job.live, job.spec
    assert live is not None and spec is not None
    job = end_attempt(job, now, end_reason, drain_until=drain_until)
    job = replace(job, counters=replace(job.counters, preemptions=job.counters.preemptions + 1))
    delete = DeleteMachine(job.job_id, live.n, live.machine, live.zone)
    limit = spec.max_preemptions
    if limit is not None and job.counters.preemptions > limit:
        reason = f"{live.machine} {end_reason}; {job.counters.preemptions} preemptions exceed max_preemptions={limit}"
        return replace(mark_deleted(job, live.n), status=Status.FAILED, reason=reason), [delete]
    avoid = live.zone if drain_until is not None else None
    job, attempt = new_attempt(job, now, ctx, job.zone_index_of(live.zone), avoid=avoid)
    moved = "" if (attempt.tier, attempt.zone) == (live.tier, live.zone) else f" in {job.where(attempt)}"
    if drain_until is not None:
        reason = f"{live.machine} noticed; its replacement is requested now{moved}, to start after its final save"
        return replace(job, status=Status.RECOVERING, reason=reason), [create_machine(job, attempt)]
    return replace(job, status=Status.RECOVERING, reason=f"{live.machine} {end_reason}; replacing it{moved}"), [
        delete,
        create_machine(job, attempt),
    ]


def crashed(job: Job, now: float, end_reason: EndReason, reason: str, ctx: Context) -> Decision:
    """The trainer failed or hung (not a preemption): counts against max_failures, retried in the same zone (a
    crash says nothing of the zone). `reason` says what happened; the job's reason adds whether it is retried."""
    live, spec = job.live, job.spec
    assert live is not None and spec is not None
    job = end_attempt(job, now, end_reason)
    failures = job.counters.failures + 1
    job = replace(job, counters=replace(job.counters, failures=failures))
    delete = DeleteMachine(job.job_id, live.n, live.machine, live.zone)
    if failures >= spec.max_failures:
        return replace(job, status=Status.FAILED, reason=f"{reason} (failure {failures} of {spec.max_failures})"), [
            delete
        ]
    job, attempt = new_attempt(job, now, ctx, job.zone_index_of(live.zone), same_zone=True)
    return replace(job, status=Status.RECOVERING, reason=f"{reason}; retrying"), [delete, create_machine(job, attempt)]


def no_capacity(job: Job, now: float, end_reason: EndReason, reason: str, ctx: Context, *, delete: bool) -> Decision:
    """No machine in the live attempt's zone: try another zone not tried in this walk (the next in list order, or
    the best-ranked) or the next tier now, or after a full walk of the tier's zones wait in PENDING. `delete`: a
    machine was made (it failed or waited too long) and must go."""
    live = job.live
    assert live is not None and job.spec is not None
    zones = job.current_tier.zones
    job = end_attempt(job, now, end_reason)
    job = replace(job, counters=replace(job.counters, capacity_errors=job.counters.capacity_errors + 1))
    actions: list[Action] = [DeleteMachine(job.job_id, live.n, live.machine, live.zone)] if delete else []
    following = (job.zone_index_of(live.zone) + 1) % len(zones)
    if not offered_zones(job) and next_tier(job, now) is None:  # no zone left that offers the machine
        return replace(job, status=Status.FAILED, reason=f"{reason}; no zone of {job.tier_name} offers it"), actions
    walked = walk_over(job)
    if walked and next_tier(job, now) is None and spot_tier_to_return_to(job, now, ctx) is None:
        wait = backoff_s(job.job_id, job.capacity_round, ctx.policy)
        return replace(
            job,
            status=Status.PENDING,
            zone_index=following,
            capacity_round=job.capacity_round + 1,
            next_attempt_at=now + wait,
            reason=f"{reason}; no capacity in any zone, next try in {wait:.0f}s",
        ), actions
    job, attempt = new_attempt(job, now, ctx, following)
    return replace(job, reason=f"{reason}; trying {job.where(attempt)}"), [*actions, create_machine(job, attempt)]


def finish(job: Job, now: float, status: Status, end_reason: EndReason, reason: str) -> Decision:
    """End the job: end the live attempt and delete its machine."""
    live = job.live
    actions: list[Action] = []
    if live is not None:
        job = end_attempt(job, now, end_reason)
        actions.append(DeleteMachine(job.job_id, live.n, live.machine, live.zone))
    return replace(job, status=status, reason=reason, next_attempt_at=None), actions


def end_attempt(job: Job, now: float, end_reason: EndReason, *, drain_until: float | None = None) -> Job:
    """The current attempt ended; its machine is deleted with it (the delete is among the decision's actions, or
    there never was a machine), or with `drain_until` kept for its final save (a head start)."""
    current = job.current
    assert current is not None
    ended = replace(current, ended_at=now, end_reason=end_reason, machine_deleted=drain_until is None)
    return job.with_attempt(replace(ended, drain_until=drain_until))


def mark_deleted(job: Job, n: int) -> Job:
    for attempt in job.attempts:
        if attempt.n == n and not attempt.machine_deleted:
            return job.with_attempt(replace(attempt, machine_deleted=True))
    return job


def create_machine(job: Job, attempt: Attempt, *, world: World | None = None) -> CreateMachine:
    """The attempt's create; while an older attempt drains (a head start), its trainer starts after that drain. A
    slice of a world (respawn.worlds) is told its slice and the world; it joins when the world takes it in."""
    if world is not None:
        return CreateMachine(
            job.job_id,
            attempt.n,
            attempt.machine,
            attempt.zone,
            deadline=job.deadline,
            tier=attempt.tier,
            mtbi_s=attempt.mtbi_s,
            slice=attempt.slice,
            world=world.to_json(),
        )
    draining = job.draining
    return CreateMachine(
        job.job_id,
        attempt.n,
        attempt.machine,
        attempt.zone,
        deadline=job.deadline,
        tier=attempt.tier,
        mtbi_s=attempt.mtbi_s,
        start_after=draining.drain_until if draining is not None else None,
    )
