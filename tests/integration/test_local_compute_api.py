"""The local Compute Engine API through the real google.cloud.compute_v1 clients (REST, anonymous credentials):
TPU VMs as instances, workload policies, instance templates, MIG slices (BULK for flex-start and reservation-bound
templates only) and resize requests, their zone, region and global operations, and what the API refuses."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests
from google.api_core import exceptions as gexc
from google.cloud import compute_v1, tpu_v2

from localcloud.apis.cloudapi import CloudApiServer, CloudMachine
from respawn.adapters.settings import client_options

pytestmark = pytest.mark.waits

P, ZONE, REGION = "proj", "us-east5-b", "us-east5"
# ZONE offers v6e, not v5p (us-east5-a), TPU7x (us-central1-c), v5e or L4 (us-central1-a): localcloud/apis/offerings.py
V5P_ZONE, TPU7X_ZONE, V5E_ZONE = "us-east5-a", "us-central1-c", "us-central1-a"
DELAY = 0.05


@dataclass
class Compute:
    """The clients respawn's Compute provider uses, pointed at one local server."""

    server: CloudApiServer
    instances: compute_v1.InstancesClient
    policies: compute_v1.ResourcePoliciesClient
    templates: compute_v1.InstanceTemplatesClient
    migs: compute_v1.InstanceGroupManagersClient
    resize: compute_v1.InstanceGroupManagerResizeRequestsClient
    zone_ops: compute_v1.ZoneOperationsClient
    region_ops: compute_v1.RegionOperationsClient
    global_ops: compute_v1.GlobalOperationsClient

    def done(self, op: compute_v1.Operation) -> compute_v1.Operation:
        """Wait for the operation in its own scope (zone, region or global) until DONE."""
        deadline = time.monotonic() + 10
        while op.status != compute_v1.Operation.Status.DONE:
            assert time.monotonic() < deadline, op
            if op.zone:
                op = self.zone_ops.wait(project=P, zone=op.zone.rpartition("/")[2], operation=op.name)
            elif op.region:
                op = self.region_ops.wait(project=P, region=op.region.rpartition("/")[2], operation=op.name)
            else:
                op = self.global_ops.wait(project=P, operation=op.name)
        return op

    def ok(self, op: compute_v1.Operation) -> compute_v1.Operation:
        op = self.done(op)
        assert not op.error.errors, op.error
        return op

    def slice_objects(
        self, name: str, *, vms: int = 4, topology: str = "4x4", zone: str = ZONE, **template: Any
    ) -> None:
        """Workload policy, template and MIG named `name`, in the order respawn creates them, the MIG BULK where
        its template's provisioning model takes bulk mode (flex-start, reservation-bound), else in the default
        mode."""
        mode = "BULK" if template.get("model") in ("FLEX_START", "RESERVATION_BOUND") else None
        region = zone.rpartition("-")[0]
        self.ok(self.policies.insert_unary(project=P, region=region, resource_policy_resource=policy(name, topology)))
        self.ok(self.templates.insert_unary(project=P, instance_template_resource=instance_template(name, **template)))
        group = mig(name, vms, mode, region=region)
        self.ok(self.migs.insert_unary(project=P, zone=zone, instance_group_manager_resource=group))

    def request(
        self, body: compute_v1.InstanceGroupManagerResizeRequest, group: str = "llm-a1"
    ) -> compute_v1.Operation:
        return self.resize.insert_unary(
            project=P, zone=ZONE, instance_group_manager=group, instance_group_manager_resize_request_resource=body
        )

    def mig(self, name: str, zone: str = ZONE) -> compute_v1.InstanceGroupManager:
        return self.migs.get(project=P, zone=zone, instance_group_manager=name)

    def managed(self, name: str) -> list[compute_v1.ManagedInstance]:
        return list(self.migs.list_managed_instances(project=P, zone=ZONE, instance_group_manager=name))

    def topology(self, name: str, zone: str = ZONE) -> str:
        return self.mig(name, zone).status.applied_accelerator_topologies[0].state


def connect(server: CloudApiServer) -> Compute:
    opts = client_options(server.url)
    return Compute(
        server,
        compute_v1.InstancesClient(**opts),
        compute_v1.ResourcePoliciesClient(**opts),
        compute_v1.InstanceTemplatesClient(**opts),
        compute_v1.InstanceGroupManagersClient(**opts),
        compute_v1.InstanceGroupManagerResizeRequestsClient(**opts),
        compute_v1.ZoneOperationsClient(**opts),
        compute_v1.RegionOperationsClient(**opts),
        compute_v1.GlobalOperationsClient(**opts),
    )


@pytest.fixture
def api() -> Iterator[Compute]:
    with CloudApiServer(create_delay_s=DELAY) as server:
        yield connect(server)


def eventually(check: Callable[[], object], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.02)


def policy(name: str, topology: str = "4x4") -> compute_v1.ResourcePolicy:
    workload = compute_v1.ResourcePolicyWorkloadPolicy(type_="HIGH_THROUGHPUT", accelerator_topology=topology)
    return compute_v1.ResourcePolicy(name=name, workload_policy=workload)


def scheduling(model: str = "SPOT", termination: str = "STOP", run_s: int | None = None) -> compute_v1.Scheduling:
    s = compute_v1.Scheduling(
        provisioning_model=model,
        instance_termination_action=termination,
        on_host_maintenance="TERMINATE",
        automatic_restart=False,
    )
    if run_s is not None:
        s.max_run_duration = compute_v1.Duration(seconds=run_s)
    return s


