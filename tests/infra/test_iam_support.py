"""IAM that Google accepts and applies: every IAM condition in infra/terraform sits on a service that evaluates resource
attributes, and every permission of every custom role exists and is supported in custom roles. Both lists are kept
under tests/data with their source and date (tests/data/SOURCES.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from tfconfig import REPO, Config

DATA = REPO / "tests" / "data"
CONDITION_SERVICES = json.loads((DATA / "iam_condition_services.json").read_text(encoding="utf-8"))
ROLE_SUPPORT = json.loads((DATA / "iam_custom_role_support.json").read_text(encoding="utf-8"))
RESOURCE_ATTRIBUTE = re.compile(r"\bresource\.(name|type|service)\b")
CUSTOM_ROLE = re.compile(r"^\$\{google_project_iam_custom_role\.(?P<name>\w+)\.(id|name)\}$")


def role_services(config: Config, role: str) -> set[str]:
    """The services whose permissions a role grants: roles/storage.objectAdmin -> storage.googleapis.com; a custom
    role of this configuration -> the service of each of its permissions."""
    custom = CUSTOM_ROLE.match(role)
    if custom:
        permissions = config.role_permissions(custom["name"])
        return {f"{p.split('.', 1)[0]}.googleapis.com" for p in permissions}
    m = re.fullmatch(r"roles/(?P<service>[a-z0-9]+)\.\w+", role)
    assert m, f"cannot tell the service of role {role!r}"
    return {f"{m['service']}.googleapis.com"}


def conditions_on_unevaluated_services(config: Config) -> list[str]:
    """Each grant whose condition reads a resource attribute (resource.name, .type, .service) of a service that does
    not evaluate them: Google ignores such a condition's resource part and the grant never applies."""
    evaluated = set(CONDITION_SERVICES["services"])
    wrong = []
    for (type_, name), body in sorted(config.resources.items()):
        for condition in body.get("condition", []):
            if not RESOURCE_ATTRIBUTE.search(condition["expression"]):
                continue
            for service in sorted(role_services(config, body["role"]) - evaluated):
                wrong.append(
                    f"{type_}.{name}: {body['role']} is a {service} role; "
                    f"{service} does not evaluate resource attributes"
                )
    return wrong


def unsupported_permissions(config: Config) -> list[str]:
    """Each permission of each custom role that Google's list does not have, or does not fully support in custom
    roles. Creating a role with a permission Google does not know fails the apply; TESTING may behave unexpectedly."""
    known: dict[str, str] = ROLE_SUPPORT["permissions"]
    complete = tuple(ROLE_SUPPORT["complete_for"])
    problems = []
    for name in sorted(config.of_type("google_project_iam_custom_role")):
        for permission in config.role_permissions(name):
            level = known.get(permission)
            if level is None:
                where = (
                    "Google has no such permission" if permission.startswith(complete) else "not in the stored subset"
                )
                problems.append(f"{name}: {permission} is absent from {ROLE_SUPPORT['source']} ({where})")
            elif level != "SUPPORTED":
                problems.append(f"{name}: {permission} is {level} in custom roles")
    return problems


@pytest.fixture(scope="module")
def config() -> Config:
    return Config.load()


def test_every_iam_condition_is_on_a_service_that_evaluates_resource_attributes(config: Config) -> None:
    conditioned = [body for body in config.resources.values() if body.get("condition")]
    assert conditioned  # the build's Cloud Storage grant keeps its condition: the check really ran
    assert conditions_on_unevaluated_services(config) == []


