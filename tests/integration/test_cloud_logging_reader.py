"""CloudLoggingReader: the real google-cloud-logging client (HTTP transport) against a small local entries.list."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import logging as cloud_logging

from respawn.adapters.cloud_logging import PAGE_SIZE, CloudLoggingReader
from respawn_ops.joblogs import entry_line, job_filter, since_filter

DATA = Path(__file__).resolve().parents[1] / "data"
NAMES = ["logentry_trainer_started.json", "logentry_container_line.json", "logentry_trainer_completed.json"]


class EntriesList(ThreadingHTTPServer):
    """POST /v2/entries:list answering with `pages` (one per call, chained by nextPageToken); keeps every request."""

    def __init__(self, pages: list[list[dict[str, Any]]]) -> None:
        self.pages = pages
        self.requests: list[tuple[str, dict[str, Any]]] = []
        super().__init__(("127.0.0.1", 0), Handler)


class Handler(BaseHTTPRequestHandler):
    server: EntriesList

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append((self.path.partition("?")[0], body))
        page = int(body.get("pageToken") or 0)
        answer: dict[str, Any] = {"entries": self.server.pages[page]}
        if page + 1 < len(self.server.pages):
            answer["nextPageToken"] = str(page + 1)
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture
def server() -> Iterator[EntriesList]:
    entries = [json.loads((DATA / name).read_text()) for name in NAMES]
    srv = EntriesList([entries[:2], entries[2:]])
    thread = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_the_reader_sends_our_query_and_reads_every_page(server: EntriesList) -> None:
    client = cloud_logging.Client(
        project="ml-research-4821",
        credentials=AnonymousCredentials(),
        _use_grpc=False,
        client_options={"api_endpoint": f"http://127.0.0.1:{server.server_address[1]}"},
    )
    query = since_filter(job_filter("ml-research-4821", "llm-small-001"), 1741944000.0)

    got = list(CloudLoggingReader("ml-research-4821", client).entries(query))

    assert [path for path, _ in server.requests] == ["/v2/entries:list"] * 2
    first, second = (body for _, body in server.requests)
    assert first == {"resourceNames": ["projects/ml-research-4821"], "filter": query, "orderBy": "timestamp asc",
                     "pageSize": PAGE_SIZE}  # fmt: skip
    assert second == {**first, "pageToken": "1"}
    assert [e["insertId"] for e in got] == ["1c8xk2vf3n9q0a", "1x3kge4f3if91a", "1c8xk2vf3nb1z4"]
    lines = [entry_line(e) for e in got]  # what the client hands back reads as the API's JSON did
    assert [line.render(workers=True)[:60] if line else None for line in lines] == [
        '[a3 w0] started {"restored_step": 1200, "startup_s": 41.7, "step": 1200}'[:60],
        "[a3 w1] 09:41:13 trainer INFO step 1401/20000 loss 2.4817 3.1 steps/s"[:60],
        '[a3 w0] completed {"final_loss": 2.1432, "goodput": {"checkpo'[:60],
    ]
    assert got[2]["timestamp"].startswith("2025-03-14T10:26:11.590273")
