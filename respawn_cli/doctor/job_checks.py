"""A job file's checks: each zone offers the machine, each region has quota for it, a slice's firewall rule, the
checkpoint bucket, the image, and the organisation policies its machines meet. Each returns Lines (checks.py)."""

from __future__ import annotations

import ipaddress
import re
from typing import Any
from urllib.parse import quote

from respawn.jobs import SPOT_MODELS, GpuMachine, JobSpec, MachineSpec, Provisioning
from respawn.machine import DEPLOYMENT_IMAGES
from respawn_cli.doctor.checks import (
    DEPLOY,
    FAIL,
    PASS,
    WARN,
    Deployment,
    Line,
    ask,
    exists,
    grant_line,
    grants_on,
    pages,
)
from respawn_cli.offering import OfferingLookup, machine_words
from respawn_ops import needs

PRIVATE = tuple(ipaddress.ip_network(r) for r in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))  # subnetworks
COORDINATOR_PORT = 8482  # respawn_trainer.env.COORDINATOR_PORT: worker 0's JAX coordinator
# The Compute Engine quota metric of a GPU (regions.get quotas[].metric) and of a TPU generation's chips.
GPU_QUOTAS = {
    "nvidia-l4": "NVIDIA_L4_GPUS",
    "nvidia-tesla-t4": "NVIDIA_T4_GPUS",
    "nvidia-tesla-v100": "NVIDIA_V100_GPUS",
    "nvidia-tesla-p100": "NVIDIA_P100_GPUS",
    "nvidia-tesla-p4": "NVIDIA_P4_GPUS",
    "nvidia-tesla-a100": "NVIDIA_A100_GPUS",
    "nvidia-a100-80gb": "NVIDIA_A100_80GB_GPUS",
    "nvidia-h100-80gb": "NVIDIA_H100_GPUS",
}
_AR_IMAGE = re.compile(
    r"^(?P<location>[a-z0-9-]+)-docker\.pkg\.dev/(?P<project>[^/]+)/(?P<repo>[^/]+)/(?P<image>[^:@]+)"
    r"(?::(?P<tag>[\w][\w.-]*))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$"
)


def region_of(zone: str) -> str:
    return zone.rpartition("-")[0]


def zones(spec: JobSpec) -> list[str]:
    return list(spec.every_zone)


def zones_offer(d: Deployment, spec: JobSpec) -> list[Line]:
    """Each zone of each tier offers the machine: the APIs' machine and accelerator type listings, asked as
    `respawn submit` asks them (respawn_cli.offering)."""
    check = "zones offer the machine"
    endpoints = d.clients.endpoints
    lookup = OfferingLookup(d.project, tpu_endpoint=endpoints.get("tpu"), compute_endpoint=endpoints.get("compute"))
    offerings = lookup.zones(spec)
    unknown = [o for o in offerings if o.offered is None]
    missing = [o for o in offerings if o.offered is False]
    what, listed = machine_words(spec.machine), ", ".join(zones(spec))
    if missing:
        absent = ", ".join(o.zone for o in missing)
        return [
            Line(FAIL, check, "; ".join(o.detail for o in missing),
                 f"remove {absent} from the job's zones (respawn would skip them), or pick zones that offer {what}: "
                 "gcloud compute accelerator-types list, gcloud compute tpus accelerator-types list")
        ]  # fmt: skip
    if unknown:
        return [Line(WARN, check, "; ".join(o.detail for o in unknown), "check your credentials and the project id")]
    return [Line(PASS, check, f"{listed} offer{'s' if len(offerings) == 1 else ''} {what}")]


def quota_need(machine: MachineSpec) -> tuple[str, int] | None:
    """(the GPU's quota metric without the PREEMPTIBLE_ prefix, GPUs one machine takes: every VM's), None for a
    machine whose quota regions.get does not list: a TPU's is the Cloud TPU API's, per zone (docs/deploy.md, Request
    Spot quota), and Compute Engine's v5p, v6e and TPU7x quotas have no metric in the v1 API."""
    if isinstance(machine, GpuMachine):
        metric = GPU_QUOTAS.get(machine.accelerator_type)
        return None if metric is None else (metric, machine.accelerator_count * machine.vms)
    return None