def properties(machine_type: str, **kw: Any) -> dict[str, Any]:
    """The instance properties respawn sends for a TPU VM, alike in an instance and a template."""
    image = "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"
    return dict(
        machine_type=machine_type,
        scheduling=scheduling(**kw),
        disks=[
            compute_v1.AttachedDisk(
                boot=True,
                auto_delete=True,
                initialize_params=compute_v1.AttachedDiskInitializeParams(source_image=image, disk_size_gb=100),
            )
        ],
        network_interfaces=[compute_v1.NetworkInterface(network="global/networks/default")],
        metadata=compute_v1.Metadata(items=[compute_v1.Items(key="respawn-job-id", value="llm")]),
        labels={"respawn-managed": "true", "respawn-job": "llm"},
        service_accounts=[compute_v1.ServiceAccount(email="m@proj.iam.gserviceaccount.com", scopes=["x"])],
    )


def instance(name: str, machine_type: str = "ct6e-standard-8t", zone: str = ZONE, **kw: Any) -> compute_v1.Instance:
    return compute_v1.Instance(name=name, **properties(f"zones/{zone}/machineTypes/{machine_type}", **kw))


def instance_template(name: str, machine_type: str = "ct6e-standard-4t", **kw: Any) -> compute_v1.InstanceTemplate:
    return compute_v1.InstanceTemplate(
        name=name, properties=compute_v1.InstanceProperties(**properties(machine_type, **kw))
    )


def mig(
    name: str, vms: int, mode: str | None = None, action: str = "DO_NOTHING", region: str = REGION, **kw: Any
) -> compute_v1.InstanceGroupManager:
    """A slice's MIG in `mode` (None: the default mode, no targetSizePolicy, as for a Spot template)."""
    group = compute_v1.InstanceGroupManager(
        name=name,
        base_instance_name=f"{name}-w",
        instance_template=f"projects/{P}/global/instanceTemplates/{name}",
        target_size=vms,
        instance_lifecycle_policy=compute_v1.InstanceGroupManagerInstanceLifecyclePolicy(
            default_action_on_failure=action
        ),
        resource_policies=compute_v1.InstanceGroupManagerResourcePolicies(
            workload_policy=f"projects/{P}/regions/{region}/resourcePolicies/{name}"
        ),
        description="respawn-managed",
    )
    if mode is not None:
        group.target_size_policy = compute_v1.InstanceGroupManagerTargetSizePolicy(mode=mode)
    for key, value in kw.items():
        setattr(group, key, value)
    return group


def resize_request(name: str, by: int = 4, run_s: int = 3600) -> compute_v1.InstanceGroupManagerResizeRequest:
    duration = compute_v1.Duration(seconds=run_s)
    return compute_v1.InstanceGroupManagerResizeRequest(name=name, resize_by=by, requested_run_duration=duration)


def refused(call: Callable[[], object], match: str, reason: str = "invalid") -> None:
    """The call is refused with a 400 whose message matches and whose errors[].reason is `reason`."""
    with pytest.raises(gexc.BadRequest, match=match) as e:
        call()
    assert [x["reason"] for x in e.value.errors] == [reason]


# ------------------------------------------------------------------------------------------------ instances


def test_a_tpu_vm_is_an_instance_with_a_tpu_machine_type(api: Compute) -> None:
    op = api.instances.insert_unary(project=P, zone=ZONE, instance_resource=instance("llm-a1"))
    assert op.zone.endswith(f"/zones/{ZONE}") and op.target_link.endswith(f"/zones/{ZONE}/instances/llm-a1")
    api.ok(op)  # done once the VM runs
    vm = api.instances.get(project=P, zone=ZONE, instance="llm-a1")
    assert vm.status == "RUNNING" and not vm.guest_accelerators
    assert vm.machine_type.endswith(f"/projects/{P}/zones/{ZONE}/machineTypes/ct6e-standard-8t")
    assert [i.name for i in api.instances.list(project=P, zone=ZONE)] == ["llm-a1"]
    machine = api.server.machine("llm-a1")
    assert machine is not None
    assert (machine.kind, machine.api, machine.workers, machine.chips_per_host) == ("tpu", "compute", ("llm-a1",), 8)
    assert machine.metadata["respawn-job-id"] == "llm"

    with pytest.raises(gexc.Conflict):
        api.instances.insert_unary(project=P, zone=ZONE, instance_resource=instance("llm-a1"))
    api.ok(api.instances.delete_unary(project=P, zone=ZONE, instance="llm-a1"))
    with pytest.raises(gexc.NotFound):
        api.instances.get(project=P, zone=ZONE, instance="llm-a1")
    with pytest.raises(gexc.NotFound):
        api.instances.delete_unary(project=P, zone=ZONE, instance="llm-a1")
    assert api.server.leftovers() == []


