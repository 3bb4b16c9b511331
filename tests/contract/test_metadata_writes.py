"""The metadata writes a new world takes (docs/design/several-slices.md, "Telling the machines"), on the local APIs
through Google's own clients: Cloud TPU v2 `nodes.patch` with `updateMask=metadata`, Compute Engine
`instances.setMetadata` with the instance's fingerprint, on a VM and on a VM of a slice's MIG. What the APIs refuse
(a mask nodes.patch does not take, a stale fingerprint: 412 conditionNotMet) and every request and reply held to
Google's discovery documents (discovery.py). Each write reaches the local cloud's `on_metadata` hook, the way to the
metadata servers of the machine's VMs (tests/integration/test_local_metadata_live.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
import requests
from discovery import Api
from google.api_core import exceptions as gexc
from google.cloud import compute_v1, tpu_v2
from google.protobuf import field_mask_pb2

from localcloud.apis.cloudapi import CloudApiServer, CloudMachine
from respawn.actions import CreateMachine
from respawn.adapters.compute import GcpComputeProvider
from respawn.adapters.settings import ProviderSettings, client_options
from respawn.jobs import GpuMachine, JobSpec, MachineSpec, MachineState, TpuMachine

pytestmark = pytest.mark.waits

P, ZONE, V6E = "proj", "us-central1-a", "us-east5-b"  # ZONE offers v5e and L4, V6E v6e (localcloud/apis/offerings.py)
NODE = f"projects/{P}/locations/{ZONE}/nodes/n1"
WORLD = '{"version": 2, "members": ["llm-a1", "llm-a2"]}'
SETTINGS = ProviderSettings(service_account="m@proj.iam.gserviceaccount.com", create_wait_s=10, read_retry_s=0)
TPU_API, COMPUTE_API = Api.load("tpu.v2"), Api.load("compute.v1")


@dataclass
class Local:
    server: CloudApiServer
    tpu: tpu_v2.TpuClient
    instances: compute_v1.InstancesClient
    written: list[CloudMachine] = field(default_factory=list)  # what on_metadata heard, in order

    def heard(self, count: int) -> list[tuple[str, dict[str, str]]]:
        deadline = time.monotonic() + 5
        while len(self.written) < count:
            assert time.monotonic() < deadline, self.written
            time.sleep(0.02)
        return [(m.name, m.metadata) for m in self.written]


@pytest.fixture
def local() -> Iterator[Local]:
    with CloudApiServer(create_delay_s=0.02, record=True) as server:
        opts = client_options(server.url)
        got = Local(server, tpu_v2.TpuClient(**opts), compute_v1.InstancesClient(**opts))
        server.connect(on_ready=None, on_deleted=None, on_metadata=got.written.append)
        yield got
        found = sorted({p for e in server.exchanges for p in api_of(e.path).exchange_problems(e)})
        assert found == [], "\n".join(found)  # every request and reply the test made, as Google defines them


def api_of(path: str) -> Api:
    return TPU_API if path.startswith("/v2/") else COMPUTE_API


def a_node(local: Local, **metadata: str) -> tpu_v2.Node:
    node = tpu_v2.Node(accelerator_type="v5litepod-16", runtime_version="v2-alpha-tpuv5-lite", metadata=metadata)
    return local.tpu.create_node(parent=f"projects/{P}/locations/{ZONE}", node_id="n1", node=node).result(timeout=10)


def patch(local: Local, node: tpu_v2.Node, *paths: str) -> tpu_v2.Node:
    mask = field_mask_pb2.FieldMask(paths=list(paths))
    result: tpu_v2.Node = local.tpu.update_node(node=node, update_mask=mask).result(timeout=10)
    return result


def raw_patch(local: Local, mask: str | None, body: dict[str, object]) -> requests.Response:
    query = {} if mask is None else {"updateMask": mask}
    return requests.patch(f"{local.server.url}/v2/{NODE}", params=query, json=body, timeout=10)


# ------------------------------------------------------------------------------------------------ nodes.patch


def test_nodes_patch_replaces_the_metadata_and_tells_the_machines(local: Local) -> None:
    a_node(local, **{"startup-script": "#!/bin/bash", "respawn-world": "{}"})
    world = {"startup-script": "#!/bin/bash", "respawn-world": WORLD}
    patched = patch(local, tpu_v2.Node(name=NODE, metadata=world), "metadata")
    assert dict(patched.metadata) == {"startup-script": "#!/bin/bash", "respawn-world": WORLD}
    assert patched.state == tpu_v2.Node.State.READY and patched.accelerator_type == "v5litepod-16"
    assert dict(local.tpu.get_node(name=NODE).metadata)["respawn-world"] == WORLD
    assert local.heard(1) == [("n1", {"startup-script": "#!/bin/bash", "respawn-world": WORLD})]
    op = next(e.response for e in local.server.exchanges if e.method == "PATCH")
    assert op["done"] and op["metadata"]["verb"] == "update" and op["metadata"]["target"] == NODE


def test_nodes_patch_changes_only_the_masked_fields(local: Local) -> None:
    a_node(local, **{"respawn-world": "{}"})
    patched = patch(local, tpu_v2.Node(name=NODE, labels={"team": "nlp"}, metadata={"ignored": "1"}), "labels")
    assert dict(patched.labels) == {"team": "nlp"} and dict(patched.metadata) == {"respawn-world": "{}"}
    assert local.written == []  # no metadata written
    # a masked field the body leaves out is cleared (google.aip.dev/134); snake_case paths are read too
    reply = raw_patch(
        local, "metadata,network_config.enable_external_ips", {"networkConfig": {"enableExternalIps": True}}
    )
    assert reply.status_code == 200, reply.text
    node = local.tpu.get_node(name=NODE)
    assert dict(node.metadata) == {} and node.network_config.enable_external_ips


@pytest.mark.parametrize(
    "mask",
    [None, "", "acceleratorType", "metadata,schedulingConfig", "runtime_version", "metadata.respawn-world"],
)
def test_nodes_patch_refuses_a_mask_it_does_not_take(local: Local, mask: str | None) -> None:
    a_node(local, **{"respawn-world": "{}"})
    reply = raw_patch(local, mask, {"metadata": {"respawn-world": WORLD}, "acceleratorType": "v5litepod-32"})
    assert reply.status_code == 400
    assert reply.json()["error"]["status"] == "INVALID_ARGUMENT"
    node = local.tpu.get_node(name=NODE)
    assert dict(node.metadata) == {"respawn-world": "{}"} and node.accelerator_type == "v5litepod-16"
    with pytest.raises(gexc.BadRequest):
        patch(local, tpu_v2.Node(name=NODE, runtime_version="other"), "runtime_version")


def test_nodes_patch_of_a_missing_node_is_not_found(local: Local) -> None:
    with pytest.raises(gexc.NotFound):
        patch(local, tpu_v2.Node(name=NODE, metadata={"respawn-world": WORLD}), "metadata")


# ------------------------------------------------------------------------------------------------ setMetadata


def spec(machine: MachineSpec, zone: str) -> JobSpec:
    return JobSpec(
        job_id="llm",
        machine=machine,
        zones=(zone,),
        image="us-docker.pkg.dev/proj/repo/trainer:1",
        checkpoint_uri="gs://ckpt/llm",
        ttl_s=7200,
    )


def created(local: Local, machine: MachineSpec, zone: str) -> str:
    """A READY machine made by respawn's own Compute adapter; its name."""
    gce = GcpComputeProvider(P, endpoint=local.server.url, settings=SETTINGS, clock=time.time)
    job = spec(machine, zone)
    gce.create(CreateMachine("llm", 1, "llm-a1", zone, time.time() + 3600), job)
    deadline = time.monotonic() + 10
    while (m := gce.get("llm-a1", zone, job)) is None or m.state is not MachineState.READY:
        assert time.monotonic() < deadline, m
        time.sleep(0.02)
    return "llm-a1"


