"""The live index: the records the sweep reads, whatever the number of jobs that ended.

Beside each record the sweep must watch (`Job.swept`: live, holding a
machine, or holding intent) lies a marker, `respawn/live/JOB_ID`; the sweep
lists the markers and reads only those records. A record that ended and holds
nothing leaves the index, and is still read by job id (`respawn status`,
`report`, `logs`).

The order of writes, each safe against a crash or a race at any point:

* A handler writes the marker before the write that makes a record the
  sweep's (`Records.save`), rewriting it where it exists: a new generation. A
  crash between leaves a marker whose record is absent or not the sweep's; the
  sweep removes it.
* The sweep removes the marker of a record that is not the sweep's in two
  steps: it rewrites the record as it read it (compare-and-set, a new
  generation), then deletes the marker iff the marker is still at the
  generation it listed. A handler that made the record the sweep's meanwhile
  either wrote first (the sweep's rewrite conflicts: the marker stays) or
  wrote after, on a fresh read, rewriting the marker after the sweep listed it
  (the delete's precondition fails, or the marker is written again after the
  delete). A crash between the two steps leaves the marker to the next sweep.
* A marker whose record does not exist (a crash between a submit's marker and
  its record, the submit never delivered again) is removed once it is older
  than any delivery can take (`ORPHAN_MARKER_S`).

Migration: a deployment whose records predate the index has no index state
(`respawn/live.json`). Until the state says the index is complete, the sweep
reads every record as before, writes the markers of those it watches, and
writes the state: `since`, when it first did. The first such sweep that begins
`settle_s` after `since` (longer than any delivery of the code before the index
can take) marks it complete, and the sweeps after it read the index; a store
with no records at all is complete at once. The state also keeps the zones of
every job that left the index, which the sweep still lists for orphaned
machines.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from respawn.jobs import Job
from respawn.ports import ConflictError, IndexState, LiveIndex, Marker
from respawn.records import Read, Records

# A marker without a record is removed once older than this: far longer than a delivery can take between writing the
# marker and the record (a function's timeout is at most 540 s).
ORPHAN_MARKER_S = 3600.0


@dataclass(frozen=True)
class Swept:
    """What the sweep reads: `reads`, the records (all of them when `every_record`); `zones`, the (API, zone) pairs of
    jobs no longer in the index, to list still; `markers`, the markers listed (none while the index is being built)."""

    reads: dict[str, Read]
    zones: frozenset[tuple[str, str]]
    markers: dict[str, Marker]
    every_record: bool


def zones_of(jobs: list[Job | None]) -> frozenset[tuple[str, str]]:
    """Every (API, zone) of these jobs' specs."""
    return frozenset(
        (job.spec.machine.api, zone) for job in jobs if job is not None and job.spec for zone in job.spec.every_zone
    )


@dataclass(frozen=True)
class LiveJobs:
    """The sweep's side of the index: which records it reads, and the markers it removes (module docstring)."""

    records: Records
    index: LiveIndex | None
    settle_s: float  # how long after the first building sweep a sweep that reads every record completes the index
    tries: int = 3

    def for_the_sweep(self, now: float) -> Swept:
        """The records of the markers once the index is complete; until then every record (the index built on the way).
        Without an index, every record."""
        if self.index is None:
            return Swept(self.records.every_record(), frozenset(), {}, every_record=True)
        state, generation = self.index.load_state()
        if state is not None and state.complete:
            markers = self.index.markers()
            reads = {job_id: self.records.fresh(job_id) for job_id in sorted(markers)}
            return Swept(reads, state.zones, markers, every_record=False)
        return Swept(self._build(self.index, state, generation, now), frozenset(), {}, every_record=True)

    def _build(self, index: LiveIndex, state: IndexState | None, generation: int, now: float) -> dict[str, Read]:
        """Every record read, a marker written for each the sweep watches that has none, and the index's state: its
        `since`, complete once this sweep began `settle_s` after it (a store with no records has nothing to migrate:
        complete at once), and every record's zones."""
        reads = self.records.every_record()
        markers = index.markers()
        for job_id, read in reads.items():
            if read.job is not None and read.job.swept and job_id not in markers:
                index.enter(job_id)
        zones = zones_of([read.job for read in reads.values()])
        try:
            if state is None:
                index.save_state(IndexState(now, complete=not reads, zones=zones), 0)
            elif now >= state.since + self.settle_s or not zones <= state.zones:
                complete = now >= state.since + self.settle_s
                index.save_state(replace(state, complete=complete, zones=state.zones | zones), generation)
        except ConflictError:
            pass  # another sweep wrote it: the next one looks again
        return reads

    def retire(self, swept: Swept, now: float) -> list[str]:
        """Remove the markers of the records the sweep no longer watches (module docstring); returns their job ids.
        Each record as this service last read or wrote it: a stale one only makes its rewrite conflict, for the next
        sweep."""
        if self.index is None or not swept.markers:
            return []
        done: dict[str, Read] = {}
        for job_id, marker in swept.markers.items():
            read = self.records.hinted(job_id)
            if read.job is None and now - marker.written_at > ORPHAN_MARKER_S:
                self._leave(self.index, job_id, marker)
            elif read.job is not None and not read.job.swept:
                done[job_id] = read
        if not done or not self._keep_zones(self.index, zones_of([read.job for read in done.values()])):
            return []
        retired = []
        for job_id, read in done.items():
            assert read.job is not None
            try:
                self.records.save(read.job, read.generation, read.job)  # the same record at a new generation
            except ConflictError:
                continue  # a handler wrote it meanwhile: the next sweep sees what it made of it
            if self._leave(self.index, job_id, swept.markers[job_id]):
                retired.append(job_id)
        return retired

    def _keep_zones(self, index: LiveIndex, zones: frozenset[tuple[str, str]]) -> bool:
        """The index's state holds `zones` (written under compare-and-set when it did not); False when it could not."""
        for _ in range(self.tries):
            state, generation = index.load_state()
            if state is None:
                return False
            if zones <= state.zones:
                return True
            try:
                index.save_state(replace(state, zones=state.zones | zones), generation)
                return True
            except ConflictError:
                continue
        return False

    @staticmethod
    def _leave(index: LiveIndex, job_id: str, marker: Marker) -> bool:
        try:
            index.leave(job_id, marker.generation)
        except ConflictError:
            return False  # written again since it was listed: the record became the sweep's, or may yet
        return True
