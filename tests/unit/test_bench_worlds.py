"""bench_worlds' figure arithmetic on synthetic timelines: the worlds, the per-preemption rows, paid goodput."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

# bench/ is a folder of scripts, not an installed package: load the script by its path.
_SPEC = importlib.util.spec_from_file_location(
    "bench_worlds", Path(__file__).resolve().parents[2] / "bench" / "bench_worlds.py"
)
assert _SPEC is not None and _SPEC.loader is not None
bench_worlds = importlib.util.module_from_spec(_SPEC)
sys.modules["bench_worlds"] = bench_worlds
_SPEC.loader.exec_module(bench_worlds)


def ev(t: float, kind: str, machine: str | None = None, **fields: Any) -> dict[str, Any]:
    return {"t": t, "kind": kind, "machine": machine, **fields}


def started(t: float, machine: str, world: int, slice_: int, restored: int) -> dict[str, Any]:
    payload = {"event": "started", "world": world, "slice": slice_, "restored_step": restored}
    return ev(t, "entry", machine, payload=payload)


def steps(machines: list[str], first: int, last: int, t: float) -> list[dict[str, Any]]:
    """Steps first..last, one a second from t, each logged by every machine (as every member's lead does)."""
    return [ev(t + i, "step", m, step=s) for i, s in enumerate(range(first, last + 1)) for m in machines]


def opening() -> list[dict[str, Any]]:
    """Both policies' start: 2 slices train steps 1..11 as world 1, a1 is noticed at 12.5 and deleted at 13.5."""
    return [
        ev(0, "submitted"),
        ev(1, "state", "j-a1", state="READY"),
        ev(1, "state", "j-a2", state="READY"),
        started(2, "j-a1", 1, 0, 0),
        started(2, "j-a2", 1, 1, 0),
        *steps(["j-a1", "j-a2"], 1, 11, 3),
        ev(12.5, "notice", "j-a1"),
        ev(13.5, "deleted", "j-a1"),
    ]


def world_timeline() -> list[dict[str, Any]]:
    """2 slices: a1 noticed at 12.5 (the world stops after step 11, at 13), a2 trains alone from 11 (world 2, steps at
    16..18), a3 joins (world 3 from 14, steps at 21..26)."""
    return sorted(
        [
            *opening(),
            ev(14, "state", "j-a3", state="READY"),
            started(15, "j-a2", 2, 1, 11),
            *steps(["j-a2"], 12, 14, 16),
            started(20, "j-a2", 3, 1, 14),
            started(20, "j-a3", 3, 0, 14),
            *steps(["j-a2", "j-a3"], 15, 20, 21),
            ev(27, "deleted", "j-a2"),
            ev(27, "deleted", "j-a3"),
        ],
        key=lambda e: e["t"],
    )


def whole_timeline() -> list[dict[str, Any]]:
    """The same notice recovered whole: both machines deleted, two new ones (a3's noticed while it boots)."""
    return sorted(
        [
            *opening(),
            ev(13.5, "deleted", "j-a2"),
            ev(15, "state", "j-a3", state="READY"),
            ev(15, "state", "j-a4", state="READY"),
            ev(17, "notice", "j-a3"),
            ev(17.5, "deleted", "j-a3"),
            ev(18, "state", "j-a5", state="READY"),
            started(20, "j-a4", 3, 1, 11),
            started(20, "j-a5", 3, 0, 11),
            *steps(["j-a4", "j-a5"], 12, 20, 21),
            ev(30, "deleted", "j-a4"),
            ev(30, "deleted", "j-a5"),
        ],
        key=lambda e: e["t"],
    )


def test_the_worlds_come_from_the_started_entries_with_their_members_and_steps() -> None:
    events = world_timeline()
    worlds = bench_worlds.worlds_of(events)
    assert [(w.version, w.members, w.start, w.from_step) for w in worlds] == [
        (1, (0, 1), 2, 0),
        (2, (1,), 15, 11),
        (3, (0, 1), 20, 14),
    ]
    by_world = bench_worlds.steps_by_world(events, worlds)
    assert by_world[1][-1] == (11, 13) and by_world[2] == [(12, 16), (13, 17), (14, 18)]


def test_a_members_notice_gives_the_survivors_idle_time_the_join_stop_and_the_time_back_to_k() -> None:
    events = world_timeline()
    worlds = bench_worlds.worlds_of(events)
    (row,) = bench_worlds.preemption_rows(events, worlds, bench_worlds.steps_by_world(events, worlds), 2)
    assert row["stopped"] is True
    assert row["survivors_idle_s"] == 3  # the last step at 13 -> world 2's first at 16
    assert row["survivors_back_s"] == 3.5  # the notice at 12.5 -> 16
    assert row["join_idle_s"] == 3  # world 2's last step at 18 -> world 3's first at 21
    assert row["back_to_k_s"] == 8.5


def test_whole_job_recreation_has_no_join_and_a_notice_while_down_stops_no_one() -> None:
    events = whole_timeline()
    worlds = bench_worlds.worlds_of(events)
    first, booting = bench_worlds.preemption_rows(events, worlds, bench_worlds.steps_by_world(events, worlds), 2)
    assert (first["survivors_idle_s"], first["join_idle_s"], first["back_to_k_s"]) == (8, 0.0, 8.5)
    assert booting["stopped"] is False and booting["survivors_idle_s"] is None
    assert booting["back_to_k_s"] == 4  # a3's notice at 17 -> world 3's first step at 21


def test_goodput_is_productive_slice_seconds_over_paid_slice_seconds() -> None:
    events = world_timeline()
    worlds = bench_worlds.worlds_of(events)
    by_world = bench_worlds.steps_by_world(events, worlds)
    # world 1: 2 slices x (2..13), world 2: 1 x (15..18), world 3: 2 x (20..26)
    assert bench_worlds.productive_slice_s(worlds, by_world) == pytest.approx(22 + 3 + 12)
    # a1 READY 1..13.5 (deleted), a2 1..27, a3 14..27
    assert bench_worlds.paid_slice_s(events) == pytest.approx(12.5 + 26 + 13)
    # from the first step (3): world 1 counts from 3, each machine is paid from 3
    assert bench_worlds.productive_slice_s(worlds, by_world, since=3) == pytest.approx(20 + 3 + 12)
    assert bench_worlds.paid_slice_s(events, since=3) == pytest.approx(10.5 + 24 + 13)
    f = bench_worlds.run_figures({"status": "SUCCEEDED", "timings": {"scale": 1 / 60}}, events, 2)
    assert f["goodput"] == round(35 / 47.5, 4) and f["goodput_whole_run"] == round(37 / 51.5, 4)
    assert f["survivors_idle_p50_min"] == 3.0  # a local second reads as a real minute


def test_steps_past_the_next_worlds_restore_are_not_productive() -> None:
    """A world that trained past the step its successor restored (a crash between saves) lost those steps."""
    events = world_timeline()
    worlds = bench_worlds.worlds_of(events)
    by_world = bench_worlds.steps_by_world(events, worlds)
    earlier = [w if w.version != 2 else bench_worlds.World(2, w.members, w.start, 9, w.machines) for w in worlds]
    # world 1 is kept up to step 9 (at 11): 2 x (2..11)
    assert bench_worlds.productive_slice_s(earlier, by_world) == pytest.approx(18 + 3 + 12)


def test_the_ceiling_loses_only_the_replacements_paid_setup_until_they_said_ready() -> None:
    """a3, READY at 14, says `ready` at 19: 5 slice-seconds no re-form can save; a1 and a2 never said it."""
    events = sorted(
        [*world_timeline(), ev(19, "entry", "j-a3", payload={"event": "ready", "world": 2})], key=lambda e: e["t"]
    )
    assert bench_worlds.setup_slice_s(events) == 5
    assert bench_worlds.setup_slice_s(events, since=16) == 3  # paid from `since`, as paid_slice_s counts it
    f = bench_worlds.run_figures({"status": "SUCCEEDED", "timings": {"scale": 1 / 60}}, events, 2)
    assert f["goodput_ceiling"] == round(1 - 5 / 47.5, 4) and f["goodput"] < f["goodput_ceiling"]


def test_the_summary_sets_each_k_beside_whole_job_recreation() -> None:
    a = argparse.Namespace(profile="cloud", mtbi=120.0, seed=7, steps=800, quick=False)
    runs = {"world": {"goodput": 0.9, "goodput_ceiling": 0.93, "notices": 3}, "whole": {"goodput": 0.6, "notices": 4}}
    s = bench_worlds.summary({4: runs}, a, 10.0)
    assert s["goodput_ratio_4"] == 1.5 and s["mtbi_h_real"] == 2.0
    assert (s["goodput_ceiling_4"], s["goodput_ratio_ceiling_4"]) == (0.93, 1.55)
    assert (s["preemptions_4"], s["preemptions_whole_4"]) == (3, 4)
