"""`MachineProvider.set_world` (docs/design/several-slices.md, Telling the machines), one contract run against
tests/fakes.py's FakeProvider and respawn's real adapters on the local Cloud TPU v2 and Compute v1 APIs: every VM of the
machine gets `respawn-world`, every other metadata key stays, a world of the same or a newer version is left as it
is, a value that is no world is overwritten, and a machine that is gone is done. Then what only the real ones have:
the Cloud TPU API's `nodes.patch` of a queued resource's node, and Compute Engine's fingerprint race (412
conditionNotMet). Every request and reply the real adapters make is held to Google's discovery documents."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from discovery import Api
from fakes import FakeProvider
from google.cloud import compute_v1, tpu_v2
from google.protobuf import field_mask_pb2

from localcloud.apis.cloudapi import CloudApiServer, Exchange
from respawn.actions import CreateMachine
from respawn.adapters.compute import GcpComputeProvider
from respawn.adapters.settings import ProviderSettings, client_options
from respawn.adapters.tpu import GcpTpuProvider
from respawn.adapters.world_metadata import with_world, world_version
from respawn.jobs import GpuMachine, JobSpec, MachineSpec, MachineState, TpuMachine
from respawn.ports import Machine, MachineProvider, PermanentError, TransientError

pytestmark = pytest.mark.waits

P, ZONE, V6E = "proj", "us-central1-a", "us-east5-b"  # ZONE offers v5e and L4, V6E v6e (localcloud/apis/offerings.py)
KEY = "respawn-world"
SETTINGS = ProviderSettings(service_account="m@proj.iam.gserviceaccount.com", create_wait_s=10, read_retry_s=0)
TPU_API, COMPUTE_API = Api.load("tpu.v2"), Api.load("compute.v1")
MACHINES: dict[str, MachineSpec] = {
    "fake": GpuMachine("g2-standard-8", "nvidia-l4", 1),
    "tpu-node": TpuMachine("v5litepod-16", "v2-alpha-tpuv5-lite", request="node"),  # 4 workers, one node
    "tpu-queued": TpuMachine("v5litepod-8", "v2-alpha-tpuv5-lite", request="queued"),
    "compute-gpu": GpuMachine("g2-standard-8", "nvidia-l4", 1),
    "compute-tpu-vm": TpuMachine("v6e-8", api="compute"),
    "compute-slice": TpuMachine("v6e-16", api="compute"),  # a MIG of 4 VMs
    "compute-gpu-group": GpuMachine("g2-standard-8", "nvidia-l4", 1, vms=2),  # a MIG of 2 VMs
}
VMS = {"compute-slice": 4, "compute-gpu-group": 2}


def world(version: int, members: tuple[int, ...] = (0, 1)) -> str:
    return json.dumps({"version": version, "members": list(members), "step": None})


@dataclass
class Backend:
    """A provider, and a way to read (and, as another writer would, change) the metadata of each VM of a machine."""

    kind: str
    provider: MachineProvider
    held: Callable[[str], list[dict[str, str]]]  # the metadata of each VM of the machine, [] when it is gone
    overwrite: Callable[[str, str], None]  # another writer sets the key on every VM
    server: CloudApiServer | None = None

    @property
    def zone(self) -> str:
        return V6E if self.kind in ("compute-tpu-vm", "compute-slice") else ZONE

    def spec(self, job_id: str = "llm") -> JobSpec:
        return JobSpec(
            job_id=job_id,
            machine=MACHINES[self.kind],
            zones=(self.zone,),
            image="us-docker.pkg.dev/proj/repo/trainer:1",
            checkpoint_uri=f"gs://ckpt/{job_id}",
            provisioning="spot",
            ttl_s=7200,
        )

    def ready(self, job_id: str = "llm") -> tuple[str, JobSpec]:
        """A READY machine of the job's first attempt; its name and spec."""
        spec, name = self.spec(job_id), f"{job_id}-a1"
        self.provider.create(CreateMachine(job_id, 1, name, self.zone, 2_000_000_000.0), spec)
        deadline = time.monotonic() + 10
        while (m := self.provider.get(name, self.zone, spec)) is None or m.state is not MachineState.READY:
            assert time.monotonic() < deadline, m
            time.sleep(0.02)
        return name, spec

    def set_world(self, name: str, spec: JobSpec, text: str) -> None:
        self.provider.set_world(name, self.zone, spec, text)

    def writes(self) -> int:
        """The metadata writes the provider made (nodes.patch, instances.setMetadata); the fake's own calls."""
        if self.server is None:
            assert isinstance(self.provider, FakeProvider)
            return self.provider.count("set_world")
        return sum(1 for e in self.server.exchanges if e.method == "PATCH" or e.path.endswith("/setMetadata"))