def test_a_tpu_vm_starts_pending_then_staging_then_running() -> None:
    with CloudApiServer(create_delay_s=0.4) as server:
        api = connect(server)
        vm = instance("llm-a1", "ct5p-hightpu-4t", zone=V5P_ZONE)
        api.instances.insert_unary(project=P, zone=V5P_ZONE, instance_resource=vm)
        seen: list[str] = []

        def running() -> bool:
            status = api.instances.get(project=P, zone=V5P_ZONE, instance="llm-a1").status
            if not seen or seen[-1] != status:
                seen.append(status)
            return status == "RUNNING"

        eventually(running)
    assert seen == ["PENDING", "STAGING", "RUNNING"]


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (  # the chips come with the machine type
            lambda i: i.guest_accelerators.append(
                compute_v1.AcceleratorConfig(accelerator_type="nvidia-a100-80gb", accelerator_count=1)
            ),
            "comes with its 8 TPU chips; it takes no guestAccelerators",
        ),
        (lambda i: setattr(i, "machine_type", f"zones/{ZONE}/machineTypes/ct5lp-hightpu-4t"), "does not exist"),
        (lambda i: setattr(i, "machine_type", "ct6e-standard-8t"), "A machine type URL in zone"),
        (lambda i: setattr(i, "machine_type", "zones/us-west1-c/machineTypes/ct6e-standard-8t"), "machine type URL"),
        (lambda i: setattr(i.scheduling, "on_host_maintenance", "MIGRATE"), "do not support live migration"),
        (lambda i: setattr(i, "deletion_protection", True), "'resource.deletionProtection' is not supported"),
        (lambda i: setattr(i.scheduling, "provisioning_model", "FLEX_START"), "needs a maxRunDuration"),
        (
            lambda i: setattr(
                i, "params", compute_v1.InstanceParams(request_valid_for_duration=compute_v1.Duration(seconds=60))
            ),
            "only a FLEX_START instance waits",
        ),
        (lambda i: setattr(i, "name", "Not_A_Name"), "resource.name"),
    ],
)
def test_an_instance_the_api_does_not_accept_is_refused(
    api: Compute, change: Callable[[compute_v1.Instance], object], match: str
) -> None:
    body = instance("llm-a1")
    change(body)
    refused(lambda: api.instances.insert_unary(project=P, zone=ZONE, instance_resource=body), match)
    assert api.server.leftovers() == []


def test_a_field_the_compute_client_does_not_know_is_refused(api: Compute) -> None:
    url = f"{api.server.url}/compute/v1/projects/{P}/zones/{ZONE}/instances"
    body = {"name": "llm-a1", "machineType": f"zones/{ZONE}/machineTypes/ct6e-standard-8t", "acceleratorType": "v6e-8"}
    reply = requests.post(url, json=body, timeout=5)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert (
        error["message"]
        == "Invalid JSON payload received. Unknown name \"acceleratorType\" at 'resource': Cannot find field."
    )
    nested = {"name": "llm-a1", "machineType": body["machineType"], "scheduling": {"spotty": True}}
    assert "at 'resource.scheduling'" in requests.post(url, json=nested, timeout=5).json()["error"]["message"]
    assert api.server.leftovers() == []


def test_a_stockout_ends_the_insert_operation_with_zone_resource_pool_exhausted() -> None:
    with CloudApiServer(create_delay_s=DELAY, stockouts={ZONE: 1}) as server:
        api = connect(server)
        op = api.done(api.instances.insert_unary(project=P, zone=ZONE, instance_resource=instance("llm-a1")))
        assert [e.code for e in op.error.errors] == ["ZONE_RESOURCE_POOL_EXHAUSTED"]
        assert op.http_error_status_code == 503 and server.leftovers() == []
        api.ok(api.instances.insert_unary(project=P, zone=ZONE, instance_resource=instance("llm-a1")))


def flex_instance(name: str, valid_s: int = 600) -> compute_v1.Instance:
    body = instance(name, model="FLEX_START", termination="DELETE", run_s=3600)
    body.params = compute_v1.InstanceParams(request_valid_for_duration=compute_v1.Duration(seconds=valid_s))
    return body


def test_a_flex_start_instance_waits_pending_for_capacity_then_runs() -> None:
    with CloudApiServer(create_delay_s=DELAY, queue_waits={ZONE: 0.4}) as server:
        api = connect(server)
        op = api.instances.insert_unary(project=P, zone=ZONE, instance_resource=flex_instance("llm-a1"))
        time.sleep(0.2)
        assert api.instances.get(project=P, zone=ZONE, instance="llm-a1").status == "PENDING"
        assert server.waiting() == [("llm-a1", ZONE)]
        api.ok(op)
        assert api.instances.get(project=P, zone=ZONE, instance="llm-a1").status == "RUNNING"
        assert server.waiting() == []


def test_a_flex_start_instance_whose_wait_ends_first_fails_as_a_stockout(monkeypatch: pytest.MonkeyPatch) -> None:
    with CloudApiServer(create_delay_s=DELAY, queue_waits={ZONE: None}) as server:
        later = server.later
        monkeypatch.setattr(server, "later", lambda delay, fn, *args: later(delay / 1000, fn, *args))  # 90 s: 90 ms
        api = connect(server)
        op = api.done(api.instances.insert_unary(project=P, zone=ZONE, instance_resource=flex_instance("llm-a1", 90)))
        assert [e.code for e in op.error.errors] == ["ZONE_RESOURCE_POOL_EXHAUSTED"]
        with pytest.raises(gexc.NotFound):
            api.instances.get(project=P, zone=ZONE, instance="llm-a1")
        assert server.waiting() == [] and server.leftovers() == []


@pytest.mark.parametrize("valid_s", [89, 7201])
def test_a_flex_start_wait_is_between_90_seconds_and_2_hours(api: Compute, valid_s: int) -> None:
    body = flex_instance("llm-a1", valid_s)
    refused(lambda: api.instances.insert_unary(project=P, zone=ZONE, instance_resource=body), "between 90 s and 7200 s")


