"""The fleet benchmark (bench/bench_fleet.py) at a reduced scale: its invariants hold.

20 live jobs, 300 ended (the first sweep runs with 30 of them), 10 machines preempted within 5 s, every message
delivered twice, 30 ms per GCS call and one write per second per object (the strict reading: any second write within
a second is refused with 429; docs/operations.md, Sizing for a fleet), each function a pool of one-request instances.
Checked: no event lost (every message acknowledged on every subscription, every preempted job replaced), no object
written more than once a second over any 10 s, and a sweep reads as many records with 300 ended jobs as with 30.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from conftest import need

from localcloud.services.emulators import FakeGcs, PubSubEmulator

pytestmark = [pytest.mark.emulator, pytest.mark.slow]

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load_bench() -> object:
    """bench/ is a folder of scripts, not a package: bench_fleet imports load_test beside it."""
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_fleet", BENCH / "bench_fleet.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_fleet"] = module
    spec.loader.exec_module(module)
    return module


def test_a_small_fleet_loses_nothing_and_sweeps_only_live_jobs(tmp_path: Path) -> None:
    need(FakeGcs.missing())
    need(PubSubEmulator.missing())
    bench = load_bench()
    scale = ["--live", "20", "--ended", "300", "--wave", "10", "--wave-s", "5", "--complete", "5"]
    scale += ["--on-event-instances", "10", "--on-job-message-instances", "5"]  # lighter than Terraform's: 20 jobs
    args = bench.parser().parse_args(  # type: ignore[attr-defined]
        [*scale, "--phase-timeout", "45", "--give-up", "--workdir", str(tmp_path)]
    )
    f = bench.run(args, say=print)  # type: ignore[attr-defined]
    assert f["events_lost"] == 0, f
    assert f["wave"] == 10 and f["unrecovered"] == 0
    assert f["max_writes_per_s_one_object_10s"] <= 1.0, (f["hottest_object"], f)
    sweeps = f["sweeps"]
    assert f["sweep_reads_independent"] == 1, sweeps
    assert f["sweep_extra_reads"] <= 10, sweeps
