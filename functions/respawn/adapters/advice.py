"""Google's Advice API (Compute Engine `advice.capacity` and `advice.capacityHistory`) as placement advice.

`GcpAdvisor.advise` asks, for one machine type and provisioning model in the zones of one region:
* `capacity`, once per zone: the recommendation's `obtainability` (0..1, how likely a create succeeds now) and
  `estimatedUptime` (how long most Spot VMs are expected to run before preemption);
* `capacityHistory`, once per region: the Spot list price history; the newest price replaces the list table's.
It answers `respawn.outlook.Advice` and never raises: a missing permission, an unknown machine type, a timeout or
any other error is an Advice without zones whose `note` says why, so placement goes on with the history alone.

Google documents both methods as preview and as not covering TPUs
(https://cloud.google.com/compute/docs/instances/view-vm-availability: "you can't view the availability of TPUs";
https://cloud.google.com/compute/docs/instances/view-spot-preemption-price: no N1 machine types with GPUs attached,
no custom machine types, no TPUs). So TPUs are never asked, and an N1 machine type with GPUs gets capacity advice
(the GPUs are sent as guestAccelerators) but no price. capacityHistory takes provisioning model SPOT only, and the
estimated uptime is a Spot figure: other provisioning models (standard, flex-start, reservation) are not asked.
The methods need the IAM permissions compute.advice.capacity and compute.advice.capacityHistory; the pages of
public projects that use them say roles/compute.viewer holds both (Google's own role list was not read here).

Field names are the installed google-cloud-compute's (compute_v1.CapacityAdviceRpcRequest,
CapacityHistoryAdviceRequest and their responses; REST paths /compute/v1/projects/P/regions/R/advice/capacity and
.../capacityHistory, also in the compute v1 discovery document).

A price is per hour of the whole machine type (an accelerator-optimized type's GPUs included), where respawn's
list table prices the accelerators alone; that the history's `listPrice` is hourly is how the pages describe it
(the type says only "the Spot VM list price during the interval").

Answers are cached per (project, region, machine type, accelerators, provisioning, zones) for an hour; a failure
for ten minutes, so that a missing permission costs one deadline per ten minutes, not one per event.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import requests
from google.api_core import exceptions as gexc
from google.cloud import compute_v1

from respawn.adapters.errors import error_text
from respawn.adapters.settings import client_options, region_of
from respawn.jobs import GpuMachine, JobSpec, MachineSpec, Provisioning
from respawn.outlook import HOUR, Advice, ZoneAdvice
from respawn.topology import UnknownTpuType, tpu_topology

CACHE_S = HOUR  # how long an answer is reused
FAILURE_CACHE_S = 600.0  # how long a failure is reused before the API is asked again
DEADLINE_S = 5.0  # all the calls of one advise() together
TPU_NOTE = "Advice API does not cover TPUs; history only"
# respawn's provisioning -> the Advice API's model. Preemptible VMs run as Spot VMs underneath
# (https://cloud.google.com/compute/docs/instances/preemptible), so they get Spot advice.
ADVISED_MODELS: dict[str, str] = {Provisioning.SPOT: "SPOT", Provisioning.PREEMPTIBLE: "SPOT"}
_COMPUTE_TPU = re.compile(r"^(ct\d+[a-z]*|tpu\d+[a-z]*)-")  # ct5p-hightpu-4t, ct6e-standard-8t, tpu7x-standard-4t
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)s$")

CacheKey = tuple[str, str, str, tuple[tuple[str, int], ...], str, tuple[str, ...]]


class AdviceUnavailable(Exception):
    """Why the Advice API gave no answer (str: one line, for the note)."""


def is_tpu(machine_type: str) -> bool:
    """A TPU accelerator type (v6e-8, the history key of a TPU job) or a Compute Engine TPU machine type."""
    if _COMPUTE_TPU.match(machine_type):
        return True
    try:
        tpu_topology(machine_type)
    except UnknownTpuType:
        return False
    return True


def accelerators(machine: MachineSpec) -> tuple[tuple[str, int], ...]:
    """The GPUs to name in a request: an N1 machine type's attached GPUs; none for the accelerator-optimized types
    (a2, a3, g2, ...), whose machine type names its GPUs, nor for TPUs."""
    if isinstance(machine, GpuMachine) and machine.machine_type.startswith("n1-"):
        return ((machine.accelerator_type, machine.accelerator_count),)
    return ()


def advise_regions(
    advisor: GcpAdvisor,
    project: str,
    machine_type: str,
    provisioning: str,
    zones: Sequence[str],
    *,
    accelerators: Sequence[tuple[str, int]] = (),
) -> Advice:
    """One Advice for zones of any regions: the advisor asked once per region (the API is regional), the zones'
    figures together, the notes joined (each once). Prices are kept only when every zone has one: an Advice API
    price is the whole machine type's and the list table's may be the GPUs' alone, so a ranking must not mix them."""
    by_region: dict[str, list[str]] = {}
    for zone in zones:
        by_region.setdefault(region_of(zone), []).append(zone)
    answers = [
        advisor.advise(project, region, machine_type, provisioning, zs, accelerators=accelerators)
        for region, zs in by_region.items()
    ]
    if not answers:
        return Advice({}, time.time())
    notes = list(dict.fromkeys(a.note for a in answers if a.note))
    merged = {zone: said for a in answers for zone, said in a.zones.items()}
    unpriced = [zone for zone in zones if zone not in merged or merged[zone].price_per_hour is None]
    if unpriced and len(unpriced) < len(zones):
        merged = {zone: replace(said, price_per_hour=None) for zone, said in merged.items()}
        notes.append(f"Advice API prices not used: none for {', '.join(unpriced)}; list prices used")
    return Advice(merged, min(a.fetched_at for a in answers), "; ".join(notes) or None)


