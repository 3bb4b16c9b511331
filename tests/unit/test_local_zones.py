"""The local cloud per zone: `--mtbi ZONE=DURATION,...` lifetimes by the machine's zone, and the report's rows per
zone (machine time, interruptions, productive steps)."""

from __future__ import annotations

from typing import Any

import pytest

from localcloud.chaos import MTBI_ROUND, Chaos, ChaosError, Mtbi, parse_mtbi
from localcloud.command import main
from localcloud.readout import report
from respawn.jobs import Attempt, JobSpec, TpuMachine
from respawn.outlook import History, Key

A, B, C = "us-central1-a", "us-central1-b", "us-central1-c"


def record_attempt(n: int, zone: str, **kw: Any) -> dict[str, Any]:
    """An attempt as the job record holds it."""
    return Attempt(n=n, zone=zone, machine=f"j-a{n}", requested_at=float(n), **kw).to_dict()


def test_mtbi_is_one_duration_for_every_zone_or_one_per_zone() -> None:
    assert parse_mtbi("60s") == Mtbi(every_s=60.0)
    assert parse_mtbi(f"{A}=20s, {C}=5m") == Mtbi(zones={A: 20.0, C: 300.0})
    mixed = parse_mtbi(f"{A}=20s,2m")
    assert (mixed.of(A), mixed.of(B), mixed.of(None)) == (20.0, 120.0, 120.0)
    assert parse_mtbi(f"{A}=20s").of(B) is None  # a zone not named is not interrupted


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "--mtbi: nothing given"),
        ("soon", "--mtbi: 'soon' in 'soon' is not a duration"),
        ("nowhere=20s", "--mtbi: 'nowhere' in 'nowhere=20s' is not a zone"),
        (f"{A}=fast", f"--mtbi: 'fast' in '{A}=fast' is not a duration"),
        (f"{A}=0s", f"--mtbi: '{A}=0s' is not a positive duration"),
        (f"{A}=20s,{A}=30s", f"--mtbi: {A} is given twice"),
        ("20s,30s", "--mtbi: two durations for every zone"),
    ],
)
def test_bad_mtbi_is_one_line_naming_the_option_and_what_is_allowed(text: str, says: str) -> None:
    with pytest.raises(ChaosError) as e:
        parse_mtbi(text)
    assert str(e.value).startswith(says) and "allowed: " in str(e.value) and "\n" not in str(e.value)


def test_the_command_line_refuses_bad_mtbi_with_one_line_and_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "no-such-job.yaml", "--mtbi", f"{A}=20s,{B}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"respawn local: error: --mtbi: '{B}' in '{B}' is not a duration") and "\n" not in err


def _lifetimes(mtbi: Mtbi | float, zones: dict[str, str], seed: int = 7) -> dict[str, float | None]:
    ready = [(name, 0.0) for name in zones]
    chaos = Chaos(ready=lambda: ready, preempt=lambda name, vm: None, t0=0.0, mtbi=mtbi, zone_of=zones.get, seed=seed)
    chaos.plan(0.0)
    return dict(chaos._deadlines)


def test_each_machine_lives_by_its_zone_and_each_zone_has_its_own_rounds() -> None:
    zones = {f"j-a{i}": (A, B, C)[i % 3] for i in range(3 * MTBI_ROUND)}
    lives = _lifetimes(Mtbi(zones={A: 20.0, C: 300.0}), zones)
    by_zone = {z: [life for name, life in lives.items() if zones[name] == z] for z in (A, B, C)}
    assert sum(by_zone[A]) == pytest.approx(MTBI_ROUND * 20.0)  # one whole round each
    assert sum(by_zone[C]) == pytest.approx(MTBI_ROUND * 300.0)
    assert by_zone[B] == [None] * MTBI_ROUND  # never interrupted
    # another zone's machines do not move this zone's lifetimes
    only_a = {name: z for name, z in zones.items() if z == A}
    assert [lives[n] for n in only_a] == list(_lifetimes(Mtbi(zones={A: 20.0, C: 300.0}), only_a).values())
    assert _lifetimes(Mtbi(zones={A: 20.0}), only_a, seed=8) != _lifetimes(Mtbi(zones={A: 20.0}), only_a)


def test_one_mtbi_for_every_zone_draws_as_before_whatever_the_zones() -> None:
    names = [f"j-a{i}" for i in range(MTBI_ROUND)]
    anywhere = _lifetimes(60.0, dict.fromkeys(names, A))
    assert anywhere == _lifetimes(Mtbi(every_s=60.0), {n: (A, B)[i % 2] for i, n in enumerate(names)})
    assert sum(v or 0.0 for v in anywhere.values()) == pytest.approx(MTBI_ROUND * 60.0)


def test_a_machine_is_preempted_when_its_zones_lifetime_is_over() -> None:
    zones = {"j-a1": A, "j-a2": C}
    ready = [("j-a1", 0.0), ("j-a2", 0.0)]
    chaos = Chaos(ready=lambda: ready, preempt=lambda name, vm: None, t0=0.0, mtbi=Mtbi(zones={A: 1.0}),
                  zone_of=zones.get)  # fmt: skip
    assert chaos.due(0.0) == []
    assert chaos.due(1e6) == ["j-a1"]  # j-a2's zone has no MTBI


def _ev(t: float, kind: str, **fields: object) -> dict[str, object]:
    return {"t": t, "kind": kind, **fields}


