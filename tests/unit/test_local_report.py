"""The local run's report: what it says of the job's result."""

from __future__ import annotations

from typing import Any

from localcloud.readout.report import build

SHA = "f0c63fffbb008e70d3a1d5fa802029101f6e4755236e0a76964ca7c82ed0db66"


def entry(t: float, attempt: int, **payload: Any) -> dict[str, Any]:
    return {"t": t, "kind": "entry", "machine": f"job-a{attempt}", "attempt": attempt, "payload": payload}


def test_the_trainers_own_result_fills_in_a_record_its_startup_script_ended_first() -> None:
    """Entries arrive in any order: the exit code's `completed` may end the job before the trainer's own, which then
    fills in the record (decide._filled_in); a report that read the record in between says what it will hold."""
    events = [
        {"t": 0.0, "kind": "submitted"},
        entry(1.0, 1, event="completed", step=3000, params_sha256="0" * 64),  # an attempt already over
        entry(2.0, 2, event="completed", step=3000, params_sha256=SHA),
        entry(2.1, 2, event="completed", source="exit-code", exit_code=0),
    ]
    job = {"status": "SUCCEEDED", "result": {"source": "exit-code", "final_step": 3000}}
    kw: dict[str, Any] = dict(machines_left=0, leftover_processes=0, price=None, timed_out=False)
    report = build(events=events, job=job, reference_sha=SHA, **kw)
    assert report["params_sha256"] == SHA and report["exact"] is True
    alone = build(events=[*events[:2], events[3]], job=job, reference_sha=SHA, **kw)  # the trainer sent none
    assert alone["params_sha256"] is None and not alone["exact"]


def test_examples_are_counted_over_the_attempts_spans_of_the_data_stream() -> None:
    """Each attempt trains positions [from, to) of its data stream: spans that tile 0..end are each example once; a
    span that starts before the previous one ended repeats examples, one that starts after it skipped some."""
    from localcloud.readout.report import example_counts

    def ended(attempt: int, event: str, first: int, end: int) -> dict[str, Any]:
        return entry(float(attempt), attempt, event=event, examples={"from": first, "to": end})

    tiled = [ended(1, "stopped", 0, 136), ended(2, "stopped", 136, 328), ended(3, "completed", 328, 480)]
    assert example_counts([*tiled, tiled[1]]) == {"trained": 480, "once": 480, "repeated": 0, "skipped": 0}
    overlap = [ended(1, "stopped", 0, 136), ended(2, "completed", 128, 480)]
    assert example_counts(overlap) == {"trained": 488, "once": 472, "repeated": 8, "skipped": 0}
    gap = [ended(1, "stopped", 0, 136), ended(2, "completed", 144, 480)]
    assert example_counts(gap) == {"trained": 472, "once": 472, "repeated": 0, "skipped": 8}
    killed = [ended(1, "stopped", 0, 136), ended(2, "checkpoint", 136, 200), ended(2, "checkpoint", 136, 256)]
    tiled_after_a_kill = [*killed, ended(3, "completed", 256, 480)]  # a2 killed: its last save is what a3 restored
    assert example_counts(tiled_after_a_kill) == {"trained": 480, "once": 480, "repeated": 0, "skipped": 0}
    assert example_counts([entry(1.0, 1, event="completed", step=3)]) is None  # a trainer without a dataset

    def said(attempt: int, world: int, event: str, first: int, end: int) -> dict[str, Any]:
        return entry(
            float(world), attempt, event=event, world=world, slice=attempt - 1, examples={"from": first, "to": end}
        )

    # two slices (attempts 1, 2) say world 1's global span each; attempt 2 trains on alone in world 2 and again
    # with the replacement (attempt 3) in world 3: each world's span once, an attempt's several worlds each
    worlds = [said(1, 1, "stopped", 0, 176), said(2, 1, "stopped", 0, 176), said(2, 2, "stopped", 176, 240)]
    worlds += [said(2, 3, "completed", 240, 640), said(3, 3, "completed", 240, 640)]
    assert example_counts(worlds) == {"trained": 640, "once": 640, "repeated": 0, "skipped": 0}
    kw: dict[str, Any] = dict(machines_left=0, leftover_processes=0, price=None, timed_out=False)
    report = build(events=[{"t": 0.0, "kind": "submitted"}, *tiled], job=None, reference_sha=None, **kw)
    assert report["examples"]["once"] == 480