# ------------------------------------------------------------------------------- policies and templates


def test_policies_and_templates_are_created_listed_and_deleted_with_their_operations(api: Compute) -> None:
    op = api.ok(api.policies.insert_unary(project=P, region=REGION, resource_policy_resource=policy("llm-a1")))
    assert op.region.endswith(f"/regions/{REGION}") and not op.zone
    got = api.region_ops.get(project=P, region=REGION, operation=op.name)
    assert got.status == compute_v1.Operation.Status.DONE
    found = api.policies.get(project=P, region=REGION, resource_policy="llm-a1")
    assert found.workload_policy.accelerator_topology == "4x4" and found.workload_policy.type_ == "HIGH_THROUGHPUT"
    assert found.self_link.endswith(f"/projects/{P}/regions/{REGION}/resourcePolicies/llm-a1")
    assert [p.name for p in api.policies.list(project=P, region=REGION)] == ["llm-a1"]

    op = api.ok(api.templates.insert_unary(project=P, instance_template_resource=instance_template("llm-a1")))
    assert not op.zone and not op.region and "/global/operations/" in op.self_link
    assert api.global_ops.get(project=P, operation=op.name).status == compute_v1.Operation.Status.DONE
    template = api.templates.get(project=P, instance_template="llm-a1")
    assert template.properties.machine_type == "ct6e-standard-4t"
    assert template.properties.scheduling.provisioning_model == "SPOT"
    assert [t.name for t in api.templates.list(project=P)] == ["llm-a1"]

    with pytest.raises(gexc.Conflict):
        api.policies.insert_unary(project=P, region=REGION, resource_policy_resource=policy("llm-a1"))
    with pytest.raises(gexc.Conflict):
        api.templates.insert_unary(project=P, instance_template_resource=instance_template("llm-a1"))
    with pytest.raises(gexc.NotFound):  # an operation is found in its own scope only
        api.zone_ops.get(project=P, zone=ZONE, operation=op.name)

    api.ok(api.templates.delete_unary(project=P, instance_template="llm-a1"))
    api.ok(api.policies.delete_unary(project=P, region=REGION, resource_policy="llm-a1"))
    with pytest.raises(gexc.NotFound):
        api.templates.delete_unary(project=P, instance_template="llm-a1")
    with pytest.raises(gexc.NotFound):
        api.policies.get(project=P, region=REGION, resource_policy="llm-a1")
    assert api.server.leftovers() == []


def test_a_template_takes_a_bare_machine_type_and_refuses_what_an_instance_refuses(api: Compute) -> None:
    def insert(t: compute_v1.InstanceTemplate) -> None:
        api.templates.insert_unary(project=P, instance_template_resource=t)

    refused(lambda: insert(instance_template("t", f"zones/{ZONE}/machineTypes/ct6e-standard-4t")), "name, e.g.")
    refused(lambda: insert(instance_template("t", "ct9z-standard-4t")), "'ct9z-standard-4t' does not exist")
    with_gpu = instance_template("t")
    with_gpu.properties.guest_accelerators = [
        compute_v1.AcceleratorConfig(accelerator_type="nvidia-l4", accelerator_count=1)
    ]
    refused(lambda: insert(with_gpu), "it takes no guestAccelerators")
    refused(
        lambda: api.policies.insert_unary(project=P, region=REGION, resource_policy_resource=policy("p", "4by4")),
        "Must be AxB or AxBxC",
    )
    assert api.server.leftovers() == []


# -------------------------------------------------------------------------------------------------- MIGs


def test_a_slice_mig_creates_its_vms_at_once_and_is_active_when_all_run() -> None:
    ready: list[CloudMachine] = []
    with CloudApiServer(create_delay_s=0.3, on_ready=ready.append) as server:
        api = connect(server)
        api.slice_objects("llm-a1")
        group = api.mig("llm-a1")
        assert group.target_size == 4 and not group.target_size_policy.mode  # a Spot template: the default mode
        assert group.instance_template.endswith(f"/projects/{P}/global/instanceTemplates/llm-a1")
        assert group.resource_policies.workload_policy.endswith(f"/regions/{REGION}/resourcePolicies/llm-a1")
        assert group.status.applied_accelerator_topologies[0].accelerator_topology == "4x4"
        assert group.status.applied_accelerator_topologies[0].state == "INCOMPLETE"  # its VMs provision
        assert not group.status.is_stable and group.current_actions.creating == 4

        managed = api.managed("llm-a1")
        names = [m.name for m in managed]
        assert len(names) == 4 and all(re.fullmatch(r"llm-a1-w-[a-z0-9]{4}", n) for n in names)
        for number, name in enumerate(names):
            vm = api.instances.get(project=P, zone=ZONE, instance=name)
            metadata = {i.key: i.value for i in vm.metadata.items}
            assert metadata["agent-worker-number"] == str(number)
            assert metadata["worker-network-endpoints"] == ",".join(names)
            assert metadata["created-by"] == f"projects/{P}/zones/{ZONE}/instanceGroupManagers/llm-a1"
            assert metadata["respawn-job-id"] == "llm" and vm.labels["respawn-job"] == "llm"
            assert vm.machine_type.endswith("/machineTypes/ct6e-standard-4t") and vm.status in ("PENDING", "STAGING")

        eventually(lambda: api.topology("llm-a1") == "ACTIVE")
        group = api.mig("llm-a1")
        assert group.status.is_stable and group.current_actions.none == 4
        assert group.status.current_instance_statuses.running == 4
        assert [m.instance_status for m in api.managed("llm-a1")] == ["RUNNING"] * 4
        eventually(lambda: ready)
        [machine] = ready
        assert (machine.name, machine.kind, machine.api, machine.state) == ("llm-a1", "tpu", "compute", "ACTIVE")
        assert machine.workers == tuple(names) and machine.chips_per_host == 4
        assert [m.name for m in server.machines()] == ["llm-a1"]  # one machine, not five


