"""The job: its spec, status, attempts and record (the model every room shares; "model" here, never the trainer's).

Everything here is plain data (frozen dataclasses) with JSON round-trips. The
record is what the JobStore keeps at ``respawn/jobs/JOB_ID.json``.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from respawn.topology import tpu_topology

# Machine names are deterministic: JOB_ID-aN (see machine_name / parse_machine_name).
MACHINE_NAME_SEPARATOR = "-a"
LABEL_JOB = "respawn-job"
LABEL_ATTEMPT = "respawn-attempt"
LABEL_MANAGED = "respawn-managed"


class Status(enum.StrEnum):
    """Job status. Which status may follow which, and why, is TRANSITIONS below: the one statement of the state
    machine, which decide is tested against and docs/architecture.md shows (`python -m respawn.jobs`)."""

    PENDING = "PENDING"  # accepted; no machine requested yet (waiting out a capacity backoff)
    PROVISIONING = "PROVISIONING"  # first machine requested; trainer not started yet
    RUNNING = "RUNNING"  # the current attempt's trainer reported `started`
    RECOVERING = "RECOVERING"  # an attempt ended (preempted/crashed); its replacement is on its way
    SUCCEEDED = "SUCCEEDED"  # trainer reported `completed`; machine deleted
    FAILED = "FAILED"  # max_failures / max_preemptions reached, or a permanent API error
    CANCELLED = "CANCELLED"  # the user cancelled; machine deleted
    EXPIRED = "EXPIRED"  # the TTL ran out; machine deleted
    REJECTED = "REJECTED"  # the job message was invalid; nothing was ever created

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({Status.SUCCEEDED, Status.FAILED, Status.CANCELLED, Status.EXPIRED, Status.REJECTED})

# How any job that is not over may end.
_ENDINGS = {
    Status.FAILED: "max_failures or max_preemptions reached, or a permanent error",
    Status.CANCELLED: "the user cancelled",
    Status.EXPIRED: "the TTL ran out",
}

# from -> {to: when}. None is a job without a record. A terminal status has no way out but one: a REJECTED job id
# submitted again with a valid message.
TRANSITIONS: dict[Status | None, dict[Status, str]] = {
    None: {
        Status.PROVISIONING: "submitted: the first machine is requested",
        Status.PENDING: "submitted, to wait before its first machine is requested",
        Status.REJECTED: "the job message was invalid",
    },
    Status.PENDING: {Status.PROVISIONING: "the capacity backoff is over: a machine is requested", **_ENDINGS},
    Status.PROVISIONING: {
        Status.RUNNING: "the trainer reported `started`",
        Status.RECOVERING: "the machine was lost or stuck, or the trainer failed, before it started",
        Status.PENDING: "no capacity in any zone of the last tier: a backoff",
        Status.SUCCEEDED: "the trainer reported `completed` (its `started` never came)",
        **_ENDINGS,
    },
    Status.RUNNING: {
        Status.RECOVERING: "preempted, lost, hung or crashed, or back to Spot from a fallback tier: a replacement is "
        "requested",
        Status.SUCCEEDED: "the trainer reported `completed`",
        **_ENDINGS,
    },
    Status.RECOVERING: {
        Status.RUNNING: "the replacement's trainer reported `started`",
        Status.PENDING: "no capacity in any zone of the last tier: a backoff",
        Status.PROVISIONING: "a machine is requested afresh",
        Status.SUCCEEDED: "the trainer reported `completed`",
        **_ENDINGS,
    },
    Status.REJECTED: {Status.PROVISIONING: "the same job id submitted again with a valid message"},
}

# from -> every status that may follow it (none for a terminal status but REJECTED).
LEGAL_TRANSITIONS: dict[Status | None, frozenset[Status]] = {
    before: frozenset(TRANSITIONS.get(before, ())) for before in (None, *Status)
}


def transitions_markdown() -> str:
    """The state machine as docs/architecture.md embeds it: a mermaid diagram and a table of TRANSITIONS."""
    name: dict[Status | None, str] = {None: "[*]", **{s: s.value for s in Status}}
    pairs = [(before, after, when) for before, afters in TRANSITIONS.items() for after, when in afters.items()]
    diagram = [f"    {name[before]} --> {name[after]}" for before, after, _ in pairs]
    rows = [f"| {before or '(none)'} | {after} | {when} |" for before, after, when in pairs]
    return "\n".join(
        ["```mermaid", "stateDiagram-v2", *diagram, "```", "", "| from | to | when |", "|---|---|---|", *rows]
    )


class MachineState(enum.StrEnum):
    """What the cloud API says about one machine (TPU node or GCE instance)."""

    QUEUED = "QUEUED"  # a queued resource waiting in Cloud TPU's queue (WAITING_FOR_RESOURCES, ACCEPTED)
    CREATING = "CREATING"
    READY = "READY"
    PREEMPTED = "PREEMPTED"
    TERMINATED = "TERMINATED"  # stopped / host error / deleted by someone else but still listed
    FAILED = "FAILED"  # creation failed (e.g. capacity surfaced in the operation)
    DELETING = "DELETING"


class Provisioning(enum.StrEnum):
    """How a tier's machines are provisioned: the job message's `provisioning` (the values records hold)."""

    SPOT = "spot"
    PREEMPTIBLE = "preemptible"  # the Cloud TPU API's preemptible TPUs, Compute Engine's legacy preemptible VMs
    STANDARD = "standard"
    FLEX_START = "flex-start"  # Compute Engine's queue for capacity: a GPU, or a TPU with machine.api compute
    RESERVATION = "reservation"  # a tier's only: standard machines that consume a named reservation
    # a tier's only, Compute Engine's: machines bound to a named calendar-mode (future) reservation's lifetime
    # (provisioningModel RESERVATION_BOUND), the way Google sells much v5p, v6e and TPU7x capacity
    RESERVATION_BOUND = "reservation-bound"


# The models that consume a named reservation (a tier's `reservation`).
RESERVED_MODELS = frozenset({Provisioning.RESERVATION, Provisioning.RESERVATION_BOUND})


# The models the cloud may take machines back from: a fallback tier goes back to them (back_to_spot_after), their
# machines cost the Spot price.
SPOT_MODELS = frozenset({Provisioning.SPOT, Provisioning.PREEMPTIBLE})


# Which API provisions a machine: "tpu" the Cloud TPU API (nodes, queued resources), "compute" Compute Engine
# (instances, and a managed instance group for a multi-host TPU slice).
API_TPU = "tpu"
API_COMPUTE = "compute"


@dataclass(frozen=True)
class TpuMachine:
    accelerator_type: str
    runtime_version: str | None = None  # api tpu only (required there): the TPU VM's software version
    kind: str = "tpu"
    # The default "tpu" keeps records written before Compute Engine made TPUs readable as what they were; the job
    # message's default is per generation (respawn.spec): compute for those Compute Engine offers.
    api: str = API_TPU
    image: str | None = None  # api compute: a boot image or image family URL; None: the generation's default
    request: str = "queued"  # api tpu: queued (a queued resource, Cloud TPU's queue for capacity) | node (nodes.create)
    # How long one zone may keep the request waiting for capacity before the next zone is tried: a queued
    # resource (api tpu, request queued), or a flex-start request (api compute, a flex-start tier).
    queue_timeout_s: int = 30 * 60
    slices: int = 1  # slices of this type in one zone, data parallel over DCN (a world: World below)
    min_slices: int = 1  # below it the job recovers whole, as a job of one slice does

    @property
    def hosts(self) -> int:
        """Worker VMs of the slice: every one runs the trainer; losing any one loses the slice."""
        return tpu_topology(self.accelerator_type).hosts

    @property
    def type_name(self) -> str:
        """What the cloud offers and takes back (the outlook's machine type): the accelerator type, `v6e-8`."""
        return self.accelerator_type


@dataclass(frozen=True)
class GpuMachine:
    machine_type: str
    accelerator_type: str
    accelerator_count: int
    kind: str = "gpu"
    boot_disk_gb: int = 200
    queue_timeout_s: int = 30 * 60  # a flex-start tier: how long one zone may keep the request waiting
    # VMs of machine_type created together and recovered whole, as a TPU slice's: 1 is one instance, more a MIG
    # slice (respawn.adapters.compute_slices) whose trainers join by jax.distributed (process id = VM index)
    vms: int = 1
    slices: int = 1  # machines of `vms` VMs each (vms 1 when several: a VM is the unit), one world (World below)
    min_slices: int = 1  # below it the job recovers whole, as a job of one slice does
    api: ClassVar[str] = API_COMPUTE  # GPUs are Compute Engine instances, always

    @property
    def hosts(self) -> int:
        """VMs of the machine: every one runs the trainer; losing any one loses them all."""
        return self.vms

    @property
    def type_name(self) -> str:
        """What the cloud offers and takes back (the outlook's machine type): the machine type, `a3-highgpu-8g`."""
        return self.machine_type


MachineSpec = TpuMachine | GpuMachine


def machine_to_dict(machine: MachineSpec) -> dict[str, Any]:
    return dict(machine.__dict__)


def machine_from_dict(m: dict[str, Any]) -> MachineSpec:
    # a record written before queued resources asked for a node: keep what its machines are
    return TpuMachine(**{"request": "node", **m}) if m["kind"] == "tpu" else GpuMachine(**m)


def machine_words(machine: MachineSpec) -> str:
    """What a machine is, as one word of a status table: `v5litepod-8`, `a3-highgpu-8g(8xnvidia-h100-80gb)`, a GPU
    machine of several VMs `2xa3-highgpu-8g(8xnvidia-h100-80gb)`, and a job of several slices `4xv6e-16`."""
    several = f"{machine.slices}x" if machine.slices > 1 else ""
    if isinstance(machine, TpuMachine):
        return several + machine.accelerator_type
    vms = f"{machine.vms}x" if machine.vms > 1 else several
    return f"{vms}{machine.machine_type}({machine.accelerator_count}x{machine.accelerator_type})"


@dataclass(frozen=True)
class Tier:
    """One way of getting machines, tried in order: a provisioning model with its zones, and when to move on.

    A job without `tiers` has one: its `provisioning` in its `zones`, never moving on."""

    provisioning: Provisioning
    zones: tuple[str, ...]
    reservation: str | None = None  # provisioning reservation or reservation-bound: the reservation's name
    # provisioning flex-start: the machine's maximum run duration; None: the time left to the job's TTL (see
    # flex_start_run_s)
    max_run_duration_s: int | None = None
    after_preemptions: int | None = None  # move on once this tier's machines were preempted this often
    after_stockout_s: int | None = None  # ... once this tier found no capacity anywhere for this long
    deadline_within_s: int | None = None  # ... once the job's TTL deadline is this close
    # A later tier that is not Spot: how long the job stays on it before it may go back to the first Spot tier
    # (decide's back-to-Spot rule, when the outlook expects Spot to last); None: it never goes back.
    back_to_spot_after_s: int | None = 2 * 3600
    # The tier's own machine (another GPU type or count, of the job's machine kind and API); None: the job's
    machine: MachineSpec | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.provisioning, Provisioning):  # as read back from JSON
            object.__setattr__(self, "provisioning", Provisioning(self.provisioning))

    def to_dict(self) -> dict[str, Any]:
        machine = machine_to_dict(self.machine) if self.machine is not None else None
        return {**self.__dict__, "zones": list(self.zones), "machine": machine}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Tier:
        machine = machine_from_dict(d["machine"]) if d.get("machine") else None  # a record before tier machines: None
        return Tier(**{**d, "zones": tuple(d["zones"]), "machine": machine})


