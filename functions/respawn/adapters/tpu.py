"""GcpTpuProvider: Cloud TPU VMs through google-cloud-tpu (TPU v2 API), as queued resources or nodes.

A job's TPU machine is requested one of two ways (`machine.request`):
* `queued` (default): a queued resource `JOB_ID-aN` holding one node of the same name. It waits in Cloud TPU's
  queue (WAITING_FOR_RESOURCES: MachineState.QUEUED, not an error), is provisioned, and is ACTIVE while its node
  runs; a preempted Spot queued resource goes SUSPENDING -> SUSPENDED (PREEMPTED). FAILED carries the API's
  reason. Deleting it uses `force`, so its node goes too. Its valid-until time is the job's TTL deadline.
  A reservation tier asks for the project's reserved capacity in the zone (`any_reservation`).
* `node`: `nodes.create`; capacity errors surface in the create operation (code 8). A reservation tier sets
  `schedulingConfig.reserved` (gcloud's `tpu-vm create --reserved`).
create waits for the create operation at most `create_wait_s`; when it is still running after that, create
returns and the sweep observes the machine later. AlreadyExists on create and NotFound on delete are success.
get, list and delete look at queued resources and nodes both (a node that belongs to a queued resource is
reported through it), so a job's machines are found whichever way they were requested. set_world patches the node's
metadata (`nodes.patch`, `updateMask=metadata`), waiting for its operation as create does. The REST transport is
used everywhere, so the cloud runs the code path the tests run against the local server.
"""

from __future__ import annotations

import datetime
import time

from google.api_core import exceptions as gexc
from google.api_core import operation
from google.cloud import tpu_v2
from google.protobuf import field_mask_pb2

from respawn.actions import CreateMachine
from respawn.adapters.errors import classify, is_already_exists, read_retry
from respawn.adapters.settings import DEFAULTS, ProviderSettings, client_options
from respawn.adapters.startup import machine_labels, machine_metadata
from respawn.adapters.world_metadata import with_world
from respawn.jobs import LABEL_JOB, LABEL_MANAGED, SPOT_MODELS, JobSpec, MachineState, Provisioning, TpuMachine
from respawn.ports import Machine, PermanentError, TransientError

CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
_QR = tpu_v2.QueuedResourceState.State
_NODE = tpu_v2.Node.State


def _meaning(api_states: dict[MachineState, tuple[int, ...]]) -> dict[int, MachineState]:
    """API state -> MachineState, from a table that lists under each MachineState the API states that mean it."""
    return {api: ours for ours, apis in api_states.items() for api in apis}


QUEUED_STATES = _meaning(
    {
        MachineState.QUEUED: (_QR.CREATING, _QR.ACCEPTED, _QR.WAITING_FOR_RESOURCES),
        MachineState.CREATING: (_QR.PROVISIONING,),
        MachineState.READY: (_QR.ACTIVE,),  # then the node's own state decides
        MachineState.PREEMPTED: (_QR.SUSPENDING, _QR.SUSPENDED),
        MachineState.FAILED: (_QR.FAILED,),
        MachineState.DELETING: (_QR.DELETING,),
    }
)
STATES = _meaning(
    {
        MachineState.CREATING: (_NODE.CREATING, _NODE.STARTING, _NODE.RESTARTING, _NODE.REIMAGING),
        MachineState.READY: (_NODE.READY, _NODE.REPAIRING),  # REPAIRING: still ours; Google is fixing it in place
        MachineState.PREEMPTED: (_NODE.PREEMPTED,),
        # UNKNOWN is "unknown state after a failed repair": the trainer is gone
        MachineState.TERMINATED: (
            _NODE.TERMINATED,
            _NODE.STOPPING,
            _NODE.STOPPED,
            _NODE.UNKNOWN,
            _NODE.HIDING,
            _NODE.HIDDEN,
            _NODE.UNHIDING,
        ),
        MachineState.DELETING: (_NODE.DELETING,),
    }
)


