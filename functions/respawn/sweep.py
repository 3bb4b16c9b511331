"""Many jobs at once: the sweep and zone wake-ups list machines and let `decide` repair each job from what it sees.

The sweep reads the records of the live index (every record while the index is
built: respawn/live_index.py) and lists every zone any job used, so it repairs
whatever a lost or crashed delivery left behind; it also reads the record of any
other job whose machine a listing shows. Then it removes the markers of records
it no longer watches and folds the pending observations into the preemption
history. A wake-up (a system event on a TPU worker, which names no node) lists
one zone and reads only the records of jobs whose machines there the API shows
dead; the rest is the sweep's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from respawn import service_log
from respawn.events import SweepTicked, ZoneWokeUp
from respawn.facts import log_waiting
from respawn.histories import Histories
from respawn.listing_policy import DEAD, zones_to_watch
from respawn.live_index import LiveJobs, Swept, zones_of
from respawn.one_job import OneJob, Sighting, observed
from respawn.outcome import InFlight, Outcome, Result, Retryable
from respawn.ports import Clock, Machine, TransientError
from respawn.providers import Providers
from respawn.records import Read, Records


@dataclass(frozen=True)
class Sweep:
    records: Records
    machines: Providers
    one_job: OneJob
    clock: Clock
    live: LiveJobs
    histories: Histories | None = None

    def sweep(self, tick: SweepTicked) -> Outcome:
        """Every job that is live or may still hold a machine: observe its zones and let decide repair."""
        now = self.clock.now()
        swept = self.live.for_the_sweep(now)
        reads = dict(swept.reads)
        log_waiting((read.job for read in reads.values()), now)
        listing = self.machines.by_job(zones_of([read.job for read in reads.values()]) | swept.zones)
        if not swept.every_record:  # a machine of a job out of the index: its record is read too
            more = {job_id: self.records.fresh(job_id) for job_id in sorted(listing.keys() - reads.keys())}
            reads |= {job_id: read for job_id, read in more.items() if read.job is not None}
        wanted = {job_id for job_id, read in reads.items() if read.job is not None and read.job.swept}
        outcome, retry = self._observe_each(tick.event_id, reads, wanted | listing.keys(), listing, zone=None)
        self._tidy(swept, now)
        if retry:
            raise Retryable("; ".join(retry))
        return outcome

    def _tidy(self, swept: Swept, now: float) -> None:
        """Markers of records no longer watched removed, observations folded into the history; a failure is the next
        sweep's (logged, never failing this one)."""
        try:
            self.live.retire(swept, now)
        except Exception as e:  # housekeeping: a marker left is read once more by the next sweep
            service_log.dropped(
                f"markers of ended jobs not removed from the live index: {e}; the next sweep tries again"
            )
        if self.histories is None:
            return
        try:
            self.histories.fold()
        except Exception as e:  # the history is advice: readers merge what is not folded
            service_log.dropped(f"observations not folded into the preemption history: {e}; the next sweep tries again")

    def wake(self, woke: ZoneWokeUp) -> Outcome:
        """A system event on a TPU worker in a zone: act for the jobs whose machines there the API shows dead.

        One listing per API and a read of only the affected records; a job whose machine the API
        does not show dead yet is the sweep's (it re-reads every job).
        """
        listing = self.machines.by_job({(api, woke.zone) for api in self.machines.providers})
        hit = {job_id for job_id, machines in listing.items() if any(m.state in DEAD for m in machines)}
        reads = {job_id: self.records.fresh(job_id) for job_id in sorted(hit)}
        outcome, retry = self._observe_each(woke.event_id, reads, hit, listing, zone=woke.zone)
        if retry:
            raise Retryable("; ".join(retry))
        return outcome

    def _observe_each(
        self,
        event_id: str,
        reads: dict[str, Read],
        job_ids: Iterable[str],
        listing: dict[str, list[Machine]],
        *,
        zone: str | None,
    ) -> tuple[Outcome, list[str]]:
        """Each job's machines as listed, to decide; one job's hiccup does not hold up the others (returned, to be
        handed back for redelivery)."""
        outcomes, retry = [], []
        for job_id in sorted(set(job_ids) & reads.keys()):
            read = reads[job_id]
            zones = zones_to_watch(read.job, zone)
            machines = [m for m in listing.get(job_id, []) if m.zone in zones]
            seen = observed(f"{event_id}/{job_id}", self.clock.now(), job_id, zones, machines)
            try:
                outcomes.append(self.one_job.apply(job_id, Sighting(seen, read, zone)))
            except InFlight:
                continue  # its lease holder finishes, or the next sweep after the lease settles it
            except (Retryable, TransientError) as e:
                retry.append(f"{job_id}: {e}")
        touched = [o for o in outcomes if o.result is Result.APPLIED or o.actions]
        outcome = Outcome(
            Result.APPLIED if touched else Result.IGNORED,
            tuple(o.job_ids[0] for o in touched),
            tuple(a for o in touched for a in o.actions),
        )
        return outcome, retry
