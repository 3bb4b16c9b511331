"""`respawn doctor` end to end against the local cloud: the local APIs (Service Usage, Policy Troubleshooter,
Resource Manager, Compute Engine, Cloud TPU, Artifact Registry, Org Policy: localcloud/apis/project_api.py),
fake-gcs-server and the Pub/Sub emulator, through the real discovery clients. A healthy deployment passes every
line; one broken in one way fails that line alone, and the line names the fix."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
import requests

from localcloud.apis.cloudapi import CloudApiServer
from localcloud.apis.project_state import LocalProject, add_network, healthy
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
    "zones": ["us-central1-a", "us-west4-a"],  # two zones that offer v5e (localcloud/apis/offerings.py)
}
# A v6e slice on Compute Engine: a MIG of VMs booting Compute Engine's TPU image, which has no Docker
COMPUTE_SLICE_JOB = {**GPU_JOB, "job_id": "doctor-v6e", "machine": {"kind": "tpu", "accelerator_type": "v6e-16"},
                     "zones": ["us-east5-b"]}  # fmt: skip


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
COMPUTE_SLICE = job(COMPUTE_SLICE_JOB)
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
        lambda c: c.unoffer("us-west4-a", "v5litepod-16"),
        SLICE,
        SETTINGS,
        "zones offer the machine",
        "us-west4-a does not offer TPU type v5litepod-16",
        "remove us-west4-a",
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
    (
        "no Cloud NAT where the machines install Docker",
        lambda c: c.project.routers.pop((PROJECT, "us-east5", "respawn-respawn-nat")),
        COMPUTE_SLICE,
        SETTINGS,
        "Cloud NAT in us-east5",
        "apt-get installs Docker from the Ubuntu archive, which Private Google Access does not reach",
        "cloud_nat_regions",
    ),
    (
        "untrusted boot image",
        lambda c: c.project.org_policies.update(
            {"compute.trustedImageProjects": {"rules": [{"values": {"allowedValues": ["projects/debian-cloud"]}}]}}
        ),
        GPU,
        SETTINGS,
        "org policy compute.trustedImageProjects",
        "boot from projects/deeplearning-platform-release",
        "trust projects/deeplearning-platform-release",
    ),
    (
        "denied permission",
        lambda c: c.project.deny(
            ORCHESTRATOR, f"//cloudresourcemanager.googleapis.com/projects/{PROJECT}", "compute.instances.create"
        ),
        GPU,
        SETTINGS,
        "orchestrator's permissions on the project",
        "lacks compute.instances.create",
        "google_project_iam_member.orchestrator_machines",
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


def test_on_a_fresh_project_the_lines_name_the_api_doctor_needs_enabled(cloud: Cloud) -> None:
    """A fresh project has the Policy Troubleshooter and Org Policy APIs off: they answer 403 SERVICE_DISABLED, and
    each line that asks them is a warning naming the `gcloud services enable` that turns it on (not the roles a
    caller lacks); the APIs line fails naming both."""
    project = cloud.fresh()
    project.apis -= {"policytroubleshooter.googleapis.com", "orgpolicy.googleapis.com"}
    lines = cloud.doctor(GPU)
    asking = [line for line in lines if "permissions" in line.check or line.check.startswith("machines ")]
    policies = [line for line in lines if line.check.startswith("org policy")]
    assert len(asking) == 7 and policies
    for line, api in [(line, "policytroubleshooter") for line in asking] + [(line, "orgpolicy") for line in policies]:
        assert line.status == WARN, line.text()
        assert f"{api}.googleapis.com is not enabled in project {project.number}" in line.detail, line.text()
        assert f"gcloud services enable {api}.googleapis.com --project={project.number}" in line.fix, line.text()
    (apis,) = [line for line in lines if line.check == "APIs enabled"]
    assert apis.status == FAIL and "orgpolicy.googleapis.com policytroubleshooter.googleapis.com" in apis.fix


def quota_lines(lines: list[Line]) -> list[Line]:
    return [line for line in lines if line.check.startswith("quota")]


def test_a_gpu_without_a_regions_get_metric_warns_naming_compute_engines_cloud_quotas(cloud: Cloud) -> None:
    """regions.get defines PREEMPTIBLE_NVIDIA_H100_GPUS and no on-demand H100 metric, and none for H100 Mega, H200
    or B200: a Spot H100 is checked, the others warn (never fail) and name Compute Engine's quotas in Cloud Quotas,
    not the Cloud TPU API's."""
    cloud.fresh()
    h100 = {"machine_type": "a3-highgpu-8g", "accelerator_type": "nvidia-h100-80gb", "accelerator_count": 8}
    h200 = {"machine_type": "a3-ultragpu-8g", "accelerator_type": "nvidia-h200-141gb", "accelerator_count": 8}
    for machine, provisioning, checked in [(h100, "spot", True), (h100, "standard", False), (h200, "spot", False)]:
        message = {**GPU_JOB, "machine": {"kind": "gpu", **machine}, "provisioning": provisioning,
                   "zones": ["us-central1-a"]}  # fmt: skip
        lines = quota_lines(cloud.doctor(job(message)))
        assert all(line.status != FAIL for line in lines), [line.text() for line in lines]
        if checked:
            assert [(line.check, line.status) for line in lines] == [("quota in us-central1", PASS)]
            assert lines[0].detail.startswith("PREEMPTIBLE_NVIDIA_H100_GPUS: 16 free")
            continue
        (line,) = lines
        assert line.status == WARN and "Cloud Quotas" in line.detail, line.text()
        assert "GPUS-PER-GPU-FAMILY-per-project-region --service=compute.googleapis.com" in line.fix, line.text()
        assert "tpu.googleapis.com" not in line.fix


