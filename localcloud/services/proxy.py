"""HTTP reverse proxies of the local cloud's fleet mode (bench/bench_fleet.py): GCS as it behaves under a fleet's
load, and a record of every Pub/Sub push to the functions.

`GcsProxy` stands in front of fake-gcs-server. Each call waits a chosen latency first (GCS answers in tens of
milliseconds, fake-gcs-server on loopback in about one), and a write to an object that was written less than a second
before is answered 429 without reaching the server: Cloud Storage allows about one write per second to one object
name ("Maximum rate of writes to the same object name: one write per second",
https://cloud.google.com/storage/quotas; https://cloud.google.com/storage/docs/request-rate; a 429 is retried with
backoff, https://cloud.google.com/storage/docs/gcs429). A write that the server does not carry out (412 on a
compare-and-set, 404) does not count. Every call is kept (`calls`): its kind (read, write, list, other), object,
status and time. The functions reach it through STORAGE_EMULATOR_HOST, as any storage client finds an emulator.

`PushRecorder` stands between the Pub/Sub emulator's push subscriptions and a function: every push, its message id,
subscription, answer and times (`pushes`), which the emulator does not show.

Both are aiohttp servers forwarding with aiohttp's client on one event loop in a thread of their own, so HTTP
(keep-alive, chunked bodies) is the maintained library's, and a call waiting out its latency holds no thread.
"""

from __future__ import annotations

import asyncio
import base64
import email.parser
import email.policy
import json
import threading
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

import aiohttp
from aiohttp import web
from yarl import URL

T = TypeVar("T")
# Not forwarded either way: per connection (RFC 9110 section 7.6.1), or set again for the new message.
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "host"}
    | {"content-length"}
)
WRITE_WINDOW_S = 1.0
RATE_LIMITED = {  # GCS's JSON error for a write over the object's rate (https://cloud.google.com/storage/docs/gcs429)
    "error": {
        "code": 429,
        "message": "The object exceeded the rate limit for object mutation operations (create, update, and delete).",
        "errors": [{"domain": "usageLimits", "reason": "rateLimitExceeded"}],
    }
}


class Proxy:
    """A reverse proxy to `upstream` on 127.0.0.1 (a free port): `handle` answers each request, by default forwarded
    as it came (path and query byte for byte, the body, the headers but the hop-by-hop ones)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="proxy", daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def start(self) -> Proxy:
        self._thread.start()
        self._run(self._start())
        return self

    async def _start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=None, connect=10)  # a push waits for its function however long it takes
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=False, skip_auto_headers=["Accept"]
        )
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._serve)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def stop(self) -> None:
        if self._thread.is_alive():
            self._run(self._stop())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        self._loop.close()

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def __enter__(self) -> Proxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        return await self.handle(request, body)

    async def handle(self, request: web.Request, body: bytes) -> web.StreamResponse:
        return await self.forward(request, body)

    async def forward(self, request: web.Request, body: bytes) -> web.Response:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        url = URL(self.upstream + request.raw_path, encoded=True)
        async with self._session.request(
            request.method, url, data=body or None, headers=headers, allow_redirects=False
        ) as reply:
            data = await reply.read()
            kept = [(k, v) for k, v in reply.headers.items() if k.lower() not in HOP_BY_HOP]
        return web.Response(status=reply.status, body=data, headers=kept)


@dataclass(frozen=True)
class Call:
    """One storage call through GcsProxy: `kind` read | write | list | other; `name` the object ("" for a list or a
    bucket call); `status` the answer (429: refused by the write rate); `t` when it arrived, `took` until answered."""

    t: float
    method: str
    kind: str
    bucket: str
    name: str
    status: int
    took: float


def classify(method: str, raw_path: str, content_type: str, body: bytes) -> tuple[str, str, str]:
    """(kind, bucket, object name) of a GCS JSON API call: objects read, written (uploads, updates, deletes, the
    destination of a copy, rewrite or compose) or listed."""
    url = urlsplit(raw_path)
    parts = [unquote(p) for p in url.path.split("/")]
    query = parse_qs(url.query)
    if parts[1:3] == ["upload", "storage"] and len(parts) >= 7 and parts[4] == "b" and parts[6] == "o":
        return "write", parts[5], (query.get("name") or [upload_name(content_type, body)])[0]
    if parts[1:2] == ["download"]:
        parts = parts[1:]
    if parts[1:4] != ["storage", "v1", "b"] or len(parts) < 6 or parts[5] != "o":
        return "other", parts[4] if len(parts) > 4 else "", ""
    bucket = parts[4]
    if len(parts) == 6 or (len(parts) == 7 and parts[6] == ""):
        return ("list" if method == "GET" else "other"), bucket, ""
    for verb in ("rewriteTo", "copyTo"):  # .../o/SRC/rewriteTo/b/DEST_BUCKET/o/DEST
        if verb in parts[7:]:
            i = parts.index(verb, 7)
            return "write", parts[i + 2], "/".join(parts[i + 4 :])
    if parts[-1] == "compose":
        return "write", bucket, "/".join(parts[6:-1])
    return ("read" if method == "GET" else "write"), bucket, "/".join(parts[6:])


def upload_name(content_type: str, body: bytes) -> str:
    """The object name in a multipart upload's first part (its metadata); "" when there is none."""
    if not content_type.startswith("multipart/"):
        return ""
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body
    )
    for part in message.iter_parts():  # type: ignore[attr-defined]
        payload = part.get_payload(decode=True)
        try:
            return str(json.loads(payload).get("name", "")) if isinstance(payload, bytes) else ""
        except (ValueError, AttributeError):
            return ""
    return ""


