"""bench_recovery's figures from the notice: the split, the real minutes, goodput at an MTBI, the head start check."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from localcloud.machines.profiles import CLOUD_SCALE
from respawn.spec import SpecError, parse_job_message

# bench/ is a folder of scripts, not an installed package: load the script by its path.
_SPEC = importlib.util.spec_from_file_location(
    "bench_recovery", Path(__file__).resolve().parents[2] / "bench" / "bench_recovery.py"
)
assert _SPEC is not None and _SPEC.loader is not None
bench_recovery = importlib.util.module_from_spec(_SPEC)
sys.modules["bench_recovery"] = bench_recovery
_SPEC.loader.exec_module(bench_recovery)


def ev(t: float, kind: str, machine: str, **fields: Any) -> dict[str, Any]:
    return {"t": t, "kind": kind, "machine": machine, **fields}


EVENTS = [
    ev(0, "trainer_start", "j-a1", attempt=1),
    ev(5, "step", "j-a1", attempt=1, step=1),
    ev(100, "notice", "j-a1"),
    ev(100.5, "step", "j-a1", attempt=1, step=2),  # its last step, inside the notice
    ev(101, "create_call", "j-a2"),
    ev(101, "state", "j-a2", state="CREATING"),
    ev(104, "state", "j-a2", state="READY"),
    ev(105, "trainer_start", "j-a2", attempt=2),
    ev(107, "machine_step", "j-a2", attempt=2, step="pull", start=105.5),
    ev(110, "step", "j-a2", attempt=2, step=2),
]
REPORT = {
    "timings": {"profile": "cloud", "scale": CLOUD_SCALE},
    "goodput_s": {"productive_s": 99.0, "checkpoint_s": 1.0, "wasted_s": 0.0},
    "preemptions": 1,
}


def test_the_recovery_from_the_notice_in_local_seconds_and_real_minutes(tmp_path: Path) -> None:
    f = bench_recovery.from_the_notice(REPORT, EVENTS, str(tmp_path), 8.0)
    assert (f["profile"], f["notice_first_step_p50_s"]) == ("cloud", 10.0)
    assert f["notice_split_p50_s"] == {
        "detect_s": 1.0,
        "queue_s": 0.0,
        "create_s": 3.0,
        "boot_s": 1.0,
        "install_s": 0.0,
        "pull_s": 2.0,
        "start_s": 3.0,
    }
    assert f["real_min"]["notice_first_step_p50"] == 10.0  # at 1/60 a local second is a real minute
    # 8 h at 1/60 is 480 local s; 6 s of it after READY before the first step; 0.5 s trained after the notice,
    # then 9.5 s without training
    assert (f["gap_p50_s"], f["after_notice_p50_s"]) == (9.5, 0.5)
    assert f["goodput_at_mtbi"] == pytest.approx((480 - 6 + 0.5) / (480 - 6 + 0.5 + 9.5), abs=1e-4)
    assert f["programs_compiled_on_restart"] == {"p0": 0}  # no cache in tmp_path: nothing compiled


def test_the_table_shows_every_step_and_the_goodput(tmp_path: Path) -> None:
    f = bench_recovery.from_the_notice(REPORT, EVENTS, str(tmp_path), 8.0)
    text = bench_recovery.notice_table({"tpu": f})
    assert "profile cloud (1 local s = 1 real min)" in text
    for step in ("detect", "queue", "create", "boot", "install", "pull", "start", "notice -> first step"):
        assert step in text
    assert "goodput at MTBI 8 h (480s)" in text and "10.00s / 10.0m" in text


def test_with_both_runs_side_by_side_the_table_says_what_the_head_start_saved(tmp_path: Path) -> None:
    """`--head-start both`: a column per run, and per API how much sooner the first step came, against the TPU's
    10 s notice window (at 1/60: 0.17 local s)."""
    off = bench_recovery.from_the_notice(REPORT, EVENTS, str(tmp_path), 8.0)
    on = {**off, "notice_first_step_p50_s": off["notice_first_step_p50_s"] - 2.5}
    text = bench_recovery.notice_table({"tpu": off, "tpu head start": on})
    assert "tpu head start" in text.splitlines()[2]
    assert text.splitlines()[-1] == (
        "head start (tpu): the first step 2.50s / 2.5m sooner, 15.0 x the notice window (0.17s / 10 real s)"
    )
    assert "head start" not in bench_recovery.notice_table({"tpu": off})


def test_a_head_start_is_refused_while_the_job_message_has_no_such_option() -> None:
    job = bench_recovery.job_of(1, "tpu")
    try:
        parse_job_message({**job, "head_start": True})
    except SpecError:
        known = False
    else:
        known = True
    problem = bench_recovery.head_start_option(job)
    assert (problem is None) is known
    assert known or "head_start" in str(problem)
