"""A local Cloud TPU v2 + Compute Engine REST server: the subset respawn's providers call, and the Advice API.

The real google-cloud-tpu and google-cloud-compute clients talk to it with ``transport="rest"``, anonymous
credentials and ``api_endpoint=server.url``. Each API is served by its own module, as the real adapters are split:
tpu_api.py (nodes, queued resources), compute/ (instances, templates, resource policies, MIGs, resize
requests) and advice_api.py (the Advice API's capacity and capacityHistory, seeded figures per zone); apicore.py
holds what they share (errors, faults, the call log, capacity, callbacks). This module is the HTTP server and the
hooks the local cloud and tests drive it with: preempt, set_state, fail_next, the call and request logs, machines()
and leftovers().

Errors use the Google JSON error format of each API, so the client libraries raise the matching exceptions.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from localcloud.apis.advice_api import AdviceApi
from localcloud.apis.apicore import (
    GPU,
    TPU,
    ApiError,
    ApiPart,
    Call,
    CloudCore,
    CloudMachine,
    CoreKnobs,
    Fault,
    Hook,
    MachineCall,
)
from localcloud.apis.compute.api import ComputeApi
from localcloud.apis.compute.migs import BULK_MODELS
from localcloud.apis.project_api import ProjectApi
from localcloud.apis.tpu_api import QueuedResource, TpuApi

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "GPU",
    "TPU",
    "ApiError",
    "Call",
    "CloudApiServer",
    "CloudMachine",
    "Exchange",
    "Fault",
    "MachineCall",
    "QueuedResource",
]


@dataclass(frozen=True)
class Exchange:
    """One HTTP request and the reply the local APIs sent, as JSON: what a test holds to Google's definitions."""

    method: str
    path: str
    query: dict[str, str]
    body: Any  # {} without a body; the text itself when it is not JSON
    status: int
    response: Any


