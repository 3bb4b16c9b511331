"""respawn's real adapters against the local Cloud TPU v2 and Compute v1 APIs, every request and reply held to
Google's discovery documents (see discovery.py).

The scenarios drive every provider method respawn uses: TPU nodes and queued resources (Spot, reservation and
standard tiers, a queue wait, a stockout, a preemption), GPU VMs (Spot, flex-start, reservation, stockout,
preemption), a single-host TPU VM, v6e-16 slices (Spot, flex-start, stockout, preemption), a world's metadata writes
(TPU nodes.patch, Compute instances.setMetadata on a VM and on each VM of a slice). The methods they reach
must be exactly the methods the adapters' source calls, so that a new call cannot go unchecked.
"""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from discovery import Api
from google.cloud import compute_v1

from localcloud.apis.cloudapi import CloudApiServer, Exchange
from respawn.actions import CreateMachine
from respawn.adapters.compute import GcpComputeProvider
from respawn.adapters.compute_operations import Scope
from respawn.adapters.settings import ProviderSettings
from respawn.adapters.tpu import GcpTpuProvider
from respawn.jobs import GpuMachine, JobSpec, MachineState, Tier, TpuMachine
from respawn.ports import CapacityError, Machine, MachineProvider
from respawn_cli.offering import OfferingLookup

ZONE, PROJECT = "us-central1-a", "proj"
V6E = "us-east5-b"  # ZONE offers v5e and L4, V6E v6e (localcloud/apis/offerings.py)
OTHER = "us-central1-b"  # a zone that does not offer the scenarios' machines (run_offerings)
REPO = Path(__file__).parents[2]
ADAPTERS = REPO / "functions" / "respawn" / "adapters"
TPU_API, COMPUTE_API = Api.load("tpu.v2"), Api.load("compute.v1")
SETTINGS = ProviderSettings(service_account="m@proj.iam.gserviceaccount.com", create_wait_s=10, read_retry_s=0)
# A deployment's own network (RESPAWN_NETWORK, RESPAWN_SUBNETWORK, RESPAWN_EXTERNAL_IP=false).
NETWORKED = replace(SETTINGS, network="projects/host/global/networks/vpc", subnetwork="ml", external_ips=False)
SUBNETWORKS = tuple(f"projects/host/regions/{zone[:-2]}/subnetworks/ml" for zone in (ZONE, V6E))  # each create's region

# The client objects each adapter calls, by (file under adapters/, or from the repository's root, attribute): the
# discovery resource their methods belong to.
CLIENTS = {
    ("tpu.py", "client"): "tpu.projects.locations",
    ("compute.py", "client"): "compute.instances",
    ("compute_slices.py", "policies"): "compute.resourcePolicies",
    ("compute_slices.py", "templates"): "compute.instanceTemplates",
    ("compute_slices.py", "migs"): "compute.instanceGroupManagers",
    ("compute_operations.py", "zones"): "compute.zoneOperations",
    ("compute_operations.py", "regions"): "compute.regionOperations",
    ("compute_operations.py", "globals"): "compute.globalOperations",
    ("respawn_cli/offering.py", "tpu"): "tpu.projects.locations",
    ("respawn_cli/offering.py", "machine_types"): "compute.machineTypes",
    ("respawn_cli/offering.py", "accelerators"): "compute.acceleratorTypes",
}
# Called by the client library, not by name in respawn: the TPU create operation's polling (op.result()).
IMPLICIT = {"tpu.projects.locations.operations.get"}
# The TPU client's verbs whose discovery method has another name: update_node is nodes.patch.
TPU_VERBS = {"update": "patch"}


def used_methods() -> set[str]:
    """Every API method the adapters' source calls, as discovery method ids: `self.migs.insert_unary(` ->
    compute.instanceGroupManagers.insert, `self.client.create_queued_resource(` (tpu.py) ->
    tpu.projects.locations.queuedResources.create."""
    found = set(IMPLICIT)
    for (file, attribute), resource in CLIENTS.items():
        calls = re.findall(
            rf"self\.{attribute}\.(\w+)\(", (REPO / file if "/" in file else ADAPTERS / file).read_text()
        )
        assert calls, f"{file} calls nothing through self.{attribute}"
        for call in calls:
            call = call.removesuffix("_unary")
            if resource.startswith("tpu."):  # create_queued_resource -> queuedResources.create
                verb, _, noun = call.partition("_")
                collection = _camel(noun if noun.endswith("s") else noun + "s")
                found.add(f"{resource}.{collection}.{TPU_VERBS.get(verb, verb)}")
            else:  # list_managed_instances -> listManagedInstances
                found.add(f"{resource}.{_camel(call)}")
    return found


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(word.title() for word in rest)