@dataclass(frozen=True)
class JobSpec:
    """A validated submit message (SPEC 3.1). Build it with respawn.spec.parse_job_message."""

    job_id: str
    machine: MachineSpec
    zones: tuple[str, ...]
    image: str
    checkpoint_uri: str
    provisioning: Provisioning = Provisioning.SPOT  # a tier's, but reservation
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # sorted (key, value) pairs
    # sorted (variable name, Secret Manager version reference) pairs: references only, resolved on the machine
    secrets: tuple[tuple[str, str], ...] = ()
    ttl_s: int = 48 * 3600
    max_preemptions: int | None = None
    max_failures: int = 3
    labels: tuple[tuple[str, str], ...] = ()  # sorted (key, value) pairs
    hang_timeout_s: int | None = 30 * 60  # a RUNNING attempt without progress this long is hung; None: off
    tiers: tuple[Tier, ...] = ()  # () = one tier of `provisioning` in `zones`; else zones/provisioning are tier 0's
    max_run_duration_s: int | None = None  # provisioning flex-start: as Tier's; with tiers, tier 0's
    placement: str = "ranked"  # ranked: zones by the outlook (decide); ordered: the list's order, same zone again
    # On a running machine's notice, request its replacement at once (in another zone, starting once the noticed
    # machine is off) instead of when the preemption's event comes (decide's head start)
    head_start: bool = True
    # The metadata notice a Spot VM on Compute Engine asks for before its soft off (scheduling.preemptionNoticeDuration,
    # preview); None: none, the soft off comes with the notice
    preemption_notice_s: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.provisioning, Provisioning):  # as read back from JSON
            object.__setattr__(self, "provisioning", Provisioning(self.provisioning))

    @property
    def all_tiers(self) -> tuple[Tier, ...]:
        return self.tiers or (Tier(self.provisioning, self.zones, max_run_duration_s=self.max_run_duration_s),)

    def machine_of(self, tier: int) -> MachineSpec:
        """The machine tier `tier`'s attempts run on: the tier's own, else the job's."""
        tiers = self.all_tiers
        own = tiers[tier].machine if 0 <= tier < len(tiers) else None
        return own if own is not None else self.machine

    def on_tier(self, tier: int) -> JobSpec:
        """The spec as tier `tier`'s machines are made from it: the job's, with the tier's machine."""
        machine = self.machine_of(tier)
        return self if machine is self.machine else replace(self, machine=machine)

    @property
    def every_zone(self) -> tuple[str, ...]:
        """Every zone any tier may use, in order (the zones a sweep lists)."""
        return tuple(dict.fromkeys(z for tier in self.all_tiers for z in tier.zones))

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)  # shallow: every field is a str, a number, None or a tuple (fixed below)
        d["machine"] = machine_to_dict(self.machine)
        d["zones"] = list(self.zones)
        d["args"] = list(self.args)
        d["env"] = dict(self.env)
        d["secrets"] = dict(self.secrets)
        d["labels"] = dict(self.labels)
        d["tiers"] = [t.to_dict() for t in self.tiers]
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> JobSpec:
        return JobSpec(
            job_id=d["job_id"],
            machine=machine_from_dict(d["machine"]),
            zones=tuple(d["zones"]),
            image=d["image"],
            checkpoint_uri=d["checkpoint_uri"],
            provisioning=d["provisioning"],
            args=tuple(d["args"]),
            env=tuple(sorted(d["env"].items())),
            secrets=tuple(sorted(d.get("secrets", {}).items())),
            ttl_s=d["ttl_s"],
            max_preemptions=d["max_preemptions"],
            max_failures=d["max_failures"],
            labels=tuple(sorted(d["labels"].items())),
            hang_timeout_s=d.get("hang_timeout_s"),
            tiers=tuple(Tier.from_dict(t) for t in d.get("tiers", ())),
            max_run_duration_s=d.get("max_run_duration_s"),
            placement=d.get("placement", "ranked"),
            head_start=d.get("head_start", True),
            preemption_notice_s=d.get("preemption_notice_s"),
        )