class CloudApiServer(CloudCore):
    """Thread-safe local TPU v2 + Compute REST server with hooks for the local cloud and tests.

    Knobs (see CloudCore): `capacity`, `stockouts`, `spot_stockouts`, `queue_waits`, `spot_queue_waits`,
    `create_delay_s`; for MIGs (see ComputeApi) `bulk_models`, `bulk_stockout`, `resize_requests`, where Google's
    pages leave the rule open, so that respawn can be tested against either reading. Callbacks
    `on_ready(machine)` / `on_deleted(machine)` / `on_metadata(machine)` run in order on one worker thread, never
    while the server holds its lock. `record=True` keeps every request and reply (`exchanges`). The Advice API
    answers from `advice_seed` and `advice_mtbi_s` (zone -> seconds: that zone's estimated uptime; see
    advice_api.py).
    """

    def __init__(
        self,
        port: int = 0,
        *,
        bulk_models: frozenset[str] | None = BULK_MODELS,
        bulk_stockout: str = "wait",
        resize_requests: bool = True,
        record: bool = False,
        advice_seed: int = 0,
        advice_mtbi_s: dict[str, float] | None = None,
        **knobs: Unpack[CoreKnobs],
    ) -> None:
        super().__init__(**knobs)
        self.tpu = TpuApi(self)
        self.compute = ComputeApi(
            self, bulk_models=bulk_models, bulk_stockout=bulk_stockout, resize_requests=resize_requests
        )
        self.advice = AdviceApi(self, seed=advice_seed, mtbi_s=advice_mtbi_s)
        # The project around a deployment (`respawn doctor`'s APIs: project_api.py), none until one is set.
        self.project = ProjectApi()
        # project and advice first: they serve paths under /v2/ and /compute/ that tpu and compute would take
        self.apis: list[ApiPart] = [self.project, self.tpu, self.advice, self.compute]
        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), _handler_class(self))
        self._httpd.daemon_threads = True
        self._threads: list[threading.Thread] = []
        self.recording = record
        self._exchanges: list[Exchange] = []

    # ----------------------------------------------------------------- lifecycle
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> CloudApiServer:
        for target in (lambda: self._httpd.serve_forever(poll_interval=0.05), self.run_callbacks):
            t = threading.Thread(target=target, name="cloudapi", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        if self._threads:  # shutdown() waits for serve_forever, which only runs after start()
            self._httpd.shutdown()
            self.stop_callbacks()
        self._httpd.server_close()
        for t in self._threads:
            t.join(timeout=5)
        self._threads.clear()

    def __enter__(self) -> CloudApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----------------------------------------------------------------- hooks
    @property
    def calls(self) -> list[Call]:
        with self.lock:
            return list(self._calls)

    @property
    def requests(self) -> list[str]:
        """Every request as "METHOD /path" (query string left off), in arrival order."""
        with self.lock:
            return list(self._requests)

    @property
    def exchanges(self) -> list[Exchange]:
        """Every request and its reply, in the order the replies went out (only with record=True)."""
        with self.lock:
            return list(self._exchanges)

    def machines(self) -> list[CloudMachine]:
        """Every machine the APIs hold: TPU nodes, Compute instances, MIG slices (one machine each)."""
        with self.lock:
            return [m for api in self.apis for m in api.machines()]

    def queued_resources(self) -> list[QueuedResource]:
        with self.lock:
            return self.tpu.queued_resources()

    def machine(self, name: str) -> CloudMachine | None:
        with self.lock:
            return next((m for api in self.apis if (m := api.machine(name)) is not None), None)

    def waiting(self) -> list[tuple[str, str]]:
        """(machine name, zone) of each Compute Engine machine now waiting for capacity in its zone's queue: a
        flex-start instance, a MIG whose BULK creation or resize request waits. (TPU queued resources: see
        queued_resources().)"""
        with self.lock:
            return self.compute.waiting()

    def leftovers(self) -> list[str]:
        """Every object still in the local APIs, as its resource path: nodes, queued resources, instances (a MIG's
        VMs too), MIGs, resize requests, instance templates, resource policies."""
        with self.lock:
            return [path for api in self.apis for path in api.leftovers()]

    def preempt(self, name: str, worker: int | None = None) -> CloudMachine | None:
        """Preempt machine `name` (every VM of it, or worker `worker` only): a TPU node -> PREEMPTED (its queued
        resource SUSPENDED); an instance -> TERMINATED, or deleted when it asked for instanceTerminationAction
        DELETE. Returns the machine, None when there is none."""
        with self.lock:
            return next((m for api in self.apis if (m := api.preempt(name, worker)) is not None), None)

    def set_state(self, name: str, state: str, worker: int | None = None) -> CloudMachine | None:
        """Set the API state string (TPU `state` / Compute `status`) of machine `name` (of worker `worker` only,
        where the API has one per VM). None when there is no such machine."""
        with self.lock:
            return next((m for api in self.apis if (m := api.set_state(name, state, worker)) is not None), None)

    def connect(self, *, on_ready: Hook | None, on_deleted: Hook | None, on_metadata: Hook | None = None) -> None:
        """Set the machine hooks once whoever runs the machines exists: the local cloud's nodes call this API back
        (preempt, set_state), so they are built after it. `on_metadata(machine)`: a TPU node's or an instance's
        metadata was written (nodes.patch, instances.setMetadata; `machine` is the node, or the instance itself, a
        MIG's VM too)."""
        with self.lock:
            self.on_ready, self.on_deleted, self.on_metadata = on_ready, on_deleted, on_metadata

    def fail_next(
        self,
        verb: str,
        *,
        code: int,
        status: str,
        message: str,
        kind: str | None = None,
        in_operation: bool = False,
        reason: str | None = None,
        collection: str | None = None,
    ) -> None:
        """Fail the next `verb` (create | delete | get | list) call with this error; `kind` ("tpu" | "gpu") and
        `collection` (nodes, queuedResources, instances, ...) narrow which call.

        in_operation=True (create only): the call succeeds and its operation ends with the error, as capacity and
        (on Compute) quota failures do for real. `reason` is the Compute error reason / operation error code (e.g.
        QUOTA_EXCEEDED); it defaults from `code`.
        """
        with self.lock:
            self._faults.append(Fault(verb, kind, code, status, message, in_operation, reason, collection))

    def _find(self, name: str) -> CloudMachine | None:
        """The stored machine itself (not a copy): tests change what the API holds through it, under `lock`."""
        return next((m for api in self.apis if (m := api.stored(name)) is not None), None)

    def _api(self, path: str) -> ApiPart:
        return next((api for api in self.apis if api.owns(path)), self.compute)


def _handler_class(server: CloudApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # header and body go out in two writes: no 40 ms delayed-ACK stall

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self._dispatch("GET")

        def do_POST(self) -> None:
            self._dispatch("POST")

        def do_DELETE(self) -> None:
            self._dispatch("DELETE")

        def do_PATCH(self) -> None:
            self._dispatch("PATCH")

        def do_PUT(self) -> None:
            self._dispatch("PUT")

        def _dispatch(self, method: str) -> None:
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            api = server._api(url.path)
            with server.lock:
                server._requests.append(f"{method} {url.path}")
            try:
                body = json.loads(raw) if raw else {}
                if not isinstance(body, dict):
                    raise ValueError("the request body is not a JSON object")
                reply = api.route(method, url.path, query, body)
                if reply is None:
                    raise ApiError(404, "NOT_FOUND", f"{method} {url.path} is not part of the local cloud API")
                status, payload = HTTPStatus.OK, reply
            except ApiError as e:
                status, payload = HTTPStatus(e.code), api.error_json(e)
            except (ValueError, KeyError, TypeError) as e:
                err = ApiError(400, "INVALID_ARGUMENT", f"Invalid request: {e}", "invalid")
                status, payload = HTTPStatus.BAD_REQUEST, api.error_json(err)
            data = json.dumps(payload).encode()
            if server.recording:
                exchange = Exchange(method, url.path, query, _json_or_text(raw), int(status), json.loads(data))
                with server.lock:
                    server._exchanges.append(exchange)
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up waiting (e.g. operations.wait)
                self.close_connection = True

    return Handler


def _json_or_text(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else {}
    except ValueError:
        return raw.decode(errors="replace")
