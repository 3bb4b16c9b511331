"""GcpComputeProvider for TPUs, through the real google-cloud-compute client (transport="rest") against the local
Compute API: single-host TPU VMs, multi-host slices (workload policy + instance template + MIG), flex-start.

The acceptance of issue 20 for the provider: duplicate creates, a crash after each create call of a slice, the
delete order, the topology state machine as get() sees it, a stockout -> CapacityError, flex-start QUEUED -> READY.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from localcloud.apis.cloudapi import CloudApiServer
from respawn.actions import CreateMachine
from respawn.adapters import compute_slices as slices
from respawn.adapters.compute import GcpComputeProvider
from respawn.adapters.settings import ProviderSettings
from respawn.jobs import JobSpec, MachineState, Tier, TpuMachine
from respawn.ports import CapacityError, Machine, TransientError

ZONE = "us-east5-a"  # offers v6e (localcloud/apis/offerings.py)
REGION = "us-east5"
PROJECT = "proj"
SLICE = ("resourcePolicies", "instanceTemplates", "instanceGroupManagers")


def spec(accelerator_type: str = "v6e-16", provisioning: str = "spot", job_id: str = "llm", **kw: object) -> JobSpec:
    return JobSpec(
        job_id=job_id,
        machine=TpuMachine(accelerator_type, api="compute"),
        zones=(ZONE,),
        image="us-docker.pkg.dev/proj/repo/trainer:1",
        checkpoint_uri=f"gs://ckpt/{job_id}",
        provisioning=provisioning,
        labels=(("team", "nlp"),),
        ttl_s=7200,
        **kw,  # type: ignore[arg-type]
    )


def create(s: JobSpec, attempt: int = 1) -> CreateMachine:
    return CreateMachine(s.job_id, attempt, f"{s.job_id}-a{attempt}", ZONE, None)


@pytest.fixture
def server() -> Iterator[CloudApiServer]:
    with CloudApiServer(create_delay_s=0.05) as s:
        yield s


def provider(server: CloudApiServer, create_wait_s: float = 10) -> GcpComputeProvider:
    settings = ProviderSettings(
        service_account="m@proj.iam.gserviceaccount.com", create_wait_s=create_wait_s, read_retry_s=0
    )
    return GcpComputeProvider(PROJECT, endpoint=server.url, settings=settings, clock=time.time)


@pytest.fixture
def gce(server: CloudApiServer) -> GcpComputeProvider:
    return provider(server)


def wait_for(read: Callable[[], Machine | None], state: MachineState, timeout: float = 10) -> Machine:
    deadline = time.monotonic() + timeout
    while (m := read()) is None or m.state is not state:
        assert time.monotonic() < deadline, f"{m} is not {state}"
        time.sleep(0.02)
    return m


def creates(server: CloudApiServer, name: str = "llm-a1") -> list[str]:
    return [c.collection for c in server.calls if c.verb == "create" and c.name == name]


def objects(server: CloudApiServer) -> list[str]:
    """Every object the local APIs hold, by collection (a MIG's VMs count as instances)."""
    return sorted(path.split("/")[-2] for path in server.leftovers())


# ------------------------------------------------------------------------------------------------ single host


def test_a_single_host_tpu_vm_is_one_instance(server: CloudApiServer, gce: GcpComputeProvider) -> None:
    s = spec("v6e-8")
    gce.create(create(s), s)
    m = gce.get("llm-a1", ZONE, s)
    assert m is not None and m.state is MachineState.READY
    vm = server.machine("llm-a1")
    assert vm is not None and vm.api == "compute" and vm.workers == ("llm-a1",)
    assert vm.resource["machineType"] == f"zones/{ZONE}/machineTypes/ct6e-standard-8t"
    assert "guestAccelerators" not in vm.resource
    assert creates(server) == ["instances"]
    assert [(m.name, m.state) for m in gce.list(ZONE, "llm")] == [("llm-a1", MachineState.READY)]
    gce.delete("llm-a1", ZONE, s)
    assert gce.get("llm-a1", ZONE, s) is None and objects(server) == []


def test_a_stockout_on_instance_insert_is_a_capacity_error(server: CloudApiServer, gce: GcpComputeProvider) -> None:
    server.stockouts[ZONE] = 1
    s = spec("v6e-8")
    with pytest.raises(CapacityError) as e:
        gce.create(create(s), s)
    assert type(e.value) is CapacityError and "ZONE_RESOURCE_POOL_EXHAUSTED" in str(e.value)
    assert objects(server) == []


def test_a_preempted_single_host_spot_tpu_vm_is_gone(server: CloudApiServer, gce: GcpComputeProvider) -> None:
    s = spec("v6e-8")
    gce.create(create(s), s)
    server.preempt("llm-a1")  # instanceTerminationAction DELETE
    assert gce.list(ZONE, "llm") == [] and gce.get("llm-a1", ZONE, s) is None


# ------------------------------------------------------------------------------------------------ slices


def test_a_slice_is_a_policy_a_template_and_a_mig_listed_as_one_machine(
    server: CloudApiServer, gce: GcpComputeProvider
) -> None:
    s = spec()
    gce.create(create(s), s)
    assert creates(server) == list(SLICE)
    m = wait_for(lambda: gce.get("llm-a1", ZONE, s), MachineState.READY)
    assert m.labels == {"team": "nlp", "respawn-managed": "true", "respawn-job": "llm", "respawn-attempt": "1"}
    machine = server.machine("llm-a1")
    assert machine is not None and len(machine.workers) == 4
    assert all(w.startswith("llm-a1-w-") and len(w) == len("llm-a1-w-xxxx") for w in machine.workers)
    assert [(m.name, m.state) for m in gce.list(ZONE)] == [("llm-a1", MachineState.READY)]  # not its 4 VMs
    assert gce.get("llm-a1", ZONE) is not None  # found without the spec too
    assert objects(server) == sorted([*SLICE, *["instances"] * 4])


def test_duplicate_creates_make_one_slice(server: CloudApiServer, gce: GcpComputeProvider) -> None:
    s = spec()
    gce.create(create(s), s)
    gce.create(create(s), s)  # a redelivered create: AlreadyExists at every step
    assert creates(server) == [*SLICE, *SLICE]
    wait_for(lambda: gce.get("llm-a1", ZONE, s), MachineState.READY)
    assert objects(server) == sorted([*SLICE, *["instances"] * 4])


@pytest.mark.parametrize(
    ("provisioning", "crashed_after"), [("spot", 1), ("spot", 2), ("flex-start", 1), ("flex-start", 2)]
)
def test_a_crash_after_each_create_call_is_repaired_by_the_next_create(
    server: CloudApiServer, gce: GcpComputeProvider, provisioning: str, crashed_after: int
) -> None:
    """The delivery dies after the first `crashed_after` objects were created (here: the next insert fails); the
    redelivered create goes on from there and the slice completes, one of each object."""
    s = spec(provisioning=provisioning)
    server.fail_next("create", code=503, status="UNAVAILABLE", message="backend error", collection=SLICE[crashed_after])
    with pytest.raises(TransientError):
        gce.create(create(s), s)
    assert objects(server) == sorted(SLICE[:crashed_after])
    gce.create(create(s), s)
    wait_for(lambda: gce.get("llm-a1", ZONE, s), MachineState.READY)
    assert objects(server) == sorted([*SLICE, *["instances"] * 4])


@pytest.mark.parametrize("made", [1, 2, 3])
def test_a_slice_made_in_part_by_a_crashed_delivery_is_completed(
    server: CloudApiServer, gce: GcpComputeProvider, made: int
) -> None:
    """A crash right after an insert was accepted, before its operation was awaited: the objects exist, and the
    next create finds each AlreadyExists and adds what is missing."""
    s = spec()
    part = gce.slice(create(s), s)
    inserts = [
        lambda: gce.slices.policies.insert_unary(
            project=PROJECT, region=REGION, resource_policy_resource=slices.workload_policy(part)
        ),
        lambda: gce.slices.templates.insert_unary(
            project=PROJECT, instance_template_resource=slices.instance_template(part)
        ),
        lambda: gce.slices.migs.insert_unary(
            project=PROJECT, zone=ZONE, instance_group_manager_resource=slices.instance_group_manager(part)
        ),
    ]
    for insert in inserts[:made]:
        insert()
        time.sleep(0.1)  # the next object needs this one's operation DONE
    gce.create(create(s), s)
    wait_for(lambda: gce.get("llm-a1", ZONE, s), MachineState.READY)
    assert objects(server) == sorted([*SLICE, *["instances"] * 4])


def test_a_slice_is_deleted_mig_then_template_then_policy(server: CloudApiServer, gce: GcpComputeProvider) -> None:
    s = spec()
    gce.create(create(s), s)
    wait_for(lambda: gce.get("llm-a1", ZONE, s), MachineState.READY)
    gce.delete("llm-a1", ZONE, s)
    deletes = [(c.collection, c.zone) for c in server.calls if c.verb == "delete" and c.name == "llm-a1"]
    assert deletes == [("instanceGroupManagers", ZONE), ("instanceTemplates", "global"), ("resourcePolicies", REGION)]
    assert objects(server) == [] and gce.get("llm-a1", ZONE, s) is None and gce.list(ZONE) == []
    gce.delete("llm-a1", ZONE, s)  # NotFound at every step is done
    gce.delete("llm-a1", ZONE)  # and with no spec: the instance of that name too
    assert objects(server) == []


def test_the_leftovers_of_a_slice_without_its_mig_are_listed_and_deleted(
    server: CloudApiServer, gce: GcpComputeProvider
) -> None:
    s = spec()
    server.fail_next("create", code=403, status="PERMISSION_DENIED", message="no", collection="instanceGroupManagers")
    with pytest.raises(Exception, match="no"):
        gce.create(create(s), s)
    listed = gce.list(ZONE, "llm")
    assert [(m.name, m.state) for m in listed] == [("llm-a1", MachineState.TERMINATED)]
    assert "MIG is gone" in listed[0].detail
    leftover = gce.get("llm-a1", ZONE, s)
    assert leftover is not None and leftover.state is MachineState.TERMINATED
    assert gce.list(ZONE, "other") == [] and gce.list("us-east5-b") == []  # not another job's, nor zone's
    gce.delete("llm-a1", ZONE, s)
    assert objects(server) == [] and gce.list(ZONE) == []


def test_the_topology_state_machine_as_get_sees_it(server: CloudApiServer) -> None:
    server.create_delay_s = 0.5
    gce = provider(server)
    s = spec()
    gce.create(create(s), s)
    m = gce.get("llm-a1", ZONE, s)
    assert m is not None and m.state is MachineState.CREATING  # VMs provisioning, topology not ACTIVE yet
    wait_for(lambda: gce.get("llm-a1", ZONE, s), MachineState.READY)
    server.preempt("llm-a1", worker=2)  # one VM TERMINATED, the topology no longer ACTIVE
    m = gce.get("llm-a1", ZONE, s)
    assert m is not None and m.state is MachineState.PREEMPTED
    assert [(x.name, x.state) for x in gce.list(ZONE, "llm")] == [("llm-a1", MachineState.PREEMPTED)]


@pytest.mark.parametrize("bulk_stockout", ["wait", "fail"])
def test_a_stockout_for_a_slice_is_a_capacity_error_and_leaves_nothing(bulk_stockout: str) -> None:
    """Whether a BULK MIG without capacity waits (reporting why in its bulk operation) or fails its insert
    operation, create raises CapacityError and deletes what it made, so decide's zone walk leaves nothing."""
    with CloudApiServer(create_delay_s=0.05, stockouts={ZONE: 1}, bulk_stockout=bulk_stockout) as server:
        gce = provider(server)
        s = spec()
        with pytest.raises(CapacityError) as e:
            gce.create(create(s), s)
        assert type(e.value) is CapacityError and "ZONE_RESOURCE_POOL_EXHAUSTED" in str(e.value)
        assert objects(server) == []
        gce.create(create(s, 2), s)  # the stockout was for one create only
        wait_for(lambda: gce.get("llm-a2", ZONE, s), MachineState.READY)


# ------------------------------------------------------------------------------------------------ flex-start


def test_a_flex_start_slice_waits_queued_then_runs() -> None:
    """A BULK MIG of FLEX_START VMs, no resize request: it waits in the zone's queue, then creates every VM."""
    with CloudApiServer(create_delay_s=0.05, queue_waits={ZONE: 0.6}) as server:
        gce = provider(server)
        s = spec(tiers=(Tier("flex-start", (ZONE,), max_run_duration_s=3600),))
        gce.create(create(s), s)
        assert creates(server) == list(SLICE)
        m = gce.get("llm-a1", ZONE, s)
        assert m is not None and m.state is MachineState.QUEUED
        assert [(x.name, x.state) for x in gce.list(ZONE)] == [("llm-a1", MachineState.QUEUED)]
        wait_for(lambda: gce.get("llm-a1", ZONE, s), MachineState.READY)
        gce.create(create(s), s)  # a redelivery changes nothing
        assert gce.get("llm-a1", ZONE, s) == Machine("llm-a1", ZONE, MachineState.READY, m.labels)
        gce.delete("llm-a1", ZONE, s)
        assert objects(server) == []


def test_a_flex_start_vm_waits_queued_then_runs() -> None:
    with CloudApiServer(create_delay_s=0.05, queue_waits={ZONE: 0.6}) as server:
        gce = provider(server, create_wait_s=0.2)
        s = spec("v6e-8", "flex-start")
        gce.create(create(s), s)
        m = gce.get("llm-a1", ZONE, s)
        assert m is not None and m.state is MachineState.QUEUED  # PENDING
        wait_for(lambda: gce.get("llm-a1", ZONE, s), MachineState.READY)
