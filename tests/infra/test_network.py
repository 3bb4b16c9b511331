"""The machines' network as a deployment setting (infra/terraform/network.tf): which network and subnetwork, whether
machines get an external IP, the rule a multi-host slice needs on a custom VPC, how machines without an external IP
reach Google's APIs and the internet, and the grants a Shared VPC's subnetworks need. The functions get the choice as
RESPAWN_NETWORK, RESPAWN_SUBNETWORK, RESPAWN_EXTERNAL_IP."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
from tfconfig import REPO, Config, block

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
            "subnetwork_regions",
        )
    }
    assert defaults == {
        "network": "default",
        "subnetwork": None,
        "create_network": False,
        "subnetwork_ranges": {},
        "external_ip": None,
        "slice_firewall": True,
        "cloud_nat_regions": None,  # by default: where the machines need it (below)
        "subnetwork_regions": [],
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
    assert router["for_each"] == "${toset(local.nat_regions)}"
    assert router["network"] == "${local.machine_network}"
    assert nat["for_each"] == "${google_compute_router.nat}"
    assert nat["source_subnetwork_ip_ranges_to_nat"] == "ALL_SUBNETWORKS_ALL_IP_RANGES"
    assert block(nat, "log_config")["enable"] is True


def test_a_network_terraform_creates_for_machines_without_an_external_ip_gets_cloud_nat_in_each_region(
    config: Config,
) -> None:
    """Private Google Access reaches Google's APIs only, and a machine's readying reaches the Ubuntu archive (Docker)
    and nvidia.github.io (the NVIDIA Container Toolkit): unset, cloud_nat_regions is every region of the created
    network when its machines have no external IP; a list is taken as written ([]: none)."""
    assert config.locals["nat_regions"] == (
        "${var.cloud_nat_regions != null ? var.cloud_nat_regions : "
        "(var.create_network && !local.external_ip ? keys(var.subnetwork_ranges) : [])}"
    )
    assert config.variables["cloud_nat_regions"]["default"] is None
    (validation,) = config.variables["cloud_nat_regions"]["validation"]
    assert validation["condition"].startswith("${var.cloud_nat_regions == null ? true : ")  # null passes


STARTUP = REPO / "functions" / "respawn" / "adapters" / "startup.sh"
_URL_HOST = re.compile(r"https://([a-z0-9.-]+)/")


def hosts_outside_google(script: str) -> set[str]:
    """The hosts the startup script fetches from by URL (in its commands, not its comments) that are not Google's
    APIs: Private Google Access does not reach them (https://cloud.google.com/vpc/docs/private-google-access)."""
    commands = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("#"))
    return {h for h in _URL_HOST.findall(commands) if not h.endswith(".googleapis.com")}


def private_network_section() -> str:
    deploy = (REPO / "docs" / "deploy.md").read_text(encoding="utf-8")
    return deploy.split("### A project without a default network", 1)[1].split("\n## ", 1)[0]


def test_what_the_startup_script_fetches_outside_google_is_what_the_deploy_guide_and_cloud_nat_name(
    config: Config,
) -> None:
    """startup.sh installs Docker with apt-get (the Ubuntu archive) and the NVIDIA Container Toolkit from NVIDIA's
    repository: docs/deploy.md's private-network section and cloud_nat_regions name each, and the guide does not
    say that machines without an external IP need only Google's APIs."""
    script = STARTUP.read_text(encoding="utf-8")
    assert "apt-get" in script and "docker.io" in script  # Docker from the OS packages: the Ubuntu archive
    outside = hosts_outside_google(script)
    assert outside == {"nvidia.github.io"}, outside
    section = private_network_section()
    description = config.variables["cloud_nat_regions"]["description"]
    for where in [*outside, "Ubuntu archive", "apt-get"]:
        assert where in section, where
    for where in [*outside, "Ubuntu archive"]:
        assert where in description, where
    assert "Cloud NAT is only needed" not in section
    assert "cloud_nat_regions = []" in section  # how to do without it, for images that have everything


def test_the_scan_for_hosts_outside_google_can_fail() -> None:
    script = (
        "# see https://cloud.google.com/x\ncurl -fsSL https://nvidia.github.io/x https://storage.googleapis.com/b\n"
    )
    assert hosts_outside_google(script + "pip download https://pypi.org/simple/") == {"nvidia.github.io", "pypi.org"}


