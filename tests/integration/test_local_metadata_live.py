"""A machine's metadata is live on its VMs: a `nodes.patch` or `instances.setMetadata` through Google's clients reaches
the metadata servers of the running VMs, whose scripts wait on the key with the metadata server's own hanging GET
(https://cloud.google.com/compute/docs/metadata/querying-metadata#waitforchange), as respawn's startup script learns
a new world (docs/design/several-slices.md, "Telling the machines"). Each VM runs a real bash script with curl."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.cloud import compute_v1, tpu_v2
from google.protobuf import field_mask_pb2
from test_local_compute_api import REGION, ZONE, connect, instance_template, mig, policy

from localcloud.apis.cloudapi import CloudApiServer
from localcloud.machines.nodes import Nodes
from localcloud.timeline import Timeline
from respawn.adapters.settings import client_options

pytestmark = pytest.mark.waits

REPO = Path(__file__).resolve().parents[2]
P, V5E_ZONE = "proj", "us-central1-a"
WORLD = '{"version": 2}'
# Each VM: read the key and its ETag, say it waits, wait for a change (at most $1 seconds), keep what came and when.
SCRIPT = """#!/bin/bash
url="http://$GCE_METADATA_HOST/computeMetadata/v1/instance/attributes/respawn-world"
tag=$(curl -s -o /dev/null -D - -H 'Metadata-Flavor: Google' "$url" | tr -d '\\r' | sed -n 's/^[Ee][Tt][Aa][Gg]: //p')
echo "$tag" > "$HOME/first-etag"
touch "$HOME/waiting"
curl -s -o "$HOME/world" -D "$HOME/headers" -w '%{http_code}' -H 'Metadata-Flavor: Google' \\
  "$url?wait_for_change=true&last_etag=$tag&timeout_sec=WAIT" > "$HOME/status"
date +%s.%N > "$HOME/done.part" && mv "$HOME/done.part" "$HOME/done"  # whole when it appears
"""


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[tuple[CloudApiServer, Nodes]]:
    with CloudApiServer(create_delay_s=0.05) as server:
        nodes = Nodes(
            project=P,
            base_env={**os.environ, "PYTHONPATH": str(REPO)},
            log_dir=tmp_path,
            grace_s=5,
            route=lambda entry: None,
            mark_preempted=server.preempt,
            timeline=Timeline(),
        )
        server.connect(
            on_ready=nodes.on_ready, on_deleted=lambda m: nodes.on_deleted(m.name), on_metadata=nodes.on_metadata
        )
        try:
            yield server, nodes
        finally:
            nodes.stop()


def homes(tmp_path: Path, machine: str, workers: int) -> list[Path]:
    return [tmp_path / machine / f"w-{i}" for i in range(workers)]


def wait_for(paths: list[Path], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, [p for p in paths if not p.exists()]
        time.sleep(0.05)


def etag(home: Path) -> str:
    lines = (home / "headers").read_text().splitlines()
    return next(line.split(":", 1)[1].strip() for line in lines if line.lower().startswith("etag:"))


def test_a_nodes_patch_wakes_every_worker_waiting_for_a_key_that_was_not_there(
    cloud: tuple[CloudApiServer, Nodes], tmp_path: Path
) -> None:
    server, _ = cloud
    tpu = tpu_v2.TpuClient(**client_options(server.url))
    script = SCRIPT.replace("WAIT", "60")
    node = tpu_v2.Node(accelerator_type="v5litepod-16", runtime_version="v2", metadata={"startup-script": script})
    tpu.create_node(parent=f"projects/{P}/locations/{V5E_ZONE}", node_id="n1", node=node).result(timeout=10)
    vms = homes(tmp_path, "n1", 4)  # a v5litepod-16 node: 4 worker VMs
    wait_for([h / "waiting" for h in vms])
    time.sleep(0.3)  # every curl is in its wait

    name = f"projects/{P}/locations/{V5E_ZONE}/nodes/n1"
    written = tpu_v2.Node(name=name, metadata={"startup-script": script, "respawn-world": WORLD})
    patched_at = time.time()
    tpu.update_node(node=written, update_mask=field_mask_pb2.FieldMask(paths=["metadata"])).result(timeout=10)
    wait_for([h / "done" for h in vms], timeout=10)

    for home in vms:
        assert (home / "status").read_text() == "200" and (home / "world").read_text() == WORLD
        assert etag(home) != (home / "first-etag").read_text().strip()  # the missing key's ETag, then the value's
        assert float((home / "done").read_text()) - patched_at < 3  # promptly, not at the 60 s timeout
    assert len({etag(h) for h in vms}) == 1  # the same value, the same ETag on every VM


def test_set_metadata_on_one_vm_of_a_slices_mig_wakes_that_vm_only(
    cloud: tuple[CloudApiServer, Nodes], tmp_path: Path
) -> None:
    server, _ = cloud
    api = connect(server)
    api.ok(api.policies.insert_unary(project=P, region=REGION, resource_policy_resource=policy("llm-a1", "4x4")))
    template = instance_template("llm-a1")
    template.properties.metadata.items.extend(
        [
            compute_v1.Items(key="startup-script", value=SCRIPT.replace("WAIT", "4")),
            compute_v1.Items(key="respawn-world", value='{"version": 1}'),
        ]
    )
    api.ok(api.templates.insert_unary(project=P, instance_template_resource=template))
    api.ok(api.migs.insert_unary(project=P, zone=ZONE, instance_group_manager_resource=mig("llm-a1", 4)))
    vms = homes(tmp_path, "llm-a1", 4)
    wait_for([h / "waiting" for h in vms])
    time.sleep(0.3)

    slice_ = server.machine("llm-a1")
    assert slice_ is not None
    vm = api.instances.get(project=P, zone=ZONE, instance=slice_.workers[1])
    items = [compute_v1.Items(key=i.key, value=i.value) for i in vm.metadata.items if i.key != "respawn-world"]
    items.append(compute_v1.Items(key="respawn-world", value=WORLD))
    body = compute_v1.Metadata(fingerprint=vm.metadata.fingerprint, items=items)
    written_at = time.time()
    api.ok(api.instances.set_metadata(project=P, zone=ZONE, instance=vm.name, metadata_resource=body))
    wait_for([vms[1] / "done"], timeout=3)
    assert float((vms[1] / "done").read_text()) - written_at < 2
    assert (vms[1] / "world").read_text() == WORLD

    wait_for([h / "done" for h in vms], timeout=10)  # the others: their 4 s timeout, with the value unchanged
    for home in (vms[0], vms[2], vms[3]):
        assert (home / "status").read_text() == "200" and (home / "world").read_text() == '{"version": 1}'
        assert etag(home) == (home / "first-etag").read_text().strip()
    assert etag(vms[1]) != (vms[1] / "first-etag").read_text().strip()
