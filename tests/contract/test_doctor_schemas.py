"""Every request `respawn doctor` sends to the local cloud's project APIs (localcloud/apis/project_api.py), and every
reply, held to Google's discovery documents (discovery.py): Service Usage, Policy Troubleshooter v3, Resource
Manager v3, Compute Engine, Cloud TPU, Artifact Registry and Org Policy. A healthy and a broken deployment, a GPU
job and TPU slices, a private Shared VPC, and a project with doctor's own APIs off, so that replies and refusals of
every method are seen; the methods seen are every method doctor calls there (the zone offerings through
google-cloud-compute and google-cloud-tpu, as `respawn submit` asks them: offerings.py)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace

import pytest
from discovery import Api

from localcloud.apis.cloudapi import CloudApiServer, Exchange
from localcloud.apis.project_state import LocalProject, add_network, healthy
from respawn.deployment import Settings
from respawn.jobs import JobSpec
from respawn.spec import parse_job_message
from respawn_cli.doctor import report
from respawn_cli.doctor.clients import Clients

PROJECT = "proj"
REPOSITORY = f"projects/{PROJECT}/locations/us/repositories/respawn"
JOB = {
    "action": "submit",
    "job_id": "schemas",
    "machine": {
        "kind": "gpu",
        "machine_type": "g2-standard-8",
        "accelerator_type": "nvidia-l4",
        "accelerator_count": 1,
    },
    "zones": ["us-central1-a", "us-west4-a"],
    "provisioning": "spot",
    "image": f"us-docker.pkg.dev/{PROJECT}/respawn/trainer:v1",
    "checkpoint_uri": "gs://ckpt/runs/schemas",
    "ttl": "1h",
}
SLICE = {
    **JOB,
    "machine": {"kind": "tpu", "accelerator_type": "v5litepod-16", "runtime_version": "v2-alpha-tpuv5-lite"},
}
DIGEST = {**JOB, "image": f"us-docker.pkg.dev/{PROJECT}/respawn/trainer@sha256:{'0' * 64}"}
# A Compute Engine TPU slice (a MIG) on a Shared VPC of HOST, without external IPs: routers.list in the host project,
# the project's number, the MIG agent's grant on the host subnetwork
HOST = "host-proj"
COMPUTE_SLICE = {**JOB, "machine": {"kind": "tpu", "accelerator_type": "v6e-16"}, "zones": ["us-east5-b"]}
APIS = {
    name: Api.load(name)
    for name in (
        "serviceusage.v1",
        "policytroubleshooter.v3",
        "cloudresourcemanager.v3",
        "compute.v1",
        "tpu.v2",
        "artifactregistry.v1",
        "orgpolicy.v2",
    )
}
SERVED = {
    "serviceusage.services.list",
    "policytroubleshooter.iam.troubleshoot",
    "compute.regions.get",
    "compute.networks.get",
    "compute.subnetworks.get",
    "compute.firewalls.list",
    "compute.routers.list",
    "cloudresourcemanager.projects.get",
    "compute.machineTypes.get",
    "compute.acceleratorTypes.get",
    "tpu.projects.locations.acceleratorTypes.get",
    "artifactregistry.projects.locations.repositories.packages.tags.get",
    "artifactregistry.projects.locations.repositories.packages.versions.get",
    "orgpolicy.projects.policies.getEffectivePolicy",
}


def spec(message: Mapping[str, object]) -> JobSpec:
    parsed = parse_job_message(message)
    assert isinstance(parsed, JobSpec)
    return parsed


@pytest.fixture(scope="module")
def exchanges() -> Iterator[list[Exchange]]:
    """A doctor run per job on a healthy project, and one on a project missing what each method looks up. Storage
    and Pub/Sub go to no server here (their lines fail): those are the emulators' APIs, not the local cloud's."""
    with CloudApiServer(record=True) as server:
        settings = Settings(
            project=PROJECT,
            state_bucket="state",
            network=f"projects/{PROJECT}/global/networks/respawn",
            subnetwork="ml",
            external_ips=True,
        )
        clients = Clients(
            {
                api: server.url
                for api in (
                    "serviceusage",
                    "policytroubleshooter",
                    "cloudresourcemanager",
                    "compute",
                    "tpu",
                    "artifactregistry",
                    "orgpolicy",
                )
            }
            | {"storage": "http://127.0.0.1:9", "pubsub": "http://127.0.0.1:9"}
        )

        def fresh() -> LocalProject:
            return healthy(PROJECT, state_bucket="state", checkpoint_bucket="ckpt", repository=REPOSITORY,
                           image="trainer", tag="v1")  # fmt: skip

        try:
            for message in (JOB, SLICE, DIGEST):
                server.project.project = fresh()
                list(report.run(report.deployment(settings, clients=clients), "respawn-status", spec(message)))
            broken = fresh()
            broken.networks.clear()
            broken.subnetworks.clear()
            broken.quotas.clear()
            broken.org_policies["compute.vmExternalIpAccess"] = {"rules": [{"denyAll": True}]}
            broken.org_policies["gcp.resourceLocations"] = {
                "rules": [{"values": {"allowedValues": ["in:eu-locations"]}}]
            }
            server.project.project = broken
            server.unoffered = {
                zone: frozenset({"g2-standard-8", "v5litepod-16"}) for zone in ("us-central1-a", "us-west4-a")
            }
            d = report.deployment(replace(settings, subnetwork="ml"), clients=clients)
            for message in (JOB, SLICE):
                list(report.run(d, "respawn-status", spec(message)))
            server.unoffered = {}
            shared = replace(settings, network=f"projects/{HOST}/global/networks/shared", external_ips=False)
            d = report.deployment(shared, clients=clients)
            for off in ((), ("policytroubleshooter.googleapis.com", "cloudresourcemanager.googleapis.com")):
                server.project.project = private = fresh()
                add_network(private, HOST, "shared", "ml")
                private.apis -= set(off)
                private.refused |= {"routers"} if off else set()
                list(report.run(d, "respawn-status", spec(COMPUTE_SLICE)))
        finally:
            clients.close()
        yield server.exchanges


def api_of(exchange: Exchange) -> Api:
    path = exchange.path
    if path.startswith("/compute/"):
        return APIS["compute.v1"]
    if path.startswith("/v2/") and "/policies/" in path:
        return APIS["orgpolicy.v2"]
    if path.startswith("/v2/"):
        return APIS["tpu.v2"]
    if path == "/v3/iam:troubleshoot":
        return APIS["policytroubleshooter.v3"]
    if path.startswith("/v3/projects/"):
        return APIS["cloudresourcemanager.v3"]
    return APIS["artifactregistry.v1"] if "/repositories/" in path else APIS["serviceusage.v1"]


def problems(exchange: Exchange) -> list[str]:
    """What in this request or its reply Google's definition of the method refuses."""
    return api_of(exchange).exchange_problems(exchange)