def _attempt_events(
    n: int, zone: str, ready: float, until: float, steps: tuple[int, int], end: str
) -> list[dict[str, object]]:
    machine = f"j-a{n}"
    first, last = steps
    events = [
        _ev(ready - 1, "state", machine=machine, zone=zone, state="CREATING"),
        _ev(ready, "state", machine=machine, zone=zone, state="READY"),
        _ev(ready + 0.5, "entry", machine=machine, zone=zone, attempt=n,
            payload={"event": "started", "restored_step": first}),
        _ev(ready + 1, "step", machine=machine, attempt=n, step=first + 1),
        _ev(until - 1, "step", machine=machine, attempt=n, step=last),
    ]  # fmt: skip
    if end == "preempted":
        events += [_ev(until - 0.5, "notice", machine=machine, zone=zone),
                   _ev(until, "preempted", machine=machine, zone=zone)]  # fmt: skip
    else:
        events.append(_ev(until, "entry", machine=machine, zone=zone, attempt=n,
                          payload={"event": "completed", "step": last}))  # fmt: skip
    return events


def test_the_report_gives_each_zone_its_machine_time_interruptions_and_productive_steps() -> None:
    """a1 in A trains 0..30, saved 20, preempted; a2 in A restores 20, reaches 25, preempted with 24 saved; a3 in C
    restores 24 and completes 100: productive A 20 + 4, C 76, summing to the final step."""
    events = [
        _ev(0.0, "submitted"),
        *_attempt_events(1, A, 2.0, 12.0, (0, 30), "preempted"),
        *_attempt_events(2, A, 15.0, 20.0, (20, 25), "preempted"),
        *_attempt_events(3, C, 24.0, 64.0, (24, 100), "completed"),
        _ev(30.0, "host_error", machine="j-a3", zone=C, worker=0, instance="x"),
    ]
    attempts = [
        record_attempt(1, A, end_reason="preempted", restored_step=0),
        record_attempt(2, A, end_reason="preempted", restored_step=20),
        record_attempt(3, C, restored_step=24),
        record_attempt(4, B, end_reason="capacity"),  # never ran: a row without machine time
    ]
    job = {"job_id": "j", "status": "SUCCEEDED", "spec": {"zones": [A, B, C]}, "attempts": attempts,
           "result": {"step": 100}}  # fmt: skip
    r = report.build(events=events, job=job, reference_sha=None, machines_left=0, leftover_processes=0, price=None,
                     timed_out=False)  # fmt: skip
    assert r["by_zone"] == [
        {"zone": A, "attempts": 2, "machine_s": pytest.approx(10.0 + 5.0), "interruptions": 2, "productive_steps": 24},
        {"zone": B, "attempts": 1, "machine_s": 0.0, "interruptions": 0, "productive_steps": 0},
        {"zone": C, "attempts": 1, "machine_s": pytest.approx(40.0), "interruptions": 1, "productive_steps": 76},
    ]
    assert sum(z["productive_steps"] for z in r["by_zone"]) == r["final_step"] == 100
    text = report.render(r)
    assert f"zone     {C}: 1 attempts, 40s machine time, 1 interruptions, 76 productive steps" in text


def test_attempts_that_send_no_started_entry_begin_before_their_first_progress_line() -> None:
    events = [
        _ev(1.0, "step", machine="j-a1", attempt=1, step=1),
        _ev(2.0, "step", machine="j-a1", attempt=1, step=12),
        _ev(4.0, "step", machine="j-a2", attempt=2, step=11),
        _ev(5.0, "step", machine="j-a2", attempt=2, step=30),
    ]
    assert report.restored_steps({}, events) == {1: 0, 2: 10}
    assert report.productive_steps({1: 0, 2: 10}, 30) == {1: 10, 2: 20}
    assert report.productive_steps({1: 0, 2: 10}, None) == {1: 10, 2: 0}  # unfinished: the last kept nothing known


def test_the_report_says_what_the_history_learned_of_each_zone_and_why_each_attempt_went_where() -> None:
    spec = JobSpec(job_id="j", machine=TpuMachine("v5litepod-8", "v2-alpha-tpuv5-lite"), zones=(A, B, C),
                   image="trainer:1", checkpoint_uri="gs://b/j")  # fmt: skip
    history = History().observe(Key(A, "v5litepod-8", "spot"), 100.0, seconds=40.0, interruptions=2)
    job = {"job_id": "j", "status": "SUCCEEDED", "spec": spec.to_dict(),
           "attempts": [record_attempt(1, C, zone_reason=f"{C}: MTBI 24.0h (history ...)")]}  # fmt: skip
    events = [_ev(0.0, "submitted"), _ev(100.0, "step", machine="j-a1", attempt=1, step=1)]
    r = report.build(events=events, job=job, reference_sha=None, machines_left=0, leftover_processes=0, price=None,
                     timed_out=False, history=history)  # fmt: skip
    rows = {h["zone"]: h for h in r["history"]}
    assert (rows[A]["interruptions"], rows[A]["machine_s"]) == (2, 40.0) and rows[C]["interruptions"] == 0
    assert rows[A]["mtbi_s"] < rows[B]["mtbi_s"] == rows[C]["mtbi_s"]  # the unseen zones sit at the pooled figure
    text = report.render(r)
    assert f"placed   a1 {C}: MTBI 24.0h" in text
    assert f"history  {A} spot: 2 interruptions in 40 machine-seconds" in text
    assert report.build(events=events, job=job, reference_sha=None, machines_left=0, leftover_processes=0,
                        price=None, timed_out=False)["history"] == []  # fmt: skip
