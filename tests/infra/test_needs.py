"""What `respawn doctor` asks Google about (respawn_ops/needs.py) is exactly what infra/terraform grants and
enables: the orchestrator's custom role, the APIs, and every grant it names exists as that Terraform resource with
a role holding its permissions."""

from __future__ import annotations

from pathlib import Path

import pytest
from tfconfig import TF_DIR, Config

from respawn_ops import needs


@pytest.fixture(scope="module")
def config() -> Config:
    return Config.load()


def test_the_custom_role_reads_the_orchestrators_permissions_from_the_file_doctor_reads(config: Config) -> None:
    assert config.role_permissions("orchestrator") == list(needs.ORCHESTRATOR_ROLE)
    assert len(set(needs.ORCHESTRATOR_ROLE)) == len(needs.ORCHESTRATOR_ROLE) >= 30
    path = config.locals["orchestrator_permissions"].split('file("', 1)[1].split('"', 1)[0]
    assert config.file_target('${file("' + path + '")}') == needs.ROLE_FILE


def test_the_role_file_is_read_one_permission_a_line(tmp_path: Path) -> None:
    """Terraform's reading (iam.tf's local) and respawn's (needs.role_permissions) take the same lines."""
    text = "# a comment\n\ncompute.instances.get\n  tpu.nodes.get  \n# compute.instances.delete\n"
    (tmp_path / "role.txt").write_text(text)
    iam = (TF_DIR / "iam.tf").read_text(encoding="utf-8")
    local = next(line for line in iam.splitlines() if line.strip().startswith("orchestrator_permissions ="))
    local = local.replace("${path.module}/../../respawn_ops/orchestrator_role.txt", "${path.module}/role.txt")
    (tmp_path / "role.tf").write_text(
        f"locals {{\n{local}\n}}\n"
        'resource "google_project_iam_custom_role" "r" {\n  permissions = local.orchestrator_permissions\n}\n'
    )
    assert Config.load(tmp_path).role_permissions("r") == ["compute.instances.get", "tpu.nodes.get"]
    assert needs.role_permissions(text) == ("compute.instances.get", "tpu.nodes.get")


def test_the_apis_are_those_terraform_enables(config: Config) -> None:
    assert sorted(config.locals["apis"]) == sorted(needs.APIS)


def test_every_grant_names_a_terraform_grant_of_its_account(config: Config) -> None:
    for grant in needs.GRANTS:
        type_, name = grant.terraform.split(".")
        body = config.resource(type_, name)
        member = body["member"]
        assert member == f"${{google_service_account.{grant.account}.member}}", grant
        if grant.permissions == needs.ORCHESTRATOR_ROLE:
            assert body["role"] == "${google_project_iam_custom_role.orchestrator.id}"


def test_the_accounts_are_the_ones_terraform_creates(config: Config) -> None:
    for account in (needs.ORCHESTRATOR, needs.MACHINE):
        assert config.resource("google_service_account", account)["account_id"] == f"respawn-{account}"
        assert needs.account_email(account, "p") == f"respawn-{account}@p.iam.gserviceaccount.com"


def test_doctor_looks_for_the_topics_and_subscriptions_terraform_makes(config: Config) -> None:
    from respawn.deployment import Settings
    from respawn_cli.doctor import report

    assert config.resource("google_pubsub_subscription", "push")["name"] == "${each.value.name}-push"
    push = {f"{f['name']}-push" for f in config.locals["functions"].values()}
    subscriptions = push | {config.resource("google_pubsub_subscription", "dead_letter")["name"]}
    # every topic but the optional ones (respawn-alerts, with alert_pubsub)
    topics = {body["name"] for body in config.of_type("google_pubsub_topic").values() if "count" not in body}
    assert "respawn-alerts" not in topics and len(topics) == 4
    d = report.deployment(Settings(project="p", state_bucket="s"))
    assert (set(d.topics), set(d.subscriptions)) == (topics, subscriptions)


def test_on_a_shared_vpc_doctor_asks_for_the_grant_terraform_makes(config: Config) -> None:
    """The grant doctor names on a Shared VPC is network.tf's: the role holding the use of a subnetwork, on the host
    subnetwork, to respawn-orchestrator and to the Google APIs service agent that creates a MIG's VMs."""
    type_, name = needs.SHARED_VPC_GRANT.split(".")
    body = config.resource(type_, name)
    assert body["role"] == needs.SUBNETWORK_ROLE == "roles/compute.networkUser"
    assert (body["project"], body["subnetwork"]) == ("${local.network_project}", "${var.subnetwork}")
    members = config.locals["subnetwork_users"]
    assert members["orchestrator"] == "${google_service_account.orchestrator.member}"
    assert members["mig_agent"] == "serviceAccount:" + needs.mig_agent_email("${data.google_project.this.number}")


def test_what_doctor_says_machines_download_outside_google_is_what_the_startup_script_fetches() -> None:
    """doctor's Cloud NAT check (respawn_cli/doctor/network_checks.py) names what the startup script installs from
    outside Google: Docker with apt-get (the Ubuntu archive) and the NVIDIA Container Toolkit from nvidia.github.io.
    A script that stops fetching one of them must change the check too."""
    from respawn_cli.doctor import network_checks

    script = (TF_DIR.parents[1] / "functions" / "respawn" / "adapters" / "startup.sh").read_text(encoding="utf-8")
    commands = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("#"))
    assert "apt-get" in commands and "docker.io" in commands
    assert "https://nvidia.github.io" in commands
    assert "apt-get" in network_checks.UBUNTU and "nvidia.github.io" in network_checks.NVIDIA