@pytest.mark.parametrize(
    ("allowed", "zones", "status", "words"),
    [
        (["in:eu-locations"], ["europe-west4-a", "europe-west4-b"], PASS, "europe-west4-a, europe-west4-b allowed"),
        (["in:eu-locations"], ["europe-west4-a", "europe-west2-a"], FAIL, "does not allow europe-west2-a"),
        (["in:europe-west4-locations"], ["europe-west4-a"], PASS, "allowed"),
        (["in:us-locations", "in:eu-locations"], ["us-central1-a", "europe-west4-a"], PASS, "allowed"),
        (["europe-west4"], ["europe-west4-a"], FAIL, "does not allow europe-west4-a"),
        (["in:low-carbon-locations"], ["europe-west4-a"], WARN, "cannot tell whether in:low-carbon-locations"),
    ],
)
def test_resource_locations_read_value_groups(
    cloud: Cloud, allowed: list[str], zones: list[str], status: str, words: str
) -> None:
    """gcp.resourceLocations as Google defines its values: `in:eu-locations` holds the European Union's regions and
    their zones (europe-west4, not London's europe-west2), `in:REGION-locations` a region's zones; a bare region
    holds the region alone, not its zones; a group doctor cannot expand is a warning."""
    cloud.fresh().org_policies["gcp.resourceLocations"] = {"rules": [{"values": {"allowedValues": allowed}}]}
    (line,) = [line for line in cloud.doctor(replace(GPU, zones=tuple(zones))) if "resourceLocations" in line.check]
    assert line.status == status and words in line.detail, line.text()