def any_reservation(project: str, zone: str) -> str:
    """A queued resource's `reservationName` for reserved capacity, in the form the TPU API v2 is known to take:
    gcloud's GA `queued-resources create --reserved` sends exactly `projects/P/locations/Z/reservations/-` (the
    project's reservations in the zone) and no tier (googlecloudsdk command_lib/compute/tpus/queued_resources/util.py,
    `CreateReservationName`). Naming one reservation is documented only for v2alpha1 (`gcloud alpha ...
    --reservation`, https://cloud.google.com/tpu/docs/consume-reservation), so a tier's reservation name is not sent
    here; the Compute Engine API names it (docs/cloud-contracts.md, Reservations)."""
    return f"projects/{project}/locations/{zone}/reservations/-"


def scheduling_config(provisioning: Provisioning) -> tpu_v2.SchedulingConfig | None:
    if provisioning == Provisioning.STANDARD:
        return None
    if provisioning == Provisioning.RESERVATION:
        return tpu_v2.SchedulingConfig(reserved=True)
    spot, preemptible = provisioning == Provisioning.SPOT, provisioning == Provisioning.PREEMPTIBLE
    return tpu_v2.SchedulingConfig(spot=spot, preemptible=preemptible)


class GcpTpuProvider:
    """MachineProvider for TPU nodes named JOB_ID-aN in projects/PROJECT/locations/ZONE."""

    def __init__(self, project: str, *, endpoint: str | None = None, settings: ProviderSettings = DEFAULTS) -> None:
        self.project = project
        self.client = tpu_v2.TpuClient(**client_options(endpoint))
        self.settings = settings
        self.timeout = settings.request_timeout_s
        self.retry = read_retry(settings.read_retry_s)

    def node(self, action: CreateMachine, spec: JobSpec, queued: bool = False) -> tpu_v2.Node:
        """The node to create; inside a queued resource the queued resource carries the provisioning model."""
        machine = spec.machine
        if not isinstance(machine, TpuMachine):
            raise PermanentError(f"machine.kind: {machine.kind!r} cannot run on Cloud TPU; allowed: tpu")
        node = tpu_v2.Node(
            accelerator_type=machine.accelerator_type,
            runtime_version=machine.runtime_version,
            scheduling_config=None if queued else scheduling_config(spec.all_tiers[action.tier].provisioning),
            labels=machine_labels(spec, action.attempt),
            metadata=machine_metadata(
                spec,
                action.attempt,
                action.mtbi_s,
                start_after=action.start_after,
                slice_world=(action.slice, action.world),
            ),
            network_config=tpu_v2.NetworkConfig(
                enable_external_ips=self.settings.external_ips,
                network=self.settings.network or "",
                subnetwork=self.settings.subnetwork_in(action.zone, self.project) or "",
            ),
        )
        if self.settings.service_account:
            node.service_account = tpu_v2.ServiceAccount(email=self.settings.service_account, scope=[CLOUD_PLATFORM])
        return node

    def queued_resource(self, action: CreateMachine, spec: JobSpec) -> tpu_v2.QueuedResource:
        """`gcloud compute tpus queued-resources create NAME --node-id NAME --spot --valid-until-time ...`."""
        parent = f"projects/{self.project}/locations/{action.zone}"
        tier = spec.all_tiers[action.tier]
        qr = tpu_v2.QueuedResource(
            tpu=tpu_v2.QueuedResource.Tpu(
                node_spec=[
                    tpu_v2.QueuedResource.Tpu.NodeSpec(
                        parent=parent, node_id=action.machine, node=self.node(action, spec, queued=True)
                    )
                ]
            )
        )
        if tier.provisioning in SPOT_MODELS:
            qr.spot = tpu_v2.QueuedResource.Spot()
        elif tier.provisioning == Provisioning.RESERVATION:
            qr.reservation_name = any_reservation(self.project, action.zone)
        else:
            qr.guaranteed = tpu_v2.QueuedResource.Guaranteed()
        if action.deadline is not None:
            until = datetime.datetime.fromtimestamp(action.deadline, datetime.UTC)
            qr.queueing_policy = tpu_v2.QueuedResource.QueueingPolicy(valid_until_time=until)
        return qr

    def create(self, action: CreateMachine, spec: JobSpec) -> None:
        queued = isinstance(spec.machine, TpuMachine) and spec.machine.request == "queued"
        kind = "queued resource" if queued else "TPU node"
        what = f"create {kind} {action.machine} in {action.zone}"
        parent = f"projects/{self.project}/locations/{action.zone}"
        try:
            if queued:
                op = self.client.create_queued_resource(
                    parent=parent,
                    queued_resource_id=action.machine,
                    queued_resource=self.queued_resource(action, spec),
                    timeout=self.timeout,
                )
            else:
                op = self.client.create_node(
                    parent=parent, node_id=action.machine, node=self.node(action, spec), timeout=self.timeout
                )
        except Exception as e:
            if is_already_exists(e):
                return
            raise classify(e, what) from e
        if not self._finished(op, what):
            return  # still creating: the sweep observes the node later
        error = op.operation.error
        if error.code:
            exc = gexc.from_grpc_status(error.code, error.message)  # type: ignore[no-untyped-call]
            if not is_already_exists(exc):
                raise classify(exc, what, in_operation=True) from exc

    def _finished(self, op: operation.Operation, what: str) -> bool:
        """Whether the operation finished within `create_wait_s` (polled, as the client library polls it)."""
        deadline = time.monotonic() + self.settings.create_wait_s
        delay = 0.25
        while True:
            try:
                if op.done(retry=self.retry):  # type: ignore[no-untyped-call]
                    return True
            except Exception as e:  # polling itself failed (not the operation)
                raise classify(e, what) from e
            if time.monotonic() + delay > deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 1.5, 10.0)

    def set_world(self, name: str, zone: str, spec: JobSpec, world: str) -> None:
        """`nodes.patch` of the node's metadata (`updateMask=metadata`), which replaces the whole map: the node's own
        keys with `respawn-world` set, unless it holds that version or a newer one. A queued resource's node has the
        machine's name, as a node requested directly does; every worker of the node reads the node's metadata. A node
        that is not there (gone, or a queued resource's not made yet) is done. The node carries no fingerprint, so a
        write between this get and the patch is not detected; respawn alone writes the key, one job at a time."""
        what = f"set the world on TPU node {name} in {zone}"
        node = self._node(name, zone)
        metadata = with_world(dict(node.metadata), world) if node is not None else None
        if metadata is None:
            return
        patch = tpu_v2.Node(name=self._name(name, zone), metadata=metadata)
        try:
            op = self.client.update_node(
                node=patch, update_mask=field_mask_pb2.FieldMask(paths=["metadata"]), timeout=self.timeout
            )
        except gexc.NotFound:
            return
        except Exception as e:
            raise classify(e, what) from e
        if not self._finished(op, what):
            raise TransientError(f"{what}: the update is still running; the next try reads the node again")
        error = op.operation.error
        if error.code:
            exc = gexc.from_grpc_status(error.code, error.message)  # type: ignore[no-untyped-call]
            if not isinstance(exc, gexc.NotFound):
                raise classify(exc, what, in_operation=True) from exc

    def delete(self, name: str, zone: str, spec: JobSpec | None = None) -> None:
        """The queued resource of that name with its node (`force`), or the node; with no spec, whichever exists."""
        queued = _queued(spec)
        if queued is not False:
            try:
                self.client.delete_queued_resource(
                    request=tpu_v2.DeleteQueuedResourceRequest(
                        name=self._name(name, zone, "queuedResources"), force=True
                    ),
                    timeout=self.timeout,
                )
                return
            except gexc.NotFound:
                if queued:
                    return
            except Exception as e:
                raise classify(e, f"delete queued resource {name} in {zone}") from e
        try:
            self.client.delete_node(name=self._name(name, zone), timeout=self.timeout)
        except gexc.NotFound:
            return
        except Exception as e:
            raise classify(e, f"delete TPU node {name} in {zone}") from e

    def get(self, name: str, zone: str, spec: JobSpec | None = None) -> Machine | None:
        """A queued resource (with its node once ACTIVE) or a node; with no spec, whichever exists."""
        queued = _queued(spec)
        if queued is not False:
            try:
                qr = self.client.get_queued_resource(
                    name=self._name(name, zone, "queuedResources"), retry=self.retry, timeout=self.timeout
                )
            except gexc.NotFound:
                qr = None
            except Exception as e:
                raise classify(e, f"get queued resource {name} in {zone}") from e
            if qr is not None:
                active = int(qr.state.state) == _QR.ACTIVE
                return _queued_machine(qr, self._node(name, zone) if active else None, zone)
            if queued:
                return None
        node = self._node(name, zone)
        return _machine(node, zone) if node is not None else None

    def _node(self, name: str, zone: str) -> tpu_v2.Node | None:
        try:
            return self.client.get_node(name=self._name(name, zone), retry=self.retry, timeout=self.timeout)
        except gexc.NotFound:
            return None
        except Exception as e:
            raise classify(e, f"get TPU node {name} in {zone}") from e

    def list(self, zone: str, job_id: str | None = None) -> list[Machine]:
        """respawn's queued resources and nodes in the zone (two list calls), one Machine per name."""
        parent = f"projects/{self.project}/locations/{zone}"
        try:
            nodes = list(self.client.list_nodes(parent=parent, retry=self.retry, timeout=self.timeout))
            qrs = list(self.client.list_queued_resources(parent=parent, retry=self.retry, timeout=self.timeout))
        except Exception as e:
            raise classify(e, f"list TPU nodes and queued resources in {zone}") from e
        ours = {
            _short(n.name): n
            for n in nodes
            if n.labels.get(LABEL_MANAGED) == "true" and (job_id is None or n.labels.get(LABEL_JOB) == job_id)
        }
        machines = {}
        for qr in qrs:
            labels = _spec_node(qr).labels
            if labels.get(LABEL_MANAGED) == "true" and (job_id is None or labels.get(LABEL_JOB) == job_id):
                name = _short(qr.name)
                machines[name] = _queued_machine(qr, ours.pop(name, None), zone)
        return [*machines.values(), *(_machine(n, zone) for n in ours.values())]

    def _name(self, name: str, zone: str, collection: str = "nodes") -> str:
        return f"projects/{self.project}/locations/{zone}/{collection}/{name}"