# ------------------------------------------------------------------------------------------------ scenarios


def tpu_spec(job_id: str, request: str, provisioning: str = "spot", **kw: object) -> JobSpec:
    return JobSpec(
        job_id=job_id,
        machine=TpuMachine("v5litepod-8", "v2-alpha-tpuv5-lite", request=request),
        zones=(ZONE,),
        image="us-docker.pkg.dev/proj/repo/trainer:1",
        checkpoint_uri=f"gs://ckpt/{job_id}",
        provisioning=provisioning,
        args=("--steps=100",),
        env=(("KEY", "value"),),
        labels=(("team", "nlp"),),
        ttl_s=7200,
        **kw,  # type: ignore[arg-type]
    )


def compute_spec(job_id: str, machine: GpuMachine | TpuMachine, provisioning: str = "spot", **kw: object) -> JobSpec:
    spec = tpu_spec(job_id, "node", provisioning=provisioning, **kw)
    return JobSpec(**{**spec.__dict__, "machine": machine, "zones": (V6E if machine.kind == "tpu" else ZONE,)})


GPU = GpuMachine("g2-standard-8", "nvidia-l4", 1)
TPU_VM = TpuMachine("v6e-8", api="compute")
SLICE = TpuMachine("v6e-16", api="compute")
TIERS = (Tier("spot", (ZONE,), after_preemptions=1),)


def zone_of(spec: JobSpec, tier: int = 0) -> str:
    return spec.all_tiers[tier].zones[0]


def action(spec: JobSpec, tier: int = 0) -> CreateMachine:
    return CreateMachine(spec.job_id, 1, f"{spec.job_id}-a1", zone_of(spec, tier), 2_000_000_000.0, tier=tier)


def wait_for(read: Callable[[], Machine | None], state: MachineState) -> None:
    deadline = time.monotonic() + 10
    while (m := read()) is None or m.state is not state:
        assert time.monotonic() < deadline, f"{m} is not {state}"
        time.sleep(0.02)


def lifecycle(server: CloudApiServer, provider: MachineProvider, spec: JobSpec, tier: int = 0) -> None:
    """Create (twice), READY, list, preempt, read it preempted, delete (twice), read it gone."""
    name, zone = f"{spec.job_id}-a1", zone_of(spec, tier)
    provider.create(action(spec, tier), spec)
    provider.create(action(spec, tier), spec)
    wait_for(lambda: provider.get(name, zone, spec), MachineState.READY)
    assert [m.name for m in provider.list(zone, spec.job_id)] == [name]
    server.preempt(name)
    provider.get(name, zone, spec)
    provider.list(zone, spec.job_id)
    provider.delete(name, zone, spec)
    provider.delete(name, zone, spec)
    assert provider.get(name, zone, spec) is None


def stocked_out(provider: MachineProvider, spec: JobSpec) -> None:
    with pytest.raises(CapacityError):
        provider.create(action(spec), spec)
    provider.delete(f"{spec.job_id}-a1", zone_of(spec), spec)


def run_tpu(server: CloudApiServer) -> None:
    tpu = GcpTpuProvider(PROJECT, endpoint=server.url, settings=SETTINGS)
    lifecycle(server, tpu, tpu_spec("node", "node"))
    lifecycle(server, tpu, tpu_spec("queued", "queued"))
    for provisioning, reservation in (("reservation", "tpu-res"), ("standard", None)):
        for request in ("node", "queued"):
            tiers = (*TIERS, Tier(provisioning, (ZONE,), reservation))
            lifecycle(server, tpu, tpu_spec(f"{provisioning}-{request}", request, tiers=tiers), tier=1)
    server.stockouts[ZONE] = 1
    stocked_out(tpu, tpu_spec("stockout", "node"))


def run_queue_wait(server: CloudApiServer) -> None:
    tpu = GcpTpuProvider(PROJECT, endpoint=server.url, settings=SETTINGS)
    spec = tpu_spec("waits", "queued")
    tpu.create(action(spec), spec)
    wait_for(lambda: tpu.get("waits-a1", ZONE, spec), MachineState.QUEUED)
    tpu.list(ZONE, "waits")
    tpu.delete("waits-a1", ZONE, spec)


