"""What the local Compute API holds: every object of it by key, in one `ComputeState` its collections share on the
CloudCore's lock (each collection module changes its own objects and reads the others')."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from localcloud.apis.apicore import CloudCore, CloudMachine
from localcloud.apis.compute.common import Key


@dataclass
class Kept:
    """An object the API keeps as the body it was given: a global instance template (scope `global`) or a regional
    resource policy with a workload policy (scope `regions/REGION`)."""

    project: str
    scope: str
    collection: str  # instanceTemplates | resourcePolicies
    name: str
    body: dict[str, Any]
    id: int
    created_at: float

    @property
    def path(self) -> str:
        return f"projects/{self.project}/{self.scope}/{self.collection}/{self.name}"

    @property
    def machine_type(self) -> str:
        """A template's machine type."""
        return str(self.body["properties"]["machineType"])

    @property
    def topology(self) -> str | None:
        """A policy's accelerator topology."""
        return (self.body.get("workloadPolicy") or {}).get("acceleratorTopology")


Template = Kept
ResourcePolicy = Kept


@dataclass
class ResizeRequest:
    """A MIG resize request: `names` are the VMs it adds, created all at once when capacity comes."""

    name: str
    body: dict[str, Any]
    id: int
    created_at: float
    names: list[str]
    state: str = "CREATING"  # CREATING | ACCEPTED | SUCCEEDED | FAILED
    error: dict[str, Any] | None = None  # FAILED: Compute's {"errors": [{"code", "message"}]}
    last_attempt: dict[str, Any] | None = None  # why it still waits (status.lastAttempt.error)

    @property
    def open(self) -> bool:
        return self.state in ("CREATING", "ACCEPTED")


@dataclass
class Mig:
    """A zonal BULK managed instance group: `vms` are its managed instances in worker order (those not yet
    created wait for capacity); to the local cloud the whole group is one machine."""

    project: str
    zone: str
    name: str
    body: dict[str, Any]
    id: int
    created_at: float
    template: Template
    policy: ResourcePolicy | None
    vms: list[str] = field(default_factory=list)
    bulk_in_progress: bool = False
    progress_error: dict[str, Any] | None = None  # lastProgressCheck.error while waiting for capacity
    topology_state: str = "INCOMPLETE"
    topology_at: float = 0.0
    ready_sent: bool = False
    deleted_at: float | None = None
    resize_requests: dict[str, ResizeRequest] = field(default_factory=dict)
    serial: int = 0  # a capacity timer acts only on the wait it was set for

    @property
    def path(self) -> str:
        return f"projects/{self.project}/zones/{self.zone}/instanceGroupManagers/{self.name}"

    @property
    def key(self) -> Key:
        return (self.project, self.zone, self.name)

    @property
    def target_size(self) -> int:
        return len(self.vms)


@dataclass
class ComputeState:
    """`vms`: every VM by (project, zone, name), standalone instances and a MIG's VMs (`managed`: the VM's key ->
    its MIG's key); `flex_waiting`: the flex-start instances in their zone's queue; `migs` by (project, zone,
    name); instance templates by (project, name), resource policies by (project, region, name)."""

    core: CloudCore
    vms: dict[Key, CloudMachine] = field(default_factory=dict)
    managed: dict[Key, Key] = field(default_factory=dict)
    flex_waiting: set[Key] = field(default_factory=set)
    migs: dict[Key, Mig] = field(default_factory=dict)
    templates: dict[tuple[str, str], Template] = field(default_factory=dict)
    policies: dict[tuple[str, str, str], ResourcePolicy] = field(default_factory=dict)

    def standalone(self) -> list[CloudMachine]:
        return [m for k, m in self.vms.items() if k not in self.managed]

    def named(self, name: str) -> Mig | None:
        return next((mig for mig in self.migs.values() if mig.name == name), None)

    def users(self, kept: Kept) -> list[str]:
        """The MIGs that use a template or policy."""
        return [mig.path for mig in self.migs.values() if mig.template is kept or mig.policy is kept]