def test_the_condition_check_fails_on_artifact_registry(tmp_path: Path) -> None:
    """The grant infra/terraform had: Artifact Registry Writer under a resource.name condition."""
    (tmp_path / "iam.tf").write_text(
        'resource "google_project_iam_member" "push" {\n'
        '  role   = "roles/artifactregistry.writer"\n'
        '  member = "serviceAccount:b@p.iam.gserviceaccount.com"\n'
        "  condition {\n"
        '    title      = "gcf-artifacts-only"\n'
        '    expression = "resource.name.startsWith(\\"projects/p/locations/r/repositories/gcf-artifacts\\")"\n'
        "  }\n"
        "}\n"
        'resource "google_project_iam_member" "sources" {\n'
        '  role   = "roles/storage.objectAdmin"\n'
        '  member = "serviceAccount:b@p.iam.gserviceaccount.com"\n'
        "  condition {\n"
        '    title      = "sources"\n'
        '    expression = "resource.name.startsWith(\\"projects/_/buckets/gcf-v2-sources-1-\\")"\n'
        "  }\n"
        "}\n"
        'resource "google_project_iam_member" "later" {\n'
        '  role   = "roles/artifactregistry.reader"\n'
        '  member = "serviceAccount:b@p.iam.gserviceaccount.com"\n'
        "  condition {\n"
        '    title      = "until"\n'
        '    expression = "request.time < timestamp(\\"2030-01-01T00:00:00Z\\")"\n'
        "  }\n"
        "}\n"
    )
    assert conditions_on_unevaluated_services(Config.load(tmp_path)) == [
        "google_project_iam_member.push: roles/artifactregistry.writer is a artifactregistry.googleapis.com role; "
        "artifactregistry.googleapis.com does not evaluate resource attributes"
    ]


def test_the_condition_services_list_is_the_documented_one() -> None:
    services = CONDITION_SERVICES["services"]
    assert CONDITION_SERVICES["source"] == "https://cloud.google.com/iam/docs/conditions-resource-attributes"
    assert {"storage.googleapis.com", "compute.googleapis.com", "secretmanager.googleapis.com"} <= set(services)
    assert "artifactregistry.googleapis.com" not in services
    assert services == sorted(set(services))


def test_every_custom_role_permission_is_supported_in_custom_roles(config: Config) -> None:
    roles = config.of_type("google_project_iam_custom_role")
    assert sum(len(config.role_permissions(name)) for name in roles) >= 30  # the check really ran
    assert unsupported_permissions(config) == []


def custom_role(tmp_path: Path, permissions: list[str]) -> Config:
    listed = ", ".join(f'"{p}"' for p in permissions)
    (tmp_path / "role.tf").write_text(
        f'resource "google_project_iam_custom_role" "r" {{\n  permissions = [{listed}]\n}}\n'
    )
    return Config.load(tmp_path)


@pytest.mark.parametrize(
    ("permission", "problem"),
    [
        ("tpu.queuedResources.create", "absent from"),  # the role had it: Google has no such permission
        ("compute.instances.getGuestAttributes", "is TESTING in custom roles"),
        ("stackdriver.projects.edit", "is NOT_SUPPORTED in custom roles"),
        ("bigquery.tables.create", "not in the stored subset"),
    ],
)
def test_the_permission_check_fails_on(tmp_path: Path, permission: str, problem: str) -> None:
    problems = unsupported_permissions(custom_role(tmp_path, ["compute.instances.create", permission]))
    assert len(problems) == 1 and problem in problems[0] and permission in problems[0], problems


def test_the_support_dataset_answers_the_issues_questions() -> None:
    """MIG creation and deletion also need compute.instanceGroups.create/delete; compute.advice.* is allowed in custom
    roles; Cloud TPU has no queued-resource permissions of its own."""
    known: dict[str, Any] = ROLE_SUPPORT["permissions"]
    for permission in (
        "compute.instanceGroups.create",
        "compute.instanceGroups.delete",
        "compute.advice.capacity",
        "compute.advice.capacityHistory",
    ):
        assert known[permission] == "SUPPORTED", permission
    assert "tpu." in ROLE_SUPPORT["complete_for"]
    assert not [p for p in known if p.startswith("tpu.queuedResources.")]
    assert {"tpu.nodes.create", "tpu.nodes.delete", "tpu.nodes.get", "tpu.nodes.list"} <= set(known)
