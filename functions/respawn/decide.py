"""The pure core: `decide(job, event, now, policy, *, outlook=None) -> (job, actions)`.

No I/O, no clock: time comes only from `now`. The service loads the record,
calls decide, persists the result with the actions as intent, then acts.

Order of the checks on every event: an already-seen event id changes nothing;
then the TTL (a live job past its deadline is EXPIRED and its machine deleted);
then events naming an older attempt are stale and change nothing; then the
event itself, by the rule for its type (RULES; what a listing says of the live machine by LIVE_MACHINE_RULES).
On a SUCCEEDED (FAILED) job only the trainer's own `completed` (`failed`) entry does anything: it fills in the
result (the error) of the one its startup script sent on the exit code. Then a draining machine whose drain is over
is deleted (_drain_over). Last, a trainer's goodput split is kept on the attempt its entry names, stale or not (the only
things a stale event may change: that older attempt's split, and the deletion of its draining machine). A decision
that changes nothing returns the same record and no actions, and the event id is not recorded.

The head start (_head_start): a running machine's notice ends its attempt as the preemption it is and requests
the replacement at once, in another zone, to start its trainer once the noticed machine is off (drain_until). The
noticed machine is kept for its final save (it drains) until its trainer's last entry, a listing after
drain_until, or the end of the job; at most one attempt drains, so a job has at most two machines.

Where each new attempt goes is respawn.next_attempt's: the rules here say that a machine is requested, it says on
which tier and in which zone. Ended attempts leave observations for the history only with an outlook.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from respawn.accounting import later_split
from respawn.actions import Action, CreateMachine, DeleteMachine
from respawn.events import (
    AboutAttempt,
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
    ResultSource,
    TrainerCompleted,
    TrainerFailed,
    TrainerProgressed,
    TrainerStarted,
)
from respawn.jobs import (
    Attempt,
    EndReason,
    Job,
    JobSpec,
    MachineState,
    Provisioning,
    Status,
    parse_machine_name,
)
from respawn.machine import notice_s
from respawn.next_attempt import (
    new_attempt,
    next_tier,
    offered_zones,
    on_tier_since,
    spot_tier_to_return_to,
    tier_name,
    tier_of,
    walk_over,
    where,
    zone_index_of,
)
from respawn.outlook import Outlook, with_observations
from respawn.policy import Context, Policy, backoff_s

# What the API says of a machine that no longer runs anything: its attempt was lost, not failed.
DEAD = frozenset({MachineState.PREEMPTED, MachineState.TERMINATED, MachineState.FAILED})

Decision = tuple[Job, list[Action]]


def decide(
    job: Job | None, event: JobEvent, now: float, policy: Policy, *, outlook: Outlook | None = None
) -> tuple[Job | None, list[Action]]:
    ctx = Context(policy, outlook)
    if job is None or (job.status is Status.REJECTED and isinstance(event, JobSubmitted)):
        return _first(event, now, ctx)  # a rejected job id may be submitted again once the message is fixed
    if event.event_id in job.seen_events:
        return job, []
    if not job.status.terminal and now >= job.deadline:
        new, actions = _finish(job, now, Status.EXPIRED, EndReason.EXPIRED, f"the ttl of {_ttl(job)}s ran out")
    elif is_stale(job, event):
        new, actions = job, []
    else:
        new, actions = _step(job, event, now, ctx)
    new, drained = _drain_over(new, event, now)
    actions = [*drained, *actions]  # a machine's delete before any create, as everywhere
    new = _with_goodput(new, event)
    if outlook is not None:  # a service that reads a history keeps it: what the ended attempts showed goes to it
        new = with_observations(job, new)
    if new == job and not actions:
        return job, []
    seen = (*new.seen_events, event.event_id)[-policy.seen_events_max :]
    return replace(new, updated_at=now, seen_events=seen), actions


def is_stale(job: Job, event: JobEvent) -> bool:
    """The event names an attempt older than the job's current one."""
    return isinstance(event, AboutAttempt) and job.current is not None and event.attempt < job.current.n


