"""GcsJobStore: job records as JSON objects in GCS, written only with compare-and-set; GcsHistoryStore: the
deployment's preemption history (respawn.outlook.History), one object in the same bucket, written the same way.

Every write carries `ifGenerationMatch` (0 = create only), so two handlers
that loaded the same generation cannot both win: the loser gets ConflictError,
reloads and re-decides.

The two calls of every event (read a record, write it) go straight to the GCS
JSON API on a keep-alive connection per thread (`_Connections`: http.client,
signed with the storage client's credentials, to its endpoint). The requests
stack under `Blob.upload_from_string` costs about 1 ms of CPU per call and
urllib3's pool manager 0.7 ms; this path 0.35 ms (bench/bench_handler.py), and
these calls are most of a handler's time. Listing, which only the sweep and the
CLI do, stays with the storage client.

Transient failures (429, 5xx, a dropped connection) are tried again twice after
a short pause, then raised as TransientError so that Pub/Sub redelivers. A
retried write is safe: if the first try landed, the retry gets 412 and the
handler reloads a record that already holds its decision.
"""

from __future__ import annotations

import http.client
import json
import secrets
import threading
import time
import urllib.request
from typing import Any, NamedTuple
from urllib.parse import quote, urlsplit

import urllib3
from google.api_core import exceptions
from google.auth.credentials import Credentials
from google.auth.transport.urllib3 import Request
from google.cloud import storage
from google.cloud.storage.retry import DEFAULT_RETRY

from respawn.jobs import Job
from respawn.outlook import History
from respawn.ports import ConflictError, TransientError

_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_PAUSES_S = (0.1, 0.5)  # between the tries of one call
_TIMEOUT_S = 30.0  # to connect, and for each read
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


class _Reply(NamedTuple):
    status: int
    headers: http.client.HTTPMessage  # looked up case-insensitively
    data: bytes


def _text(reply: _Reply) -> str:
    return reply.data[:200].decode(errors="replace").strip()


def _multipart(name: str, record: bytes) -> tuple[bytes, str]:
    """The body and content type of a multipart upload (the object's metadata, then its bytes). A media upload
    would do on GCS, but fake-gcs-server honours ifGenerationMatch only on multipart uploads."""
    boundary = f"respawn-{secrets.token_hex(16)}"
    meta = json.dumps({"name": name, "contentType": "application/json"})
    head = f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{meta}\r\n"
    part = f"--{boundary}\r\nContent-Type: application/json\r\n\r\n"
    body = b"".join((head.encode(), part.encode(), record, f"\r\n--{boundary}--\r\n".encode()))
    return body, f"multipart/related; boundary={boundary}"


def function_client(project: str | None = None) -> storage.Client:
    """The storage client of the deployed functions: it does not read proxy settings from the environment.

    requests looks the proxy variables up on every call (a walk over os.environ);
    the functions reach GCS directly. The CLI keeps the default client, which
    honours HTTPS_PROXY (and so does the store's own transport, see _Connections).
    """
    client = storage.Client(project=project)
    client._http.trust_env = False
    return client


