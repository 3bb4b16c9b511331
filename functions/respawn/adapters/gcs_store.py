"""GcsJobStore: job records as JSON objects in GCS, written only with compare-and-set, and their live index (a
marker per job the sweep watches, and the index's state); GcsHistoryStore: the deployment's preemption history
(respawn.outlook.History), one object in the same bucket written the same way, and the observations not yet folded
into it, one create-only object each.

Every write carries `ifGenerationMatch` (0 = create only), so two handlers
that loaded the same generation cannot both win: the loser gets ConflictError,
reloads and re-decides.

Reads, writes and deletes are GCS JSON API calls through google-auth's
AuthorizedHttp over a urllib3 pool (`_authorized_http`): the storage client's
credentials and endpoint, kept-alive connections, and the environment's proxy
(a CONNECT tunnel for https) when the client's own session reads the
environment. TLS trusts the system's CAs (SSL_CERT_FILE). Listing goes through
the storage client.

Transient failures (408, 429, 5xx, a dropped connection, a timeout) are tried
again twice by urllib3's Retry, after 1 s and 2 s as GCS asks, then raised as TransientError so that Pub/Sub
redelivers. A retried write is safe: if the first try landed, the retry gets
412 and the handler reloads a record that already holds its decision.
"""

from __future__ import annotations

import json
import random
import secrets
import urllib.request
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, unquote

import urllib3
from google.api_core import exceptions
from google.auth.transport.urllib3 import AuthorizedHttp
from google.cloud import storage
from google.cloud.storage.retry import DEFAULT_RETRY
from urllib3.util.retry import Retry

from respawn.jobs import Job
from respawn.outlook import History, Observation
from respawn.ports import ConflictError, IndexState, Marker, TransientError

_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_TIMEOUT_S = 30.0  # to connect, and for each read
_CONNECTIONS = 10  # kept per endpoint: one per thread that calls at once


class _Backoff(Retry):
    """urllib3's Retry on GCS's schedule: the first retry after 1 s, then 2 s (urllib3 sends its first at once).
    GCS takes one write per second to an object; a 429 tried again sooner is refused again."""

    def get_backoff_time(self) -> float:
        tries = len(self.history)  # failed so far; urllib3 sleeps this long before the next
        jitter = random.random() * self.backoff_jitter
        return min(self.backoff_max, self.backoff_factor * 2 ** (tries - 1) + jitter) if tries else 0.0


_RETRY = _Backoff(
    total=2,  # three tries in all, over about 3 s
    other=0,  # a failed TLS handshake or a refused tunnel is not tried again
    allowed_methods=None,  # every method: a write's retry is safe under its precondition
    status_forcelist=_TRANSIENT_STATUS,
    backoff_factor=1.0,  # 1 s, then 2 s
    backoff_jitter=0.2,
    raise_on_status=False,  # the last reply comes back, and `_call` raises TransientError
    respect_retry_after_header=False,  # Pub/Sub's redelivery is the long wait, not a handler's
)

_TRANSIENT = (
    exceptions.TooManyRequests,
    exceptions.InternalServerError,
    exceptions.BadGateway,
    exceptions.ServiceUnavailable,
    exceptions.GatewayTimeout,
    exceptions.RetryError,
)


class StoreError(RuntimeError):
    """A store call that retrying will not fix (403, a missing bucket); the message names the object."""


def _text(response: urllib3.BaseHTTPResponse) -> str:
    return response.data[:200].decode(errors="replace").strip()


def _multipart(name: str, record: bytes, metadata: dict[str, str] | None = None) -> tuple[bytes, str]:
    """The body and content type of a multipart upload (the object's metadata, with its custom `metadata`, then its
    bytes). A media upload would do on GCS, but fake-gcs-server honours ifGenerationMatch only on multipart uploads."""
    boundary = f"respawn-{secrets.token_hex(16)}"
    meta = json.dumps({"name": name, "contentType": "application/json", **({"metadata": metadata} if metadata else {})})
    head = f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{meta}\r\n"
    part = f"--{boundary}\r\nContent-Type: application/json\r\n\r\n"
    body = b"".join((head.encode(), part.encode(), record, f"\r\n--{boundary}--\r\n".encode()))
    return body, f"multipart/related; boundary={boundary}"


def function_client(project: str | None = None) -> storage.Client:
    """The storage client of the deployed functions: it does not read proxy settings from the environment.

    requests looks the proxy variables up on every call (a walk over os.environ);
    the functions reach GCS directly. The CLI keeps the default client, which
    honours HTTPS_PROXY (and so does the store's own pool, see `_authorized_http`).
    """
    client = storage.Client(project=project)
    client._http.trust_env = False
    return client


