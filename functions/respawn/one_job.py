"""One event on one job: read, take over crashed intent, decide, persist intent, act, clear.

A record whose lease ran out holds the intent of a handler that crashed: it is
taken over and carried out first (`Acting.take_over`). A live lease means
another delivery is acting: a duplicate of an event already recorded is
acknowledged, anything else raises `InFlight` so Pub/Sub delivers it later.

Every write is a compare-and-set, so each try rests on one read of the record
and a conflict takes the event again on a fresh read. The first read may come
from the cache (`Records.hinted`): a decision on it that writes something is
checked by the write, but one that writes nothing (the event changes nothing,
another delivery holds the lease) could be a stale record's and is taken again
on a fresh read before it counts. "Already seen" counts on any read: a stale
record can only under-report the events seen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from respawn.acting import Acting, has_intent, lease_expired
from respawn.actions import Action
from respawn.decide import decide, is_stale
from respawn.events import JobEvent, JobSubmitted, MachinesObserved, TrainerFailed
from respawn.facts import log_facts
from respawn.jobs import Job, MachineState
from respawn.listing_policy import zones_to_watch
from respawn.outcome import InFlight, Outcome, Result, Retryable
from respawn.policy import Policy
from respawn.ports import Clock, ConflictError, Machine, ProviderError, TransientError
from respawn.providers import Providers
from respawn.records import Read, Records


@dataclass(frozen=True)
class Sighting:
    """What the sweep or a zone wake-up saw of one job's machines, listed after reading `read` of its record.

    On another generation of the record (crashed intent taken over, a conflicting write) the listing may predate a
    create, so the job's machines are listed again: in `zone` for a wake-up, in every zone of its spec for the sweep.
    """

    observed: MachinesObserved
    read: Read
    zone: str | None = None


@dataclass(frozen=True)
class OneJob:
    """One event on one job's record, in tries of one read each (the module docstring)."""

    records: Records
    machines: Providers
    acting: Acting
    clock: Clock
    policy: Policy
    max_conflicts: int  # tries, each on a fresh read after the first, before the event is handed back for redelivery

    def apply(self, job_id: str, event: JobEvent | Sighting, *, new_job: bool = False) -> Outcome:
        """Handle `event` on the job's record. `new_job`: the event usually names a job id never seen (a submit)."""
        done: list[Action] = []  # by this handler, on any try: taken-over intent and its own
        read = event.read if isinstance(event, Sighting) else self.records.hinted(job_id, new_job=new_job)
        for _ in range(self.max_conflicts):
            try:
                outcome = self._try(job_id, read, event, done)
            except ConflictError:
                outcome = None
            if outcome is not None:
                return outcome
            read = self.records.fresh(job_id)
        raise Retryable(f"job {job_id}: the record kept changing under {self.max_conflicts} tries")

    def _try(self, job_id: str, read: Read, event: JobEvent | Sighting, done: list[Action]) -> Outcome | None:
        """One try on one read; None: take it again on a fresh read. A lost compare-and-set raises ConflictError."""
        event_id = event.observed.event_id if isinstance(event, Sighting) else event.event_id
        job, now = read.job, self.clock.now()
        if job is not None and event_id in job.seen_events and not lease_expired(job, now):
            return Outcome(Result.DUPLICATE, (job_id,), tuple(done))
        if job is not None and has_intent(job):
            if not lease_expired(job, now):
                if read.cached:
                    return None
                raise InFlight(f"job {job_id}: another delivery is acting on it; retry later")
            read, taken_over = self.acting.take_over(read, now)
            done += taken_over
            job = read.job
            assert job is not None
            if event_id in job.seen_events:
                return Outcome(Result.DUPLICATE, (job_id,), tuple(done))
        judged = self._as_judged(event, read)
        spec = judged.spec if isinstance(judged, JobSubmitted) else job.spec if job is not None else None
        new, actions = decide(job, judged, now, self.policy, outlook=self.acting.outlook(now, judged, spec))
        if new is None or (new == job and not actions):
            return None if read.cached else Outcome(_result_of_no_change(job, judged), (job_id,), tuple(done))
        intent = self.acting.intent(job, new, actions, now)
        generation = self.records.save(intent, read.generation, job)
        log_facts(job, intent, now)  # this write won the compare-and-set: its facts are logged once, here
        if has_intent(intent):
            _, acted = self.acting.carry_out(intent, generation, actions, now)
            done += acted
        return Outcome(Result.APPLIED, (job_id,), tuple(done))

    def _as_judged(self, event: JobEvent | Sighting, read: Read) -> JobEvent:
        """The event as `decide` judges it on this read of the record: a trainer's failure with what the API says of
        its machine; machines listed before this generation of the record, listed again."""
        if isinstance(event, TrainerFailed):
            return self._with_machine_state(event, read.job)
        if isinstance(event, Sighting):
            if read.generation == event.read.generation:
                return event.observed
            zones = zones_to_watch(read.job, event.zone)
            machines = self.machines.of_job(read.job, zones)
            return observed(event.observed.event_id, self.clock.now(), event.observed.job_id, zones, machines)
        return event

    def _with_machine_state(self, event: TrainerFailed, job: Job | None) -> TrainerFailed:
        """A `failed` entry of the live attempt, with what the API says of its machine: a slice that lost a worker
        VM (host error, maintenance) fails its other workers' trainers too, and that is a loss, not a failure.
        Entries of older attempts (every other worker's, once the first was handled) cost no read."""
        current = job.current if job is not None else None
        if job is None or job.spec is None or current is None or current.n != event.attempt or current.ended:
            return event
        try:
            machine = self.machines.of_spec(job.spec).get(current.machine, current.zone, job.spec_of(current.machine))
        except TransientError as e:
            raise Retryable(f"reading {current.machine}: {e}") from e
        except ProviderError:
            return event  # unreadable: judge by the entry alone
        return replace(event, machine_state=machine.state if machine is not None else MachineState.TERMINATED)


def observed(
    event_id: str, now: float, job_id: str, zones: tuple[str, ...], machines: Sequence[Machine]
) -> MachinesObserved:
    """The event of what the API showed of a job's machines in `zones`."""
    return MachinesObserved(
        event_id,
        now,
        job_id,
        tuple((m.name, m.zone, m.state) for m in machines),
        zones,
        tuple((m.name, m.detail) for m in machines if m.detail),
    )


def _result_of_no_change(job: Job | None, event: JobEvent) -> Result:
    """Why an event changed nothing: it names an older attempt, it submits a job that exists, or it simply does not."""
    if job is not None and is_stale(job, event):
        return Result.STALE
    if job is not None and isinstance(event, JobSubmitted):
        return Result.DUPLICATE
    return Result.IGNORED
