"""The organisation policies a deployment's machines meet, read as Org Policy v2's getEffectivePolicy gives them:
external IPs (compute.vmExternalIpAccess), the job's zones (gcp.resourceLocations, value groups included) and the
boot images of its Compute Engine machines (compute.trustedImageProjects). Each returns Lines (checks.py)."""

from __future__ import annotations

import re
from typing import Any

from respawn.jobs import API_COMPUTE, GpuMachine, JobSpec
from respawn.topology import UnknownTpuType, compute_shape
from respawn_cli.doctor.checks import DEPLOY, FAIL, PASS, WARN, Deployment, Line, ask
from respawn_cli.doctor.job_checks import region_of, zones
from respawn_cli.offering import machine_words

_REGION = re.compile(r"[a-z]+-[a-z]+[0-9]+")
_ZONE = re.compile(r"[a-z]+-[a-z]+[0-9]+-[a-z0-9]+")
# The value groups of gcp.resourceLocations that are a continent's regions: every region named with the prefix
# (in:us-locations: us-central1, us-east5, ...; https://cloud.google.com/resource-manager/docs/organization-policy/
# defining-locations, "Value groups").
_CONTINENT_GROUPS = {"us": "us-", "europe": "europe-", "asia": "asia-", "australia": "australia-",
                     "southamerica": "southamerica-"}  # fmt: skip
# in:eu-locations: the European Union's regions; Europe's other regions (London, Zurich) are outside it. A European
# region in neither set is one doctor cannot place (a warning, not a failure).
EU_REGIONS = frozenset(
    {
        "europe-central2",
        "europe-north1",
        "europe-north2",
        "europe-southwest1",
        "europe-west1",
        "europe-west3",
        "europe-west4",
        "europe-west8",
        "europe-west9",
        "europe-west10",
        "europe-west12",
    }
)
NOT_EU_REGIONS = frozenset({"europe-west2", "europe-west6"})


def org_policies(d: Deployment, spec: JobSpec | None) -> list[Line]:
    """The effective organisation policies the machines meet: external IPs (when they have one), resource locations
    (the job's zones) and trusted image projects (the boot images of the job's Compute Engine machines)."""
    policies = d.clients("orgpolicy").projects().policies()
    images = boot_image_projects(d, spec) if spec else {}
    wanted = [
        ("compute.vmExternalIpAccess", d.external_ips),
        ("gcp.resourceLocations", spec is not None),
        ("compute.trustedImageProjects", bool(images)),
    ]
    lines = []
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
        if constraint == "compute.vmExternalIpAccess":
            lines.append(_external_ip(check, rules))
        elif constraint == "gcp.resourceLocations":
            lines.append(_locations(check, rules, zones(spec) if spec else []))
        else:
            lines.append(_trusted_images(d, check, rules, images))
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


def in_location(zone: str, value: str) -> bool | None:
    """Whether a gcp.resourceLocations value holds the zone: True, False, or None for a value group doctor cannot
    expand. `in:GROUP` holds the group's locations and those within them (`in:us-east1-locations`: the region and
    its zones); a bare region or multi-region holds itself only, not the zones within it (Google's page: denying
    us-east1 still lets resources be created in us-east1-a)."""
    value = value.removeprefix("is:")
    region = region_of(zone)
    if not value.startswith("in:"):
        return value.removeprefix("zones:") == zone
    group = value.removeprefix("in:").removesuffix("-locations")
    if _REGION.fullmatch(group):
        return group == region
    if _ZONE.fullmatch(group):
        return group == zone
    if group in _CONTINENT_GROUPS:
        return region.startswith(_CONTINENT_GROUPS[group])
    if group == "eu":
        if region in EU_REGIONS:
            return True
        return False if region in NOT_EU_REGIONS or not region.startswith("europe-") else None
    return None


