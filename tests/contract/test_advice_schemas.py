"""GcpAdvisor against the local Advice API, every request and reply held to Google's compute v1 discovery document
(discovery.py), which has both methods respawn calls: compute.advice.capacity and compute.advice.capacityHistory.

The scenarios ask as placement does (a Spot GPU machine type over zones, an N1 machine type with GPUs attached), plus
a history of both types in one zone so that the preemption records the adapter does not ask for are checked too.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from discovery import Api
from google.cloud import compute_v1

from localcloud.apis.cloudapi import CloudApiServer, Exchange
from respawn.adapters.advice import GcpAdvisor
from respawn.adapters.settings import client_options

COMPUTE_API = Api.load("compute.v1")
ADVICE = Path(__file__).parents[2] / "functions" / "respawn" / "adapters" / "advice.py"
PROJECT, REGION = "proj", "us-central1"


@pytest.fixture(scope="module")
def exchanges() -> Iterator[list[Exchange]]:
    with CloudApiServer(record=True, advice_mtbi_s={"us-central1-b": 900.0}) as server:
        advisor = GcpAdvisor(server.url)
        advisor.advise(PROJECT, REGION, "a3-highgpu-8g", "spot", ["us-central1-a", "us-central1-b"])
        advisor.advise(PROJECT, REGION, "n1-standard-8", "spot", ["us-central1-c"], accelerators=[("nvidia-l4", 1)])
        client = compute_v1.AdviceClient(**client_options(server.url))
        client.capacity_history(
            project=PROJECT,
            region=REGION,
            capacity_history_request_resource=compute_v1.CapacityHistoryRequest(
                instance_properties={"machine_type": "g2-standard-4", "scheduling": {"provisioning_model": "SPOT"}},
                location_policy={"location": "zones/us-central1-a"},
                types=["PREEMPTION", "PRICE"],
            ),
        )
        yield server.exchanges


def problems(exchange: Exchange) -> list[str]:
    """What in this request or its reply Google's definition of the method refuses."""
    return COMPUTE_API.exchange_problems(exchange)


def test_every_request_and_reply_conforms(exchanges: list[Exchange]) -> None:
    assert {e.status for e in exchanges} == {200}
    found = sorted({p for e in exchanges for p in problems(e)})
    assert found == [], "\n".join(found)


def test_the_methods_checked_are_those_the_adapter_calls(exchanges: list[Exchange]) -> None:
    called = {
        re.sub(r"_(\w)", lambda m: m.group(1).upper(), c)
        for c in re.findall(r"self\.client\.(\w+)\(", ADVICE.read_text())
    }
    covered = {m.id for e in exchanges if (m := COMPUTE_API.method(e.method, e.path)) is not None}
    assert (
        covered
        == {f"compute.advice.{c}" for c in called}
        == {"compute.advice.capacity", "compute.advice.capacityHistory"}
    )


def test_the_replies_hold_every_figure(exchanges: list[Exchange]) -> None:
    replies = [str(e.response) for e in exchanges]
    for seen in ("estimatedUptime", "obtainability", "priceHistory", "preemptionHistory", "guestAccelerators"):
        assert any(seen in r for r in replies) or any(seen in str(e.body) for e in exchanges), seen


def test_a_wrong_field_fails(exchanges: list[Exchange]) -> None:
    capacity = next(e for e in exchanges if e.path.endswith("/capacity"))
    assert problems(capacity) == []
    body = copy.deepcopy(capacity.body)
    body["distributionPolicy"]["targetShape"] = "ONE_ZONE"
    assert len(problems(Exchange(**{**capacity.__dict__, "body": body}))) == 1
    response = copy.deepcopy(capacity.response)
    response["recommendations"][0]["scores"]["estimatedUptime"] = 3600
    assert len(problems(Exchange(**{**capacity.__dict__, "response": response}))) == 1
    history = next(e for e in exchanges if e.path.endswith("/capacityHistory"))
    response = copy.deepcopy(history.response)
    response["priceHistory"][0]["listPrice"]["units"] = 3
    assert len(problems(Exchange(**{**history.__dict__, "response": response}))) == 1