def _with_goodput(job: Job, event: JobEvent) -> Job:
    """The trainer's goodput split, kept on the attempt the entry names, whatever the job or that attempt became
    since: a `stopped` entry may arrive after the preemption that replaced its attempt. It changes nothing else,
    so even a stale entry never touches a newer attempt; per attempt the split covering more time wins
    (accounting.later_split), so duplicates and any order leave the same record."""
    split = getattr(event, "goodput", None)
    if not split or not isinstance(event, AboutAttempt):
        return job
    attempt = next((a for a in job.attempts if a.n == event.attempt), None)
    if attempt is None or not later_split(split, attempt.goodput):
        return job
    return job.with_attempt(replace(attempt, goodput=dict(split)))


# -- a job's first event ---------------------------------------------------------------------------------------------


def _first(event: JobEvent, now: float, ctx: Context) -> tuple[Job | None, list[Action]]:
    """A submit makes the record and requests its first machine; a rejection with a usable job id makes a REJECTED
    record (so the sender can see why); anything else about an unknown job is dropped."""
    if isinstance(event, JobSubmitted):
        spec = event.spec
        job = _new_record(event, now, spec.job_id, spec, Status.PROVISIONING, "")
        job, attempt = new_attempt(job, now, ctx, 0)
        return replace(job, reason=f"machine requested in {attempt.zone}"), [_create(job, attempt)]
    if isinstance(event, JobRejected) and event.job_id:
        return _new_record(event, now, event.job_id, None, Status.REJECTED, event.error), []
    return None, []


def _new_record(event: JobEvent, now: float, job_id: str, spec: JobSpec | None, status: Status, reason: str) -> Job:
    return Job(
        job_id=job_id,
        spec=spec,
        status=status,
        submitted_at=now,
        updated_at=now,
        reason=reason,
        seen_events=(event.event_id,),
    )


# -- one event on an existing record: a rule per event type ----------------------------------------------------------

# A rule takes (job, event, now, ctx) for the events of its type. Rules of the same shape make the table below
# one lookup; an event type without a rule (a submit or rejection naming an existing job) changes nothing.
Rule = Callable[[Job, Any, float, Context], Decision]
# A rule about the live attempt also takes that attempt: (job, live, event, now, ctx).
LiveRule = Callable[[Job, Attempt, Any, float, Context], Decision]


def _step(job: Job, event: JobEvent, now: float, ctx: Context) -> Decision:
    rule = RULES.get(type(event))
    return rule(job, event, now, ctx) if rule is not None else (job, [])


def _while_open(rule: Rule) -> Rule:
    """The rule, while the job is not over: a terminal job changes no more."""

    def guarded(job: Job, event: Any, now: float, ctx: Context) -> Decision:
        return (job, []) if job.status.terminal else rule(job, event, now, ctx)

    return guarded


def _on_live_attempt(rule: LiveRule) -> Rule:
    """The rule, for an event about the live attempt; about an attempt that is over (or a job without a live one),
    an event changes nothing."""

    def guarded(job: Job, event: Any, now: float, ctx: Context) -> Decision:
        live = _live(job)
        if live is None or event.attempt != live.n:
            return job, []
        return rule(job, live, event, now, ctx)

    return guarded


def _cancelled(job: Job, event: CancelRequested, now: float, ctx: Context) -> Decision:
    return _finish(job, now, Status.CANCELLED, EndReason.CANCELLED, "cancelled by the user")


def _trained(job: Job, event: CheckpointSaved | TrainerProgressed, now: float, ctx: Context) -> Decision:
    """The current attempt trained on: its newest step and sign of progress, and for a save, its newest save."""
    current = job.current
    if current is None or event.attempt != current.n:
        return job, []
    if isinstance(event, CheckpointSaved) and (current.checkpoint_at or 0.0) < event.time:
        current = replace(current, checkpoint_at=event.time)  # lost work is counted from here (accounting.py)
    return _with_step(job, _progressed(current, event.time), event.step), []


def _preempted(job: Job, live: Attempt, event: MachinePreempted, now: float, ctx: Context) -> Decision:
    return _lost(job, now, EndReason.PREEMPTED, ctx)


