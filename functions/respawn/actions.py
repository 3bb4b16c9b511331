"""Actions: what to do (imperative). Returned by decide(), executed by the service.

Each is idempotent by construction: machine names are deterministic
(JOB_ID-aN), create treats AlreadyExists and delete treats NotFound as success,
and a world's metadata write leaves a newer world in place.
They round-trip through dicts because they are persisted as intent
(`Job.pending`) before they are executed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CreateMachine:
    job_id: str
    attempt: int
    machine: str
    zone: str
    deadline: float | None = None  # the job's TTL deadline (epoch s): a GPU VM's own hard stop (maxRunDuration)
    tier: int = 0  # index into the spec's tiers: provisioning model, reservation
    # the outlook's expected seconds to interruption of the zone: the machine's metadata respawn-mtbi-s, from which
    # the trainer takes its checkpoint interval (RESPAWN_MTBI_S); None without an outlook
    mtbi_s: float | None = None
    # a head start (respawn.decide): the machine boots and pulls its image at once, but starts its trainer only after
    # this time (epoch s; metadata respawn-start-after), once the noticed machine it replaces is off; None: at once
    start_after: float | None = None
    # a job of several slices: the slice the machine is, and the world it is told at its making (metadata
    # respawn-slice and respawn-world: respawn.jobs.World's JSON); None for a job of one slice
    slice: int | None = None
    world: str | None = None


@dataclass(frozen=True)
class DeleteMachine:
    """Delete attempt `attempt`'s machine (NotFound is done)."""

    job_id: str
    attempt: int
    machine: str  # a node, an instance, or a slice's MIG (its template and policy go with it)
    zone: str


@dataclass(frozen=True)
class SetWorld:
    """Tell attempt `attempt`'s machine (every VM of it) the world of several slices it is a member of, or is to
    join: its metadata key `respawn-world` becomes `world` (the JSON of respawn.jobs.World), unless a newer version
    is there already (a write delivered late changes nothing)."""

    job_id: str
    attempt: int
    machine: str
    zone: str
    world: str


Action = CreateMachine | DeleteMachine | SetWorld
_KINDS: dict[str, type[CreateMachine] | type[DeleteMachine] | type[SetWorld]] = {
    "create": CreateMachine,
    "delete": DeleteMachine,
    "set-world": SetWorld,
}
_NAMES = {kind: name for name, kind in _KINDS.items()}


# Fields written only when set: intent and log lines of a create without an outlook stay as they were.
_OMITTED_WHEN_NONE = frozenset({"mtbi_s", "start_after", "slice", "world"})


def action_to_dict(action: Action) -> dict[str, Any]:
    kind = _NAMES[type(action)]
    fields = {k: v for k, v in vars(action).items() if not (k in _OMITTED_WHEN_NONE and v is None)}
    return {"kind": kind, **fields}


def action_from_dict(d: dict[str, Any]) -> Action:
    fields = {k: v for k, v in d.items() if k != "kind"}
    return _KINDS[d["kind"]](**fields)