def test_a_preempted_vm_deactivates_the_topology_and_is_not_repaired(api: Compute) -> None:
    api.slice_objects("llm-a1")
    eventually(lambda: api.topology("llm-a1") == "ACTIVE")
    names = [m.name for m in api.managed("llm-a1")]

    machine = api.server.preempt("llm-a1", worker=1)
    assert machine is not None and machine.state == "DEACTIVATING"
    assert api.instances.get(project=P, zone=ZONE, instance=names[1]).status == "TERMINATED"  # it asked to STOP
    eventually(lambda: api.topology("llm-a1") == "INCOMPLETE")
    time.sleep(3 * DELAY)
    assert [m.instance_status for m in api.managed("llm-a1")] == ["RUNNING", "TERMINATED", "RUNNING", "RUNNING"]
    assert api.mig("llm-a1").target_size == 4 and api.topology("llm-a1") == "INCOMPLETE"


def test_a_spot_vm_that_asked_to_be_deleted_is_gone_and_its_slice_incomplete(api: Compute) -> None:
    api.slice_objects("llm-a1", termination="DELETE")
    eventually(lambda: api.topology("llm-a1") == "ACTIVE")
    names = [m.name for m in api.managed("llm-a1")]
    api.server.preempt(names[2])  # a MIG's VM by its own name
    with pytest.raises(gexc.NotFound):
        api.instances.get(project=P, zone=ZONE, instance=names[2])
    eventually(lambda: api.topology("llm-a1") == "INCOMPLETE")
    managed = api.managed("llm-a1")
    assert [m.name for m in managed] == names and not managed[2].instance_status  # listed, not recreated
    assert api.mig("llm-a1").status.current_instance_statuses.non_existent == 1


def test_set_state_of_one_worker_and_of_the_whole_slice(api: Compute) -> None:
    api.slice_objects("llm-a1")
    eventually(lambda: api.topology("llm-a1") == "ACTIVE")
    api.server.set_state("llm-a1", "TERMINATED", worker=3)
    assert [m.instance_status for m in api.managed("llm-a1")][3] == "TERMINATED"
    assert api.topology("llm-a1") == "DEACTIVATING"
    api.server.set_state("llm-a1", "STOPPED")
    assert {m.instance_status for m in api.managed("llm-a1")} == {"STOPPED"}
    assert api.server.set_state("llm-a1", "STOPPED", worker=4) is None  # no such worker


def test_deleting_a_mig_deletes_its_vms_and_then_its_template_and_policy_can_go() -> None:
    deleted: list[CloudMachine] = []
    with CloudApiServer(create_delay_s=DELAY, on_deleted=deleted.append) as server:
        api = connect(server)
        api.slice_objects("llm-a1")
        eventually(lambda: api.topology("llm-a1") == "ACTIVE")
        assert len(server.leftovers()) == 7  # 4 VMs, the MIG, its template and its policy
        refused(
            lambda: api.templates.delete_unary(project=P, instance_template="llm-a1"),
            f"The instance_template resource 'projects/{P}/global/instanceTemplates/llm-a1' is already being used "
            f"by 'projects/{P}/zones/{ZONE}/instanceGroupManagers/llm-a1'",
            "resourceInUseByAnotherResource",
        )
        refused(
            lambda: api.policies.delete_unary(project=P, region=REGION, resource_policy="llm-a1"),
            "is already being used by",
            "resourceInUseByAnotherResource",
        )
        vm = api.managed("llm-a1")[0].name
        refused(
            lambda: api.instances.delete_unary(project=P, zone=ZONE, instance=vm), "delete the managed instance group"
        )

        api.ok(api.migs.delete_unary(project=P, zone=ZONE, instance_group_manager="llm-a1"))
        assert list(api.instances.list(project=P, zone=ZONE)) == []
        with pytest.raises(gexc.NotFound):
            api.mig("llm-a1")
        with pytest.raises(gexc.NotFound):
            api.migs.delete_unary(project=P, zone=ZONE, instance_group_manager="llm-a1")
        eventually(lambda: deleted)
        assert [(m.name, m.deleted_at is not None) for m in deleted] == [("llm-a1", True)]
        assert sorted(server.leftovers()) == [
            f"projects/{P}/global/instanceTemplates/llm-a1",
            f"projects/{P}/regions/{REGION}/resourcePolicies/llm-a1",
        ]
        api.ok(api.templates.delete_unary(project=P, instance_template="llm-a1"))
        api.ok(api.policies.delete_unary(project=P, region=REGION, resource_policy="llm-a1"))
        assert server.leftovers() == [] and server.machines() == []


def test_a_mig_insert_twice_is_already_exists_and_the_list_has_it_once(api: Compute) -> None:
    api.slice_objects("llm-a1")
    with pytest.raises(gexc.Conflict):
        api.migs.insert_unary(project=P, zone=ZONE, instance_group_manager_resource=mig("llm-a1", 4))
    assert [g.name for g in api.migs.list(project=P, zone=ZONE)] == ["llm-a1"]
    with pytest.raises(gexc.NotFound):
        api.mig("llm-a2")


