"""The deployment's checks (no job needed): APIs, each account's permissions, the network, the state bucket, the
topics and subscriptions, the organisation policies. Each returns Lines: pass, warn or fail, a failure naming its fix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from respawn_cli.doctor.clients import Clients, disabled_api, reason, status_of
from respawn_ops import needs

PASS, WARN, FAIL = "pass", "warn", "fail"
DEPLOY = "terraform -chdir=infra/terraform apply"


@dataclass(frozen=True)
class Line:
    status: str  # pass | warn | fail
    check: str
    detail: str
    fix: str = ""

    def text(self) -> str:
        return f"{self.status:<4}  {self.check}: {self.detail}" + (f"\n      fix: {self.fix}" if self.fix else "")

    def to_json(self) -> dict[str, str]:
        return {"status": self.status, "check": self.check, "detail": self.detail, "fix": self.fix}


@dataclass(frozen=True)
class Deployment:
    """What `respawn doctor` checks: the project and what Terraform made in it (the CLI's environment)."""

    project: str
    state_bucket: str
    topics: tuple[str, ...]  # jobs, events, status, dead letter
    subscriptions: tuple[str, ...]
    orchestrator: str  # service account emails
    machine: str
    network: str  # projects/P/global/networks/N
    subnetwork: str | None
    external_ips: bool
    clients: Clients

    @property
    def network_project(self) -> str:
        return self.network.split("/")[1]

    @property
    def network_name(self) -> str:
        return self.network.rsplit("/", 1)[1]

    def email(self, account: str) -> str:
        return self.orchestrator if account == needs.ORCHESTRATOR else self.machine


def ask(check: str, call: Callable[[], Any]) -> tuple[Any, Line | None]:
    """(the reply, None); (None, None) when the thing asked for does not exist (404); else (None, the line saying
    the call failed): a 403 is a warning (the caller may not read it, which says nothing of the deployment), naming
    the API to enable when that API is off for the caller's project, anything else a failure."""
    try:
        return call(), None
    except Exception as e:
        if status_of(e) == 404:
            return None, None
        if (off := disabled_api(e)) is not None:
            api, project = off
            return None, Line(
                WARN,
                check,
                f"{api or 'the API'} is not enabled in project {project or '?'}: doctor cannot ask it",
                f"gcloud services enable {api or 'API'} --project={project or 'PROJECT'} (or {DEPLOY}: apis.tf "
                "enables it), then run doctor again",
            )
        if status_of(e) == 403:
            return None, Line(
                WARN,
                check,
                f"not allowed to ask ({reason(e)})",
                "run doctor as a project owner, or with roles/viewer and roles/iam.securityReviewer",
            )
        return None, Line(FAIL, check, f"the call failed ({reason(e)})", "check the project id and your credentials")


def exists(check: str, call: Callable[[], Any], absent: str, fix: str) -> tuple[Any, list[Line]]:
    """(the reply, []) when the thing asked for is there; (None, [the line]) when it is not (a failure saying
    `absent` and naming `fix`) or the call failed (ask)."""
    got, problem = ask(check, call)
    if problem is not None:
        return None, [problem]
    if got is None:
        return None, [Line(FAIL, check, absent, fix)]
    return got, []


def pages(request: Callable[[str | None], Any], key: str) -> list[Any]:
    """Every item of a paged listing."""
    items: list[Any] = []
    token: str | None = None
    while True:
        reply = request(token)
        items += reply.get(key) or []
        token = reply.get("nextPageToken")
        if not token:
            return items


def apis_enabled(d: Deployment) -> list[Line]:
    services = d.clients("serviceusage").services()
    check = "APIs enabled"
    listed, problem = ask(
        check,
        lambda: pages(
            lambda token: services.list(
                parent=f"projects/{d.project}", filter="state:ENABLED", pageSize=200, pageToken=token
            ).execute(),
            "services",
        ),
    )
    if problem:
        return [problem]
    enabled = {str(s.get("config", {}).get("name") or s["name"].rsplit("/", 1)[1]) for s in listed}
    missing = [api for api in needs.APIS if api not in enabled]
    if missing:
        return [
            Line(
                FAIL,
                check,
                f"not enabled in {d.project}: {', '.join(missing)}",
                f"gcloud services enable {' '.join(missing)} --project={d.project} (or {DEPLOY}: apis.tf)",
            )
        ]
    return [Line(PASS, check, f"all {len(needs.APIS)} APIs respawn uses are enabled in {d.project}")]


@dataclass(frozen=True)
class Access:
    """What the Policy Troubleshooter says of one account's permissions on one resource."""

    missing: list[str]  # CANNOT_ACCESS
    unknown: list[str]  # UNKNOWN_INFO, UNKNOWN_CONDITIONAL: "permission (state)"
    problem: Line | None  # the call failed (ask)


def access(d: Deployment, email: str, full: str, permissions: list[str], check: str) -> Access:
    """Whether `email` holds each permission on the resource `full` (a full resource name), as Policy Troubleshooter
    v3's iam.troubleshoot evaluates every allow and deny policy that applies there (inherited and conditional ones
    included): one call per permission, asked side by side."""
    iam = d.clients("policytroubleshooter").iam()

    def troubleshoot(permission: str) -> tuple[Any, Line | None]:
        body = {"accessTuple": {"principal": email, "fullResourceName": full, "permission": permission}}
        http = d.clients.http("policytroubleshooter")
        return ask(check, lambda: iam.troubleshoot(body=body).execute(http=http))

    answers = d.clients.map(troubleshoot, permissions)
    missing, unknown = [], []
    for permission, (reply, problem) in zip(permissions, answers, strict=True):
        if problem:
            return Access([], [], problem)
        state = (reply or {}).get("overallAccessState")
        if state == "CANNOT_ACCESS":
            missing.append(permission)
        elif state != "CAN_ACCESS":
            unknown.append(f"{permission} ({state})")
    return Access(missing, unknown, None)


def grant_line(d: Deployment, grants: tuple[needs.Grant, ...], where: str, check: str = "") -> Line:
    """Whether the grants' account (one account, one resource) holds each of their permissions on `where` (access)."""
    account, resource = grants[0].account, grants[0].resource
    email = d.email(account)
    check = check or f"{account}'s permissions on the {resource}"
    full = needs.full_resource_name(resource, d.project, where)
    wanted = [p for g in grants for p in g.permissions]
    got = access(d, email, full, wanted, check)
    target = full.removeprefix("//")
    if got.problem:
        return got.problem
    if got.missing:
        granting = ", ".join(g.terraform for g in grants if set(g.permissions) & set(got.missing))
        return Line(FAIL, check, f"{email} lacks {', '.join(got.missing)} on {target}",
                    f"{DEPLOY} (iam.tf: {granting} grant{'s' if ', ' not in granting else ''} them)")  # fmt: skip
    if got.unknown:
        return unknown_line(check, email, got.unknown)
    n = len(wanted)
    return Line(PASS, check, f"{email} holds the {n} permission{'s' if n > 1 else ''} it uses on {target}")


def unknown_line(check: str, email: str, unknown: list[str]) -> Line:
    """The Policy Troubleshooter could not settle some permissions: it may not read every policy (UNKNOWN_INFO), or a
    conditional grant needs a request's context (UNKNOWN_CONDITIONAL)."""
    fix = (
        "check the grant's condition (gcloud projects get-iam-policy)"
        if all(u.endswith("(UNKNOWN_CONDITIONAL)") for u in unknown)
        else "run doctor with roles/iam.securityReviewer to read every policy"
    )
    return Line(WARN, check, f"the Policy Troubleshooter cannot tell for {email}: {', '.join(unknown)}", fix)


def grants_on(resource: str) -> list[tuple[needs.Grant, ...]]:
    """needs.GRANTS on `resource`, one group per account."""
    accounts = dict.fromkeys(g.account for g in needs.GRANTS if g.resource == resource)
    return [tuple(g for g in needs.GRANTS if g.resource == resource and g.account == a) for a in accounts]


def permissions(d: Deployment, status_topic: str) -> list[Line]:
    """The deployment-wide grants (the job's bucket and image: job_checks.py)."""
    where = {
        needs.PROJECT: d.project,
        needs.STATE_BUCKET: d.state_bucket,
        needs.STATUS_TOPIC: status_topic,
        needs.MACHINE_ACCOUNT: d.machine,
    }
    return [grant_line(d, group, place) for resource, place in where.items() for group in grants_on(resource)]


def network(d: Deployment, regions: Iterable[str]) -> list[Line]:
    """The network exists, and a subnetwork in each region the job uses (without a job: the network only)."""
    compute = d.clients("compute")
    check = "network"
    got, missing = exists(
        check,
        compute.networks().get(project=d.network_project, network=d.network_name).execute,
        f"{d.network} does not exist",
        f"set network (and create_network for a new one) in terraform.tfvars, then {DEPLOY} (docs/deploy.md, A "
        "project without a default network)",
    )
    if missing:
        return missing
    lines = [Line(PASS, check, f"{d.network} exists")]
    for region in sorted(set(regions)):
        lines.append(_subnetwork(d, got, region))
    return lines


def _subnetwork(d: Deployment, net: dict[str, Any], region: str) -> Line:
    check = f"subnetwork in {region}"
    if d.subnetwork is None:
        if net.get("autoCreateSubnetworks"):
            return Line(PASS, check, f"{d.network_name} is an auto mode network: it has a subnetwork in {region}")
        return Line(
            FAIL,
            check,
            f"{d.network_name} is a custom mode network and no subnetwork is set",
            f"set subnetwork (and subnetwork_ranges) in terraform.tfvars, then {DEPLOY}",
        )
    compute = d.clients("compute")
    sub, problem = ask(
        check,
        lambda: compute.subnetworks().get(project=d.network_project, region=region, subnetwork=d.subnetwork).execute(),
    )
    fix = (
        f"add {region} to subnetwork_ranges in terraform.tfvars and {DEPLOY}, or: gcloud compute networks subnets "
        f"create {d.subnetwork} --network={d.network_name} --region={region} --range=CIDR "
        "--enable-private-ip-google-access"
    )
    if problem:
        return problem
    if sub is None:
        return Line(FAIL, check, f"no subnetwork {d.subnetwork} in {region}", fix)
    if not str(sub.get("network", "")).endswith(f"/networks/{d.network_name}"):
        return Line(
            FAIL, check, f"{d.subnetwork} in {region} belongs to {sub.get('network')}, not {d.network_name}", fix
        )
    if not d.external_ips and not sub.get("privateIpGoogleAccess"):
        return Line(
            WARN,
            check,
            f"{d.subnetwork} in {region} has Private Google Access off and machines have no "
            "external IP: they reach Google's APIs only through Cloud NAT",
            f"gcloud compute networks subnets update {d.subnetwork} --region={region} "
            "--enable-private-ip-google-access",
        )
    return Line(PASS, check, f"{d.subnetwork} in {region} ({sub.get('ipCidrRange')})")


def state_bucket(d: Deployment) -> list[Line]:
    check = "state bucket"
    storage = d.clients("storage")
    got, missing = exists(
        check,
        storage.buckets().get(bucket=d.state_bucket).execute,
        f"gs://{d.state_bucket} does not exist",
        f"{DEPLOY} (storage.tf), and export RESPAWN_STATE_BUCKET from its cli_environment output",
    )
    return missing or [Line(PASS, check, f"gs://{d.state_bucket} exists ({got.get('location')})")]


def pubsub(d: Deployment) -> list[Line]:
    """The topics and subscriptions Terraform makes (asked side by side)."""
    client = d.clients("pubsub").projects()
    wanted = [("topic", name) for name in d.topics] + [("subscription", name) for name in d.subscriptions]

    def get(item: tuple[str, str]) -> tuple[Any, Line | None]:
        kind, name = item
        path = f"projects/{d.project}/{kind}s/{name}"
        request = client.topics().get(topic=path) if kind == "topic" else client.subscriptions().get(subscription=path)
        http = d.clients.http("pubsub")
        return ask(f"Pub/Sub {kind}s", lambda: request.execute(http=http))

    answers = dict(zip(wanted, d.clients.map(get, wanted), strict=True))
    lines = []
    for kind, names in (("topic", d.topics), ("subscription", d.subscriptions)):
        check = f"Pub/Sub {kind}s"
        problems = [problem for name in names if (problem := answers[(kind, name)][1]) is not None]
        missing = [name for name in names if answers[(kind, name)] == (None, None)]
        if missing:
            lines.append(Line(FAIL, check, f"missing in {d.project}: {', '.join(missing)}",
                              f"{DEPLOY} (pubsub.tf, functions.tf)"))  # fmt: skip
        lines += problems[:1]
        if not missing and not problems:
            lines.append(Line(PASS, check, ", ".join(names)))
    return lines
