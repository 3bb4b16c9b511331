"""GcsJobStore: job records as JSON objects in GCS, written only with compare-and-set; GcsHistoryStore: the
deployment's preemption history (respawn.outlook.History), one object in the same bucket, written the same way.

Every write carries `ifGenerationMatch` (0 = create only), so two handlers
that loaded the same generation cannot both win: the loser gets ConflictError,
reloads and re-decides.

The two calls of every event (read a record, write it) go straight to the GCS
JSON API on a keep-alive connection per thread (`_Connections`: HTTP/1.1 on a
socket, signed with the storage client's credentials, to its endpoint). The
requests stack under `Blob.upload_from_string` costs about 1 ms of CPU per
call, urllib3's pool manager 0.7 ms, http.client 0.46 ms; this path 0.2 ms
(2,000 writes of a 3 KB record), and these calls are most of a handler's time.
Listing, which only the sweep and the CLI do, stays with the storage client.

Transient failures (429, 5xx, a dropped connection) are tried again twice after
a short pause, then raised as TransientError so that Pub/Sub redelivers. A
retried write is safe: if the first try landed, the retry gets 412 and the
handler reloads a record that already holds its decision.
"""

from __future__ import annotations

import http.client
import io
import json
import secrets
import socket
import ssl
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
_MAX_LINE = 65536  # the longest status or header line read
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
    headers: dict[str, str]  # names in lower case
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
    """Keep-alive HTTP/1.1 connections to one endpoint, one per thread, each request signed by the credentials (which
    google-auth refreshes when they expire). Through the environment's proxy (a CONNECT tunnel) when `trust_env`
    and the endpoint is not exempt from it.

    A request is one write (head and body together, TCP_NODELAY) and its reply is read by `_reply`: a status line,
    headers, and a body by Content-Length, chunked, or to the end of the connection. http.client sent the head and
    the body in two writes and parsed the headers as e-mail: 0.46 ms of CPU per write against 0.2 ms, and the
    handler's 750 events/s against 1,070 (bench/bench_handler.py)."""

    def __init__(self, endpoint: str, credentials: Credentials, trust_env: bool) -> None:
        url = urlsplit(endpoint)
        https = url.scheme == "https"
        self._host, self._port = url.hostname or "", url.port or (443 if https else 80)
        self._origin = f"{url.scheme}://{url.netloc}"
        self._host_header = url.netloc.rsplit("@", 1)[-1].encode("ascii")
        proxy = urllib.request.getproxies().get(url.scheme) if trust_env else None
        self._proxy = urlsplit(proxy) if proxy and not urllib.request.proxy_bypass(self._host) else None
        self._tls: ssl.SSLContext | None = None
        if https:
            self._tls = ssl.create_default_context()
            self._tls.set_alpn_protocols(["http/1.1"])
        self._credentials = credentials
        self._refresh = Request(urllib3.PoolManager(retries=False))  # type: ignore[no-untyped-call]  # a token refresh
        self._local = threading.local()

    def _open(self) -> tuple[socket.socket, io.BufferedReader]:
        if self._proxy is None:
            sock = socket.create_connection((self._host, self._port), timeout=_TIMEOUT_S)
        else:
            sock = socket.create_connection((self._proxy.hostname or "", self._proxy.port or 80), _TIMEOUT_S)
        try:
            if self._proxy is not None:
                _tunnel(sock, f"[{self._host}]:{self._port}" if ":" in self._host else f"{self._host}:{self._port}")
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=self._host)
        except OSError:  # a refused tunnel, a failed handshake
            sock.close()
            raise
        return sock, sock.makefile("rb")

    def request(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> _Reply:
        """One request on this thread's connection. When the server has closed a kept connection meanwhile, the
        request goes once more at once on a fresh one; any other failure raises (OSError, HTTPException)."""
        self._credentials.before_request(self._refresh, method, self._origin + path, headers)  # type: ignore[no-untyped-call]
        body = body or b""
        head = [f"{method} {path} HTTP/1.1".encode(), b"Host: " + self._host_header, b"Accept-Encoding: identity"]
        head += [f"{name}: {value}".encode("latin-1") for name, value in headers.items()]
        if body or method in ("POST", "PUT", "PATCH"):
            head.append(b"Content-Length: %d" % len(body))
        message = b"\r\n".join((*head, b"", body))
        for last_try in (False, True):
            connection = getattr(self._local, "connection", None)
            kept = connection is not None
            sock, reader = self._local.connection = connection or self._open()
            try:
                sock.sendall(message)
                reply, keep = _reply(reader, method)
            except (OSError, http.client.HTTPException) as e:
                self._close()
                if last_try or not kept or not isinstance(e, ConnectionError):
                    raise
            else:
                if not keep:
                    self._close()
                return reply
        raise AssertionError("unreachable: the last try returns or raises")

    def _close(self) -> None:
        sock, reader = self._local.connection
        self._local.connection = None
        reader.close()  # the socket's file descriptor is released with its last reader
        sock.close()


def _tunnel(sock: socket.socket, target: str) -> None:
    """Ask the proxy on `sock` for a tunnel to `target` (HOST:PORT); OSError unless it answers 2xx."""
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    answer = b""
    while not answer.endswith(b"\r\n\r\n"):  # byte by byte: nothing of the tunnel may be read here
        byte = sock.recv(1)
        if not byte:
            raise ConnectionError(f"the proxy closed the connection before answering CONNECT {target}")
        answer += byte
    status = answer.split(b" ", 2)[1] if answer.startswith(b"HTTP/") else b""
    if not status.startswith(b"2"):
        raise OSError(f"the proxy refused CONNECT {target}: {answer.splitlines()[0].decode(errors='replace')}")


def _line(reader: io.BufferedReader) -> bytes:
    line = reader.readline(_MAX_LINE + 1)
    if len(line) > _MAX_LINE:
        raise http.client.LineTooLong("header line")
    return line


def _reply(reader: io.BufferedReader, method: str) -> tuple[_Reply, bool]:
    """Read one reply: (the reply, whether the connection may be kept). ConnectionError when the server closed the
    connection before a status line (a kept connection it timed out), HTTPException when the reply is malformed."""
    while True:
        status_line = _line(reader)
        if not status_line:
            raise ConnectionError("the server closed the connection")
        version, _, rest = status_line.partition(b" ")
        code = rest[:3]
        if not version.startswith(b"HTTP/1.") or not code.isdigit():
            raise http.client.BadStatusLine(status_line.decode(errors="replace"))
        headers: dict[str, str] = {}
        while (line := _line(reader)) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        status = int(code)
        if not 100 <= status < 200:
            break  # 1xx: an interim answer, the reply follows
    keep = version == b"HTTP/1.1" and headers.get("connection", "").lower() != "close"
    if method == "HEAD" or status in (204, 304):
        return _Reply(status, headers, b""), keep
    if "chunked" in headers.get("transfer-encoding", "").lower():
        chunks = []
        while size := _number(_line(reader).split(b";", 1)[0], 16):
            chunks.append(_exactly(reader, size + 2)[:-2])
        while _line(reader) not in (b"\r\n", b"\n", b""):  # trailers
            pass
        return _Reply(status, headers, b"".join(chunks)), keep
    if "content-length" in headers:
        return _Reply(status, headers, _exactly(reader, _number(headers["content-length"].encode(), 10))), keep
    return _Reply(status, headers, reader.read()), False  # to the end of the connection


def _number(text: bytes, base: int) -> int:
    try:
        return int(text, base)
    except ValueError:
        raise http.client.HTTPException(f"a malformed length in the reply: {text[:40]!r}") from None


def _exactly(reader: io.BufferedReader, n: int) -> bytes:
    data = reader.read(n)
    if len(data) != n:
        raise http.client.IncompleteRead(data, n - len(data))
    return data


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
