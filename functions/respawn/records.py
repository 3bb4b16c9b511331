"""Job records as the service reads and writes them: a cache of the last generation seen, and compare-and-set.

A function instance handles many events of the same jobs, so the record it
last read or wrote is usually current and an event costs no read. The cache is
only a hint: every write is a compare-and-set on the generation read, so a
stale record fails its write (ConflictError) and is read afresh.

With a live index (`LiveIndex`), a write that makes a record the sweep's
(`Job.swept`: a new record, a rejected one submitted again, an ended one given
intent) writes the job's marker first: intent before effect, so no record the
sweep must watch is ever without its marker (respawn/live_index.py).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from respawn.jobs import Job
from respawn.ports import ConflictError, JobStore, LiveIndex


@dataclass(frozen=True)
class Read:
    """A job's record (None: there is none) at a generation of the store (0: none).

    `cached`: taken from the cache, or guessed absent for a job id never seen: a hint that only a write's
    compare-and-set confirms, so a decision on it that writes nothing must be taken again on a fresh read.
    """

    job: Job | None
    generation: int
    cached: bool = False


class Records:
    def __init__(self, store: JobStore, capacity: int, index: LiveIndex | None = None) -> None:
        self.store, self.index = store, index
        self._capacity = capacity
        self._cache: OrderedDict[str, Read] = OrderedDict()  # job id -> last read or written, least recent first
        self._lock = threading.Lock()

    def hinted(self, job_id: str, *, new_job: bool = False) -> Read:
        """The cached record, or for a job id never seen (`new_job`) the guess "no record", else a fresh read.

        The guess costs no read because the write that follows is create-only (generation 0): a record that does
        exist makes it conflict, and the record is read afresh."""
        with self._lock:
            hit = self._cache.get(job_id)
        if hit is not None:
            return Read(hit.job, hit.generation, cached=True)
        if new_job:
            return Read(None, 0, cached=True)
        return self.fresh(job_id)

    def fresh(self, job_id: str) -> Read:
        job, generation = self.store.load(job_id)
        self._remember(job_id, job, generation)
        return Read(job, generation)

    def every_record(self) -> dict[str, Read]:
        """A fresh read of every job's record (the sweep)."""
        return {job_id: self.fresh(job_id) for job_id in self.store.list_ids()}

    def save(self, job: Job, generation: int, was: Job | None) -> int:
        """Write `job` over `generation`, at which the store held `was` (None: no record); ConflictError if another
        writer got there first. Returns the new generation. A record that becomes the sweep's gets its marker first
        (rewritten at a new generation where it exists, so that a sweep about to remove it cannot)."""
        if self.index is not None and job.swept and (was is None or not was.swept):
            self.index.enter(job.job_id)
        return self.save_watched(job, generation)

    def save_watched(self, job: Job, generation: int) -> int:
        """`save` over a record the sweep watches already (one holding intent under this handler's lease)."""
        try:
            new_generation = self.store.save(job, generation)
        except ConflictError:
            self._remember(job.job_id, None, 0)
            raise
        self._remember(job.job_id, job, new_generation)
        return new_generation

    def _remember(self, job_id: str, job: Job | None, generation: int) -> None:
        with self._lock:
            self._cache.pop(job_id, None)
            if job is not None:
                self._cache[job_id] = Read(job, generation)
                if len(self._cache) > self._capacity:
                    self._cache.popitem(last=False)