class _Connections:
    """Keep-alive connections to one endpoint, one per thread, each request signed by the credentials (which
    google-auth refreshes when they expire). Through the environment's proxy (a CONNECT tunnel) when `trust_env`
    and the endpoint is not exempt from it."""

    def __init__(self, endpoint: str, credentials: Credentials, trust_env: bool) -> None:
        url = urlsplit(endpoint)
        self._https = url.scheme == "https"
        self._host, self._port = url.hostname or "", url.port or (443 if self._https else 80)
        self._origin = f"{url.scheme}://{url.netloc}"
        proxy = urllib.request.getproxies().get(url.scheme) if trust_env else None
        self._proxy = urlsplit(proxy) if proxy and not urllib.request.proxy_bypass(self._host) else None
        self._credentials = credentials
        self._refresh = Request(urllib3.PoolManager(retries=False))  # type: ignore[no-untyped-call]  # a token refresh
        self._local = threading.local()

    def _open(self) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        if self._proxy is None:
            return kind(self._host, self._port, timeout=_TIMEOUT_S)
        connection = kind(self._proxy.hostname or "", self._proxy.port or 80, timeout=_TIMEOUT_S)
        connection.set_tunnel(self._host, self._port)
        return connection

    def request(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> _Reply:
        """One request on this thread's connection. When the server has closed a kept connection meanwhile, the
        request goes once more at once on a fresh one; any other failure raises (OSError, HTTPException)."""
        self._credentials.before_request(self._refresh, method, self._origin + path, headers)  # type: ignore[no-untyped-call]
        for last_try in (False, True):
            connection = getattr(self._local, "connection", None)
            kept = connection is not None
            connection = self._local.connection = connection or self._open()
            try:
                connection.request(method, path, body=body, headers=headers)
                response = connection.getresponse()
                return _Reply(response.status, response.headers, response.read())
            except (OSError, http.client.HTTPException) as e:
                connection.close()
                self._local.connection = None
                if last_try or not kept or not isinstance(e, ConnectionError):
                    raise
        raise AssertionError("unreachable: the last try returns or raises")


class _JsonObjects:
    """JSON objects of one bucket, read with their generation and written with ifGenerationMatch."""

    def __init__(self, bucket: str, client: storage.Client | None = None) -> None:
        self._client = client or storage.Client()
        self._bucket = self._client.bucket(bucket)
        self.bucket_name = bucket
        endpoint = self._client.api_endpoint.rstrip("/")
        prefix = urlsplit(endpoint).path.rstrip("/")
        self._objects = f"{prefix}/storage/v1/b/{quote(bucket, safe='')}/o/"
        self._uploads = f"{prefix}/upload/storage/v1/b/{quote(bucket, safe='')}/o"
        trust_env = bool(getattr(self._client._http, "trust_env", True))
        self._http = _Connections(endpoint, self._client._credentials, trust_env)

    def _call(self, what: str, method: str, path: str, body: bytes | None = None, content_type: str = "") -> _Reply:
        """One JSON API call, tried up to three times while the failure is transient."""
        for pause in (*_PAUSES_S, None):
            headers = {"Content-Type": content_type} if content_type else {}
            try:
                response = self._http.request(method, path, body, headers)
            except (OSError, http.client.HTTPException) as e:  # connection refused, reset, timed out
                problem = f"{type(e).__name__}: {e}"
            else:
                if response.status not in _TRANSIENT_STATUS:
                    return response
                problem = f"{response.status} {_text(response)}"
            if pause is not None:
                time.sleep(pause)
        raise TransientError(f"{what}: {problem}")

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

    def _write(self, name: str, value: Any, generation: int, conflict: str) -> int:
        """Write iff the object is still at `generation` (0: create); ConflictError saying `conflict` otherwise."""
        what = f"writing gs://{self.bucket_name}/{name}"
        data = json.dumps(value, separators=(",", ":")).encode()  # in the record's own field order
        url = f"{self._uploads}?uploadType=multipart&ifGenerationMatch={generation:d}"
        response = self._call(what, "POST", url, *_multipart(name, data))
        if response.status == 412:
            raise ConflictError(f"{conflict} is no longer at generation {generation}")
        if response.status != 200:
            raise StoreError(f"{what}: {response.status} {_text(response)}")
        return int(json.loads(response.data)["generation"])


class GcsJobStore(_JsonObjects):
    """JobStore on `gs://BUCKET/PREFIX/JOB_ID.json` (default prefix `respawn/jobs/`)."""

    def __init__(self, bucket: str, client: storage.Client | None = None, prefix: str = "respawn/jobs/") -> None:
        super().__init__(bucket, client)
        self._prefix = prefix if prefix.endswith("/") else prefix + "/"

    def _path(self, job_id: str) -> str:
        return f"{self._prefix}{job_id}.json"

    def load(self, job_id: str) -> tuple[Job | None, int]:
        record, generation = self._read(self._path(job_id))
        return (None, 0) if record is None else (Job.from_dict(record), generation)

    def save(self, job: Job, generation: int) -> int:
        return self._write(self._path(job.job_id), job.to_dict(), generation, f"{job.job_id}: the record")

    def list_ids(self) -> list[str]:
        try:
            blobs = self._client.list_blobs(self._bucket, prefix=self._prefix, retry=DEFAULT_RETRY)
            names = [b.name for b in blobs]
        except _TRANSIENT as e:
            raise TransientError(f"listing gs://{self.bucket_name}/{self._prefix}: {e}") from e
        return sorted(n[len(self._prefix) : -len(".json")] for n in names if n.endswith(".json"))


class GcsHistoryStore(_JsonObjects):
    """HistoryStore on `gs://BUCKET/placement/history.json`: one small object every decision that places a machine
    reads (through the service's cache) and every drain of observations rewrites under compare-and-set."""

    NAME = "placement/history.json"

    def load(self) -> tuple[History, int]:
        value, generation = self._read(self.NAME)
        return (History(), 0) if value is None else (History.from_json(value), generation)

    def save(self, history: History, generation: int) -> int:
        return self._write(self.NAME, history.to_json(), generation, "the preemption history")
