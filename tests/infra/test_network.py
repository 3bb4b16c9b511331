"""The machines' network as a deployment setting (infra/terraform/network.tf): which network and subnetwork, whether
machines get an external IP, the rule a multi-host slice needs on a custom VPC, and how machines without an external
IP reach Google's APIs. The functions get the choice as RESPAWN_NETWORK, RESPAWN_SUBNETWORK, RESPAWN_EXTERNAL_IP."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
from tfconfig import Config, block

from respawn_trainer.env import COORDINATOR_PORT

MACHINE_EMAIL = "${google_service_account.machine.email}"


@pytest.fixture(scope="module")
def config() -> Config:
    return Config.load()


def test_the_network_settings_and_their_defaults(config: Config) -> None:
    """Unset, machines use the project's default network with an external IP, as before."""
    defaults = {
        name: config.variables[name].get("default", "unset")
        for name in (
            "network",
            "subnetwork",
            "create_network",
            "subnetwork_ranges",
            "external_ip",
            "slice_firewall",
            "cloud_nat_regions",
        )
    }
    assert defaults == {
        "network": "default",
        "subnetwork": None,
        "create_network": False,
        "subnetwork_ranges": {},
        "external_ip": None,
        "slice_firewall": True,
        "cloud_nat_regions": [],
    }


def test_external_ips_are_off_by_default_where_private_google_access_is_on(config: Config) -> None:
    """No external IP by default on the network Terraform creates (its subnetworks have Private Google Access); one
    by default on an existing network, whose subnetworks may lack it (the default network's do)."""
    assert config.locals["external_ip"] == "${var.external_ip == null ? !var.create_network : var.external_ip}"
    for subnetwork in [config.resource("google_compute_subnetwork", "machines")]:
        assert subnetwork["private_ip_google_access"] is True
        assert subnetwork["for_each"] == "${var.create_network ? var.subnetwork_ranges : {}}"
        assert (subnetwork["name"], subnetwork["region"]) == ("${var.subnetwork}", "${each.key}")
        assert subnetwork["network"] == "${google_compute_network.machines[0].id}"
    network = config.resource("google_compute_network", "machines")
    assert network["count"] == "${var.create_network ? 1 : 0}"
    assert network["auto_create_subnetworks"] is False


def test_the_functions_get_the_network_choice(config: Config) -> None:
    env = config.locals["function_environment"]
    assert env["RESPAWN_NETWORK"] == "${local.machine_network}"
    assert env["RESPAWN_SUBNETWORK"] == "${local.machine_subnetwork}"
    assert env["RESPAWN_EXTERNAL_IP"] == "${tostring(local.external_ip)}"
    assert config.locals["machine_subnetwork"] == '${var.subnetwork == null ? "" : var.subnetwork}'
    network = config.locals["machine_network"]
    assert "google_compute_network.machines[0].id" in network
    assert "projects/${local.network_project}/global/networks/${local.network_name}" in network


def test_a_slices_machines_reach_each_other_and_the_jax_coordinator(config: Config) -> None:
    """Every protocol between machines running as the machines' account, from nothing else; TCP without a port list
    is every port, JAX's coordinator port included."""
    rule = config.resource("google_compute_firewall", "machine_peers")
    assert rule["count"] == "${var.slice_firewall ? 1 : 0}"
    assert (rule["direction"], rule["network"]) == ("INGRESS", "${local.machine_network}")
    assert rule["source_service_accounts"] == rule["target_service_accounts"] == [MACHINE_EMAIL]
    assert "source_ranges" not in rule and "source_tags" not in rule
    allowed = {a["protocol"]: a.get("ports") for a in rule["allow"]}
    assert allowed == {"tcp": None, "udp": None, "icmp": None}
    assert COORDINATOR_PORT == 8482 and f"{COORDINATOR_PORT}" in rule["description"]


def test_cloud_nat_only_where_asked(config: Config) -> None:
    router = config.resource("google_compute_router", "nat")
    nat = config.resource("google_compute_router_nat", "machines")
    assert router["for_each"] == "${toset(var.cloud_nat_regions)}"
    assert router["network"] == "${local.machine_network}"
    assert nat["for_each"] == "${google_compute_router.nat}"
    assert nat["source_subnetwork_ip_ranges_to_nat"] == "ALL_SUBNETWORKS_ALL_IP_RANGES"
    assert block(nat, "log_config")["enable"] is True


def validation_pattern(config: Config, variable: str) -> str:
    (validation,) = config.variables[variable]["validation"]
    found = re.search(r'regex\("(.+?)", var\.' + variable + r"\)", validation["condition"])
    assert found is not None, validation["condition"]
    return found.group(1).replace("\\\\", "\\")


