"""What GcpTpuProvider asks the Cloud TPU API v2 for, held to documented request bodies (no server involved)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from google.cloud import tpu_v2
from google.protobuf import json_format

from respawn.actions import CreateMachine
from respawn.adapters.tpu import GcpTpuProvider, any_reservation
from respawn.bootstrap import FirstUse, machine_providers
from respawn.deployment import Settings
from respawn.jobs import JobSpec, Tier, TpuMachine

DATA = Path(__file__).parent.parent / "data"
PROJECT, ZONE = "my-project", "us-central2-b"


def spec(provisioning: str, reservation: str | None = None) -> JobSpec:
    return JobSpec(
        job_id="llm",
        machine=TpuMachine("v4-8", "tpu-ubuntu2204-base"),
        zones=(ZONE,),
        image="us-docker.pkg.dev/p/r/trainer:1",
        checkpoint_uri="gs://b/llm",
        tiers=(Tier(provisioning, (ZONE,), reservation),),
    )


def body(provisioning: str, reservation: str | None = None) -> dict[str, Any]:
    """The queued resource's REST body (camelCase JSON), as the adapter builds it for attempt 1 in ZONE."""
    provider = GcpTpuProvider(PROJECT, endpoint="http://127.0.0.1:1")  # never called
    qr = provider.queued_resource(CreateMachine("llm", 1, "llm-a1", ZONE, None), spec(provisioning, reservation))
    out: dict[str, Any] = json_format.MessageToDict(tpu_v2.QueuedResource.pb(qr))  # as the REST transport sends it
    return out


def test_a_reservation_tier_asks_for_reserved_capacity_as_gclouds_ga_reserved_does() -> None:
    """gcloud compute tpus queued-resources create --reserved (API v2): reservationName `.../reservations/-` and no
    tier (tests/data/tpu_queued_resource_reserved.json, SOURCES.md)."""
    documented = json.loads((DATA / "tpu_queued_resource_reserved.json").read_text())
    got = body("reservation", "tpu-res-1")
    assert got["reservationName"] == documented["reservationName"].replace("my-project", PROJECT)
    assert (
        got["reservationName"]
        == any_reservation(PROJECT, ZONE)
        == f"projects/{PROJECT}/locations/{ZONE}/reservations/-"
    )
    tiers = {"spot", "guaranteed"}
    assert tiers.isdisjoint(documented) and tiers.isdisjoint(got)  # neither names a tier
    assert "tpu-res-1" not in json.dumps(got)  # a named reservation is a v2alpha1 form


@pytest.mark.parametrize(
    ("provisioning", "tier"), [("spot", "spot"), ("preemptible", "spot"), ("standard", "guaranteed")]
)
def test_other_tiers_name_their_tier_and_no_reservation(provisioning: str, tier: str) -> None:
    got = body(provisioning)
    assert tier in got and "reservationName" not in got


def test_a_cloud_tpu_node_carries_the_zones_mtbi_for_its_trainer() -> None:
    provider = GcpTpuProvider(PROJECT, endpoint="http://127.0.0.1:1")  # never called
    action = CreateMachine("llm", 1, "llm-a1", ZONE, None, mtbi_s=7200.0)
    qr = provider.queued_resource(action, spec("spot"))
    metadata = dict(qr.tpu.node_spec[0].node.metadata)
    assert metadata["respawn-mtbi-s"] == "7200" and "-e RESPAWN_MTBI_S=7200 " in metadata["startup-script"]


def test_a_node_and_a_queued_resource_name_the_deployments_network_without_external_ips() -> None:
    """RESPAWN_NETWORK, RESPAWN_SUBNETWORK and RESPAWN_EXTERNAL_IP, read as the functions read them, fill the
    node's networkConfig, alone and inside a queued resource; the subnetwork is the one in the zone's region."""
    env = {
        "RESPAWN_PROJECT": PROJECT,
        "RESPAWN_NETWORK": "projects/host/global/networks/team-vpc",
        "RESPAWN_SUBNETWORK": "ml-subnet",
        "RESPAWN_EXTERNAL_IP": "false",
        "RESPAWN_TPU_ENDPOINT": "http://127.0.0.1:9",  # never called
        "RESPAWN_COMPUTE_ENDPOINT": "http://127.0.0.1:9",
    }
    deferred = machine_providers(Settings.from_env(env))["tpu"]
    assert isinstance(deferred, FirstUse)  # built at its first call
    provider = deferred.provider
    assert isinstance(provider, GcpTpuProvider)
    action = CreateMachine("llm", 1, "llm-a1", ZONE, None)
    expected = {
        "network": "projects/host/global/networks/team-vpc",
        "subnetwork": "projects/host/regions/us-central2/subnetworks/ml-subnet",
    }  # enableExternalIps false: left out of the JSON, as proto3 leaves every default
    node = json_format.MessageToDict(tpu_v2.Node.pb(provider.node(action, spec("spot"))))
    assert node["networkConfig"] == expected
    qr = json_format.MessageToDict(tpu_v2.QueuedResource.pb(provider.queued_resource(action, spec("spot"))))
    assert qr["tpu"]["nodeSpec"][0]["node"]["networkConfig"] == expected


def test_unset_a_node_is_on_the_default_network_with_external_ips() -> None:
    assert body("spot")["tpu"]["nodeSpec"][0]["node"]["networkConfig"] == {"enableExternalIps": True}
