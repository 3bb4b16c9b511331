"""A job's network checks beyond the subnetwork (checks.py): whether machines without an external IP reach what
readying them downloads from outside Google (Cloud NAT), and on a Shared VPC whether the accounts that create the
machines may use the host project's subnetwork. Each returns Lines (checks.py)."""

from __future__ import annotations

from typing import Any

from respawn.jobs import API_COMPUTE, GpuMachine, JobSpec, MachineSpec, TpuMachine
from respawn.topology import UnknownTpuType, compute_shape
from respawn_cli.doctor.checks import DEPLOY, FAIL, PASS, WARN, Deployment, Line, access, ask, unknown_line
from respawn_cli.doctor.job_checks import region_of
from respawn_cli.offering import machine_words
from respawn_ops import needs

# A Cloud NAT's source ranges that serve every subnetwork of its router's network in the region (RouterNat's
# sourceSubnetworkIpRangesToNat); LIST_OF_SUBNETWORKS serves those its `subnetworks` name.
_EVERY_SUBNETWORK = ("ALL_SUBNETWORKS_ALL_IP_RANGES", "ALL_SUBNETWORKS_ALL_PRIMARY_IP_RANGES")
UBUNTU = "apt-get installs Docker from the Ubuntu archive"
NVIDIA = "the NVIDIA Container Toolkit comes from nvidia.github.io"


def outside_need(machine: MachineSpec) -> tuple[str, str] | None:
    """(FAIL or WARN, why) when readying the machine downloads from outside Google (functions/respawn/adapters/
    startup.sh: ready_docker, ready_gpu); None when it needs nothing there. Compute Engine's TPU images
    (ubuntu-accel-*) have no Docker: a certain need. A job's own TPU image may have Docker; the Deep Learning VM
    image has Docker and may lack the NVIDIA Container Toolkit: possible needs."""
    from respawn.adapters.compute import DLVM_IMAGE

    if isinstance(machine, GpuMachine):
        return WARN, f"{machine_words(machine)} boots {DLVM_IMAGE}: if it lacks the toolkit, {NVIDIA}"
    if machine.api != API_COMPUTE:
        return None  # the Cloud TPU API's runtime images have Docker
    try:
        image = compute_shape(machine.accelerator_type).image
    except UnknownTpuType:
        return None  # zones_offer says why
    if machine.image:
        return WARN, f"{machine_words(machine)} boots the job's image {machine.image}: if it has no Docker, {UBUNTU}"
    return FAIL, f"{machine_words(machine)} boots {image}, which has no Docker: {UBUNTU}"


def cloud_nat(d: Deployment, spec: JobSpec) -> list[Line]:
    """Machines without an external IP reach the internet only through a Cloud NAT on a Cloud Router of their
    network in their region, serving their subnetwork; Private Google Access reaches Google's APIs, not the Ubuntu
    archive nor nvidia.github.io. A region whose machines would need them and have no such NAT fails (a certain
    need) or warns (a possible one)."""
    if d.external_ips:
        return []
    wanted: dict[str, tuple[str, str]] = {}  # region -> the most certain need there
    for n, tier in enumerate(spec.all_tiers):
        need = outside_need(spec.machine_of(n))
        if need is None:
            continue
        for region in {region_of(z) for z in tier.zones}:
            if region not in wanted or (need[0] == FAIL and wanted[region][0] != FAIL):
                wanted[region] = need
    compute = d.clients("compute")
    subnetwork = d.subnetwork or d.network_name  # an auto mode network's subnetworks are named as it is
    lines = []
    for region, (status, why) in sorted(wanted.items()):
        check = f"Cloud NAT in {region}"
        request = compute.routers().list(project=d.network_project, region=region)
        routers, problem = ask(check, request.execute)
        if problem:
            lines.append(problem)
            continue
        serving = [f"{r['name']}/{nat['name']}" for r in (routers or {}).get("items") or [] if _on(r, d)
                   for nat in r.get("nats") or [] if _serves(nat, region, subnetwork)]  # fmt: skip
        if serving:
            lines.append(Line(PASS, check, f"{serving[0]} serves {subnetwork}: machines without an external IP "
                                           "reach the Ubuntu archive and nvidia.github.io"))  # fmt: skip
            continue
        lines.append(
            Line(
                status,
                check,
                f"the machines have no external IP and no Cloud NAT serves {subnetwork} on {d.network_name} in "
                f"{region}; {why}, which Private Google Access does not reach"
                + (": every attempt would fail" if status == FAIL else ""),
                f"cloud_nat_regions in terraform.tfvars (unset with create_network: every region) and {DEPLOY} "
                f"(network.tf), or gcloud compute routers create respawn-nat --network={d.network_name} "
                f"--region={region} --project={d.network_project} && gcloud compute routers nats create respawn-nat "
                f"--router=respawn-nat --region={region} --project={d.network_project} "
                "--auto-allocate-nat-external-ips --nat-all-subnet-ip-ranges; or external_ip = true",
            )
        )
    return lines


