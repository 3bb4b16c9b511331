"""The local cloud's pure parts: chaos options and schedule, the report, prices, LogEntries, progress lines, slices."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from localcloud.chaos import MTBI_ROUND, Chaos, ChaosError, parse_duration, parse_steps, parse_stockout, parse_times
from localcloud.command import UsageError, parse_entrypoint, total_steps, with_trainer_args
from localcloud.machines.slices import HEARTBEAT_TIMEOUT_S, SINGLE_HOST, LocalSlice, local_trainer_env, report_line
from localcloud.machines.vms import lifecycle_entry, progress
from localcloud.readout import report
from localcloud.services.logentries import preempted_entry, tpu_worker_name, trainer_entry
from respawn import parsing
from respawn.events import MachinePreempted, TrainerStarted, ZoneWokeUp
from respawn.jobs import Attempt
from respawn.prices import machine_price, tpu_units
from respawn_ops.logfilter import LogFilter, load_sink_filter


def record_attempt(n: int, zone: str, **kw: Any) -> dict[str, Any]:
    """An attempt as the job record holds it."""
    return Attempt(n=n, zone=zone, machine=f"j-a{n}", requested_at=float(n), **kw).to_dict()


def test_durations_and_schedules() -> None:
    assert parse_duration("45s", "--x") == 45.0
    assert parse_duration("1.5m", "--x") == 90.0
    assert parse_duration("250ms", "--x") == 0.25
    assert parse_duration("7", "--x") == 7.0
    assert parse_times("75s,30s") == [30.0, 75.0]
    assert parse_steps("550, 250") == [250, 550]
    assert parse_stockout("us-central1-a:2") == ("us-central1-a", 2)
    assert parse_stockout("us-central1-a") == ("us-central1-a", None)
    assert parse_stockout("us-central1-a@a3-highgpu-8g:3") == ("us-central1-a@a3-highgpu-8g", 3)


def test_a_stockout_of_one_machine_type_leaves_the_zone_to_the_others() -> None:
    from localcloud.apis.apicore import CloudCore

    core = CloudCore(spot_stockouts={"us-central1-a@a3-highgpu-8g": None}, stockouts={"us-east5-a@a2-highgpu-4g": 1})
    assert core.stocked_out("us-central1-a", spot=True, machine_type="a3-highgpu-8g")
    assert not core.stocked_out("us-central1-a", spot=True, machine_type="a2-highgpu-4g")
    assert not core.stocked_out("us-central1-a", spot=False, machine_type="a3-highgpu-8g")  # on-demand has capacity
    assert core.stocked_out("us-east5-a", machine_type="a2-highgpu-4g")  # once
    assert not core.stocked_out("us-east5-a", machine_type="a2-highgpu-4g")


@pytest.mark.parametrize(
    ("call", "names"),
    [
        (lambda: parse_duration("soon", "--mtbi"), "--mtbi"),
        (lambda: parse_times(","), "--preempt-at"),
        (lambda: parse_steps("250,soon"), "--preempt-at-step: 'soon' is not a step"),
        (lambda: parse_steps("0"), "--preempt-at-step: '0' is not a step"),
        (lambda: parse_steps(""), "--preempt-at-step: no step given"),
        (lambda: parse_stockout("nowhere:1"), "--stockout"),
        (lambda: parse_stockout("us-central1-a:x"), "--stockout"),
        (lambda: parse_stockout("us-central1-a@A3:1"), "--stockout: 'A3' is not a machine type"),
    ],
)
def test_bad_chaos_options_name_the_option(call, names) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ChaosError, match=names):
        call()


def test_fixed_preemption_waits_for_a_ready_machine() -> None:
    ready: list[tuple[str, float]] = []
    chaos = Chaos(ready=lambda: ready, preempt=lambda name, vm: None, t0=100.0, at=[10.0, 20.0])
    assert chaos.due(105.0) == []
    assert chaos.due(111.0) == []  # due, but nothing is READY: it waits
    ready.append(("job-a1", 112.0))
    assert chaos.due(113.0) == ["job-a1"]
    ready.clear()
    ready.append(("job-a2", 118.0))
    assert chaos.due(119.0) == []
    assert chaos.due(120.5) == ["job-a2"]
    assert chaos.due(500.0) == []  # the schedule is used up


def test_step_preemption_waits_for_the_trainer_to_reach_the_step() -> None:
    ready = [("job-a1", 0.0)]
    steps: dict[str, int] = {}
    chaos = Chaos(ready=lambda: ready, preempt=lambda name, vm: None, t0=0.0, at_steps=[50, 120], step_of=steps.get)
    assert chaos.due(1.0) == []  # no step reported yet
    steps["job-a1"] = 49
    assert chaos.due(2.0) == []
    steps["job-a1"] = 53  # progress lines may skip steps
    assert chaos.due(3.0) == ["job-a1"]
    ready[:] = [("job-a2", 4.0)]
    steps["job-a2"] = 54  # the replacement resumed past the first step, not yet at the second
    assert chaos.due(5.0) == []
    steps["job-a2"] = 120
    assert chaos.due(6.0) == ["job-a2"]
    assert chaos.due(7.0) == []  # the schedule is used up


def test_mtbi_schedule_is_seeded() -> None:
    def lifetimes(seed: int) -> list[float]:
        ready = [(f"job-a{i}", 0.0) for i in range(1, 6)]
        chaos = Chaos(ready=lambda: ready, preempt=lambda name, vm: None, t0=0.0, mtbi=60.0, seed=seed)
        chaos.due(0.0)
        return [chaos._deadlines[name] for name, _ in ready]

    assert lifetimes(7) == lifetimes(7)
    assert lifetimes(7) != lifetimes(8)
    assert all(t > 0 for t in lifetimes(7))


def test_a_preemption_takes_one_vm_of_a_compute_slice_drawn_with_the_seed() -> None:
    """A Compute Engine slice's workers are VMs of their own: each preemption takes one, drawn from a stream of its
    own (the same seed, the same VMs; the machine picks and lifetimes unchanged); any other machine goes whole."""

    def preempted(seed: int, vms: int) -> list[tuple[str, int | None]]:
        ready = [(f"job-a{i}", 0.0) for i in range(1, 9)]
        chaos = Chaos(ready=lambda: ready, preempt=lambda name, vm: None, t0=0.0, mtbi=1.0, seed=seed,
                      vms=lambda name: vms)  # fmt: skip
        return [(name, a.worker) for name, a in chaos.plan(1e6)]

    drawn = preempted(7, 4)
    assert len(drawn) == 8 and {vm for _, vm in drawn} <= {0, 1, 2, 3} and len({vm for _, vm in drawn}) > 1
    assert drawn == preempted(7, 4) and drawn != preempted(8, 4)
    assert preempted(7, 1) == [(name, None) for name, _ in drawn]
    ready = [("job-a1", 0.0)]
    chaos = Chaos(ready=lambda: ready, preempt=lambda name, vm: None, t0=0.0, at_steps=[5], step_of=lambda n: 5,
                  seed=3, vms=lambda name: 4)  # fmt: skip
    ((name, action),) = chaos.plan(1.0)
    assert name == "job-a1" and action.action == "preempt" and action.worker in range(4)


def test_mtbi_lifetimes_come_in_rounds_that_last_the_mtbi_on_average() -> None:
    ready = [(f"job-a{i}", 0.0) for i in range(1, 3 * MTBI_ROUND + 1)]
    chaos = Chaos(ready=lambda: ready, preempt=lambda name, vm: None, t0=0.0, mtbi=60.0, seed=7)
    chaos.due(0.0)
    lives = [chaos._deadlines[name] for name, _ in ready]
    rounds = [lives[i : i + MTBI_ROUND] for i in range(0, len(lives), MTBI_ROUND)]
    assert [sum(r) for r in rounds] == [pytest.approx(MTBI_ROUND * 60.0)] * 3
    assert len(set(lives)) == len(lives) and min(lives) > 0


def _ev(t: float, kind: str, **fields: object) -> dict[str, object]:
    return {"t": t, "kind": kind, **fields}


TIMELINE = [
    _ev(0.0, "submitted"),
    _ev(0.5, "create_call", machine="j-a1", zone="z-a"),
    _ev(0.5, "state", machine="j-a1", zone="z-a", state="CREATING"),
    _ev(1.5, "state", machine="j-a1", zone="z-a", state="READY"),
    _ev(1.5, "trainer_start", machine="j-a1", attempt=1),
    _ev(4.0, "step", machine="j-a1", attempt=1, step=1, loss=5.0),
    _ev(9.0, "step", machine="j-a1", attempt=1, step=40, loss=4.0),
    _ev(10.0, "notice", machine="j-a1"),
    _ev(11.0, "entry", machine="j-a1", attempt=1, payload={"event": "stopped", "step": 42, "goodput": {
        "startup_s": 2.0, "restore_s": 0.0, "productive_s": 7.0, "checkpoint_s": 0.5, "wasted_s": 0.0,
        "total_s": 9.5}}),
    _ev(11.5, "preempted", machine="j-a1", zone="z-a"),
    _ev(11.8, "create_call", machine="j-a2", zone="z-a"),
    _ev(11.8, "state", machine="j-a2", zone="z-a", state="CREATING"),
    _ev(12.0, "deleted", machine="j-a1"),
    _ev(12.8, "state", machine="j-a2", zone="z-a", state="READY"),
    _ev(12.8, "trainer_start", machine="j-a2", attempt=2),
    _ev(15.0, "entry", machine="j-a2", attempt=2, payload={"event": "started", "restored_step": 40}),
    _ev(16.5, "step", machine="j-a2", attempt=2, step=41, loss=3.9),
    _ev(20.0, "entry", machine="j-a2", attempt=2, payload={"event": "completed", "step": 60, "params_sha256": "ab",
        "goodput": {"startup_s": 2.0, "restore_s": 0.5, "productive_s": 4.0, "checkpoint_s": 0.5, "wasted_s": 0.0,
                    "total_s": 7.0}}),
    _ev(20.5, "deleted", machine="j-a2"),
]  # fmt: skip


def head_start_timeline(marked: bool) -> list[dict[str, object]]:
    """TIMELINE with a head start: j-a2 is requested 0.3 s after j-a1's notice; j-a1 is deleted at its final save
    (never marked PREEMPTED), or marked after j-a2 was requested."""
    moved = ("create_call", "state", "trainer_start")
    events = [
        e for e in TIMELINE if e["kind"] != "preempted" and not (e.get("machine") == "j-a2" and e["kind"] in moved)
    ]
    events += [
        _ev(10.3, "create_call", machine="j-a2", zone="z-b"),
        _ev(10.3, "state", machine="j-a2", zone="z-b", state="CREATING"),
        _ev(11.3, "state", machine="j-a2", zone="z-b", state="READY"),
        _ev(11.3, "trainer_start", machine="j-a2", attempt=2),
    ]
    return [*events, _ev(11.5, "preempted", machine="j-a1", zone="z-a")] if marked else events


@pytest.mark.parametrize("marked", [False, True])
def test_a_head_starts_recovery_is_measured_from_the_notice(marked: bool) -> None:
    """The next machine was requested on the notice, before the noticed one was PREEMPTED (or it never was: deleted
    at its final save): measured from the PREEMPTED mark, its create call would come before it."""
    job = {"job_id": "j", "status": "SUCCEEDED", "attempts": [record_attempt(1, "z-a"), record_attempt(2, "z-b")],
           "counters": {"preemptions": 1}, "result": {"params_sha256": "ab", "step": 60}}  # fmt: skip
    r = report.build(
        events=head_start_timeline(marked), job=job, reference_sha="ab", machines_left=0, leftover_processes=0,
        price=None, timed_out=False,
    )  # fmt: skip
    (row,) = r["recovery"]
    assert (row["from"], row["at_s"], row["stop_s"]) == ("notice", 10.0, pytest.approx(1.5) if marked else None)
    assert r["recovery_create_s"] == [pytest.approx(0.3)] and r["recovery_first_step_s"] == [pytest.approx(6.5)]
    assert (row["queue_s"], row["boot_s"], row["start_s"]) == (0.0, pytest.approx(1.0), pytest.approx(5.2))


def test_a_notice_the_job_ended_on_is_no_recovery() -> None:
    ended = [e for e in TIMELINE if e["kind"] != "preempted" and e.get("machine") != "j-a2"]
    assert report.recoveries(ended) == []


def test_report_from_a_timeline() -> None:
    job = {"job_id": "j", "status": "SUCCEEDED", "attempts": [record_attempt(1, "z-a"), record_attempt(2, "z-a")],
           "counters": {"preemptions": 1}, "result": {"params_sha256": "ab", "step": 60}}  # fmt: skip
    r = report.build(
        events=list(reversed(TIMELINE)),  # order of recording does not matter
        job=job,
        reference_sha="ab",
        machines_left=0,
        leftover_processes=0,
        price=machine_price({"kind": "tpu", "accelerator_type": "v5litepod-8"}),
        timed_out=False,
    )
    assert r["status"] == "SUCCEEDED" and r["exact"] is True
    assert r["lost_steps"] == 2  # step 42 was reached, step 40 restored
    assert r["recovery_create_s"] == [pytest.approx(0.3)]
    assert r["recovery_first_step_s"] == [pytest.approx(5.0)]
    assert r["recovery"][0]["stop_s"] == pytest.approx(1.5) and r["recovery"][0]["from"] == "preempted"
    assert r["wall_s"] == pytest.approx(20.0)
    assert r["mtbi_realized_s"] == pytest.approx(8.5 + 7.7)  # READY to the notice, READY to its deletion; one notice
    assert r["goodput_s"]["productive_s"] == pytest.approx(11.0)
    assert r["goodput_s"]["idle_s"] == pytest.approx(20.0 - 16.5)
    assert r["goodput"] == pytest.approx(11.0 / 20.0)
    assert r["max_live_machines"] == 1  # a1 was PREEMPTED (not live) before a2 was requested
    assert r["cost"]["spot_usd"] < r["cost"]["on_demand_usd"]
    assert "SUCCEEDED" in report.render(r) and "(injected 1, one per 16s of machine time)" in report.render(r)
    assert report.build(events=TIMELINE, job=job, reference_sha="cd", machines_left=0, leftover_processes=0,
                        price=None, timed_out=False)["exact"] is False  # fmt: skip
    assert r["exact_reason"] is None
    assert [z["api"] for z in r["zones"]] == ["tpu", "tpu"]  # a record from before machines named their API


@pytest.mark.parametrize(
    ("machine", "api", "words"),
    [
        ({"kind": "tpu", "accelerator_type": "v6e-16", "api": "compute"}, "compute", " on v6e-16"),
        ({"kind": "tpu", "accelerator_type": "v5litepod-8", "api": "tpu"}, "tpu", " on v5litepod-8"),
        ({"kind": "gpu", "machine_type": "g2-standard-8"}, "compute", ""),  # too little of a machine to name it
    ],
)
def test_each_attempt_row_says_which_api_provisioned_it(machine: dict[str, str], api: str, words: str) -> None:
    job = {"job_id": "j", "status": "SUCCEEDED", "spec": {"machine": machine},
           "attempts": [record_attempt(1, "z-a", end_reason="preempted"), record_attempt(2, "z-b")]}  # fmt: skip
    r = report.build(events=TIMELINE, job=job, reference_sha=None, machines_left=0, leftover_processes=0,
                     price=None, timed_out=False)  # fmt: skip
    assert [z["api"] for z in r["zones"]] == [api, api]
    line = f"  zones    a1 z-a {api}{words} (preempted) -> a2 z-b {api}{words} (live)"
    assert line in report.render(r).splitlines()


def test_each_attempt_row_names_the_machine_of_its_tier() -> None:
    gpu = {"kind": "gpu", "machine_type": "a3-highgpu-8g", "accelerator_type": "nvidia-h100-80gb",
           "accelerator_count": 8, "vms": 2}  # fmt: skip
    a100 = {"kind": "gpu", "machine_type": "a2-highgpu-4g", "accelerator_type": "nvidia-tesla-a100",
            "accelerator_count": 4}  # fmt: skip
    spec = {"machine": gpu, "tiers": [{"provisioning": "spot", "zones": ["z-a"]},
                                      {"provisioning": "spot", "zones": ["z-b"], "machine": a100}]}  # fmt: skip
    attempts = [record_attempt(1, "z-a", end_reason="capacity"), {**record_attempt(2, "z-b"), "tier": 1}]
    job = {"job_id": "j", "status": "SUCCEEDED", "spec": spec, "attempts": attempts}
    r = report.build(events=TIMELINE, job=job, reference_sha=None, machines_left=0, leftover_processes=0,
                     price=None, timed_out=False)  # fmt: skip
    assert [z["machine"] for z in r["zones"]] == [
        "2xa3-highgpu-8g(8xnvidia-h100-80gb)",
        "a2-highgpu-4g(4xnvidia-tesla-a100)",
    ]
    assert "a2 z-b compute tier 1 on a2-highgpu-4g(4xnvidia-tesla-a100) (live)" in report.render(r)


def test_without_a_reference_hash_exact_is_unknown_and_the_report_says_why() -> None:
    job = {
        "job_id": "j",
        "status": "SUCCEEDED",
        "attempts": [record_attempt(1, "z-a")],
        "result": {"source": "exit-code"},
    }
    why = "the program sends no params_sha256 (the respawn_trainer library does)"
    r = report.build(events=TIMELINE[:5], job=job, reference_sha=None, machines_left=0, leftover_processes=0,
                     price=None, timed_out=False, reference_note=why)  # fmt: skip
    assert (r["exact"], r["exact_reason"], r["params_sha256"]) == (None, why, None)
    assert f"  exact    unknown: {why}" in report.render(r).splitlines()


def test_a_program_without_started_entries_loses_the_steps_before_its_first_progress_line() -> None:
    steps = [_ev(1.0 + i, "step", machine=f"j-a{n}", attempt=n, step=s) for i, (n, s) in enumerate(
        [(1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (2, 5), (3, 4), (3, 6)])]  # fmt: skip
    assert report.lost_steps(steps) == 4 + 2  # a2 began from scratch after a1 reached 4; a3 at 4 after a2 reached 5


def test_live_machines_count_only_creating_and_ready() -> None:
    events = [
        _ev(1, "state", machine="a1", state="CREATING"),
        _ev(2, "state", machine="a1", state="READY"),
        _ev(3, "state", machine="a1", state="PREEMPTED"),
        _ev(4, "state", machine="a2", state="CREATING"),
        _ev(5, "deleted", machine="a1"),
        _ev(6, "state", machine="a3", state="CREATING"),
    ]
    assert report.max_live_machines(events) == 2
    assert report.max_live_machines(events[:5]) == 1


def test_percentile_nearest_rank() -> None:
    assert report.percentile([], 50) is None
    assert report.percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert report.percentile([float(i) for i in range(1, 21)], 95) == 19.0


def test_prices() -> None:
    assert tpu_units("v5litepod-8") == ("v5litepod", 8)
    assert tpu_units("v4-8") == ("v4", 4)
    assert tpu_units("v2-8") == ("v2", 1)
    price = machine_price({"kind": "tpu", "accelerator_type": "v5litepod-8"})
    assert price is not None and price.spot_per_h < price.on_demand_per_h
    gpu = machine_price({"kind": "gpu", "accelerator_type": "nvidia-l4", "accelerator_count": 2})
    assert gpu is not None and gpu.on_demand_per_h == pytest.approx(2 * 0.56)
    assert machine_price({"kind": "tpu", "accelerator_type": "v99-8"}) is None


def test_emitted_entries_pass_the_sink_filter_and_parse() -> None:
    sink = LogFilter.parse(load_sink_filter())
    worker = tpu_worker_name("quickstart-a1")
    assert worker.startswith("t1v-n-") and worker.endswith("-w-0")
    tpu = preempted_entry(project="p", zone="us-central1-a", instance=worker, now=1.0)
    gpu = preempted_entry(project="p", zone="us-central1-a", instance="quickstart-a2", now=1.0)
    started = trainer_entry({"event": "started", "job_id": "quickstart", "attempt": 2, "step": 5, "restored_step": 5},
                            project="p", zone="us-central1-a", machine="quickstart-a2", job_id="quickstart", attempt=2,
                            now=1.0)  # fmt: skip
    for entry in (tpu, gpu, started):
        assert sink.matches(entry)
    assert isinstance(parsing.log_entry_event(tpu), ZoneWokeUp)
    preempted = parsing.log_entry_event(gpu)
    assert isinstance(preempted, MachinePreempted) and (preempted.job_id, preempted.attempt) == ("quickstart", 2)
    event = parsing.log_entry_event(started)
    assert isinstance(event, TrainerStarted) and event.restored_step == 5
    other = preempted_entry(project="p", zone="us-central1-a", instance="someone-elses-vm", now=1.0)
    assert not sink.matches(other)


def test_only_json_objects_naming_a_lifecycle_event_of_this_job_and_attempt_are_entries() -> None:
    ours = {"event": "completed", "job_id": "byo", "attempt": 2, "step": 5}
    assert lifecycle_entry(json.dumps(ours).encode() + b"\n", "byo", 2) == ours
    plain = [
        b"step 1 loss 2.0\n",
        b"\n",
        b'{"event": "completed"}\n',  # a program's own log line: no job, no attempt
        json.dumps({**ours, "attempt": 1}).encode(),
        json.dumps({**ours, "attempt": True}).encode(),
        json.dumps({**ours, "job_id": "other"}).encode(),
        json.dumps({**ours, "event": "epoch"}).encode(),
        json.dumps({**ours, "event": ["completed"]}).encode(),
        b'{"deep": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # deeper than the JSON parser recurses
        b'{"event": "\xff\xfe"}',  # not UTF-8
        b"{not json",
        b"[1, 2]",
    ]
    assert [lifecycle_entry(line, "byo", 2) for line in plain] == [None] * len(plain)
    assert lifecycle_entry(json.dumps({**ours, "attempt": 1}).encode(), "byo", 1) is not None


def test_entrypoints_split_like_a_shell_and_python_is_this_interpreter() -> None:
    assert parse_entrypoint("python train.py --lr='1e-3 x'") == [sys.executable, "train.py", "--lr=1e-3 x"]
    assert parse_entrypoint("python3 -m my.train")[0] == sys.executable
    assert parse_entrypoint("/opt/bin/train --x") == ["/opt/bin/train", "--x"]
    for text, problem in [("", "holds no command"), ("  ", "holds no command"), ("python 'a", "no closing quotation")]:
        with pytest.raises(UsageError, match=f"^--entrypoint: .*{problem}; allowed: a command line such as"):
            parse_entrypoint(text)


def test_progress_lines_and_trainer_args() -> None:
    assert progress("step 120/300 loss 3.2100 12.1 steps/s") == (120, 3.21)
    assert progress("23:50:28 trainer INFO step 20/100 loss 2.9404 5.8 steps/s") == (20, 2.9404)
    assert progress("trainer INFO started at step 270 of 1000 (startup 4.1s, restore 0.3s)") is None
    assert progress("compiling") is None
    assert with_trainer_args(["--steps=300", "--model=tiny"], ["--steps=40"]) == ["--model=tiny", "--steps=40"]
    assert total_steps(["--model=tiny", "--steps=40"]) == 40
    assert total_steps(["--steps", "9"]) == 9


def test_a_single_host_is_a_slice_of_one_that_keeps_its_names_and_environment() -> None:
    assert LocalSlice.of("gpu", None) == LocalSlice.of("tpu", "v9-7") == SINGLE_HOST == LocalSlice(1, 1)
    assert LocalSlice.of("tpu", "v5litepod-8") == LocalSlice(1, 8)
    one = LocalSlice(1, 8)
    assert list(one.workers) == [0]
    assert one.log_name("job-a1", 0) == "job-a1.log"
    assert one.tag(0) == {}
    assert one.worker_env({"A": "1", "XLA_FLAGS": "--x"}, 0, 0) == {"A": "1", "XLA_FLAGS": "--x"}
    assert one.cache_key() == {}  # a one-host run keeps the reference key it always had
    assert one.processes_phrase() == ""
    assert (one.hosts_phrase(), one.workers_allowed()) == ("1 host", "worker 0 only")
    assert report_line(1) is None


def test_a_slice_names_tags_and_sets_up_each_worker() -> None:
    four = LocalSlice.of("tpu", "v5litepod-16")
    assert four == LocalSlice(4, 4)
    assert list(four.workers) == [0, 1, 2, 3] and four.has_worker(3) and not four.has_worker(4)
    assert four.log_name("job-a1", 2) == "job-a1-w-2.log"
    assert four.tag(2) == {"worker": 2}
    env = four.worker_env({"A": "1", "XLA_FLAGS": "--x --xla_force_host_platform_device_count=1"}, 2, 8476)
    assert env["A"] == "1" and env["TPU_WORKER_ID"] == "2" and env["JAX_COORDINATOR_ADDRESS"] == "127.0.0.1:8476"
    assert env["XLA_FLAGS"] == "--x --xla_force_host_platform_device_count=4"
    assert env["JAX_CPU_COLLECTIVES_IMPLEMENTATION"] == "gloo"
    assert env["RESPAWN_HEARTBEAT_TIMEOUT_S"] == str(HEARTBEAT_TIMEOUT_S)
    assert four.cache_key() == {"hosts": 4, "chips_per_host": 4}
    assert four.processes_phrase() == " on 4 processes (4 hosts x 4 devices)"
    assert (four.hosts_phrase(), four.workers_allowed()) == ("4 hosts", "workers 0..3")
    assert report_line(4) == "  slice    4 hosts: 4 trainer processes per attempt"


def test_every_local_trainer_reads_the_storage_emulator_anonymously_in_the_images_environment(tmp_path: Path) -> None:
    env = local_trainer_env(tmp_path, {"HOME": "/h", "RESPAWN_PROJECT": "p", "PUBSUB_EMULATOR_HOST": "x"})
    assert env == {
        "HOME": "/h",
        "RESPAWN_COMPILE_CACHE": str((tmp_path / "compile-cache").resolve()),
        "FSSPEC_GCS_TOKEN": "anon",
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1",  # trainer/Dockerfile's ENV
    }
    own = {"GLIBC_TUNABLES": "glibc.malloc.check=3"}  # the environment's own setting wins, as `docker run -e` does
    assert local_trainer_env(tmp_path, own)["GLIBC_TUNABLES"] == "glibc.malloc.check=3"
    shared = tmp_path / "shared-programs"  # --compile-cache: several workdirs' machines share one
    assert local_trainer_env(tmp_path, {}, shared)["RESPAWN_COMPILE_CACHE"] == str(shared.resolve())


def test_the_functions_read_time_at_the_profiles_scale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--profile cloud` replays a real minute in a local second: the functions get its scale (RESPAWN_TIME_SCALE),
    which decide's Policy.time_scale reads, so a head start's drain is as much shorter; the local profile's is 1."""
    from localcloud import cloud
    from localcloud.machines.profiles import CLOUD_SCALE
    from localcloud.services.emulators import FakeGcs
    from respawn.deployment import Settings

    given: list[dict[str, str]] = []

    class Recorded:
        def __init__(self, env: dict[str, str], log_dir: Path, *sizing: object) -> None:
            given.append(env)

        def start(self) -> None:
            return None

        def stop(self) -> None:
            return None

    monkeypatch.setattr(cloud, "FunctionServers", Recorded)
    api = type("Api", (), {"url": "http://127.0.0.1:9"})()
    for scale in (CLOUD_SCALE, 1.0):
        local = cloud.LocalCloud(cloud.Options(workdir=tmp_path, time_scale=scale), say=lambda line: None)
        local._functions(api, FakeGcs(port=9).env(), None)  # type: ignore[arg-type]
        assert Settings.from_env(given[-1]).time_scale == scale


def test_a_reference_run_writes_its_log_into_a_new_workdir(tmp_path: Path) -> None:
    """A first run from a new --workdir whose reference cache lies elsewhere (--reference-cache, a test session's
    shared one): the reference's log is the first thing written under the workdir, and it makes its directory."""
    from localcloud.reference import reference_run

    log = tmp_path / "new" / "work" / "reference.log"
    program = [sys.executable, "-c", "print('trained')"]  # knows nothing of respawn: exit 0 is completed
    result = reference_run([], {}, cache_dir=tmp_path / "shared", base_env={}, log_path=log, entrypoint=program)
    assert result["cached"] is False and result["params_sha256"] is None
    assert "trained" in log.read_text()
