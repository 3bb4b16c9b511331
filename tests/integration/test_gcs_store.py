"""GcsJobStore against fake-gcs-server; what it writes is read back with the real google-cloud-storage client."""

from __future__ import annotations

import base64
import contextlib
import datetime
import http.server
import json
import re
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from respawn.adapters import gcs_store
from respawn.adapters.gcs_store import GcsHistoryStore, GcsJobStore, StoreError
from respawn.jobs import Attempt, Job, JobSpec, Status, TpuMachine
from respawn.outlook import History, Key, Observation
from respawn.ports import ConflictError, TransientError

pytestmark = [pytest.mark.emulator, pytest.mark.waits]


def make_job(job_id: str = "llm-1") -> Job:
    spec = JobSpec(
        job_id=job_id,
        machine=TpuMachine("v5litepod-8", "v2-alpha-tpuv5-lite"),
        zones=("us-central1-a", "us-west4-a"),
        image="us-docker.pkg.dev/p/r/trainer:1",
        checkpoint_uri=f"gs://ckpt/runs/{job_id}",
        args=("--steps=100", "--lr='1e-3; rm -rf /'"),
        env=(("KEY", "va lue"),),
        labels=(("team", "nlp"),),
    )
    attempt = Attempt(n=1, zone="us-central1-a", machine=f"{job_id}-a1", requested_at=100.0)
    return Job(
        job_id=job_id,
        spec=spec,
        status=Status.PROVISIONING,
        submitted_at=100.0,
        updated_at=100.0,
        attempts=(attempt,),
        pending=({"kind": "create", "job_id": job_id, "attempt": 1, "machine": f"{job_id}-a1", "zone": "z"},),
        pending_lease_until=160.0,
        seen_events=("m1",),
    )


def test_round_trip(bucket: str) -> None:
    store = GcsJobStore(bucket)
    assert store.load("llm-1") == (None, 0)
    job = make_job()
    gen = store.save(job, 0)
    assert gen > 0
    loaded, loaded_gen = store.load("llm-1")
    assert loaded == job
    assert loaded_gen == gen
    gen2 = store.save(replace(job, status=Status.RUNNING), gen)
    assert gen2 != gen
    assert store.load("llm-1") == (replace(job, status=Status.RUNNING), gen2)
    store.save(make_job("other-2"), 0)
    assert store.list_ids() == ["llm-1", "other-2"]


def test_record_is_readable_json_at_the_documented_path(bucket: str) -> None:
    GcsJobStore(bucket).save(make_job(), 0)
    blob = storage.Client().bucket(bucket).get_blob("respawn/jobs/llm-1.json")
    assert blob is not None
    assert blob.content_type == "application/json"
    record = json.loads(blob.download_as_text())
    assert record["status"] == "PROVISIONING" and record["spec"]["env"] == {"KEY": "va lue"}
    assert blob.generation == GcsJobStore(bucket).load("llm-1")[1]


def test_create_only_conflicts_when_the_record_exists(bucket: str) -> None:
    store = GcsJobStore(bucket)
    store.save(make_job(), 0)
    with pytest.raises(ConflictError):
        store.save(replace(make_job(), status=Status.REJECTED), 0)
    assert store.load("llm-1")[0] == make_job()


def test_stale_generation_conflicts(bucket: str) -> None:
    store = GcsJobStore(bucket)
    gen = store.save(make_job(), 0)
    store.save(replace(make_job(), status=Status.RUNNING), gen)
    with pytest.raises(ConflictError):
        store.save(replace(make_job(), status=Status.CANCELLED), gen)
    assert store.load("llm-1")[0].status == Status.RUNNING  # type: ignore[union-attr]


def test_list_ids_is_empty_for_an_empty_bucket(bucket: str) -> None:
    assert GcsJobStore(bucket).list_ids() == []


def test_the_history_is_one_object_beside_the_records_written_with_compare_and_set(bucket: str) -> None:
    store = GcsHistoryStore(bucket)
    assert store.load() == (History(), 0)
    key = Key("us-central1-a", "v6e-8", "spot")
    history = History().record([Observation("llm-1/1", key, 3600.0, 1, 100.0)])
    generation = store.save(history, 0)
    assert store.load() == (history, generation)
    with pytest.raises(ConflictError):
        store.save(History(), 0)  # another handler created it first
    later = history.record([Observation("llm-1/2", key, 60.0, 0, 200.0)])
    newer = store.save(later, generation)
    with pytest.raises(ConflictError):
        store.save(history, generation)  # a stale generation loses
    assert store.load() == (later, newer)
    blob = storage.Client().bucket(bucket).get_blob("placement/history.json")
    assert blob is not None and json.loads(blob.download_as_text())["seen"] == ["llm-1/1", "llm-1/2"]
    assert GcsJobStore(bucket).list_ids() == []  # not a record


