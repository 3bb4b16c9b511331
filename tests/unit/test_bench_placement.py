"""bench_placement: on two synthetic zones, respawn's placement learns the long-lived one and beats list order."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from respawn.actions import CreateMachine

# bench/ is a folder of scripts, not an installed package: load the script by its path.
_SPEC = importlib.util.spec_from_file_location(
    "bench_placement", Path(__file__).resolve().parents[2] / "bench" / "bench_placement.py"
)
assert _SPEC is not None and _SPEC.loader is not None
bench_placement = importlib.util.module_from_spec(_SPEC)
sys.modules["bench_placement"] = bench_placement  # dataclasses look their module up by name
_SPEC.loader.exec_module(bench_placement)
Trace, main, simulate = bench_placement.Trace, bench_placement.main, bench_placement.simulate


def write(folder: Path, zone: str, period: int, ticks: int = 12_000) -> None:
    """10 s ticks: up for period - 1 ticks, then down for one (a replacement 30 s later finds it up again)."""
    data = [0 if i % period == period - 1 else 1 for i in range(ticks)]
    (folder / f"{zone}_synthetic.json").write_text(json.dumps({"metadata": {"gap_seconds": 10}, "data": data}))


@pytest.fixture
def zones(tmp_path: Path) -> Path:
    write(tmp_path, "zone-flaky", period=48)  # interrupts every 8 minutes, listed first
    write(tmp_path, "zone-steady", period=3000)  # every 500 minutes
    return tmp_path


def test_respawn_puts_most_machine_time_in_the_long_lived_zone_and_beats_list_order(zones: Path) -> None:
    traces = {t.zone: t for t in (Trace.load(p) for p in sorted(zones.glob("*.json")))}
    assert list(traces) == ["zone-flaky", "zone-steady"]
    respawn = simulate(traces, "respawn", jobs=4, days=2, seed=1, price_per_h=1.0)
    ordered = simulate(traces, "ordered", jobs=4, days=2, seed=1, price_per_h=1.0)
    hours = respawn.machine_hours_by_zone
    assert hours["zone-steady"] > 0.9 * sum(hours.values())
    assert respawn.goodput > ordered.goodput + 0.05
    assert respawn.cost_per_productive_hour < ordered.cost_per_productive_hour
    assert respawn.recoveries < ordered.recoveries


def test_the_last_line_is_the_json_of_every_policy(zones: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--traces", str(zones), "--jobs", "2", "--days", "1"]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(last["policies"]) == {"respawn", "ordered", "skip-preempted", "respawn-zones-only"}
    for figures in last["policies"].values():
        assert {"goodput", "cost_per_productive_hour", "recoveries"} <= set(figures)


def test_respawn_trainers_save_at_their_zones_interval_and_the_others_at_the_default() -> None:
    """Young/Daly: sqrt(2 x 30 s x MTBI); a handed MTBI of 2 h gives 657 s, none the trainer's default 3600 s: 465 s."""
    assert bench_placement.checkpoint_interval_s(7200.0) == pytest.approx(657.27, abs=0.01)
    assert bench_placement.checkpoint_interval_s(None) == pytest.approx(464.76, abs=0.01)
    assert bench_placement.kept_training_s(1000.0, False, 465.0) == 930.0  # two saved intervals; the last 10 s lost
    assert bench_placement.kept_training_s(1000.0, True, 465.0) == 940.0  # the end keeps all but the saves' time


def test_a_trace_tells_when_its_zone_next_goes_down() -> None:
    t = Trace("z", 10.0, (1, 1, 0, 1), (2, 2, 2, 6))
    assert t.up(5) and not t.up(25)
    assert t.down_at(0) == 20 and t.down_at(35) == 60  # looped: the next 0 is the next cycle's third tick


def test_placement_is_decides_own_through_an_outlook_that_learns(zones: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """respawn hands decide() an Outlook whose history grows from the observations decide leaves, and each machine it
    asks for carries decide's placement reason; the baselines hand none."""
    traces = {t.zone: t for t in (Trace.load(p) for p in sorted(zones.glob("*.json")))}
    outlooks: dict[str, list[Any]] = {"respawn": [], "ordered": []}
    reasons: dict[str, list[str]] = {"respawn": [], "ordered": []}
    real = bench_placement.decide

    for policy in outlooks:

        def spy(job: Any, event: Any, now: float, knobs: Any, *, outlook: Any = None, seen: str = policy) -> Any:
            outlooks[seen].append(outlook)
            new, actions = real(job, event, now, knobs, outlook=outlook)
            reasons[seen] += [new.current.zone_reason for a in actions if isinstance(a, CreateMachine)]
            return new, actions

        monkeypatch.setattr(bench_placement, "decide", spy)
        simulate(traces, policy, jobs=1, days=1, seed=1, price_per_h=1.0)
    assert set(outlooks["ordered"]) == {None} and set(reasons["ordered"]) == {""}
    assert None not in outlooks["respawn"]
    assert reasons["respawn"] and all(r.startswith(("zone-flaky", "zone-steady")) for r in reasons["respawn"])
    learned = [sum(e.interruptions for e in o.history.exposures.values()) for o in outlooks["respawn"]]
    assert learned[0] == 0 and learned[-1] > 0