def quota(d: Deployment, spec: JobSpec) -> list[Line]:
    """Each region of each tier has the quota one machine of that tier needs: Spot and preemptible (and flex-start)
    machines count against PREEMPTIBLE_ metrics, standard ones against the plain metric; a reservation's are
    reserved."""
    wanted: dict[tuple[str, str], int] = {}  # (region, metric) -> the most one machine there needs
    unlisted: dict[str, None] = {}
    for n, tier in enumerate(spec.all_tiers):
        if tier.provisioning == Provisioning.RESERVATION:
            continue
        machine = spec.machine_of(n)
        need = quota_need(machine)
        if need is None:
            unlisted[machine_words(machine)] = None
            continue
        base, units = need
        preemptible = tier.provisioning in SPOT_MODELS or tier.provisioning == Provisioning.FLEX_START
        metric = f"PREEMPTIBLE_{base}" if preemptible else base
        for zone in tier.zones:
            wanted[(region_of(zone), metric)] = max(units, wanted.get((region_of(zone), metric), 0))
    lines = [
        Line(
            WARN,
            "quota",
            f"{words}'s quota is not listed by Compute Engine's regions.get: not checked",
            f"gcloud beta quotas info list --service=tpu.googleapis.com --project={d.project} (or IAM & Admin > "
            "Quotas: docs/deploy.md, Request Spot quota)",
        )
        for words in unlisted
    ]
    compute = d.clients("compute")
    for (region, metric), units in wanted.items():
        check = f"quota in {region}"
        got, problem = ask(check, compute.regions().get(project=d.project, region=region).execute)
        if problem or got is None:
            lines.append(problem or Line(FAIL, check, f"no region {region}", "fix the job's zones"))
            continue
        q = next((q for q in got.get("quotas") or [] if q.get("metric") == metric), None)
        free = 0 if q is None else int(float(q.get("limit", 0)) - float(q.get("usage", 0)))
        if free < units:
            have = "none" if q is None else f"{free:g} of {float(q.get('limit', 0)):g} free"
            lines.append(
                Line(
                    FAIL,
                    check,
                    f"{metric}: {have}, one machine needs {units}",
                    f"request {metric} in {region}: console IAM & Admin > Quotas (docs/deploy.md, "
                    "Request Spot quota), or drop the region's zones",
                )
            )
        else:
            lines.append(Line(PASS, check, f"{metric}: {free:g} free, one machine needs {units}"))
    return lines


def slice_firewall(d: Deployment, spec: JobSpec) -> list[Line]:
    """A multi-host slice's workers reach worker 0's coordinator: an enabled ingress rule on the network allows tcp
    to COORDINATOR_PORT from the machines (their account or a range holding their subnetworks) to them."""
    if all(spec.machine_of(n).hosts <= 1 for n in range(len(spec.all_tiers))):
        return []
    check = "slice firewall rule"
    compute = d.clients("compute")
    rules, problem = ask(
        check,
        lambda: pages(
            lambda token: compute.firewalls().list(project=d.network_project, pageToken=token).execute(), "items"
        ),
    )
    if problem or rules is None:
        return [problem or Line(FAIL, check, f"project {d.network_project} not found", "check RESPAWN_NETWORK")]
    ok = [r["name"] for r in rules if _lets_peers_in(r, d)]
    if not ok:
        return [
            Line(
                FAIL,
                check,
                f"no enabled ingress rule on {d.network_name} lets the machines reach each other "
                f"(tcp {COORDINATOR_PORT}, the JAX coordinator)",
                f"slice_firewall = true in terraform.tfvars and {DEPLOY} (network.tf: machine_peers)",
            )
        ]
    return [Line(PASS, check, f"{ok[0]} lets the slice's workers reach tcp {COORDINATOR_PORT}")]