def test_concurrent_writers_lose_no_update(bucket: str) -> None:
    """N threads do load-modify-CAS increments on one record: every successful write is counted once."""
    store = GcsJobStore(bucket)
    store.save(replace(make_job(), result={"count": 0}), 0)
    threads, increments = 6, 8
    successes: list[int] = []
    conflicts: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(threads)

    def worker() -> None:
        start.wait()
        done = 0
        while done < increments:
            job, gen = store.load("llm-1")
            assert job is not None
            try:
                store.save(replace(job, result={"count": job.result["count"] + 1}), gen)
            except ConflictError:
                with lock:
                    conflicts.append(1)
                continue
            done += 1
        with lock:
            successes.append(done)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    final, _ = store.load("llm-1")
    assert final is not None
    assert sum(successes) == threads * increments
    assert final.result["count"] == threads * increments
    assert conflicts, "the writers never raced; the test did not exercise compare-and-set"


def test_objects_are_listed_by_prefix_and_deleted(bucket: str) -> None:
    store = GcsJobStore(bucket)
    first = store.save(make_job("a-1"), 0)
    store.save(make_job("b-2"), 0)
    GcsHistoryStore(bucket).save(History(), 0)
    assert store._list("respawn/jobs/") == ["respawn/jobs/a-1.json", "respawn/jobs/b-2.json"]
    assert store._list("placement/") == ["placement/history.json"]
    store._delete("respawn/jobs/a-1.json", first)
    store._delete("respawn/jobs/a-1.json", first)  # gone already, as after a retried delete that had landed
    store._delete("respawn/jobs/b-2.json")
    assert store.list_ids() == []


class Scripted(http.server.BaseHTTPRequestHandler):
    """Answers each request with the next (status, body, headers) of the server's script; records the requests. With
    the server's `raw`, it sends those bytes instead and closes; with `stall`, it answers nothing for that long."""

    def _answer(self) -> None:
        server: Any = self.server
        length = int(self.headers.get("Content-Length") or 0)
        server.requests.append((self.command, self.path, self.rfile.read(length)))
        if server.stall:
            time.sleep(server.stall)
            return
        if server.raw is not None:
            self.wfile.write(server.raw)
            return
        status, body, headers = server.script.pop(0) if server.script else server.last
        self.send_response(status)
        for k, v in {"Content-Length": str(len(body)), **headers}.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, *args: Any) -> None:
        pass


class KeptAlive(Scripted):
    """HTTP/1.1: a connection stays open between requests, unless the server's `drop` says to close each one after
    its answer without a word (as a server's idle timeout does to a kept connection). With `chunked`, each body goes
    in two chunks and a trailer."""

    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        server: Any = self.server
        server.ports.append(self.client_address[1])  # before the answer, which lets the client go on
        if server.chunked:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status, body, headers = server.last
            self.send_response(status)
            for k, v in {"Transfer-Encoding": "chunked", **headers}.items():
                self.send_header(k, v)
            self.end_headers()
            half = len(body) // 2
            self.wfile.write(
                b"%x;ext=1\r\n%s\r\n%x\r\n%s\r\n0\r\nX-Trailer: 1\r\n\r\n"
                % (half, body[:half], len(body) - half, body[half:])
            )
        else:
            super()._answer()
        self.close_connection = server.drop

    do_GET = do_POST = do_DELETE = _answer


def serve(handler: type[Scripted], tls: ssl.SSLContext | None = None) -> tuple[Any, GcsJobStore]:
    server: Any = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    server.requests, server.script, server.last = [], [], (503, b"backend error", {})
    server.ports, server.drop, server.chunked, server.raw, server.stall = [], False, False, None, 0.0
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = storage.Client(
        project="p",
        credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
        client_options={
            "api_endpoint": f"https://localhost:{server.server_port}"
            if tls
            else f"http://127.0.0.1:{server.server_port}"
        },
    )
    return server, GcsJobStore("state", client)