# Compute Engine runs a flex-start VM for at most 7 days ("Flex-start VMs ... can run for up to seven days",
# https://cloud.google.com/compute/docs/instances/provisioning-models).
FLEX_START_MAX_RUN_S = 7 * 24 * 3600


def flex_start_run_s(tier: Tier, deadline: float, now: float) -> int:
    """The run duration a flex-start machine is asked for: the tier's max_run_duration, else the time left to the
    job's TTL deadline; never more than Compute Engine's maximum, never less than a minute."""
    wanted = tier.max_run_duration_s if tier.max_run_duration_s is not None else int(deadline - now)
    return max(60, min(wanted, FLEX_START_MAX_RUN_S))


def machine_name(job_id: str, attempt: int) -> str:
    return f"{job_id}{MACHINE_NAME_SEPARATOR}{attempt}"


def parse_machine_name(name: str) -> tuple[str, int] | None:
    """`llm-a1-a3` -> ("llm-a1", 3); None when the name is not a respawn machine name."""
    job_id, sep, n = name.rpartition(MACHINE_NAME_SEPARATOR)
    if not sep or not job_id or not n.isdigit() or n.startswith("0"):
        return None
    return job_id, int(n)


# A managed instance group names its VMs from its baseInstanceName and a random suffix: a slice MIG named NAME has
# baseInstanceName NAME-w, so its VMs are NAME-w-x7k2 (the suffix is 4 lowercase letters or digits).
SLICE_VM_BASE = "-w"
SLICE_VM_RE = re.compile(r"^(.+)-w-[a-z0-9]{4}$")


