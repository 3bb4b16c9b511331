"""What `respawn doctor` asks Google about (respawn/doctor/needs.py) is exactly what infra/terraform grants and
enables: the orchestrator's custom role, the APIs, and every grant it names exists as that Terraform resource with
a role holding its permissions."""

from __future__ import annotations

import pytest
from tfconfig import Config

from respawn.doctor import needs


@pytest.fixture(scope="module")
def config() -> Config:
    return Config.load()


def test_the_custom_role_is_the_orchestrators_permissions(config: Config) -> None:
    role = config.resource("google_project_iam_custom_role", "orchestrator")["permissions"]
    assert sorted(role) == sorted(needs.ORCHESTRATOR_ROLE)
    assert len(set(needs.ORCHESTRATOR_ROLE)) == len(needs.ORCHESTRATOR_ROLE) >= 30


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