def set_metadata(
    local: Local, zone: str, name: str, fingerprint: str | None, **items: str
) -> Callable[[], compute_v1.Operation]:
    metadata = compute_v1.Metadata(items=[compute_v1.Items(key=k, value=v) for k, v in items.items()])
    if fingerprint is not None:
        metadata.fingerprint = fingerprint
    return lambda: local.instances.set_metadata(project=P, zone=zone, instance=name, metadata_resource=metadata)


def items(vm: compute_v1.Instance) -> dict[str, str]:
    return {i.key: i.value for i in vm.metadata.items}


def test_set_metadata_with_the_current_fingerprint_replaces_the_metadata(local: Local) -> None:
    name = created(local, GpuMachine("g2-standard-8", "nvidia-l4", 1), ZONE)
    vm = local.instances.get(project=P, zone=ZONE, instance=name)
    before, fingerprint = items(vm), vm.metadata.fingerprint
    assert fingerprint and before["respawn-job-id"] == "llm"
    op = set_metadata(local, ZONE, name, fingerprint, **before, **{"respawn-world": WORLD})()
    assert op.status == compute_v1.Operation.Status.DONE and not op.error.errors
    assert op.operation_type == "setMetadata" and op.target_link.endswith(f"/zones/{ZONE}/instances/{name}")
    after = local.instances.get(project=P, zone=ZONE, instance=name)
    assert items(after) == {**before, "respawn-world": WORLD}
    assert after.metadata.fingerprint not in ("", fingerprint)  # it changes with every write
    assert local.heard(1) == [(name, {**before, "respawn-world": WORLD})]
    # the same write again, with the fingerprint it read before the first: refused, nothing changes
    for stale in (fingerprint, None):
        with pytest.raises(gexc.PreconditionFailed) as e:
            set_metadata(local, ZONE, name, stale, **{"respawn-world": "{}"})()
        assert e.value.code == 412 and [x["reason"] for x in e.value.errors] == ["conditionNotMet"]
    assert items(local.instances.get(project=P, zone=ZONE, instance=name)) == {**before, "respawn-world": WORLD}
    assert len(local.written) == 1


