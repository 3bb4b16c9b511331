"""GcpTpuProvider and GcpComputeProvider: the real client libraries (transport="rest") against CloudApiServer."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from localcloud.apis.cloudapi import CloudApiServer
from respawn.actions import CreateMachine
from respawn.adapters.compute import DLVM_IMAGE, GcpComputeProvider
from respawn.adapters.settings import ProviderSettings
from respawn.adapters.tpu import GcpTpuProvider
from respawn.jobs import GpuMachine, JobSpec, MachineState, Tier, TpuMachine
from respawn.ports import CapacityError, PermanentError, QuotaError, TransientError

pytestmark = pytest.mark.waits

ZONE = "us-central1-a"
PROJECT = "proj"


def tpu_spec(job_id: str = "llm-1", provisioning: str = "spot", **kw: object) -> JobSpec:
    return JobSpec(
        job_id=job_id,
        machine=TpuMachine("v5litepod-8", "v2-alpha-tpuv5-lite", request="node"),
        zones=(ZONE, "us-west4-a"),
        image="us-docker.pkg.dev/proj/repo/trainer:1",
        checkpoint_uri=f"gs://ckpt/{job_id}",
        provisioning=provisioning,
        args=("--steps=100",),
        env=(("KEY", "value"),),
        labels=(("team", "nlp"),),
        **kw,  # type: ignore[arg-type]
    )


def gpu_spec(job_id: str = "gpu-1", provisioning: str = "spot") -> JobSpec:
    spec = tpu_spec(job_id, provisioning, ttl_s=7200)
    return JobSpec(**{**spec.__dict__, "machine": GpuMachine("g2-standard-8", "nvidia-l4", 1)})


def create(spec: JobSpec, attempt: int = 1, zone: str = ZONE, deadline: float | None = None) -> CreateMachine:
    return CreateMachine(spec.job_id, attempt, f"{spec.job_id}-a{attempt}", zone, deadline)


@pytest.fixture
def server() -> Iterator[CloudApiServer]:
    with CloudApiServer(create_delay_s=0.05) as s:
        yield s


@pytest.fixture
def tpu(server: CloudApiServer) -> GcpTpuProvider:
    return GcpTpuProvider(
        PROJECT,
        endpoint=server.url,
        settings=ProviderSettings(service_account="m@proj.iam.gserviceaccount.com", create_wait_s=10, read_retry_s=0),
    )


@pytest.fixture
def gce(server: CloudApiServer) -> GcpComputeProvider:
    return GcpComputeProvider(
        PROJECT,
        endpoint=server.url,
        clock=lambda: 1000.0,
        settings=ProviderSettings(service_account="m@proj.iam.gserviceaccount.com", create_wait_s=10, read_retry_s=0),
    )


# ---------------------------------------------------------------------------------------------------------- TPU


def test_tpu_create_get_list_delete(server: CloudApiServer, tpu: GcpTpuProvider) -> None:
    spec = tpu_spec()
    tpu.create(create(spec), spec)

    m = tpu.get("llm-1-a1", ZONE, spec)
    assert m is not None and m.state is MachineState.READY  # create waited for the operation
    assert m.labels == {"team": "nlp", "respawn-managed": "true", "respawn-job": "llm-1", "respawn-attempt": "1"}
    node = server.machine("llm-1-a1")
    assert node is not None and node.kind == "tpu" and node.project == PROJECT and node.zone == ZONE
    assert node.resource["acceleratorType"] == "v5litepod-8"
    assert node.resource["runtimeVersion"] == "v2-alpha-tpuv5-lite"
    assert node.resource["schedulingConfig"] == {"spot": True}
    assert node.resource["networkConfig"] == {"enableExternalIps": True}
    assert node.resource["serviceAccount"]["email"] == "m@proj.iam.gserviceaccount.com"
    assert node.metadata["startup-script"].startswith("#!/bin/bash")
    assert node.metadata["respawn-job-id"] == "llm-1" and node.metadata["respawn-attempt"] == "1"
    assert json.loads(node.metadata["respawn-args"]) == ["--steps=100"]
    assert json.loads(node.metadata["respawn-env"]) == {"KEY": "value"}

    other = tpu_spec("other")
    tpu.create(create(other), other)
    assert {m.name for m in tpu.list(ZONE)} == {"llm-1-a1", "other-a1"}
    assert [m.name for m in tpu.list(ZONE, "llm-1")] == ["llm-1-a1"]
    assert tpu.list("us-west4-a") == []

    tpu.delete("llm-1-a1", ZONE, spec)
    assert tpu.get("llm-1-a1", ZONE, spec) is None
    verbs = [c.verb for c in server.calls if c.name == "llm-1-a1"]
    assert [v for v in verbs if v != "operation"] == ["create", "get", "delete", "get"] and "operation" in verbs
    assert f"POST /v2/projects/{PROJECT}/locations/{ZONE}/nodes" in server.requests
    assert f"GET /v2/projects/{PROJECT}/locations/{ZONE}/operations/operation-1" in server.requests


@pytest.mark.parametrize(
    ("provisioning", "expected"), [("spot", {"spot": True}), ("preemptible", {"preemptible": True}), ("standard", None)]
)
def test_tpu_scheduling(server: CloudApiServer, tpu: GcpTpuProvider, provisioning: str, expected: object) -> None:
    spec = tpu_spec(provisioning=provisioning)
    tpu.create(create(spec), spec)
    node = server.machine("llm-1-a1")
    assert node is not None and node.resource.get("schedulingConfig") == expected


def test_tpu_unmanaged_nodes_are_not_listed(server: CloudApiServer, tpu: GcpTpuProvider) -> None:
    spec = tpu_spec()
    tpu.create(create(spec), spec)
    tpu.client.create_node(
        parent=f"projects/{PROJECT}/locations/{ZONE}",
        node_id="someone-else",
        node={"accelerator_type": "v5litepod-8", "labels": {"respawn-job": "llm-1"}},
    )
    assert [m.name for m in tpu.list(ZONE, "llm-1")] == ["llm-1-a1"]


def test_tpu_already_exists_and_not_found_are_success(server: CloudApiServer, tpu: GcpTpuProvider) -> None:
    spec = tpu_spec()
    tpu.create(create(spec), spec)
    tpu.create(create(spec), spec)
    assert len(server.machines()) == 1
    tpu.delete("llm-1-a1", ZONE)
    tpu.delete("llm-1-a1", ZONE)
    tpu.delete("never-a1", "us-west4-a")
    assert server.machines() == []


@pytest.mark.parametrize(
    ("server_state", "state"),
    [
        ("CREATING", MachineState.CREATING),
        ("READY", MachineState.READY),
        ("PREEMPTED", MachineState.PREEMPTED),
        ("TERMINATED", MachineState.TERMINATED),
        ("STOPPED", MachineState.TERMINATED),
        ("DELETING", MachineState.DELETING),
        ("REPAIRING", MachineState.READY),
    ],
)
def test_tpu_states(server: CloudApiServer, tpu: GcpTpuProvider, server_state: str, state: MachineState) -> None:
    spec = tpu_spec()
    tpu.create(create(spec), spec)
    server.set_state("llm-1-a1", server_state)
    m = tpu.get("llm-1-a1", ZONE)
    assert m is not None and m.state is state


def test_tpu_preempted_node(server: CloudApiServer, tpu: GcpTpuProvider) -> None:
    spec = tpu_spec()
    tpu.create(create(spec), spec)
    assert server.preempt("llm-1-a1") is not None
    assert [m.state for m in tpu.list(ZONE, "llm-1")] == [MachineState.PREEMPTED]
    assert server.preempt("gone") is None


def test_tpu_create_returns_while_still_creating(server: CloudApiServer) -> None:
    server.create_delay_s = 30
    provider = GcpTpuProvider(PROJECT, endpoint=server.url, settings=ProviderSettings(create_wait_s=0.3))
    spec = tpu_spec()
    provider.create(create(spec), spec)
    m = provider.get("llm-1-a1", ZONE)
    assert m is not None and m.state is MachineState.CREATING


def test_tpu_stockout_is_a_capacity_error(server: CloudApiServer, tpu: GcpTpuProvider) -> None:
    server.stockouts[ZONE] = 1
    spec = tpu_spec()
    with pytest.raises(CapacityError) as e:
        tpu.create(create(spec), spec)
    assert type(e.value) is CapacityError and "no more capacity" in str(e.value)
    assert server.machines() == []
    tpu.create(create(spec, 2), spec)  # the stockout was for one create only
    assert [m.name for m in server.machines()] == ["llm-1-a2"]


def test_tpu_zone_capacity(server: CloudApiServer, tpu: GcpTpuProvider) -> None:
    server.capacity[ZONE] = 1
    spec = tpu_spec()
    tpu.create(create(spec), spec)
    server.preempt("llm-1-a1")  # a preempted node holds its capacity until deleted
    with pytest.raises(CapacityError):
        tpu.create(create(spec, 2), spec)
    tpu.delete("llm-1-a1", ZONE)
    tpu.create(create(spec, 3), spec)


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        # quota: a synchronous 429 whose message names the quota
        (
            dict(
                code=429,
                status="RESOURCE_EXHAUSTED",
                message="Quota limit 'TPUV5sLitepodPreemptiblePerProjectPerZoneForTPUAPI' has been exceeded. "
                "Limit: 0 in zone us-central1-a.",
            ),
            QuotaError,
        ),
        # a rate limit is also 429 RESOURCE_EXHAUSTED, but retrying helps
        (
            dict(
                code=429,
                status="RESOURCE_EXHAUSTED",
                message="Quota exceeded for quota metric 'Create requests' and limit 'Create requests per minute'",
            ),
            TransientError,
        ),
        (dict(code=429, status="RESOURCE_EXHAUSTED", message="Too many requests"), TransientError),
        (dict(code=503, status="UNAVAILABLE", message="The service is currently unavailable."), TransientError),
        (dict(code=500, status="INTERNAL", message="Internal error"), TransientError),
        (dict(code=403, status="PERMISSION_DENIED", message="Permission 'tpu.nodes.create' denied"), PermanentError),
        (dict(code=400, status="INVALID_ARGUMENT", message="Invalid accelerator type"), PermanentError),
        (dict(code=404, status="NOT_FOUND", message="Project 'proj' not found"), PermanentError),
        # inside the operation, code 8 is capacity
        (
            dict(code=429, status="RESOURCE_EXHAUSTED", message="Insufficient capacity.", in_operation=True),
            CapacityError,
        ),
        (
            dict(
                code=429, status="RESOURCE_EXHAUSTED", message="Quota limit 'X' has been exceeded.", in_operation=True
            ),
            QuotaError,
        ),
        (dict(code=500, status="INTERNAL", message="Internal error", in_operation=True), TransientError),
    ],
)
def test_tpu_create_errors(server: CloudApiServer, tpu: GcpTpuProvider, fault: dict, error: type) -> None:
    server.fail_next("create", **fault)
    spec = tpu_spec()
    with pytest.raises(error) as e:
        tpu.create(create(spec), spec)
    assert type(e.value) is error
    assert "llm-1-a1" in str(e.value) and fault["message"] in str(e.value)
    assert "http://" not in str(e.value)


def test_tpu_read_and_delete_errors(server: CloudApiServer, tpu: GcpTpuProvider) -> None:
    server.fail_next("get", code=503, status="UNAVAILABLE", message="unavailable")
    with pytest.raises(TransientError):
        tpu.get("x-a1", ZONE)
    server.fail_next("list", code=403, status="PERMISSION_DENIED", message="denied")
    with pytest.raises(PermanentError):
        tpu.list(ZONE)
    server.fail_next("delete", code=429, status="RESOURCE_EXHAUSTED", message="Too many requests")
    with pytest.raises(TransientError):
        tpu.delete("x-a1", ZONE)


def test_tpu_read_retry(server: CloudApiServer) -> None:
    provider = GcpTpuProvider(PROJECT, endpoint=server.url, settings=ProviderSettings(read_retry_s=5))
    server.fail_next("get", code=503, status="UNAVAILABLE", message="unavailable")
    assert provider.get("x-a1", ZONE, tpu_spec()) is None
    assert [c.verb for c in server.calls] == ["get", "get"]


def test_unreachable_endpoint_is_transient() -> None:
    provider = GcpTpuProvider(
        PROJECT, endpoint="http://127.0.0.1:9", settings=ProviderSettings(read_retry_s=0, request_timeout_s=2)
    )
    with pytest.raises(TransientError):
        provider.get("x-a1", ZONE)


def test_wrong_machine_kind_is_permanent(tpu: GcpTpuProvider, gce: GcpComputeProvider) -> None:
    with pytest.raises(PermanentError):
        tpu.create(create(gpu_spec()), gpu_spec())
    with pytest.raises(PermanentError):
        gce.create(create(tpu_spec()), tpu_spec())


# ---------------------------------------------------------------------------------------------------------- GCE


def test_gce_create_get_list_delete(server: CloudApiServer, gce: GcpComputeProvider) -> None:
    spec = gpu_spec()
    gce.create(create(spec, deadline=1000.0 + 3600), spec)

    m = gce.get("gpu-1-a1", ZONE)
    assert m is not None and m.state is MachineState.READY
    assert m.labels == {"team": "nlp", "respawn-managed": "true", "respawn-job": "gpu-1", "respawn-attempt": "1"}
    vm = server.machine("gpu-1-a1")
    assert vm is not None and vm.kind == "gpu"
    r = vm.resource
    assert r["machineType"] == f"zones/{ZONE}/machineTypes/g2-standard-8"
    assert r["guestAccelerators"] == [
        {"acceleratorType": f"zones/{ZONE}/acceleratorTypes/nvidia-l4", "acceleratorCount": 1}
    ]
    assert r["scheduling"] == {
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "DELETE",
        "maxRunDuration": {"seconds": "3600"},
        "automaticRestart": False,
        "onHostMaintenance": "TERMINATE",
    }
    assert r["disks"][0]["boot"] is True and r["disks"][0]["initializeParams"]["sourceImage"] == DLVM_IMAGE
    assert r["disks"][0]["initializeParams"]["diskSizeGb"] == "200"
    assert r["networkInterfaces"][0]["accessConfigs"][0]["type"] == "ONE_TO_ONE_NAT"
    assert r["serviceAccounts"] == [
        {"email": "m@proj.iam.gserviceaccount.com", "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}
    ]
    assert vm.metadata["install-nvidia-driver"] == "True"
    assert "--gpus all" in vm.metadata["startup-script"]
    assert vm.metadata["respawn-checkpoint-uri"] == "gs://ckpt/gpu-1"

    other = gpu_spec("other")
    gce.create(create(other), other)
    assert {m.name for m in gce.list(ZONE)} == {"gpu-1-a1", "other-a1"}
    assert [m.name for m in gce.list(ZONE, "gpu-1")] == ["gpu-1-a1"]

    gce.delete("gpu-1-a1", ZONE)
    assert gce.get("gpu-1-a1", ZONE) is None
    base = f"/compute/v1/projects/{PROJECT}/zones/{ZONE}"
    assert f"POST {base}/instances" in server.requests
    assert any(r.startswith(f"POST {base}/operations/") and r.endswith("/wait") for r in server.requests)
    assert f"GET {base}/instances" in server.requests and f"DELETE {base}/instances/gpu-1-a1" in server.requests


@pytest.mark.parametrize(
    ("provisioning", "expected"),
    [
        ("preemptible", {"preemptible": True, "automaticRestart": False, "onHostMaintenance": "TERMINATE"}),
        (
            "standard",
            {
                "provisioningModel": "STANDARD",
                "instanceTerminationAction": "DELETE",
                "maxRunDuration": {"seconds": "7200"},
                "automaticRestart": False,
                "onHostMaintenance": "TERMINATE",
            },
        ),
    ],
)
def test_gce_scheduling(server: CloudApiServer, gce: GcpComputeProvider, provisioning: str, expected: dict) -> None:
    spec = gpu_spec(provisioning=provisioning)
    gce.create(create(spec), spec)  # no deadline on the action: the whole TTL
    vm = server.machine("gpu-1-a1")
    assert vm is not None and vm.resource["scheduling"] == expected


def test_gce_run_duration_never_below_the_minimum(server: CloudApiServer, gce: GcpComputeProvider) -> None:
    spec = gpu_spec()
    gce.create(create(spec, deadline=1000.0 - 5), spec)
    vm = server.machine("gpu-1-a1")
    assert vm is not None and vm.resource["scheduling"]["maxRunDuration"] == {"seconds": "30"}


def test_gce_already_exists_and_not_found_are_success(server: CloudApiServer, gce: GcpComputeProvider) -> None:
    spec = gpu_spec()
    gce.create(create(spec), spec)
    gce.create(create(spec), spec)
    assert len(server.machines()) == 1
    gce.delete("gpu-1-a1", ZONE)
    gce.delete("gpu-1-a1", ZONE)
    assert server.machines() == []


@pytest.mark.parametrize(
    ("server_state", "state"),
    [
        ("PROVISIONING", MachineState.CREATING),
        ("STAGING", MachineState.CREATING),
        ("RUNNING", MachineState.READY),
        ("STOPPING", MachineState.TERMINATED),
        ("TERMINATED", MachineState.TERMINATED),
        ("SUSPENDED", MachineState.TERMINATED),
    ],
)
def test_gce_states(server: CloudApiServer, gce: GcpComputeProvider, server_state: str, state: MachineState) -> None:
    spec = gpu_spec()
    gce.create(create(spec), spec)
    server.set_state("gpu-1-a1", server_state)
    m = gce.get("gpu-1-a1", ZONE)
    assert m is not None and m.state is state


def test_gce_preempted_spot_vm_is_deleted_as_it_asked(server: CloudApiServer, gce: GcpComputeProvider) -> None:
    spec = gpu_spec()
    gce.create(create(spec), spec)
    assert server.machine("gpu-1-a1").resource["scheduling"]["instanceTerminationAction"] == "DELETE"  # type: ignore[union-attr]
    server.preempt("gpu-1-a1")
    assert gce.list(ZONE, "gpu-1") == [] and gce.get("gpu-1-a1", ZONE) is None


def test_gce_preempted_vm_that_asked_to_stop_is_terminated(server: CloudApiServer, gce: GcpComputeProvider) -> None:
    spec = gpu_spec()
    gce.create(create(spec), spec)
    with server.lock:  # the stored VM, as a STOP-on-preemption VM would have been created
        server._find("gpu-1-a1").resource["scheduling"]["instanceTerminationAction"] = "STOP"  # type: ignore[union-attr]
    server.preempt("gpu-1-a1")
    assert [m.state for m in gce.list(ZONE, "gpu-1")] == [MachineState.TERMINATED]


def test_gce_stockout_is_a_capacity_error(server: CloudApiServer, gce: GcpComputeProvider) -> None:
    server.stockouts[ZONE] = 1
    spec = gpu_spec()
    with pytest.raises(CapacityError) as e:
        gce.create(create(spec), spec)
    assert type(e.value) is CapacityError and "ZONE_RESOURCE_POOL_EXHAUSTED" in str(e.value)
    assert server.machines() == []


def test_gce_create_returns_while_still_creating(server: CloudApiServer) -> None:
    server.create_delay_s = 30
    provider = GcpComputeProvider(PROJECT, endpoint=server.url, settings=ProviderSettings(create_wait_s=0.3))
    spec = gpu_spec()
    t0 = time.monotonic()
    provider.create(create(spec), spec)
    assert time.monotonic() - t0 < 5
    m = provider.get("gpu-1-a1", ZONE)
    assert m is not None and m.state is MachineState.CREATING


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        (
            dict(
                code=403,
                status="PERMISSION_DENIED",
                reason="QUOTA_EXCEEDED",
                in_operation=True,
                message="Quota 'NVIDIA_L4_GPUS' exceeded.  Limit: 0.0 in region us-central1.",
            ),
            QuotaError,
        ),
        (
            dict(
                code=403,
                status="PERMISSION_DENIED",
                reason="quotaExceeded",
                message="Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally.",
            ),
            QuotaError,
        ),
        (
            dict(
                code=503,
                status="UNAVAILABLE",
                reason="ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
                in_operation=True,
                message="The zone 'projects/proj/zones/us-central1-a' does not have enough resources available to "
                "fulfill the request.  '(resource type:compute)'.",
            ),
            CapacityError,
        ),
        (
            dict(
                code=403,
                status="PERMISSION_DENIED",
                reason="forbidden",
                message="Required 'compute.instances.create' permission for 'projects/proj'",
            ),
            PermanentError,
        ),
        (
            dict(
                code=400,
                status="INVALID_ARGUMENT",
                reason="invalid",
                message="Invalid value for field 'resource.machineType'",
            ),
            PermanentError,
        ),
        (dict(code=503, status="UNAVAILABLE", reason="backendError", message="Backend Error"), TransientError),
        (
            dict(code=429, status="RESOURCE_EXHAUSTED", reason="rateLimitExceeded", message="Rate Limit Exceeded"),
            TransientError,
        ),
        (
            dict(
                code=400,
                status="INVALID_ARGUMENT",
                reason="resourceNotReady",
                message="The resource 'projects/proj/zones/us-central1-a/instances/gpu-1-a1' is not ready",
            ),
            TransientError,
        ),
        (
            dict(code=500, status="INTERNAL", reason="INTERNAL_ERROR", message="Internal error", in_operation=True),
            TransientError,
        ),
    ],
)
def test_gce_create_errors(server: CloudApiServer, gce: GcpComputeProvider, fault: dict, error: type) -> None:
    server.fail_next("create", **fault)
    spec = gpu_spec()
    with pytest.raises(error) as e:
        gce.create(create(spec), spec)
    assert type(e.value) is error and fault["message"] in str(e.value)


def test_gce_read_and_delete_errors(server: CloudApiServer, gce: GcpComputeProvider) -> None:
    server.fail_next("list", code=503, status="UNAVAILABLE", message="unavailable")
    with pytest.raises(TransientError):
        gce.list(ZONE)
    server.fail_next("get", code=403, status="PERMISSION_DENIED", message="denied")
    with pytest.raises(PermanentError):
        gce.get("x-a1", ZONE)
    server.fail_next(
        "delete",
        code=400,
        status="INVALID_ARGUMENT",
        reason="resourceNotReady",
        message="The resource 'projects/proj/zones/us-central1-a/instances/x-a1' is not ready",
    )
    with pytest.raises(TransientError):
        gce.delete("x-a1", ZONE)


def test_server_callbacks_and_call_log() -> None:
    ready: list[str] = []
    deleted: list[str] = []
    with CloudApiServer(
        create_delay_s=0.01, on_ready=lambda m: ready.append(m.name), on_deleted=lambda m: deleted.append(m.name)
    ) as server:
        tpu = GcpTpuProvider(PROJECT, endpoint=server.url, settings=ProviderSettings(create_wait_s=10))
        gce = GcpComputeProvider(PROJECT, endpoint=server.url, settings=ProviderSettings(create_wait_s=10))
        tpu.create(create(tpu_spec()), tpu_spec())
        gce.create(create(gpu_spec()), gpu_spec())
        tpu.delete("llm-1-a1", ZONE, tpu_spec())
        gce.delete("gpu-1-a1", ZONE, gpu_spec())  # with no spec it would look for a slice of that name too
        deadline = time.monotonic() + 5
        while len(deleted) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        verbs = [(c.verb, c.kind, c.name, c.zone) for c in server.calls if c.verb in ("create", "delete")]
    assert ready == ["llm-1-a1", "gpu-1-a1"] and deleted == ["llm-1-a1", "gpu-1-a1"]
    assert verbs == [
        ("create", "tpu", "llm-1-a1", ZONE),
        ("create", "gpu", "gpu-1-a1", ZONE),
        ("delete", "tpu", "llm-1-a1", ZONE),
        ("delete", "gpu", "gpu-1-a1", ZONE),
    ]


# ---------------------------------------------------------------------------------------------------------- queued


def queued_spec(job_id: str = "llm-1", provisioning: str = "spot", **kw: object) -> JobSpec:
    spec = tpu_spec(job_id, provisioning, **kw)
    return JobSpec(**{**spec.__dict__, "machine": TpuMachine("v5litepod-8", "v2-alpha-tpuv5-lite", request="queued")})


def wait_state(tpu: GcpTpuProvider, name: str, spec: JobSpec, state: MachineState) -> None:
    deadline = time.monotonic() + 5
    while (m := tpu.get(name, ZONE, spec)) is None or m.state is not state:
        assert time.monotonic() < deadline, f"{name} is {m}, not {state}"
        time.sleep(0.02)


def test_queued_resource_create_active_list_and_force_delete(server: CloudApiServer, tpu: GcpTpuProvider) -> None:
    spec = queued_spec()
    tpu.create(create(spec, deadline=2_000_000_000.0), spec)
    tpu.create(create(spec, deadline=2_000_000_000.0), spec)  # a redelivered create: 409, already there
    assert [c.verb for c in server.calls if c.verb == "create"] == ["create", "create"]
    assert len(server.queued_resources()) == 1
    wait_state(tpu, "llm-1-a1", spec, MachineState.READY)
    qr = server.queued_resources()[0]
    assert qr.state == "ACTIVE" and qr.body["spot"] == {} and "guaranteed" not in qr.body
    assert qr.body["queueingPolicy"] == {"validUntilTime": "2033-05-18T03:33:20Z"}  # the job's TTL deadline
    node_spec = qr.body["tpu"]["nodeSpec"][0]
    assert node_spec["parent"] == f"projects/{PROJECT}/locations/{ZONE}" and node_spec["nodeId"] == "llm-1-a1"
    assert "schedulingConfig" not in node_spec["node"]  # the queued resource carries the provisioning model
    node = server.machine("llm-1-a1")
    assert node is not None and node.resource["queuedResource"].endswith("/queuedResources/llm-1-a1")
    assert node.metadata["respawn-job-id"] == "llm-1"
    listed = tpu.list(ZONE)
    assert [(m.name, m.state) for m in listed] == [("llm-1-a1", MachineState.READY)]  # one machine, not two
    assert tpu.get("llm-1-a1", ZONE) is not None  # found without the spec too

    tpu.delete("llm-1-a1", ZONE, spec)
    assert server.queued_resources() == [] and server.machine("llm-1-a1") is None  # force took the node too
    assert tpu.get("llm-1-a1", ZONE, spec) is None
    tpu.delete("llm-1-a1", ZONE, spec)  # NotFound is success
    assert f"DELETE /v2/projects/{PROJECT}/locations/{ZONE}/queuedResources/llm-1-a1" in server.requests


def test_a_queued_resource_waits_for_resources_then_becomes_active() -> None:
    with CloudApiServer(create_delay_s=0.05, queue_waits={ZONE: 0.5}) as server:
        tpu = GcpTpuProvider(PROJECT, endpoint=server.url, settings=ProviderSettings(create_wait_s=10, read_retry_s=0))
        spec = queued_spec()
        tpu.create(create(spec), spec)
        m = tpu.get("llm-1-a1", ZONE, spec)
        assert m is not None and m.state is MachineState.QUEUED and server.machine("llm-1-a1") is None
        wait_state(tpu, "llm-1-a1", spec, MachineState.READY)
        assert server.queued_resources()[0].state == "ACTIVE"


def test_a_queued_resource_waits_forever_in_a_stocked_out_zone_until_deleted() -> None:
    with CloudApiServer(create_delay_s=0.05, queue_waits={ZONE: None}) as server:
        tpu = GcpTpuProvider(PROJECT, endpoint=server.url, settings=ProviderSettings(create_wait_s=10, read_retry_s=0))
        spec = queued_spec()
        tpu.create(create(spec), spec)  # capacity is not an error for a queued request
        time.sleep(0.2)
        assert [(m.name, m.state) for m in tpu.list(ZONE, "llm-1")] == [("llm-1-a1", MachineState.QUEUED)]
        tpu.delete("llm-1-a1", ZONE, spec)
        assert server.queued_resources() == []


def test_a_preempted_queued_resource_is_suspended(server: CloudApiServer, tpu: GcpTpuProvider) -> None:
    spec = queued_spec()
    tpu.create(create(spec), spec)
    wait_state(tpu, "llm-1-a1", spec, MachineState.READY)
    server.preempt("llm-1-a1")
    assert server.queued_resources()[0].state == "SUSPENDED"
    m = tpu.get("llm-1-a1", ZONE, spec)
    assert m is not None and m.state is MachineState.PREEMPTED


def test_a_failed_queued_resource_says_why(server: CloudApiServer, tpu: GcpTpuProvider) -> None:
    server.fail_next(
        "create", code=400, status="INVALID_ARGUMENT", message="Invalid runtime version", in_operation=True
    )
    spec = queued_spec()
    tpu.create(create(spec), spec)
    m = tpu.get("llm-1-a1", ZONE, spec)
    assert m is not None and m.state is MachineState.FAILED and m.detail == "Invalid runtime version"
    assert [(x.name, x.detail) for x in tpu.list(ZONE)] == [("llm-1-a1", "Invalid runtime version")]


@pytest.mark.parametrize(
    ("provisioning", "reservation", "expected"),
    [
        ("standard", None, {"guaranteed": {}}),
        ("reservation", "tpu-res-1", {}),  # gcloud's GA --reserved: reservationName only, no tier
    ],
)
def test_queued_tiers(
    server: CloudApiServer, tpu: GcpTpuProvider, provisioning: str, reservation: str | None, expected: dict[str, Any]
) -> None:
    tiers = (Tier("spot", (ZONE,), after_preemptions=1), Tier(provisioning, (ZONE,), reservation))
    spec = queued_spec(tiers=tiers)
    action = CreateMachine(spec.job_id, 1, "llm-1-a1", ZONE, None, tier=1)
    tpu.create(action, spec)
    body = server.queued_resources()[0].body
    assert {k: body[k] for k in ("spot", "guaranteed") if k in body} == expected
    if reservation:
        assert body["reservationName"] == f"projects/{PROJECT}/locations/{ZONE}/reservations/-"  # any of them


def test_a_node_tier_asks_for_the_tiers_provisioning(server: CloudApiServer, tpu: GcpTpuProvider) -> None:
    spec = tpu_spec(tiers=(Tier("spot", (ZONE,), after_preemptions=1), Tier("reservation", (ZONE,), "r-1")))
    tpu.create(CreateMachine(spec.job_id, 1, "llm-1-a1", ZONE, None, tier=1), spec)
    node = server.machine("llm-1-a1")
    assert node is not None and node.resource["schedulingConfig"] == {"reserved": True}


def test_a_gpu_reservation_tier_consumes_that_reservation(server: CloudApiServer, gce: GcpComputeProvider) -> None:
    base = gpu_spec()
    spec = JobSpec(
        **{
            **base.__dict__,
            "tiers": (Tier("spot", (ZONE,), after_preemptions=1), Tier("reservation", (ZONE,), "gpu-res")),
        }
    )
    gce.create(CreateMachine(spec.job_id, 1, "gpu-1-a1", ZONE, None, tier=1), spec)
    vm = server.machine("gpu-1-a1")
    assert vm is not None and vm.resource["scheduling"]["provisioningModel"] == "STANDARD"
    assert vm.resource["reservationAffinity"] == {
        "consumeReservationType": "SPECIFIC_RESERVATION",
        "key": "compute.googleapis.com/reservation-name",
        "values": ["gpu-res"],
    }


# ---------------------------------------------------------------------------------------------------------- network


def test_the_local_apis_take_every_create_on_the_deployments_network(server: CloudApiServer) -> None:
    """With a network, a subnetwork and no external IPs (RESPAWN_NETWORK, RESPAWN_SUBNETWORK, RESPAWN_EXTERNAL_IP),
    the Cloud TPU API's node and queued resource and Compute Engine's instance carry them to the API."""
    network, subnetwork = "projects/host/global/networks/team-vpc", "projects/host/regions/us-central1/subnetworks/ml"
    settings = ProviderSettings(network=network, subnetwork="ml", external_ips=False, create_wait_s=10)
    tpu = GcpTpuProvider(PROJECT, endpoint=server.url, settings=settings)
    gce = GcpComputeProvider(PROJECT, endpoint=server.url, clock=lambda: 1000.0, settings=settings)
    node_spec, queued, gpu = tpu_spec(), queued_spec("llm-2"), gpu_spec()
    tpu.create(create(node_spec), node_spec)
    tpu.create(create(queued), queued)
    gce.create(create(gpu), gpu)

    expected = {"network": network, "subnetwork": subnetwork}
    node = server.machine("llm-1-a1")
    assert node is not None and node.resource["networkConfig"] == expected
    assert server.queued_resources()[0].body["tpu"]["nodeSpec"][0]["node"]["networkConfig"] == expected
    vm = server.machine("gpu-1-a1")
    assert vm is not None and vm.resource["networkInterfaces"] == [expected]  # no accessConfigs: no external IP
