"""The rules of a job of several slices (machine.slices > 1): decide's for it, pure like decide.

The job trains as one world of its live member slices (respawn.jobs.World, docs/design/several-slices.md). Each
slice has its own line of attempts in the one record (Attempt.slice; machine names stay JOB-aN, N counting every
slice's attempts), all in the job's zone. What the rules decide, for an event about slice i's live attempt:

* slice i's trainer started, trained or saved: the attempt's progress;
* its trainer failed: the world broke (a crash breaks every process's collectives), so the same members form the
  next world in place, on the machines they run, counted as one failure; the failures of an older world are none;
* its notice, its preemption, or its machine dead (in a listing, or under its failed trainer): the world goes on
  without i while min_slices are left (the new world to every survivor, i's replacement requested, to join later);
  with fewer left, every slice anew, a version up (every machine deleted and made again: the whole job recovers, as
  a job of one slice does);
* its replacement's `ready` (set up, not a member): the world with i, told to every member and the newcomer;
* its create failed: nothing now, the world trains on without it, and a listing asks for it again;
* `completed` of any member: SUCCEEDED, every machine deleted.

Every change is a new world version, and each rule is a no-op for an event it has already applied: a second notice
of slice i finds i out of the world, a second `ready` finds it in, an event of an attempt that is over changes
nothing. A noticed slice's machine is kept for the world's one-step save (it drains) until its trainer's last entry
or a listing after its drain, as a head start's is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from respawn.actions import Action, DeleteMachine, SetWorld
from respawn.events import (
    CancelRequested,
    CheckpointSaved,
    CreateFailed,
    JobEvent,
    MachineNoticed,
    MachinePreempted,
    MachinesObserved,
    TrainerCompleted,
    TrainerFailed,
    TrainerProgressed,
    TrainerReady,
    TrainerStarted,
)
from respawn.jobs import Attempt, EndReason, Job, Status, World, parse_machine_name
from respawn.listing_policy import DEAD
from respawn.machine import notice_s
from respawn.next_attempt import new_attempt
from respawn.policy import Context, backoff_s
from respawn.transitions import Decision, create_machine

Rule = Callable[[Job, Attempt, Any, float, Context], Decision]


def several_slices(job: Job) -> bool:
    return job.spec is not None and job.spec.machine.slices > 1


def first_machines(job: Job, now: float, ctx: Context) -> Decision:
    """A submitted job's world: every slice's first machine, in the zone the first one's placement picks, world 1."""
    assert job.spec is not None
    return _every_slice(replace(job, world=World.first(job.spec.machine.slices)), now, ctx, 0)


def step(job: Job, event: JobEvent, now: float, ctx: Context) -> Decision:
    """The job's next record and actions for `event` (a seen event never comes here: decide checks)."""
    if not job.status.terminal and now >= job.deadline:
        return finish(job, now, Status.EXPIRED, EndReason.EXPIRED, "the ttl ran out")
    job, drained = _drains_over(job, event, now)
    if job.status.terminal:
        return job, drained
    if isinstance(event, CancelRequested):
        decided = finish(job, now, Status.CANCELLED, EndReason.CANCELLED, "cancelled by the user")
    elif isinstance(event, MachinesObserved):
        decided = _listed(job, event, now, ctx)
    else:
        attempt = _live(job, getattr(event, "attempt", None))
        rule = RULES.get(type(event))
        decided = rule(job, attempt, event, now, ctx) if attempt is not None and rule is not None else (job, [])
    return decided[0], [*drained, *decided[1]]


def finish(job: Job, now: float, status: Status, end_reason: EndReason, reason: str) -> Decision:
    """The job is over: every live attempt ends and every machine still there (a draining one too) is deleted."""
    actions: list[Action] = []
    for a in job.attempts:
        if not a.machine_deleted:
            actions.append(DeleteMachine(job.job_id, a.n, a.machine, a.zone))
            ended = a if a.ended else replace(a, ended_at=now, end_reason=end_reason)
            job = job.with_attempt(replace(ended, machine_deleted=True))
    return replace(job, status=status, reason=reason, next_attempt_at=None), actions


# -- the rules of the live attempt an event names ----------------------------------------------------------------


def _started(job: Job, a: Attempt, event: TrainerStarted, now: float, ctx: Context) -> Decision:
    started = replace(a, started_at=a.started_at or event.time, restored_step=event.restored_step)
    started = _progressed(started, event.time, event.restored_step)
    world = job.world
    reason = f"trainer running on {len(world.members) if world else 1} slices (world {world.version if world else 1})"
    return replace(job.with_attempt(started), status=Status.RUNNING, reason=reason), []


