"""Preemption -> first step from the notice, split into a recovery's steps (localcloud/readout/recovery_split.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from localcloud.readout.recovery_split import PHASES, goodput_at, programs_written, recoveries, split, summary


def ev(t: float, kind: str, machine: str = "job-a2", **fields: Any) -> dict[str, Any]:
    return {"t": t, "kind": kind, "machine": machine, **fields}


def one_recovery(workers: int = 1, install: bool = True) -> list[dict[str, Any]]:
    """Attempt 1 on job-a1 trains, is noticed at t=100; attempt 2 on job-a2 takes every step."""
    events = [
        ev(0, "trainer_start", "job-a1", attempt=1),
        ev(50, "step", "job-a1", attempt=1, step=10),
        ev(100, "notice", "job-a1"),
        ev(101, "step", "job-a1", attempt=1, step=11),  # the old trainer's last step inside the notice
        ev(103, "preempted", "job-a1"),
        ev(104, "create_call"),
        ev(104.5, "state", state="CREATING"),
        ev(108, "state", state="READY"),
    ]
    for w in range(workers):
        tag = {"worker": w} if workers > 1 else {}
        events.append(ev(109 + w, "trainer_start", attempt=2, **tag))  # the last VM's script starts at 109 + n - 1
        if install:
            events.append(ev(111 + w, "machine_step", attempt=2, step="install", start=109 + w, **tag))
        events.append(ev(114 + w, "machine_step", attempt=2, step="pull", start=111 + w, **tag))
    return [*events, ev(120, "step", attempt=2, step=11)]


def test_the_steps_add_up_to_the_notice_to_the_first_step() -> None:
    row = split(one_recovery(), next(e for e in one_recovery() if e["kind"] == "notice"))
    assert row is not None
    assert (row["machine"], row["next"], row["first_step_s"]) == ("job-a1", "job-a2", 20.0)
    assert [row[k] for k in PHASES] == [4.0, 0.5, 3.5, 1.0, 2.0, 3.0, 6.0]
    assert sum(row[k] for k in PHASES) == pytest.approx(row["first_step_s"])
    # no training from the old trainer's last step (101, inside the notice) to the new one's first
    assert (row["gap_s"], row["after_notice_s"]) == (19.0, 1.0)


def test_a_machine_that_trains_on_through_a_longer_notice_leaves_a_shorter_gap() -> None:
    """The job's preemption_notice: the old trainer trains until the soft off while the next machine boots."""
    events = [*one_recovery(), ev(115, "step", "job-a1", attempt=1, step=25)]
    (row,) = recoveries(events)
    assert (row["first_step_s"], row["gap_s"], row["after_notice_s"]) == (20.0, 5.0, 15.0)
    # the gap, not the notice -> first step, is what an interruption costs
    assert goodput_at(3600, row["gap_s"], 12, 0, row["after_notice_s"]) > goodput_at(3600, 20.0, 12, 0)


def test_a_slice_step_ends_when_its_last_vm_has_done_it() -> None:
    (row,) = recoveries(one_recovery(workers=4))
    # scripts start at 109..112, installs end 111..114, pulls end 114..117
    assert (row["boot_s"], row["install_s"], row["pull_s"], row["start_s"]) == (4.0, 2.0, 3.0, 3.0)


def test_a_step_that_did_not_happen_lasts_nothing() -> None:
    (row,) = recoveries(one_recovery(install=False))
    assert row["install_s"] == 0.0 and row["pull_s"] == 5.0  # the pull runs from the script's start
    no_pull = [e for e in one_recovery(install=False) if e["kind"] != "machine_step"]
    (row,) = recoveries(no_pull)
    assert (row["install_s"], row["pull_s"], row["start_s"]) == (0.0, 0.0, 11.0)  # an image reused


def test_a_create_called_on_the_notice_itself_leaves_nothing_to_detect() -> None:
    """A head start: the next machine is asked for as the notice arrives."""
    events = [e if e["kind"] != "create_call" else {**e, "t": 100.0} for e in one_recovery()]
    (row,) = recoveries(events)
    assert row["detect_s"] == 0.0 and row["queue_s"] == 4.5
    assert row["first_step_s"] == 20.0


def test_a_notice_no_later_attempt_trained_after_is_no_recovery() -> None:
    events = [e for e in one_recovery() if not (e["kind"] == "step" and e["machine"] == "job-a2")]
    assert recoveries(events) == []


def test_the_summary_is_nearest_rank_percentiles() -> None:
    keys = ("first_step_s", *PHASES, "gap_s", "after_notice_s")
    rows = [{k: float(v) for k in keys} for v in (10, 30, 20)]
    s = summary(rows)
    assert (s["first_step_p50_s"], s["first_step_p95_s"]) == (20.0, 30.0)
    assert s["split_p50_s"] == dict.fromkeys(PHASES, 20.0)
    assert (s["gap_p50_s"], s["after_notice_p50_s"]) == (20.0, 20.0)
    assert summary([])["first_step_p50_s"] is None


def test_goodput_at_an_mtbi_counts_the_recovery_and_the_boot_inside_the_lifetime() -> None:
    # 8 h lifetime, 10 min recovery of which 6 min after READY, nothing lost
    g = goodput_at(8 * 3600, 600, 360, 0)
    assert g == pytest.approx((8 * 3600 - 360) / (8 * 3600 - 360 + 600), abs=1e-4)
    assert goodput_at(300, 600, 360, 0) == 0.0  # a machine that never trains
    assert goodput_at(3600, 60, 30, 30) == pytest.approx((3600 - 30 - 30) / (3600 - 30 + 60), abs=1e-4)


def test_programs_written_after_a_moment_are_the_ones_compiled_then(tmp_path: Path) -> None:
    for p in ("p0", "p1"):
        (tmp_path / "cpu-16x2" / "respawn-programs" / p).mkdir(parents=True)
    old, new = tmp_path / "cpu-16x2/respawn-programs/p0/a", tmp_path / "cpu-16x2/respawn-programs/p1/b"
    old.write_text("x")
    new.write_text("y")
    os.utime(old, (1000, 1000))
    os.utime(new, (3000, 3000))
    assert programs_written(tmp_path, 2000, 2) == {"p0": 0, "p1": 1}
    assert programs_written(tmp_path, 2000, 1) == {"p0": 0}  # a one-process run: another run's p1 is not its
    assert programs_written(tmp_path / "none", 0, 1) == {"p0": 0}
