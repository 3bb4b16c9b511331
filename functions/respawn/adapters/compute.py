"""GcpComputeProvider: Spot GPU VMs through google-cloud-compute.

A VM boots a Deep Learning VM image (NVIDIA driver, Docker), whose startup
script runs the trainer container with `--gpus all`. Spot VMs are deleted on
preemption (instanceTerminationAction=DELETE) and carry maxRunDuration = the time
left until the job's TTL (`CreateMachine.deadline`; the whole TTL when it is not
set), so a VM never outlives its job even if nothing deletes it.

Zone operations are awaited with our own ZoneOperationsClient (`operations.wait`):
the library's `.result()` polls through a client of its own at the default
endpoint, which would bypass `endpoint`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import requests
from google.api_core import exceptions as gexc
from google.cloud import compute_v1

from respawn.actions import CreateMachine
from respawn.adapters.errors import classify, is_already_exists, read_retry
from respawn.adapters.settings import DEFAULTS, ProviderSettings, client_options
from respawn.adapters.startup import machine_labels, machine_metadata
from respawn.model import LABEL_JOB, LABEL_MANAGED, GpuMachine, JobSpec, MachineState
from respawn.ports import Machine, PermanentError

CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
# Deep Learning VM image family with CUDA 12.8, the NVIDIA 570 driver and Docker.
DLVM_IMAGE = "projects/deeplearning-platform-release/global/images/family/common-cu128-ubuntu-2204-nvidia-570"
DEFAULT_NETWORK = "global/networks/default"
MIN_RUN_S = 30  # Compute Engine's smallest maxRunDuration
STATES: dict[str, MachineState] = {
    "PROVISIONING": MachineState.CREATING,
    "STAGING": MachineState.CREATING,
    "PENDING": MachineState.CREATING,
    "RUNNING": MachineState.READY,
    "REPAIRING": MachineState.READY,
    "STOPPING": MachineState.TERMINATED,  # a preempted Spot VM goes STOPPING -> TERMINATED (or is deleted)
    "PENDING_STOP": MachineState.TERMINATED,
    "STOPPED": MachineState.TERMINATED,
    "TERMINATED": MachineState.TERMINATED,
    "SUSPENDING": MachineState.TERMINATED,
    "SUSPENDED": MachineState.TERMINATED,
    "DEPROVISIONING": MachineState.DELETING,
}
_DONE = compute_v1.Operation.Status.DONE


def scheduling(provisioning: str, run_s: int) -> compute_v1.Scheduling:
    """GPUs cannot live-migrate, so host maintenance terminates; respawn, not GCE, restarts the work.
    A reservation tier runs standard VMs that consume the reservation (`reservation_affinity`)."""
    if provisioning == "preemptible":  # legacy preemptible VMs: at most 24 h, no maxRunDuration
        return compute_v1.Scheduling(preemptible=True, automatic_restart=False, on_host_maintenance="TERMINATE")
    return compute_v1.Scheduling(
        provisioning_model="SPOT" if provisioning == "spot" else "STANDARD",
        instance_termination_action="DELETE",
        max_run_duration=compute_v1.Duration(seconds=run_s),
        automatic_restart=False,
        on_host_maintenance="TERMINATE",
    )


class GcpComputeProvider:
    """MachineProvider for GPU VMs named JOB_ID-aN in projects/PROJECT/zones/ZONE."""

    def __init__(
        self,
        project: str,
        *,
        endpoint: str | None = None,
        settings: ProviderSettings = DEFAULTS,
        image: str = DLVM_IMAGE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.project = project
        self.client = compute_v1.InstancesClient(**client_options(endpoint))
        self.operations = compute_v1.ZoneOperationsClient(**client_options(endpoint))
        self.settings = settings
        self.image = image
        self.timeout = settings.request_timeout_s
        self.retry = read_retry(settings.read_retry_s)
        self.clock = clock

    def instance(self, action: CreateMachine, spec: JobSpec) -> compute_v1.Instance:
        m = spec.machine
        if not isinstance(m, GpuMachine):
            raise PermanentError(f"machine.kind: {m.kind!r} cannot run on a GPU VM; allowed: gpu")
        zone, tier = action.zone, spec.all_tiers[action.tier]
        left = (action.deadline - self.clock()) if action.deadline is not None else spec.ttl_s
        metadata = {**machine_metadata(spec, action.attempt), "install-nvidia-driver": "True"}
        nic = compute_v1.NetworkInterface(network=self.settings.network or DEFAULT_NETWORK)
        if self.settings.external_ips:
            nic.access_configs = [compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
        disk = compute_v1.AttachedDisk(
            boot=True,
            auto_delete=True,
            initialize_params=compute_v1.AttachedDiskInitializeParams(
                source_image=self.image, disk_size_gb=m.boot_disk_gb, disk_type=f"zones/{zone}/diskTypes/pd-balanced"
            ),
        )
        instance = compute_v1.Instance(
            name=action.machine,
            machine_type=f"zones/{zone}/machineTypes/{m.machine_type}",
            guest_accelerators=[
                compute_v1.AcceleratorConfig(
                    accelerator_type=f"zones/{zone}/acceleratorTypes/{m.accelerator_type}",
                    accelerator_count=m.accelerator_count,
                )
            ],
            scheduling=scheduling(tier.provisioning, max(MIN_RUN_S, int(left))),
            disks=[disk],
            network_interfaces=[nic],
            metadata=compute_v1.Metadata(items=[compute_v1.Items(key=k, value=v) for k, v in metadata.items()]),
            labels=machine_labels(spec, action.attempt),
        )
        if tier.reservation:
            instance.reservation_affinity = compute_v1.ReservationAffinity(
                consume_reservation_type="SPECIFIC_RESERVATION",
                key="compute.googleapis.com/reservation-name",
                values=[tier.reservation],
            )
        if self.settings.service_account:
            account = compute_v1.ServiceAccount(email=self.settings.service_account, scopes=[CLOUD_PLATFORM])
            instance.service_accounts = [account]
        return instance

    def create(self, action: CreateMachine, spec: JobSpec) -> None:
        what = f"create GPU VM {action.machine} in {action.zone}"
        try:
            op = self.client.insert_unary(
                project=self.project,
                zone=action.zone,
                instance_resource=self.instance(action, spec),
                timeout=self.timeout,
            )
        except Exception as e:
            if is_already_exists(e):
                return
            raise classify(e, what) from e
        deadline = time.monotonic() + self.settings.create_wait_s
        while op.status != _DONE:
            left = deadline - time.monotonic()
            if left <= 0:
                return  # still creating: the sweep observes the VM later
            try:
                op = self.operations.wait(project=self.project, zone=action.zone, operation=op.name, timeout=left)
            except (requests.exceptions.Timeout, gexc.DeadlineExceeded):
                return
            except Exception as e:  # waiting itself failed (not the operation)
                raise classify(e, what) from e
        if op.error.errors:
            exc = _operation_error(op)
            if not is_already_exists(exc):
                raise classify(exc, what, in_operation=True) from exc

    def delete(self, name: str, zone: str, spec: JobSpec | None = None) -> None:
        try:
            self.client.delete_unary(project=self.project, zone=zone, instance=name, timeout=self.timeout)
        except gexc.NotFound:
            return
        except Exception as e:
            raise classify(e, f"delete GPU VM {name} in {zone}") from e

    def get(self, name: str, zone: str, spec: JobSpec | None = None) -> Machine | None:
        try:
            vm = self.client.get(project=self.project, zone=zone, instance=name, retry=self.retry, timeout=self.timeout)
        except gexc.NotFound:
            return None
        except Exception as e:
            raise classify(e, f"get GPU VM {name} in {zone}") from e
        return _machine(vm, zone)

    def list(self, zone: str, job_id: str | None = None) -> list[Machine]:
        query = f'(labels.{LABEL_MANAGED} = "true")'
        if job_id is not None:
            query += f' AND (labels.{LABEL_JOB} = "{job_id}")'
        request = compute_v1.ListInstancesRequest(project=self.project, zone=zone, filter=query)
        try:
            vms = list(self.client.list(request=request, retry=self.retry, timeout=self.timeout))
        except Exception as e:
            raise classify(e, f"list GPU VMs in {zone}") from e
        return [  # the filter again, client-side: a label value is never trusted to the query language alone
            _machine(vm, zone)
            for vm in vms
            if vm.labels.get(LABEL_MANAGED) == "true" and (job_id is None or vm.labels.get(LABEL_JOB) == job_id)
        ]


def _operation_error(op: compute_v1.Operation) -> gexc.GoogleAPICallError:
    errors = [{"reason": e.code, "message": e.message} for e in op.error.errors]
    message = "; ".join(f"{e.code}: {e.message}" for e in op.error.errors)
    exc: gexc.GoogleAPICallError = gexc.from_http_status(  # type: ignore[no-untyped-call]
        op.http_error_status_code or 500, message, errors=errors
    )
    return exc


def _machine(vm: compute_v1.Instance, zone: str) -> Machine:
    state = STATES.get(vm.status, MachineState.CREATING)  # unknown: let the sweep's timeout judge
    return Machine(name=vm.name, zone=zone, state=state, labels=dict(vm.labels))