@pytest.fixture
def scripted() -> Iterator[tuple[Any, GcsJobStore]]:
    server, store = serve(Scripted)
    yield server, store
    server.shutdown()


def test_one_connection_is_kept_and_one_the_server_closed_is_opened_again_at_once() -> None:
    server, store = serve(KeptAlive)
    server.last = (200, json.dumps(make_job().to_dict()).encode(), {"x-goog-generation": "7"})
    for _ in range(3):
        assert store.load("llm-1") == (make_job(), 7)
    assert len(server.requests) == 3 and len(set(server.ports)) == 1  # one connection for the three
    server.drop = True
    for _ in range(3):
        assert store.load("llm-1") == (make_job(), 7)
    assert len(server.requests) == 6 and len(set(server.ports)) == 3  # the 5th and 6th each on a fresh one
    server.shutdown()


class Tunnel(socketserver.ThreadingTCPServer):
    """A proxy that answers CONNECT and pipes the bytes both ways; it counts the tunnels it opened (and the target of
    any other request, which it does not serve) and keeps the head of each request."""

    daemon_threads = True
    tunnels: list[str]
    heads: list[bytes]

    def finish_request(self, request: Any, client_address: Any) -> None:
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            head += request.recv(1)
        target = head.split()[1].decode()
        self.tunnels.append(target)
        self.heads.append(head)
        host, port = target.rsplit(":", 1)
        upstream = socket.create_connection((host, int(port)))
        request.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")

        def pipe(src: socket.socket, dst: socket.socket) -> None:
            with contextlib.suppress(OSError):
                while data := src.recv(65536):
                    dst.sendall(data)
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

        threading.Thread(target=pipe, args=(upstream, request), daemon=True).start()
        pipe(request, upstream)


def tunnel(monkeypatch: Any, user: str = "") -> Tunnel:
    """A Tunnel that the environment names as the proxy of http and https URLs (as `user@`), with no exemptions."""
    proxy = Tunnel(("127.0.0.1", 0), socketserver.BaseRequestHandler)
    proxy.tunnels, proxy.heads = [], []
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    for variable in ("http_proxy", "https_proxy"):
        monkeypatch.setenv(variable, f"http://{user}{'@' if user else ''}127.0.0.1:{proxy.server_address[1]}")
    for variable in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(variable, raising=False)
    return proxy


def test_the_functions_client_goes_straight_past_the_environments_proxy(monkeypatch: Any) -> None:
    server, _ = serve(KeptAlive)
    proxy = tunnel(monkeypatch)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{server.server_port}")
    server.last = (200, json.dumps(make_job().to_dict()).encode(), {"x-goog-generation": "7"})
    assert GcsJobStore("state", gcs_store.function_client("p")).load("llm-1")[1] == 7
    assert proxy.tunnels == [] and len(server.requests) == 1
    proxy.shutdown()
    server.shutdown()


