"""The pure core: `decide(job, event, now, policy, *, outlook=None) -> (job, actions)`.

No I/O, no clock: time comes only from `now`. The service loads the record,
calls decide, persists the result with the actions as intent, then acts.

Order of the checks on every event: an already-seen event id changes nothing;
then the TTL (a live job past its deadline is EXPIRED and its machine deleted);
then events naming an older attempt are stale and change nothing; then the
event itself, by the rule for its type (RULES; a listing's by respawn.listing_policy).
On a SUCCEEDED (FAILED) job only the trainer's own `completed` (`failed`) entry does anything: it fills in the
result (the error) of the one its startup script sent on the exit code. Then a draining machine whose drain is over
is deleted (_drain_over). Last, a trainer's goodput split is kept on the attempt its entry names, stale or not (the only
things a stale event may change: that older attempt's split, and the deletion of its draining machine). A decision
that changes nothing returns the same record and no actions, and the event id is not recorded.

The head start (_head_start): a running machine's notice ends its attempt as the preemption it is and requests
the replacement at once, in another zone, to start its trainer once the noticed machine is off (drain_until). The
noticed machine is kept for its final save (it drains) until its trainer's last entry, a listing after
drain_until, or the end of the job; at most one attempt drains, so a job has at most two machines.

The rules end in respawn.transitions (a machine lost, a trainer crashed, no capacity, the job over); where each new
attempt goes is respawn.next_attempt's: the rules say that a machine is requested, it says on which tier and in which
zone. Ended attempts leave observations for the history only with an outlook.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from respawn import worlds
from respawn.accounting import later_split
from respawn.actions import Action, DeleteMachine
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
from respawn.jobs import Attempt, EndReason, Job, JobSpec, Provisioning, Status
from respawn.listing_policy import DEAD, machines_listed
from respawn.machine import notice_s
from respawn.next_attempt import new_attempt
from respawn.outlook import Outlook, with_observations
from respawn.policy import Context, Policy
from respawn.transitions import (
    Decision,
    crashed,
    create_machine,
    end_attempt,
    finish,
    lost,
    mark_deleted,
    no_capacity,
)
from respawn.worlds import several_slices


def decide(
    job: Job | None, event: JobEvent, now: float, policy: Policy, *, outlook: Outlook | None = None
) -> tuple[Job | None, list[Action]]:
    ctx = Context(policy, outlook)
    if job is None or (job.status is Status.REJECTED and isinstance(event, JobSubmitted)):
        return _first(event, now, ctx)  # a rejected job id may be submitted again once the message is fixed
    if event.event_id in job.seen_events:
        return job, []
    if several_slices(job):  # a world of several slices: its own rules (respawn.worlds), its own drains
        new, actions = worlds.step(job, event, now, ctx)
    elif not job.status.terminal and now >= job.deadline:
        new, actions = finish(job, now, Status.EXPIRED, EndReason.EXPIRED, f"the ttl of {_ttl(job)}s ran out")
    elif is_stale(job, event):
        new, actions = job, []
    else:
        new, actions = _step(job, event, now, ctx)
    new, drained = _drain_over(new, event, now) if not several_slices(job) else (new, [])
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
        if several_slices(job):
            return worlds.first_machines(job, now, ctx)
        job, attempt = new_attempt(job, now, ctx, 0)
        return replace(job, reason=f"machine requested in {attempt.zone}"), [create_machine(job, attempt)]
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
        live = job.live
        if live is None or event.attempt != live.n:
            return job, []
        return rule(job, live, event, now, ctx)

    return guarded


def _cancelled(job: Job, event: CancelRequested, now: float, ctx: Context) -> Decision:
    return finish(job, now, Status.CANCELLED, EndReason.CANCELLED, "cancelled by the user")


def _trained(job: Job, event: CheckpointSaved | TrainerProgressed, now: float, ctx: Context) -> Decision:
    """The current attempt trained on: its newest step and sign of progress, and for a save, its newest save."""
    current = job.current
    if current is None or event.attempt != current.n:
        return job, []
    if isinstance(event, CheckpointSaved) and (current.checkpoint_at or 0.0) < event.time:
        current = replace(current, checkpoint_at=event.time)  # lost work is counted from here (accounting.py)
    return _with_step(job, _progressed(current, event.time), event.step), []


def _preempted(job: Job, live: Attempt, event: MachinePreempted, now: float, ctx: Context) -> Decision:
    return lost(job, now, EndReason.PREEMPTED, ctx)


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
    if not spec.head_start or live.started_at is None or job.draining is not None:
        return job, []
    policy = ctx.policy
    lead = spec.preemption_notice_s if spec.all_tiers[live.tier].provisioning == Provisioning.SPOT else None
    window = notice_s(spec.machine.kind) + (lead or 0) + policy.drain_margin_s
    drain_until = event.time + window * policy.time_scale
    return lost(job, now, EndReason.PREEMPTED, ctx, drain_until=drain_until)


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
    done, actions = finish(job, now, Status.SUCCEEDED, EndReason.COMPLETED, "")
    return _with_result(done, event), actions


def _trainer_failed(job: Job, live: Attempt, event: TrainerFailed, now: float, ctx: Context) -> Decision:
    if event.machine_state in DEAD:  # the machine went first (a host error on one worker kills its peers)
        return lost(job, now, EndReason.PREEMPTED, ctx)
    on = f"{live.machine}" + ("" if event.worker is None else f" worker {event.worker}")
    error = f"trainer failed on {on}" + (f": {event.error}" if event.error else "")
    if event.permanent:  # the trainer says no machine of this job would do better (its devices): not retried
        job, actions = finish(job, now, Status.FAILED, EndReason.FAILED, f"{error} (permanent: not retried)")
        job = replace(job, counters=replace(job.counters, failures=job.counters.failures + 1))
    else:
        job, actions = crashed(job, now, EndReason.FAILED, error, ctx)
    if job.status is Status.FAILED and event.source == ResultSource.EXIT_CODE and event.error:  # see _filled_in
        job = replace(job, result={"source": ResultSource.EXIT_CODE, "error": event.error})
    return job, actions


def _create_failed(job: Job, live: Attempt, event: CreateFailed, now: float, ctx: Context) -> Decision:
    if live.started_at is not None:  # a started trainer proves the create worked
        return job, []
    if event.kind == CreateFailure.UNOFFERED:  # a stockout that never ends: the zone is skipped from now on
        job = job.with_attempt(replace(live, error=event.error))
        reason = f"{live.zone} does not offer the machine: {event.error}"
        return no_capacity(job, now, EndReason.UNOFFERED, reason, ctx, delete=False)
    if event.kind == CreateFailure.CAPACITY:
        reason = f"no capacity in {live.zone}: {event.error}"
        return no_capacity(job, now, EndReason.CAPACITY, reason, ctx, delete=False)
    # An earlier try of this create may have made the machine after all (a crash before the intent was
    # cleared, then a 403 on redelivery): delete it now rather than leave it to the sweep.
    ended = end_attempt(job, now, EndReason.ERROR)
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


# The rule for each type of event; the guard around a rule says when its events count at all.
RULES: dict[type, Rule] = {
    MachinesObserved: machines_listed,
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


# -- helpers ---------------------------------------------------------------------------------------------------------


def _drain_over(job: Job, event: JobEvent, now: float) -> Decision:
    """The draining attempt's machine is deleted once its drain is over: its trainer's last entry came (`stopped`,
    `completed` or `failed`: the one effect of a stale event besides the goodput split), a listing came after its
    drain_until, or the job is over."""
    draining = job.draining
    if draining is None or draining.drain_until is None:
        return job, []
    over = (
        job.status.terminal
        or (isinstance(event, MachinesObserved) and now >= draining.drain_until)
        or _last_word(event, draining.n)
    )
    if not over:
        return job, []
    return mark_deleted(job, draining.n), [DeleteMachine(job.job_id, draining.n, draining.machine, draining.zone)]


def _last_word(event: JobEvent, n: int) -> bool:
    """A trainer's last entry of attempt n: it saved on the notice (`stopped`), completed or failed."""
    last = isinstance(event, (TrainerCompleted, TrainerFailed)) or (isinstance(event, CheckpointSaved) and event.final)
    return last and isinstance(event, AboutAttempt) and event.attempt == n


def _with_step(job: Job, attempt: Attempt, step: int) -> Job:
    if attempt.last_step is not None and attempt.last_step >= step:
        return job.with_attempt(attempt)
    return job.with_attempt(replace(attempt, last_step=step))


def _progressed(attempt: Attempt, at: float) -> Attempt:
    """The attempt with `at` as its newest sign of training progress (entries may arrive out of order)."""
    if attempt.ended or (attempt.progress_at is not None and attempt.progress_at >= at):
        return attempt
    return replace(attempt, progress_at=at)


def _ttl(job: Job) -> int:
    return job.spec.ttl_s if job.spec else 0
