"""Intent before effect: persist what a decision will do under a lease, do it, publish its notices, clear it.

A decision's machine actions go into `Job.pending` and the notice of its
status change into `Job.outbox`, written with a lease (`pending_lease_until`)
by the same compare-and-set as the new record. The lease holder then acts,
publishes and clears both. A handler that crashes in between leaves the intent
to whoever loads the record after the lease ran out (a redelivery, the sweep):
every action is idempotent and a notice's `id` deterministic, so carrying it
out again is safe.

The observations of ended attempts (`Job.observations`) are intent too: the lease
holder writes each as its own object of the deployment's preemption history
(`histories.Histories`: create-only, named by its id), then clears them, so a
crash between those writes and the record's counts nothing twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from respawn import service_log
from respawn.actions import Action, CreateMachine, action_from_dict, action_to_dict
from respawn.decide import decide
from respawn.events import CheckpointSaved, CreateFailed, CreateFailure, JobEvent, TrainerProgressed, TrainerStarted
from respawn.facts import log_facts
from respawn.histories import Histories
from respawn.jobs import Job, JobSpec
from respawn.outcome import Retryable
from respawn.outlook import Outlook
from respawn.policy import Policy
from respawn.ports import (
    CapacityError,
    ConflictError,
    ProviderError,
    StatusNotifier,
    TransientError,
    UnofferedError,
)
from respawn.providers import Providers
from respawn.records import Read, Records
from respawn.status_messages import status_message

# The events most jobs send most often, none of which requests a machine: decide ranks nothing for them, so they
# get an outlook without reading the history (its presence alone has the attempts they end observed).
_PLACES_NOTHING = (TrainerProgressed, CheckpointSaved, TrainerStarted)


def has_intent(job: Job) -> bool:
    """The record holds intent not yet carried out: machine actions, status messages or history observations."""
    return job.holds_intent


def lease_expired(job: Job, now: float) -> bool:
    """The record's intent belongs to nobody any more: its writer crashed, or handed it back after a hiccup."""
    return has_intent(job) and (job.pending_lease_until is None or job.pending_lease_until <= now)