def run_compute(server: CloudApiServer) -> None:
    gce = GcpComputeProvider(PROJECT, endpoint=server.url, settings=SETTINGS, clock=time.time)
    lifecycle(server, gce, compute_spec("gpu", GPU))
    lifecycle(server, gce, compute_spec("gpu-flex", GPU, "flex-start"))
    tiers = (*TIERS, Tier("reservation", (ZONE,), "gpu-res"))
    lifecycle(server, gce, compute_spec("gpu-res", GPU, tiers=tiers), tier=1)
    lifecycle(server, gce, compute_spec("tpu-vm", TPU_VM))
    lifecycle(server, gce, compute_spec("slice", SLICE))
    lifecycle(server, gce, compute_spec("slice-flex", SLICE, "flex-start"))
    bound = (Tier("spot", (V6E,), after_preemptions=1), Tier("reservation-bound", (V6E,), "v6e-calendar"))
    lifecycle(server, gce, compute_spec("slice-bound", SLICE, tiers=bound), tier=1)
    # A region's or the global scope's operation still RUNNING is waited for; the local APIs finish those at once,
    # so the adapter's wait is driven here on the operations its inserts returned.
    for scope, collection in ((Scope(region=V6E[:-2]), "resourcePolicies"), (Scope(), "instanceTemplates")):
        op = next(e.response for e in server.exchanges if e.method == "POST" and e.path.endswith(collection))
        running = compute_v1.Operation(name=op["name"], status=compute_v1.Operation.Status.RUNNING)
        assert gce.operations.wait(running, scope, time.monotonic() + 5) is not None
    server.stockouts.update({ZONE: 1, V6E: 1})
    stocked_out(gce, compute_spec("gpu-out", GPU))
    stocked_out(gce, compute_spec("slice-out", SLICE))


def run_worlds(server: CloudApiServer) -> None:
    """A world told to a TPU node, a queued resource's node, a GPU VM and each VM of a v6e-16 slice's MIG, twice
    (the second finds it there and writes nothing), then to machines that are gone."""
    tpu = GcpTpuProvider(PROJECT, endpoint=server.url, settings=SETTINGS)
    gce = GcpComputeProvider(PROJECT, endpoint=server.url, settings=SETTINGS, clock=time.time)
    world = '{"version": 1, "members": [0, 1], "step": null}'
    machines = [
        (tpu, tpu_spec("world-node", "node")),
        (tpu, tpu_spec("world-queued", "queued")),
        (gce, compute_spec("world-gpu", GPU)),
        (gce, compute_spec("world-slice", SLICE)),
    ]
    for provider, spec in machines:
        name, zone = f"{spec.job_id}-a1", zone_of(spec)
        provider.create(action(spec), spec)
        wait_for(lambda: provider.get(name, zone, spec), MachineState.READY)  # noqa: B023 (called at once)
        provider.set_world(name, zone, spec, world)
        provider.set_world(name, zone, spec, world)
        provider.delete(name, zone, spec)
        assert provider.get(name, zone, spec) is None
        provider.set_world(name, zone, spec, world)
    patched = [e for e in server.exchanges if e.method == "PATCH"]
    written = [e for e in server.exchanges if e.path.endswith("/setMetadata")]
    assert len(patched) == 2 and len(written) == 1 + 4, (patched, written)


def run_networked(server: CloudApiServer) -> None:
    """Every kind of create on a deployment's own network, without external IPs."""
    tpu = GcpTpuProvider(PROJECT, endpoint=server.url, settings=NETWORKED)
    gce = GcpComputeProvider(PROJECT, endpoint=server.url, settings=NETWORKED, clock=time.time)
    lifecycle(server, tpu, tpu_spec("net-node", "node"))
    lifecycle(server, tpu, tpu_spec("net-queued", "queued"))
    lifecycle(server, gce, compute_spec("net-gpu", GPU))
    lifecycle(server, gce, compute_spec("net-slice", SLICE))


def run_offerings(server: CloudApiServer) -> None:
    """Which zones offer a TPU (both APIs) and a GPU: the type listings, found and not."""
    lookup = OfferingLookup(PROJECT, tpu_endpoint=server.url, compute_endpoint=server.url)
    for machine in (SLICE, GPU, TpuMachine("v5litepod-8", "v2-alpha-tpuv5-lite")):
        zones = (V6E if machine is SLICE else ZONE, OTHER)
        assert [o.offered for o in lookup.zones(replace(compute_spec("offered", machine), zones=zones))] == [
            True,
            False,
        ]