def _trained(job: Job, a: Attempt, event: CheckpointSaved | TrainerProgressed, now: float, ctx: Context) -> Decision:
    if isinstance(event, CheckpointSaved) and (a.checkpoint_at or 0.0) < event.time:
        a = replace(a, checkpoint_at=event.time)
    return job.with_attempt(_progressed(a, event.time, event.step)), []


def _noticed(job: Job, a: Attempt, event: MachineNoticed, now: float, ctx: Context) -> Decision:
    """The notice: the world saves at one step and re-forms without the slice, whose machine drains meanwhile. A
    machine not in the world (a replacement not let in yet) has nothing to save: it goes at once."""
    assert job.spec is not None and job.world is not None
    if a.slice not in job.world.members or a.started_at is None:
        return _slice_lost(job, a, now, ctx, f"{a.machine} noticed")
    window = (notice_s(job.spec.machine.kind) + (job.spec.preemption_notice_s or 0)) * ctx.policy.time_scale
    drain_until = event.time + window + ctx.policy.drain_margin_s * ctx.policy.time_scale
    return _slice_lost(job, a, now, ctx, f"{a.machine} noticed", drain_until=drain_until)


def _preempted(job: Job, a: Attempt, event: MachinePreempted, now: float, ctx: Context) -> Decision:
    return _slice_lost(job, a, now, ctx, f"{a.machine} preempted")


def _failed(job: Job, a: Attempt, event: TrainerFailed, now: float, ctx: Context) -> Decision:
    """A member's trainer failed. A machine the API shows dead was lost. Otherwise the world broke, whoever failed
    first (a peer's crash breaks every process's collectives, so every member's trainer fails): one failure, counted
    against max_failures, and the same members form the next world in place, on the machines they run (no machine
    is made); the failures of a world older than the job's are that break's echoes, not failures."""
    if event.machine_state in DEAD:
        return _slice_lost(job, a, now, ctx, f"{a.machine} lost")
    world, spec = job.world, job.spec
    assert world is not None and spec is not None
    if event.world is not None and event.world < world.version:
        return job, []
    error = f"trainer failed on {a.machine}" + (f": {event.error}" if event.error else "")
    failures = job.counters.failures + 1
    job = replace(job, counters=replace(job.counters, failures=failures))
    if event.permanent or failures >= spec.max_failures:
        why = " (permanent: not retried)" if event.permanent else f" (failure {failures} of {spec.max_failures})"
        return finish(job, now, Status.FAILED, EndReason.FAILED, error + why)
    again = World(world.version + 1, world.members)
    job = replace(job, world=again, reason=f"{error}; the world forms again in place (world {again.version})")
    return job, _told(job, again)


def _ready(job: Job, a: Attempt, event: TrainerReady, now: float, ctx: Context) -> Decision:
    """A replacement is set up and waits to be let in: the world takes it at the next step."""
    world = job.world
    if world is None or a.slice in world.members:
        return job, []
    joined = world.joined(a.slice)
    job = replace(
        job, world=joined, reason=f"slice {a.slice} is back: {len(joined.members)} slices, world {joined.version}"
    )
    return job, _told(job, joined)


def _completed(job: Job, a: Attempt, event: TrainerCompleted, now: float, ctx: Context) -> Decision:
    done, actions = finish(job, now, Status.SUCCEEDED, EndReason.COMPLETED, "")
    return replace(done, result=dict(event.result)), actions


def _create_failed(job: Job, a: Attempt, event: CreateFailed, now: float, ctx: Context) -> Decision:
    """No machine for the slice: the world trains on without it, and a listing asks again. A world that cannot
    form without it (fewer than min_slices) gives back every machine and waits out a capacity backoff (a listing
    makes every slice again when it is over, in the next zone): never a storm of creates."""
    if a.started_at is not None:
        return job, []
    failed = replace(a, ended_at=now, end_reason=EndReason.CAPACITY, machine_deleted=True, error=event.error)
    job = job.with_attempt(failed)
    job = replace(job, counters=replace(job.counters, capacity_errors=job.counters.capacity_errors + 1))
    world, spec = job.world, job.spec
    assert world is not None and spec is not None
    why = f"no capacity for slice {a.slice} in {a.zone}"
    survivors = world.without(a.slice)
    if len(survivors.members) >= spec.machine.min_slices:
        job = replace(job, world=survivors, reason=f"{why}; training on without it")
        return job, _told(job, survivors)
    actions: list[Action] = []
    for other in job.attempts:
        if not other.ended:
            actions.append(DeleteMachine(job.job_id, other.n, other.machine, other.zone))
            gone = replace(other, ended_at=now, end_reason=EndReason.CAPACITY, machine_deleted=True)
            job = job.with_attempt(gone)
    wait = backoff_s(job.job_id, job.capacity_round, ctx.policy)
    zones = job.current_tier.zones
    return replace(
        job,
        status=Status.PENDING,
        world=World(world.version + 1, tuple(range(spec.machine.slices))),
        zone_index=(job.zone_index_of(a.zone) + 1) % len(zones),
        capacity_round=job.capacity_round + 1,
        next_attempt_at=now + wait,
        reason=f"{why}; fewer than min_slices={spec.machine.min_slices} can form: next try in {wait:.0f}s",
    ), actions


