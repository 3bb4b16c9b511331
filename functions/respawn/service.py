"""The one path every event takes: load, decide, persist intent, act, clear intent.

A handler persists the new record with its actions in `Job.pending`, the notice
of a status change in `Job.outbox` and a lease before it touches a machine or
publishes, then acts, publishes, and clears both. A handler that
loads a record whose lease ran out (its writer crashed) takes the lease over,
executes the pending actions (all idempotent) and then handles its own event.
A live lease means another delivery is acting: a duplicate of an event already
recorded is acknowledged, anything else raises `Retryable` so Pub/Sub
redelivers it later. Every record write is a compare-and-set; a conflict
reloads and decides again.

Each Service keeps the records it last read or wrote (a function instance
handles many events of the same jobs), so an event usually costs no read: the
compare-and-set of its write proves the cached generation current. The cache
is only a hint. A decision that writes nothing (the event changes nothing, or
another delivery holds the lease) is taken again on a fresh read before it
counts, except "already seen", which a stale record can only under-report.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from respawn.actions import Action, CreateMachine, action_from_dict, action_to_dict
from respawn.decide import DEAD, Policy, decide, is_stale
from respawn.events import (
    CreateFailed,
    CreateFailure,
    Event,
    Ignored,
    JobEvent,
    JobRejected,
    JobSubmitted,
    MachinesObserved,
    SweepTicked,
    TrainerFailed,
    ZoneWokeUp,
)
from respawn.model import Job, MachineState, parse_machine_name
from respawn.notices import status_notice
from respawn.ports import (
    CapacityError,
    Clock,
    ConflictError,
    JobStore,
    Machine,
    MachineProvider,
    PermanentError,
    ProviderError,
    StatusNotifier,
    TransientError,
)

log = logging.getLogger("respawn.service")
DEFAULT_POLICY = Policy()


class Retryable(Exception):
    """Raise to the entry point so Pub/Sub redelivers the message later."""


class InFlight(Retryable):
    """Another delivery holds the job's intent lease."""


@dataclass(frozen=True)
class Outcome:
    result: str  # applied | duplicate | stale | ignored | rejected
    job_ids: tuple[str, ...] = ()
    actions: tuple[Action, ...] = ()


