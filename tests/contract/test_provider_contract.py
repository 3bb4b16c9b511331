"""One provider contract, run against tests/fakes.py's in-memory FakeProvider and every real adapter on the local
Cloud TPU and Compute APIs, so that neither the fake the unit tests trust nor the local imitation can drift:
create twice (one machine, no error), delete and get of a missing machine, list by job, the states a machine
goes through (QUEUED or CREATING before READY; preempted; gone once deleted), and a zone without capacity
(CapacityError, or still booting where the request waits in a queue).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from fakes import FakeProvider

from localcloud.apis.cloudapi import CloudApiServer
from respawn.actions import CreateMachine
from respawn.adapters.compute import GcpComputeProvider
from respawn.adapters.settings import ProviderSettings
from respawn.adapters.tpu import GcpTpuProvider
from respawn.jobs import GpuMachine, JobSpec, MachineState, TpuMachine
from respawn.ports import CapacityError, Machine, MachineProvider

pytestmark = pytest.mark.waits

ZONE, PROJECT = "us-central1-a", "proj"
SETTINGS = ProviderSettings(service_account="m@proj.iam.gserviceaccount.com", create_wait_s=10, read_retry_s=0)
BOOTING = {MachineState.QUEUED, MachineState.CREATING}
MACHINES = {
    "fake": GpuMachine("g2-standard-8", "nvidia-l4", 1),
    "tpu-queued": TpuMachine("v5litepod-8", "v2-alpha-tpuv5-lite", request="queued"),
    "tpu-node": TpuMachine("v5litepod-8", "v2-alpha-tpuv5-lite", request="node"),
    "compute-gpu": GpuMachine("g2-standard-8", "nvidia-l4", 1),
    "compute-tpu-vm": TpuMachine("v6e-8", api="compute"),
    "compute-slice": TpuMachine("v6e-16", api="compute"),
}
# each in a zone that offers it (localcloud/apis/offerings.py): v5e and L4 in us-central1-a, v6e in us-east5-b
ZONES = {kind: "us-east5-b" if kind in ("compute-tpu-vm", "compute-slice") else ZONE for kind in MACHINES}


@dataclass(frozen=True)
class Backend:
    """A provider, and how its cloud preempts a machine and runs out of capacity in the zone."""

    kind: str
    provider: MachineProvider
    preempt: Callable[[str], object]
    stock_out: Callable[[], None]

    @property
    def zone(self) -> str:
        return ZONES[self.kind]

    def spec(self, job_id: str) -> JobSpec:
        return JobSpec(
            job_id=job_id,
            machine=MACHINES[self.kind],
            zones=(self.zone,),
            image="us-docker.pkg.dev/proj/repo/trainer:1",
            checkpoint_uri=f"gs://ckpt/{job_id}",
            provisioning="spot",
            ttl_s=7200,
        )

    def create(self, job_id: str) -> tuple[str, JobSpec]:
        spec = self.spec(job_id)
        name = f"{job_id}-a1"
        self.provider.create(CreateMachine(job_id, 1, name, self.zone, 2_000_000_000.0), spec)
        return name, spec


@pytest.fixture(params=list(MACHINES))
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    kind: str = request.param
    if kind == "fake":
        fake = FakeProvider()
        yield Backend(kind, fake, lambda name: fake.set_state(name, MachineState.PREEMPTED), lambda: _zero(fake))
        return
    with CloudApiServer(create_delay_s=0.3) as server:
        real: MachineProvider
        if kind.startswith("tpu"):
            real = GcpTpuProvider(PROJECT, endpoint=server.url, settings=SETTINGS)
        else:
            real = GcpComputeProvider(PROJECT, endpoint=server.url, settings=SETTINGS, clock=time.time)
        yield Backend(kind, real, server.preempt, lambda: server.stockouts.update({ZONES[kind]: 10}))


def _zero(fake: FakeProvider) -> None:
    fake.capacity[ZONE] = 0


def states_until_ready(backend: Backend, name: str, spec: JobSpec) -> list[MachineState]:
    """Every distinct state get() reports, in order, until READY."""
    seen: list[MachineState] = []
    deadline = time.monotonic() + 10
    while not seen or seen[-1] is not MachineState.READY:
        assert time.monotonic() < deadline, seen
        m = backend.provider.get(name, backend.zone, spec)
        assert m is not None
        if not seen or seen[-1] is not m.state:
            seen.append(m.state)
        time.sleep(0.02)
    return seen


def test_a_machine_boots_before_it_is_ready(backend: Backend) -> None:
    """Only QUEUED or CREATING before READY. A TPU node's or a VM's create waits for its operation, which the local
    APIs finish when the machine runs; a queued resource, a slice and the fake are seen booting first."""
    name, spec = backend.create("boot")
    seen = states_until_ready(backend, name, spec)
    assert set(seen[:-1]) <= BOOTING, seen
    if backend.kind in ("fake", "tpu-queued", "compute-slice"):
        assert len(seen) >= 2, seen


def test_create_twice_makes_one_machine(backend: Backend) -> None:
    name, spec = backend.create("twice")
    backend.create("twice")
    states_until_ready(backend, name, spec)
    assert [m.name for m in backend.provider.list(backend.zone, "twice")] == [name]


def test_missing_machines(backend: Backend) -> None:
    spec = backend.spec("gone")
    assert backend.provider.get("gone-a1", backend.zone, spec) is None
    backend.provider.delete("gone-a1", backend.zone, spec)  # NotFound is success
    name, spec = backend.create("gone")
    backend.provider.delete(name, backend.zone, spec)
    assert _eventually_gone(backend, name, spec)
    backend.provider.delete(name, backend.zone, spec)


def _eventually_gone(backend: Backend, name: str, spec: JobSpec) -> bool:
    deadline = time.monotonic() + 10
    while backend.provider.get(name, backend.zone, spec) is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return backend.provider.list(backend.zone, spec.job_id) == []


def test_list_by_job(backend: Backend) -> None:
    a, _ = backend.create("job-a")
    b, _ = backend.create("job-b")
    assert [m.name for m in backend.provider.list(backend.zone, "job-a")] == [a]
    assert sorted(m.name for m in backend.provider.list(backend.zone)) == [a, b]
    labelled: Machine = backend.provider.list(backend.zone, "job-b")[0]
    assert labelled.labels["respawn-job"] == "job-b" and labelled.labels["respawn-attempt"] == "1"


def test_a_preempted_machine(backend: Backend) -> None:
    name, spec = backend.create("preempt")
    states_until_ready(backend, name, spec)
    backend.preempt(name)
    m = backend.provider.get(name, backend.zone, spec)
    # a Spot VM that asked for instanceTerminationAction=DELETE is gone; others report their preemption
    assert m is None or m.state in (MachineState.PREEMPTED, MachineState.TERMINATED), m


def test_no_capacity(backend: Backend) -> None:
    backend.stock_out()
    if backend.kind == "tpu-queued":  # a queued resource waits for capacity instead of failing
        name, spec = backend.create("full")
        m = backend.provider.get(name, backend.zone, spec)
        assert m is not None and m.state in BOOTING
        return
    with pytest.raises(CapacityError):
        backend.create("full")
