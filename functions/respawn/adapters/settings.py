"""What every machine provider is configured with, and the REST client options that point it at an endpoint."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.auth.credentials import AnonymousCredentials


@dataclass(frozen=True)
class ProviderSettings:
    service_account: str | None = None  # the machines' identity (cloud-platform scope); None: the API's default
    network: str | None = None  # None: the project's default network
    external_ips: bool = True  # False: machines reach Google APIs through Private Google Access only
    create_wait_s: float = 120.0  # how long a create waits for its operation before leaving it to the sweep
    request_timeout_s: float = 30.0
    read_retry_s: float = 10.0  # reads retry transient errors this long; writes never retry (redelivery does)


DEFAULTS = ProviderSettings()


def client_options(endpoint: str | None) -> dict[str, Any]:
    """REST transport; with `endpoint` (the local cloud), anonymous credentials at that address."""
    if endpoint:
        return {
            "transport": "rest",
            "credentials": AnonymousCredentials(),  # type: ignore[no-untyped-call]
            "client_options": {"api_endpoint": endpoint},
        }
    return {"transport": "rest"}
