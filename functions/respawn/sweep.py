"""Many jobs at once: the sweep and zone wake-ups list machines and let `decide` repair each job from what it sees.

The sweep reads every record and lists every zone in use, so it repairs
whatever a lost or crashed delivery left behind. A wake-up (a system event on a
TPU worker, which names no node) lists one zone and reads only the records of
jobs whose machines there the API shows dead; the rest is the sweep's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from respawn.acting import has_intent
from respawn.events import SweepTicked, ZoneWokeUp
from respawn.facts import log_waiting
from respawn.jobs import Job
from respawn.listing_policy import DEAD, zones_to_watch
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

    def sweep(self, tick: SweepTicked) -> Outcome:
        """Every job that is live or may still hold a machine: observe its zones and let decide repair."""
        reads = self.records.every_record()
        log_waiting((read.job for read in reads.values()), self.clock.now())
        api_zones = {
            (job.spec.machine.api, zone)
            for job in (read.job for read in reads.values())
            if job is not None and job.spec is not None
            for zone in job.spec.every_zone
        }
        listing = self.machines.by_job(api_zones)
        wanted = {job_id for job_id, read in reads.items() if read.job is not None and _wants_the_sweep(read.job)}
        return self._observe_each(tick.event_id, reads, wanted | listing.keys(), listing, zone=None)

    def wake(self, woke: ZoneWokeUp) -> Outcome:
        """A system event on a TPU worker in a zone: act for the jobs whose machines there the API shows dead.

        One listing per API and a read of only the affected records; a job whose machine the API
        does not show dead yet is the sweep's (it re-reads every job).
        """
        listing = self.machines.by_job({(api, woke.zone) for api in self.machines.providers})
        hit = {job_id for job_id, machines in listing.items() if any(m.state in DEAD for m in machines)}
        reads = {job_id: self.records.fresh(job_id) for job_id in sorted(hit)}
        return self._observe_each(woke.event_id, reads, hit, listing, zone=woke.zone)

    def _observe_each(
        self,
        event_id: str,
        reads: dict[str, Read],
        job_ids: Iterable[str],
        listing: dict[str, list[Machine]],
        *,
        zone: str | None,
    ) -> Outcome:
        """Each job's machines as listed, to decide; one job's hiccup does not hold up the others."""
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
        if retry:
            raise Retryable("; ".join(retry))
        touched = [o for o in outcomes if o.result is Result.APPLIED or o.actions]
        return Outcome(
            Result.APPLIED if touched else Result.IGNORED,
            tuple(o.job_ids[0] for o in touched),
            tuple(a for o in touched for a in o.actions),
        )


def _wants_the_sweep(job: Job) -> bool:
    """A live job, one that may still hold a machine, or intent left to carry out (a rejected record, with no spec,
    only for its unpublished notice)."""
    if has_intent(job):
        return True
    return job.spec is not None and (not job.status.terminal or any(not a.machine_deleted for a in job.attempts))
