"""Offline `terraform validate` for names: every resource, data source and provider block of infra/terraform uses
only types, arguments and nested blocks its provider has (schemas from the Terraform CDK's prebuilt providers)."""

from __future__ import annotations

import json
import os
import re
from typing import Any

import hcl2
import pytest
from hcl2 import SerializationOptions
from tfconfig import REPO, TF_DIR
from tfschema import PACKAGES, Schemas, check_file, schema_dir

EXPLICIT = SerializationOptions(strip_string_quotes=True, explicit_blocks=True, with_comments=False)
PINNED = REPO / "infra" / "tfschema" / "package.json"


@pytest.fixture(scope="module")
def schemas() -> Schemas:
    found = schema_dir()
    if found is None:
        problem = (
            "the provider schemas (@cdktf/provider-google, -archive, -time) are not installed: "
            "`make setup` installs them into .venv-tfschema and sets RESPAWN_TFSCHEMA"
        )
        if os.environ.get("RESPAWN_REQUIRE_EMULATORS") == "1" or os.environ.get("CI") == "true":
            pytest.fail(problem)
        pytest.skip(problem)
    return Schemas(found)


def parse(text: str) -> dict[str, Any]:
    parsed: dict[str, Any] = hcl2.loads(text, serialization_options=EXPLICIT)
    return parsed


@pytest.fixture(scope="module")
def configuration() -> dict[str, dict[str, Any]]:
    return {p.name: parse(p.read_text(encoding="utf-8")) for p in sorted(TF_DIR.glob("*.tf"))}


@pytest.mark.parametrize("name", sorted(p.name for p in TF_DIR.glob("*.tf")))
def test_every_block_uses_only_names_its_provider_has(
    schemas: Schemas, configuration: dict[str, dict[str, Any]], name: str
) -> None:
    assert check_file(schemas, configuration[name], name) == []


def test_every_resource_and_data_source_was_checked(schemas: Schemas, configuration: dict[str, dict[str, Any]]) -> None:
    parsed = configuration.values()
    used = {(kind, t) for f in parsed for kind in ("resource", "data") for e in f.get(kind, []) for t in e}
    used -= {(kind, "__is_block__") for kind in ("resource", "data")}
    assert len(used) >= 15  # the configuration really was read
    assert all(schemas.get(kind, t) is not None for kind, t in used)
    assert schemas.get("provider", "google") is not None


def test_installed_schemas_are_the_pinned_ones_and_fit_versions_tf(schemas: Schemas) -> None:
    pinned = json.loads(PINNED.read_text())["dependencies"]
    constraints = parse((TF_DIR / "versions.tf").read_text())["terraform"][0]["required_providers"][0]
    for provider, name in PACKAGES.items():
        package = f"@cdktf/{name}"
        installed = json.loads((schemas.package(provider) / "package.json").read_text())
        assert installed["version"] == pinned[package], f"{package}: run `make setup`"
        built_for = installed["cdktf"]["provider"]
        assert built_for["name"] == f"registry.terraform.io/hashicorp/{provider}"
        assert satisfies(built_for["version"], constraints[provider]["version"]), (provider, built_for)
        major = int(built_for["version"].split(".")[0])
        assert not satisfies(f"{major + 1}.0.0", constraints[provider]["version"]), "a major no schema checks"


def test_the_google_provider_range_is_the_one_the_schemas_check() -> None:
    """versions.tf allows only the google provider the pinned schemas were built for and newer minors of its major:
    the schemas stop at 6.x (infra/tfschema/package.json), so a 7.x provider would run unchecked."""
    built_for = re.search(r"hashicorp/google (\d+)\.(\d+)\.(\d+)", json.loads(PINNED.read_text())["description"])
    assert built_for, "infra/tfschema/package.json no longer says which hashicorp/google its schemas are"
    major, minor, patch = (int(x) for x in built_for.groups())
    constraint = parse((TF_DIR / "versions.tf").read_text())["terraform"][0]["required_providers"][0]["google"]
    assert constraint["version"] == f"~> {major}.{minor}"
    assert satisfies(f"{major}.{minor}.{patch}", constraint["version"])
    assert satisfies(f"{major}.{minor + 9}.0", constraint["version"])  # newer minors of the major
    assert not satisfies(f"{major + 1}.0.0", constraint["version"]) and not satisfies(
        f"{major}.0.0", constraint["version"]
    )


