"""A project as the local cloud holds it around a deployment: its number, enabled APIs, IAM grants, the network
(with a Shared VPC's, another project's networks and subnetworks), firewall rules, Cloud Routers and their NATs,
regional quotas, the trainer images, organisation policies. (What each zone offers is the CloudCore knob
`unoffered`, offerings.py.)

`healthy(...)` is what `terraform apply` leaves (every grant of respawn_ops.needs, the APIs of apis.tf, the
network with a Cloud NAT in each region, a slice's firewall rule) in the zones the local cloud offers; tests break
one thing at a time by changing its fields. project_api.py serves it over the real APIs' paths.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

from respawn_ops import needs

# The regions of the local cloud's zones: a subnetwork and quotas in each.
REGIONS = (
    "asia-southeast1",
    "europe-west4",
    "us-central1",
    "us-east1",
    "us-east5",
    "us-south1",
    "us-west1",
    "us-west4",
)
# Regional quota limits (Compute Engine regions.get), Spot and on-demand.
QUOTAS = {
    "PREEMPTIBLE_NVIDIA_L4_GPUS": 16.0,
    "NVIDIA_L4_GPUS": 8.0,
    "PREEMPTIBLE_NVIDIA_A100_GPUS": 8.0,
    "PREEMPTIBLE_NVIDIA_H100_GPUS": 16.0,
    "PREEMPTIBLE_NVIDIA_T4_GPUS": 8.0,
    "PREEMPTIBLE_TPU_LITE_PODSLICE_V5": 64.0,
    "TPU_LITE_PODSLICE_V5": 32.0,
    "PREEMPTIBLE_TPU_PODSLICE_V4": 64.0,
    "PREEMPTIBLE_CPUS": 512.0,
    "CPUS": 512.0,
}


@dataclass
class Repository:
    """An Artifact Registry repository: package (image) -> its tags and digests."""

    packages: dict[str, set[str]] = field(default_factory=dict)


@dataclass
class LocalProject:
    project: str
    apis: set[str] = field(default_factory=set)  # the APIs enabled; the others answer 403 SERVICE_DISABLED
    grants: dict[tuple[str, str], set[str]] = field(default_factory=dict)  # (email, full resource name) -> perms
    # IAM deny policies: (email, full resource name, permission) denied whatever the grants (Policy Troubleshooter v3
    # evaluates them; v1 did not)
    denied: set[tuple[str, str, str]] = field(default_factory=set)
    networks: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # (project, name) -> Network
    subnetworks: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)  # (project, region, name)
    firewalls: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # (project, name) -> Firewall
    routers: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)  # (project, region, name)
    quotas: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # region -> metric -> [limit, usage]
    repositories: dict[str, Repository] = field(default_factory=dict)  # projects/P/locations/L/repositories/R
    org_policies: dict[str, dict[str, Any]] = field(default_factory=dict)  # constraint -> PolicySpec
    # the methods (project_api.py's route names: services, troubleshoot, region, ...) that answer 403 PERMISSION_DENIED,
    # as they do for a caller without the permission to ask
    refused: set[str] = field(default_factory=set)
    number: str = ""  # the project number (Resource Manager's projects/NUMBER); "": one made from the id

    def __post_init__(self) -> None:
        self.number = self.number or str(100_000_000_000 + zlib.crc32(self.project.encode()))

    def grant(self, email: str, resource: str, permissions: tuple[str, ...] | set[str]) -> None:
        self.grants.setdefault((email, resource), set()).update(permissions)

    def revoke(self, email: str, resource: str, permission: str) -> None:
        self.grants.get((email, resource), set()).discard(permission)

    def deny(self, email: str, resource: str, permission: str) -> None:
        self.denied.add((email, resource, permission))

    def holds(self, email: str, resource: str, permission: str) -> bool:
        allowed = permission in self.grants.get((email, resource), set())
        return allowed and (email, resource, permission) not in self.denied


def healthy(
    project: str,
    *,
    state_bucket: str,
    checkpoint_bucket: str,
    repository: str,
    image: str,
    tag: str,
    network: str = "respawn",
    subnetwork: str = "ml",
    status_topic: str = "respawn-status",
) -> LocalProject:
    """The project as `terraform apply` leaves it with create_network (no external IP: a Cloud NAT in every region),
    subnetwork `subnetwork` in every local region, slice_firewall, and the trainer image `image:tag` pushed to
    `repository`."""
    p = LocalProject(project, apis=set(needs.APIS))
    accounts = {a: needs.account_email(a, project) for a in (needs.ORCHESTRATOR, needs.MACHINE)}
    where = {
        needs.PROJECT: project,
        needs.STATE_BUCKET: state_bucket,
        needs.CHECKPOINT_BUCKET: checkpoint_bucket,
        needs.STATUS_TOPIC: status_topic,
        needs.MACHINE_ACCOUNT: accounts[needs.MACHINE],
        needs.REPOSITORY: repository,
    }
    for g in needs.GRANTS:
        p.grant(accounts[g.account], needs.full_resource_name(g.resource, project, where[g.resource]), g.permissions)
    add_network(p, project, network, subnetwork)
    for region in REGIONS:
        p.quotas[region] = {metric: [limit, 0.0] for metric, limit in QUOTAS.items()}
    base = f"https://www.googleapis.com/compute/v1/projects/{project}"
    peers = f"{network}-respawn-peers"
    p.firewalls[(project, peers)] = {
        "kind": "compute#firewall",
        "name": peers,
        "network": f"{base}/global/networks/{network}",
        "direction": "INGRESS",
        "priority": 1000,
        "allowed": [{"IPProtocol": "tcp"}, {"IPProtocol": "udp"}, {"IPProtocol": "icmp"}],
        "sourceServiceAccounts": [accounts[needs.MACHINE]],
        "targetServiceAccounts": [accounts[needs.MACHINE]],
        "disabled": False,
        "selfLink": f"{base}/global/firewalls/{peers}",
    }
    p.repositories[repository] = Repository({image: {tag}})
    return p


def add_network(p: LocalProject, project: str, network: str, subnetwork: str, *, nat: bool = True) -> None:
    """A custom mode network of `project` (the deployment's, or a Shared VPC host project's) with subnetwork
    `subnetwork` in every local region, Private Google Access on, and (`nat`) a Cloud NAT in each region, as
    network.tf makes them with create_network and machines without an external IP."""
    base = f"https://www.googleapis.com/compute/v1/projects/{project}"
    p.networks[(project, network)] = {
        "kind": "compute#network",
        "name": network,
        "selfLink": f"{base}/global/networks/{network}",
        "autoCreateSubnetworks": False,
    }
    for i, region in enumerate(REGIONS):
        p.subnetworks[(project, region, subnetwork)] = {
            "kind": "compute#subnetwork",
            "name": subnetwork,
            "network": f"{base}/global/networks/{network}",
            "region": f"{base}/regions/{region}",
            "ipCidrRange": f"10.{i}.0.0/20",
            "privateIpGoogleAccess": True,
            "selfLink": f"{base}/regions/{region}/subnetworks/{subnetwork}",
        }
        if nat:
            p.routers[(project, region, f"{network}-respawn-nat")] = nat_router(project, region, network)


def nat_router(project: str, region: str, network: str, name: str = "") -> dict[str, Any]:
    """The Cloud Router with one Cloud NAT for every subnetwork of `network` in `region` that network.tf makes
    (google_compute_router.nat, google_compute_router_nat.machines)."""
    base = f"https://www.googleapis.com/compute/v1/projects/{project}"
    name = name or f"{network}-respawn-nat"
    return {
        "kind": "compute#router",
        "name": name,
        "network": f"{base}/global/networks/{network}",
        "region": f"{base}/regions/{region}",
        "nats": [
            {
                "name": name,
                "natIpAllocateOption": "AUTO_ONLY",
                "sourceSubnetworkIpRangesToNat": "ALL_SUBNETWORKS_ALL_IP_RANGES",
                "logConfig": {"enable": True, "filter": "ERRORS_ONLY"},
            }
        ],
        "selfLink": f"{base}/regions/{region}/routers/{name}",
    }
