"""The in-process push bus (the local cloud's fallback without the Pub/Sub emulator) against a real HTTP endpoint."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from localcloud.services.bus import InProcessBus, push_endpoint
from respawn import parsing


class Endpoint:
    """Answers 503 to the first `failures` pushes, 204 afterwards; records every push body and path."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.bodies: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with endpoint.lock:
                    endpoint.bodies.append((self.path, body))
                    fail = len(endpoint.bodies) <= endpoint.failures
                self.send_response(503 if fail else 204)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, n: int, timeout: float = 20.0) -> list[tuple[str, dict[str, Any]]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.bodies) >= n:
                    return list(self.bodies)
            time.sleep(0.02)
        raise AssertionError(f"{len(self.bodies)} pushes arrived, expected {n}")


@pytest.fixture
def endpoint(request: pytest.FixtureRequest) -> Iterator[Endpoint]:
    e = Endpoint(failures=getattr(request, "param", 0))
    yield e
    e.server.shutdown()


@pytest.mark.parametrize("endpoint", [2], indirect=True)
def test_a_failed_push_is_redelivered_until_acknowledged(endpoint: Endpoint) -> None:
    bus = InProcessBus("proj", {"respawn-events": push_endpoint(endpoint.url, "proj", "respawn-events")})
    try:
        message_id = bus.publish("respawn-events", b'{"kind": "sweep_tick"}', {"a": "b"})
        pushes = endpoint.wait_for(3)
        time.sleep(0.5)  # acknowledged: no further delivery
        assert len(endpoint.bodies) == 3
    finally:
        bus.close()
    for path, body in pushes:
        assert path == "/projects/proj/topics/respawn-events"
        assert body["subscription"] == "projects/proj/subscriptions/respawn-events-push-0"
        assert base64.b64decode(body["message"]["data"]) == b'{"kind": "sweep_tick"}'
        assert body["message"]["attributes"] == {"a": "b"}
        msg = parsing.message_from_push(body)
        assert msg.message_id == message_id
        assert parsing.events_event(msg).__class__.__name__ == "SweepTicked"


def test_duplicate_deliveries_carry_the_same_message_id(endpoint: Endpoint) -> None:
    bus = InProcessBus("proj", {"respawn-jobs": push_endpoint(endpoint.url, "proj", "respawn-jobs")}, copies=3)
    try:
        bus.publish("respawn-jobs", b"{}")
        pushes = endpoint.wait_for(3)
    finally:
        bus.close()
    assert len({body["message"]["messageId"] for _, body in pushes}) == 1
    assert len({body["subscription"] for _, body in pushes}) == 3
