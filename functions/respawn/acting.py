"""Intent before effect: persist what a decision will do under a lease, do it, publish its notices, clear it.

A decision's machine actions go into `Job.pending` and the notice of its
status change into `Job.outbox`, written with a lease (`pending_lease_until`)
by the same compare-and-set as the new record. The lease holder then acts,
publishes and clears both. A handler that crashes in between leaves the intent
to whoever loads the record after the lease ran out (a redelivery, the sweep):
every action is idempotent and a notice's `id` deterministic, so carrying it
out again is safe.

The observations of ended attempts (`Job.observations`) are intent too: the lease
holder adds them to the deployment's preemption history (`Histories`) under
compare-and-set, then clears them. The history remembers the ids it counted, so a
crash between its write and the record's counts nothing twice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from respawn import service_log
from respawn.actions import Action, CreateMachine, action_from_dict, action_to_dict
from respawn.decide import decide
from respawn.events import CheckpointSaved, CreateFailed, CreateFailure, JobEvent, TrainerProgressed, TrainerStarted
from respawn.facts import log_facts
from respawn.jobs import Job, JobSpec
from respawn.outcome import Retryable
from respawn.outlook import Advice, History, Observation, Outlook
from respawn.policy import Policy
from respawn.ports import (
    CapacityError,
    ConflictError,
    HistoryStore,
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

# What Google's Advice API says for a job's machines, per (machine type, provisioning model) of its tiers: built by
# bootstrap around the Advisor adapter, which answers GPU machine types only, caches and never raises.
AdviceSource = Callable[[JobSpec], Mapping[tuple[str, str], Advice]]


def has_intent(job: Job) -> bool:
    """The record holds intent not yet carried out: machine actions, status messages or history observations."""
    return bool(job.pending or job.outbox or job.observations)


class Histories:
    """The deployment's preemption history: read for decide through an in-process cache, written from observations.

    Every decision that may place a machine reads it; a history a minute old ranks zones as well as a fresh one, so
    reads are cached `cache_s` (60 s). A read that fails gives an outlook without history and a note saying why (the
    zones then rank on no data: list order, the penalty aside): a store hiccup never fails an event."""

    def __init__(
        self, store: HistoryStore, *, advice: AdviceSource | None = None, cache_s: float = 60.0, tries: int = 5
    ) -> None:
        self.store, self.advice, self.cache_s, self.tries = store, advice, cache_s, tries
        self._cached: tuple[float, Outlook] | None = None

    def outlook(self, now: float, *, read: bool = True, spec: JobSpec | None = None) -> Outlook:
        """The outlook of the history as of at most `cache_s` ago, with the Advice API's word on `spec`'s machines
        when there is an advice source; without `read`, whatever history is cached and no advice (no I/O)."""
        history = self._history(now, read)
        if not read or spec is None or self.advice is None:
            return history
        return replace(history, advice=self.advice(spec))

    def _history(self, now: float, read: bool) -> Outlook:
        if self._cached is not None and (not read or now - self._cached[0] < self.cache_s):
            return self._cached[1]
        if not read:
            return Outlook(History(), note="the preemption history was not read for this event")
        try:
            outlook = Outlook(self.store.load()[0])
        except Exception as e:  # any failure to read: rank on no data and say so, never fail the event
            outlook = Outlook(History(), note=f"preemption history unreadable ({type(e).__name__}: {e}); no data")
        self._cached = (now, outlook)
        return outlook

    def record(self, observations: Sequence[Mapping[str, Any]], now: float) -> None:
        """Add the observations not counted yet, under compare-and-set (a conflict: reload and again, `tries` times).
        Raises TransientError when the store keeps failing or changing; anything else the store raises."""
        parsed = [Observation.from_dict(o) for o in observations]
        for _ in range(self.tries):
            history, generation = self.store.load()
            new = history.record(parsed)
            if new is history:
                return  # every one counted already: a crash after the history's write, before the record's
            try:
                self.store.save(new, generation)
            except ConflictError:
                continue
            self._cached = (self._cached[0] if self._cached else now, Outlook(new))
            return
        raise TransientError(f"the preemption history kept changing under {self.tries} tries")


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
        generation = self.records.save(job, read.generation)
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
            return self.records.save(job, generation)
        except ConflictError as e:
            raise Retryable(f"job {job.job_id}: intent was taken over by another delivery") from e


def _dicts(actions: Sequence[Action]) -> tuple[dict[str, object], ...]:
    return tuple(action_to_dict(a) for a in actions)