@pytest.mark.parametrize("key", ["respawn world", "", "x" * 129])
def test_set_metadata_refuses_a_key_the_schema_does_not_allow(local: Local, key: str) -> None:
    name = created(local, GpuMachine("g2-standard-8", "nvidia-l4", 1), ZONE)
    fingerprint = local.instances.get(project=P, zone=ZONE, instance=name).metadata.fingerprint
    with pytest.raises(gexc.BadRequest, match="key"):
        set_metadata(local, ZONE, name, fingerprint, **{key: "1"})()


def test_set_metadata_of_a_missing_instance_is_not_found(local: Local) -> None:
    with pytest.raises(gexc.NotFound):
        set_metadata(local, ZONE, "nobody", "AAAA", **{"respawn-world": WORLD})()


def test_set_metadata_on_one_vm_of_a_slices_mig(local: Local) -> None:
    """A multi-host slice is a MIG (compute/migs.py): a world goes to each of its VMs, one setMetadata each, and
    each VM keeps its own metadata (agent-worker-number)."""
    name = created(local, TpuMachine("v6e-16", api="compute"), V6E)
    slice_ = local.server.machine(name)
    assert slice_ is not None and len(slice_.workers) == 4
    vm = slice_.workers[1]
    got = local.instances.get(project=P, zone=V6E, instance=vm)
    before = items(got)
    assert before["agent-worker-number"] == "1"
    set_metadata(local, V6E, vm, got.metadata.fingerprint, **before, **{"respawn-world": WORLD})()
    assert items(local.instances.get(project=P, zone=V6E, instance=vm))["respawn-world"] == WORLD
    others = [local.instances.get(project=P, zone=V6E, instance=w) for w in slice_.workers if w != vm]
    assert all("respawn-world" not in items(o) for o in others)
    assert local.heard(1) == [(vm, {**before, "respawn-world": WORLD})]