def _head_start(job: Job, live: Attempt, event: MachineNoticed, now: float, ctx: Context) -> Decision:
    """The notice reached the live attempt's machine: the cloud has decided to take it, so its replacement is requested
    now, in another zone, and starts its trainer once the noticed machine is off (drain_until: the notice plus the
    machine kind's notice window, a Spot VM's preemption_notice before it, and a margin), so that its create, boot
    and image pull overlap the final save and it restores what that save completed. Counted as the preemption it is:
    the attempt ends PREEMPTED, and the system event or listing that follows names an older attempt. Not with
    head_start off, before the trainer started (nothing to save), nor while another attempt drains (never more than
    two machines of a job): then the preemption's own event or a listing replaces the machine, as without a notice."""
    spec = job.spec
    assert spec is not None
    if not spec.head_start or live.started_at is None or _draining(job) is not None:
        return job, []
    policy = ctx.policy
    lead = spec.preemption_notice_s if spec.all_tiers[live.tier].provisioning == Provisioning.SPOT else None
    window = notice_s(spec.machine.kind) + (lead or 0) + policy.drain_margin_s
    drain_until = event.time + window * policy.time_scale
    return _lost(job, now, EndReason.PREEMPTED, ctx, drain_until=drain_until)


def _started(job: Job, live: Attempt, event: TrainerStarted, now: float, ctx: Context) -> Decision:
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
    return replace(job.with_attempt(started), status=Status.RUNNING, reason=reason, capacity_round=0), []


def _or_filled_in(over: Status, rule: LiveRule) -> Rule:
    """The rule, for the live attempt's trainer; on a job this kind of entry already ended (`over`: the startup
    script's came first), the trainer's own entry may still fill in what the exit code could not say (_filled_in)."""

    def ruled(job: Job, event: Any, now: float, ctx: Context) -> Decision:
        return (_filled_in(job, event), []) if job.status is over else _on_live_attempt(rule)(job, event, now, ctx)

    return ruled


def _succeeded(job: Job, live: Attempt, event: TrainerCompleted, now: float, ctx: Context) -> Decision:
    done, actions = _finish(job, now, Status.SUCCEEDED, EndReason.COMPLETED, "")
    return _with_result(done, event), actions


def _trainer_failed(job: Job, live: Attempt, event: TrainerFailed, now: float, ctx: Context) -> Decision:
    if event.machine_state in DEAD:  # the machine went first (a host error on one worker kills its peers)
        return _lost(job, now, EndReason.PREEMPTED, ctx)
    on = f"{live.machine}" + ("" if event.worker is None else f" worker {event.worker}")
    error = f"trainer failed on {on}" + (f": {event.error}" if event.error else "")
    if event.permanent:  # the trainer says no machine of this job would do better (its devices): not retried
        job, actions = _finish(job, now, Status.FAILED, EndReason.FAILED, f"{error} (permanent: not retried)")
        job = replace(job, counters=replace(job.counters, failures=job.counters.failures + 1))
    else:
        job, actions = _crashed(job, now, EndReason.FAILED, error, ctx)
    if job.status is Status.FAILED and event.source == ResultSource.EXIT_CODE and event.error:  # see _filled_in
        job = replace(job, result={"source": ResultSource.EXIT_CODE, "error": event.error})
    return job, actions


def _create_failed(job: Job, live: Attempt, event: CreateFailed, now: float, ctx: Context) -> Decision:
    if live.started_at is not None:  # a started trainer proves the create worked
        return job, []
    if event.kind == CreateFailure.UNOFFERED:  # a stockout that never ends: the zone is skipped from now on
        job = job.with_attempt(replace(live, error=event.error))
        reason = f"{live.zone} does not offer the machine: {event.error}"
        return _no_capacity(job, now, EndReason.UNOFFERED, reason, ctx, delete=False)
    if event.kind == CreateFailure.CAPACITY:
        reason = f"no capacity in {live.zone}: {event.error}"
        return _no_capacity(job, now, EndReason.CAPACITY, reason, ctx, delete=False)
    # An earlier try of this create may have made the machine after all (a crash before the intent was
    # cleared, then a 403 on redelivery): delete it now rather than leave it to the sweep.
    ended = _end(job, now, EndReason.ERROR)
    failed = replace(ended, status=Status.FAILED, reason=f"creating {live.machine} failed: {event.error}")
    return failed, [DeleteMachine(job.job_id, live.n, live.machine, live.zone)]


