"""A job file's checks: each zone offers the machine, each region has quota for it, a slice's firewall rule, the
checkpoint bucket and the image (its network: network_checks.py; the organisation policies its machines meet:
policy_checks.py). Each returns Lines (checks.py)."""

from __future__ import annotations

import ipaddress
import re
from typing import Any
from urllib.parse import quote

from respawn.jobs import API_COMPUTE, SPOT_MODELS, GpuMachine, JobSpec, MachineSpec, Provisioning
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
from respawn_cli.doctor.clients import document
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
    machine whose quota regions.get does not list: a TPU's (the Cloud TPU API's, per zone, or Compute Engine's for a
    TPU machine type: docs/deploy.md, Request Spot quota), and a GPU the table does not name (H100 Mega, H200, B200:
    Cloud Quotas' per-family GPU quota)."""
    if isinstance(machine, GpuMachine):
        metric = GPU_QUOTAS.get(machine.accelerator_type)
        return None if metric is None else (metric, machine.accelerator_count * machine.vms)
    return None


def quota_metrics() -> frozenset[str]:
    """The quota metrics Compute Engine's regions.get defines (the discovery document's Quota.metric enum): Spot
    H100s have PREEMPTIBLE_NVIDIA_H100_GPUS, on-demand ones no metric at all."""
    return frozenset(document("compute", "v1")["schemas"]["Quota"]["properties"]["metric"]["enum"])


def unlisted_line(d: Deployment, machine: MachineSpec, metric: str | None, regions: list[str]) -> Line:
    """A warning naming where the quota of a machine regions.get does not list is: Cloud Quotas, under the service
    that makes the machine (compute.googleapis.com for a GPU or a Compute Engine TPU, tpu.googleapis.com for a Cloud
    TPU API node)."""
    words, where = machine_words(machine), ", ".join(regions)
    if isinstance(machine, GpuMachine):
        what = (
            f"regions.get defines no {metric}"
            if metric
            else f"regions.get has no metric for {machine.accelerator_type}"
        )
        return Line(
            WARN,
            "quota",
            f"{words} in {where}: {what}; its quota is Compute Engine's per-family GPU quota in Cloud Quotas: "
            "not checked",
            "gcloud quotas info describe GPUS-PER-GPU-FAMILY-per-project-region --service=compute.googleapis.com "
            f"--project={d.project} (its gpu_family for {machine.accelerator_type}; Spot and flex-start count as "
            "preemptible: gcloud quotas info list --service=compute.googleapis.com --filter='quotaId~GPU'), or "
            "IAM & Admin > Quotas, service Compute Engine API (docs/deploy.md, Request Spot quota)",
        )
    service = "compute.googleapis.com" if machine.api == API_COMPUTE else "tpu.googleapis.com"
    api = "Compute Engine" if machine.api == API_COMPUTE else "Cloud TPU"
    return Line(WARN, "quota", f"{words} in {where}: its quota is the {api} API's, which Compute Engine's regions.get "
                               "does not list: not checked",
                f"gcloud quotas info list --service={service} --project={d.project} (or IAM & Admin > Quotas, service "
                f"{api} API: docs/deploy.md, Request Spot quota)")  # fmt: skip


def quota(d: Deployment, spec: JobSpec) -> list[Line]:
    """Each region of each tier has the quota one machine of that tier needs: Spot and preemptible (and flex-start)
    machines count against PREEMPTIBLE_ metrics, standard ones against the plain metric; a reservation's are
    reserved. A metric regions.get does not define, or a region's reply does not list, is a warning naming where
    the quota is, never a failure."""
    wanted: dict[tuple[str, str], int] = {}  # (region, metric) -> the most one machine there needs
    unlisted: dict[tuple[str, str | None], tuple[MachineSpec, list[str]]] = {}
    defined = quota_metrics()
    for n, tier in enumerate(spec.all_tiers):
        if tier.provisioning == Provisioning.RESERVATION:
            continue
        machine = spec.machine_of(n)
        need = quota_need(machine)
        preemptible = tier.provisioning in SPOT_MODELS or tier.provisioning == Provisioning.FLEX_START
        metric = None if need is None else f"PREEMPTIBLE_{need[0]}" if preemptible else need[0]
        if need is None or metric not in defined:
            _, regions = unlisted.setdefault((machine_words(machine), metric), (machine, []))
            regions += [r for r in dict.fromkeys(region_of(z) for z in tier.zones) if r not in regions]
            continue
        for zone in tier.zones:
            key = (region_of(zone), str(metric))
            wanted[key] = max(need[1], wanted.get(key, 0))
    lines = [unlisted_line(d, machine, metric, regions) for (_, metric), (machine, regions) in unlisted.items()]
    compute = d.clients("compute")
    for (region, metric), units in wanted.items():
        check = f"quota in {region}"
        got, problem = ask(check, compute.regions().get(project=d.project, region=region).execute)
        if problem or got is None:
            lines.append(problem or Line(FAIL, check, f"no region {region}", "fix the job's zones"))
            continue
        q = next((q for q in got.get("quotas") or [] if q.get("metric") == metric), None)
        if q is None:
            lines.append(Line(WARN, check, f"regions.get lists no {metric} in {region}: not checked",
                              f"gcloud compute regions describe {region} --project={d.project}, or IAM & Admin > "
                              "Quotas (docs/deploy.md, Request Spot quota)"))  # fmt: skip
            continue
        free = int(float(q.get("limit", 0)) - float(q.get("usage", 0)))
        if free < units:
            lines.append(
                Line(
                    FAIL,
                    check,
                    f"{metric}: {free:g} of {float(q.get('limit', 0)):g} free, one machine needs {units}",
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
