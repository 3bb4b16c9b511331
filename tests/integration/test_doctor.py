"""`respawn doctor` end to end against the local cloud: the local APIs (Service Usage, Policy Troubleshooter,
Compute Engine, Cloud TPU, Artifact Registry, Org Policy: localcloud/apis/project_api.py), fake-gcs-server and the
Pub/Sub emulator, through the real discovery clients. A healthy deployment passes every line; one broken in one way
fails that line alone, and the line names the fix."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
import requests

from localcloud.apis.cloudapi import CloudApiServer
from localcloud.apis.project_state import LocalProject, healthy
from localcloud.services.emulators import FakeGcs, PubSubEmulator, patched_env
from respawn.deployment import Settings
from respawn.jobs import JobSpec
from respawn.spec import parse_job_message
from respawn_cli import main as cli
from respawn_cli.doctor import report
from respawn_cli.doctor.checks import FAIL, PASS, WARN, Line
from respawn_cli.doctor.clients import Clients, endpoints_from_env
from respawn_ops import needs

pytestmark = pytest.mark.emulator

PROJECT = "doctor-proj"
STATE, CHECKPOINTS, REPOSITORY = (
    "doctor-state",
    "doctor-checkpoints",
    f"projects/{PROJECT}/locations/us/repositories/respawn",
)
IMAGE = f"us-docker.pkg.dev/{PROJECT}/respawn/trainer:v1"
ORCHESTRATOR = needs.account_email(needs.ORCHESTRATOR, PROJECT)
MACHINE = needs.account_email(needs.MACHINE, PROJECT)
TOPICS = ("respawn-jobs", "respawn-events", "respawn-status", "respawn-dead-letter")
SUBSCRIPTIONS = {
    "respawn-on-job-message-push": "respawn-jobs",
    "respawn-on-event-push": "respawn-events",
    "respawn-dead-letter": "respawn-dead-letter",
}
SETTINGS = Settings(
    project=PROJECT,
    state_bucket=STATE,
    status_topic="respawn-status",
    network=f"projects/{PROJECT}/global/networks/respawn",
    subnetwork="ml",
    external_ips=False,
)
GPU_JOB = {
    "action": "submit",
    "job_id": "doctor-gpu",
    "machine": {
        "kind": "gpu",
        "machine_type": "g2-standard-8",
        "accelerator_type": "nvidia-l4",
        "accelerator_count": 1,
    },
    "zones": ["us-central1-a", "us-central1-b", "us-west4-a"],
    "provisioning": "spot",
    "image": IMAGE,
    "checkpoint_uri": f"gs://{CHECKPOINTS}/runs/doctor-gpu",
    "ttl": "2h",
}
SLICE_JOB = {
    **GPU_JOB,
    "job_id": "doctor-slice",
    "machine": {"kind": "tpu", "accelerator_type": "v5litepod-16", "runtime_version": "v2-alpha-tpuv5-lite"},
    "zones": ["us-central1-a", "us-central1-c"],
}


def job(message: dict[str, Any]) -> JobSpec:
    spec = parse_job_message(message)
    assert isinstance(spec, JobSpec)
    return spec


@dataclass
class Cloud:
    server: CloudApiServer
    env: dict[str, str]

    @property
    def project(self) -> LocalProject:
        assert self.server.project.project is not None
        return self.server.project.project

    def unoffer(self, zone: str, type_name: str) -> None:
        """`zone` no longer offers the machine or accelerator type (the local APIs' offerings.py)."""
        self.server.unoffered = {zone: frozenset({type_name})}

    def fresh(self) -> LocalProject:
        """The project as `terraform apply` leaves it, served from now on."""
        self.server.unoffered = {}
        self.server.project.project = healthy(
            PROJECT, state_bucket=STATE, checkpoint_bucket=CHECKPOINTS, repository=REPOSITORY, image="trainer", tag="v1"
        )
        assert self.server.project.project is not None
        return self.server.project.project

    def doctor(self, spec: JobSpec | None, settings: Settings = SETTINGS) -> list[Line]:
        clients = Clients(endpoints_from_env(self.env))
        try:
            return list(report.run(report.deployment(settings, clients=clients), "respawn-status", spec))
        finally:
            clients.close()


@pytest.fixture(scope="module")
def cloud(fake_gcs: FakeGcs, pubsub_emulator: PubSubEmulator) -> Iterator[Cloud]:
    """The local APIs, and the deployment's buckets, topics and subscriptions on the session's emulators."""
    with CloudApiServer() as server:
        for bucket in (STATE, CHECKPOINTS):
            r = requests.post(
                f"{fake_gcs.url}/storage/v1/b",
                json={"name": bucket, "location": "US-CENTRAL1"},
                params={"project": PROJECT},
                timeout=10,
            )
            assert r.status_code in (200, 409), r.text
        rest = f"http://{pubsub_emulator.host}/v1/projects/{PROJECT}"
        for topic in TOPICS:
            r = requests.put(f"{rest}/topics/{topic}", json={}, timeout=10)
            assert r.status_code in (200, 409), r.text
        for subscription, topic in SUBSCRIPTIONS.items():
            body = {"topic": f"projects/{PROJECT}/topics/{topic}"}
            r = requests.put(f"{rest}/subscriptions/{subscription}", json=body, timeout=10)
            assert r.status_code in (200, 409), r.text
        env = {
            "RESPAWN_GOOGLE_APIS_ENDPOINT": server.url,
            "RESPAWN_COMPUTE_ENDPOINT": server.url,
            "RESPAWN_TPU_ENDPOINT": server.url,
            "STORAGE_EMULATOR_HOST": fake_gcs.url,
            "PUBSUB_EMULATOR_HOST": pubsub_emulator.host,
        }
        yield Cloud(server, env)


def fails(lines: list[Line]) -> list[Line]:
    return [line for line in lines if line.status == FAIL]


@pytest.mark.parametrize("message", [GPU_JOB, SLICE_JOB], ids=["gpu", "tpu-slice"])
def test_a_healthy_deployment_passes_every_line(cloud: Cloud, message: dict[str, Any]) -> None:
    cloud.fresh()
    lines = cloud.doctor(job(message))
    others = [(line.check, line.status) for line in lines if line.status != PASS]
    # a TPU's quota is the Cloud TPU API's, which regions.get does not list: a warning, not a check
    assert others == ([] if message is GPU_JOB else [("quota", "warn")]), others
    checks = {line.check for line in lines}
    for check in (
        "APIs enabled",
        "orchestrator's permissions on the project",
        "network",
        "subnetwork in us-central1",
        "state bucket",
        "Pub/Sub topics",
        "Pub/Sub subscriptions",
        "zones offer the machine",
        "checkpoint bucket",
        "machines write the checkpoint bucket",
        "trainer image",
        "image location",
        "org policy gcp.resourceLocations",
    ):
        assert check in checks, check
    assert ("slice firewall rule" in checks) == (message is SLICE_JOB)
    assert ("quota in us-central1" in checks) == (message is GPU_JOB)


def test_without_a_job_the_deployment_alone_is_checked(cloud: Cloud) -> None:
    cloud.fresh()
    lines = cloud.doctor(None)
    assert lines and all(line.status == PASS for line in lines)
    assert not any(line.check.startswith(("quota", "zones", "trainer image", "checkpoint")) for line in lines)


def test_a_job_without_image_is_checked_all_but_its_image(cloud: Cloud) -> None:
    """The CLI does not know the deployment's trainer images (RESPAWN_TRAINER_IMAGES is the functions'): the doctor
    checks the rest of a job that names none, and says that its image is not checked."""
    cloud.fresh()
    spec = cli.job_spec({k: v for k, v in GPU_JOB.items() if k != "image"})
    assert isinstance(spec, JobSpec)
    lines = cloud.doctor(spec)
    (image,) = [line for line in lines if line.check == "trainer image"]
    assert image.status == WARN and image.detail.startswith("the job names no image: it runs the deployment's"), image
    assert "terraform -chdir=infra/terraform output trainer_images" in image.fix
    others = [line for line in lines if line.status != PASS and line is not image]
    assert others == [], others
    assert "zones offer the machine" in {line.check for line in lines}


Break = Callable[[Cloud], Any]
SLICE = job(SLICE_JOB)
GPU = job(GPU_JOB)
BROKEN: list[tuple[str, Break, JobSpec, Settings, str, str, str]] = [
    # (case, break the project, job, settings, failing check, words of its detail, words of its fix)
    (
        "missing permission",
        lambda c: c.project.revoke(
            ORCHESTRATOR, f"//cloudresourcemanager.googleapis.com/projects/{PROJECT}", "compute.instanceGroups.create"
        ),
        GPU,
        SETTINGS,
        "orchestrator's permissions on the project",
        "lacks compute.instanceGroups.create",
        "google_project_iam_member.orchestrator_machines",
    ),
    (
        "zone without the machine",
        lambda c: c.unoffer("us-central1-b", "nvidia-l4"),
        GPU,
        SETTINGS,
        "zones offer the machine",
        "us-central1-b does not offer",
        "remove us-central1-b",
    ),
    (
        "tpu zone without the machine",
        lambda c: c.unoffer("us-central1-c", "v5litepod-16"),
        SLICE,
        SETTINGS,
        "zones offer the machine",
        "us-central1-c does not offer TPU type v5litepod-16",
        "remove us-central1-c",
    ),
    (
        "no quota",
        lambda c: c.project.quotas["us-west4"].update(PREEMPTIBLE_NVIDIA_L4_GPUS=[8.0, 8.0]),
        GPU,
        SETTINGS,
        "quota in us-west4",
        "PREEMPTIBLE_NVIDIA_L4_GPUS: 0 of 8 free",
        "request PREEMPTIBLE_NVIDIA_L4_GPUS in us-west4",
    ),
    (
        "missing subnetwork",
        lambda c: c.project.subnetworks.pop((PROJECT, "us-west4", "ml")),
        GPU,
        SETTINGS,
        "subnetwork in us-west4",
        "no subnetwork ml in us-west4",
        "subnetwork_ranges",
    ),
    (
        "missing network",
        lambda c: c.project.networks.clear(),
        GPU,
        SETTINGS,
        "network",
        "does not exist",
        "A project without a default network",
    ),
    (
        "missing firewall rule",
        lambda c: c.project.firewalls.clear(),
        SLICE,
        SETTINGS,
        "slice firewall rule",
        "tcp 8482",
        "slice_firewall = true",
    ),
    (
        "unwritable bucket",
        lambda c: c.project.revoke(
            MACHINE, f"//storage.googleapis.com/projects/_/buckets/{CHECKPOINTS}", "storage.objects.create"
        ),
        GPU,
        SETTINGS,
        "machines write the checkpoint bucket",
        "lacks storage.objects.create",
        f"gcloud storage buckets add-iam-policy-binding gs://{CHECKPOINTS}",
    ),
    (
        "missing image",
        lambda c: c.project.repositories[REPOSITORY].packages["trainer"].clear(),
        GPU,
        SETTINGS,
        "trainer image",
        f"{IMAGE} does not exist",
        f"docker push {IMAGE}",
    ),
    (
        "missing bucket",
        lambda c: None,
        replace(GPU, checkpoint_uri="gs://doctor-typo/runs/x"),
        SETTINGS,
        "checkpoint bucket",
        "gs://doctor-typo does not exist",
        "gcloud storage buckets create gs://doctor-typo",
    ),
    (
        "disabled API",
        lambda c: c.project.apis.discard("tpu.googleapis.com"),
        GPU,
        SETTINGS,
        "APIs enabled",
        "tpu.googleapis.com",
        "gcloud services enable tpu.googleapis.com",
    ),
    (
        "missing topic",
        lambda c: None,
        GPU,
        replace(SETTINGS, jobs_topic="respawn-jobz"),
        "Pub/Sub topics",
        "respawn-jobz",
        "pubsub.tf",
    ),
    (
        "external IPs forbidden",
        lambda c: c.project.org_policies.update({"compute.vmExternalIpAccess": {"rules": [{"denyAll": True}]}}),
        GPU,
        replace(SETTINGS, external_ips=True),
        "org policy compute.vmExternalIpAccess",
        "forbids external IPs",
        "external_ip = false",
    ),
    (
        "location forbidden",
        lambda c: c.project.org_policies.update(
            {"gcp.resourceLocations": {"rules": [{"values": {"allowedValues": ["in:us-locations"]}}]}}
        ),
        replace(GPU, zones=("us-central1-a", "europe-west4-a")),
        SETTINGS,
        "org policy gcp.resourceLocations",
        "does not allow europe-west4-a",
        "zones the policy allows",
    ),
]


@pytest.mark.parametrize(
    ("case", "breaks", "spec", "settings", "check", "detail", "fix"), BROKEN, ids=[b[0] for b in BROKEN]
)
def test_a_deployment_broken_one_way_fails_that_line_and_names_the_fix(
    cloud: Cloud, case: str, breaks: Break, spec: JobSpec, settings: Settings, check: str, detail: str, fix: str
) -> None:
    cloud.fresh()
    breaks(cloud)
    failed = fails(cloud.doctor(spec, settings))
    assert [line.check for line in failed] == [check], [line.text() for line in failed]
    assert detail in failed[0].detail and fix in failed[0].fix, failed[0].text()


def test_a_check_the_caller_may_not_make_is_a_warning_naming_the_roles_it_needs(cloud: Cloud) -> None:
    """The Policy Troubleshooter refuses a caller without roles/iam.securityReviewer: the permission lines warn, and
    nothing fails (the deployment may be fine)."""
    cloud.fresh().refused.add("troubleshoot")
    lines = cloud.doctor(GPU)
    warned = [line for line in lines if line.status != PASS]
    assert warned and all(line.status == "warn" for line in warned)
    assert {line.check for line in warned} == {
        "orchestrator's permissions on the project",
        "machine's permissions on the project",
        "orchestrator's permissions on the state bucket",
        "orchestrator's permissions on the status topic",
        "orchestrator's permissions on the machines' account",
        "machines write the checkpoint bucket",
        "machines pull the image",
    }
    assert all("HTTP 403" in line.detail and "roles/iam.securityReviewer" in line.fix for line in warned)


def test_the_cli_exits_0_on_a_healthy_deployment_and_1_on_a_broken_one(
    cloud: Cloud, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    path = tmp_path / "job.json"
    path.write_text(json.dumps(GPU_JOB))
    env = {
        **cloud.env,
        "RESPAWN_PROJECT": PROJECT,
        "RESPAWN_STATE_BUCKET": STATE,
        "RESPAWN_STATUS_TOPIC": "respawn-status",
        "RESPAWN_NETWORK": SETTINGS.network or "",
        "RESPAWN_SUBNETWORK": "ml",
        "RESPAWN_EXTERNAL_IP": "false",
    }
    project = cloud.fresh()
    with patched_env(env):
        assert cli.main(["doctor", str(path)]) == 0
        out = capsys.readouterr().out
        assert out.splitlines()[-1].endswith(" 0 failed") and "pass  zones offer the machine" in out
        project.quotas["us-central1"]["PREEMPTIBLE_NVIDIA_L4_GPUS"] = [0.0, 0.0]
        assert cli.main(["doctor", str(path), "--json"]) == 1
        lines = json.loads(capsys.readouterr().out)
    assert [(line["check"], line["status"]) for line in lines if line["status"] != PASS] == [
        ("quota in us-central1", FAIL)
    ]


def test_doctor_without_a_project_or_with_a_cancel_message_is_a_user_error(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("RESPAWN_PROJECT", "GOOGLE_CLOUD_PROJECT", "RESPAWN_STATE_BUCKET"):
        monkeypatch.delenv(name, raising=False)
    assert cli.main(["doctor"]) == 2
    assert "RESPAWN_PROJECT is not set" in capsys.readouterr().err
    cancel = tmp_path / "cancel.yaml"
    cancel.write_text("action: cancel\njob_id: doctor-gpu\n")
    assert cli.main(["doctor", str(cancel), "--project", PROJECT, "--bucket", STATE]) == 2
    assert "doctor takes a submit message" in capsys.readouterr().err
