"""GcsJobStore: job records as JSON objects in GCS, written only with compare-and-set; GcsHistoryStore: the
deployment's preemption history (respawn.outlook.History), one object in the same bucket, written the same way.

Every write carries `ifGenerationMatch` (0 = create only), so two handlers
that loaded the same generation cannot both win: the loser gets ConflictError,
reloads and re-decides.

The two calls of every event (read a record, write it) go straight to the GCS
JSON API over google-auth's urllib3 transport, with the storage client's
credentials and endpoint: the requests stack under `Blob.upload_from_string`
costs about 1 ms of CPU per call, 2.5 times this path (bench/bench_handler.py),
and those calls are nearly all of a handler's time. Listing, which only the
sweep and the CLI do, stays with the storage client.

Transient failures (429, 5xx, a dropped connection) are tried again twice after
a short pause, then raised as TransientError so that Pub/Sub redelivers. A
retried write is safe: if the first try landed, the retry gets 412 and the
handler reloads a record that already holds its decision.
"""

from __future__ import annotations

import json
import secrets
import time
import urllib.request
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import urllib3
from google.api_core import exceptions
from google.auth.transport.urllib3 import AuthorizedHttp
from google.cloud import storage
from google.cloud.storage.retry import DEFAULT_RETRY

from respawn.jobs import Job
from respawn.outlook import History
from respawn.ports import ConflictError, TransientError

_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_PAUSES_S = (0.1, 0.5)  # between the tries of one call
_TIMEOUT = urllib3.Timeout(connect=10.0, read=30.0)
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
    honours HTTPS_PROXY (and so does the store's own transport, see _pool).
    """
    client = storage.Client(project=project)
    client._http.trust_env = False
    return client


def _pool(endpoint: str, trust_env: bool) -> urllib3.PoolManager:
    """A connection pool to the endpoint, through the environment's proxy when the client honours it."""
    host = urlsplit(endpoint).hostname or ""
    proxy = urllib.request.getproxies().get(urlsplit(endpoint).scheme) if trust_env else None
    if proxy and not urllib.request.proxy_bypass(host):
        return urllib3.ProxyManager(proxy, maxsize=16, retries=False, timeout=_TIMEOUT)
    return urllib3.PoolManager(maxsize=16, retries=False, timeout=_TIMEOUT)


class _JsonObjects:
    """JSON objects of one bucket, read with their generation and written with ifGenerationMatch."""

    def __init__(self, bucket: str, client: storage.Client | None = None) -> None:
        self._client = client or storage.Client()
        self._bucket = self._client.bucket(bucket)
        self.bucket_name = bucket
        endpoint = self._client.api_endpoint.rstrip("/")
        self._objects = f"{endpoint}/storage/v1/b/{quote(bucket, safe='')}/o/"
        self._uploads = f"{endpoint}/upload/storage/v1/b/{quote(bucket, safe='')}/o"
        trust_env = bool(getattr(self._client._http, "trust_env", True))
        self._http = AuthorizedHttp(self._client._credentials, http=_pool(endpoint, trust_env))  # type: ignore[no-untyped-call]

    def _call(
        self, what: str, method: str, url: str, body: bytes | None = None, content_type: str = ""
    ) -> urllib3.BaseHTTPResponse:
        """One JSON API call, tried up to three times while the failure is transient."""
        headers = {"Content-Type": content_type} if content_type else {}
        for pause in (*_PAUSES_S, None):
            try:
                response = self._http.request(method, url, body=body, headers=headers)
            except urllib3.exceptions.HTTPError as e:  # connection refused, reset, timed out
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
        data = json.dumps(value, separators=(",", ":"), sort_keys=True).encode()
        query = urlencode({"uploadType": "multipart", "ifGenerationMatch": str(generation)})
        response = self._call(what, "POST", f"{self._uploads}?{query}", *_multipart(name, data))
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