class GcsProxy(Proxy):
    """fake-gcs-server as GCS answers a fleet (module docstring): `latency_s` per call; writes to one object at one
    per `write_window_s` (0: no limit), a token bucket of `burst` writes (1: never two within the window). Each may
    be changed while it runs; `calls()` holds every call so far."""

    def __init__(
        self, upstream: str, latency_s: float = 0.0, write_window_s: float = WRITE_WINDOW_S, burst: int = 1
    ) -> None:
        super().__init__(upstream)
        self.latency_s = latency_s
        self.write_window_s = write_window_s
        self.burst = burst
        self._calls: list[Call] = []
        self._tokens: dict[tuple[str, str], tuple[float, float]] = {}  # (bucket, name) -> (writes left, as of when)

    def _take(self, key: tuple[str, str], now: float) -> bool:
        """Whether a write to `key` may go now (a token taken)."""
        left, since = self._tokens.get(key, (float(self.burst), now))
        left = min(float(self.burst), left + (now - since) / self.write_window_s)
        if left < 1:
            return False
        self._tokens[key] = (left - 1, now)
        return True

    def _give_back(self, key: tuple[str, str]) -> None:
        """A write that changed nothing (412, 404) costs no token."""
        left, since = self._tokens[key]
        self._tokens[key] = (min(float(self.burst), left + 1), since)

    def env(self) -> dict[str, str]:
        return {"STORAGE_EMULATOR_HOST": self.url}

    def calls(self) -> list[Call]:
        return list(self._calls)

    async def handle(self, request: web.Request, body: bytes) -> web.StreamResponse:
        t = time.time()
        kind, bucket, name = classify(request.method, request.raw_path, request.headers.get("Content-Type", ""), body)
        if self.latency_s > 0:
            await asyncio.sleep(self.latency_s)
        key, limited = (bucket, name), kind == "write" and bool(name) and self.write_window_s > 0
        if limited and not self._take(key, time.time()):  # taken before forwarding: a write meanwhile is refused
            self._calls.append(Call(t, request.method, kind, bucket, name, 429, time.time() - t))
            return web.json_response(RATE_LIMITED, status=429)
        reply = await self.forward(request, body)
        if limited and not 200 <= reply.status < 300:
            self._give_back(key)
        self._calls.append(Call(t, request.method, kind, bucket, name, reply.status, time.time() - t))
        return reply


@dataclass(frozen=True)
class Push:
    """One push of a Pub/Sub message to a function: `sent` when it reached the proxy, `done` when answered."""

    path: str
    message_id: str
    subscription: str
    data: bytes  # the message's data, decoded
    sent: float
    done: float
    status: int  # 0: the function closed the connection without an answer (a worker killed at its timeout)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


class PushRecorder(Proxy):
    """Forwards the emulator's pushes to a function and keeps each (`pushes()`)."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self._pushes: list[Push] = []

    def pushes(self) -> list[Push]:
        return list(self._pushes)

    async def handle(self, request: web.Request, body: bytes) -> web.StreamResponse:
        sent = time.time()
        try:
            envelope = json.loads(body)
            message: Mapping[str, Any] = envelope.get("message") or {}
            subscription = str(envelope.get("subscription", ""))
        except ValueError:
            message, subscription = {}, ""
        message_id = str(message.get("messageId") or message.get("message_id") or "")
        data = base64.b64decode(str(message.get("data") or ""))
        try:
            reply: web.StreamResponse = await self.forward(request, body)
            status = reply.status
        except aiohttp.ClientError:
            reply, status = web.Response(status=502), 0
        self._pushes.append(Push(request.path, message_id, subscription, data, sent, time.time(), status))
        return reply