def _locations(check: str, rules: list[dict[str, Any]], job_zones: list[str]) -> Line:
    if not rules or any(r.get("allowAll") for r in rules):
        return Line(PASS, check, "every location is allowed")
    if any(r.get("denyAll") for r in rules):
        return Line(FAIL, check, "the organisation allows no location", "ask your organisation's policy admins")
    allowed = [v for r in rules for v in (r.get("values") or {}).get("allowedValues") or []]
    denied = [v for r in rules for v in (r.get("values") or {}).get("deniedValues") or []]
    refused, unsure = [], []
    for zone in job_zones:
        is_denied = [in_location(zone, v) for v in denied]
        is_allowed = [in_location(zone, v) for v in allowed]
        if True in is_denied or (allowed and None not in is_allowed and True not in is_allowed):
            refused.append(zone)
        elif None in is_denied or (allowed and True not in is_allowed):
            unsure.append(zone)
    describe = "gcloud org-policies describe gcp.resourceLocations --effective"
    if refused:
        return Line(FAIL, check, f"the organisation does not allow {', '.join(refused)}",
                    f"use zones the policy allows ({describe})")  # fmt: skip
    if unsure:
        groups = sorted({v for v in allowed + denied if any(in_location(z, v) is None for z in unsure)})
        return Line(WARN, check, f"cannot tell whether {', '.join(groups)} hold {', '.join(unsure)}",
                    f"check the value groups' locations ({describe})")  # fmt: skip
    return Line(PASS, check, f"{', '.join(job_zones)} allowed")


def boot_image_projects(d: Deployment, spec: JobSpec) -> dict[str, list[str]]:
    """The projects of the boot images the job's Compute Engine machines boot from (the Deep Learning VM image of
    a GPU VM, a TPU generation's image or the job's machine.image), each with the machines that boot from it: those
    compute.trustedImageProjects governs. The project's own images are exempt (Google: trusted image policies "do
    not restrict access to ... custom images in your local project"); a Cloud TPU API node's runtime is not a
    Compute Engine image respawn names."""
    from respawn.adapters.compute import DLVM_IMAGE

    found: dict[str, list[str]] = {}
    for n in range(len(spec.all_tiers)):
        machine = spec.machine_of(n)
        if isinstance(machine, GpuMachine):
            image = DLVM_IMAGE
        elif machine.api != API_COMPUTE:
            continue
        else:
            try:
                image = machine.image or compute_shape(machine.accelerator_type).image
            except UnknownTpuType:
                continue
        project = image.split("projects/", 1)[-1].split("/", 1)[0]
        if project != d.project and machine_words(machine) not in found.get(project, []):
            found.setdefault(project, []).append(machine_words(machine))
    return found


def _trusted_images(d: Deployment, check: str, rules: list[dict[str, Any]], images: dict[str, list[str]]) -> Line:
    if not rules or any(r.get("allowAll") for r in rules):
        return Line(PASS, check, "boot disks may come from any image project")
    allowed = [v.removeprefix("is:") for r in rules for v in (r.get("values") or {}).get("allowedValues") or []]
    denied = [v.removeprefix("is:") for r in rules for v in (r.get("values") or {}).get("deniedValues") or []]
    deny_all = any(r.get("denyAll") for r in rules)
    refused: list[str] = []
    unsure: list[str] = []
    for project in images:
        value = f"projects/{project}"
        if deny_all or value in denied:
            refused.append(project)
        elif allowed and value not in allowed:
            # under:organizations/N or under:folders/N trusts the projects there, which doctor does not look up
            (unsure if any(v.startswith("under:") for v in allowed) else refused).append(project)
    fix = (
        "ask your organisation's policy admins to trust "
        + ", ".join(f"projects/{p}" for p in refused + unsure)
        + f" (gcloud org-policies describe compute.trustedImageProjects --effective --project={d.project}), or "
        "boot from an image in this project (a TPU job's machine.image)"
    )
    if refused:
        boots = "; ".join(f"{', '.join(images[p])} boot from projects/{p}" for p in refused)
        return Line(FAIL, check, f"the organisation does not trust the image project: {boots}", fix)
    if unsure:
        trusted = ", ".join(v for v in allowed if v.startswith("under:"))
        return Line(WARN, check, f"cannot tell whether {trusted} hold {', '.join('projects/' + p for p in unsure)}",
                    fix)  # fmt: skip
    return Line(PASS, check, f"{', '.join('projects/' + p for p in images)} trusted")