RULES: dict[type, Rule] = {
    TrainerStarted: _started,
    CheckpointSaved: _trained,
    TrainerProgressed: _trained,
    MachineNoticed: _noticed,
    MachinePreempted: _preempted,
    TrainerFailed: _failed,
    TrainerReady: _ready,
    TrainerCompleted: _completed,
    CreateFailed: _create_failed,
}


# -- a slice lost, the job anew, a listing ------------------------------------------------------------------------


def _slice_lost(
    job: Job,
    a: Attempt,
    now: float,
    ctx: Context,
    why: str,
    *,
    drain_until: float | None = None,
    end_reason: EndReason = EndReason.PREEMPTED,
    counted: bool = True,
) -> Decision:
    """Slice `a.slice` left: the survivors re-form without it (told at once), its replacement is requested in the
    job's zone and joins when it is ready; below min_slices the whole job starts over."""
    spec, world = job.spec, job.world
    assert spec is not None and world is not None
    ended = replace(
        a, ended_at=now, end_reason=end_reason, machine_deleted=drain_until is None, drain_until=drain_until
    )
    job = job.with_attempt(ended)
    actions: list[Action] = [] if drain_until is not None else [DeleteMachine(job.job_id, a.n, a.machine, a.zone)]
    if counted:
        job = replace(job, counters=replace(job.counters, preemptions=job.counters.preemptions + 1))
        limit = spec.max_preemptions
        if limit is not None and job.counters.preemptions > limit:
            over = f"{why}; {job.counters.preemptions} preemptions exceed max_preemptions={limit}"
            done, deletes = finish(job, now, Status.FAILED, end_reason, over)
            return done, [*actions, *deletes]
    survivors = world.without(a.slice)
    if len(survivors.members) < spec.machine.min_slices:
        job, anew = _anew(job, now, ctx, why)
        return job, [*actions, *anew]
    job = replace(
        job, world=survivors, reason=f"{why}; {len(survivors.members)} slices train on, its replacement asked"
    )
    told = _told(job, survivors)
    job, replacement = _attempt_for(job, a.slice, now, ctx)
    return job, [*actions, *told, create_machine(job, replacement, world=survivors)]


def _anew(job: Job, now: float, ctx: Context, why: str) -> Decision:
    """Fewer than min_slices could train: every live machine goes and every slice is made again, as one world a
    version up."""
    actions: list[Action] = []
    for a in job.attempts:
        if not a.ended:
            actions.append(DeleteMachine(job.job_id, a.n, a.machine, a.zone))
            job = job.with_attempt(replace(a, ended_at=now, end_reason=EndReason.PREEMPTED, machine_deleted=True))
    spec, world = job.spec, job.world
    assert spec is not None and world is not None
    job = replace(job, world=World(world.version + 1, tuple(range(spec.machine.slices))), status=Status.RECOVERING)
    job, creates = _every_slice(job, now, ctx, job.zone_index)
    why = f"{why}; fewer than min_slices={spec.machine.min_slices} left: every slice anew"
    return replace(job, reason=why), [*actions, *creates]


