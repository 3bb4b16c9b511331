"""`respawn doctor`: the deployment from the CLI's environment, every check in order, one line each."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from respawn.deployment import Settings
from respawn.jobs import JobSpec
from respawn_cli.doctor import checks, job_checks, network_checks, policy_checks
from respawn_cli.doctor.checks import FAIL, Deployment, Line
from respawn_cli.doctor.clients import Clients, endpoints_from_env
from respawn_ops import needs

DEAD_LETTER = "respawn-dead-letter"  # pubsub.tf
PUSH_SUBSCRIPTIONS = ("respawn-on-job-message-push", "respawn-on-event-push")  # functions.tf


def deployment(s: Settings, orchestrator: str | None = None, clients: Clients | None = None) -> Deployment:
    """The deployment `s` describes (the CLI's environment: terraform output cli_environment), its accounts named
    as iam.tf names them unless given."""
    status = s.status_topic or "respawn-status"
    return Deployment(
        project=s.project,
        state_bucket=s.state_bucket,
        topics=(s.jobs_topic, s.events_topic, status, DEAD_LETTER),
        subscriptions=(*PUSH_SUBSCRIPTIONS, DEAD_LETTER),
        orchestrator=orchestrator or needs.account_email(needs.ORCHESTRATOR, s.project),
        machine=s.machine_service_account or needs.account_email(needs.MACHINE, s.project),
        network=s.network or f"projects/{s.project}/global/networks/default",
        subnetwork=s.subnetwork,
        external_ips=s.external_ips,
        clients=clients or Clients(endpoints_from_env()),
    )


def run(d: Deployment, status_topic: str, spec: JobSpec | None) -> Iterator[Line]:
    """Every check, in the order a deployment is built: APIs, accounts, network, storage, topics, policies, and for
    a job its zones, quota, Shared VPC grants, Cloud NAT, slice firewall, checkpoint bucket and image."""
    regions = {job_checks.region_of(z) for z in job_checks.zones(spec)} if spec else set()
    steps: list[Callable[[], list[Line]]] = [
        lambda: checks.apis_enabled(d),
        lambda: checks.permissions(d, status_topic),
        lambda: checks.network(d, regions),
        lambda: checks.state_bucket(d),
        lambda: checks.pubsub(d),
        lambda: policy_checks.org_policies(d, spec),
    ]
    if spec is not None:
        steps += [
            lambda: job_checks.zones_offer(d, spec),
            lambda: job_checks.quota(d, spec),
            lambda: network_checks.shared_vpc(d, spec),
            lambda: network_checks.cloud_nat(d, spec),
            lambda: job_checks.slice_firewall(d, spec),
            lambda: job_checks.checkpoint_bucket(d, spec),
            lambda: job_checks.image(d, spec),
        ]
    for step in steps:
        yield from step()


def failed(lines: list[Line]) -> bool:
    return any(line.status == FAIL for line in lines)