def self_signed(folder: Path, host: str) -> tuple[Path, Path]:
    """A certificate for `host` signed by its own key: (the certificate, the key), PEM files in `folder`."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_file, key_file


def test_over_tls_a_chunked_reply_is_read_whole_on_one_kept_connection_and_through_a_proxy_tunnel(
    monkeypatch: Any, tmp_path: Path
) -> None:
    cert, key = self_signed(tmp_path, "localhost")
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    server, store = serve(KeptAlive, tls)
    with pytest.raises(TransientError, match="CERTIFICATE_VERIFY_FAILED"):
        store.load("llm-1")
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # trusted as a CA of the system is, from the next connection
    server.chunked = True
    server.last = (200, json.dumps(make_job().to_dict()).encode(), {"x-goog-generation": "7"})
    server.ports.clear()
    for _ in range(3):
        assert store.load("llm-1") == (make_job(), 7)
    assert len(server.ports) == 3 and len(set(server.ports)) == 1

    proxy = tunnel(monkeypatch, user="ops:p%40ss")
    anonymous = AnonymousCredentials()  # type: ignore[no-untyped-call]
    options = {"api_endpoint": f"https://localhost:{server.server_port}"}
    proxied = GcsJobStore("state", storage.Client("p", anonymous, client_options=options))
    for _ in range(2):
        assert proxied.load("llm-1") == (make_job(), 7)
    assert proxy.tunnels == [f"localhost:{server.server_port}"]  # one tunnel, kept for both
    lines = proxy.heads[0].decode().split("\r\n")[1:]
    asked = {name.lower(): value for name, _, value in (line.partition(": ") for line in lines if line)}
    assert asked["proxy-authorization"] == "Basic " + base64.b64encode(b"ops:p@ss").decode()  # the URL's, unquoted
    proxy.shutdown()
    server.shutdown()


def test_a_passing_failure_is_tried_again(scripted: tuple[Any, GcsJobStore]) -> None:
    server, store = scripted
    body = json.dumps(make_job().to_dict()).encode()
    server.script = [(503, b"", {}), (429, b"", {}), (200, body, {"x-goog-generation": "7"})]
    started = time.monotonic()
    assert store.load("llm-1") == (make_job(), 7)
    assert time.monotonic() - started >= 3.0  # GCS's schedule: 1 s, then 2 s (a 429 sooner is refused again)
    assert [(m, p.split("?")[0]) for m, p, _ in server.requests] == [
        ("GET", "/storage/v1/b/state/o/respawn%2Fjobs%2Fllm-1.json")
    ] * 3


def test_a_lasting_failure_asks_for_redelivery(scripted: tuple[Any, GcsJobStore]) -> None:
    server, store = scripted
    with pytest.raises(TransientError, match=r"writing gs://state/respawn/jobs/llm-1.json: 503 backend error"):
        store.save(make_job(), 3)
    assert len(server.requests) == 3
    method, path, body = server.requests[0]
    assert method == "POST" and "ifGenerationMatch=3" in path
    meta, record = body.split(b"\r\n\r\n")[1:3]
    assert json.loads(meta.split(b"\r\n")[0]) == {"name": "respawn/jobs/llm-1.json", "contentType": "application/json"}
    assert json.loads(record.rsplit(b"\r\n--", 1)[0]) == make_job().to_dict()


def test_a_lost_precondition_is_a_conflict_at_once(scripted: tuple[Any, GcsJobStore]) -> None:
    server, store = scripted
    server.last = (412, b'{"error": {"code": 412}}', {})
    with pytest.raises(ConflictError, match="llm-1: the record is no longer at generation 3"):
        store.save(make_job(), 3)
    with pytest.raises(ConflictError):  # fake-gcs-server deletes whatever the precondition: GCS answers 412
        store._delete("respawn/jobs/llm-1.json", 3)
    assert [(m, "ifGenerationMatch=3" in p) for m, p, _ in server.requests] == [("POST", True), ("DELETE", True)]


@pytest.mark.parametrize(
    "raw",
    [
        b"",  # closed without a word
        b"SSH-2.0-OpenSSH\r\n\r\n",  # not HTTP
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",  # cut short
    ],
)
def test_a_malformed_or_cut_reply_is_tried_again_then_asks_for_redelivery(
    scripted: tuple[Any, GcsJobStore], raw: bytes
) -> None:
    server, store = scripted
    server.raw = raw
    with pytest.raises(TransientError, match=re.escape("reading gs://state/respawn/jobs/llm-1.json: ")):
        store.load("llm-1")
    assert len(server.requests) == 3


def test_a_reply_that_does_not_come_in_time_is_tried_again_then_asks_for_redelivery(
    scripted: tuple[Any, GcsJobStore], monkeypatch: Any
) -> None:
    server, store = scripted
    monkeypatch.setattr(gcs_store, "_TIMEOUT_S", 0.2)
    server.stall = 1.0
    with pytest.raises(TransientError, match="Read timed out"):
        store.load("llm-1")
    assert len(server.requests) == 3


def test_an_unreachable_store_asks_for_redelivery() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    client = storage.Client(
        project="p",
        credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
        client_options={"api_endpoint": f"http://127.0.0.1:{port}"},
    )
    with pytest.raises(TransientError, match=re.escape("reading gs://state/respawn/jobs/x.json: ")):
        GcsJobStore("state", client).load("x")


def test_a_refusal_is_an_error_that_names_the_object(scripted: tuple[Any, GcsJobStore]) -> None:
    server, store = scripted
    server.last = (403, b'{"error": {"message": "the caller lacks storage.objects.create"}}', {})
    with pytest.raises(StoreError, match=r"writing gs://state/respawn/jobs/llm-1.json: 403 .*storage.objects.create"):
        store.save(make_job(), 0)
    assert len(server.requests) == 1  # not tried again
