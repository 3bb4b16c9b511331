"""Events: what happened (past tense). Produced by respawn.parsing, consumed by decide().

Every event has an `event_id` used for de-duplication (Pub/Sub message id,
LogEntry insertId, ...) and `time` (seconds since the epoch, from the source).
Events about a machine carry the attempt number they concern, so an event for
attempt N arriving after attempt N+1 started is recognisably stale.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from respawn.model import JobSpec, MachineState


@dataclass(frozen=True)
class JobSubmitted:
    event_id: str
    time: float
    spec: JobSpec


@dataclass(frozen=True)
class JobRejected:
    """A job message that failed validation. job_id is set when it was usable."""

    event_id: str
    time: float
    job_id: str | None
    error: str


@dataclass(frozen=True)
class CancelRequested:
    event_id: str
    time: float
    job_id: str


@dataclass(frozen=True)
class MachinePreempted:
    """A GCE system event naming one of respawn's machines (preempted, host error, host maintenance)."""

    event_id: str
    time: float
    job_id: str
    attempt: int
    machine: str
    zone: str
    project: str
    cause: str = "preempted"  # preempted | hostError | terminateOnHostMaintenance


@dataclass(frozen=True)
class ZoneWokeUp:
    """A system event on a TPU worker VM (t1v-n-*) in `zone`: re-read the job machines there."""

    event_id: str
    time: float
    zone: str
    project: str
    instance: str
    cause: str = "preempted"


@dataclass(frozen=True)
class TrainerStarted:
    event_id: str
    time: float
    job_id: str
    attempt: int
    restored_step: int | None = None
    startup_s: float | None = None


@dataclass(frozen=True)
class CheckpointSaved:
    """A save completed: the trainer's `checkpoint` entry, or its `stopped` entry (saved on the notice), which
    carries the trainer's goodput split of the attempt (accounting.py)."""

    event_id: str
    time: float
    job_id: str
    attempt: int
    step: int
    goodput: dict[str, float] | None = None


@dataclass(frozen=True)
class TrainerProgressed:
    """Process 0 of the trainer is still training (a `progress` entry, at most about once a minute)."""

    event_id: str
    time: float
    job_id: str
    attempt: int
    step: int


EXIT_CODE = "exit-code"  # the `source` of an entry a startup script sends for a trainer that exited without one


@dataclass(frozen=True)
class TrainerCompleted:
    """The trainer's `completed` entry, or (source `exit-code`) its startup script's for a trainer that exited 0
    without the notice: a program that knows nothing of respawn completes too. Only the trainer's own entry carries
    a result (final_loss, params_sha256, goodput)."""

    event_id: str
    time: float
    job_id: str
    attempt: int
    step: int | None = None
    result: dict[str, Any] = field(default_factory=dict)  # final_loss, params_sha256, ...
    goodput: dict[str, float] | None = None
    source: str = "trainer"  # trainer | exit-code


@dataclass(frozen=True)
class TrainerFailed:
    """A trainer process exited non-zero without the preemption notice (its own entry or its startup script's).

    `machine_state` is what the API said about the attempt's machine when the service handled the entry (None:
    not read): a machine the API shows dead was lost (a host error on one worker of a slice kills its peers'
    trainers too), which is not the trainer's failure."""

    event_id: str
    time: float
    job_id: str
    attempt: int
    error: str = ""
    worker: int | None = None
    machine_state: MachineState | None = None
    goodput: dict[str, float] | None = None  # the trainer's own entry has its split; its startup script's has none


@dataclass(frozen=True)
class SweepTicked:
    event_id: str
    time: float


# Fed back by the service after acting; never parsed from outside.
@dataclass(frozen=True)
class CreateFailed:
    """A create call for attempt N failed. kind: capacity | permanent."""

    event_id: str
    time: float
    job_id: str
    attempt: int
    kind: str
    error: str


@dataclass(frozen=True)
class MachinesObserved:
    """What the API said about the job's machines: name -> state; a missing name is not there.

    `zones` are the zones that were listed completely: only there does a missing
    live machine count as lost.
    """

    event_id: str
    time: float
    job_id: str
    machines: tuple[tuple[str, str, MachineState], ...]  # (name, zone, state)
    zones: tuple[str, ...] = ()
    details: tuple[tuple[str, str], ...] = ()  # (name, what the API says went wrong) for FAILED machines


@dataclass(frozen=True)
class Ignored:
    reason: str


JobEvent = (
    JobSubmitted
    | JobRejected
    | CancelRequested
    | MachinePreempted
    | TrainerStarted
    | CheckpointSaved
    | TrainerProgressed
    | TrainerCompleted
    | TrainerFailed
    | CreateFailed
    | MachinesObserved
)
Event = JobEvent | ZoneWokeUp | SweepTicked | Ignored