def _with_result(job: Job, event: TrainerCompleted) -> Job:
    """The SUCCEEDED job with what the `completed` entry says: the trainer's result, or only that its startup
    script saw it exit 0 (`source: exit-code`)."""
    if event.step is not None:
        job = _with_step(job, job.attempts[-1], event.step)
    final = {**event.result, **({"final_step": event.step} if event.step is not None else {})}
    if event.source == ResultSource.EXIT_CODE:
        return replace(job, result={**final, "source": ResultSource.EXIT_CODE}, reason="the trainer exited with code 0")
    return replace(job, result=final, reason="the trainer completed")


def _filled_in(job: Job, event: TrainerCompleted | TrainerFailed) -> Job:
    """A trainer's own `completed` (`failed`) entry arriving after its startup script's made the job SUCCEEDED
    (FAILED): entries arrive in any order. Its result, final step and reason (its error, in the reason) replace the
    exit code's, as if it had come first. Anything else about a job that is over changes nothing, so a trainer's own
    word is never replaced."""
    current = job.current
    by_exit_code = job.result.get("source") == ResultSource.EXIT_CODE
    if event.source == ResultSource.EXIT_CODE or not by_exit_code or current is None or current.n != event.attempt:
        return job
    if isinstance(event, TrainerFailed):
        said = job.result.get("error")
        return replace(job, reason=job.reason.replace(said, event.error), result={}) if said and event.error else job
    return _with_result(job, event)