def test_a_shared_vpcs_subnetwork_users_get_network_user_on_it_in_the_host_project(config: Config) -> None:
    """On a Shared VPC with a subnetwork and its regions named, the orchestrator (every create names the subnetwork)
    and the Google APIs service agent (it creates a slice MIG's VMs) get roles/compute.networkUser on the subnetwork
    in each region, in the host project; nothing on a network of this project."""
    grant = config.resource("google_compute_subnetwork_iam_member", "shared_vpc_users")
    assert grant["for_each"] == (
        '${{for pair in setproduct(local.shared_subnetworks, keys(local.subnetwork_users)) : "${pair[0]}/${pair[1]}" '
        "=> {region = pair[0], member = local.subnetwork_users[pair[1]]}}}"
    )
    assert (grant["project"], grant["region"], grant["subnetwork"]) == (
        "${local.network_project}",
        "${each.value.region}",
        "${var.subnetwork}",
    )
    assert (grant["role"], grant["member"]) == ("roles/compute.networkUser", "${each.value.member}")
    assert config.locals["subnetwork_users"] == {
        "orchestrator": "${google_service_account.orchestrator.member}",
        "mig_agent": "serviceAccount:${data.google_project.this.number}@cloudservices.gserviceaccount.com",
    }
    assert config.locals["shared_vpc"] == "${local.network_project != var.project}"
    assert config.locals["shared_subnetworks"] == (
        "${local.shared_vpc && var.subnetwork != null ? toset(var.subnetwork_regions) : toset([])}"
    )
    assert config.variables["subnetwork_regions"]["default"] == []


def test_the_deploy_guide_names_the_shared_vpc_grants(config: Config) -> None:
    section = private_network_section()
    shared = section.split("**A Shared VPC.**", 1)[1]
    for needed in ("roles/compute.networkUser", "@cloudservices.gserviceaccount.com", "respawn-orchestrator"):
        assert needed in shared, needed
    assert "subnetwork_regions" in shared


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


def type_of(value: str) -> str:
    """A variable's type as written: python-hcl2 reads `list(string)` as "${list(string)}", `string` as is."""
    return expression(value) if value.startswith("${") else value


@pytest.fixture(scope="module")
def evaluate(config: Config, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., dict[str, Any]]:
    """network.tf's locals as Terraform itself evaluates them (`terraform console`, no provider needed), for given
    variables: the values the functions get."""
    binary = shutil.which("terraform")
    if binary is None:  # no package registry serves it: a machine without it skips (the HCL checks above still run)
        pytest.skip("terraform is not installed (HashiCorp's binary, on PATH)")
    module = tmp_path_factory.mktemp("network_locals")
    names = (
        "project",
        "network",
        "subnetwork",
        "create_network",
        "external_ip",
        "subnetwork_ranges",
        "cloud_nat_regions",
        "subnetwork_regions",
    )
    variables = "".join(
        f'variable "{n}" {{\n  type    = {type_of(config.variables[n]["type"])}\n'
        f"  default = {json.dumps(config.variables[n].get('default'))}\n}}\n"
        for n in names
    )
    wanted = (
        "network_project",
        "network_name",
        "machine_subnetwork",
        "external_ip",
        "nat_regions",
        "shared_vpc",
        "shared_subnetworks",
    )
    values = "".join(f"  {n} = {expression(config.locals[n])}\n" for n in wanted)
    (module / "main.tf").write_text(f"{variables}locals {{\n{values}}}\n")
    shown = ", ".join(f"{n} = local.{n}" for n in wanted)

    def run(**settings: Any) -> dict[str, Any]:
        args = [binary, "console"] + [
            f"-var={k}={str(v).lower() if isinstance(v, bool) else json.dumps(v) if isinstance(v, list | dict) else v}"
            for k, v in settings.items()
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
    got = evaluate(**settings)
    assert {k: got[k] for k in expected} == expected


CREATED = {"project": "p", "create_network": True, "network": "v", "subnetwork": "s"}
TWO_REGIONS = {"us-central1": "10.20.0.0/20", "europe-west4": "10.20.16.0/20"}
SHARED = {"project": "p", "network": "projects/host-1/global/networks/shared", "subnetwork": "ml"}


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"project": "p"}, {"nat_regions": [], "shared_subnetworks": []}),  # the default network, external IPs
        ({**CREATED, "subnetwork_ranges": TWO_REGIONS}, {"nat_regions": ["europe-west4", "us-central1"]}),
        ({**CREATED, "subnetwork_ranges": TWO_REGIONS, "cloud_nat_regions": []}, {"nat_regions": []}),
        ({**CREATED, "subnetwork_ranges": TWO_REGIONS, "external_ip": True}, {"nat_regions": []}),
        ({**CREATED, "cloud_nat_regions": ["us-east5"]}, {"nat_regions": ["us-east5"]}),
        ({"project": "p", "external_ip": False, "subnetwork": "s"}, {"nat_regions": [], "shared_vpc": False}),
        (
            {**SHARED, "external_ip": False, "subnetwork_regions": ["us-central1"]},
            {"nat_regions": [], "shared_vpc": True, "shared_subnetworks": ["us-central1"]},
        ),
        ({**SHARED, "subnetwork_regions": []}, {"shared_vpc": True, "shared_subnetworks": []}),
        (
            {
                "project": "p",
                "network": "projects/p/global/networks/n",
                "subnetwork": "s",
                "subnetwork_regions": ["us-central1"],
            },
            {"shared_vpc": False, "shared_subnetworks": []},  # the network of this project, written in full
        ),
    ],
)
def test_where_cloud_nat_and_the_shared_vpc_grants_go(
    evaluate: Callable[..., dict[str, Any]], settings: dict[str, Any], expected: dict[str, Any]
) -> None:
    got = evaluate(**settings)
    assert {k: got[k] for k in expected} == expected