@pytest.mark.parametrize(
    ("topology", "vms", "change", "match"),
    [
        ("4x4", 3, {}, r"topology 4x4 of .* has 16 chips; 3 VMs of ct6e-standard-4t have 12"),
        ("2x2x4", 4, {}, "v6e slices have an AxB topology"),
        (
            "4x4",
            4,
            {"target_size_policy": compute_v1.InstanceGroupManagerTargetSizePolicy(mode="BULK")},
            "Bulk mode supports instance templates with provisioning model FLEX_START, RESERVATION_BOUND",
        ),
        (
            "4x4",
            4,
            {
                "instance_lifecycle_policy": compute_v1.InstanceGroupManagerInstanceLifecyclePolicy(
                    default_action_on_failure="REPAIR"
                )
            },
            "DO_NOTHING is required",
        ),
        (
            "4x4",
            4,
            {"resource_policies": compute_v1.InstanceGroupManagerResourcePolicies(workload_policy="llm-a1")},
            "The URL is malformed",
        ),
        (
            "4x4",
            4,
            {"auto_healing_policies": [compute_v1.InstanceGroupManagerAutoHealingPolicy(initial_delay_sec=60)]},
            "'resource.autoHealingPolicies' is not supported",
        ),
    ],
)
def test_a_mig_the_api_does_not_accept_is_refused(
    api: Compute, topology: str, vms: int, change: dict[str, Any], match: str
) -> None:
    api.ok(api.policies.insert_unary(project=P, region=REGION, resource_policy_resource=policy("llm-a1", topology)))
    api.ok(api.templates.insert_unary(project=P, instance_template_resource=instance_template("llm-a1")))
    body = mig("llm-a1", vms, **change)
    refused(lambda: api.migs.insert_unary(project=P, zone=ZONE, instance_group_manager_resource=body), match)
    with pytest.raises(gexc.NotFound):
        api.mig("llm-a1")


def test_a_mig_needs_its_template_and_policy_to_exist(api: Compute) -> None:
    with pytest.raises(gexc.NotFound, match="instanceTemplates/llm-a1"):
        api.migs.insert_unary(project=P, zone=ZONE, instance_group_manager_resource=mig("llm-a1", 4))
    api.ok(api.templates.insert_unary(project=P, instance_template_resource=instance_template("llm-a1")))
    with pytest.raises(gexc.NotFound, match="resourcePolicies/llm-a1"):
        api.migs.insert_unary(project=P, zone=ZONE, instance_group_manager_resource=mig("llm-a1", 4))


def test_v5p_and_tpu7x_slices_have_three_dimensional_topologies(api: Compute) -> None:
    slices = (("v5p-a1", "ct5p-hightpu-4t", V5P_ZONE), ("ironwood-a1", "tpu7x-standard-4t", TPU7X_ZONE))
    for name, machine_type, zone in slices:
        api.slice_objects(name, vms=2, topology="2x2x2", zone=zone, machine_type=machine_type)
    eventually(lambda: {api.topology(name, zone) for name, _, zone in slices} == {"ACTIVE"})


# ------------------------------------------------------------------------------------------ BULK stockouts


def test_a_bulk_mig_in_a_stocked_out_zone_waits_for_all_its_capacity() -> None:
    with CloudApiServer(create_delay_s=DELAY, stockouts={ZONE: 1}, queue_waits={ZONE: 0.5}) as server:
        api = connect(server)
        api.slice_objects("llm-a1")  # the insert operation succeeds: the MIG exists and waits
        group = api.mig("llm-a1")
        bulk = group.status.bulk_instance_operation
        assert bulk.in_progress and group.target_size == 4
        assert [e.code for e in bulk.last_progress_check.error.errors] == ["ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"]
        assert [m.current_action for m in api.managed("llm-a1")] == ["CREATING"] * 4
        assert list(api.instances.list(project=P, zone=ZONE)) == []  # no VM until all can be made
        assert server.waiting() == [("llm-a1", ZONE)]
        eventually(lambda: api.topology("llm-a1") == "ACTIVE")
        assert server.waiting() == []
        assert not api.mig("llm-a1").status.bulk_instance_operation.in_progress


def test_a_bulk_mig_stockout_can_fail_its_insert_operation_instead() -> None:
    with CloudApiServer(create_delay_s=DELAY, stockouts={ZONE: 1}, bulk_stockout="fail") as server:
        api = connect(server)
        with pytest.raises(AssertionError, match="ZONE_RESOURCE_POOL_EXHAUSTED"):
            api.slice_objects("llm-a1")
        with pytest.raises(gexc.NotFound):
            api.mig("llm-a1")
        api.ok(api.migs.insert_unary(project=P, zone=ZONE, instance_group_manager_resource=mig("llm-a1", 4)))