def advice_for(advisor: GcpAdvisor, project: str, spec: JobSpec) -> dict[tuple[str, str], Advice]:
    """What the Advice API says of a job's machines: one Advice per (machine type, provisioning model) of its tiers
    (each tier's own machine where it names one), over all their zones, as the outlook keys it. A TPU: the note, no
    call."""
    now = time.time()
    zones: dict[tuple[str, str], list[str]] = {}
    machines: dict[str, JobSpec] = {}
    for index, tier in enumerate(spec.all_tiers):
        on_tier = spec.on_tier(index)
        kind = on_tier.machine.type_name
        machines.setdefault(kind, on_tier)
        listed = zones.setdefault((kind, tier.provisioning), [])
        listed.extend(z for z in tier.zones if z not in listed)
    return {
        (kind, p): Advice({}, now, TPU_NOTE)
        if is_tpu(kind)
        else advise_regions(advisor, project, kind, p, zs, accelerators=accelerators(machines[kind].machine))
        for (kind, p), zs in zones.items()
    }


class GcpAdvisor:
    """What Google's Advice API says of a machine type's zones, over compute_v1.AdviceClient (REST; `endpoint`
    for the local cloud's API). The one advisor: tests run it against the local Advice API."""

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        deadline_s: float = DEADLINE_S,
        cache_s: float = CACHE_S,
        failure_cache_s: float = FAILURE_CACHE_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = compute_v1.AdviceClient(**client_options(endpoint))
        self.deadline_s, self.cache_s, self.failure_cache_s = deadline_s, cache_s, failure_cache_s
        self.clock = clock
        self._cache: dict[CacheKey, tuple[float, Advice]] = {}
        self._lock = threading.Lock()

    def advise(
        self,
        project: str,
        region: str,
        machine_type: str,
        provisioning: str,
        zones: Sequence[str],
        *,
        accelerators: Sequence[tuple[str, int]] = (),
    ) -> Advice:
        now = self.clock()
        if is_tpu(machine_type):
            return Advice({}, now, TPU_NOTE)
        model = ADVISED_MODELS.get(provisioning)
        if model is None:
            return Advice({}, now, f"Advice API advises Spot VMs only; {provisioning}: history only")
        if not zones:
            return Advice({}, now)
        key: CacheKey = (project, region, machine_type, tuple(accelerators), provisioning, tuple(zones))
        with self._lock:
            cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            advice = self._fetch(project, region, machine_type, model, zones, tuple(accelerators), now)
        except Exception as e:  # a request respawn could not even build: never a failed event
            advice = Advice({}, now, f"Advice API not asked: {why(e, self.deadline_s)}; history only")
        keep = self.failure_cache_s if advice.note and not advice.zones else self.cache_s
        with self._lock:
            self._cache[key] = (now + keep, advice)
        return advice

    def _fetch(
        self,
        project: str,
        region: str,
        machine_type: str,
        model: str,
        zones: Sequence[str],
        accelerators: tuple[tuple[str, int], ...],
        now: float,
    ) -> Advice:
        ends = time.monotonic() + self.deadline_s
        outside = [z for z in zones if region_of(z) != region]
        if outside:
            return Advice({}, now, f"Advice API not asked: {', '.join(outside)} not in region {region}")
        try:
            said = {z: self._capacity(project, region, machine_type, model, z, accelerators, ends) for z in zones}
        except AdviceUnavailable as e:
            return Advice({}, now, f"Advice API unavailable: {e}; history only")
        note = None
        if accelerators and machine_type.startswith("n1-"):
            price, note = None, "Advice API has no price history for N1 machine types with GPUs; list prices used"
        else:
            try:
                price = self._newest_price(project, region, machine_type, ends)
            except AdviceUnavailable as e:
                price, note = None, f"Advice API price history unavailable: {e}; list prices used"
        if price is not None:
            said = {z: ZoneAdvice(a.estimated_uptime_s, a.obtainability, price) for z, a in said.items()}
        return Advice(said, now, note)

    def _capacity(
        self,
        project: str,
        region: str,
        machine_type: str,
        model: str,
        zone: str,
        accelerators: tuple[tuple[str, int], ...],
        ends: float,
    ) -> ZoneAdvice:
        """One zone's recommendation: its scores, or those of the shard placed in this zone."""
        selection = compute_v1.CapacityAdviceRequestInstanceFlexibilityPolicyInstanceSelection(
            machine_types=[machine_type],
            guest_accelerators=[
                compute_v1.AcceleratorConfig(accelerator_type=kind, accelerator_count=count)
                for kind, count in accelerators
            ],
        )
        body = compute_v1.CapacityAdviceRequest(
            instance_properties=compute_v1.CapacityAdviceRequestInstanceProperties(
                scheduling=compute_v1.CapacityAdviceRequestInstancePropertiesScheduling(provisioning_model=model)
            ),
            instance_flexibility_policy=compute_v1.CapacityAdviceRequestInstanceFlexibilityPolicy(
                instance_selections={"respawn": selection}
            ),
            distribution_policy=compute_v1.CapacityAdviceRequestDistributionPolicy(
                zones=[compute_v1.CapacityAdviceRequestDistributionPolicyZoneConfiguration(zone=f"zones/{zone}")],
                target_shape="ANY_SINGLE_ZONE",
            ),
            size=1,
        )
        request = compute_v1.CapacityAdviceRpcRequest(
            project=project, region=region, capacity_advice_request_resource=body
        )
        response = _call(lambda timeout: self.client.capacity(request=request, timeout=timeout), ends, self.deadline_s)
        for recommendation in response.recommendations:
            placed = {_name(s.zone) for s in recommendation.shards if s.zone}
            if placed and zone not in placed:
                continue
            scores = recommendation.scores
            uptime = _seconds(scores.estimated_uptime) if "estimated_uptime" in scores else None
            obtainability = scores.obtainability if "obtainability" in scores else None
            return ZoneAdvice(uptime, obtainability)
        return ZoneAdvice()

    def _newest_price(self, project: str, region: str, machine_type: str, ends: float) -> float | None:
        """The Spot list price of the newest interval of the region's price history (USD per hour); None when the
        history has no price in USD."""
        body = compute_v1.CapacityHistoryRequest(
            instance_properties=compute_v1.CapacityHistoryRequestInstanceProperties(
                machine_type=machine_type,
                scheduling=compute_v1.CapacityHistoryRequestInstancePropertiesScheduling(provisioning_model="SPOT"),
            ),
            location_policy=compute_v1.CapacityHistoryRequestLocationPolicy(location=f"regions/{region}"),
            types=["PRICE"],
        )
        request = compute_v1.CapacityHistoryAdviceRequest(
            project=project, region=region, capacity_history_request_resource=body
        )
        response = _call(
            lambda timeout: self.client.capacity_history(request=request, timeout=timeout), ends, self.deadline_s
        )
        priced = [
            (_instant(r.interval.start_time if "interval" in r else ""), r.list_price)
            for r in response.price_history
            if "list_price" in r and r.list_price.currency_code in ("", "USD")
        ]
        if not priced:
            return None
        _, money = max(priced, key=lambda item: item[0])
        return float(money.units) + float(money.nanos) / 1e9


