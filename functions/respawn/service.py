"""The one path every event takes: `Service.handle` routes it by type, and logs one line of what it came to.

The rooms behind it, one concern each:

  one_job.py          one event on one job: read, take over crashed intent, decide, persist intent, act, clear
  records.py          the cache of records and compare-and-set (the cache is only a hint)
  acting.py           intent before effect: leases, acting, create failures fed back into decide, status messages
  histories.py        the preemption history: read merged with the observations not yet folded, folded by the sweep
  sweep.py            many jobs: the sweep and zone wake-ups, fanned out over one job each
  live_index.py       the records the sweep reads: the live index, its markers removed, its migration
  providers.py        the machine providers by API, for acting and listing
  outcome.py          what an event came to (`Result`), and `Retryable`
  service_settings.py the lease, the compare-and-set tries, the cache size, the index's settle time
  service_log.py      the structured log lines

bootstrap.py builds a Service, and every other store and client, from the deployed settings.

A store or API hiccup raises `Retryable` to the entry point, and Pub/Sub
delivers the event again; a crash between any two writes is repaired by that
redelivery or by the sweep.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from respawn import service_log
from respawn.acting import Acting
from respawn.events import Event, Ignored, JobEvent, JobRejected, JobSubmitted, SweepTicked, ZoneWokeUp
from respawn.histories import AdviceSource, Histories
from respawn.live_index import LiveJobs
from respawn.one_job import OneJob
from respawn.outcome import InFlight, Outcome, Result, Retryable
from respawn.policy import Policy
from respawn.ports import Clock, HistoryStore, JobStore, LiveIndex, MachineProvider, StatusNotifier, TransientError
from respawn.providers import Providers
from respawn.records import Records
from respawn.service_settings import ServiceSettings
from respawn.sweep import Sweep

__all__ = ["InFlight", "Outcome", "Result", "Retryable", "Service", "ServiceSettings"]

DEFAULT_POLICY = Policy()
DEFAULT_SETTINGS = ServiceSettings()


class Service:
    def __init__(
        self,
        store: JobStore,
        providers: Mapping[str, MachineProvider],
        clock: Clock,
        policy: Policy = DEFAULT_POLICY,
        notifier: StatusNotifier | None = None,
        *,
        settings: ServiceSettings = DEFAULT_SETTINGS,
        history: HistoryStore | None = None,
        advice: AdviceSource | None = None,
        index: LiveIndex | None = None,
    ) -> None:
        """Without a `notifier` no status message is kept or published. Without a `history` store no preemption history
        is kept and decide places machines in list order (no outlook); `advice` adds the Advice API's word on a
        job's machines to its outlook. Without an `index` (the live index beside the records) every sweep reads
        every record."""
        self.providers, self.notifier, self.history = providers, notifier, history  # what it was wired with
        records = Records(store, settings.cached_records, index)
        machines = Providers(providers)
        histories = Histories(history, advice=advice) if history is not None else None
        acting = Acting(records, machines, notifier, policy, settings.lease_s, histories)
        self._one_job = OneJob(records, machines, acting, clock, policy, settings.max_conflicts)
        live = LiveJobs(records, index, settings.index_settle_s)
        self._sweep = Sweep(records, machines, self._one_job, clock, live, histories)
        service_log.ensure_handler()

    def handle(self, event: Event) -> Outcome:
        try:
            outcome = self._route(event)
        except (Retryable, TransientError) as e:  # a store or API hiccup: Pub/Sub delivers the event again
            service_log.retrying(event, str(e))
            if isinstance(e, Retryable):
                raise
            raise Retryable(str(e)) from e
        service_log.handled(event, outcome)
        return outcome

    def _route(self, event: Event) -> Outcome:
        match event:
            case Ignored():
                return Outcome(Result.IGNORED)
            case SweepTicked():
                return self._sweep.sweep(event)
            case ZoneWokeUp():
                return self._sweep.wake(event)
            case _:
                return self._on_job(event)

    def _on_job(self, event: JobEvent) -> Outcome:
        """An event of one job. A rejected job message keeps its record (and its notice) but reads `rejected`."""
        job_id = event.spec.job_id if isinstance(event, JobSubmitted) else event.job_id
        if job_id is None:
            return Outcome(Result.REJECTED)
        new_job = isinstance(event, (JobSubmitted, JobRejected))  # usually for a job id never seen before
        outcome = self._one_job.apply(job_id, event, new_job=new_job)
        return replace(outcome, result=Result.REJECTED) if isinstance(event, JobRejected) else outcome