def _fake() -> Backend:
    fake = FakeProvider(creating_reads=0)

    def held(name: str) -> list[dict[str, str]]:
        if name not in fake.machines:
            return []
        return [{KEY: fake.worlds[name]} if name in fake.worlds else {}]

    def overwrite(name: str, text: str) -> None:
        fake.worlds[name] = text

    return Backend("fake", fake, held, overwrite)


class RealCloud:
    """The local APIs as another client sees them: each VM's metadata, read and written with Google's clients."""

    def __init__(self, server: CloudApiServer) -> None:
        self.server = server
        options = client_options(server.url)
        self.tpu = tpu_v2.TpuClient(**options)
        self.instances = compute_v1.InstancesClient(**options)

    def node(self, zone: str, name: str) -> str:
        return f"projects/{P}/locations/{zone}/nodes/{name}"

    def vms(self, name: str) -> list[tuple[str, str]]:
        """(zone, instance) of each Compute Engine VM of the machine."""
        machine = self.server.machine(name)
        if machine is None or machine.deleted_at is not None:
            return []
        return [(machine.zone, vm) for vm in machine.workers]

    def tpu_held(self, zone: str) -> Callable[[str], list[dict[str, str]]]:
        def held(name: str) -> list[dict[str, str]]:
            machine = self.server.machine(name)
            if machine is None or machine.deleted_at is not None:
                return []
            return [dict(self.tpu.get_node(name=self.node(zone, name)).metadata)]

        return held

    def tpu_overwrite(self, zone: str) -> Callable[[str, str], None]:
        def overwrite(name: str, text: str) -> None:
            node = self.tpu.get_node(name=self.node(zone, name))
            patch = tpu_v2.Node(name=node.name, metadata={**node.metadata, KEY: text})
            mask = field_mask_pb2.FieldMask(paths=["metadata"])
            self.tpu.update_node(node=patch, update_mask=mask).result(timeout=10)

        return overwrite

    def compute_held(self, name: str) -> list[dict[str, str]]:
        return [items(self.instances.get(project=P, zone=z, instance=vm)) for z, vm in self.vms(name)]

    def compute_overwrite(self, name: str, text: str) -> None:
        for z, vm in self.vms(name):
            self.set_items(z, vm, lambda before: {**before, KEY: text})

    def set_items(self, zone: str, vm: str, change: Callable[[dict[str, str]], dict[str, str]]) -> None:
        got = self.instances.get(project=P, zone=zone, instance=vm)
        metadata = compute_v1.Metadata(
            fingerprint=got.metadata.fingerprint,
            items=[compute_v1.Items(key=k, value=v) for k, v in change(items(got)).items()],
        )
        self.instances.set_metadata(project=P, zone=zone, instance=vm, metadata_resource=metadata).result(timeout=10)


def items(vm: compute_v1.Instance) -> dict[str, str]:
    return {i.key: i.value for i in vm.metadata.items}


def problems(exchanges: list[Exchange]) -> list[str]:
    """What Google's discovery documents refuse in the requests and replies made."""
    found = set()
    for e in exchanges:
        found.update((TPU_API if e.path.startswith("/v2/") else COMPUTE_API).exchange_problems(e))
    return sorted(found)


@pytest.fixture(params=list(MACHINES))
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    kind: str = request.param
    if kind == "fake":
        yield _fake()
        return
    with CloudApiServer(create_delay_s=0.02, record=True) as server:
        cloud = RealCloud(server)
        if kind.startswith("tpu"):
            tpu = GcpTpuProvider(P, endpoint=server.url, settings=SETTINGS)
            yield Backend(kind, tpu, cloud.tpu_held(ZONE), cloud.tpu_overwrite(ZONE), server)
        else:
            gce = GcpComputeProvider(P, endpoint=server.url, settings=SETTINGS, clock=time.time)
            yield Backend(kind, gce, cloud.compute_held, cloud.compute_overwrite, server)
        found = problems(server.exchanges)
        assert found == [], "\n".join(found)


