"""Offline checks of infra/terraform: it parses, and it declares what the event chain and least privilege need."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tfconfig import REPO, TF_DIR, Config, block, parse, strings

from respawn.events import SweepTicked
from respawn.parsing import PubSubMessage, events_event
from respawn_ops import logfilter

EXPECTED_FILES = {
    "apis.tf",
    "artifact_registry.tf",
    "functions.tf",
    "iam.tf",
    "monitoring.tf",
    "network.tf",
    "outputs.tf",
    "pubsub.tf",
    "scheduler.tf",
    "sink.tf",
    "storage.tf",
    "variables.tf",
    "variables_monitoring.tf",
    "versions.tf",
}


@pytest.fixture(scope="module")
def config() -> Config:
    return Config.load()


@pytest.mark.parametrize("path", sorted(TF_DIR.glob("*.tf")), ids=lambda p: p.name)
def test_every_tf_file_parses(path: Path) -> None:
    assert parse(path), f"{path.name} is empty"


def test_every_tf_file_is_formatted_as_terraform_fmt_writes_it() -> None:
    binary = shutil.which("terraform")
    if binary is None:  # no package registry serves it: a machine without it skips (parsing is checked above)
        pytest.skip("terraform is not installed (HashiCorp's binary, on PATH)")
    done = subprocess.run(
        [binary, "fmt", "-check", "-list=true", "-no-color", "."],
        cwd=TF_DIR,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"run `terraform fmt` in infra/terraform: {done.stdout.split()}"


def test_the_configuration_is_split_by_concern() -> None:
    assert {p.name for p in TF_DIR.glob("*.tf")} == EXPECTED_FILES


def test_tfvars_example_sets_only_declared_variables(config: Config) -> None:
    example = parse(TF_DIR / "terraform.tfvars.example")
    assert set(example) <= set(config.variables)
    required = {name for name, body in config.variables.items() if "default" not in body}
    assert required == {"project"} and required <= set(example)


def test_versions_pin_terraform_and_providers() -> None:
    terraform = parse(TF_DIR / "versions.tf")["terraform"][0]
    assert terraform["required_version"].startswith(">=")
    providers = terraform["required_providers"][0]
    assert providers["google"]["source"] == "hashicorp/google"
    assert providers["archive"]["version"] == "~> 2.5"
    assert "gcs" in terraform["backend"][0]  # remote state: Cloud Build workers are ephemeral


REQUIRED_RESOURCES = {
    ("google_pubsub_topic", "jobs"),
    ("google_pubsub_topic", "events"),
    ("google_pubsub_topic", "dead_letter"),
    ("google_pubsub_topic", "status"),
    ("google_pubsub_subscription", "dead_letter"),
    ("google_pubsub_subscription", "push"),
    ("google_logging_project_sink", "events"),
    ("google_pubsub_topic_iam_member", "sink_publisher"),
    ("google_cloudfunctions2_function", "respawn"),
    ("google_cloud_scheduler_job", "sweep"),
    ("google_storage_bucket", "state"),
    ("google_storage_bucket", "checkpoints"),
    ("google_artifact_registry_repository", "trainer"),
    ("google_service_account", "orchestrator"),
    ("google_service_account", "machine"),
    ("google_project_iam_custom_role", "orchestrator"),
}


def test_required_resources_exist(config: Config) -> None:
    assert set(config.resources) >= REQUIRED_RESOURCES, REQUIRED_RESOURCES - set(config.resources)


def test_topic_names_are_the_contract(config: Config) -> None:
    assert config.resource("google_pubsub_topic", "jobs")["name"] == "respawn-jobs"
    assert config.resource("google_pubsub_topic", "events")["name"] == "respawn-events"
    assert config.resource("google_pubsub_topic", "status")["name"] == "respawn-status"
    dead_letter = config.resource("google_pubsub_subscription", "dead_letter")
    assert dead_letter["topic"] == "${google_pubsub_topic.dead_letter.id}"


# --- the sink ----------------------------------------------------------------------------------------------------


def test_the_sink_reads_the_filter_from_its_single_source(config: Config) -> None:
    sink = config.resource("google_logging_project_sink", "events")
    assert config.file_target(sink["filter"]) == Path(str(logfilter.SINK_FILTER)).resolve()
    assert sink["destination"] == "pubsub.googleapis.com/${google_pubsub_topic.events.id}"
    assert sink["unique_writer_identity"] is True


def test_only_the_sink_writer_identity_may_publish_to_respawn_events(config: Config) -> None:
    on_events = [
        (type_, body)
        for (type_, _), body in config.resources.items()
        if type_.startswith("google_pubsub_topic_iam") and body.get("topic") == "${google_pubsub_topic.events.id}"
    ]
    assert on_events == [
        (
            "google_pubsub_topic_iam_member",
            {
                "topic": "${google_pubsub_topic.events.id}",
                "role": "roles/pubsub.publisher",
                "member": "${google_logging_project_sink.events.writer_identity}",
            },
        )
    ]


# --- least privilege ---------------------------------------------------------------------------------------------

PRIMITIVE = re.compile(r"roles/(owner|editor|viewer)\b")
PUBLIC = re.compile(r"\ball(Authenticated)?Users\b")


def broad_grants(config: Config) -> list[str]:
    everything = strings([config.resources, config.data, config.locals, config.variables, config.outputs])
    return [s for s in everything if PRIMITIVE.search(s) or PUBLIC.search(s)]


def test_no_primitive_roles_and_no_public_members_anywhere(config: Config) -> None:
    assert broad_grants(config) == []


def test_the_scan_for_broad_grants_can_fail(tmp_path: Path) -> None:
    (tmp_path / "bad.tf").write_text(
        'resource "google_project_iam_member" "x" {\n  role = "roles/editor"\n  member = "user:a@b.c"\n}\n'
        'resource "google_storage_bucket_iam_binding" "y" {\n  role = "roles/storage.objectViewer"\n'
        '  members = ["allUsers"]\n}\n'
        'locals {\n  fine = "roles/viewerish.thing allUsersX"\n}\n'
    )
    assert broad_grants(Config.load(tmp_path)) == ["roles/editor", "allUsers"]


def members_with_role(config: Config, type_: str, role: str) -> dict[str, str]:
    return {name: body["member"] for name, body in config.of_type(type_).items() if body["role"] == role}


ORCHESTRATOR = "${google_service_account.orchestrator.member}"
MACHINE = "${google_service_account.machine.member}"


def test_the_orchestrator_has_a_custom_role_for_machines_only(config: Config) -> None:
    permissions = set(config.role_permissions("orchestrator"))
    # Cloud TPU has no tpu.queuedResources.* permissions: tpu.nodes.* covers queued resources (test_iam_support.py)
    needed = {f"tpu.nodes.{verb}" for verb in ("create", "delete", "get", "list", "update")} | {
        f"compute.instances.{verb}" for verb in ("create", "delete", "get", "list", "setMetadata", "setLabels")
    }
    assert needed | {"tpu.operations.get", "compute.zoneOperations.get", "compute.disks.create"} <= permissions
    assert all(p.startswith(("tpu.", "compute.")) for p in permissions)
    assert not any(p.endswith(("setIamPolicy", ".start", ".stop", ".reset")) for p in permissions)
    # no update of any object but a TPU node's metadata (nodes.patch, updateMask=metadata: a world of several
    # slices, docs/design/several-slices.md): a flex-start slice is a BULK MIG created at its full size, never resized
    assert [p for p in permissions if p.endswith(".update")] == ["tpu.nodes.update"]
    assert len(config.role_permissions("orchestrator")) == len(permissions)  # no permission listed twice
    grant = config.resource("google_project_iam_member", "orchestrator_machines")
    assert grant == {
        "project": "${var.project}",
        "role": "${google_project_iam_custom_role.orchestrator.id}",
        "member": ORCHESTRATOR,
    }


# What the Compute Engine TPU path calls (docs/compute-engine.md, "IAM"): per object, exactly these verbs.
COMPUTE_TPU_PATH = {
    "instances": {"create", "delete", "get", "list", "setLabels", "setMetadata", "setScheduling", "setServiceAccount"},
    "instanceTemplates": {"create", "delete", "get", "list", "useReadOnly"},  # list: a crash's leftover template
    "resourcePolicies": {"create", "delete", "get", "list", "use"},  # list: a crash's leftover policy
    "instanceGroupManagers": {"create", "delete", "get", "list"},
    "instanceGroups": {"create", "delete"},  # a MIG is an instance group of its name, created and deleted with it
    "zoneOperations": {"get"},
    "regionOperations": {"get"},
    "globalOperations": {"get"},
    # what instances.insert checks for the boot disk, its image and the NIC (GPU VMs needed them before)
    "disks": {"create", "setLabels"},
    "images": {"useReadOnly"},
    "subnetworks": {"use", "useExternalIp"},
    # placement advice for GPU machine types (respawn/adapters/advice.py): read-only
    "advice": {"capacity", "capacityHistory"},
}


def compute_verbs(permissions: list[str]) -> dict[str, set[str]]:
    verbs: dict[str, set[str]] = {}
    for permission in permissions:
        service, kind, verb = permission.split(".")
        if service == "compute":
            verbs.setdefault(kind, set()).add(verb)
    return verbs


def test_the_compute_engine_permissions_are_exactly_what_the_tpu_path_calls(config: Config) -> None:
    """Slices (policy, template, MIG) and single-host TPU VMs, and nothing broader: no wildcard,
    no IAM policy changes, no instance updates, restarts or resizes, no other kind of object."""
    assert compute_verbs(config.role_permissions("orchestrator")) == COMPUTE_TPU_PATH


def test_the_compute_permission_check_can_fail() -> None:
    broader = [f"compute.{kind}.{verb}" for kind, verbs in COMPUTE_TPU_PATH.items() for verb in verbs]
    assert compute_verbs(broader) == COMPUTE_TPU_PATH
    assert compute_verbs([*broader, "compute.instances.start"]) != COMPUTE_TPU_PATH
    assert compute_verbs([p for p in broader if p != "compute.regionOperations.get"]) != COMPUTE_TPU_PATH


def test_only_the_orchestrator_publishes_status_notices(config: Config) -> None:
    on_status = [
        body for (type_, _), body in config.resources.items() if body.get("topic") == "${google_pubsub_topic.status.id}"
    ]
    assert on_status == [
        {"topic": "${google_pubsub_topic.status.id}", "role": "roles/pubsub.publisher", "member": ORCHESTRATOR}
    ]


def test_machines_read_only_the_listed_secrets(config: Config) -> None:
    grants = config.of_type("google_secret_manager_secret_iam_member")
    assert grants == {
        "machine_reads_secret": {
            "for_each": "${toset(var.machine_secret_ids)}",
            "project": "${var.project}",
            "secret_id": "${each.value}",
            "role": "roles/secretmanager.secretAccessor",
            "member": MACHINE,
        }
    }
    assert config.variables["machine_secret_ids"]["default"] == []  # nothing readable unless listed
    everything = strings([config.resources, config.data, config.locals])
    assert [s for s in everything if s.startswith("roles/secretmanager.")] == ["roles/secretmanager.secretAccessor"]


def test_project_level_grants_are_exactly_these(config: Config) -> None:
    project_roles = sorted(
        (body["role"], body["member"]) for body in config.of_type("google_project_iam_member").values()
    )
    build = "${google_service_account.build.member}"
    assert project_roles == [
        ("${google_project_iam_custom_role.machine_peers.id}", MACHINE),  # a multi-VM GPU machine lists its MIG
        ("${google_project_iam_custom_role.orchestrator.id}", ORCHESTRATOR),
        ("roles/logging.logWriter", build),
        ("roles/logging.logWriter", MACHINE),
        ("roles/logging.logWriter", ORCHESTRATOR),
        ("roles/storage.objectAdmin", build),  # as Google documents for a build service account, on its sources
    ]
    conditioned = {
        body["role"]: block(body, "condition")["expression"]
        for body in config.of_type("google_project_iam_member").values()
        if body["role"] == "roles/storage.objectAdmin"
    }
    assert "buckets/gcf-v2-sources-" in conditioned["roles/storage.objectAdmin"]


def test_bucket_grants_are_per_bucket(config: Config) -> None:
    grants = sorted(
        (body["bucket"], body["role"], body["member"])
        for body in config.of_type("google_storage_bucket_iam_member").values()
    )
    assert grants == [
        ("${google_storage_bucket.checkpoints.name}", "roles/storage.objectAdmin", MACHINE),
        ("${google_storage_bucket.state.name}", "roles/storage.objectAdmin", ORCHESTRATOR),
    ]


def test_act_as_is_granted_on_the_machine_account_only(config: Config) -> None:
    """Instances, instance templates and the MIGs built from them name the machines' account: the functions may act
    as that one account (Service Account User on it), on no other account and not project-wide."""
    act_as = [
        body
        for body in config.of_type("google_service_account_iam_member").values()
        if body["role"] == "roles/iam.serviceAccountUser"
    ]
    assert act_as == [
        {
            "service_account_id": "${google_service_account.machine.name}",
            "role": "roles/iam.serviceAccountUser",
            "member": ORCHESTRATOR,
        }
    ]
    everything = strings([config.resources, config.data, config.locals])
    assert "iam.serviceAccounts.actAs" not in everything  # not folded into the project-wide custom role
    assert not [
        body
        for type_ in ("google_project_iam_member", "google_project_iam_binding")
        for body in config.of_type(type_).values()
        if body["role"].startswith("roles/iam.")
    ]


def test_machines_pull_the_trainer_image_from_that_repository_only(config: Config) -> None:
    grant = config.resource("google_artifact_registry_repository_iam_member", "machine_pulls_trainer")
    assert grant["repository"] == "${google_artifact_registry_repository.trainer.name}"
    assert (grant["role"], grant["member"]) == ("roles/artifactregistry.reader", MACHINE)


def test_machines_pull_regional_copies_of_the_trainer_image_only_from_those_repositories(config: Config) -> None:
    """image_regions: a repository of the same name per region but the functions' own, each readable by the machines."""
    repo = config.resource("google_artifact_registry_repository", "trainer_regional")
    main = config.resource("google_artifact_registry_repository", "trainer")
    assert repo["for_each"] == "${local.image_regions}" and repo["location"] == "${each.value}"
    assert repo["repository_id"] == main["repository_id"] and repo["format"] == "DOCKER"
    assert block(repo, "docker_config")["immutable_tags"] is True
    assert repo["cleanup_policies"] == main["cleanup_policies"]
    locals_ = parse(TF_DIR / "artifact_registry.tf")["locals"][0]
    assert locals_["image_regions"] == "${setsubtract(toset(var.image_regions), [var.region])}"
    grant = config.resource("google_artifact_registry_repository_iam_member", "machine_pulls_trainer_regional")
    assert grant["for_each"] == "${google_artifact_registry_repository.trainer_regional}"
    assert (grant["repository"], grant["role"], grant["member"]) == (
        "${each.value.name}",
        "roles/artifactregistry.reader",
        MACHINE,
    )
    assert config.variables["image_regions"]["default"] == []