@dataclass(frozen=True)
class Acting:
    """Persists and carries out intent. Without a `notifier` no status message is kept or published."""

    records: Records
    machines: Providers
    notifier: StatusNotifier | None
    policy: Policy
    lease_s: float
    histories: Histories | None = None  # None: no history is kept, decide gets no outlook

    def outlook(self, now: float, event: JobEvent, spec: JobSpec | None) -> Outlook | None:
        """What decide reads to place `spec`'s machines for `event`: the cached history and advice (read only for
        events that may place one); None without a history store."""
        if self.histories is None:
            return None
        return self.histories.outlook(now, read=not isinstance(event, _PLACES_NOTHING), spec=spec)

    def intent(self, old: Job | None, new: Job, actions: Sequence[Action], now: float) -> Job:
        """The record to persist for a decision: `new` with its actions pending and its status message in the outbox,
        leased to this handler while there is anything to carry out."""
        new = self._with_status_message(old, new, now)
        leased = bool(actions or new.outbox or new.observations)
        return replace(new, pending=_dicts(actions), pending_lease_until=now + self.lease_s if leased else None)

    def _with_status_message(self, old: Job | None, new: Job, now: float) -> Job:
        """`new` with the notice of its status change in the outbox (when it changed and notices are published)."""
        if self.notifier is None or (old is not None and old.status is new.status):
            return new
        return replace(new, outbox=(*new.outbox, status_message(old, new, now)))

    def take_over(self, read: Read, now: float) -> tuple[Read, list[Action]]:
        """Take over intent whose lease ran out and carry it out. A conflict means another handler took it first."""
        assert read.job is not None
        job = replace(read.job, pending_lease_until=now + self.lease_s)
        generation = self.records.save_watched(job, read.generation)
        return self.carry_out(job, generation, [action_from_dict(d) for d in job.pending], now)

    def carry_out(self, job: Job, generation: int, actions: list[Action], now: float) -> tuple[Read, list[Action]]:
        """Execute the actions, publish the notices, clear the intent; we hold the lease. Returns the cleared record
        and the actions done.

        A create that fails for good (no capacity, a permanent error) goes back to `decide`, which moves the attempt
        on (the next zone or tier) or ends the job; at most once per zone and tier, so the walk always ends. A
        transient failure keeps what is left as intent, lease handed back, for the redelivery."""
        queue, done = list(actions), []
        creates_left_to_retry = len(job.spec.every_zone) + len(job.spec.all_tiers) if job.spec else 0
        while queue:
            action = queue.pop(0)
            try:
                self.machines.execute(job, action)
            except TransientError as e:
                self._save_held(replace(job, pending=_dicts([action, *queue]), pending_lease_until=now), generation)
                raise Retryable(f"{action.machine}: {e}") from e
            except ProviderError as e:
                if not isinstance(action, CreateMachine) or creates_left_to_retry <= 0:
                    service_log.error(job.job_id, f"{type(action).__name__} {action.machine} failed: {e}")
                    continue
                creates_left_to_retry -= 1
                before = job
                job, more = self._create_failed(job, action, e, now)
                queue += more
                job = replace(job, pending=_dicts(queue), pending_lease_until=now + self.lease_s)
                generation = self._save_held(job, generation)
                log_facts(before, job, now)
                continue
            done.append(action)
        self._publish(job, generation, now)
        self._observe(job, generation, now)
        job = replace(job, pending=(), outbox=(), observations=(), pending_lease_until=None)
        return Read(job, self._save_held(job, generation)), done

    def _create_failed(
        self, job: Job, action: CreateMachine, error: ProviderError, now: float
    ) -> tuple[Job, list[Action]]:
        """What `decide` makes of a create that failed: the record (with its status message) and the next actions.

        Why decide is called a second time here, not in one_job: the failure is an event (`CreateFailed`) that only
        acting can see, and it comes while this handler holds the record's lease. Decided at once by its own rule
        (decide.RULES[CreateFailed]), it moves the job to the next zone or tier within this delivery, with the same
        outcome as if it had come as an event of its own: no second read, no lease to take over, no wait for a
        redelivery between the zones of a walk."""
        kind = (
            CreateFailure.UNOFFERED
            if isinstance(error, UnofferedError)
            else CreateFailure.CAPACITY
            if isinstance(error, CapacityError)
            else CreateFailure.PERMANENT
        )
        failed = CreateFailed(f"create-failed/{action.machine}", now, job.job_id, action.attempt, kind, str(error))
        decided, more = decide(job, failed, now, self.policy, outlook=self.outlook(now, failed, job.spec))
        assert decided is not None
        return self._with_status_message(job, decided, now), more

    def _publish(self, job: Job, generation: int, now: float) -> None:
        """Publish the outbox, in order. A notice that cannot be published (no topic, no permission) is logged and
        dropped: notices never hold up a job. A transient failure keeps the rest for the next handler."""
        for i, notice in enumerate(job.outbox if self.notifier is not None else ()):
            assert self.notifier is not None
            try:
                self.notifier.notify(notice)
            except TransientError as e:
                self._save_held(replace(job, pending=(), outbox=job.outbox[i:], pending_lease_until=now), generation)
                raise Retryable(f"publishing the status message {notice.get('id')}: {e}") from e
            except ProviderError as e:
                service_log.error(job.job_id, f"status message {notice.get('id')} dropped: {e}")

    def _observe(self, job: Job, generation: int, now: float) -> None:
        """Add the record's observations to the history (without a history store they are dropped). A transient
        failure keeps them for the next handler; any other is logged and they are dropped: the history is advice,
        it never holds up a job."""
        if not job.observations or self.histories is None:
            return
        try:
            self.histories.record(job.observations, now)
        except TransientError as e:
            held = replace(job, pending=(), outbox=(), pending_lease_until=now)
            self._save_held(held, generation)
            raise Retryable(f"recording {len(job.observations)} observations in the preemption history: {e}") from e
        except Exception as e:  # a store that refuses for good (permission): drop, say so
            service_log.error(job.job_id, f"observations dropped: the preemption history refused them: {e}")

    def _save_held(self, job: Job, generation: int) -> int:
        """Save a record whose lease we hold; losing it means another handler took over."""
        try:
            return self.records.save_watched(job, generation)
        except ConflictError as e:
            raise Retryable(f"job {job.job_id}: intent was taken over by another delivery") from e


def _dicts(actions: Sequence[Action]) -> tuple[dict[str, object], ...]:
    return tuple(action_to_dict(a) for a in actions)
