"""The pure core: `decide(job, event, now, policy) -> (job, actions)`.

No I/O, no clock: time comes only from `now`. The service loads the record,
calls decide, persists the result with the actions as intent, then acts.

Order of the checks on every event: an already-seen event id changes nothing;
then the TTL (a live job past its deadline is EXPIRED and its machine deleted);
then events naming an older attempt are stale and change nothing; then the
event itself (on a SUCCEEDED job only the trainer's own `completed` entry does anything: it fills in the result
of one its startup script sent on exit code 0). Last, a trainer's goodput split is kept on the attempt its entry
names, stale or not (the only thing a stale event may change: that older attempt's split). A decision that
changes nothing returns the same record and no actions, and the event id is not recorded.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

from respawn.accounting import later_split
from respawn.actions import Action, CreateMachine, DeleteMachine
from respawn.events import (
    EXIT_CODE,
    CancelRequested,
    CheckpointSaved,
    CreateFailed,
    JobEvent,
    JobRejected,
    JobSubmitted,
    MachinePreempted,
    MachinesObserved,
    TrainerCompleted,
    TrainerFailed,
    TrainerProgressed,
    TrainerStarted,
)
from respawn.model import Attempt, Job, MachineState, Status, Tier, TpuMachine, machine_name, parse_machine_name

# Attempt end reasons that mean "this zone had no machine for us": they drive the zone walk.
NO_CAPACITY = frozenset({"capacity", "stuck", "queued"})
# What the API says of a machine that no longer runs anything: its attempt was lost, not failed.
DEAD = frozenset({MachineState.PREEMPTED, MachineState.TERMINATED, MachineState.FAILED})


@dataclass(frozen=True)
class Policy:
    backoff_base_s: float = 30.0  # wait after the first full walk of the zones without capacity
    backoff_max_s: float = 600.0  # cap of the exponential backoff (before jitter)
    jitter: float = 0.2  # the wait is scaled by a factor in [1 - jitter, 1 + jitter]
    stuck_creating_s: float = 900.0  # a machine CREATING this long is given up for the next zone
    lost_grace_s: float = 60.0  # a machine younger than this may not be listed yet: not lost
    seen_events_max: int = 256  # event ids remembered for de-duplication


def backoff_s(job_id: str, capacity_round: int, policy: Policy) -> float:
    """min(base * 2^round, max), scaled by a jitter that is a pure function of (job_id, round)."""
    wait = min(policy.backoff_base_s * float(2 ** min(capacity_round, 40)), policy.backoff_max_s)
    digest = hashlib.sha256(f"{job_id}:{capacity_round}".encode()).digest()
    unit = int.from_bytes(digest[:8], "big") / 2**64  # [0, 1)
    return wait * (1 + policy.jitter * (2 * unit - 1))


def decide(job: Job | None, event: JobEvent, now: float, policy: Policy) -> tuple[Job | None, list[Action]]:
    if job is None or (job.status is Status.REJECTED and isinstance(event, JobSubmitted)):
        return _first(event, now)  # a rejected job id may be submitted again once the message is fixed
    if event.event_id in job.seen_events:
        return job, []
    if not job.status.terminal and now >= job.deadline:
        new, actions = _finish(job, now, Status.EXPIRED, "expired", f"the ttl of {_ttl(job)}s ran out")
    elif is_stale(job, event):
        new, actions = job, []
    else:
        new, actions = _step(job, event, now, policy)
    new = _with_goodput(new, event)
    if new == job and not actions:
        return job, []
    seen = (*new.seen_events, event.event_id)[-policy.seen_events_max :]
    return replace(new, updated_at=now, seen_events=seen), actions


def is_stale(job: Job, event: JobEvent) -> bool:
    """The event names an attempt older than the job's current one."""
    attempt = getattr(event, "attempt", None)
    return attempt is not None and job.current is not None and attempt < job.current.n


