"""Events: what happened (past tense). Produced by respawn.parsing, consumed by decide().

Every event has an `event_id` used for de-duplication (Pub/Sub message id,
LogEntry insertId, ...) and `time` (seconds since the epoch, from the source).
Events about a machine carry the attempt number they concern, so an event for
attempt N arriving after attempt N+1 started is recognisably stale.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from respawn.jobs import JobSpec, MachineState


@dataclass(frozen=True)
class Stamped:
    """What every event carries: the id that de-duplicates its deliveries, and when it happened."""

    event_id: str
    time: float


@dataclass(frozen=True)
class JobSubmitted(Stamped):
    """A valid job message: run this job (its id is the spec's)."""

    spec: JobSpec


@dataclass(frozen=True)
class JobRejected(Stamped):
    """A job message that failed validation."""

    job_id: str | None  # None: the message named no usable job id, so no record can say why
    error: str  # one line: the field, what was wrong, what is allowed


@dataclass(frozen=True)
class AboutJob(Stamped):
    """An event about one job; a job's events are handled one at a time, on its record."""

    job_id: str


@dataclass(frozen=True)
class CancelRequested(AboutJob):
    """The user asked to stop the job: its machine is deleted and it ends CANCELLED."""


@dataclass(frozen=True)
class AboutAttempt(AboutJob):
    """An event about one attempt of the job: one naming an attempt older than the current one is stale."""

    attempt: int


@dataclass(frozen=True)
class MachinePreempted(AboutAttempt):
    """An audit entry naming one of respawn's machines: a Compute Engine system event on a VM (preempted, host error,
    host maintenance), or the Cloud TPU API's termination of a node (`tpu.nodes.terminate`)."""

    machine: str
    zone: str
    project: str
    cause: str = "preempted"  # preempted | hostError | terminateOnHostMaintenance | terminate[: REASON]


@dataclass(frozen=True)
class ZoneWokeUp(Stamped):
    """A system event on a TPU worker VM (t1v-n-*) in `zone`: re-read the job machines there."""

    zone: str
    project: str
    instance: str
    cause: str = "preempted"


@dataclass(frozen=True)
class TrainerStarted(AboutAttempt):
    restored_step: int | None = None
    startup_s: float | None = None


@dataclass(frozen=True)
class CheckpointSaved(AboutAttempt):
    """A save completed: the trainer's `checkpoint` entry, or its `stopped` entry (`final`: saved on the notice, its
    last word), which carries the trainer's goodput split of the attempt (accounting.py)."""

    step: int
    goodput: dict[str, float] | None = None
    final: bool = False


@dataclass(frozen=True)
class MachineNoticed(AboutAttempt):
    """The preemption notice reached a worker VM of attempt N's machine: its shutdown script's `notice` entry
    (written as the soft off begins, whatever the trainer). The cloud has decided to take the machine; it is off at
    the end of its notice window (respawn.machine.NOTICE_S)."""

    worker: int | None = None


@dataclass(frozen=True)
class TrainerProgressed(AboutAttempt):
    """Process 0 of the trainer is still training (a `progress` entry, at most about once a minute)."""

    step: int


class ResultSource(enum.StrEnum):
    """Who sent a `completed` or `failed` entry: the trainer itself, or its startup script, which knows only the exit
    code."""

    TRAINER = "trainer"
    EXIT_CODE = "exit-code"


EXIT_CODE = ResultSource.EXIT_CODE  # the name the startup script's entries are known by elsewhere


@dataclass(frozen=True)
class TrainerCompleted(AboutAttempt):
    """The trainer's `completed` entry, or (source `exit-code`) its startup script's for a trainer that exited 0
    without the notice: a program that knows nothing of respawn completes too. Only the trainer's own entry carries
    a result (final_loss, params_sha256, goodput)."""

    step: int | None = None
    result: dict[str, Any] = field(default_factory=dict)  # final_loss, params_sha256, ...
    goodput: dict[str, float] | None = None
    source: ResultSource = ResultSource.TRAINER


@dataclass(frozen=True)
class TrainerFailed(AboutAttempt):
    """A trainer process exited non-zero without the preemption notice (its own entry or its startup script's).

    `machine_state` is what the API said about the attempt's machine when the service handled the entry (None:
    not read): a machine the API shows dead was lost (a host error on one worker of a slice kills its peers'
    trainers too), which is not the trainer's failure."""

    error: str = ""
    worker: int | None = None
    machine_state: MachineState | None = None
    goodput: dict[str, float] | None = None  # the trainer's own entry has its split; its startup script's has none
    permanent: bool = False  # the trainer says another machine would fail the same way (wrong devices): no retry
    source: ResultSource = ResultSource.TRAINER
    world: int | None = None  # a job of several slices: the version of the world the trainer ran in (respawn.worlds)


@dataclass(frozen=True)
class TrainerReady(AboutAttempt):
    """A slice's machine is set up (its image pulled, its trainer started and its imports done) and waits for a world
    of several slices to take it in: its trainer's `ready` entry, written while the world its metadata names does not
    count it (respawn.worlds)."""

    world: int | None = None  # the version the machine was told, which lacks it


@dataclass(frozen=True)
class SweepTicked(Stamped):
    """The scheduler's periodic tick: every job that is live or may still hold a machine is checked against what
    the API lists."""


class CreateFailure(enum.StrEnum):
    """How a create call failed: the zone had no machine (try the next one), does not offer it (skip the zone), or it
    never will work (fail)."""

    CAPACITY = "capacity"
    UNOFFERED = "unoffered"  # the zone does not offer the machine: try the next zone, and never this one again
    PERMANENT = "permanent"


# Fed back by the service after acting; never parsed from outside.
@dataclass(frozen=True)
class CreateFailed(AboutAttempt):
    """A create call for attempt N failed."""

    kind: CreateFailure
    error: str


@dataclass(frozen=True)
class MachinesObserved(AboutJob):
    """What the API said about the job's machines: name -> state; a missing name is not there.

    `zones` are the zones that were listed completely: only there does a missing
    live machine count as lost.
    """

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
    | MachineNoticed
    | TrainerStarted
    | CheckpointSaved
    | TrainerProgressed
    | TrainerCompleted
    | TrainerFailed
    | TrainerReady
    | CreateFailed
    | MachinesObserved
)
Event = JobEvent | ZoneWokeUp | SweepTicked | Ignored