def _lets_peers_in(rule: dict[str, Any], d: Deployment) -> bool:
    if rule.get("disabled") or rule.get("direction", "INGRESS") != "INGRESS":
        return False
    if not str(rule.get("network", "")).endswith(f"/networks/{d.network_name}"):
        return False
    targets_ok = not rule.get("targetTags") and d.machine in (rule.get("targetServiceAccounts") or [d.machine])
    sources = d.machine in (rule.get("sourceServiceAccounts") or []) or any(
        ipaddress.ip_network(r, strict=False).overlaps(private)
        for r in rule.get("sourceRanges") or []
        for private in PRIVATE
    )
    return targets_ok and sources and any(_allows_port(a) for a in rule.get("allowed") or [])


def _allows_port(allowed: dict[str, Any]) -> bool:
    if allowed.get("IPProtocol") not in ("tcp", "all", "6"):
        return False
    for port in allowed.get("ports") or ["0-65535"]:
        low, _, high = str(port).partition("-")
        if int(low) <= COORDINATOR_PORT <= int(high or low):
            return True
    return False


def continent(location: str) -> str:
    """us-central1 -> us, US -> us, EU -> europe, europe-west4 -> europe, asia -> asia."""
    first = location.lower().split("-", 1)[0]
    return "europe" if first == "eu" else first


def near(location: str, regions: set[str]) -> bool:
    """A bucket or repository location (a region, or a multi-region: US, EU, ASIA) is on the continent of every
    region: its reads and writes stay within the continent's network."""
    return all(continent(location) == continent(r) for r in regions)


def checkpoint_bucket(d: Deployment, spec: JobSpec) -> list[Line]:
    check = "checkpoint bucket"
    bucket = spec.checkpoint_uri.removeprefix("gs://").split("/", 1)[0]
    regions = {region_of(z) for z in zones(spec)}
    got, missing = exists(
        check,
        d.clients("storage").buckets().get(bucket=bucket).execute,
        f"gs://{bucket} does not exist",
        f"gcloud storage buckets create gs://{bucket} --location={min(regions)} --uniform-bucket-level-access, or "
        "use the deployment's (terraform output checkpoint_bucket)",
    )
    if missing:
        return missing
    location = str(got.get("location", ""))
    lines = [
        Line(PASS, check, f"gs://{bucket} is in {location}, near {', '.join(sorted(regions))}")
        if near(location, regions)
        else Line(
            WARN,
            check,
            f"gs://{bucket} is in {location}, the job runs in {', '.join(sorted(regions))}: "
            "every save and restore crosses regions (slower, and billed as egress)",
            "a checkpoint bucket in the job's region or its multi-region",
        )
    ]
    writable = grant_line(
        d, grants_on(needs.CHECKPOINT_BUCKET)[0], bucket, check="machines write the checkpoint bucket"
    )
    if writable.status == FAIL:
        writable = Line(
            FAIL,
            writable.check,
            writable.detail,
            f"gcloud storage buckets add-iam-policy-binding gs://{bucket} --member=serviceAccount:"
            f"{d.machine} --role=roles/storage.objectAdmin (the deployment's own bucket: {DEPLOY})",
        )
    return [*lines, writable]