class Service:
    def __init__(
        self,
        store: JobStore,
        providers: Mapping[str, MachineProvider],
        clock: Clock,
        policy: Policy = DEFAULT_POLICY,
        notifier: StatusNotifier | None = None,
    ) -> None:
        """Without a `notifier` no status notice is kept or published."""
        self.store = store
        self.providers = providers
        self.clock = clock
        self.policy = policy
        self.notifier = notifier
        self._cache: OrderedDict[str, tuple[Job, int]] = OrderedDict()  # job id -> (record, generation)
        self._cache_lock = threading.Lock()
        _ensure_log_handler()

    def handle(self, event: Event) -> Outcome:
        try:
            outcome = self._route(event)
        except (Retryable, TransientError) as e:  # a store or API hiccup: Pub/Sub delivers the event again
            _log_line("WARNING", event, "retry", (), (), reason=str(e))
            if isinstance(e, Retryable):
                raise
            raise Retryable(str(e)) from e
        _log_line("INFO", event, outcome.result, outcome.job_ids, outcome.actions)
        return outcome

    def _route(self, event: Event) -> Outcome:
        if isinstance(event, Ignored):
            return Outcome("ignored")
        if isinstance(event, SweepTicked):
            return self._sweep(event)
        if isinstance(event, ZoneWokeUp):
            return self._wake(event)
        job_id = event.spec.job_id if isinstance(event, JobSubmitted) else event.job_id
        if job_id is None:
            return Outcome("rejected")
        new = isinstance(event, (JobSubmitted, JobRejected))  # usually for a job id never seen before
        event_for: Callable[[Job | None, int], JobEvent] = lambda job, gen: event  # noqa: E731
        if isinstance(event, TrainerFailed):
            event_for = functools.partial(self._failed_with_machine, event)
        outcome = self._apply(job_id, event.event_id, event_for, new_job=new)
        return replace(outcome, result="rejected") if isinstance(event, JobRejected) else outcome

    def _failed_with_machine(self, event: TrainerFailed, job: Job | None, gen: int) -> TrainerFailed:
        """A `failed` entry of the live attempt, with what the API says of its machine: a slice that lost a worker
        VM (host error, maintenance) fails its other workers' trainers too, and that is a loss, not a failure.
        Entries of older attempts (every other worker's, once the first was handled) cost no read."""
        current = job.current if job is not None else None
        if job is None or job.spec is None or current is None or current.n != event.attempt or current.ended:
            return event
        try:
            machine = self._provider(job.spec.machine.kind).get(current.machine, current.zone, job.spec)
        except TransientError as e:
            raise Retryable(f"reading {current.machine}: {e}") from e
        except ProviderError:
            return event  # unreadable: judge by the entry alone
        return replace(event, machine_state=machine.state if machine is not None else MachineState.TERMINATED)

    # -- one job -----------------------------------------------------------------------------------------------------

    def _apply(
        self,
        job_id: str,
        event_id: str,
        event_for: Callable[[Job | None, int], JobEvent],
        loaded: tuple[Job | None, int] | None = None,
        new_job: bool = False,
    ) -> Outcome:
        """Load, settle crashed intent, decide, persist intent, act, clear: with CAS retries."""
        done: list[Action] = []
        fresh = False
        for _ in range(self.policy.max_conflicts):
            if loaded is not None:
                (job, gen), cached, loaded = loaded, False, None
            else:
                job, gen, cached = self._load(job_id, fresh, new_job)
            now = self.clock.now()
            try:
                if job is not None and event_id in job.seen_events and not _lease_expired(job, now):
                    return Outcome("duplicate", (job_id,), tuple(done))
                if job is not None and _intent(job):
                    if not _lease_expired(job, now):
                        if cached:
                            fresh = True
                            continue
                        raise InFlight(f"job {job_id}: another delivery is acting on it; retry later")
                    job, gen, settled = self._settle(job, gen, now)
                    done += settled
                    if event_id in job.seen_events:
                        return Outcome("duplicate", (job_id,), tuple(done))
                event = event_for(job, gen)
                new, actions = decide(job, event, now, self.policy)
                if new is None or (new == job and not actions):
                    if cached:
                        fresh = True
                        continue
                    return Outcome(_quiet(job, event), (job_id,), tuple(done))
                new = self._noted(job, new, now)
                intent = replace(
                    new,
                    pending=tuple(action_to_dict(a) for a in actions),
                    pending_lease_until=now + self.policy.lease_s if actions or new.outbox else None,
                )
                gen = self._save(intent, gen)
            except ConflictError:
                fresh = True
                continue
            if actions or intent.outbox:
                _, _, acted = self._act(intent, gen, actions, now)
                done += acted
            return Outcome("applied", (job_id,), tuple(done))
        raise Retryable(f"job {job_id}: the record kept changing under {self.policy.max_conflicts} tries")

    def _load(self, job_id: str, fresh: bool, new_job: bool = False) -> tuple[Job | None, int, bool]:
        """(record, generation, from the cache or a guess).

        Like a cached record, the guess "no record" for a job id never seen is checked by the write: it is
        create-only (generation 0), and a conflict or a decision to change nothing reads the record fresh.
        """
        if not fresh:
            with self._cache_lock:
                hit = self._cache.get(job_id)
            if hit is not None:
                return hit[0], hit[1], True
            if new_job:
                return None, 0, True
        job, gen = self.store.load(job_id)
        self._remember(job_id, job, gen)
        return job, gen, False

    def _save(self, job: Job, gen: int) -> int:
        try:
            new_gen = self.store.save(job, gen)
        except ConflictError:
            self._remember(job.job_id, None, 0)
            raise
        self._remember(job.job_id, job, new_gen)
        return new_gen

    def _remember(self, job_id: str, job: Job | None, gen: int) -> None:
        with self._cache_lock:
            self._cache.pop(job_id, None)
            if job is not None:
                self._cache[job_id] = (job, gen)
                if len(self._cache) > self.policy.cached_records:
                    self._cache.popitem(last=False)

    def _noted(self, old: Job | None, new: Job, now: float) -> Job:
        """`new` with the notice of its status change in the outbox (when it changed and notices are published)."""
        if self.notifier is None or (old is not None and old.status is new.status):
            return new
        return replace(new, outbox=(*new.outbox, status_notice(old, new, now)))

    def _settle(self, job: Job, gen: int, now: float) -> tuple[Job, int, list[Action]]:
        """Take over intent whose lease ran out and carry it out."""
        job = replace(job, pending_lease_until=now + self.policy.lease_s)
        gen = self._save(job, gen)  # a conflict means someone else took it: reload
        return self._act(job, gen, [action_from_dict(d) for d in job.pending], now)

    def _act(self, job: Job, gen: int, actions: list[Action], now: float) -> tuple[Job, int, list[Action]]:
        """Execute the actions; feed create failures back into decide; publish the notices; clear the intent.
        We hold the lease."""
        queue, done = list(actions), []
        feedback_left = len(job.spec.every_zone) + len(job.spec.all_tiers) if job.spec else 0
        while queue:
            action = queue[0]
            try:
                self._execute(job, action)
            except TransientError as e:
                self._save_held(replace(job, pending=_dicts(queue), pending_lease_until=now), gen)
                raise Retryable(f"{action.machine}: {e}") from e
            except ProviderError as e:
                queue.pop(0)
                if not isinstance(action, CreateMachine) or feedback_left <= 0:
                    _log_error(job.job_id, f"{type(action).__name__} {action.machine} failed: {e}")
                    continue
                feedback_left -= 1
                kind = CreateFailure.CAPACITY if isinstance(e, CapacityError) else CreateFailure.PERMANENT
                failed = CreateFailed(f"create-failed/{action.machine}", now, job.job_id, action.attempt, kind, str(e))
                decided, more = decide(job, failed, now, self.policy)
                assert decided is not None
                decided = self._noted(job, decided, now)
                queue += more
                job = replace(decided, pending=_dicts(queue), pending_lease_until=now + self.policy.lease_s)
                gen = self._save_held(job, gen)
                continue
            done.append(queue.pop(0))
        job = self._publish(job, gen, now)
        job = replace(job, pending=(), outbox=(), pending_lease_until=None)
        return job, self._save_held(job, gen), done

    def _publish(self, job: Job, gen: int, now: float) -> Job:
        """Publish the outbox, in order. A notice that cannot be published (no topic, no permission) is logged and
        dropped: notices never hold up a job. A transient failure keeps the rest for the next handler."""
        for i, notice in enumerate(job.outbox if self.notifier is not None else ()):
            assert self.notifier is not None
            try:
                self.notifier.notify(notice)
            except TransientError as e:
                self._save_held(replace(job, pending=(), outbox=job.outbox[i:], pending_lease_until=now), gen)
                raise Retryable(f"publishing the status notice {notice.get('id')}: {e}") from e
            except ProviderError as e:
                _log_error(job.job_id, f"status notice {notice.get('id')} dropped: {e}")
        return job

    def _save_held(self, job: Job, gen: int) -> int:
        """Save a record whose lease we hold; losing it means another handler took over."""
        try:
            return self._save(job, gen)
        except ConflictError as e:
            raise Retryable(f"job {job.job_id}: intent was taken over by another delivery") from e

    def _execute(self, job: Job, action: Action) -> None:
        assert job.spec is not None
        provider = self._provider(job.spec.machine.kind)
        if isinstance(action, CreateMachine):
            provider.create(action, job.spec)
        else:
            provider.delete(action.machine, action.zone, job.spec)

    def _provider(self, kind: str) -> MachineProvider:
        provider = self.providers.get(kind)
        if provider is None:
            raise PermanentError(f"no machine provider for machine kind {kind!r}; configured: {sorted(self.providers)}")
        return provider

    # -- many jobs: sweep and zone wake-up ---------------------------------------------------------------------------

    def _sweep(self, tick: SweepTicked) -> Outcome:
        """Every job that is live or may still hold a machine: observe its zones and let decide repair."""
        records = self._load_all()
        zones = {
            (job.spec.machine.kind, z) for job, _ in records.values() if job and job.spec for z in job.spec.every_zone
        }
        listing = self._list(zones)
        wanted = {  # a rejected record (no spec) is wanted only for its unpublished notice
            job_id
            for job_id, (job, _) in records.items()
            if job is not None
            and (_intent(job) or (job.spec is not None and (not job.status.terminal or _holds_a_machine(job))))
        }
        return self._observe_all(tick.event_id, records, wanted | listing.keys(), listing, _spec_zones)

    def _wake(self, woke: ZoneWokeUp) -> Outcome:
        """A system event on a TPU worker in a zone: act for the jobs whose machines there the API shows dead.

        One listing per machine kind and a read of only the affected records; a job whose machine the API
        does not show dead yet is the sweep's (it re-reads every job).
        """
        listing = self._list({(kind, woke.zone) for kind in self.providers})
        hit = {job_id for job_id, machines in listing.items() if any(m.state in DEAD for m in machines)}
        records = {job_id: self._load(job_id, fresh=True)[:2] for job_id in sorted(hit)}
        return self._observe_all(woke.event_id, records, hit, listing, lambda job: (woke.zone,))

    def _observe_all(
        self,
        event_id: str,
        records: dict[str, tuple[Job | None, int]],
        job_ids: Iterable[str],
        listing: dict[str, list[Machine]],
        zones_of: Callable[[Job], tuple[str, ...]],
    ) -> Outcome:
        outcomes, retry = [], []
        for job_id in sorted(set(job_ids) & records.keys()):
            first = records[job_id]

            def observe(
                job: Job | None, gen: int, job_id: str = job_id, first: tuple[Job | None, int] = first
            ) -> JobEvent:
                zones = zones_of(job) if job is not None and job.spec is not None else ()
                if gen == first[1]:  # the listing was taken after this generation was loaded
                    machines = [m for m in listing.get(job_id, []) if m.zone in zones]
                else:
                    machines = self._observe(job, zones)
                return MachinesObserved(
                    f"{event_id}/{job_id}",
                    self.clock.now(),
                    job_id,
                    tuple((m.name, m.zone, m.state) for m in machines),
                    zones,
                    tuple((m.name, m.detail) for m in machines if m.detail),
                )

            try:
                outcomes.append(self._apply(job_id, f"{event_id}/{job_id}", observe, first))
            except InFlight:
                continue  # its lease holder finishes, or the next sweep after the lease settles it
            except (Retryable, TransientError) as e:
                retry.append(f"{job_id}: {e}")
        if retry:
            raise Retryable("; ".join(retry))
        touched = [o for o in outcomes if o.result == "applied" or o.actions]
        return Outcome(
            "applied" if touched else "ignored",
            tuple(o.job_ids[0] for o in touched),
            tuple(a for o in touched for a in o.actions),
        )

    def _load_all(self) -> dict[str, tuple[Job | None, int]]:
        records = {job_id: self.store.load(job_id) for job_id in self.store.list_ids()}
        for job_id, (job, gen) in records.items():
            self._remember(job_id, job, gen)
        return records

    def _list(self, zones: set[tuple[str, str]]) -> dict[str, list[Machine]]:
        """respawn's machines in these (kind, zone)s, grouped by job id (from the deterministic name)."""
        by_job: dict[str, list[Machine]] = {}
        for kind, zone in sorted(zones):
            provider = self.providers.get(kind)
            for machine in self._listed(provider, zone, None) if provider else []:
                parsed = parse_machine_name(machine.name)
                if parsed is not None:
                    by_job.setdefault(parsed[0], []).append(machine)
        return by_job

    def _observe(self, job: Job | None, zones: tuple[str, ...]) -> list[Machine]:
        if job is None or job.spec is None:
            return []
        provider = self._provider(job.spec.machine.kind)
        return [m for z in zones for m in self._listed(provider, z, job.job_id)]

    @staticmethod
    def _listed(provider: MachineProvider, zone: str, job_id: str | None) -> list[Machine]:
        try:
            return provider.list(zone, job_id)
        except TransientError as e:
            raise Retryable(f"listing machines in {zone}: {e}") from e