def test_machines_without_an_external_ip_need_a_cloud_nat_for_what_they_download(cloud: Cloud) -> None:
    """Compute Engine's TPU image has no Docker (apt-get installs it from the Ubuntu archive) and the GPU image may
    lack the NVIDIA Container Toolkit (nvidia.github.io): without an external IP they need a Cloud NAT serving the
    subnetwork. A NAT of the network serving the subnetwork passes; none fails a Compute Engine TPU and warns a GPU;
    a Cloud TPU API node downloads nothing; machines with an external IP need no NAT."""
    project = cloud.fresh()
    served = [line for line in cloud.doctor(COMPUTE_SLICE) if line.check == "Cloud NAT in us-east5"]
    assert [(line.status, line.detail.split(" serves")[0]) for line in served] == [
        (PASS, "respawn-respawn-nat/respawn-respawn-nat")
    ]
    router = project.routers[(PROJECT, "us-east5", "respawn-respawn-nat")]
    router["nats"][0] |= {
        "sourceSubnetworkIpRangesToNat": "LIST_OF_SUBNETWORKS",
        "subnetworks": [
            {"name": f"projects/{PROJECT}/regions/us-east5/subnetworks/other", "sourceIpRangesToNat": ["ALL_IP_RANGES"]}
        ],
    }
    (nat,) = [line for line in cloud.doctor(COMPUTE_SLICE) if line.check == "Cloud NAT in us-east5"]
    assert nat.status == FAIL and "no Cloud NAT serves ml on respawn in us-east5" in nat.detail, nat.text()
    assert "every attempt would fail" in nat.detail and "--nat-all-subnet-ip-ranges" in nat.fix
    router["nats"][0]["subnetworks"][0]["name"] = f"projects/{PROJECT}/regions/us-east5/subnetworks/ml"
    assert [line.status for line in cloud.doctor(COMPUTE_SLICE) if line.check == "Cloud NAT in us-east5"] == [PASS]
    project.routers.clear()
    lines = cloud.doctor(GPU)
    nats = {line.check: line for line in lines if line.check.startswith("Cloud NAT")}
    assert sorted(nats) == ["Cloud NAT in us-central1", "Cloud NAT in us-west4"]
    assert all(line.status == WARN and "nvidia.github.io" in line.detail for line in nats.values())
    assert not [line for line in cloud.doctor(SLICE) if line.check.startswith("Cloud NAT")]
    public = replace(SETTINGS, external_ips=True)
    assert not [line for line in cloud.doctor(COMPUTE_SLICE, public) if line.check.startswith("Cloud NAT")]


HOST = "doctor-host"
SHARED = replace(SETTINGS, network=f"projects/{HOST}/global/networks/shared")


def test_on_a_shared_vpc_the_creators_of_the_machines_need_network_user_on_the_host_subnetwork(cloud: Cloud) -> None:
    """With the network in a host project, respawn-orchestrator (every create) and, for a MIG's VMs, the project's
    Google APIs service agent (PROJECT_NUMBER@cloudservices.gserviceaccount.com) need compute.subnetworks.use on the
    host subnetwork: missing, each line fails naming the grant; granted, they pass; a caller who may not ask gets a
    warning that still names it."""
    project = cloud.fresh()
    add_network(project, HOST, "shared", "ml")
    agent = f"{project.number}@cloudservices.gserviceaccount.com"
    subnetwork = f"//compute.googleapis.com/projects/{HOST}/regions/us-east5/subnetworks/ml"

    def shared_lines() -> dict[str, Line]:
        return {line.check: line for line in cloud.doctor(COMPUTE_SLICE, SHARED) if line.check.startswith("Shared")}

    lines = shared_lines()
    assert sorted(lines) == [
        "Shared VPC: respawn-orchestrator in us-east5",
        "Shared VPC: the Google APIs service agent (a MIG's VMs) in us-east5",
    ]
    for email, line in zip((ORCHESTRATOR, agent), lines.values(), strict=True):
        assert line.status == FAIL and f"{email} lacks compute.subnetworks.use" in line.detail, line.text()
        assert f"--member=serviceAccount:{email} --role=roles/compute.networkUser" in line.fix
        assert "google_compute_subnetwork_iam_member.shared_vpc_users" in line.fix
        project.grant(email, subnetwork, {"compute.subnetworks.use"})
    assert [line.status for line in shared_lines().values()] == [PASS, PASS]
    single = [line.check for line in cloud.doctor(GPU, SHARED) if line.check.startswith("Shared")]
    assert single == [f"Shared VPC: respawn-orchestrator in {r}" for r in ("us-central1", "us-west4")]
    project.refused.add("troubleshoot")
    refused = shared_lines()
    assert all(line.status == WARN and "roles/compute.networkUser" in line.fix for line in refused.values())


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
