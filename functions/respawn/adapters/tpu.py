"""GcpTpuProvider: Cloud TPU VMs (TPU v2 API nodes) through google-cloud-tpu.

create waits for the create operation at most `create_wait_s` (capacity errors
surface there, as operation code 8); when it is still running after that, create
returns and the sweep observes the node later. AlreadyExists on create and
NotFound on delete are success. The REST transport is used everywhere, so the
cloud runs the code path the tests run against the local server.
"""

from __future__ import annotations

import time

from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials
from google.cloud import tpu_v2

from respawn.actions import CreateMachine
from respawn.adapters.errors import classify, is_already_exists, read_retry
from respawn.adapters.startup import machine_labels, machine_metadata
from respawn.model import LABEL_JOB, LABEL_MANAGED, JobSpec, MachineState, TpuMachine
from respawn.ports import Machine, PermanentError

CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
_STATE = tpu_v2.Node.State
STATES: dict[int, MachineState] = {
    _STATE.CREATING: MachineState.CREATING,
    _STATE.STARTING: MachineState.CREATING,
    _STATE.RESTARTING: MachineState.CREATING,
    _STATE.REIMAGING: MachineState.CREATING,
    _STATE.READY: MachineState.READY,
    _STATE.REPAIRING: MachineState.READY,  # still ours; Google is fixing it in place
    _STATE.PREEMPTED: MachineState.PREEMPTED,
    _STATE.TERMINATED: MachineState.TERMINATED,
    _STATE.STOPPING: MachineState.TERMINATED,
    _STATE.STOPPED: MachineState.TERMINATED,
    _STATE.HIDING: MachineState.TERMINATED,
    _STATE.HIDDEN: MachineState.TERMINATED,
    _STATE.UNHIDING: MachineState.TERMINATED,
    _STATE.DELETING: MachineState.DELETING,
}


def scheduling_config(provisioning: str) -> tpu_v2.SchedulingConfig | None:
    if provisioning == "standard":
        return None
    if provisioning == "reservation":
        return tpu_v2.SchedulingConfig(reserved=True)
    return tpu_v2.SchedulingConfig(spot=provisioning == "spot", preemptible=provisioning == "preemptible")


class GcpTpuProvider:
    """MachineProvider for TPU nodes named JOB_ID-aN in projects/PROJECT/locations/ZONE."""

    def __init__(
        self,
        project: str,
        client: tpu_v2.TpuClient | None = None,
        endpoint: str | None = None,
        service_account: str | None = None,
        *,
        create_wait_s: float = 120.0,
        external_ips: bool = True,
        network: str | None = None,
        request_timeout_s: float = 30.0,
        read_retry_s: float = 10.0,
    ) -> None:
        self.project = project
        self.client = client or tpu_client(endpoint)
        self.service_account = service_account
        self.create_wait_s = create_wait_s
        self.external_ips = external_ips
        self.network = network
        self.timeout = request_timeout_s
        self.retry = read_retry(read_retry_s)

    def node(self, action: CreateMachine, spec: JobSpec) -> tpu_v2.Node:
        machine = spec.machine
        if not isinstance(machine, TpuMachine):
            raise PermanentError(f"machine.kind: {machine.kind!r} cannot run on Cloud TPU; allowed: tpu")
        node = tpu_v2.Node(
            accelerator_type=machine.accelerator_type,
            runtime_version=machine.runtime_version,
            scheduling_config=scheduling_config(spec.all_tiers[action.tier].provisioning),
            labels=machine_labels(spec, action.attempt),
            metadata=machine_metadata(spec, action.attempt),
            network_config=tpu_v2.NetworkConfig(enable_external_ips=self.external_ips, network=self.network or ""),
        )
        if self.service_account:
            node.service_account = tpu_v2.ServiceAccount(email=self.service_account, scope=[CLOUD_PLATFORM])
        return node

    def create(self, action: CreateMachine, spec: JobSpec) -> None:
        what = f"create TPU node {action.machine} in {action.zone}"
        parent = f"projects/{self.project}/locations/{action.zone}"
        try:
            op = self.client.create_node(
                parent=parent, node_id=action.machine, node=self.node(action, spec), timeout=self.timeout
            )
        except Exception as e:
            if is_already_exists(e):
                return
            raise classify(e, what) from e
        deadline = time.monotonic() + self.create_wait_s
        delay = 0.25
        while True:
            try:
                if op.done(retry=self.retry):  # type: ignore[no-untyped-call]
                    break
            except Exception as e:  # polling itself failed (not the operation)
                raise classify(e, what) from e
            if time.monotonic() + delay > deadline:
                return  # still creating: the sweep observes the node later
            time.sleep(delay)
            delay = min(delay * 1.5, 10.0)
        error = op.operation.error
        if error.code:
            exc = gexc.from_grpc_status(error.code, error.message)  # type: ignore[no-untyped-call]
            if not is_already_exists(exc):
                raise classify(exc, what, in_operation=True) from exc

    def delete(self, name: str, zone: str) -> None:
        try:
            self.client.delete_node(name=self._name(name, zone), timeout=self.timeout)
        except gexc.NotFound:
            return
        except Exception as e:
            raise classify(e, f"delete TPU node {name} in {zone}") from e

    def get(self, name: str, zone: str) -> Machine | None:
        try:
            node = self.client.get_node(name=self._name(name, zone), retry=self.retry, timeout=self.timeout)
        except gexc.NotFound:
            return None
        except Exception as e:
            raise classify(e, f"get TPU node {name} in {zone}") from e
        return _machine(node, zone)

    def list(self, zone: str, job_id: str | None = None) -> list[Machine]:
        parent = f"projects/{self.project}/locations/{zone}"
        try:
            nodes = list(self.client.list_nodes(parent=parent, retry=self.retry, timeout=self.timeout))
        except Exception as e:
            raise classify(e, f"list TPU nodes in {zone}") from e
        return [
            _machine(n, zone)
            for n in nodes
            if n.labels.get(LABEL_MANAGED) == "true" and (job_id is None or n.labels.get(LABEL_JOB) == job_id)
        ]

    def _name(self, name: str, zone: str) -> str:
        return f"projects/{self.project}/locations/{zone}/nodes/{name}"


def tpu_client(endpoint: str | None = None) -> tpu_v2.TpuClient:
    """The REST client; with `endpoint` (the local cloud), anonymous credentials at that address."""
    if endpoint:
        return tpu_v2.TpuClient(
            transport="rest",
            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
            client_options={"api_endpoint": endpoint},
        )
    return tpu_v2.TpuClient(transport="rest")


def _machine(node: tpu_v2.Node, zone: str) -> Machine:
    state = STATES.get(int(node.state), MachineState.CREATING)  # unknown / unspecified: let the sweep's timeout judge
    return Machine(name=node.name.rsplit("/", 1)[-1], zone=zone, state=state, labels=dict(node.labels))