def _on(router: dict[str, Any], d: Deployment) -> bool:
    return str(router.get("network", "")).endswith(f"projects/{d.network_project}/global/networks/{d.network_name}")


def _serves(nat: dict[str, Any], region: str, subnetwork: str) -> bool:
    """Whether a Cloud NAT (RouterNat) translates the primary range of `subnetwork` in `region` to the internet."""
    if nat.get("type", "PUBLIC") != "PUBLIC":
        return False  # Private NAT translates between networks, not to the internet
    ranges = nat.get("sourceSubnetworkIpRangesToNat")
    if ranges in _EVERY_SUBNETWORK:
        return True
    if ranges != "LIST_OF_SUBNETWORKS":
        return False
    return any(
        str(s.get("name", "")).endswith(f"/regions/{region}/subnetworks/{subnetwork}")
        and {"ALL_IP_RANGES", "PRIMARY_IP_RANGE"} & set(s.get("sourceIpRangesToNat") or ["ALL_IP_RANGES"])
        for s in nat.get("subnetworks") or []
    )


def makes_mig(machine: MachineSpec) -> bool:
    """Whether the machine is a managed instance group's VMs (respawn.adapters.compute_slices): a GPU machine of
    several VMs, or a TPU slice Compute Engine makes of several VMs."""
    if isinstance(machine, GpuMachine):
        return machine.vms > 1
    if not isinstance(machine, TpuMachine) or machine.api != API_COMPUTE:
        return False
    try:
        return compute_shape(machine.accelerator_type).multi_host
    except UnknownTpuType:
        return False


def shared_vpc(d: Deployment, spec: JobSpec) -> list[Line]:
    """On a Shared VPC (the network in another project), the accounts that create the job's machines hold
    roles/compute.networkUser's compute.subnetworks.use on the host project's subnetwork in each of the job's
    regions: respawn-orchestrator, which names it on every create, and, for a MIG's VMs, the project's Google APIs
    service agent (PROJECT_NUMBER@cloudservices.gserviceaccount.com), which creates them. Asked of the Policy
    Troubleshooter; a caller who may not ask gets the grant named."""
    if d.network_project == d.project or not d.subnetwork:
        return []
    agents = [("respawn-orchestrator", d.orchestrator)]
    why = ""  # why the project's number is unknown
    if any(makes_mig(spec.machine_of(n)) for n in range(len(spec.all_tiers))):
        projects = d.clients("cloudresourcemanager").projects()
        got, problem = ask("Shared VPC", projects.get(name=f"projects/{d.project}").execute)
        number = str((got or {}).get("name", "")).removeprefix("projects/") or "PROJECT_NUMBER"
        why = f" ({problem.detail})" if problem else ""
        agents.append(("the Google APIs service agent (a MIG's VMs)", needs.mig_agent_email(number)))
    permissions = [*needs.SUBNETWORK_USE, *(needs.SUBNETWORK_EXTERNAL_IP if d.external_ips else ())]
    lines = []
    for region in sorted({region_of(z) for z in spec.every_zone}):
        full = needs.subnetwork_name(d.network_project, region, d.subnetwork)
        for who, email in agents:
            check = f"Shared VPC: {who} in {region}"
            fix = (
                f"subnetwork_regions in terraform.tfvars and {DEPLOY} (network.tf: {needs.SHARED_VPC_GRANT}), or in "
                f"the host project: gcloud compute networks subnets add-iam-policy-binding {d.subnetwork} "
                f"--region={region} --project={d.network_project} --member=serviceAccount:{email} "
                f"--role={needs.SUBNETWORK_ROLE}"
            )
            lines.append(_uses(d, email, full, permissions, check, fix, why))
    return lines


def _uses(d: Deployment, email: str, full: str, permissions: list[str], check: str, fix: str, why: str) -> Line:
    if email.startswith("PROJECT_NUMBER@"):
        return Line(WARN, check, f"the project's number is unknown{why}: its service agent is not checked", fix)
    got = access(d, email, full, permissions, check)
    target = full.removeprefix("//")
    if got.problem:
        return Line(WARN, check, f"cannot check {email} on {target}: {got.problem.detail}", fix)
    if got.missing:
        return Line(FAIL, check, f"{email} lacks {', '.join(got.missing)} on {target}", fix)
    if got.unknown:
        return unknown_line(check, email, got.unknown)
    return Line(PASS, check, f"{email} may use {target}")