def _with_goodput(job: Job, event: JobEvent) -> Job:
    """The trainer's goodput split, kept on the attempt the entry names, whatever the job or that attempt became
    since: a `stopped` entry may arrive after the preemption that replaced its attempt. It changes nothing else,
    so even a stale entry never touches a newer attempt; per attempt the split covering more time wins
    (accounting.later_split), so duplicates and any order leave the same record."""
    split = getattr(event, "goodput", None)
    n = getattr(event, "attempt", None)
    if not split or n is None:
        return job
    attempt = next((a for a in job.attempts if a.n == n), None)
    if attempt is None or not later_split(split, attempt.goodput):
        return job
    return job.with_attempt(replace(attempt, goodput=dict(split)))


# -- a job's first event ---------------------------------------------------------------------------------------------


def _first(event: JobEvent, now: float) -> tuple[Job | None, list[Action]]:
    if isinstance(event, JobSubmitted):
        spec = event.spec
        job = Job(
            job_id=spec.job_id,
            spec=spec,
            status=Status.PROVISIONING,
            submitted_at=now,
            updated_at=now,
            reason=f"machine requested in {spec.zones[0]}",
            seen_events=(event.event_id,),
        )
        job, attempt = _with_new_attempt(job, 0, now)
        return job, [_create(job, attempt)]
    if isinstance(event, JobRejected) and event.job_id:
        rejected = Job(
            job_id=event.job_id,
            spec=None,
            status=Status.REJECTED,
            submitted_at=now,
            updated_at=now,
            reason=event.error,
            seen_events=(event.event_id,),
        )
        return rejected, []
    return None, []


# -- one event on an existing record ---------------------------------------------------------------------------------


def _step(job: Job, event: JobEvent, now: float, policy: Policy) -> tuple[Job, list[Action]]:
    if isinstance(event, MachinesObserved):
        return _observed(job, event, now, policy)
    if isinstance(event, TrainerCompleted) and job.status is Status.SUCCEEDED:
        return _filled_in(job, event), []
    if job.status.terminal:
        return job, []
    if isinstance(event, CancelRequested):
        return _finish(job, now, Status.CANCELLED, "cancelled", "cancelled by the user")
    if isinstance(event, (CheckpointSaved, TrainerProgressed)):
        current = job.current
        if current is None or event.attempt != current.n:
            return job, []
        if isinstance(event, CheckpointSaved) and (current.checkpoint_at or 0.0) < event.time:
            current = replace(current, checkpoint_at=event.time)  # lost work is counted from here (accounting.py)
        return _with_step(job, _progressed(current, event.time), event.step), []
    live = _live(job)
    if live is None or getattr(event, "attempt", None) != live.n:
        return job, []  # submit/reject of an existing job, or an event for an attempt that is over
    if isinstance(event, MachinePreempted):
        return _lost(job, now, "preempted", policy)
    if isinstance(event, TrainerStarted):
        return _started(job, live, event), []
    if isinstance(event, TrainerCompleted):
        done, actions = _finish(job, now, Status.SUCCEEDED, "completed", "")
        return _with_result(done, event), actions
    if isinstance(event, TrainerFailed):
        if event.machine_state in DEAD:  # the machine went first (a host error on one worker kills its peers)
            return _lost(job, now, "preempted", policy)
        on = f"{live.machine}" + ("" if event.worker is None else f" worker {event.worker}")
        return _crashed(job, now, f"trainer failed on {on}" + (f": {event.error}" if event.error else ""), policy)
    if isinstance(event, CreateFailed) and live.started_at is None:  # a started trainer proves the create worked
        if event.kind == "capacity":
            return _no_capacity(job, now, "capacity", f"no capacity in {live.zone}: {event.error}", False, policy)
        # An earlier try of this create may have made the machine after all (a crash before the intent was
        # cleared, then a 403 on redelivery): delete it now rather than leave it to the sweep.
        ended = _end(job, now, "error", deleted=True)
        failed = replace(ended, status=Status.FAILED, reason=f"creating {live.machine} failed: {event.error}")
        return failed, [DeleteMachine(job.job_id, live.n, live.machine, live.zone)]
    return job, []


def _started(job: Job, live: Attempt, event: TrainerStarted) -> Job:
    restored = event.restored_step
    started = replace(
        _progressed(live, event.time),
        started_at=live.started_at or event.time,
        restored_step=restored,
        startup_s=live.startup_s if live.startup_s is not None else event.startup_s,
    )
    if restored is not None:
        started = replace(started, last_step=max(restored, live.last_step or 0))
    reason = "trainer running" + ("" if restored is None else f" (resumed from step {restored})")
    return replace(job.with_attempt(started), status=Status.RUNNING, reason=reason, capacity_round=0)