@pytest.mark.parametrize(
    ("value", "allowed"),
    [
        ("default", True),
        ("respawn-vpc", True),
        ("projects/host-project-1/global/networks/shared", True),
        ("global/networks/default", False),
        ("https://www.googleapis.com/compute/v1/projects/p/global/networks/n", False),
        ("Default", False),
        ("", False),
    ],
)
def test_network_is_a_name_or_a_shared_vpc_path(config: Config, value: str, allowed: bool) -> None:
    assert bool(re.fullmatch(validation_pattern(config, "network"), value)) is allowed


@pytest.mark.parametrize(
    ("value", "allowed"),
    [("respawn-machines", True), ("regions/us-central1/subnetworks/s", False), ("S", False), ("a-", False)],
)
def test_subnetwork_is_a_name(config: Config, value: str, allowed: bool) -> None:
    assert bool(re.fullmatch(validation_pattern(config, "subnetwork"), value)) is allowed


def test_function_builds_push_to_a_repository_of_their_own(config: Config) -> None:
    """Artifact Registry does not evaluate IAM conditions on resource.name: the build account writes to a repository
    Terraform creates, granted on that repository, and the functions' build names it."""
    repo = config.resource("google_artifact_registry_repository", "functions")
    assert (repo["format"], repo["location"]) == ("DOCKER", "${var.region}")
    grant = config.resource("google_artifact_registry_repository_iam_member", "build_pushes_images")
    assert grant == {
        "location": "${google_artifact_registry_repository.functions.location}",
        "repository": "${google_artifact_registry_repository.functions.name}",
        "role": "roles/artifactregistry.writer",
        "member": "${google_service_account.build.member}",
    }
    fn = config.resource("google_cloudfunctions2_function", "respawn")
    assert block(fn, "build_config")["docker_repository"] == "${google_artifact_registry_repository.functions.id}"
    assert "${google_artifact_registry_repository_iam_member.build_pushes_images}" in fn["depends_on"]
    project_roles = {body["role"] for body in config.of_type("google_project_iam_member").values()}
    assert not [role for role in project_roles if role.startswith("roles/artifactregistry.")]


def expression(value: str) -> str:
    assert value.startswith("${") and value.endswith("}"), value
    return value[2:-1]


@pytest.fixture(scope="module")
def evaluate(config: Config, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., dict[str, Any]]:
    """network.tf's locals as Terraform itself evaluates them (`terraform console`, no provider needed), for given
    variables: the values the functions get."""
    binary = shutil.which("terraform")
    if binary is None:  # no package registry serves it: a machine without it skips (the HCL checks above still run)
        pytest.skip("terraform is not installed (HashiCorp's binary, on PATH)")
    module = tmp_path_factory.mktemp("network_locals")
    names = ("project", "network", "subnetwork", "create_network", "external_ip")
    variables = "".join(
        f'variable "{n}" {{\n  type    = {config.variables[n]["type"]}\n'
        f"  default = {json.dumps(config.variables[n].get('default'))}\n}}\n"
        for n in names
    )
    wanted = ("network_project", "network_name", "machine_subnetwork", "external_ip")
    values = "".join(f"  {n} = {expression(config.locals[n])}\n" for n in wanted)
    (module / "main.tf").write_text(f"{variables}locals {{\n{values}}}\n")
    shown = ", ".join(f"{n} = local.{n}" for n in wanted)

    def run(**settings: Any) -> dict[str, Any]:
        args = [binary, "console"] + [
            f"-var={k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in settings.items()
        ]
        done = subprocess.run(
            args, cwd=module, input=f"jsonencode({{{shown}}})\n", capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        result: dict[str, Any] = json.loads(json.loads(done.stdout.strip().splitlines()[-1]))
        return result

    return run


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (
            {"project": "p"},
            {"network_project": "p", "network_name": "default", "machine_subnetwork": "", "external_ip": True},
        ),
        (
            {"project": "p", "create_network": True, "network": "respawn-vpc", "subnetwork": "respawn-machines"},
            {
                "network_project": "p",
                "network_name": "respawn-vpc",
                "machine_subnetwork": "respawn-machines",
                "external_ip": False,
            },
        ),
        (
            {
                "project": "p",
                "network": "projects/host-1/global/networks/shared",
                "subnetwork": "ml",
                "external_ip": False,
            },
            {"network_project": "host-1", "network_name": "shared", "machine_subnetwork": "ml", "external_ip": False},
        ),
        (
            {"project": "p", "create_network": True, "network": "v", "subnetwork": "s", "external_ip": True},
            {"network_project": "p", "network_name": "v", "machine_subnetwork": "s", "external_ip": True},
        ),
    ],
)
def test_the_settings_the_functions_get(
    evaluate: Callable[..., dict[str, Any]], settings: dict[str, Any], expected: dict[str, Any]
) -> None:
    assert evaluate(**settings) == expected