@pytest.mark.parametrize(
    ("region", "allowed"),
    [("europe-west4", True), ("us", True), ("asia", True), ("us-central1-a", False), ("US", False), ("", False)],
)
def test_image_regions_are_regions_or_multi_regions(config: Config, region: str, allowed: bool) -> None:
    (validation,) = config.variables["image_regions"]["validation"]
    pattern = re.search(r'regex\("(.+?)", r\)', validation["condition"])
    assert pattern is not None
    assert bool(re.fullmatch(pattern.group(1), region)) is allowed


def test_only_the_push_identity_invokes_the_functions(config: Config) -> None:
    invokers = config.of_type("google_cloud_run_v2_service_iam_member")
    assert invokers == {
        "push_invokes": {
            "for_each": "${google_cloudfunctions2_function.respawn}",
            "location": "${each.value.location}",
            "name": "${each.value.name}",
            "role": "roles/run.invoker",
            "member": "${google_service_account.push.member}",
        }
    }


# --- functions and delivery --------------------------------------------------------------------------------------


def cloud_event_functions() -> set[str]:
    tree = ast.parse((REPO / "functions" / "main.py").read_text(encoding="utf-8"))
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and any(ast.unparse(d) == "functions_framework.cloud_event" for d in node.decorator_list)
    }


