"""What respawn needs of a project: the APIs it calls and, per service account, the permissions it uses on each
resource; `respawn doctor` asks Google whether each account holds each of them. The orchestrator's custom role is
respawn/orchestrator_role.txt, which infra/terraform/iam.tf reads itself; the APIs and the other grants are what
apis.tf and iam.tf hold (tests/infra/test_needs.py).

A leaf: it imports nothing of respawn.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# apis.tf enables these (the same list, tests/infra/test_needs.py).
APIS = (
    "artifactregistry.googleapis.com",
    "billingbudgets.googleapis.com",
    "cloudbuild.googleapis.com",
    "cloudfunctions.googleapis.com",
    "cloudresourcemanager.googleapis.com",
    "cloudscheduler.googleapis.com",
    "compute.googleapis.com",
    "iam.googleapis.com",
    "logging.googleapis.com",
    "monitoring.googleapis.com",
    "orgpolicy.googleapis.com",
    "policytroubleshooter.googleapis.com",
    "pubsub.googleapis.com",
    "run.googleapis.com",
    "secretmanager.googleapis.com",
    "serviceusage.googleapis.com",
    "storage.googleapis.com",
    "tpu.googleapis.com",
)

ROLE_FILE = Path(__file__).resolve().parent / "orchestrator_role.txt"


def role_permissions(text: str) -> tuple[str, ...]:
    """The permissions of a role file: one a line, '#' comments and blank lines skipped (what iam.tf's
    local.orchestrator_permissions makes of it)."""
    return tuple(line.strip() for line in text.split("\n") if line.strip() and not line.strip().startswith("#"))


# The orchestrator's custom role (infra/terraform/iam.tf reads the same file): every API method the providers call
# (respawn/adapters/tpu.py, compute.py, compute_slices.py, compute_operations.py, advice.py), each one's reason
# written beside it there.
ORCHESTRATOR_ROLE = role_permissions(ROLE_FILE.read_text(encoding="utf-8"))

ORCHESTRATOR, MACHINE = "orchestrator", "machine"
# Where a grant sits: the project, the state bucket, the checkpoint bucket (a job's), the status topic, the machines'
# service account, the trainer image's repository (a job's).
PROJECT, STATE_BUCKET, CHECKPOINT_BUCKET = "project", "state bucket", "checkpoint bucket"
STATUS_TOPIC, MACHINE_ACCOUNT, REPOSITORY = "status topic", "machines' account", "image repository"
OBJECTS = ("storage.objects.create", "storage.objects.delete", "storage.objects.get", "storage.objects.list")


@dataclass(frozen=True)
class Grant:
    """`account` needs `permissions` on `resource`; `terraform` is the resource in infra/terraform granting them."""

    account: str
    resource: str
    permissions: tuple[str, ...]
    terraform: str


GRANTS = (
    Grant(ORCHESTRATOR, PROJECT, ORCHESTRATOR_ROLE, "google_project_iam_member.orchestrator_machines"),
    Grant(ORCHESTRATOR, PROJECT, ("logging.logEntries.create",), "google_project_iam_member.orchestrator_logs"),
    Grant(ORCHESTRATOR, STATE_BUCKET, OBJECTS, "google_storage_bucket_iam_member.orchestrator_state"),
    Grant(
        ORCHESTRATOR,
        STATUS_TOPIC,
        ("pubsub.topics.publish",),
        "google_pubsub_topic_iam_member.orchestrator_publishes_status",
    ),
    Grant(
        ORCHESTRATOR,
        MACHINE_ACCOUNT,
        ("iam.serviceAccounts.actAs",),
        "google_service_account_iam_member.orchestrator_acts_as_machine",
    ),
    Grant(MACHINE, PROJECT, ("logging.logEntries.create",), "google_project_iam_member.machine_logs"),
    Grant(MACHINE, CHECKPOINT_BUCKET, OBJECTS, "google_storage_bucket_iam_member.machine_checkpoints"),
    Grant(
        MACHINE,
        REPOSITORY,
        ("artifactregistry.repositories.downloadArtifacts",),
        "google_artifact_registry_repository_iam_member.machine_pulls_trainer",
    ),
)


# On a Shared VPC (the network in another project) the accounts that create machines use the host project's
# subnetwork: respawn-orchestrator names it on every create, and the project's Google APIs service agent creates a
# managed instance group's VMs. network.tf grants both roles/compute.networkUser on the subnetwork in each of
# subnetwork_regions; doctor asks whether each holds its use (and, with external IPs, the use of one there).
SUBNETWORK_ROLE = "roles/compute.networkUser"
SUBNETWORK_USE = ("compute.subnetworks.use",)
SUBNETWORK_EXTERNAL_IP = ("compute.subnetworks.useExternalIp",)
SHARED_VPC_GRANT = "google_compute_subnetwork_iam_member.shared_vpc_users"


def mig_agent_email(project_number: str) -> str:
    """The Google APIs service agent, which creates a MIG's VMs (Compute Engine's service accounts page)."""
    return f"{project_number}@cloudservices.gserviceaccount.com"


def subnetwork_name(host: str, region: str, subnetwork: str) -> str:
    """A subnetwork's full resource name, as IAM (the Policy Troubleshooter) takes it."""
    return f"//compute.googleapis.com/projects/{host}/regions/{region}/subnetworks/{subnetwork}"


def account_email(account: str, project: str) -> str:
    """The account Terraform creates (iam.tf: respawn-orchestrator, respawn-machine)."""
    return f"respawn-{account}@{project}.iam.gserviceaccount.com"


def full_resource_name(resource: str, project: str, where: str) -> str:
    """The full resource name IAM (the Policy Troubleshooter) takes for `resource`: `where` is its bucket, topic,
    account email or repository path (projects/P/locations/L/repositories/R); the project's is `project`."""
    return {
        PROJECT: f"//cloudresourcemanager.googleapis.com/projects/{project}",
        STATE_BUCKET: f"//storage.googleapis.com/projects/_/buckets/{where}",
        CHECKPOINT_BUCKET: f"//storage.googleapis.com/projects/_/buckets/{where}",
        STATUS_TOPIC: f"//pubsub.googleapis.com/projects/{project}/topics/{where}",
        MACHINE_ACCOUNT: f"//iam.googleapis.com/projects/{project}/serviceAccounts/{where}",
        REPOSITORY: f"//artifactregistry.googleapis.com/{where}",
    }[resource]
