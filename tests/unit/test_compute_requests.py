"""GcpComputeProvider's requests, built without a server: GPU VMs, TPU VMs, slice objects; and a slice's state as
its MIG and managed instances say."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.cloud import compute_v1
from google.protobuf import json_format

from respawn.actions import CreateMachine
from respawn.adapters import compute_slices as slices
from respawn.adapters.compute import DLVM_IMAGE, GcpComputeProvider, _machine_instance
from respawn.adapters.compute_operations import api_error
from respawn.adapters.compute_slices import Observed, slice_state
from respawn.adapters.errors import classify
from respawn.adapters.settings import ProviderSettings
from respawn.bootstrap import FirstUse, machine_providers
from respawn.deployment import Settings
from respawn.gpus import GPU_SHAPES, GpuShape
from respawn.jobs import GpuMachine, JobSpec, MachineSpec, MachineState, Tier, TpuMachine
from respawn.ports import CapacityError, PermanentError, QuotaError, TransientError, UnofferedError

ZONE = "us-central1-a"
NOW = 1000.0
UBUNTU = "projects/ubuntu-os-accelerator-images/global/images/family/"
ACCOUNT = "m@proj.iam.gserviceaccount.com"


@pytest.fixture
def gce() -> GcpComputeProvider:
    return GcpComputeProvider(
        "proj",
        endpoint="http://127.0.0.1:9",  # never called
        settings=ProviderSettings(service_account=ACCOUNT),
        clock=lambda: NOW,
    )


def job(machine: MachineSpec, provisioning: str = "spot", **kw: Any) -> JobSpec:
    return JobSpec(
        job_id="llm",
        machine=machine,
        zones=(ZONE,),
        image="us-docker.pkg.dev/proj/repo/trainer:1",
        checkpoint_uri="gs://ckpt/llm",
        provisioning=provisioning,
        labels=(("team", "nlp"),),
        ttl_s=7200,
        **kw,
    )


def tpu(accelerator_type: str, **kw: Any) -> TpuMachine:
    return TpuMachine(accelerator_type, api="compute", **kw)


def create(deadline: float | None = NOW + 3600) -> CreateMachine:
    return CreateMachine("llm", 1, "llm-a1", ZONE, deadline)


def body(message: Any) -> dict[str, Any]:
    """The message as its REST JSON body (camelCase, unset fields left out)."""
    return json_format.MessageToDict(type(message).pb(message))


# ------------------------------------------------------------------------------------------------ one instance


def test_a_single_host_tpu_vm_is_an_instance_with_a_tpu_machine_type(gce: GcpComputeProvider) -> None:
    r = body(gce.instance(create(), job(tpu("v6e-8"))))
    assert r["name"] == "llm-a1"
    assert r["machineType"] == f"zones/{ZONE}/machineTypes/ct6e-standard-8t"
    assert "guestAccelerators" not in r  # the chips come with the machine type
    assert r["disks"] == [
        {
            "boot": True,
            "autoDelete": True,
            "initializeParams": {
                "sourceImage": UBUNTU + "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e",
                "diskSizeGb": "100",
                "diskType": f"zones/{ZONE}/diskTypes/hyperdisk-balanced",
            },
        }
    ]
    assert r["scheduling"] == {
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "DELETE",
        "maxRunDuration": {"seconds": "3600"},
        "automaticRestart": False,
        "onHostMaintenance": "TERMINATE",
    }
    assert r["labels"] == {"team": "nlp", "respawn-managed": "true", "respawn-job": "llm", "respawn-attempt": "1"}
    metadata = {i["key"]: i["value"] for i in r["metadata"]["items"]}
    assert metadata["respawn-job-id"] == "llm" and metadata["startup-script"].startswith("#!/bin/bash")
    assert "install-nvidia-driver" not in metadata and "--privileged" in metadata["startup-script"]
    assert r["serviceAccounts"] == [{"email": ACCOUNT, "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}]
    assert r["networkInterfaces"][0]["accessConfigs"][0]["type"] == "ONE_TO_ONE_NAT"
    assert "params" not in r


def test_v5p_boots_from_a_balanced_persistent_disk_and_a_job_may_name_its_image(gce: GcpComputeProvider) -> None:
    image = "projects/my-images/global/images/family/tpu-with-docker"
    r = body(gce.instance(create(), job(tpu("v5p-8", image=image))))
    assert r["machineType"] == f"zones/{ZONE}/machineTypes/ct5p-hightpu-4t"
    assert r["disks"][0]["initializeParams"]["diskType"] == f"zones/{ZONE}/diskTypes/pd-balanced"
    assert r["disks"][0]["initializeParams"]["sourceImage"] == image
    tpu7x = body(gce.instance(create(), job(tpu("tpu7x-8"))))
    assert tpu7x["machineType"].endswith("/tpu7x-standard-4t")
    assert tpu7x["disks"][0]["initializeParams"]["sourceImage"] == UBUNTU + "ubuntu-accel-2404-amd64-tpu-tpu7x"


def test_a_flex_start_vm_waits_for_capacity_at_most_its_queue_timeout(gce: GcpComputeProvider) -> None:
    tiers = (Tier("flex-start", (ZONE,), max_run_duration_s=5400),)
    r = body(gce.instance(create(), job(tpu("v6e-4", queue_timeout_s=900), tiers=tiers)))
    assert r["scheduling"] == {
        "provisioningModel": "FLEX_START",
        "instanceTerminationAction": "DELETE",
        "maxRunDuration": {"seconds": "5400"},
        "automaticRestart": False,
        "onHostMaintenance": "TERMINATE",
    }
    assert r["params"] == {"requestValidForDuration": {"seconds": "900"}}


def test_a_flex_start_vm_without_a_max_run_duration_runs_until_the_ttl_deadline(gce: GcpComputeProvider) -> None:
    r = body(gce.instance(create(deadline=NOW + 4000), job(tpu("v6e-4"), provisioning="flex-start")))
    assert r["scheduling"]["maxRunDuration"] == {"seconds": "4000"}
    week = body(gce.instance(create(deadline=NOW + 30 * 86400), job(tpu("v6e-4"), provisioning="flex-start")))
    assert week["scheduling"]["maxRunDuration"] == {"seconds": str(7 * 86400)}  # Compute Engine's maximum


def test_a_gpu_vm_is_built_as_before(gce: GcpComputeProvider) -> None:
    r = body(gce.instance(create(), job(GpuMachine("g2-standard-8", "nvidia-l4", 1))))
    assert r["machineType"] == f"zones/{ZONE}/machineTypes/g2-standard-8"
    assert r["guestAccelerators"] == [
        {"acceleratorType": f"zones/{ZONE}/acceleratorTypes/nvidia-l4", "acceleratorCount": 1}
    ]
    assert r["disks"][0]["initializeParams"] == {
        "sourceImage": DLVM_IMAGE,
        "diskSizeGb": "200",
        "diskType": f"zones/{ZONE}/diskTypes/pd-balanced",
    }
    metadata = {i["key"]: i["value"] for i in r["metadata"]["items"]}
    assert metadata["install-nvidia-driver"] == "True" and "--gpus all" in metadata["startup-script"]
    flex = body(gce.instance(create(), job(GpuMachine("a3-highgpu-8g", "nvidia-h100-80gb", 8), "flex-start")))
    assert flex["scheduling"]["provisioningModel"] == "FLEX_START" and flex["params"]["requestValidForDuration"]


@pytest.mark.parametrize(
    ("machine", "error"),
    [
        (TpuMachine("v6e-8", "v2-alpha-tpuv6e"), "machine.api: 'tpu'"),  # the Cloud TPU API's machine
        (tpu("v5litepod-8"), "Compute Engine does not offer v5litepod"),
        (tpu("v6e-16"), "is a multi-host slice, not one instance"),
    ],
)
def test_what_is_not_one_compute_engine_instance_is_a_permanent_error(
    gce: GcpComputeProvider, machine: MachineSpec, error: str
) -> None:
    with pytest.raises(PermanentError, match=error):
        gce.instance(create(), job(machine))


# ------------------------------------------------------------------------------------------------ slices


def test_a_multi_host_slice_is_a_workload_policy_a_template_and_a_mig(gce: GcpComputeProvider) -> None:
    s = gce.slice(create(), job(tpu("v6e-16")))
    assert (s.name, s.zone, s.vms, s.topology, s.flex) == ("llm-a1", ZONE, 4, "4x4", False)
    assert body(slices.workload_policy(s)) == {
        "name": "llm-a1",
        "description": f"respawn-managed: slice in {ZONE}",
        "workloadPolicy": {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "4x4"},
    }
    assert body(slices.instance_group_manager(s)) == {
        "name": "llm-a1",
        "description": "respawn-managed",
        "baseInstanceName": "llm-a1-w",
        "instanceTemplate": "projects/proj/global/instanceTemplates/llm-a1",
        "targetSize": 4,
        "resourcePolicies": {"workloadPolicy": "projects/proj/regions/us-central1/resourcePolicies/llm-a1"},
        "instanceLifecyclePolicy": {"defaultActionOnFailure": "DO_NOTHING"},
    }  # a Spot template: the default mode (no targetSizePolicy), as bulk mode takes no Spot template
    template = body(slices.instance_template(s))
    assert template["name"] == "llm-a1" and template["description"] == f"respawn-managed: slice in {ZONE}"
    properties = template["properties"]
    assert properties["machineType"] == "ct6e-standard-4t"  # a template names types bare
    assert properties["disks"][0]["initializeParams"]["diskType"] == "hyperdisk-balanced"
    assert properties["scheduling"] == {
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "STOP",  # a lost VM stays in the MIG as TERMINATED
        "maxRunDuration": {"seconds": "3600"},
        "automaticRestart": False,
        "onHostMaintenance": "TERMINATE",
    }


def test_a_spot_vm_asks_for_the_jobs_preemption_notice_a_standard_one_does_not(gce: GcpComputeProvider) -> None:
    """scheduling.preemptionNoticeDuration: the metadata notice before the soft off, for Spot VMs only."""
    spot = job(tpu("v6e-8"), preemption_notice_s=90)
    assert body(gce.instance(create(), spot))["scheduling"]["preemptionNoticeDuration"] == {"seconds": "90"}
    template = body(slices.instance_template(gce.slice(create(), job(tpu("v6e-16"), preemption_notice_s=90))))
    assert template["properties"]["scheduling"]["preemptionNoticeDuration"] == {"seconds": "90"}
    tiers = (Tier("spot", (ZONE,)), Tier("standard", (ZONE,)))
    standard = job(GpuMachine("g2-standard-8", "nvidia-l4", 1), tiers=tiers, preemption_notice_s=90)
    on_standard = replace(create(), tier=1)
    assert "preemptionNoticeDuration" not in body(gce.instance(on_standard, standard))["scheduling"]
    assert "preemptionNoticeDuration" not in body(gce.instance(create(), job(tpu("v6e-8"))))["scheduling"]


def test_a_slice_template_holds_the_properties_a_single_host_instance_has(gce: GcpComputeProvider) -> None:
    """One builder: apart from the machine type, the zonal names, the preemption action and the startup script
    (a slice VM's waits for its peers), they are the same."""
    template = body(slices.instance_template(gce.slice(create(), job(tpu("v6e-16")))))["properties"]
    instance = body(gce.instance(create(), job(tpu("v6e-8"))))
    differ = {"name", "machineType", "disks", "scheduling"}
    assert {k: v for k, v in instance.items() if k not in differ | {"metadata"}} == {
        k: v for k, v in template.items() if k not in differ | {"metadata"}
    }

    def metadata(properties: dict[str, Any]) -> dict[str, str]:
        return {i["key"]: i["value"] for i in properties["metadata"]["items"] if i["key"] != "startup-script"}

    assert metadata(instance) == metadata(template)
    assert (
        template["disks"][0]["initializeParams"]["sourceImage"]
        == instance["disks"][0]["initializeParams"]["sourceImage"]
    )


@pytest.mark.parametrize(
    ("tier", "mode"),
    [
        (Tier("spot", (ZONE,)), None),
        (Tier("standard", (ZONE,)), None),
        (Tier("flex-start", (ZONE,), max_run_duration_s=7200), {"mode": "BULK"}),
        (Tier("reservation-bound", (ZONE,), reservation="r1"), {"mode": "BULK"}),
    ],
)
@pytest.mark.parametrize("machine", [tpu("v6e-16"), GpuMachine("a3-highgpu-8g", "nvidia-h100-80gb", 8, vms=2)])
def test_a_slice_mig_is_bulk_exactly_where_googles_bulk_mode_takes_its_provisioning_model(
    gce: GcpComputeProvider, machine: MachineSpec, tier: Tier, mode: dict[str, str] | None
) -> None:
    """compute/docs/instance-groups/bulk-create-instances-in-mig: "Bulk mode in MIGs is only supported with instance
    templates that specify either a reservation-bound or flex-start provisioning model"."""
    s = gce.slice(create(), job(machine, tiers=(tier,)))
    assert body(slices.instance_group_manager(s)).get("targetSizePolicy") == mode


class RecordingInserts:
    """A Compute client's insert_unary: records each resource sent, and raises what it is given (policy, template:
    AlreadyExists, which the create takes as done; the MIG: a refusal)."""

    def __init__(self, error: Exception) -> None:
        self.sent: list[Any] = []
        self.error = error

    def insert_unary(self, **kw: Any) -> compute_v1.Operation:
        self.sent.append(next(v for k, v in kw.items() if k.endswith("_resource")))
        raise self.error


def test_a_spot_slices_first_mig_insert_asks_no_bulk_and_a_refusal_is_not_read_for_a_mode(
    gce: GcpComputeProvider,
) -> None:
    """One insert in the mode the docs allow Spot (the default): a 400 that speaks of the target size policy is an
    error like any other, never a cue to ask again in another mode."""
    exists = gexc.AlreadyExists("already exists")
    gce.slices.policies, gce.slices.templates = RecordingInserts(exists), RecordingInserts(exists)  # type: ignore[assignment]
    refusal = gexc.BadRequest("Invalid value for field 'resource.targetSizePolicy.mode': 'INDIVIDUAL'.")
    gce.slices.migs = migs = RecordingInserts(refusal)  # type: ignore[assignment]
    with pytest.raises(PermanentError, match="targetSizePolicy"):
        gce.slices.create(gce.slice(create(), job(tpu("v6e-16"))))
    (mig,) = migs.sent
    assert "targetSizePolicy" not in body(mig) and mig.target_size == 4


def test_a_v5p_slice_names_a_three_dimensional_topology(gce: GcpComputeProvider) -> None:
    s = gce.slice(create(), job(tpu("v5p-32")))
    assert (s.vms, s.topology, s.properties.machine_type) == (4, "2x2x4", "ct5p-hightpu-4t")


def test_a_flex_start_slice_is_a_bulk_mig_of_flex_start_vms(gce: GcpComputeProvider) -> None:
    """No resize request: the BULK MIG itself waits in the flex-start queue."""
    tiers = (Tier("flex-start", (ZONE,), max_run_duration_s=7200),)
    s = gce.slice(create(), job(tpu("v6e-16"), tiers=tiers))
    assert s.flex and body(slices.instance_group_manager(s))["targetSize"] == 4
    assert body(s.properties)["scheduling"] == {
        "provisioningModel": "FLEX_START",
        "instanceTerminationAction": "DELETE",
        "maxRunDuration": {"seconds": "7200"},
        "automaticRestart": False,
        "onHostMaintenance": "TERMINATE",
    }


def test_a_gpu_machine_of_several_vms_is_a_mig_slice_of_gpu_vms(gce: GcpComputeProvider) -> None:
    """machine.vms 2 of a3-highgpu-8g: the slice path, with a workload policy of no topology (Google's placement of
    A3 High VMs in a MIG); an A2 series, which takes no workload policy in a MIG, has none."""
    a3 = GpuMachine("a3-highgpu-8g", "nvidia-h100-80gb", 8, vms=2)
    s = gce.slice(create(), job(a3))
    assert (s.name, s.vms, s.topology, s.placement) == ("llm-a1", 2, None, True)
    assert body(slices.workload_policy(s))["workloadPolicy"] == {"type": "HIGH_THROUGHPUT"}
    group = body(slices.instance_group_manager(s))
    assert group["targetSize"] == 2 and group["resourcePolicies"]["workloadPolicy"].endswith("/llm-a1")
    properties = body(slices.instance_template(s))["properties"]
    assert properties["machineType"] == "a3-highgpu-8g"
    assert properties["guestAccelerators"] == [{"acceleratorType": "nvidia-h100-80gb", "acceleratorCount": 8}]
    assert properties["scheduling"]["instanceTerminationAction"] == "STOP"  # a lost VM stays in its MIG
    metadata = {i["key"]: i["value"] for i in properties["metadata"]["items"]}
    assert "ready_gpu_workers" in metadata["startup-script"] and "readonly slice_hosts=2" in metadata["startup-script"]
    a2 = gce.slice(create(), job(GpuMachine("a2-highgpu-8g", "nvidia-tesla-a100", 8, vms=3)))
    assert (a2.vms, a2.placement) == (3, False) and "resourcePolicies" not in body(slices.instance_group_manager(a2))
    with pytest.raises(PermanentError, match="one instance, not a multi-host slice"):
        gce.slice(create(), job(replace(a3, vms=1)))
    with pytest.raises(PermanentError, match="multi-host slice, not one instance"):
        gce.instance(create(), job(a3))


def test_a_single_host_machine_is_not_a_slice(gce: GcpComputeProvider) -> None:
    with pytest.raises(PermanentError, match="one instance, not a multi-host slice"):
        gce.slice(create(), job(tpu("v6e-8")))


# ------------------------------------------------------------------------------------------------ slice states


def mig(
    target: int = 4, topology: str | None = "ACTIVE", bulk: tuple[tuple[str, str], ...] = ()
) -> compute_v1.InstanceGroupManager:
    status = compute_v1.InstanceGroupManagerStatus()
    if topology is not None:
        status.applied_accelerator_topologies = [
            compute_v1.InstanceGroupManagerStatusAcceleratorTopology(accelerator_topology="4x4", state=topology)
        ]
    if bulk:
        errors = [compute_v1.Errors(code=c, message=m) for c, m in bulk]
        status.bulk_instance_operation = compute_v1.InstanceGroupManagerStatusBulkInstanceOperation(
            in_progress=True,
            last_progress_check=compute_v1.InstanceGroupManagerStatusBulkInstanceOperationLastProgressCheck(
                error=compute_v1.Error(errors=errors)
            ),
        )
    return compute_v1.InstanceGroupManager(name="llm-a1", target_size=target, status=status)


def vms(*statuses: str | None, action: str = "NONE") -> list[compute_v1.ManagedInstance]:
    """One managed instance per status; None: not created yet (no instance)."""
    return [
        compute_v1.ManagedInstance(name=f"llm-a1-w-000{i}", instance_status=s, current_action=action)
        if s
        else compute_v1.ManagedInstance(current_action="CREATING")
        for i, s in enumerate(statuses)
    ]


def no_capacity(n: int) -> list[compute_v1.ManagedInstance]:
    """Managed instances an INDIVIDUAL MIG could not create: each says why in its last attempt."""
    errors = [compute_v1.Errors(code="ZONE_RESOURCE_POOL_EXHAUSTED", message="no room")]
    attempt = compute_v1.ManagedInstanceLastAttempt(errors=compute_v1.ManagedInstanceLastAttemptErrors(errors=errors))
    return [compute_v1.ManagedInstance(current_action="CREATING", last_attempt=attempt)] * n


RUN = ("RUNNING",) * 4
STOCKOUT = (("ZONE_RESOURCE_POOL_EXHAUSTED", "The zone does not have enough resources"),)


@pytest.mark.parametrize(
    ("name", "group", "instances", "state"),
    [
        ("all running, topology active", mig(), vms(*RUN), MachineState.READY),
        ("running, topology still forming", mig(topology="INCOMPLETE"), vms(*RUN), MachineState.CREATING),
        ("running, topology activating", mig(topology="ACTIVATING"), vms(*RUN), MachineState.CREATING),
        ("no topology reported yet", mig(topology=None), vms(*RUN), MachineState.CREATING),
        (
            "vms provisioning",
            mig(topology="INCOMPLETE"),
            vms("PROVISIONING", "STAGING", "RUNNING", "STAGING"),
            MachineState.CREATING,
        ),
        ("no vm created yet", mig(topology=None), vms(None, None, None, None), MachineState.CREATING),
        ("fewer vms than target, none running", mig(topology=None), vms(), MachineState.CREATING),
        (
            "one vm preempted",
            mig(topology="DEACTIVATING"),
            vms("RUNNING", "TERMINATED", "RUNNING", "RUNNING"),
            MachineState.PREEMPTED,
        ),
        (
            "one vm stopping, topology still active",
            mig(),
            vms("RUNNING", "RUNNING", "STOPPING", "RUNNING"),
            MachineState.PREEMPTED,
        ),
        ("one vm suspended", mig(topology="INCOMPLETE"), vms("SUSPENDED", *RUN[:3]), MachineState.PREEMPTED),
        ("topology deactivating", mig(topology="DEACTIVATING"), vms(*RUN), MachineState.PREEMPTED),
        # "active but operating in degraded mode": not still creating, a slice that no longer runs whole
        ("topology degraded", mig(topology="ACTIVE_DEGRADED"), vms(*RUN), MachineState.PREEMPTED),
        ("one vm missing", mig(topology="INCOMPLETE"), vms(*RUN[:3]), MachineState.PREEMPTED),
        (
            "one vm deleted, still listed without an instance",
            mig(topology="INCOMPLETE"),
            vms(*RUN[:3], None),
            MachineState.PREEMPTED,
        ),
        ("one vm recreated", mig(topology="INCOMPLETE"), vms(*RUN, action="RECREATING"), MachineState.PREEMPTED),
        ("topology failed after running", mig(topology="FAILED"), vms(*RUN), MachineState.PREEMPTED),
        ("topology failed before running", mig(topology="FAILED"), vms(*("STAGING",) * 4), MachineState.FAILED),
        (
            "the mig is being deleted",
            mig(topology="DEACTIVATING"),
            vms(*("STOPPING",) * 4, action="DELETING"),
            MachineState.DELETING,
        ),
        (
            "bulk creation found no capacity",
            mig(topology=None, bulk=STOCKOUT),
            vms(None, None, None, None),
            MachineState.FAILED,
        ),
        (
            "an individual mig found capacity for some vms only",
            mig(topology="INCOMPLETE"),
            [*vms(*RUN[:2]), *no_capacity(2)],
            MachineState.FAILED,
        ),
    ],
)
def test_slice_state(
    name: str,
    group: compute_v1.InstanceGroupManager,
    instances: list[compute_v1.ManagedInstance],
    state: MachineState,
) -> None:
    assert slice_state(group, instances).state is state, name


def test_a_gpu_slice_has_no_topology_to_wait_for() -> None:
    """GPU VMs have no accelerator topology: all VMs running is READY; a TPU slice waits for its topology."""
    group = mig(target=2, topology=None)
    assert slice_state(group, vms("RUNNING", "RUNNING"), topology=False).state is MachineState.READY
    assert slice_state(group, vms("RUNNING", "RUNNING")).state is MachineState.CREATING
    assert slice_state(group, vms("RUNNING", "TERMINATED"), topology=False).state is MachineState.PREEMPTED
    assert slice_state(group, vms("RUNNING", "STAGING"), topology=False).state is MachineState.CREATING


def test_a_flex_start_slice_waits_queued_where_a_spot_one_failed() -> None:
    """The BULK creation's wait for capacity is flex-start's queue, not a failure."""
    waiting = mig(topology=None, bulk=STOCKOUT)
    assert slice_state(waiting, vms(None, None, None, None), flex=True).state is MachineState.QUEUED
    assert slice_state(waiting, vms(None, None, None, None), flex=False).state is MachineState.FAILED
    starting = slice_state(mig(topology="INCOMPLETE"), vms(*("STAGING",) * 4), flex=True)
    assert starting.state is MachineState.CREATING
    assert slice_state(mig(), vms(*RUN), flex=True).state is MachineState.READY


UNOFFERED = (
    (
        "INVALID_FIELD_VALUE",
        "Invalid value for field 'resource.machineType': 'zones/us-east5-a/machineTypes/ct6e-standard-4t'. "
        "Machine type with name 'ct6e-standard-4t' does not exist in zone 'us-east5-a'.",
    ),
)


def test_a_flex_start_slice_whose_zone_does_not_offer_its_type_fails_rather_than_wait_in_the_queue() -> None:
    """A type the zone does not offer never comes with capacity: the MIG's report of it is no queue's wait."""
    unoffered = slice_state(mig(topology=None, bulk=UNOFFERED), vms(None, None, None, None), flex=True)
    assert unoffered.state is MachineState.FAILED and unoffered.errors == UNOFFERED
    assert type(classify(api_error(list(unoffered.errors)), "create slice", in_operation=True)) is UnofferedError
    quota = (("QUOTA_EXCEEDED", "Quota 'TPU_V6E' exceeded. Limit: 0.0"),)
    for waits in (STOCKOUT, quota, (("INTERNAL_ERROR", "Internal error"),)):
        assert slice_state(mig(topology=None, bulk=waits), vms(None, None), flex=True).state is MachineState.QUEUED


def test_a_failed_slice_says_why_in_the_apis_words() -> None:
    stockout = slice_state(mig(topology=None, bulk=STOCKOUT), vms(None, None))
    assert stockout == Observed(
        MachineState.FAILED, "ZONE_RESOURCE_POOL_EXHAUSTED: The zone does not have enough resources", STOCKOUT
    )
    once = slice_state(mig(topology=None), no_capacity(4))
    assert once.detail == "ZONE_RESOURCE_POOL_EXHAUSTED: no room"  # every VM's error, said once


@pytest.mark.parametrize(
    ("errors", "kind"),
    [
        (STOCKOUT, CapacityError),
        ((("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "no TPUs"),), CapacityError),
        ((("QUOTA_EXCEEDED", "Quota 'TPU_V6E' exceeded. Limit: 0.0"),), QuotaError),
        # a VM of the MIG whose type the zone does not offer (its lastAttempt, or the bulk creation's last check)
        (UNOFFERED, UnofferedError),
        ((("INTERNAL_ERROR", "Internal error"),), TransientError),
    ],
)
def test_errors_a_mig_reports_are_classified_as_operation_errors(
    errors: tuple[tuple[str, str], ...], kind: type
) -> None:
    error = classify(api_error(list(errors)), "create TPU slice llm-a1", in_operation=True)
    assert type(error) is kind and errors[0][1] in str(error)


def test_a_template_still_used_by_a_mig_being_deleted_is_transient() -> None:
    message = (
        "The instance_template resource 'projects/p/global/instanceTemplates/llm-a1' is already being used by "
        "'projects/p/zones/us-central1-a/instanceGroupManagers/llm-a1'"
    )
    error = classify(api_error([("resourceInUseByAnotherResource", message)], 400), "delete instance template")
    assert type(error) is TransientError


@pytest.mark.parametrize(
    ("name", "labels", "machine"),
    [
        ("llm-a1", {"respawn-job": "llm", "respawn-attempt": "1"}, True),
        ("llm-a1-w-a123", {"respawn-job": "llm", "respawn-attempt": "1"}, False),  # a VM of slice llm-a1
        ("llm-a1-w-x7k2", {"respawn-job": "llm", "respawn-attempt": "1"}, False),
        ("llm-a1", {"respawn-job": "llm"}, False),
    ],
)
def test_a_slice_vm_is_not_listed_as_a_machine(name: str, labels: dict[str, str], machine: bool) -> None:
    assert _machine_instance(compute_v1.Instance(name=name, labels=labels)) is machine


@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: s.machine_type)
def test_a_gpu_vm_boots_from_the_disk_type_its_machine_series_supports(
    gce: GcpComputeProvider, shape: GpuShape
) -> None:
    """Every row of respawn.gpus: its machine type, its GPUs and the boot disk its series supports."""
    r = body(gce.instance(create(), job(GpuMachine(shape.machine_type, shape.accelerator_type, shape.gpus))))
    assert r["disks"][0]["initializeParams"]["diskType"] == f"zones/{ZONE}/diskTypes/{shape.boot_disk}"
    assert r["machineType"] == f"zones/{ZONE}/machineTypes/{shape.machine_type}"
    (gpus,) = r["guestAccelerators"]
    assert gpus == {"acceleratorType": f"zones/{ZONE}/acceleratorTypes/{shape.accelerator_type}",
                    "acceleratorCount": shape.gpus}  # fmt: skip
    assert {s.boot_disk for s in GPU_SHAPES if s.series in ("A4", "A3 Ultra")} == {"hyperdisk-balanced"}


def test_a_gpu_machine_type_outside_the_table_boots_from_balanced_persistent_disk(gce: GcpComputeProvider) -> None:
    r = body(gce.instance(create(), job(GpuMachine("n1-standard-8", "nvidia-tesla-t4", 1))))
    assert r["disks"][0]["initializeParams"]["diskType"] == f"zones/{ZONE}/diskTypes/pd-balanced"
    r = body(gce.instance(create(), job(GpuMachine("a3-ultragpu-8g-nolssd", "nvidia-h200-141gb", 8))))
    assert r["disks"][0]["initializeParams"]["diskType"] == f"zones/{ZONE}/diskTypes/hyperdisk-balanced"


def test_the_zones_mtbi_goes_to_the_machine_and_the_trainer_of_an_instance_and_of_a_slice(
    gce: GcpComputeProvider,
) -> None:
    placed = replace(create(), mtbi_s=5400.4)

    def metadata(properties: dict[str, Any]) -> dict[str, str]:
        return {i["key"]: i["value"] for i in properties["metadata"]["items"]}

    for properties in (
        body(gce.instance(placed, job(tpu("v6e-8")))),
        body(slices.instance_template(gce.slice(placed, job(tpu("v6e-16")))))["properties"],
    ):
        items = metadata(properties)
        assert items["respawn-mtbi-s"] == "5400" and "-e RESPAWN_MTBI_S=5400 " in items["startup-script"]
    items = metadata(body(gce.instance(create(), job(tpu("v6e-8")))))
    assert "respawn-mtbi-s" not in items and "RESPAWN_MTBI_S" not in items["startup-script"]  # no outlook


# ------------------------------------------------------------------------------------------------ the network

NETWORK_ENV = {
    "RESPAWN_NETWORK": "projects/host/global/networks/team-vpc",
    "RESPAWN_SUBNETWORK": "ml-subnet",
    "RESPAWN_EXTERNAL_IP": "false",
    "RESPAWN_TPU_ENDPOINT": "http://127.0.0.1:9",  # never called
    "RESPAWN_COMPUTE_ENDPOINT": "http://127.0.0.1:9",
}


def test_every_create_names_the_deployments_network_and_subnetwork_without_an_external_ip() -> None:
    """RESPAWN_NETWORK, RESPAWN_SUBNETWORK and RESPAWN_EXTERNAL_IP (Terraform's network.tf), read as the functions
    read them: an instance and a slice's template name that network, the subnetwork in the zone's region (in the
    network's project, a Shared VPC's host), and no access config."""
    settings = Settings.from_env({"RESPAWN_PROJECT": "proj", **NETWORK_ENV})
    deferred = machine_providers(settings)["compute"]
    assert isinstance(deferred, FirstUse)  # built at its first call
    provider = deferred.provider
    assert isinstance(provider, GcpComputeProvider)
    expected = [
        {
            "network": "projects/host/global/networks/team-vpc",
            "subnetwork": "projects/host/regions/us-central1/subnetworks/ml-subnet",
        }
    ]
    gpu = job(GpuMachine("g2-standard-8", "nvidia-l4", 1))
    assert body(provider.instance(create(), gpu))["networkInterfaces"] == expected
    assert body(provider.instance(create(), job(tpu("v6e-8"))))["networkInterfaces"] == expected
    template = body(slices.instance_template(provider.slice(create(), job(tpu("v6e-16")))))
    assert template["properties"]["networkInterfaces"] == expected


def test_unset_the_network_is_the_projects_default_with_an_external_ip(gce: GcpComputeProvider) -> None:
    expected = [
        {
            "network": "global/networks/default",
            "accessConfigs": [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}],
        }
    ]
    assert body(gce.instance(create(), job(tpu("v6e-8"))))["networkInterfaces"] == expected
    template = body(slices.instance_template(gce.slice(create(), job(tpu("v6e-16")))))
    assert template["properties"]["networkInterfaces"] == expected


def test_a_provider_is_built_and_its_client_imported_at_its_first_call_only() -> None:
    """A function instance whose jobs use the Cloud TPU API never imports Compute Engine's client (about 1.1 s of CPU
    at a cold start), and the other way round; in a fresh interpreter, as a cold start is."""
    program = f"""
import sys
from respawn.bootstrap import machine_providers
from respawn.deployment import Settings
providers = machine_providers(Settings.from_env({{"RESPAWN_PROJECT": "proj", **{NETWORK_ENV!r}}}))
before = "google.cloud.compute_v1" in sys.modules, "google.cloud.tpu_v2" in sys.modules
providers["tpu"].provider
middle = "google.cloud.compute_v1" in sys.modules, "google.cloud.tpu_v2" in sys.modules
assert providers["compute"].provider is providers["compute"].provider  # built once
after = "google.cloud.compute_v1" in sys.modules
print(before, middle, after)
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["(False,", "False)", "(False,", "True)", "True"], done.stderr[-2000:]