def _queued(spec: JobSpec | None) -> bool | None:
    """Whether the job's machines are queued resources; None when unknown."""
    if spec is None:
        return None
    return isinstance(spec.machine, TpuMachine) and spec.machine.request == "queued"


def _short(name: str) -> str:
    return name.rsplit("/", 1)[-1]


def _machine(node: tpu_v2.Node, zone: str) -> Machine:
    state = STATES.get(int(node.state), MachineState.CREATING)  # unknown / unspecified: let the sweep's timeout judge
    return Machine(name=_short(node.name), zone=zone, state=state, labels=dict(node.labels))


def _spec_node(qr: tpu_v2.QueuedResource) -> tpu_v2.Node:
    specs = qr.tpu.node_spec
    return specs[0].node if specs else tpu_v2.Node()


def _queued_machine(qr: tpu_v2.QueuedResource, node: tpu_v2.Node | None, zone: str) -> Machine:
    """An ACTIVE queued resource is as alive as its node; otherwise its own state says (SUSPENDED: preempted)."""
    state = QUEUED_STATES.get(int(qr.state.state), MachineState.QUEUED)
    if state is MachineState.READY:
        state = _machine(node, zone).state if node is not None else MachineState.CREATING
    detail = ""
    if state is MachineState.FAILED:
        error = qr.state.failed_data.error
        detail = error.message or f"the queued resource FAILED (code {error.code})"
    return Machine(name=_short(qr.name), zone=zone, state=state, labels=dict(_spec_node(qr).labels), detail=detail)