def satisfies(version: str, constraint: str) -> bool:
    """Terraform's version constraints, the operators versions.tf uses (>=, <, ~>)."""
    have = tuple(int(x) for x in version.split("."))
    for term in constraint.split(","):
        m = re.fullmatch(r"\s*(>=|<|~>)\s*([\d.]+)\s*", term)
        assert m, f"unsupported constraint {term!r}"
        want = tuple(int(x) for x in m[2].split("."))
        if m[1] == ">=" and not have >= want:
            return False
        if m[1] == "<" and not have < want:
            return False
        if m[1] == "~>" and not (have >= want and have[: len(want) - 1] == want[:-1]):
            return False
    return True


def test_the_constraint_reader() -> None:
    assert satisfies("6.50.0", ">= 6.0, < 8.0") and not satisfies("8.0.0", ">= 6.0, < 8.0")
    assert satisfies("6.51.2", "~> 6.50") and not satisfies("7.0.0", "~> 6.50") and not satisfies("6.49.0", "~> 6.50")
    assert satisfies("2.7.1", "~> 2.5") and not satisfies("3.0.0", "~> 2.5") and not satisfies("2.4.0", "~> 2.5")


# ------------------------------------------------------------------------------------------ the checker fails


BAD = """
resource "google_pubsub_subscription" "push" {
  name                 = "x"
  topic                = "t"
  ack_deadline_secs    = 60
  push_config {
    push_endpoint = "https://example.invalid"
    oidc_token {
      service_account_email = "a@b"
      audiences             = "x"
    }
  }
  retry {
    minimum_backoff = "10s"
  }
}
"""


def test_an_unknown_argument_and_unknown_blocks_fail_naming_what_is_allowed(schemas: Schemas) -> None:
    problems = check_file(schemas, parse(BAD), "bad.tf")
    assert len(problems) == 3, problems
    top, nested, block = (next(p for p in problems if word in p) for word in ("_secs", "audiences", "'retry'"))
    assert top.startswith("bad.tf: resource google_pubsub_subscription.push: unknown argument 'ack_deadline_secs';")
    assert "allowed arguments: ack_deadline_seconds," in top and "blocks: bigquery_config," in top
    assert "unknown argument 'audiences' in push_config.oidc_token;" in nested
    assert "allowed arguments: audience, service_account_email; blocks: none" in nested
    assert "unknown block 'retry';" in block and "retry_policy" in block


def test_an_unknown_nested_block_fails(schemas: Schemas) -> None:
    text = BAD.replace("ack_deadline_secs", "ack_deadline_seconds").replace("audiences", "audience")
    text = text.replace("retry {", "retry_policy {").replace("oidc_token {", "oidc {")
    problems = check_file(schemas, parse(text), "bad.tf")
    assert problems == [
        "bad.tf: resource google_pubsub_subscription.push: unknown block 'oidc' in push_config; "
        "allowed arguments: attributes, push_endpoint; blocks: no_wrapper, oidc_token"
    ]


def test_unknown_types_blocks_as_arguments_and_dynamic_blocks(schemas: Schemas) -> None:
    text = """
    resource "google_pubsub_subscriptions" "a" {}
    data "google_projects_x" "b" {}
    resource "google_storage_bucket" "c" {
      name          = "n"
      location      = "US"
      versioning    = { enabled = true }
      labels { a = "b" }
      dynamic "lifecycle_rule" {
        for_each = [1]
        content {
          action { type = "Delete" }
          condition { ages = 1 }
        }
      }
      lifecycle { prevent_destroy = true }
      depends_on = []
    }
    provider "google" { projekt = "p" }
    """
    problems = check_file(schemas, parse(text), "t.tf")
    wrong_type = [p for p in problems if "has no" in p]
    assert wrong_type[0].startswith("t.tf: resource google_pubsub_subscriptions.a: google has no resource type")
    assert "did you mean" in wrong_type[0] and "google_pubsub_subscription" in wrong_type[0]
    assert wrong_type[1].startswith("t.tf: data.google_projects_x.b: google has no data type 'google_projects_x'")
    bucket = schemas.get("resource", "google_storage_bucket")
    assert bucket is not None and (provider := schemas.get("provider", "google")) is not None
    assert [p for p in problems if p not in wrong_type] == [
        "t.tf: resource google_storage_bucket.c: 'versioning' is a block, written as an argument (versioning = ...)",
        "t.tf: resource google_storage_bucket.c: 'labels' is an argument, written as a block (labels { ... })",
        "t.tf: resource google_storage_bucket.c: unknown argument 'ages' in lifecycle_rule.condition; allowed "
        + bucket.blocks["lifecycle_rule"].blocks["condition"].allowed(),
        "t.tf: provider google: unknown argument 'projekt'; allowed " + provider.allowed(),
    ]