def image(d: Deployment, spec: JobSpec) -> list[Line]:
    check = "trainer image"
    kind = spec.machine.kind
    if spec.image == DEPLOYMENT_IMAGES[kind]:  # the job names none (respawn_cli.main.job_spec)
        return [
            Line(
                WARN,
                check,
                f"the job names no image: it runs the deployment's trainer image of a {kind} machine "
                "(RESPAWN_TRAINER_IMAGES, set by Terraform's trainer_tag), not checked here",
                "terraform -chdir=infra/terraform output trainer_images, then gcloud artifacts docker tags list "
                "IMAGE (docs/deploy.md, A job's default image)",
            )
        ]
    m = _AR_IMAGE.match(spec.image)
    if m is None:
        return [
            Line(
                WARN,
                check,
                f"{spec.image} is not in Artifact Registry: not checked",
                "push it to the deployment's repository (docs/deploy.md, Build the trainer image)",
            )
        ]
    repo = f"projects/{m['project']}/locations/{m['location']}/repositories/{m['repo']}"
    package = f"{repo}/packages/{quote(m['image'], safe='')}"
    packages = d.clients("artifactregistry").projects().locations().repositories().packages()
    if m["digest"]:
        request = packages.versions().get(name=f"{package}/versions/{m['digest']}")
    else:
        request = packages.tags().get(name=f"{package}/tags/{m['tag'] or 'latest'}")
    _, missing = exists(
        check,
        request.execute,
        f"{spec.image} does not exist",
        f"build and push it: docker build ... && docker push {spec.image} (docs/deploy.md, Build the trainer image)",
    )
    if missing:
        return missing
    regions = {region_of(z) for z in zones(spec)}
    where = (
        Line(PASS, "image location", f"{m['location']} is near {', '.join(sorted(regions))}")
        if near(m["location"], regions)
        else Line(
            WARN,
            "image location",
            f"{m['location']} is far from {', '.join(sorted(regions))}: every machine "
            "pulls the image across regions (slower starts, egress)",
            "image_regions in terraform.tfvars (docs/operations.md, Machines that start fast)",
        )
    )
    return [
        Line(PASS, check, f"{spec.image} exists"),
        where,
        grant_line(d, grants_on(needs.REPOSITORY)[0], repo, check="machines pull the image"),
    ]


def org_policies(d: Deployment, spec: JobSpec | None) -> list[Line]:
    """The effective organisation policies the machines meet: external IPs (when they have one) and resource
    locations (the job's zones)."""
    policies = d.clients("orgpolicy").projects().policies()
    lines = []
    wanted = [("compute.vmExternalIpAccess", d.external_ips), ("gcp.resourceLocations", spec is not None)]
    for constraint, applies in wanted:
        if not applies:
            continue
        check = f"org policy {constraint}"
        name = f"projects/{d.project}/policies/{constraint}"
        got, problem = ask(check, policies.getEffectivePolicy(name=name).execute)
        if problem:
            lines.append(problem)
            continue
        rules = ((got or {}).get("spec") or {}).get("rules") or []
        lines.append(
            _external_ip(check, rules)
            if constraint == "compute.vmExternalIpAccess"
            else _locations(check, rules, zones(spec) if spec else [])
        )
    return lines


def _external_ip(check: str, rules: list[dict[str, Any]]) -> Line:
    if not rules or any(r.get("allowAll") for r in rules):
        return Line(PASS, check, "machines may have external IPs")
    return Line(
        FAIL,
        check,
        "the organisation forbids external IPs on new VMs, and the machines get one",
        "external_ip = false in terraform.tfvars (with Private Google Access or Cloud NAT) and "
        f"{DEPLOY} (docs/deploy.md, A project without a default network)",
    )


def _locations(check: str, rules: list[dict[str, Any]], job_zones: list[str]) -> Line:
    if not rules or any(r.get("allowAll") for r in rules):
        return Line(PASS, check, "every location is allowed")
    if any(r.get("denyAll") for r in rules):
        return Line(FAIL, check, "the organisation allows no location", "ask your organisation's policy admins")
    allowed = [v for r in rules for v in (r.get("values") or {}).get("allowedValues") or []]
    denied = [v for r in rules for v in (r.get("values") or {}).get("deniedValues") or []]

    def matches(zone: str, value: str) -> bool:
        value = value.removeprefix("in:").removesuffix("-locations")
        value = value.removeprefix("zones:").removeprefix("regions:")
        return zone == value or region_of(zone) == value or zone.startswith(f"{value}-")

    refused = [
        z
        for z in job_zones
        if any(matches(z, v) for v in denied) or (allowed and not any(matches(z, v) for v in allowed))
    ]
    if refused:
        return Line(
            FAIL,
            check,
            f"the organisation does not allow {', '.join(refused)}",
            "use zones the policy allows (gcloud org-policies describe gcp.resourceLocations --effective)",
        )
    return Line(PASS, check, f"{', '.join(job_zones)} allowed")