def test_functions_are_2nd_gen_python_with_deliberate_limits(config: Config) -> None:
    fn = config.resource("google_cloudfunctions2_function", "respawn")
    assert fn["for_each"] == "${local.functions}"
    assert set(config.locals["functions"]) == {"on_job_message", "on_event"}
    assert set(config.locals["functions"]) <= cloud_event_functions()  # entry points exist as CloudEvent functions
    build = block(fn, "build_config")
    assert build["entry_point"] == "${each.key}"
    assert config.variables["python_runtime"]["default"] in ("python311", "python312")
    service = block(fn, "service_config")
    assert service["ingress_settings"] == "ALLOW_INTERNAL_ONLY"
    assert service["service_account_email"] == "${google_service_account.orchestrator.email}"
    for knob in ("timeout_seconds", "max_instance_count", "available_memory", "max_instance_request_concurrency"):
        assert knob in service, knob
    assert service["environment_variables"] == "${local.function_environment}"
    assert set(config.locals["function_environment"]) == {
        "RESPAWN_PROJECT",
        "RESPAWN_STATE_BUCKET",
        "RESPAWN_JOBS_TOPIC",
        "RESPAWN_EVENTS_TOPIC",
        "RESPAWN_STATUS_TOPIC",
        "RESPAWN_MACHINE_SERVICE_ACCOUNT",
        "RESPAWN_NETWORK",
        "RESPAWN_SUBNETWORK",
        "RESPAWN_EXTERNAL_IP",
        "RESPAWN_TRAINER_IMAGES",
    }
    source = block(block(build, "source"), "storage_source")
    assert source["object"] == "${google_storage_bucket_object.functions_source.name}"
    archive = config.data[("archive_file", "functions")]
    assert archive["source_dir"] == "${path.module}/../../functions"
    assert not [e for e in archive["excludes"] if "respawn" in e]  # all of functions/ ships: test_deployed_source.py