def _observed(job: Job, event: MachinesObserved, now: float, ctx: Context) -> Decision:
    """What the API lists: every machine of an older attempt still there is deleted (even for a job that is over);
    then a job waiting out a capacity backoff requests its machine once it is due, and for a live attempt the
    first rule about its machine that holds (LIVE_MACHINE_RULES) decides."""
    live = _live(job)
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
    listing may be older than the record), each marked deleted; a draining machine is spared (_drain_over)."""
    current_n = job.current.n if job.current else 0
    draining = _draining(job)
    deletes: list[Action] = []
    for name, zone, state in sorted(event.machines):
        parsed = parse_machine_name(name)
        if parsed is None or parsed[0] != job.job_id or parsed[1] > current_n:
            continue
        n = parsed[1]
        spared = (live is not None and n == live.n) or (draining is not None and n == draining.n)
        if not spared and state is not MachineState.DELETING:
            deletes.append(DeleteMachine(job.job_id, n, name, zone))
            job = _mark_deleted(job, n)
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
    return replace(job, status=Status.PROVISIONING, reason=f"machine requested in {where(job, attempt)}"), [
        _create(job, attempt)
    ]


# The rule for each type of event; the guard around a rule says when its events count at all.
RULES: dict[type, Rule] = {
    MachinesObserved: _observed,
    TrainerCompleted: _or_filled_in(Status.SUCCEEDED, _succeeded),
    CancelRequested: _while_open(_cancelled),
    CheckpointSaved: _while_open(_trained),
    TrainerProgressed: _while_open(_trained),
    MachinePreempted: _on_live_attempt(_preempted),
    MachineNoticed: _on_live_attempt(_head_start),
    TrainerStarted: _on_live_attempt(_started),
    TrainerFailed: _or_filled_in(Status.FAILED, _trainer_failed),
    CreateFailed: _on_live_attempt(_create_failed),
}


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
    return _lost(seen.job, seen.now, EndReason.LOST, seen.ctx)


def _taken(seen: _Listed) -> Decision:
    return _lost(seen.job, seen.now, EndReason.PREEMPTED, seen.ctx)


def _failed_to_come_up(seen: _Listed) -> Decision:
    live = seen.live
    api_says = dict(seen.event.details).get(live.machine)
    reason = f"{live.machine} failed to come up in {live.zone}" + (f": {api_says}" if api_says else "")
    return _no_capacity(seen.job, seen.now, EndReason.CAPACITY, reason, seen.ctx, delete=True)


def _queue_given_up(seen: _Listed) -> Decision:
    reason = f"{seen.live.machine} waited {seen.age:.0f}s in the queue of {seen.live.zone}"
    return _no_capacity(seen.job, seen.now, EndReason.QUEUED, reason, seen.ctx, delete=True)


def _creating_given_up(seen: _Listed) -> Decision:
    reason = f"{seen.live.machine} was still creating after {seen.age:.0f}s in {seen.live.zone}"
    return _no_capacity(seen.job, seen.now, EndReason.STUCK, reason, seen.ctx, delete=True)


def _hung(seen: _Listed) -> Decision:
    silent = _hung_for(seen.job, seen.live, seen.now)
    assert silent is not None
    reason = f"hung: no training progress for {silent:.0f}s on {seen.live.machine}"
    return _crashed(seen.job, seen.now, EndReason.HUNG, reason, seen.ctx)


def _back_to_spot(seen: _Listed) -> Decision:
    """End the fallback attempt (not a preemption, not a failure: no counter moves) and request Spot again."""
    live, now = seen.live, seen.now
    on_tier = now - on_tier_since(seen.job, now)
    job = _end(seen.job, now, EndReason.BACK_TO_SPOT)
    job, attempt = new_attempt(job, now, seen.ctx, 0)
    reason = f"back to Spot after {on_tier / 3600:.1f}h on {tier_name(seen.job)}: requested {where(job, attempt)}"
    delete = DeleteMachine(job.job_id, live.n, live.machine, live.zone)
    return replace(job, status=Status.RECOVERING, reason=reason), [delete, _create(job, attempt)]


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


# -- transitions -----------------------------------------------------------------------------------------------------


def _lost(job: Job, now: float, end_reason: EndReason, ctx: Context, *, drain_until: float | None = None) -> Decision:
    """The live machine was preempted or vanished: delete it, replace it (the same zone in list order, else where
    the outlook ranks best with this zone penalised). Counts against max_preemptions, never against max_failures:
    the cloud took it, the trainer did nothing wrong. With `drain_until` (a head start on its notice) the machine is
    kept for its final save until its drain is over (_drain_over), and the replacement goes to another zone."""
    live, spec = _live(job), job.spec
    assert live is not None and spec is not None
    job = _end(job, now, end_reason, drain_until=drain_until)
    job = replace(job, counters=replace(job.counters, preemptions=job.counters.preemptions + 1))
    delete = DeleteMachine(job.job_id, live.n, live.machine, live.zone)
    limit = spec.max_preemptions
    if limit is not None and job.counters.preemptions > limit:
        reason = f"{live.machine} {end_reason}; {job.counters.preemptions} preemptions exceed max_preemptions={limit}"
        return replace(_mark_deleted(job, live.n), status=Status.FAILED, reason=reason), [delete]
    avoid = live.zone if drain_until is not None else None
    job, attempt = new_attempt(job, now, ctx, zone_index_of(job, live.zone), avoid=avoid)
    moved = "" if (attempt.tier, attempt.zone) == (live.tier, live.zone) else f" in {where(job, attempt)}"
    if drain_until is not None:
        reason = f"{live.machine} noticed; its replacement is requested now{moved}, to start after its final save"
        return replace(job, status=Status.RECOVERING, reason=reason), [_create(job, attempt)]
    return replace(job, status=Status.RECOVERING, reason=f"{live.machine} {end_reason}; replacing it{moved}"), [
        delete,
        _create(job, attempt),
    ]


def _crashed(job: Job, now: float, end_reason: EndReason, reason: str, ctx: Context) -> Decision:
    """The trainer failed or hung (not a preemption): counts against max_failures, retried in the same zone (a
    crash says nothing of the zone). `reason` says what happened; the job's reason adds whether it is retried."""
    live, spec = _live(job), job.spec
    assert live is not None and spec is not None
    job = _end(job, now, end_reason)
    failures = job.counters.failures + 1
    job = replace(job, counters=replace(job.counters, failures=failures))
    delete = DeleteMachine(job.job_id, live.n, live.machine, live.zone)
    if failures >= spec.max_failures:
        return replace(job, status=Status.FAILED, reason=f"{reason} (failure {failures} of {spec.max_failures})"), [
            delete
        ]
    job, attempt = new_attempt(job, now, ctx, zone_index_of(job, live.zone), same_zone=True)
    return replace(job, status=Status.RECOVERING, reason=f"{reason}; retrying"), [delete, _create(job, attempt)]