def _authorized_http(client: storage.Client, endpoint: str) -> AuthorizedHttp:
    """urllib3 connections to `endpoint` with `_RETRY`, each request signed by the client's credentials (which
    google-auth refreshes when they expire). Through the environment's proxy when the client's session reads the
    environment (requests' `trust_env`) and `endpoint` is not exempt from it (no_proxy)."""
    options: dict[str, Any] = {"retries": _RETRY, "maxsize": _CONNECTIONS}
    url = urllib3.util.parse_url(endpoint)
    proxy = urllib.request.getproxies().get(url.scheme or "") if getattr(client._http, "trust_env", True) else None
    if proxy and not urllib.request.proxy_bypass(url.host or ""):
        auth = urllib3.util.parse_url(proxy).auth
        headers = urllib3.make_headers(proxy_basic_auth=unquote(auth)) if auth else None
        pool: urllib3.PoolManager = urllib3.ProxyManager(proxy, proxy_headers=headers, **options)
    else:
        pool = urllib3.PoolManager(**options)
    return AuthorizedHttp(client._credentials, http=pool)  # type: ignore[no-untyped-call]


class _JsonObjects:
    """JSON objects of one bucket, read with their generation and written with ifGenerationMatch."""

    def __init__(self, bucket: str, client: storage.Client | None = None) -> None:
        self._client = client or storage.Client()
        self._bucket = self._client.bucket(bucket)
        self.bucket_name = bucket
        endpoint = self._client.api_endpoint.rstrip("/")
        self._objects = f"{endpoint}/storage/v1/b/{quote(bucket, safe='')}/o/"
        self._uploads = f"{endpoint}/upload/storage/v1/b/{quote(bucket, safe='')}/o"
        self._http = _authorized_http(self._client, endpoint)

    def _call(
        self, what: str, method: str, url: str, body: bytes | None = None, content_type: str = ""
    ) -> urllib3.BaseHTTPResponse:
        """One JSON API call (urllib3 tries a transient failure again); TransientError when it keeps failing."""
        headers = {"Content-Type": content_type} if content_type else {}
        try:
            response: urllib3.BaseHTTPResponse = self._http.urlopen(  # type: ignore[no-untyped-call]
                method, url, body=body, headers=headers, timeout=_TIMEOUT_S
            )
        except urllib3.exceptions.HTTPError as e:  # refused, reset, timed out, cut short, a failed handshake
            reason = e.reason if isinstance(e, urllib3.exceptions.MaxRetryError) else e
            raise TransientError(f"{what}: {type(reason).__name__}: {reason}") from e
        if response.status in _TRANSIENT_STATUS:
            raise TransientError(f"{what}: {response.status} {_text(response)}")
        return response

    def _read(self, name: str) -> tuple[Any, int]:
        """(the object's JSON, its generation); (None, 0) when it does not exist."""
        what = f"reading gs://{self.bucket_name}/{name}"
        response = self._call(what, "GET", f"{self._objects}{quote(name, safe='')}?alt=media")
        if response.status == 404:
            return None, 0
        if response.status != 200:
            raise StoreError(f"{what}: {response.status} {_text(response)}")
        # The download names the generation of exactly the bytes it returned.
        return json.loads(response.data), int(response.headers["x-goog-generation"])

    def _write(
        self, name: str, value: Any, generation: int | None, conflict: str, metadata: dict[str, str] | None = None
    ) -> int:
        """Write iff the object is still at `generation` (0: create; None: whatever it is); ConflictError saying
        `conflict` otherwise. `metadata`: the object's custom metadata, which a listing returns."""
        what = f"writing gs://{self.bucket_name}/{name}"
        data = json.dumps(value, separators=(",", ":")).encode()  # in the record's own field order
        url = f"{self._uploads}?uploadType=multipart"
        url += "" if generation is None else f"&ifGenerationMatch={generation:d}"
        response = self._call(what, "POST", url, *_multipart(name, data, metadata))
        if response.status == 412:
            raise ConflictError(f"{conflict} is no longer at generation {generation}")
        if response.status != 200:
            raise StoreError(f"{what}: {response.status} {_text(response)}")
        return int(json.loads(response.data)["generation"])

    def _delete(self, name: str, generation: int | None = None) -> None:
        """Delete the object, iff it is still at `generation` when one is given (ConflictError otherwise); an object
        already gone is no error (a retried delete that had landed finds none). fake-gcs-server deletes whatever
        the precondition."""
        what = f"deleting gs://{self.bucket_name}/{name}"
        url = f"{self._objects}{quote(name, safe='')}"
        response = self._call(what, "DELETE", url if generation is None else f"{url}?ifGenerationMatch={generation:d}")
        if response.status == 412:
            raise ConflictError(f"gs://{self.bucket_name}/{name} is no longer at generation {generation}")
        if response.status not in (200, 204, 404):
            raise StoreError(f"{what}: {response.status} {_text(response)}")

    def _list(self, prefix: str) -> list[str]:
        """The names of the objects under `prefix`, sorted."""
        try:
            return sorted(b.name for b in self._client.list_blobs(self._bucket, prefix=prefix, retry=DEFAULT_RETRY))
        except _TRANSIENT as e:
            raise TransientError(f"listing gs://{self.bucket_name}/{prefix}: {e}") from e

    def _listed(self, prefix: str) -> list[tuple[str, int, float, dict[str, str]]]:
        """(name, generation, when written in seconds since the epoch, custom metadata) of each object under
        `prefix`, sorted by name: one listing call per 1,000 objects, no read."""
        try:
            blobs = list(self._client.list_blobs(self._bucket, prefix=prefix, retry=DEFAULT_RETRY))
        except _TRANSIENT as e:
            raise TransientError(f"listing gs://{self.bucket_name}/{prefix}: {e}") from e
        return sorted(
            (b.name, int(b.generation or 0), b.updated.timestamp() if b.updated else 0.0, dict(b.metadata or {}))
            for b in blobs
        )


