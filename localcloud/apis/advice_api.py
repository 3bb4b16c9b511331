"""A local Compute Engine Advice API: `advice.capacity` and `advice.capacityHistory`, with seeded figures per zone.

Served on the local cloud's API server (cloudapi.py) for the real compute_v1.AdviceClient over REST, at the paths
of the compute v1 discovery document: POST /compute/v1/projects/P/regions/R/advice/capacity and
.../advice/capacityHistory. The figures are deterministic from `seed` and the zone (or region) and machine type:
* estimated uptime: the zone's MTBI when the local cloud gives one (`mtbi_s`, its `--mtbi ZONE=DURATION`), else a
  seeded 1 to 24 hours; Spot only (other provisioning models get obtainability alone);
* obtainability: a seeded 0.30 to 1.00;
* price history: three 30-day intervals of the region's Spot price, the newest a seeded $0.50 to $5.00 per hour;
* preemption history: 30 daily rates, higher where the uptime is shorter.

It refuses what Google documents the API not to take: a TPU machine type (view-vm-availability: "you can't view the
availability of TPUs"; view-spot-preemption-price: no TPUs), a capacityHistory request whose provisioning model is
not SPOT ("This field must be set to SPOT"), a zone outside the request's region. Google's own error text for these
is not documented; the local one is a 400 INVALID_ARGUMENT in Compute's error format. Injected faults: the server's
fail_next("advice", collection="capacity" | "capacityHistory", ...).
"""

from __future__ import annotations

import hashlib
import re
import time
from typing import Any

from localcloud.apis.apicore import ApiError, CloudCore, NoMachines, compute_error_json, invalid, rfc3339

ADVICE_PATH = re.compile(r"^/compute/v1/projects/([^/]+)/regions/([^/]+)/advice/(capacity|capacityHistory)$")
MODELS = ("FLEX_START", "RESERVATION_BOUND", "SPOT", "STANDARD")
HISTORY_TYPES = ("PREEMPTION", "PRICE")
_TPU_MACHINE = re.compile(r"^(ct\d+[a-z]*|tpu\d+[a-z]*)-|^v\d+[a-z]*-\d+$")
HOUR = 3600.0
DAY = 24 * HOUR
_REASONS = {400: "invalid", 403: "forbidden", 404: "notFound", 429: "rateLimitExceeded", 503: "backendError"}


