"""What every machine provider is configured with, and the REST client options that point it at an endpoint."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.auth.credentials import AnonymousCredentials


@dataclass(frozen=True)
class ProviderSettings:
    service_account: str | None = None  # the machines' identity (cloud-platform scope); None: the API's default
    network: str | None = None  # projects/P/global/networks/N; None: the project's default network
    subnetwork: str | None = None  # a name, the same in every region; None: the network's own
    external_ips: bool = True  # False: machines reach Google APIs through Private Google Access only
    create_wait_s: float = 120.0  # how long a create waits for its operation before leaving it to the sweep
    request_timeout_s: float = 30.0
    read_retry_s: float = 10.0  # reads retry transient errors this long; writes never retry (redelivery does)

    def subnetwork_in(self, zone: str, project: str) -> str | None:
        """The subnetwork a machine in `zone` uses, `projects/P/regions/REGION/subnetworks/NAME` (P: the network's
        project, a Shared VPC's host; `project` without a network); None: the network's own."""
        if not self.subnetwork:
            return None
        if self.network:
            project = self.network.split("/")[1]
        return f"projects/{project}/regions/{region_of(zone)}/subnetworks/{self.subnetwork}"


DEFAULTS = ProviderSettings()


def region_of(zone: str) -> str:
    """us-central1-a -> us-central1."""
    return zone.rpartition("-")[0]


def client_options(endpoint: str | None) -> dict[str, Any]:
    """REST transport; with `endpoint` (the local cloud), anonymous credentials at that address."""
    if endpoint:
        return {
            "transport": "rest",
            "credentials": AnonymousCredentials(),  # type: ignore[no-untyped-call]
            "client_options": {"api_endpoint": endpoint},
        }
    return {"transport": "rest"}
