"""bench_fleet's arithmetic: the busiest object's write rate, a phase's costs, Terraform's limits as it reads them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from localcloud.services.proxy import Call, Push

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))  # bench_fleet imports load_test beside it
_SPEC = importlib.util.spec_from_file_location("bench_fleet", BENCH / "bench_fleet.py")
assert _SPEC is not None and _SPEC.loader is not None
bench_fleet = importlib.util.module_from_spec(_SPEC)
sys.modules["bench_fleet"] = bench_fleet
_SPEC.loader.exec_module(bench_fleet)


def write(t: float, name: str, status: int = 200) -> Call:
    return Call(t, "POST", "write", "b", name, status, 0.03)


def test_the_busiest_object_counts_refused_writes_too() -> None:
    calls = [write(0.0, "h"), write(0.2, "h", 429), write(0.5, "h", 429), write(3.0, "h"), write(0.1, "r")]
    calls.append(Call(0.3, "GET", "read", "b", "h", 200, 0.03))
    assert bench_fleet.busiest(calls, 1.0) == (3.0, "h")
    assert bench_fleet.busiest(calls, 10.0) == (0.4, "h")
    assert bench_fleet.busiest([], 10.0) == (0.0, "")


def test_a_phase_counts_redeliveries_per_subscription() -> None:
    pushes = [
        Push("/p", "m1", "s0", b"", 0, 1, 500),
        Push("/p", "m1", "s0", b"", 11, 12, 204),  # redelivered after its 500
        Push("/p", "m1", "s1", b"", 0, 1, 204),  # the other subscription's copy: not a redelivery
    ]
    calls = [write(0.0, "a"), write(0.1, "a", 429), Call(0.2, "GET", "list", "b", "", 200, 0.03)]
    phase = bench_fleet.Phase("wave", 12.0, [("t", "m1")], calls, pushes, True)
    costs = bench_fleet.costs(phase)
    assert (costs["pushes"], costs["redeliveries"], costs["writes"], costs["writes_429"]) == (3, 1, 2, 1)
    assert costs["per_message"] == {"read": 0.0, "write": 2.0, "list": 1.0}
    assert bench_fleet.acked(pushes) == {"m1": 2}


def test_terraform_limits_are_read_from_the_configuration() -> None:
    limits = bench_fleet.terraform_defaults()
    assert limits["ack_deadline_seconds"] == min(600, limits["function_timeout_seconds"] + 30)
    assert limits["minimum_backoff"] < limits["maximum_backoff"]
    assert limits["on_event_max_instances"] >= 1 and limits["on_job_message_max_instances"] >= 1