def _spec_zones(job: Job) -> tuple[str, ...]:
    return job.spec.every_zone if job.spec else ()


def _intent(job: Job) -> bool:
    """The record holds intent not yet carried out: machine actions or status notices."""
    return bool(job.pending or job.outbox)


def _holds_a_machine(job: Job) -> bool:
    return any(not a.machine_deleted for a in job.attempts)


def _lease_expired(job: Job, now: float) -> bool:
    return _intent(job) and (job.pending_lease_until is None or job.pending_lease_until <= now)


def _dicts(actions: list[Action]) -> tuple[dict[str, object], ...]:
    return tuple(action_to_dict(a) for a in actions)


def _quiet(job: Job | None, event: JobEvent) -> str:
    """The result of an event that changed nothing."""
    if job is not None and is_stale(job, event):
        return "stale"
    if job is not None and isinstance(event, JobSubmitted):
        return "duplicate"
    return "ignored"


# -- structured log lines --------------------------------------------------------------------------------------------


@functools.cache
def _kind(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _log_line(
    severity: str, event: Event, result: str, job_ids: tuple[str, ...], actions: tuple[Action, ...], **extra: str
) -> None:
    """One JSON line per handled event. Never includes the job's env, args or image."""
    job_id = getattr(event, "job_id", None) or (event.spec.job_id if isinstance(event, JobSubmitted) else None)
    entry = {
        "severity": severity,
        "message": f"{_kind(type(event).__name__)} {result}",
        "event": _kind(type(event).__name__),
        "event_id": getattr(event, "event_id", None),
        "job_id": job_id,
        "job_ids": list(job_ids),
        "result": result,
        "actions": [action_to_dict(a) for a in actions],
        **extra,
    }
    log.log(
        logging.WARNING if severity == "WARNING" else logging.INFO,
        json.dumps({k: v for k, v in entry.items() if v is not None}),
    )


def _log_error(job_id: str, message: str) -> None:
    log.error(json.dumps({"severity": "ERROR", "message": message, "job_id": job_id}))


def _ensure_log_handler() -> None:
    """Cloud Functions read JSON lines on stderr; add a handler only when nobody configured logging."""
    package = logging.getLogger("respawn")
    if not package.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        package.addHandler(handler)
        package.setLevel(logging.INFO)