class AdviceApi(NoMachines):
    """The local Advice API: no machines of its own, only answers (NoMachines: the ApiPart's machine hooks empty).

    `seed` and `mtbi_s` (zone -> seconds) may be changed while the server runs; each answer reads them."""

    def __init__(self, core: CloudCore, seed: int = 0, mtbi_s: dict[str, float] | None = None) -> None:
        self.core = core
        self.seed = seed
        self.mtbi_s: dict[str, float] = dict(mtbi_s or {})

    # ------------------------------------------------------------------ the figures
    def _unit(self, *parts: str) -> float:
        """A number in [0, 1) fixed by the seed and `parts`."""
        digest = hashlib.sha256("|".join((str(self.seed), *parts)).encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64

    def uptime_s(self, zone: str, machine_type: str) -> float:
        """The zone's estimated Spot uptime: its MTBI when given, else seeded 1-24 h (whole minutes)."""
        if zone in self.mtbi_s:
            return float(self.mtbi_s[zone])
        return 60.0 * round(60 * (1 + 23 * self._unit("uptime", zone, machine_type)))

    def obtainability(self, zone: str, machine_type: str) -> float:
        return round(0.3 + 0.7 * self._unit("obtainability", zone, machine_type), 2)

    def price_per_hour(self, region: str, machine_type: str) -> float:
        """The region's newest Spot price of the machine type, USD per hour (cents)."""
        return round(0.5 + 4.5 * self._unit("price", region, machine_type), 2)

    # ------------------------------------------------------------------ ApiPart
    def owns(self, path: str) -> bool:
        return ADVICE_PATH.match(path) is not None

    def route(self, method: str, path: str, query: dict[str, str], body: dict[str, Any]) -> Any:
        match = ADVICE_PATH.match(path)
        if match is None or method != "POST":
            return None
        project, region, verb = match.groups()
        if verb == "capacity":
            return self.capacity(project, region, body)
        return self.capacity_history(project, region, body)

    def error_json(self, e: ApiError) -> dict[str, Any]:
        return compute_error_json(e, _REASONS)

    # ------------------------------------------------------------------ the methods
    def capacity(self, project: str, region: str, body: dict[str, Any]) -> dict[str, Any]:
        """One recommendation (as Google's "initially ... one recommendation"): of the requested zones, the one
        with the best obtainability, its scores and a shard of `size` VMs there."""
        model = str(_get(body, "instanceProperties", "scheduling", "provisioningModel") or "")
        if model not in MODELS:
            raise invalid(f"Invalid value for field 'instanceProperties.scheduling.provisioningModel': {model!r}")
        selections = _get(body, "instanceFlexibilityPolicy", "instanceSelections") or {}
        machine_types = [str(t) for s in dict(selections).values() for t in s.get("machineTypes") or []]
        if not machine_types:
            raise invalid("Required field 'instanceFlexibilityPolicy.instanceSelections[].machineTypes' not specified")
        zones = [_name(str(z.get("zone") or "")) for z in _get(body, "distributionPolicy", "zones") or []]
        if not zones:
            raise invalid("Required field 'distributionPolicy.zones' not specified")
        for zone in zones:
            if zone.rpartition("-")[0] != region:
                raise invalid(f"Invalid value for field 'distributionPolicy.zones': {zone} is not in {region}")
        machine_type = machine_types[0]
        self._refuse_tpu(machine_type)
        with self.core.lock:
            self.core.check("advice", "", machine_type, region, "capacity")
        zone = max(zones, key=lambda z: (self.obtainability(z, machine_type), -zones.index(z)))
        scores: dict[str, Any] = {"obtainability": self.obtainability(zone, machine_type)}
        if model == "SPOT":
            scores["estimatedUptime"] = f"{self.uptime_s(zone, machine_type):g}s"
        shard = {
            "zone": zone,
            "machineType": machine_type,
            "provisioningModel": model,
            "instanceCount": int(body.get("size") or 1),
        }
        return {"recommendations": [{"scores": scores, "shards": [shard]}]}

    def capacity_history(self, project: str, region: str, body: dict[str, Any]) -> dict[str, Any]:
        """The machine type's price history in the region and preemption history in the location asked (a zone or
        the region), as `types` asks (both when it names none)."""
        machine_type = str(_get(body, "instanceProperties", "machineType") or "")
        if not machine_type:
            raise invalid("Required field 'instanceProperties.machineType' not specified")
        model = _get(body, "instanceProperties", "scheduling", "provisioningModel")
        if model != "SPOT":
            raise invalid(f"Invalid value for field 'instanceProperties.scheduling.provisioningModel': {model!r}; "
                          "it must be SPOT")  # fmt: skip
        location = str(_get(body, "locationPolicy", "location") or f"regions/{region}")
        place = _name(location)
        if place != region and place.rpartition("-")[0] != region:
            raise invalid(f"Invalid value for field 'locationPolicy.location': {location} is not in {region}")
        types = [str(t) for t in body.get("types") or HISTORY_TYPES]
        unknown = [t for t in types if t not in (*HISTORY_TYPES, "HISTORY_TYPE_UNSPECIFIED")]
        if unknown:
            raise invalid(f"Invalid value for field 'types': {unknown[0]!r}")
        self._refuse_tpu(machine_type)
        with self.core.lock:
            self.core.check("advice", "", machine_type, place, "capacityHistory")
        now = time.time()
        scope = "zones" if place != region else "regions"
        reply: dict[str, Any] = {
            "machineType": machine_type,
            "location": f"https://www.googleapis.com/compute/v1/projects/{project}/{scope}/{place}",
        }
        if "PRICE" in types:
            price = self.price_per_hour(region, machine_type)
            reply["priceHistory"] = [
                {"interval": _interval(now - (k + 1) * 30 * DAY, now - k * 30 * DAY if k else None),
                 "listPrice": _money(price * (1 + 0.05 * k))}
                for k in (2, 1, 0)
            ]  # fmt: skip
        if "PREEMPTION" in types:
            uptime = self.uptime_s(place, machine_type) if place != region else HOUR * 12
            rate = round(min(0.95, HOUR / uptime), 2)
            reply["preemptionHistory"] = [
                {"interval": _interval(now - (d + 1) * DAY, now - d * DAY), "preemptionRate": rate}
                for d in range(29, -1, -1)
            ]
        return reply

    @staticmethod
    def _refuse_tpu(machine_type: str) -> None:
        if _TPU_MACHINE.search(machine_type):
            raise ApiError(400, "INVALID_ARGUMENT", f"The Advice API does not support TPU machine type {machine_type}")


def _get(body: dict[str, Any], *path: str) -> Any:
    value: Any = body
    for part in path:
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _name(url: str) -> str:
    return url.rstrip("/").rpartition("/")[2]


def _interval(start: float, end: float | None) -> dict[str, str]:
    return {"startTime": rfc3339(start)} | ({"endTime": rfc3339(end)} if end is not None else {})


def _money(usd: float) -> dict[str, Any]:
    """Money as the JSON mapping writes it: units an int64 (a decimal string), nanos an int32."""
    units = int(usd)
    return {"currencyCode": "USD", "units": str(units), "nanos": round((usd - units) * 1e9)}
