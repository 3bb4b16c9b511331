"""GcpAdvisor (respawn/adapters/advice.py) with the real compute_v1.AdviceClient against the local Advice API: the
figures it reads, what it never asks, its cache, and every way the API can fail, each an Advice whose note says why."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from localcloud.apis.cloudapi import CloudApiServer
from respawn.adapters.advice import TPU_NOTE, GcpAdvisor, accelerators, advise_regions, is_tpu
from respawn.jobs import GpuMachine, TpuMachine
from respawn.outlook import ZoneAdvice

PROJECT, REGION = "proj", "us-central1"
A, B = "us-central1-a", "us-central1-b"
GPU = "a2-highgpu-1g"


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def server() -> Iterator[CloudApiServer]:
    with CloudApiServer(advice_seed=3, advice_mtbi_s={A: 7200.0}) as s:
        yield s


def advice_requests(server: CloudApiServer) -> list[str]:
    return [r.rpartition("/")[2] for r in server.requests if "/advice/" in r]


def test_spot_gpu_advice_per_zone_with_the_newest_price(server: CloudApiServer) -> None:
    clock = Clock()
    advice = GcpAdvisor(server.url, clock=clock).advise(PROJECT, REGION, GPU, "spot", [A, B])
    price = server.advice.price_per_hour(REGION, GPU)
    assert advice.note is None
    assert advice.fetched_at == clock.t
    assert advice.zones == {
        A: ZoneAdvice(7200.0, server.advice.obtainability(A, GPU), price),
        B: ZoneAdvice(server.advice.uptime_s(B, GPU), server.advice.obtainability(B, GPU), price),
    }
    assert advice_requests(server) == ["capacity", "capacity", "capacityHistory"]


def test_preemptible_is_advised_as_spot(server: CloudApiServer) -> None:
    advice = GcpAdvisor(server.url).advise(PROJECT, REGION, GPU, "preemptible", [A])
    assert advice.zones[A].estimated_uptime_s == 7200.0


@pytest.mark.parametrize("machine_type", ["v6e-8", "v5litepod-16", "ct6e-standard-8t", "tpu7x-standard-4t"])
def test_tpus_are_never_asked(server: CloudApiServer, machine_type: str) -> None:
    advice = GcpAdvisor(server.url).advise(PROJECT, REGION, machine_type, "spot", [A])
    assert (advice.zones, advice.note) == ({}, TPU_NOTE)
    assert advice_requests(server) == []


def test_is_tpu() -> None:
    assert is_tpu("v5p-8") and is_tpu("ct5p-hightpu-4t")
    assert not is_tpu("a3-highgpu-8g") and not is_tpu("n1-standard-8") and not is_tpu("g2-standard-4")


@pytest.mark.parametrize("provisioning", ["standard", "flex-start", "reservation"])
def test_other_provisioning_models_are_not_asked(server: CloudApiServer, provisioning: str) -> None:
    advice = GcpAdvisor(server.url).advise(PROJECT, REGION, GPU, provisioning, [A])
    assert advice.zones == {}
    assert advice.note == f"Advice API advises Spot VMs only; {provisioning}: history only"
    assert advice_requests(server) == []


def test_n1_with_gpus_gets_capacity_advice_but_no_price(server: CloudApiServer) -> None:
    server.recording = True
    advice = GcpAdvisor(server.url).advise(
        PROJECT, REGION, "n1-standard-8", "spot", [A], accelerators=[("nvidia-tesla-t4", 2)]
    )
    assert advice.zones[A] == ZoneAdvice(7200.0, server.advice.obtainability(A, "n1-standard-8"), None)
    assert advice.note == "Advice API has no price history for N1 machine types with GPUs; list prices used"
    (exchange,) = server.exchanges
    selection = exchange.body["instanceFlexibilityPolicy"]["instanceSelections"]["respawn"]
    assert selection["guestAccelerators"] == [{"acceleratorType": "nvidia-tesla-t4", "acceleratorCount": 2}]


def test_zones_outside_the_region_are_not_asked(server: CloudApiServer) -> None:
    advice = GcpAdvisor(server.url).advise(PROJECT, REGION, GPU, "spot", [A, "europe-west4-a"])
    assert advice.zones == {}
    assert advice.note == "Advice API not asked: europe-west4-a not in region us-central1"
    assert advice_requests(server) == []


@pytest.mark.parametrize(
    ("code", "status", "says"),
    [
        (403, "PERMISSION_DENIED", "permission denied (Required 'compute.advice.capacity' permission"),
        (404, "NOT_FOUND", "not found ("),
        (400, "INVALID_ARGUMENT", "request refused ("),
        (503, "UNAVAILABLE", "unavailable ("),
        (429, "RESOURCE_EXHAUSTED", "unavailable ("),
    ],
)
def test_a_failed_capacity_call_is_an_advice_without_zones(
    server: CloudApiServer, code: int, status: str, says: str
) -> None:
    message = "Required 'compute.advice.capacity' permission for 'projects/proj'" if code == 403 else "no"
    server.fail_next("advice", code=code, status=status, message=message, collection="capacity")
    advice = GcpAdvisor(server.url).advise(PROJECT, REGION, GPU, "spot", [A, B])
    assert advice.zones == {}
    assert advice.note is not None
    assert advice.note.startswith(f"Advice API unavailable: {says}"), advice.note
    assert advice.note.endswith("; history only")
    if code == 403:
        assert "compute.advice.capacityHistory (roles/compute.viewer holds both)" in advice.note


def test_a_failed_price_history_keeps_the_zones_at_list_prices(server: CloudApiServer) -> None:
    server.fail_next("advice", code=503, status="UNAVAILABLE", message="try later", collection="capacityHistory")
    advice = GcpAdvisor(server.url).advise(PROJECT, REGION, GPU, "spot", [A])
    assert advice.zones == {A: ZoneAdvice(7200.0, server.advice.obtainability(A, GPU), None)}
    assert advice.note is not None
    assert advice.note.startswith("Advice API price history unavailable: unavailable (try later")
    assert advice.note.endswith("; list prices used")


def test_answers_are_cached_an_hour_failures_ten_minutes(server: CloudApiServer) -> None:
    clock = Clock()
    advisor = GcpAdvisor(server.url, clock=clock)
    first = advisor.advise(PROJECT, REGION, GPU, "spot", [A])
    clock.t += 3599
    assert advisor.advise(PROJECT, REGION, GPU, "spot", [A]) is first
    assert len(advice_requests(server)) == 2
    clock.t += 2
    assert advisor.advise(PROJECT, REGION, GPU, "spot", [A]) is not first
    assert len(advice_requests(server)) == 4

    server.fail_next("advice", code=403, status="PERMISSION_DENIED", message="denied", collection="capacity")
    failed = advisor.advise(PROJECT, REGION, GPU, "spot", [B])
    assert failed.zones == {}
    clock.t += 599
    assert advisor.advise(PROJECT, REGION, GPU, "spot", [B]) is failed
    clock.t += 2
    assert advisor.advise(PROJECT, REGION, GPU, "spot", [B]).zones.keys() == {B}


@pytest.fixture
def silent_server() -> Iterator[str]:
    """An HTTP server that takes each request and answers only after two seconds."""

    class Slow(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            time.sleep(2)
            self.send_response(503)
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_no_answer_within_the_deadline(silent_server: str) -> None:
    started = time.monotonic()
    advice = GcpAdvisor(silent_server, deadline_s=0.3).advise(PROJECT, REGION, GPU, "spot", [A, B])
    assert time.monotonic() - started < 1.5
    assert (advice.zones, advice.note) == ({}, "Advice API unavailable: no answer within 0.3s; history only")


def test_an_unreachable_endpoint() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again before the call: nothing listens there
    advice = GcpAdvisor(f"http://127.0.0.1:{port}").advise(PROJECT, REGION, GPU, "spot", [A])
    assert advice.zones == {}
    assert advice.note is not None and advice.note.startswith("Advice API unavailable: unreachable (")


def test_zones_of_several_regions_are_asked_region_by_region(server: CloudApiServer) -> None:
    advice = advise_regions(GcpAdvisor(server.url), PROJECT, GPU, "spot", [A, "us-west1-b", B])
    assert advice.note is None
    assert advice.zones.keys() == {A, B, "us-west1-b"}
    assert advice.zones["us-west1-b"].price_per_hour == server.advice.price_per_hour("us-west1", GPU)
    assert [r.split("/regions/")[1] for r in server.requests] == [
        "us-central1/advice/capacity",
        "us-central1/advice/capacity",
        "us-central1/advice/capacityHistory",
        "us-west1/advice/capacity",
        "us-west1/advice/capacityHistory",
    ]


def test_prices_are_used_for_every_zone_or_none(server: CloudApiServer) -> None:
    server.fail_next("advice", code=503, status="UNAVAILABLE", message="later", collection="capacityHistory")
    advice = advise_regions(GcpAdvisor(server.url), PROJECT, GPU, "spot", [A, "us-west1-b"])
    assert {z.price_per_hour for z in advice.zones.values()} == {None}
    assert advice.zones[A].estimated_uptime_s == 7200.0
    assert advice.note is not None
    assert advice.note.endswith("; Advice API prices not used: none for us-central1-a; list prices used")


def test_accelerators_are_named_for_n1_only() -> None:
    assert accelerators(GpuMachine("n1-standard-8", "nvidia-tesla-t4", 2)) == (("nvidia-tesla-t4", 2),)
    assert accelerators(GpuMachine("a2-highgpu-1g", "nvidia-tesla-a100", 1)) == ()
    assert accelerators(TpuMachine("v6e-8")) == ()