def _with_result(job: Job, event: TrainerCompleted) -> Job:
    """The SUCCEEDED job with what the `completed` entry says: the trainer's result, or only that its startup
    script saw it exit 0 (`source: exit-code`)."""
    if event.step is not None:
        job = _with_step(job, job.attempts[-1], event.step)
    final = {**event.result, **({"final_step": event.step} if event.step is not None else {})}
    if event.source == EXIT_CODE:
        return replace(job, result={**final, "source": EXIT_CODE}, reason="the trainer exited with code 0")
    return replace(job, result=final, reason="the trainer completed")


def _filled_in(job: Job, event: TrainerCompleted) -> Job:
    """A trainer's own `completed` entry arriving after its startup script's made the job SUCCEEDED (entries arrive
    in any order): its result, final step and reason replace the exit code's, as if it had come first. Anything
    else about a SUCCEEDED job changes nothing, so a trainer's result is never replaced."""
    current = job.current
    by_exit_code = job.result.get("source") == EXIT_CODE
    if event.source == EXIT_CODE or not by_exit_code or current is None or current.n != event.attempt:
        return job
    return _with_result(job, event)


def _observed(job: Job, event: MachinesObserved, now: float, policy: Policy) -> tuple[Job, list[Action]]:
    """Act on what the API says: orphans, dead or stuck current machine, backoff due."""
    live = _live(job)
    current_n = job.current.n if job.current else 0
    actions: list[Action] = []
    state_of_live: MachineState | None = None
    for name, zone, state in sorted(event.machines):
        parsed = parse_machine_name(name)
        if parsed is None or parsed[0] != job.job_id or parsed[1] > current_n:
            continue
        n = parsed[1]
        if live is not None and n == live.n:
            state_of_live = state
        elif state is not MachineState.DELETING:
            actions.append(DeleteMachine(job.job_id, n, name, zone))
            job = _mark_deleted(job, n)
    if job.status.terminal:
        return job, actions
    if live is None:
        due = job.status is Status.PENDING and job.next_attempt_at is not None and job.next_attempt_at <= now
        if not due or job.spec is None:
            return job, actions
        job, attempt = _with_new_attempt(job, job.zone_index, now)
        return replace(job, status=Status.PROVISIONING, reason=f"machine requested in {_where(job, attempt)}"), [
            *actions,
            _create(job, attempt),
        ]
    age = now - live.requested_at
    more: list[Action] = []
    if state_of_live is None:
        if live.zone in event.zones and not job.pending and age >= policy.lost_grace_s:
            job, more = _lost(job, now, "lost", policy)
    elif state_of_live in (MachineState.PREEMPTED, MachineState.TERMINATED) or (
        state_of_live is MachineState.FAILED and live.started_at is not None
    ):
        job, more = _lost(job, now, "preempted", policy)
    elif state_of_live is MachineState.FAILED:
        said = dict(event.details).get(live.machine)
        reason = f"{live.machine} failed to come up in {live.zone}" + (f": {said}" if said else "")
        job, more = _no_capacity(job, now, "capacity", reason, True, policy)
    elif state_of_live is MachineState.QUEUED and age > _queue_timeout(job):
        reason = f"{live.machine} waited {age:.0f}s in the queue of {live.zone}"
        job, more = _no_capacity(job, now, "queued", reason, True, policy)
    elif state_of_live is MachineState.CREATING and live.started_at is None and age > policy.stuck_creating_s:
        reason = f"{live.machine} was still creating after {age:.0f}s in {live.zone}"
        job, more = _no_capacity(job, now, "stuck", reason, True, policy)
    elif state_of_live is MachineState.READY and (silent := _hung_for(job, live, now)) is not None:
        job, more = _crashed(
            job, now, f"hung: no training progress for {silent:.0f}s on {live.machine}", policy, "hung"
        )
    return job, actions + more


def _queue_timeout(job: Job) -> float:
    machine = job.spec.machine if job.spec else None
    return machine.queue_timeout_s if isinstance(machine, TpuMachine) else float("inf")