@pytest.fixture(scope="module")
def exchanges() -> Iterator[list[Exchange]]:
    """Every request and reply of every scenario."""
    recorded: list[Exchange] = []
    for run, knobs in (
        (run_tpu, {}),
        (run_queue_wait, {"queue_waits": {ZONE: 30.0}}),
        (run_compute, {}),
        (run_worlds, {}),
        (run_networked, {}),
        (run_offerings, {"unoffered": {OTHER: ("ct6e-standard-4t", "g2-standard-8", "v5litepod-8")}}),
    ):
        with CloudApiServer(create_delay_s=0.02, record=True, **knobs) as server:  # type: ignore[arg-type]
            run(server)
            recorded += server.exchanges
    yield recorded


def api_of(exchange: Exchange) -> Api:
    return TPU_API if exchange.path.startswith("/v2/") else COMPUTE_API


def problems(exchange: Exchange) -> list[str]:
    """What in this request or its reply Google's definition of the method refuses."""
    return api_of(exchange).exchange_problems(exchange)


# ------------------------------------------------------------------------------------------------ tests


def test_every_request_and_reply_conforms(exchanges: list[Exchange]) -> None:
    found = sorted({p for e in exchanges for p in problems(e)})
    assert found == [], "\n".join(found)


def test_every_method_the_adapters_call_is_checked(exchanges: list[Exchange]) -> None:
    covered = {m.id for e in exchanges if (m := api_of(e).method(e.method, e.path)) is not None}
    assert covered == used_methods()


def test_the_scenarios_reach_errors_and_states(exchanges: list[Exchange]) -> None:
    """The checks above saw operations that failed for capacity, preempted and queued machines."""
    replies = [str(e.response) for e in exchanges]
    states = ("'PREEMPTED'", "'SUSPENDED'", "'WAITING_FOR_RESOURCES'", "'TERMINATED'")
    for seen in ("ZONE_RESOURCE_POOL_EXHAUSTED", *states):
        assert any(seen in r for r in replies), seen


def test_the_networked_creates_were_checked(exchanges: list[Exchange]) -> None:
    """The conformance check above saw the subnetwork, and no external IP, on each kind of create."""
    networked = [e for e in exchanges if e.method == "POST" and any(s in str(e.body) for s in SUBNETWORKS)]
    assert {e.path.rsplit("/", 1)[-1] for e in networked} == {
        "nodes",
        "queuedResources",
        "instances",
        "instanceTemplates",
    }
    assert not any("accessConfigs" in str(e.body) or "enableExternalIps" in str(e.body) for e in networked)


def first(exchanges: list[Exchange], method_id: str) -> Exchange:
    return next(e for e in exchanges if (m := api_of(e).method(e.method, e.path)) and m.id == method_id)


def test_a_wrong_request_field_fails(exchanges: list[Exchange]) -> None:
    insert = first(exchanges, "compute.instanceGroupManagers.insert")
    assert problems(insert) == []
    for change in (
        lambda b: b.update(targetSizee=b.pop("targetSize")),  # unknown field
        lambda b: b.update(targetSize=str(b["targetSize"])),  # int32 as a string
        lambda b: b["instanceLifecyclePolicy"].update(defaultActionOnFailure=1),
    ):
        body = copy.deepcopy(insert.body)
        change(body)
        assert len(problems(Exchange(**{**insert.__dict__, "body": body}))) == 1
    node = first(exchanges, "tpu.projects.locations.nodes.create")
    body = copy.deepcopy(node.body)
    body["schedulingConfig"]["spot"] = "true"
    assert problems(Exchange(**{**node.__dict__, "body": body})) == [
        'tpu.projects.locations.nodes.create: request Node.schedulingConfig.spot: "true" is not a boolean'
    ]


def test_a_wrong_response_field_fails(exchanges: list[Exchange]) -> None:
    got = first(exchanges, "compute.instances.get")
    for field, value in (("status", "READY"), ("id", 17), ("labels", [])):
        response = {**got.response, field: value}
        assert len(problems(Exchange(**{**got.__dict__, "response": response}))) == 1, field
    node = first(exchanges, "tpu.projects.locations.nodes.get")
    assert len(problems(Exchange(**{**node.__dict__, "response": {**node.response, "state": "RUNNING"}}))) == 1