class GcsJobStore(_JsonObjects):
    """JobStore on `gs://BUCKET/PREFIX/JOB_ID.json` (default prefix `respawn/jobs/`), and LiveIndex beside it: a
    marker `LIVE/JOB_ID` per job the sweep watches (default `respawn/live/`), the index's state in `LIVE.json`
    (`respawn/live.json`)."""

    def __init__(
        self,
        bucket: str,
        client: storage.Client | None = None,
        prefix: str = "respawn/jobs/",
        live: str = "respawn/live/",
    ) -> None:
        super().__init__(bucket, client)
        self._prefix = prefix if prefix.endswith("/") else prefix + "/"
        self._live = live if live.endswith("/") else live + "/"
        self._state = self._live.rstrip("/") + ".json"

    def _path(self, job_id: str) -> str:
        return f"{self._prefix}{job_id}.json"

    def load(self, job_id: str) -> tuple[Job | None, int]:
        record, generation = self._read(self._path(job_id))
        return (None, 0) if record is None else (Job.from_dict(record), generation)

    def save(self, job: Job, generation: int) -> int:
        return self._write(self._path(job.job_id), job.to_dict(), generation, f"{job.job_id}: the record")

    def list_ids(self) -> list[str]:
        return sorted(n[len(self._prefix) : -len(".json")] for n in self._list(self._prefix) if n.endswith(".json"))

    def enter(self, job_id: str) -> None:
        self._write(f"{self._live}{job_id}", {"job_id": job_id}, None, f"{job_id}: the marker")

    def markers(self) -> dict[str, Marker]:
        return {
            name[len(self._live) :]: Marker(generation, written_at)
            for name, generation, written_at, _ in self._listed(self._live)
        }

    def leave(self, job_id: str, generation: int) -> None:
        self._delete(f"{self._live}{job_id}", generation)

    def load_state(self) -> tuple[IndexState | None, int]:
        value, generation = self._read(self._state)
        return (None, 0) if value is None else (IndexState.from_json(value), generation)

    def save_state(self, state: IndexState, generation: int) -> int:
        return self._write(self._state, state.to_json(), generation, "the live index's state")


class GcsHistoryStore(_JsonObjects):
    """HistoryStore on `gs://BUCKET/placement/history.json`: one small object the decisions that place a machine read
    (through the service's cache) and the sweep rewrites under compare-and-set, and the observations not folded
    into it yet, `placement/observations/JOB/N` each (the id's own words): written create-only by the handler that
    ended the attempt, the observation in the object's custom metadata too, so one listing returns them all."""

    NAME = "placement/history.json"
    PENDING = "placement/observations/"

    def load(self) -> tuple[History, int]:
        value, generation = self._read(self.NAME)
        return (History(), 0) if value is None else (History.from_json(value), generation)

    def save(self, history: History, generation: int) -> int:
        return self._write(self.NAME, history.to_json(), generation, "the preemption history")

    def _pending_name(self, observation_id: str) -> str:
        return self.PENDING + quote(observation_id, safe="/")

    def add(self, observations: Sequence[Observation]) -> None:
        for o in observations:
            value = o.to_dict()
            metadata = {"observation": json.dumps(value, separators=(",", ":"))}
            try:
                self._write(self._pending_name(o.id), value, 0, f"observation {o.id}", metadata)
            except ConflictError:
                continue  # written before: a duplicate delivery, or a redelivery after a crash

    def pending(self) -> list[Observation]:
        found = []
        for name, _, _, metadata in self._listed(self.PENDING):
            value = json.loads(metadata["observation"]) if "observation" in metadata else self._read(name)[0]
            if value is not None:  # None: deleted since the listing (folded)
                found.append(Observation.from_dict(value))
        return sorted(found, key=lambda o: o.id)

    def drop(self, ids: Sequence[str]) -> None:
        for observation_id in ids:
            self._delete(self._pending_name(observation_id))