def _hung_for(job: Job, live: Attempt, now: float) -> float | None:
    """Seconds a RUNNING attempt's trainer has been silent, when that exceeds the job's hang_timeout."""
    timeout = job.spec.hang_timeout_s if job.spec else None
    if timeout is None or job.status is not Status.RUNNING or live.started_at is None:
        return None
    silent = now - max(live.started_at, live.progress_at or 0.0)
    return silent if silent > timeout else None


# -- transitions -----------------------------------------------------------------------------------------------------


def _lost(job: Job, now: float, why: str, policy: Policy) -> tuple[Job, list[Action]]:
    """The live machine was preempted or vanished: delete it, replace it in the same zone."""
    live, spec = _live(job), job.spec
    assert live is not None and spec is not None
    job = _end(job, now, why, deleted=True)
    job = replace(job, counters=replace(job.counters, preemptions=job.counters.preemptions + 1))
    delete = DeleteMachine(job.job_id, live.n, live.machine, live.zone)
    limit = spec.max_preemptions
    if limit is not None and job.counters.preemptions > limit:
        reason = f"{live.machine} {why}; {job.counters.preemptions} preemptions exceed max_preemptions={limit}"
        return replace(job, status=Status.FAILED, reason=reason), [delete]
    job, attempt = _with_new_attempt(job, _zone_index(job, live.zone), now)
    where = "" if attempt.tier == live.tier else f" in {_where(job, attempt)}"
    return replace(job, status=Status.RECOVERING, reason=f"{live.machine} {why}; replacing it{where}"), [
        delete,
        _create(job, attempt),
    ]


def _crashed(job: Job, now: float, said: str, policy: Policy, why: str = "failed") -> tuple[Job, list[Action]]:
    """The trainer failed or hung (not a preemption): counts against max_failures. `said` becomes the reason."""
    live, spec = _live(job), job.spec
    assert live is not None and spec is not None
    job = _end(job, now, why, deleted=True)
    failures = job.counters.failures + 1
    job = replace(job, counters=replace(job.counters, failures=failures))
    delete = DeleteMachine(job.job_id, live.n, live.machine, live.zone)
    if failures >= spec.max_failures:
        return replace(job, status=Status.FAILED, reason=f"{said} (failure {failures} of {spec.max_failures})"), [
            delete
        ]
    job, attempt = _with_new_attempt(job, _zone_index(job, live.zone), now)
    return replace(job, status=Status.RECOVERING, reason=f"{said}; retrying"), [delete, _create(job, attempt)]


def _no_capacity(job: Job, now: float, why: str, reason: str, delete: bool, policy: Policy) -> tuple[Job, list[Action]]:
    """No machine in the live attempt's zone: try the next zone (or the next tier) now, or after a full walk of the
    tier's zones wait in PENDING."""
    live = _live(job)
    assert live is not None and job.spec is not None
    zones = _tier(job).zones
    job = _end(job, now, why, deleted=True)
    job = replace(job, counters=replace(job.counters, capacity_errors=job.counters.capacity_errors + 1))
    actions: list[Action] = [DeleteMachine(job.job_id, live.n, live.machine, live.zone)] if delete else []
    following = (_zone_index(job, live.zone) + 1) % len(zones)
    if _no_capacity_streak(job) % len(zones) == 0 and _next_tier(job, now) is None:
        wait = backoff_s(job.job_id, job.capacity_round, policy)
        return replace(
            job,
            status=Status.PENDING,
            zone_index=following,
            capacity_round=job.capacity_round + 1,
            next_attempt_at=now + wait,
            reason=f"{reason}; no capacity in any zone, next try in {wait:.0f}s",
        ), actions
    job, attempt = _with_new_attempt(job, following, now)
    return replace(job, reason=f"{reason}; trying {_where(job, attempt)}"), [*actions, _create(job, attempt)]


def _finish(job: Job, now: float, status: Status, why: str, reason: str) -> tuple[Job, list[Action]]:
    """End the job: end the live attempt and delete its machine."""
    live = _live(job)
    actions: list[Action] = []
    if live is not None:
        job = _end(job, now, why, deleted=True)
        actions.append(DeleteMachine(job.job_id, live.n, live.machine, live.zone))
    return replace(job, status=status, reason=reason, next_attempt_at=None), actions