def _no_capacity(job: Job, now: float, end_reason: EndReason, reason: str, ctx: Context, *, delete: bool) -> Decision:
    """No machine in the live attempt's zone: try another zone not tried in this walk (the next in list order, or
    the best-ranked) or the next tier now, or after a full walk of the tier's zones wait in PENDING. `delete`: a
    machine was made (it failed or waited too long) and must go."""
    live = _live(job)
    assert live is not None and job.spec is not None
    zones = tier_of(job).zones
    job = _end(job, now, end_reason)
    job = replace(job, counters=replace(job.counters, capacity_errors=job.counters.capacity_errors + 1))
    actions: list[Action] = [DeleteMachine(job.job_id, live.n, live.machine, live.zone)] if delete else []
    following = (zone_index_of(job, live.zone) + 1) % len(zones)
    if not offered_zones(job) and next_tier(job, now) is None:  # no zone left that offers the machine
        return replace(job, status=Status.FAILED, reason=f"{reason}; no zone of {tier_name(job)} offers it"), actions
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
    return replace(job, reason=f"{reason}; trying {where(job, attempt)}"), [*actions, _create(job, attempt)]


def _finish(job: Job, now: float, status: Status, end_reason: EndReason, reason: str) -> Decision:
    """End the job: end the live attempt and delete its machine."""
    live = _live(job)
    actions: list[Action] = []
    if live is not None:
        job = _end(job, now, end_reason)
        actions.append(DeleteMachine(job.job_id, live.n, live.machine, live.zone))
    return replace(job, status=status, reason=reason, next_attempt_at=None), actions


# -- helpers ---------------------------------------------------------------------------------------------------------


def _live(job: Job) -> Attempt | None:
    """The current attempt while it still holds (or is getting) a machine."""
    current = job.current
    return current if current is not None and not current.ended and not job.status.terminal else None


def _end(job: Job, now: float, end_reason: EndReason, *, drain_until: float | None = None) -> Job:
    """The current attempt ended; its machine is deleted with it (the delete is among the decision's actions, or
    there never was a machine), or with `drain_until` kept for its final save (a head start)."""
    current = job.current
    assert current is not None
    ended = replace(current, ended_at=now, end_reason=end_reason, machine_deleted=drain_until is None)
    return job.with_attempt(replace(ended, drain_until=drain_until))


def _draining(job: Job) -> Attempt | None:
    """The attempt ended on its machine's notice whose machine is kept for its final save (at most one)."""
    return next((a for a in job.attempts if a.draining), None)


def _drain_over(job: Job, event: JobEvent, now: float) -> Decision:
    """The draining attempt's machine is deleted once its drain is over: its trainer's last entry came (`stopped`,
    `completed` or `failed`: the one effect of a stale event besides the goodput split), a listing came after its
    drain_until, or the job is over."""
    draining = _draining(job)
    if draining is None or draining.drain_until is None:
        return job, []
    over = (
        job.status.terminal
        or (isinstance(event, MachinesObserved) and now >= draining.drain_until)
        or _last_word(event, draining.n)
    )
    if not over:
        return job, []
    return _mark_deleted(job, draining.n), [DeleteMachine(job.job_id, draining.n, draining.machine, draining.zone)]


def _last_word(event: JobEvent, n: int) -> bool:
    """A trainer's last entry of attempt n: it saved on the notice (`stopped`), completed or failed."""
    last = isinstance(event, (TrainerCompleted, TrainerFailed)) or (isinstance(event, CheckpointSaved) and event.final)
    return last and isinstance(event, AboutAttempt) and event.attempt == n


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


def _create(job: Job, attempt: Attempt) -> CreateMachine:
    """The attempt's create; while an older attempt drains (a head start), its trainer starts after that drain."""
    draining = _draining(job)
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


def _ttl(job: Job) -> int:
    return job.spec.ttl_s if job.spec else 0
