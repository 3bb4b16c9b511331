"""The local Advice API's figures (seeded, the zone's MTBI when given) and what it refuses, as Google documents."""

from __future__ import annotations

from typing import Any

import pytest

from localcloud.apis.advice_api import AdviceApi
from localcloud.apis.apicore import ApiError, CloudCore

CAPACITY = "/compute/v1/projects/p/regions/us-central1/advice/capacity"
HISTORY = "/compute/v1/projects/p/regions/us-central1/advice/capacityHistory"


def capacity_body(machine_type: str = "g2-standard-4", model: str = "SPOT", *zones: str) -> dict[str, Any]:
    return {
        "instanceProperties": {"scheduling": {"provisioningModel": model}},
        "instanceFlexibilityPolicy": {"instanceSelections": {"x": {"machineTypes": [machine_type]}}},
        "distributionPolicy": {"zones": [{"zone": f"zones/{z}"} for z in zones or ("us-central1-a",)]},
        "size": 2,
    }


def history_body(machine_type: str = "g2-standard-4", model: str = "SPOT", **extra: Any) -> dict[str, Any]:
    return {"instanceProperties": {"machineType": machine_type, "scheduling": {"provisioningModel": model}}, **extra}


def test_figures_are_fixed_by_the_seed_and_the_zone() -> None:
    one, same, other = AdviceApi(CloudCore(), seed=1), AdviceApi(CloudCore(), seed=1), AdviceApi(CloudCore(), seed=2)
    zones = [f"us-central1-{z}" for z in "abcf"]
    figures = [(a.uptime_s(z, "g2"), a.obtainability(z, "g2")) for a in (one, same, other) for z in zones]
    assert figures[:4] == figures[4:8] != figures[8:]
    for uptime, obtainability in figures:
        assert 3600 <= uptime <= 24 * 3600 and uptime % 60 == 0
        assert 0.3 <= obtainability <= 1.0
    assert 0.5 <= one.price_per_hour("us-central1", "g2") <= 5.0


def test_a_zones_mtbi_is_its_estimated_uptime() -> None:
    api = AdviceApi(CloudCore(), mtbi_s={"us-central1-a": 20.0})
    reply = api.route("POST", CAPACITY, {}, capacity_body())
    (recommendation,) = reply["recommendations"]
    assert recommendation["scores"]["estimatedUptime"] == "20s"
    assert recommendation["shards"] == [
        {"zone": "us-central1-a", "machineType": "g2-standard-4", "provisioningModel": "SPOT", "instanceCount": 2}
    ]


def test_capacity_recommends_the_most_obtainable_zone_and_uptime_for_spot_only() -> None:
    api = AdviceApi(CloudCore())
    zones = ("us-central1-a", "us-central1-b", "us-central1-c")
    best = max(zones, key=lambda z: api.obtainability(z, "g2-standard-4"))
    reply = api.route("POST", CAPACITY, {}, capacity_body("g2-standard-4", "STANDARD", *zones))
    (recommendation,) = reply["recommendations"]
    assert recommendation["shards"][0]["zone"] == best
    assert recommendation["scores"] == {"obtainability": api.obtainability(best, "g2-standard-4")}


def test_history_answers_the_types_asked() -> None:
    api = AdviceApi(CloudCore())
    prices = api.route("POST", HISTORY, {}, history_body(types=["PRICE"]))
    assert "preemptionHistory" not in prices
    newest = prices["priceHistory"][-1]
    assert "endTime" not in newest["interval"]
    money = newest["listPrice"]
    assert int(money["units"]) + money["nanos"] / 1e9 == pytest.approx(
        api.price_per_hour("us-central1", "g2-standard-4")
    )
    both = api.route("POST", HISTORY, {}, history_body(locationPolicy={"location": "zones/us-central1-b"}))
    assert len(both["preemptionHistory"]) == 30 and len(both["priceHistory"]) == 3
    assert both["location"].endswith("/projects/p/zones/us-central1-b")


@pytest.mark.parametrize(
    ("path", "body", "says"),
    [
        (CAPACITY, capacity_body("ct6e-standard-8t"), "does not support TPU machine type ct6e-standard-8t"),
        (CAPACITY, capacity_body("v6e-8"), "does not support TPU"),
        (CAPACITY, capacity_body("g2-standard-4", "SPOT", "europe-west4-a"), "europe-west4-a is not in us-central1"),
        (CAPACITY, capacity_body("g2-standard-4", "CHEAP"), "provisioningModel"),
        (HISTORY, history_body(model="STANDARD"), "it must be SPOT"),
        (HISTORY, history_body("tpu7x-standard-4t"), "does not support TPU"),
        (HISTORY, history_body(types=["COST"]), "'types'"),
        (HISTORY, history_body(locationPolicy={"location": "regions/us-east1"}), "not in us-central1"),
    ],
)
def test_refusals(path: str, body: dict[str, Any], says: str) -> None:
    with pytest.raises(ApiError) as refused:
        AdviceApi(CloudCore()).route("POST", path, {}, body)
    assert refused.value.code == 400
    assert says in refused.value.message


def test_only_the_two_methods_are_served() -> None:
    api = AdviceApi(CloudCore())
    assert api.owns(CAPACITY) and api.owns(HISTORY)
    assert not api.owns("/compute/v1/projects/p/regions/us-central1/advice/calendarMode")
    assert not api.owns("/compute/v1/projects/p/zones/us-central1-a/instances")
    assert api.route("GET", CAPACITY, {}, {}) is None