@pytest.mark.parametrize(("model", "accepted"), [("SPOT", False), ("STANDARD", False), ("FLEX_START", True)])
def test_bulk_mode_takes_only_flex_start_and_reservation_bound_templates(
    api: Compute, model: str, accepted: bool
) -> None:
    """compute/docs/instance-groups/bulk-create-instances-in-mig: "Bulk mode in MIGs is only supported with instance
    templates that specify either a reservation-bound or flex-start provisioning model"."""
    flex = {"termination": "DELETE", "run_s": 3600} if model == "FLEX_START" else {}
    api.ok(api.policies.insert_unary(project=P, region=REGION, resource_policy_resource=policy("llm-a1")))
    template = instance_template("llm-a1", model=model, **flex)
    api.ok(api.templates.insert_unary(project=P, instance_template_resource=template))

    def insert() -> compute_v1.Operation:
        return api.migs.insert_unary(project=P, zone=ZONE, instance_group_manager_resource=mig("llm-a1", 4, "BULK"))

    if accepted:
        api.ok(insert())
        eventually(lambda: api.topology("llm-a1") == "ACTIVE")
    else:
        refused(insert, f"Bulk mode supports instance templates with provisioning model .*has {model}")


def test_a_flex_start_bulk_mig_waits_for_its_zones_queue() -> None:
    with CloudApiServer(create_delay_s=DELAY, queue_waits={ZONE: 0.4}) as server:
        api = connect(server)
        api.slice_objects("llm-a1", model="FLEX_START", termination="DELETE", run_s=3600)
        assert api.mig("llm-a1").status.bulk_instance_operation.in_progress
        eventually(lambda: api.topology("llm-a1") == "ACTIVE")


def test_a_bulk_mig_resizes_from_zero_to_its_full_size_and_back(api: Compute) -> None:
    api.slice_objects("llm-a1", vms=0)
    assert api.mig("llm-a1").target_size == 0 and api.managed("llm-a1") == []
    refused(lambda: api.migs.resize_unary(project=P, zone=ZONE, instance_group_manager="llm-a1", size=2), "16 chips")
    api.ok(api.migs.resize_unary(project=P, zone=ZONE, instance_group_manager="llm-a1", size=4))
    eventually(lambda: api.topology("llm-a1") == "ACTIVE")
    refused(lambda: api.migs.resize_unary(project=P, zone=ZONE, instance_group_manager="llm-a1", size=8), "grows only")
    api.ok(api.migs.resize_unary(project=P, zone=ZONE, instance_group_manager="llm-a1", size=0))
    assert list(api.instances.list(project=P, zone=ZONE)) == []
    eventually(lambda: api.topology("llm-a1") == "INCOMPLETE")


# --------------------------------------------------------------------------------------- resize requests


def flex_mig(api: Compute, name: str = "llm-a1") -> None:
    """A flex-start slice as respawn asks for it: the MIG at size 0, then a resize request for its VMs."""
    api.slice_objects(name, vms=0, model="FLEX_START", termination="DELETE", run_s=3600)


def test_a_resize_request_is_accepted_waits_for_capacity_then_succeeds() -> None:
    with CloudApiServer(create_delay_s=DELAY, queue_waits={ZONE: 0.6}) as server:
        api = connect(server)
        flex_mig(api)
        op = api.request(resize_request("llm-a1"))
        api.ok(op)
        assert op.target_link.endswith("/instanceGroupManagers/llm-a1/resizeRequests/llm-a1")

        def state() -> str:
            return api.resize.get(project=P, zone=ZONE, instance_group_manager="llm-a1", resize_request="llm-a1").state

        assert state() in ("CREATING", "ACCEPTED")
        eventually(lambda: state() == "ACCEPTED")
        rr = api.resize.get(project=P, zone=ZONE, instance_group_manager="llm-a1", resize_request="llm-a1")
        waits_for = [e.code for e in rr.status.last_attempt.error.errors]
        assert waits_for == ["ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"] and not rr.status.error.errors
        group = api.mig("llm-a1")
        assert group.target_size == 4 and group.status.bulk_instance_operation.in_progress  # waiting, no VM yet
        assert not group.status.bulk_instance_operation.last_progress_check.error.errors  # the request says why
        assert server.waiting() == [("llm-a1", ZONE)]
        assert [m.current_action for m in api.managed("llm-a1")] == ["CREATING"] * 4
        assert list(api.instances.list(project=P, zone=ZONE)) == []
        eventually(lambda: state() == "SUCCEEDED")
        eventually(lambda: api.topology("llm-a1") == "ACTIVE")
        listed = api.resize.list(project=P, zone=ZONE, instance_group_manager="llm-a1")
        assert [(r.name, r.resize_by, r.requested_run_duration.seconds) for r in listed] == [("llm-a1", 4, 3600)]
        with pytest.raises(gexc.Conflict):
            api.request(resize_request("llm-a1"))
        api.ok(api.resize.delete_unary(project=P, zone=ZONE, instance_group_manager="llm-a1", resize_request="llm-a1"))
        assert len(api.managed("llm-a1")) == 4  # a done request's VMs stay
        with pytest.raises(gexc.NotFound):
            api.resize.get(project=P, zone=ZONE, instance_group_manager="llm-a1", resize_request="llm-a1")


def test_a_resize_request_that_fails_says_why_and_adds_nothing(api: Compute) -> None:
    flex_mig(api)
    api.server.fail_next(
        "create",
        collection="resizeRequests",
        code=403,
        status="PERMISSION_DENIED",
        reason="QUOTA_EXCEEDED",
        message="Quota 'TPU_V6E' exceeded.",
        in_operation=True,
    )
    api.ok(api.request(resize_request("llm-a1")))
    rr = api.resize.get(project=P, zone=ZONE, instance_group_manager="llm-a1", resize_request="llm-a1")
    assert rr.state == "FAILED" and [e.code for e in rr.status.error.errors] == ["QUOTA_EXCEEDED"]
    assert api.mig("llm-a1").target_size == 0