def _listed(job: Job, event: MachinesObserved, now: float, ctx: Context) -> Decision:
    """A listing: a machine of no live or draining attempt is deleted; a member's dead or missing machine is lost
    (missing only where its zone was listed whole); a slice with no attempt at all is asked for again."""
    if job.status is Status.PENDING:  # a capacity backoff: every slice again once it is over
        due = job.next_attempt_at is None or now >= job.next_attempt_at
        return _every_slice(replace(job, status=Status.PROVISIONING), now, ctx, job.zone_index) if due else (job, [])
    listed = {name: state for name, _, state in event.machines}
    actions: list[Action] = []
    kept = {a.machine for a in job.attempts if not a.ended or a.draining}
    for name, zone, _state in sorted(event.machines):
        parsed = parse_machine_name(name)
        if parsed is not None and parsed[0] == job.job_id and name not in kept and _made(job, parsed[1]):
            actions.append(DeleteMachine(job.job_id, parsed[1], name, zone))
    for a in sorted(_live_by_slice(job).values(), key=lambda a: a.n):
        state = listed.get(a.machine)
        if (state in DEAD) or (state is None and a.zone in event.zones and a.started_at is not None):
            job, more = _slice_lost(job, a, now, ctx, f"{a.machine} {'gone' if state is None else state}")
            actions += more
            if job.status.terminal or job.status is Status.RECOVERING:
                return job, actions
    job, more = _missing_asked_again(job, now, ctx)
    return job, [*actions, *more]


def _missing_asked_again(job: Job, now: float, ctx: Context) -> Decision:
    """Slices with no live attempt (their create found no capacity) are asked for again, in the job's zone."""
    spec, world = job.spec, job.world
    assert spec is not None and world is not None
    live, actions = _live_by_slice(job), list[Action]()
    for i in range(spec.machine.slices):
        if i not in live:
            job, attempt = _attempt_for(job, i, now, ctx)
            actions.append(create_machine(job, attempt, world=world))
    return job, actions


# -- helpers ------------------------------------------------------------------------------------------------------


def _every_slice(job: Job, now: float, ctx: Context, zone_index: int) -> Decision:
    """Each slice's new attempt: the first placed by new_attempt, the others in its zone; told the job's world."""
    spec, world = job.spec, job.world
    assert spec is not None and world is not None
    job, first = new_attempt(job, now, ctx, zone_index)
    job = job.with_attempt(replace(first, slice=0))
    creates: list[Action] = [create_machine(job, first, world=world)]
    for i in range(1, spec.machine.slices):
        job, attempt = _attempt_for(job, i, now, ctx)
        creates.append(create_machine(job, attempt, world=world))
    return replace(job, reason=f"{len(creates)} slices requested in {first.zone}"), creates


def _attempt_for(job: Job, slice_: int, now: float, ctx: Context) -> tuple[Job, Attempt]:
    """Slice `slice_`'s next attempt, in the job's zone (a world's slices talk over the zone's network)."""
    job, attempt = new_attempt(job, now, ctx, job.zone_index, same_zone=True)
    attempt = replace(attempt, slice=slice_)
    return job.with_attempt(attempt), attempt


def _told(job: Job, world: World) -> list[Action]:
    """The world's metadata write to every live attempt's machine: members re-form, a waiting newcomer learns it is
    in (or still out)."""
    value = world.to_json()
    return [
        SetWorld(job.job_id, a.n, a.machine, a.zone, value)
        for a in sorted(_live_by_slice(job).values(), key=lambda a: a.n)
    ]


def _live_by_slice(job: Job) -> dict[int, Attempt]:
    return {a.slice: a for a in job.attempts if not a.ended}


def _live(job: Job, n: int | None) -> Attempt | None:
    return next((a for a in job.attempts if a.n == n and not a.ended), None) if n is not None else None


def _made(job: Job, n: int) -> bool:
    """Attempt n is one of the record's (a listing may be older or newer than the record)."""
    return any(a.n == n for a in job.attempts)


def _progressed(a: Attempt, at: float, step: int | None) -> Attempt:
    if a.progress_at is None or a.progress_at < at:
        a = replace(a, progress_at=at)
    if step is not None and (a.last_step is None or a.last_step < step):
        a = replace(a, last_step=step)
    return a


def _drains_over(job: Job, event: JobEvent, now: float) -> Decision:
    """A draining slice's machine is deleted once its drain is over: its trainer's last entry came, a listing came
    after its drain_until, or the job is over."""
    actions: list[Action] = []
    for a in job.attempts:
        if not a.draining or a.drain_until is None:
            continue
        last = isinstance(event, (TrainerCompleted, TrainerFailed)) or (
            isinstance(event, CheckpointSaved) and event.final
        )
        over = (
            job.status.terminal
            or (isinstance(event, MachinesObserved) and now >= a.drain_until)
            or (last and getattr(event, "attempt", None) == a.n)
        )
        if over:
            job = job.with_attempt(replace(a, machine_deleted=True))
            actions.append(DeleteMachine(job.job_id, a.n, a.machine, a.zone))
    return job, actions
