"""The discovery-document checker itself, on hand-made bodies: a correct one passes, each kind of wrong one fails."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from discovery import Api

COMPUTE = Api.load("compute.v1")
TPU = Api.load("tpu.v2")

MIG: dict[str, Any] = {
    "name": "llm-a1",
    "description": "respawn",
    "instanceTemplate": "projects/p/global/instanceTemplates/llm-a1",
    "baseInstanceName": "llm-a1",
    "targetSize": 4,
    "instanceLifecyclePolicy": {"defaultActionOnFailure": "DO_NOTHING"},
    "updatePolicy": {"type": "OPPORTUNISTIC"},
}
INSTANCE: dict[str, Any] = {
    "id": "1234567890123",
    "name": "gpu-a1",
    "status": "RUNNING",
    "labels": {"respawn-job": "gpu"},
    "scheduling": {"provisioningModel": "SPOT", "maxRunDuration": {"seconds": "7200"}},
    "disks": [{"boot": True, "initializeParams": {"diskSizeGb": "200"}}],
    "guestAccelerators": [{"acceleratorType": "nvidia-l4", "acceleratorCount": 1}],
    "creationTimestamp": "2025-01-01T00:00:00.000-08:00",
}


def test_methods_are_found_by_verb_and_path() -> None:
    insert = COMPUTE.method("POST", "/compute/v1/projects/p/zones/us-central1-a/instanceGroupManagers")
    assert insert is not None and insert.id == "compute.instanceGroupManagers.insert"
    assert (insert.request, insert.response) == ("InstanceGroupManager", "Operation")
    wait = COMPUTE.method("POST", "/compute/v1/projects/p/regions/us-central1/operations/operation-1/wait")
    assert wait is not None and wait.id == "compute.regionOperations.wait"
    node = TPU.method("GET", "/v2/projects/p/locations/us-central1-a/nodes/n")
    assert node is not None and (node.id, node.response) == ("tpu.projects.locations.nodes.get", "Node")
    assert COMPUTE.method("PUT", "/compute/v1/projects/p/zones/z/instanceGroupManagers") is None
    assert TPU.method("GET", "/v2/projects/p/locations/z/nodes/n/extra") is None


def test_a_correct_body_passes() -> None:
    assert COMPUTE.check("InstanceGroupManager", MIG) == []
    assert COMPUTE.check("Instance", INSTANCE) == []
    node = {"acceleratorType": "v5litepod-8", "state": "READY", "labels": {"a": "b"}}
    node["schedulingConfig"] = {"spot": True}
    assert TPU.check("Node", node) == []


def wrong(body: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    """`body` with the field at `path` set to `value`."""
    changed = copy.deepcopy(body)
    where: Any = changed
    for key in path[:-1]:
        where = where[key]
    where[path[-1]] = value
    return changed


@pytest.mark.parametrize(
    ("path", "value", "problem"),
    [
        (("targetSizes",), 4, "InstanceGroupManager.targetSizes: not a field"),  # unknown property
        (("targetSize",), "4", 'targetSize: "4" is not an integer'),  # int32 as a string
        (("targetSize",), True, "is not an integer"),  # a boolean is no integer
        (("targetSize",), 2**40, "outside int32"),
        (("name",), 7, "name: 7 is not a string"),
        (("updatePolicy", "type"), "EAGER", "'EAGER' is not one of"),  # enum
        (("instanceLifecyclePolicy", "onFailure"), "x", "instanceLifecyclePolicy.onFailure: not a field"),  # nested
        (("instanceLifecyclePolicy",), [], "is not an object"),
    ],
)
def test_a_wrong_mig_fails(path: tuple[str, ...], value: Any, problem: str) -> None:
    problems = COMPUTE.check("InstanceGroupManager", wrong(MIG, path, value))
    assert len(problems) == 1 and problem in problems[0], problems


@pytest.mark.parametrize(
    ("path", "value", "problem"),
    [
        (("id",), 1234567890123, "is not a decimal string"),  # uint64 is a JSON string
        (("id",), "12ab", "is not a uint64"),
        (("labels", "respawn-job"), 5, "Instance.labels['respawn-job']: 5 is not a string"),  # map values
        (("labels",), ["a"], "is not an object"),
        (("disks", 0, "boot"), "true", 'Instance.disks[0].boot: "true" is not a boolean'),  # array items
        (("disks", 0, "initializeParams", "diskSizeGb"), 200, "is not a decimal string"),  # int64
        (("disks",), {"boot": True}, "is not an array"),
        (("scheduling", "provisioningModel"), "SPOTTY", "'SPOTTY' is not one of"),
        (("scheduling", "maxRunDuration", "seconds"), 7200, "is not a decimal string"),
        (("scheduling", "maxRunDuration", "nanos"), 1.5, "is not an integer"),
        (("status",), "READY", "'READY' is not one of"),
    ],
)
def test_a_wrong_instance_fails(path: tuple[str | int, ...], value: Any, problem: str) -> None:
    problems = COMPUTE.check("Instance", wrong(INSTANCE, path, value))
    assert len(problems) == 1 and problem in problems[0], problems


def test_tpu_formats() -> None:
    assert TPU.check("QueuedResource", {"queueingPolicy": {"validUntilTime": "2033-05-18T03:33:20Z"}}) == []
    assert "not an RFC 3339 timestamp" in TPU.check("QueuedResource", {"queueingPolicy": {"validUntilTime": "soon"}})[0]
    assert TPU.check("QueuedResource", {"queueingPolicy": {"validUntilDuration": "3600s"}}) == []
    assert "not a duration" in TPU.check("QueuedResource", {"queueingPolicy": {"validUntilDuration": "1h"}})[0]
    assert "not a field of Empty" in TPU.check("Empty", {"x": 1})[0]
    # an Operation's response is `any`: whatever resource it carries
    assert TPU.check("Operation", {"name": "o", "done": True, "response": {"@type": "t", "x": [1]}}) == []


def test_query_parameters() -> None:
    create = TPU.method("POST", "/v2/projects/p/locations/z/queuedResources")
    assert create is not None
    assert TPU.check_query(create, {"queuedResourceId": "q", "$alt": "json;enum-encoding=int"}) == []
    assert TPU.check_query(create, {"nodeId": "q"}) == ["?nodeId: not a query parameter of " + create.id]
    assert TPU.check_query(create, {"$alt": "xml"})[0].startswith("?$alt=xml: not one of")
    delete = TPU.method("DELETE", "/v2/projects/p/locations/z/queuedResources/q")
    assert delete is not None and TPU.check_query(delete, {"force": "yes"}) == ["?force=yes: not a boolean"]