# ------------------------------------------------------------------------------------------------ the contract


def test_every_vm_gets_the_world_and_keeps_its_other_keys(backend: Backend) -> None:
    name, spec = backend.ready()
    before = backend.held(name)
    assert len(before) == VMS.get(backend.kind, 1)
    backend.set_world(name, spec, world(1))
    after = backend.held(name)
    assert after == [{**b, KEY: world(1)} for b in before]
    if backend.kind != "fake":
        assert all("startup-script" in vm and vm["respawn-job-id"] == "llm" for vm in after)
    if backend.kind in VMS:  # each VM of a MIG keeps its own worker number
        assert sorted(vm["agent-worker-number"] for vm in after) == [str(i) for i in range(VMS[backend.kind])]
    backend.set_world(name, spec, world(2, (0,)))
    assert backend.held(name) == [{**b, KEY: world(2, (0,))} for b in before]


def test_a_world_of_the_same_or_an_older_version_leaves_a_newer_one(backend: Backend) -> None:
    name, spec = backend.ready()
    backend.set_world(name, spec, world(3))
    writes = backend.writes()
    backend.set_world(name, spec, world(3))  # told twice
    backend.set_world(name, spec, world(2, (1,)))  # delivered late
    assert [vm[KEY] for vm in backend.held(name)] == [world(3)] * VMS.get(backend.kind, 1)
    if backend.kind != "fake":
        assert backend.writes() == writes  # read, and nothing written
    backend.overwrite(name, world(7))  # a newer one written in between (another delivery's)
    backend.set_world(name, spec, world(4))
    assert [vm[KEY] for vm in backend.held(name)] == [world(7)] * VMS.get(backend.kind, 1)


@pytest.mark.parametrize("backend", ["fake", "tpu-node", "compute-gpu", "compute-slice"], indirect=True)
@pytest.mark.parametrize("value", ["not json", "[]", '{"members": [0]}', '{"version": "x"}', '{"version": null}'])
def test_a_value_that_is_no_world_is_overwritten(backend: Backend, value: str) -> None:
    name, spec = backend.ready()
    backend.overwrite(name, value)
    backend.set_world(name, spec, world(1))
    assert [vm[KEY] for vm in backend.held(name)] == [world(1)] * VMS.get(backend.kind, 1)


def test_a_machine_that_is_gone_is_done(backend: Backend) -> None:
    spec = backend.spec("gone")
    backend.set_world("gone-a1", spec, world(1))  # never made
    name, spec = backend.ready("gone")
    backend.provider.delete(name, backend.zone, spec)
    deadline = time.monotonic() + 10
    while backend.provider.get(name, backend.zone, spec) is not None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    backend.set_world(name, spec, world(2))
    assert backend.held(name) == []


@pytest.mark.parametrize("backend", ["tpu-node", "compute-gpu"], indirect=True)
def test_a_world_without_an_integer_version_is_refused(backend: Backend) -> None:
    name, spec = backend.ready()
    with pytest.raises(PermanentError, match="integer version"):
        backend.set_world(name, spec, '{"members": [0]}')
    assert all(KEY not in vm for vm in backend.held(name))


# ------------------------------------------------------------------------------------------------ the real APIs


@pytest.fixture
def server() -> Iterator[CloudApiServer]:
    with CloudApiServer(create_delay_s=0.02, record=True, queue_waits={ZONE: 30.0}) as running:
        yield running
        found = problems(running.exchanges)
        assert found == [], "\n".join(found)


def test_a_queued_resource_waiting_for_capacity_has_no_node_and_is_done(server: CloudApiServer) -> None:
    """A queued resource's node is made once the resource is provisioned: until then there is nothing to tell."""
    tpu = GcpTpuProvider(P, endpoint=server.url, settings=SETTINGS)
    spec = Backend("tpu-queued", tpu, lambda _: [], lambda *_: None).spec("waits")
    tpu.create(CreateMachine("waits", 1, "waits-a1", ZONE, 2_000_000_000.0), spec)
    machine: Machine | None = tpu.get("waits-a1", ZONE, spec)
    assert machine is not None and machine.state is MachineState.QUEUED
    tpu.set_world("waits-a1", ZONE, spec, world(1))
    assert not [e for e in server.exchanges if e.method == "PATCH"]