# -- helpers ---------------------------------------------------------------------------------------------------------


def _live(job: Job) -> Attempt | None:
    """The current attempt while it still holds (or is getting) a machine."""
    current = job.current
    return current if current is not None and not current.ended and not job.status.terminal else None


def _end(job: Job, now: float, why: str, *, deleted: bool) -> Job:
    current = job.current
    assert current is not None
    return job.with_attempt(replace(current, ended_at=now, end_reason=why, machine_deleted=deleted))


def _mark_deleted(job: Job, n: int) -> Job:
    for attempt in job.attempts:
        if attempt.n == n and not attempt.machine_deleted:
            return job.with_attempt(replace(attempt, machine_deleted=True))
    return job


def _with_step(job: Job, attempt: Attempt, step: int) -> Job:
    if attempt.last_step is not None and attempt.last_step >= step:
        return job.with_attempt(attempt)
    return job.with_attempt(replace(attempt, last_step=step))


def _progressed(attempt: Attempt, at: float) -> Attempt:
    """The attempt with `at` as its newest sign of training progress (entries may arrive out of order)."""
    if attempt.ended or (attempt.progress_at is not None and attempt.progress_at >= at):
        return attempt
    return replace(attempt, progress_at=at)


def _with_new_attempt(job: Job, zone_index: int, now: float) -> tuple[Job, Attempt]:
    """The next attempt in the tier's zone `zone_index`, or in the first zone of the next tier when it is time."""
    assert job.spec is not None
    tier = _next_tier(job, now)
    if tier is not None:
        job, zone_index = replace(job, tier_index=tier, capacity_round=0), 0
    n = job.current.n + 1 if job.current else 1
    zone = _tier(job).zones[zone_index]
    attempt = Attempt(n=n, zone=zone, machine=machine_name(job.job_id, n), requested_at=now, tier=job.tier_index)
    return replace(job.with_attempt(attempt), zone_index=zone_index, next_attempt_at=None), attempt


def _create(job: Job, attempt: Attempt) -> CreateMachine:
    return CreateMachine(job.job_id, attempt.n, attempt.machine, attempt.zone, deadline=job.deadline, tier=attempt.tier)


def _tier(job: Job) -> Tier:
    assert job.spec is not None
    return job.spec.all_tiers[job.tier_index]


def _where(job: Job, attempt: Attempt) -> str:
    assert job.spec is not None
    tiers = job.spec.all_tiers
    return attempt.zone if len(tiers) == 1 else f"{attempt.zone} ({tiers[attempt.tier].provisioning} tier)"


def _next_tier(job: Job, now: float) -> int | None:
    """The tier the next attempt must use when the current tier's move-on rule holds (the last tier stays)."""
    assert job.spec is not None
    tiers, index = job.spec.all_tiers, job.tier_index
    while index + 1 < len(tiers) and _moves_on(job, tiers[index], index, now):
        index += 1
    return index if index != job.tier_index else None


def _moves_on(job: Job, tier: Tier, index: int, now: float) -> bool:
    mine = [a for a in job.attempts if a.tier == index]
    if tier.after_preemptions is not None:
        preempted = sum(a.end_reason in ("preempted", "lost") for a in mine)
        if preempted >= tier.after_preemptions:
            return True
    if tier.after_stockout_s is not None and index == job.tier_index:
        streak = _no_capacity_streak(job)
        if streak and now - job.attempts[-streak].requested_at >= tier.after_stockout_s:
            return True
    return tier.deadline_within_s is not None and job.deadline - now <= tier.deadline_within_s


def _zone_index(job: Job, zone: str) -> int:
    zones = _tier(job).zones
    return zones.index(zone) if zone in zones else job.zone_index


def _no_capacity_streak(job: Job) -> int:
    """How many attempts in a row, newest first, found no capacity (in the current tier)."""
    streak = 0
    for attempt in reversed(job.attempts):
        if attempt.end_reason not in NO_CAPACITY or attempt.tier != job.tier_index:
            break
        streak += 1
    return streak


def _ttl(job: Job) -> int:
    return job.spec.ttl_s if job.spec else 0
