"""Ports: the interfaces the service needs from the outside world."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from respawn.actions import CreateMachine
from respawn.jobs import Job, JobSpec, MachineState
from respawn.outlook import History, Observation


class ProviderError(Exception):
    """Base of the errors a MachineProvider or StatusNotifier raises (the message is safe to show a user)."""


class CapacityError(ProviderError):
    """No capacity in the zone (RESOURCE_EXHAUSTED, ZONE_RESOURCE_POOL_EXHAUSTED, stockout): try elsewhere."""


class QuotaError(CapacityError):
    """Quota exceeded in the region: treated like capacity (walk the zones, back off)."""


class UnofferedError(CapacityError):
    """The zone does not offer the machine (its machine or accelerator type is not listed there): a stockout that
    never ends, so the zone is skipped from then on."""


class PermanentError(ProviderError):
    """400 / 403 / 404 on the project: retrying will not help; the job ends with this reason."""


class TransientError(ProviderError):
    """429 / 5xx / timeout: raise so Pub/Sub redelivers."""


@dataclass(frozen=True)
class Machine:
    name: str
    zone: str
    state: MachineState
    labels: dict[str, str] = field(default_factory=dict)
    detail: str = ""  # why a FAILED machine failed, in the API's words


class MachineProvider(Protocol):
    """Creates and deletes one kind of machine (Cloud TPU nodes or Spot GPU VMs)."""

    def create(self, action: CreateMachine, spec: JobSpec) -> None:
        """Create `action.machine` in `action.zone`. AlreadyExists is success."""

    def delete(self, name: str, zone: str, spec: JobSpec | None = None) -> None:
        """Delete the machine. NotFound is success. Does not wait for completion longer than needed.
        `spec`, the job's, says how its machines were requested (None: unknown, look every way)."""

    def get(self, name: str, zone: str, spec: JobSpec | None = None) -> Machine | None:
        """The machine, or None when it does not exist."""

    def set_world(self, name: str, zone: str, spec: JobSpec, world: str) -> None:
        """Write the metadata key `respawn-world` = `world` (JSON with an integer "version") on every VM of the
        machine, leaving any VM whose key holds a newer version as it is. A machine that is gone is done."""

    def list(self, zone: str, job_id: str | None = None) -> list[Machine]:
        """respawn's machines in `zone` (label respawn-managed), optionally only those of one job."""


class ConflictError(Exception):
    """A compare-and-set write lost the race: reload and re-decide."""


class JobStore(Protocol):
    """Job records with compare-and-set. generation 0 means 'does not exist yet'."""

    def load(self, job_id: str) -> tuple[Job | None, int]:
        """(record, generation); (None, 0) when absent."""

    def save(self, job: Job, generation: int) -> int:
        """Write iff the stored generation is still `generation` (0: create). Returns the new generation.
        Raises ConflictError otherwise."""

    def list_ids(self) -> list[str]:
        """Every job id in the store."""


@dataclass(frozen=True)
class Marker:
    """A live job's marker in the index: its generation (a new one at every `enter`) and when it was written."""

    generation: int
    written_at: float


@dataclass(frozen=True)
class IndexState:
    """The index's own object: `since`, when the first sweep that built it began; `complete`, whether a sweep that
    read every record began at least the settle time after `since` (until then every sweep reads every record);
    `zones`, the (API, zone) pairs of every job whose marker was removed, which the sweep still lists for orphaned
    machines."""

    since: float
    complete: bool = False
    zones: frozenset[tuple[str, str]] = frozenset()

    def to_json(self) -> dict[str, Any]:
        zones = sorted([api, zone] for api, zone in self.zones)
        return {"since": self.since, "complete": self.complete, "zones": zones}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> IndexState:
        zones = frozenset((str(api), str(zone)) for api, zone in d.get("zones", ()))
        return IndexState(float(d["since"]), bool(d.get("complete", False)), zones)


class LiveIndex(Protocol):
    """The jobs the sweep watches: a marker per job beside the records (`respawn/live/JOB_ID`), and one object of
    the index's own state (`respawn/live.json`), written with compare-and-set."""

    def enter(self, job_id: str) -> None:
        """Write the job's marker: created, or rewritten at a new generation when it exists."""

    def markers(self) -> dict[str, Marker]:
        """Every marker, by job id."""

    def leave(self, job_id: str, generation: int) -> None:
        """Delete the marker iff it is still at `generation` (ConflictError otherwise); one already gone is no error."""

    def load_state(self) -> tuple[IndexState | None, int]:
        """(state, generation); (None, 0) when the index was never built."""

    def save_state(self, state: IndexState, generation: int) -> int:
        """Write iff the stored generation is still `generation` (0: create). Returns the new generation.
        Raises ConflictError otherwise."""


class HistoryStore(Protocol):
    """The deployment's preemption history (respawn.outlook.History): one object, written with compare-and-set, and
    the observations not yet folded into it, one object each."""

    def load(self) -> tuple[History, int]:
        """(history, generation); (History(), 0) when none was written yet."""

    def save(self, history: History, generation: int) -> int:
        """Write iff the stored generation is still `generation` (0: create). Returns the new generation.
        Raises ConflictError otherwise."""

    def add(self, observations: Sequence[Observation]) -> None:
        """Write each observation as its own object, named by its id, create-only: one already there stays as it is."""

    def pending(self) -> list[Observation]:
        """Every observation written and not dropped yet, in the order of their ids."""

    def drop(self, ids: Sequence[str]) -> None:
        """Delete the objects of these observations; one already gone is no error."""


class Clock(Protocol):
    def now(self) -> float: ...


class LogReader(Protocol):
    """Reads log entries (`respawn logs`)."""

    def entries(self, filter_: str) -> Iterable[Mapping[str, Any]]:
        """Every entry matching the Cloud Logging query `filter_`, oldest first, as LogEntry JSON."""


class StatusNotifier(Protocol):
    """Publishes the status changes of jobs (topic respawn-status)."""

    def notify(self, notice: dict[str, Any]) -> None:
        """Publish one notice (respawn.status_messages). Raises TransientError when a later try may succeed,
        PermanentError when it cannot (no such topic, no permission)."""