def slice_vm_base(machine: str) -> str:
    """The baseInstanceName of the MIG of slice `machine`: its VMs are named from it."""
    return machine + SLICE_VM_BASE


def parse_instance_name(name: str) -> tuple[str, int] | None:
    """A Compute Engine instance's job and attempt: a slice VM `llm-a3-w-x7k2` -> ("llm", 3), the machine it is a
    worker of; any other instance as parse_machine_name reads it. None when it is not respawn's."""
    vm = SLICE_VM_RE.fullmatch(name)
    parsed = parse_machine_name(vm.group(1)) if vm else None
    return parsed if parsed is not None else parse_machine_name(name)


class EndReason(enum.StrEnum):
    """Why an attempt ended. The values are what job records hold, so records written before stay readable."""

    PREEMPTED = "preempted"  # the cloud took the machine: a system event, or the API shows it dead
    LOST = "lost"  # the machine vanished from a complete listing of its zone
    TERMINATED = "terminated"  # never written by decide(); named so that any record holding it still reads
    FAILED = "failed"  # the trainer exited non-zero without the preemption notice
    HUNG = "hung"  # the trainer made no progress for the job's hang_timeout
    CAPACITY = "capacity"  # the zone had no machine: the create failed for capacity, or the machine FAILED to come up
    QUEUED = "queued"  # the request waited in the zone's queue longer than its queue_timeout
    STUCK = "stuck"  # the machine was still CREATING after Policy.stuck_creating_s
    COMPLETED = "completed"  # the trainer completed: the job SUCCEEDED
    CANCELLED = "cancelled"  # the user cancelled the job
    EXPIRED = "expired"  # the job's TTL ran out
    ERROR = "error"  # the create call failed for good (a permanent API error): the job FAILED
    BACK_TO_SPOT = "back-to-spot"  # a fallback tier's machine ended to go back to Spot: not a preemption nor a failure
    # the zone does not offer the job's machine (the create was refused for it): a stockout that never ends, so the
    # zone is skipped from then on
    UNOFFERED = "unoffered"