def test_each_function_is_fed_with_retry_and_dead_lettering(config: Config) -> None:
    topics = {key: fn["topic"] for key, fn in config.locals["functions"].items()}
    assert topics == {
        "on_job_message": "${google_pubsub_topic.jobs.id}",
        "on_event": "${google_pubsub_topic.events.id}",
    }
    push = config.resource("google_pubsub_subscription", "push")
    assert (push["for_each"], push["topic"]) == ("${local.functions}", "${each.value.topic}")
    endpoint = "${google_cloudfunctions2_function.respawn[each.key].service_config[0].uri}"
    push_config = block(push, "push_config")
    assert push_config["push_endpoint"] == endpoint
    assert block(push_config, "oidc_token") == {
        "service_account_email": "${google_service_account.push.email}",
        "audience": endpoint,
    }
    assert set(block(push, "retry_policy")) == {"minimum_backoff", "maximum_backoff"}
    dead_letter = block(push, "dead_letter_policy")
    assert dead_letter == {
        "dead_letter_topic": "${google_pubsub_topic.dead_letter.id}",
        "max_delivery_attempts": "${var.max_delivery_attempts}",
    }
    assert 5 <= config.variables["max_delivery_attempts"]["default"] <= 100
    # Pub/Sub's service agent forwards to the dead-letter topic: publisher there, subscriber on the source.
    agent = "${local.pubsub_service_agent}"
    assert config.resource("google_pubsub_topic_iam_member", "dead_letter_publisher")["member"] == agent
    forwarding = config.resource("google_pubsub_subscription_iam_member", "dead_letter_forwarding")
    assert (forwarding["role"], forwarding["member"]) == ("roles/pubsub.subscriber", agent)