def _call(request: Callable[[float], Any], ends: float, deadline_s: float) -> Any:
    """Run one API call with what is left of the deadline; its failure as AdviceUnavailable naming why."""
    left = ends - time.monotonic()
    if left <= 0:
        raise AdviceUnavailable(f"no answer within {deadline_s:g}s")
    try:
        return request(left)
    except Exception as e:
        raise AdviceUnavailable(why(e, deadline_s)) from e


def why(exc: BaseException, deadline_s: float) -> str:
    """One line naming the failure: a missing permission, an unknown method or resource, a timeout, an outage."""
    text = " ".join(error_text(exc).split())[:200]
    if isinstance(exc, (gexc.Forbidden, gexc.Unauthorized)):
        return (
            f"permission denied ({text}); the service account needs compute.advice.capacity and "
            "compute.advice.capacityHistory (roles/compute.viewer holds both)"
        )
    if isinstance(exc, gexc.NotFound):
        return f"not found ({text}); the API is in preview and may not serve this project, region or machine type"
    if isinstance(exc, gexc.BadRequest):
        return f"request refused ({text})"
    if isinstance(exc, (gexc.DeadlineExceeded, TimeoutError, requests.exceptions.Timeout)):
        return f"no answer within {deadline_s:g}s"
    if isinstance(exc, requests.exceptions.ConnectionError):
        return f"unreachable ({text})"
    if isinstance(exc, (gexc.ServerError, gexc.TooManyRequests)):
        return f"unavailable ({text})"
    return f"{type(exc).__name__} ({text})"


def _name(url: str) -> str:
    """zones/us-central1-a, a full URL or a bare name -> us-central1-a."""
    return url.rstrip("/").rpartition("/")[2]


def _seconds(duration: str) -> float | None:
    """A google-duration ("3600s") in seconds; None when it is not one."""
    match = _DURATION.match(duration.strip())
    return float(match.group(1)) if match else None


def _instant(text: str) -> float:
    """An RFC 3339 time in seconds since the epoch; 0 when absent or unreadable (sorts first)."""
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).timestamp()
    except ValueError:
        return 0.0