def test_every_request_and_reply_conforms(exchanges: list[Exchange]) -> None:
    assert len(exchanges) > 100
    found = sorted({p for e in exchanges for p in problems(e)})
    assert found == [], "\n".join(found)


def test_every_method_doctor_calls_was_seen_answering_and_refusing(exchanges: list[Exchange]) -> None:
    seen = {(m.id, e.status < 300) for e in exchanges if (m := api_of(e).method(e.method, e.path)) is not None}
    assert {method for method, _ in seen} == SERVED
    refused = {method for method, ok in seen if not ok}
    assert {
        "compute.networks.get",
        "compute.routers.list",
        "cloudresourcemanager.projects.get",
        "policytroubleshooter.iam.troubleshoot",
        "compute.machineTypes.get",
        "tpu.projects.locations.acceleratorTypes.get",
        "artifactregistry.projects.locations.repositories.packages.versions.get",
    } <= refused


def test_a_wrong_reply_field_fails(exchanges: list[Exchange]) -> None:
    region = next(e for e in exchanges if e.path.endswith("/regions/us-central1") and e.status == 200)
    wrong = {**region.response, "quotas": [{"metric": "NO_SUCH_METRIC", "limit": 1.0, "usage": 0.0}]}
    assert len(problems(replace(region, response=wrong))) == 1
    troubleshoot = next(e for e in exchanges if e.path == "/v3/iam:troubleshoot" and e.status == 200)
    assert len(problems(replace(troubleshoot, response={"overallAccessState": "MAYBE"}))) == 1