# The zone had no machine for us: these drive the walk to the next zone and count as capacity errors.
NO_CAPACITY = frozenset({EndReason.CAPACITY, EndReason.QUEUED, EndReason.STUCK, EndReason.UNOFFERED})
# The machine was taken from us: these count against max_preemptions and a tier's after_preemptions.
COUNTED_AS_PREEMPTION = frozenset({EndReason.PREEMPTED, EndReason.LOST})
# The trainer itself went wrong: these count against max_failures.
COUNTED_AS_FAILURE = frozenset({EndReason.FAILED, EndReason.HUNG})


@dataclass(frozen=True)
class Attempt:
    """One create try: one machine, in one zone."""

    n: int
    zone: str
    machine: str
    requested_at: float
    started_at: float | None = None  # trainer `started`
    ended_at: float | None = None
    end_reason: EndReason | None = None
    tier: int = 0  # index into spec.all_tiers: how this attempt's machine was requested
    restored_step: int | None = None
    startup_s: float | None = None  # the trainer's own start (imports, compile, restore), from its `started` entry
    last_step: int | None = None  # newest step reported by a checkpoint/started/completed entry
    progress_at: float | None = None  # time of the newest trainer entry proving progress (hang detection)
    machine_deleted: bool = False
    checkpoint_at: float | None = None  # time of the newest `checkpoint` / `stopped` entry: a save completed
    goodput: dict[str, float] | None = None  # the trainer's split of its time (accounting.py), from its last entry
    # why this zone: the chosen zone's figures and the runner-up ("" without an outlook); the record's key for it is
    # "placement", as records written before hold it (Attempt.to_dict, from_dict)
    zone_reason: str = ""
    mtbi_s: float | None = None  # the outlook's expected seconds to interruption of its zone, handed to the machine
    # the Advice API's price of its machine in its zone when placed ({per_h, source}): its hours' cost (accounting)
    price: dict[str, Any] | None = None
    # Ended on its machine's notice (a head start): the machine is kept for its trainer's final save until its
    # trainer's last entry comes, a listing comes after this time (epoch s), or the job ends; the next attempt's
    # machine starts its trainer only after it
    drain_until: float | None = None
    error: str = ""  # why its create failed, in the API's words (an attempt that ended on a create error)
    slice: int = 0  # a job of several slices: the slice (0 .. slices-1) this attempt's machine is

    def __post_init__(self) -> None:
        if self.end_reason is not None and not isinstance(self.end_reason, EndReason):  # as read back from JSON
            object.__setattr__(self, "end_reason", EndReason(self.end_reason))

    @property
    def ended(self) -> bool:
        return self.ended_at is not None

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["placement"] = d.pop("zone_reason")
        if not self.slice:
            del d["slice"]  # a job of one slice: its records as they were
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Attempt:
        fields = dict(d)
        reason = fields.pop("placement", "")
        return Attempt(**fields, zone_reason=reason)

    @property
    def draining(self) -> bool:
        """Ended on its machine's notice, and that machine, finishing its final save, is not deleted yet."""
        return self.drain_until is not None and not self.machine_deleted


