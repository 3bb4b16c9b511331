"""What a listing of a job's machines decides: decide's rule for MachinesObserved (a sweep's or a zone wake-up's).

Every listed machine of an older attempt is deleted (a draining one is spared), even for a job that is over; then a
job waiting out a capacity backoff requests its machine once it is due, and the live attempt's machine is judged by
its listed state: the first of LIVE_MACHINE_RULES whose state is the machine's and whose guard holds decides, one
row per case (missing once its zone was listed completely, taken, failed to come up, queued or creating too long,
hung, back to Spot). Each ends in one of respawn.transitions. Pure, like decide.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from respawn.actions import Action, DeleteMachine
from respawn.events import MachinesObserved
from respawn.jobs import Attempt, EndReason, Job, MachineState, Status, parse_machine_name
from respawn.next_attempt import new_attempt, on_tier_since, spot_tier_to_return_to
from respawn.policy import Context, Policy
from respawn.transitions import Decision, crashed, create_machine, end_attempt, lost, mark_deleted, no_capacity

# What the API says of a machine that no longer runs anything: its attempt was lost, not failed.
DEAD = frozenset({MachineState.PREEMPTED, MachineState.TERMINATED, MachineState.FAILED})


def zones_to_watch(job: Job | None, zone: str | None) -> tuple[str, ...]:
    """Where to look for a job's machines: a wake-up's `zone`, or (None) every zone of its spec; nowhere without one."""
    if job is None or job.spec is None:
        return ()
    return job.spec.every_zone if zone is None else (zone,)


def machines_listed(job: Job, event: MachinesObserved, now: float, ctx: Context) -> Decision:
    """What the API lists: every machine of an older attempt still there is deleted (even for a job that is over);
    then a job waiting out a capacity backoff requests its machine once it is due, and for a live attempt the
    first rule about its machine that holds (LIVE_MACHINE_RULES) decides."""
    live = job.live
    job, deletes = _orphans_deleted(job, event, live)
    if job.status.terminal:
        return job, deletes
    if live is None:
        job, more = _backoff_over(job, now, ctx)
    else:
        job, more = _live_machine_rules(_Listed(job, live, _state_of(job, live, event), event, now, ctx))
    return job, deletes + more


def _orphans_deleted(job: Job, event: MachinesObserved, live: Attempt | None) -> tuple[Job, list[Action]]:
    """Deletes for the listed machines of this job's attempts other than the live one (not of later attempts: a
    listing may be older than the record), each marked deleted; a draining machine is spared (decide's _drain_over)."""
    current_n = job.current.n if job.current else 0
    draining = job.draining
    deletes: list[Action] = []
    for name, zone, state in sorted(event.machines):
        parsed = parse_machine_name(name)
        if parsed is None or parsed[0] != job.job_id or parsed[1] > current_n:
            continue
        n = parsed[1]
        spared = (live is not None and n == live.n) or (draining is not None and n == draining.n)
        if not spared and state is not MachineState.DELETING:
            deletes.append(DeleteMachine(job.job_id, n, name, zone))
            job = mark_deleted(job, n)
    return job, deletes


def _state_of(job: Job, live: Attempt, event: MachinesObserved) -> MachineState | None:
    """The listed state of the live attempt's machine (the last in name order, should two zones list it); None
    when the listing does not show it."""
    states = [state for name, _, state in sorted(event.machines) if parse_machine_name(name) == (job.job_id, live.n)]
    return states[-1] if states else None


def _backoff_over(job: Job, now: float, ctx: Context) -> Decision:
    """A PENDING job whose capacity backoff is over requests its next machine."""
    due = job.status is Status.PENDING and job.next_attempt_at is not None and job.next_attempt_at <= now
    if not due or job.spec is None:
        return job, []
    job, attempt = new_attempt(job, now, ctx, job.zone_index)
    return replace(job, status=Status.PROVISIONING, reason=f"machine requested in {job.where(attempt)}"), [
        create_machine(job, attempt)
    ]


# -- the live attempt's machine, as a listing shows it: a rule per state ----------------------------------------------


@dataclass(frozen=True)
class _Listed:
    """The live attempt's machine as one listing showed it, with what the rules about it read."""

    job: Job
    live: Attempt
    state: MachineState | None  # None: the listing does not show the machine
    event: MachinesObserved
    now: float
    ctx: Context

    @property
    def policy(self) -> Policy:
        return self.ctx.policy

    @property
    def age(self) -> float:
        """Seconds since the live attempt's machine was requested."""
        return self.now - self.live.requested_at


@dataclass(frozen=True)
class _MachineRule:
    """When the live machine is in `state` (None: not listed) and `holds`, `then` decides."""

    state: MachineState | None
    holds: Callable[[_Listed], bool]
    then: Callable[[_Listed], Decision]


def _queue_timeout(job: Job) -> float:
    """How long the machine may wait QUEUED in one zone: a queued resource, or a flex-start request (TPU or GPU)."""
    return job.spec.machine.queue_timeout_s if job.spec else float("inf")


def _hung_for(job: Job, live: Attempt, now: float) -> float | None:
    """Seconds a RUNNING attempt's trainer has been silent, when that exceeds the job's hang_timeout."""
    timeout = job.spec.hang_timeout_s if job.spec else None
    if timeout is None or job.status is not Status.RUNNING or live.started_at is None:
        return None
    silent = now - max(live.started_at, live.progress_at or 0.0)
    return silent if silent > timeout else None


def _always(seen: _Listed) -> bool:
    return True


def _missing_for_good(seen: _Listed) -> bool:
    """Its zone was listed completely, no create of ours is in flight, and it is old enough to be listed."""
    return seen.live.zone in seen.event.zones and not seen.job.pending and seen.age >= seen.policy.lost_grace_s


def _trainer_ran(seen: _Listed) -> bool:
    return seen.live.started_at is not None


def _queued_too_long(seen: _Listed) -> bool:
    return seen.age > _queue_timeout(seen.job)


def _stuck_creating(seen: _Listed) -> bool:
    return seen.live.started_at is None and seen.age > seen.policy.stuck_creating_s


def _silent_too_long(seen: _Listed) -> bool:
    return _hung_for(seen.job, seen.live, seen.now) is not None


def _spot_lasts_again(seen: _Listed) -> bool:
    """A fallback attempt whose trainer runs, on a tier the job has used long enough, while Spot looks lasting."""
    return seen.live.started_at is not None and spot_tier_to_return_to(seen.job, seen.now, seen.ctx) is not None


def _vanished(seen: _Listed) -> Decision:
    return lost(seen.job, seen.now, EndReason.LOST, seen.ctx)


def _taken(seen: _Listed) -> Decision:
    return lost(seen.job, seen.now, EndReason.PREEMPTED, seen.ctx)


def _failed_to_come_up(seen: _Listed) -> Decision:
    live = seen.live
    api_says = dict(seen.event.details).get(live.machine)
    reason = f"{live.machine} failed to come up in {live.zone}" + (f": {api_says}" if api_says else "")
    return no_capacity(seen.job, seen.now, EndReason.CAPACITY, reason, seen.ctx, delete=True)


def _queue_given_up(seen: _Listed) -> Decision:
    reason = f"{seen.live.machine} waited {seen.age:.0f}s in the queue of {seen.live.zone}"
    return no_capacity(seen.job, seen.now, EndReason.QUEUED, reason, seen.ctx, delete=True)


def _creating_given_up(seen: _Listed) -> Decision:
    reason = f"{seen.live.machine} was still creating after {seen.age:.0f}s in {seen.live.zone}"
    return no_capacity(seen.job, seen.now, EndReason.STUCK, reason, seen.ctx, delete=True)


def _hung(seen: _Listed) -> Decision:
    silent = _hung_for(seen.job, seen.live, seen.now)
    assert silent is not None
    reason = f"hung: no training progress for {silent:.0f}s on {seen.live.machine}"
    return crashed(seen.job, seen.now, EndReason.HUNG, reason, seen.ctx)


def _back_to_spot(seen: _Listed) -> Decision:
    """End the fallback attempt (not a preemption, not a failure: no counter moves) and request Spot again."""
    live, now = seen.live, seen.now
    on_tier = now - on_tier_since(seen.job, now)
    job = end_attempt(seen.job, now, EndReason.BACK_TO_SPOT)
    job, attempt = new_attempt(job, now, seen.ctx, 0)
    reason = f"back to Spot after {on_tier / 3600:.1f}h on {seen.job.tier_name}: requested {job.where(attempt)}"
    delete = DeleteMachine(job.job_id, live.n, live.machine, live.zone)
    return replace(job, status=Status.RECOVERING, reason=reason), [delete, create_machine(job, attempt)]


# The first rule whose state is the machine's and whose guard holds decides; when none does, nothing is due yet.
LIVE_MACHINE_RULES: tuple[_MachineRule, ...] = (
    _MachineRule(None, _missing_for_good, _vanished),
    _MachineRule(MachineState.PREEMPTED, _always, _taken),
    _MachineRule(MachineState.TERMINATED, _always, _taken),
    _MachineRule(MachineState.FAILED, _trainer_ran, _taken),  # it ran, so the machine died under it
    _MachineRule(MachineState.FAILED, _always, _failed_to_come_up),
    _MachineRule(MachineState.QUEUED, _queued_too_long, _queue_given_up),
    _MachineRule(MachineState.CREATING, _stuck_creating, _creating_given_up),
    _MachineRule(MachineState.READY, _silent_too_long, _hung),
    _MachineRule(MachineState.READY, _spot_lasts_again, _back_to_spot),
)


def _live_machine_rules(seen: _Listed) -> Decision:
    rule = next((r for r in LIVE_MACHINE_RULES if r.state == seen.state and r.holds(seen)), None)
    return rule.then(seen) if rule is not None else (seen.job, [])