def racing_get(gce: GcpComputeProvider, cloud: RealCloud, times: int) -> list[str]:
    """The provider's `instances.get`, after which another writer changes the VM's metadata, the first `times` calls:
    the fingerprint the provider read is stale when it writes. The keys the other writer added."""
    real = gce.client.get
    added: list[str] = []

    def get(**kw: Any) -> compute_v1.Instance:
        vm = real(**kw)
        if len(added) < times:
            added.append(f"other-{len(added)}")
            cloud.set_items(kw["zone"], kw["instance"], lambda before: {**before, added[-1]: "1"})
        return vm

    gce.client.get = get  # type: ignore[method-assign]
    return added


def test_a_write_that_loses_the_fingerprint_race_reads_again(server: CloudApiServer) -> None:
    cloud = RealCloud(server)
    gce = GcpComputeProvider(P, endpoint=server.url, settings=SETTINGS, clock=time.time)
    backend = Backend("compute-gpu", gce, cloud.compute_held, cloud.compute_overwrite, server)
    name, spec = backend.ready()
    added = racing_get(gce, cloud, times=2)
    backend.set_world(name, spec, world(1))
    assert added == ["other-0", "other-1"]
    (vm,) = cloud.compute_held(name)
    assert vm[KEY] == world(1) and vm["other-0"] == vm["other-1"] == "1"  # theirs kept, ours written
    refused = [e for e in server.exchanges if e.path.endswith("/setMetadata") and e.status == 412]
    assert len(refused) == 2 and refused[0].response["error"]["errors"][0]["reason"] == "conditionNotMet"


def test_a_fingerprint_refused_inside_the_operation_reads_again(server: CloudApiServer) -> None:
    """Compute Engine may take the write and fail its operation for the stale fingerprint (CONDITION_NOT_MET), as
    users report it: the same race, read again and retried. The first operation is made up here; the local API
    refuses a stale fingerprint at once."""
    cloud = RealCloud(server)
    gce = GcpComputeProvider(P, endpoint=server.url, settings=SETTINGS, clock=time.time)
    name, spec = Backend("compute-gpu", gce, cloud.compute_held, cloud.compute_overwrite, server).ready()
    real, failed = gce.client.set_metadata_unary, []

    def set_metadata(**kw: Any) -> compute_v1.Operation:
        if failed:
            return real(**kw)
        failed.append(kw["metadata_resource"].fingerprint)
        message = "Supplied fingerprint does not match current metadata fingerprint."
        errors = compute_v1.Error(errors=[compute_v1.Errors(code="CONDITION_NOT_MET", message=message)])
        return compute_v1.Operation(name="op-1", status=compute_v1.Operation.Status.DONE, error=errors)

    gce.client.set_metadata_unary = set_metadata  # type: ignore[method-assign]
    gce.set_world(name, ZONE, spec, world(1))
    assert len(failed) == 1 and [vm[KEY] for vm in cloud.compute_held(name)] == [world(1)]


def test_a_race_lost_for_longer_than_a_request_is_transient(server: CloudApiServer) -> None:
    cloud = RealCloud(server)
    settings = ProviderSettings(create_wait_s=10, read_retry_s=0, request_timeout_s=1.0)
    gce = GcpComputeProvider(P, endpoint=server.url, settings=settings, clock=time.time)
    name, spec = Backend("compute-gpu", gce, cloud.compute_held, cloud.compute_overwrite, server).ready()
    racing_get(gce, cloud, times=1_000)
    with pytest.raises(TransientError, match="set the world on VM llm-a1"):
        gce.set_world(name, ZONE, spec, world(1))
    (vm,) = cloud.compute_held(name)
    assert KEY not in vm


# ------------------------------------------------------------------------------------------------ the version


@pytest.mark.parametrize(
    ("text", "version"),
    [(world(3), 3), ('{"version": "4"}', 4), ("not json", None), ("[1]", None), ('{"v": 1}', None), (None, None)],
)
def test_world_version(text: str | None, version: int | None) -> None:
    assert world_version(text) == version


def test_with_world_keeps_every_other_key() -> None:
    assert with_world({"a": "1", KEY: world(1)}, world(2)) == {"a": "1", KEY: world(2)}
    assert with_world({"a": "1", KEY: world(2)}, world(2)) is None
    assert with_world({"a": "1"}, world(1)) == {"a": "1", KEY: world(1)}