def test_the_scheduler_publishes_the_sweep_tick_the_parser_expects(config: Config) -> None:
    target = block(config.resource("google_cloud_scheduler_job", "sweep"), "pubsub_target")
    assert target["topic_name"] == "${google_pubsub_topic.events.id}"
    m = re.fullmatch(r'\$\{base64encode\(jsonencode\(\{\s*kind\s*=\s*"(\w+)"\s*\}\)\)\}', target["data"])
    assert m, target["data"]
    published = json.dumps({"kind": m[1]}, separators=(",", ":")).encode()  # what jsonencode() produces
    assert isinstance(events_event(PubSubMessage(published, {}, "m1", 0.0)), SweepTicked)


# --- storage, registry, APIs -------------------------------------------------------------------------------------


def test_buckets_are_private_uniform_and_expire_what_they_keep(config: Config) -> None:
    buckets = config.of_type("google_storage_bucket")
    assert set(buckets) == {"state", "checkpoints", "source"}
    for name, bucket in buckets.items():
        assert bucket["uniform_bucket_level_access"] is True, name
        assert bucket["public_access_prevention"] == "enforced", name
    state = buckets["state"]
    assert block(state, "versioning")["enabled"] is True
    assert [block(rule, "condition") for rule in state["lifecycle_rule"]] == [
        {"days_since_noncurrent_time": "${var.state_noncurrent_retention_days}", "with_state": "ARCHIVED"}
    ]
    ages = [block(rule, "condition").get("age") for rule in buckets["checkpoints"]["lifecycle_rule"]]
    assert "${var.checkpoint_retention_days}" in ages