@dataclass(frozen=True)
class World:
    """Which slices of a job of several train together, from which step: one JAX multi-controller job over every host
    of every member (docs/design/several-slices.md). The control plane decides it; each member's machines learn it
    from their metadata key `respawn-world` (`to_json`, which respawn_trainer.world reads).

    Versioned: every change is a new version, so a change told twice or late is told as what it is. A machine runs
    only a version above the one it ran, and the trainer ignores an older one."""

    version: int
    members: tuple[int, ...]  # slice indices, ascending
    step: int | None = None  # where the change takes effect: the save boundary to stop at; None: the next step

    @staticmethod
    def first(slices: int) -> World:
        return World(1, tuple(range(slices)))

    def without(self, lost: int, step: int | None = None) -> World:
        """The world once slice `lost` has left it (preempted, noticed, failed): the same when it is no member."""
        if lost not in self.members:
            return self
        return World(self.version + 1, tuple(m for m in self.members if m != lost), step)

    def joined(self, member: int, step: int | None = None) -> World:
        """The world with slice `member` (its replacement ready) back in it: the same when it is a member."""
        if member in self.members:
            return self
        return World(self.version + 1, tuple(sorted((*self.members, member))), step)

    def to_json(self) -> str:
        return json.dumps({"version": self.version, "members": list(self.members), "step": self.step})

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "members": list(self.members), "step": self.step}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> World:
        return World(d["version"], tuple(d["members"]), d.get("step"))


@dataclass(frozen=True)
class Counters:
    preemptions: int = 0  # preempted or lost machines; never count against max_failures
    failures: int = 0  # trainer crashes
    capacity_errors: int = 0