def test_a_cancelled_resize_request_takes_its_waiting_vms_with_it() -> None:
    with CloudApiServer(create_delay_s=DELAY, queue_waits={ZONE: None}) as server:
        api = connect(server)
        flex_mig(api)
        api.ok(api.request(resize_request("llm-a1")))
        assert api.mig("llm-a1").target_size == 4
        api.ok(api.resize.delete_unary(project=P, zone=ZONE, instance_group_manager="llm-a1", resize_request="llm-a1"))
        assert api.mig("llm-a1").target_size == 0 and api.managed("llm-a1") == []


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (resize_request("r", by=3), "has 16 chips; 3 VMs"),
        (resize_request("r", run_s=60), "between 600 s"),
        (resize_request("r", by=0), "resizeBy"),
    ],
)
def test_a_resize_request_the_api_does_not_accept_is_refused(
    api: Compute, body: compute_v1.InstanceGroupManagerResizeRequest, match: str
) -> None:
    flex_mig(api)
    refused(lambda: api.request(body), match)
    with pytest.raises(gexc.NotFound):
        api.request(body, "llm-a9")


def test_a_resize_request_needs_a_flex_start_or_reservation_bound_template(api: Compute) -> None:
    api.slice_objects("llm-a1", vms=0)  # Spot
    refused(lambda: api.request(resize_request("llm-a1")), "FLEX_START or RESERVATION_BOUND; .* has SPOT")


def test_resize_requests_can_be_refused_in_tpu_migs() -> None:
    with CloudApiServer(create_delay_s=DELAY, resize_requests=False) as server:
        api = connect(server)
        flex_mig(api)
        refused(
            lambda: api.request(resize_request("r")),
            "Creating resize requests for managed instance group with TPU is not allowed",
        )


# ------------------------------------------------------------------------------------- the call log


def test_the_call_log_names_each_collection_and_what_it_computes_with(api: Compute) -> None:
    api.slice_objects("llm-a1")
    api.ok(api.instances.insert_unary(project=P, zone=ZONE, instance_resource=instance("llm-a2")))
    creates = [(c.collection, c.kind, c.name, c.zone) for c in api.server.calls if c.verb == "create"]
    assert creates == [
        ("resourcePolicies", "tpu", "llm-a1", REGION),
        ("instanceTemplates", "tpu", "llm-a1", "global"),
        ("instanceGroupManagers", "tpu", "llm-a1", ZONE),
        ("instances", "tpu", "llm-a2", ZONE),
    ]
    api.server.fail_next("get", collection="instanceGroupManagers", code=403, status="PERMISSION_DENIED", message="no")
    api.instances.get(project=P, zone=ZONE, instance="llm-a2")  # another collection: not failed
    with pytest.raises(gexc.Forbidden):
        api.mig("llm-a1")


# ------------------------------------------------------------------------- machines as the local cloud sees them


def test_every_machine_says_its_api_its_workers_and_their_chips(api: Compute) -> None:
    tpu = tpu_v2.TpuClient(**client_options(api.server.url))
    node = tpu_v2.Node(accelerator_type="v5litepod-16", runtime_version="v2-alpha-tpuv5-lite")
    tpu.create_node(parent=f"projects/{P}/locations/{V5E_ZONE}", node_id="old-a1", node=node)
    gpu = instance("gpu-a1", "g2-standard-24", model="STANDARD", zone=V5E_ZONE)
    gpu.guest_accelerators = [compute_v1.AcceleratorConfig(accelerator_type="nvidia-l4", accelerator_count=2)]
    api.ok(api.instances.insert_unary(project=P, zone=V5E_ZONE, instance_resource=gpu))
    api.ok(api.instances.insert_unary(project=P, zone=ZONE, instance_resource=instance("one-a1")))
    api.slice_objects("llm-a1", vms=2, topology="2x4")
    eventually(lambda: api.topology("llm-a1") == "ACTIVE")

    machines = {m.name: m for m in api.server.machines()}
    shapes = {name: (m.kind, m.api, len(m.workers), m.chips_per_host) for name, m in machines.items()}
    assert shapes == {
        "old-a1": ("tpu", "tpu", 4, 4),  # a Cloud TPU node: its hidden worker VMs
        "gpu-a1": ("gpu", "compute", 1, 2),
        "one-a1": ("tpu", "compute", 1, 8),
        "llm-a1": ("tpu", "compute", 2, 4),  # a MIG slice: its VMs
    }
    assert all(re.fullmatch(r"t1v-n-[0-9a-f]{8}-w-[0-3]", w) for w in machines["old-a1"].workers)
    assert machines["one-a1"].workers == ("one-a1",)
    assert sorted(api.server.leftovers()) == sorted(
        [
            f"projects/{P}/locations/{V5E_ZONE}/nodes/old-a1",
            f"projects/{P}/zones/{V5E_ZONE}/instances/gpu-a1",
            f"projects/{P}/zones/{ZONE}/instances/one-a1",
            *(f"projects/{P}/zones/{ZONE}/instances/{w}" for w in machines["llm-a1"].workers),
            f"projects/{P}/zones/{ZONE}/instanceGroupManagers/llm-a1",
            f"projects/{P}/global/instanceTemplates/llm-a1",
            f"projects/{P}/regions/{REGION}/resourcePolicies/llm-a1",
        ]
    )