def deleted_by_lifecycle(bucket: dict[str, Any], name: str) -> bool:
    """Whether any Delete rule of the bucket deletes a live object `name` once it is old enough, by Cloud Storage's
    rules (https://cloud.google.com/storage/docs/lifecycle#conditions: a rule applies when all its conditions hold;
    matchesPrefix / matchesSuffix: any of the listed). A condition this does not know fails the test."""
    for rule in bucket["lifecycle_rule"]:
        if block(rule, "action")["type"] != "Delete":
            continue
        condition = dict(block(rule, "condition"))
        condition.pop("age", None)  # the object is as old as it gets
        prefixes, suffixes = condition.pop("matches_prefix", None), condition.pop("matches_suffix", None)
        assert not condition, f"a lifecycle condition the test does not evaluate: {condition}"
        if (prefixes is None or name.startswith(tuple(prefixes))) and (
            suffixes is None or name.endswith(tuple(suffixes))
        ):
            return True
    return False


def test_a_finished_jobs_final_checkpoint_outlives_the_checkpoint_buckets_retention(config: Config) -> None:
    """Where the trainer keeps a SUCCEEDED job's final save (respawn_trainer.checkpoint.final_uri) no rule deletes;
    the job's checkpoints, compile cache and handover objects, under the checkpoint_uri that job messages use
    (gs://BUCKET/runs/JOB, variables.tf), are deleted after checkpoint_retention_days."""
    from respawn_trainer.checkpoint import final_uri

    checkpoints = config.resource("google_storage_bucket", "checkpoints")
    uri = "gs://bucket/runs/llm-small-001"
    kept = final_uri(uri, 20000).removeprefix("gs://bucket/")
    assert not deleted_by_lifecycle(checkpoints, f"{kept}/state/manifest.ocdbt")
    for left in ("20000/state/manifest.ocdbt", "-compile-cache/jit_train", ".respawn/attempt-2.exited"):
        assert deleted_by_lifecycle(checkpoints, f"runs/llm-small-001{'/' if left[0].isdigit() else ''}{left}")
    assert "runs/" in config.variables["checkpoint_bucket_name"]["description"]


def test_the_trainer_image_has_a_docker_repository(config: Config) -> None:
    repo = config.resource("google_artifact_registry_repository", "trainer")
    assert repo["format"] == "DOCKER"
    assert config.variables["artifact_repository"]["default"] == "respawn"


def test_the_needed_apis_are_enabled(config: Config) -> None:
    apis = config.resource("google_project_service", "apis")
    assert apis["for_each"] == "${toset(local.apis)}"
    needed = {
        f"{api}.googleapis.com"
        for api in (
            "cloudfunctions",
            "run",
            "cloudbuild",
            "artifactregistry",
            "pubsub",
            "logging",
            "cloudscheduler",
            "tpu",
            "compute",
            "storage",
            "iam",
            "secretmanager",
        )
    }
    assert needed <= set(config.locals["apis"])


def test_the_apis_respawn_doctor_asks_about_the_project_are_enabled(config: Config) -> None:
    """A fresh project has the Policy Troubleshooter and Org Policy APIs off: doctor's permission and organisation
    policy lines would read "API not enabled" instead of the answer. Every API doctor builds a client for is on."""
    from respawn_cli.doctor import clients

    asked = {f"{api}.googleapis.com" for api in clients.APIS}
    assert {"policytroubleshooter.googleapis.com", "orgpolicy.googleapis.com", "serviceusage.googleapis.com"} <= asked
    assert sorted(asked - set(config.locals["apis"])) == []


def test_the_compute_engine_guide_names_every_kind_of_object_the_role_reaches(config: Config) -> None:
    guide = (REPO / "docs" / "compute-engine.md").read_text(encoding="utf-8")
    iam = guide.split("\n## IAM\n", 1)[1].split("\n## ", 1)[0]
    kinds = set(compute_verbs(config.role_permissions("orchestrator")))
    assert kinds == set(COMPUTE_TPU_PATH)
    assert [kind for kind in sorted(kinds) if f"`compute.{kind}." not in iam] == []