@dataclass(frozen=True)
class Job:
    """The job record. `pending` (machine actions), `outbox` (status messages) and `observations` (what ended attempts
    add to the preemption history) hold intent persisted before its side effects, owned by the handler whose lease
    (`pending_lease_until`) is live."""

    job_id: str
    spec: JobSpec | None  # None only for REJECTED records
    status: Status
    submitted_at: float
    updated_at: float
    reason: str = ""  # human-readable reason for the current status
    attempts: tuple[Attempt, ...] = ()
    counters: Counters = field(default_factory=Counters)
    # index into spec.all_tiers: the tier the next create uses (moves forward, and back only to the first Spot tier)
    tier_index: int = 0
    zone_index: int = 0  # index into the tier's zones for the next create
    capacity_round: int = 0  # full walks of the zone list that met no capacity (drives backoff)
    next_attempt_at: float | None = None  # capacity backoff: create no sooner than this
    pending: tuple[dict[str, Any], ...] = ()  # serialized actions not yet confirmed done
    pending_lease_until: float | None = None
    outbox: tuple[dict[str, Any], ...] = ()  # status messages not yet published (status_messages.py), under the lease
    seen_events: tuple[str, ...] = ()  # bounded, newest last
    # ended attempts' evidence for the preemption history (respawn.outlook.Observation dicts), under the lease
    observations: tuple[dict[str, Any], ...] = ()
    result: dict[str, Any] = field(default_factory=dict)  # completed: final_step, final_loss, params_sha256
    world: World | None = None  # a job of several slices: the members training together now

    @property
    def current(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def deadline(self) -> float:
        return self.submitted_at + (self.spec.ttl_s if self.spec else 0)

    @property
    def current_tier(self) -> Tier:
        """The tier the next create uses (tier_index)."""
        assert self.spec is not None
        return self.spec.all_tiers[self.tier_index]

    @property
    def tier_name(self) -> str:
        return f"the {self.current_tier.provisioning} tier"

    @property
    def live(self) -> Attempt | None:
        """The current attempt while it still holds (or is getting) a machine."""
        current = self.current
        return current if current is not None and not current.ended and not self.status.terminal else None

    @property
    def draining(self) -> Attempt | None:
        """The attempt ended on its machine's notice whose machine is kept for its final save (at most one)."""
        return next((a for a in self.attempts if a.draining), None)

    @property
    def holds_intent(self) -> bool:
        """Intent not yet carried out: machine actions, status messages or history observations."""
        return bool(self.pending or self.outbox or self.observations)

    @property
    def swept(self) -> bool:
        """The sweep's to watch: live, holding a machine not yet deleted, or intent (a rejected record, with no spec,
        only for its unpublished notice). A record that is none of these never changes without an event."""
        if self.holds_intent:
            return True
        return self.spec is not None and (not self.status.terminal or any(not a.machine_deleted for a in self.attempts))

    def where(self, attempt: Attempt) -> str:
        """Where an attempt runs: its zone, and its tier's provisioning model when the job has several tiers."""
        assert self.spec is not None
        tiers = self.spec.all_tiers
        return attempt.zone if len(tiers) == 1 else f"{attempt.zone} ({tiers[attempt.tier].provisioning} tier)"

    def zone_index_of(self, zone: str) -> int:
        """The index of `zone` in the current tier's zones (zone_index when the tier has no such zone)."""
        zones = self.current_tier.zones
        return zones.index(zone) if zone in zones else self.zone_index

    def spec_of(self, machine: str) -> JobSpec:
        """The spec that machine `machine` was made from: its attempt's tier's (JobSpec.on_tier); the job's for a
        machine of no attempt of the record."""
        assert self.spec is not None
        tier = next((a.tier for a in self.attempts if a.machine == machine), 0)
        return self.spec.on_tier(tier)

    def with_attempt(self, attempt: Attempt) -> Job:
        """Replace the attempt with the same n (or append it)."""
        others = tuple(a for a in self.attempts if a.n != attempt.n)
        return replace(self, attempts=tuple(sorted((*others, attempt), key=lambda a: a.n)))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (a fresh one: callers may change it). Field by field, not asdict: this runs on every
        save, and asdict's deep copy was most of a handler's CPU time."""
        d = dict(self.__dict__)
        d["spec"] = self.spec.to_dict() if self.spec else None
        d["status"] = self.status.value
        d["attempts"] = [a.to_dict() for a in self.attempts]
        d["counters"] = dict(self.counters.__dict__)
        d["pending"] = [dict(p) for p in self.pending]
        d["outbox"] = [dict(n) for n in self.outbox]
        d["observations"] = [dict(o) for o in self.observations]
        d["seen_events"] = list(self.seen_events)
        d["result"] = dict(self.result)
        d["hosts"] = self.spec.machine.hosts if self.spec else None  # shown, not read back: the spec decides
        if self.world is None:
            del d["world"]  # a job of one slice: its records as they were
        else:
            d["world"] = self.world.to_dict()
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Job:
        return Job(
            job_id=d["job_id"],
            spec=JobSpec.from_dict(d["spec"]) if d.get("spec") else None,
            status=Status(d["status"]),
            submitted_at=d["submitted_at"],
            updated_at=d["updated_at"],
            reason=d.get("reason", ""),
            attempts=tuple(Attempt.from_dict(a) for a in d.get("attempts", ())),
            counters=Counters(**d.get("counters", {})),
            tier_index=d.get("tier_index", 0),
            zone_index=d.get("zone_index", 0),
            capacity_round=d.get("capacity_round", 0),
            next_attempt_at=d.get("next_attempt_at"),
            pending=tuple(d.get("pending", ())),
            pending_lease_until=d.get("pending_lease_until"),
            outbox=tuple(d.get("outbox", ())),
            observations=tuple(d.get("observations", ())),
            seen_events=tuple(d.get("seen_events", ())),
            result=d.get("result", {}),
            world=World.from_dict(d["world"]) if d.get("world") else None,
        )


if __name__ == "__main__":
    print(transitions_markdown())
