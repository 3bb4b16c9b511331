"""The Google API clients `respawn doctor` asks: google-api-python-client over the discovery documents it ships
(static_discovery: no document is fetched), with the user's Application Default Credentials.

The local cloud stands in for Google through the endpoints the CLI already reads: RESPAWN_COMPUTE_ENDPOINT and
RESPAWN_TPU_ENDPOINT (the local Compute Engine and Cloud TPU APIs), STORAGE_EMULATOR_HOST (fake-gcs-server),
PUBSUB_EMULATOR_HOST (the Pub/Sub emulator) and RESPAWN_GOOGLE_APIS_ENDPOINT (the local cloud's Service Usage,
Policy Troubleshooter, Resource Manager, Artifact Registry and Org Policy APIs). An API given an endpoint is called
there with anonymous credentials.
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")
WORKERS = 8  # calls in flight at once (the Policy Troubleshooter takes one permission a call)

# API -> (version, servicePath): a client's api_endpoint replaces the document's rootUrl and servicePath together.
APIS = {
    "serviceusage": ("v1", ""),
    # v3: allow and deny policies (v1 evaluates allow policies only)
    "policytroubleshooter": ("v3", ""),
    "cloudresourcemanager": ("v3", ""),
    "compute": ("v1", "compute/v1/"),
    "tpu": ("v2", ""),
    "storage": ("v1", "storage/v1/"),
    "artifactregistry": ("v1", ""),
    "pubsub": ("v1", ""),
    "orgpolicy": ("v2", ""),
}
LOCAL_APIS = "RESPAWN_GOOGLE_APIS_ENDPOINT"


def endpoints_from_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """API -> the local server answering for it (none in the cloud)."""
    e = os.environ if env is None else env
    shared = e.get(LOCAL_APIS, "").strip()
    local = ("serviceusage", "policytroubleshooter", "cloudresourcemanager", "artifactregistry", "orgpolicy")
    found = dict.fromkeys(local, shared)
    found["compute"] = e.get("RESPAWN_COMPUTE_ENDPOINT", "").strip() or shared
    found["tpu"] = e.get("RESPAWN_TPU_ENDPOINT", "").strip() or shared
    found["storage"] = e.get("STORAGE_EMULATOR_HOST", "").strip()
    pubsub = e.get("PUBSUB_EMULATOR_HOST", "").strip()
    found["pubsub"] = pubsub if not pubsub or "://" in pubsub else f"http://{pubsub}"
    return {api: url for api, url in found.items() if url}


@dataclass
class Clients:
    """One discovery client per API, built on first use."""

    endpoints: dict[str, str] = field(default_factory=dict)
    _built: dict[str, Any] = field(default_factory=dict)
    _credentials: dict[str, Any] = field(default_factory=dict)
    _local: threading.local = field(default_factory=threading.local)
    _pool: ThreadPoolExecutor | None = None

    def __call__(self, api: str) -> Any:
        if api not in self._built:
            from googleapiclient.discovery import build_from_document

            version, service_path = APIS[api]
            endpoint = self.endpoints.get(api)
            options: dict[str, Any] = {}
            if endpoint:
                options = {"client_options": {"api_endpoint": f"{endpoint.rstrip('/')}/{service_path}"}}
            self._built[api] = build_from_document(document(api, version), credentials=self.credentials(api), **options)
        return self._built[api]

    def credentials(self, api: str) -> Any:
        """Anonymous for an API the local cloud answers, else the Application Default Credentials."""
        if api not in self._credentials:
            if self.endpoints.get(api):
                from google.auth.credentials import AnonymousCredentials

                self._credentials[api] = AnonymousCredentials()  # type: ignore[no-untyped-call]
            else:
                import google.auth

                self._credentials[api], _ = google.auth.default(  # type: ignore[no-untyped-call]
                    scopes=["https://www.googleapis.com/auth/cloud-platform"]
                )
        return self._credentials[api]

    def http(self, api: str) -> Any:
        """This thread's own connection (a discovery client's is not thread-safe), authorized as `api`'s calls are,
        kept for the thread's next call."""
        import google_auth_httplib2
        from googleapiclient.http import build_http

        kept: dict[str, Any] = self._local.__dict__.setdefault("http", {})
        if api not in kept:
            kept[api] = google_auth_httplib2.AuthorizedHttp(self.credentials(api), http=build_http())
        return kept[api]

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """fn over items, WORKERS calls in flight at once (each thread with its own connections: http())."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="doctor")
        return list(self._pool.map(fn, items))

    def close(self) -> None:
        """Stop the threads map() started."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


@functools.cache
def document(api: str, version: str) -> dict[str, Any]:
    """The discovery document google-api-python-client ships for api/version, parsed once (compute's is large)."""
    from googleapiclient.discovery_cache import get_static_doc

    text = get_static_doc(api, version)
    if text is None:
        raise RuntimeError(f"google-api-python-client ships no discovery document for {api} {version}")
    parsed: dict[str, Any] = json.loads(text)
    return parsed


def status_of(e: Exception) -> int | None:
    """The HTTP status of a failed call (googleapiclient's HttpError), None for anything else."""
    from googleapiclient.errors import HttpError

    return int(e.resp.status) if isinstance(e, HttpError) else None


def reason(e: Exception) -> str:
    """One line: the API's own message."""
    from googleapiclient.errors import HttpError

    if isinstance(e, HttpError):
        return f"HTTP {e.resp.status}: {' '.join(str(e.reason or '').split())[:200]}"
    return f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"


# A disabled API's 403, in the words Service Usage uses ("... API has not been used in project 123 before or it is
# disabled. Enable it by visiting ..."), for a reply without the ErrorInfo.
_DISABLED = re.compile(r"has not been used in project (\S+) before or it is disabled")


def disabled_api(e: Exception) -> tuple[str, str] | None:
    """(the API, the project it is off in: an id or a number) when the call failed because the API is disabled for
    the caller's project: a 403 whose google.rpc.ErrorInfo reason is SERVICE_DISABLED (metadata `service`,
    `consumer` projects/N), or whose message says so; None for anything else."""
    from googleapiclient.errors import HttpError

    if not isinstance(e, HttpError) or int(e.resp.status) != 403:
        return None
    try:
        error = json.loads(e.content.decode("utf-8"))["error"]
    except (ValueError, KeyError, TypeError, AttributeError):
        error = {}
    for detail in error.get("details") or []:
        if isinstance(detail, dict) and detail.get("reason") == "SERVICE_DISABLED":
            meta = detail.get("metadata") or {}
            return str(meta.get("service", "")), str(meta.get("consumer", "")).removeprefix("projects/")
    m = _DISABLED.search(str(error.get("message") or e.reason or ""))
    if m is None:
        return None
    service = re.search(r"/apis/api/([a-z0-9.-]+)", str(error.get("message") or e.reason or ""))
    return (service.group(1) if service else ""), m.group(1).rstrip(".")
