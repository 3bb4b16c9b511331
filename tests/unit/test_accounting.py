"""Goodput, badput and cost from a job record: the trainer's split kept per attempt whatever the delivery order,
garbage tolerated, and what no trainer reported filled in from the record's times."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from respawn.accounting import CATEGORIES, job_accounting, later_split, parse_split
from respawn.decide import decide
from respawn.events import (
    CheckpointSaved,
    JobEvent,
    JobSubmitted,
    MachinePreempted,
    TrainerCompleted,
    TrainerFailed,
    TrainerStarted,
)
from respawn.jobs import Attempt, Job, JobSpec, Status, TpuMachine
from respawn.parsing import log_entry_event
from respawn.policy import Policy
from respawn.prices import LIST_SOURCE

DATA = Path(__file__).resolve().parents[1] / "data"
T = 1_700_000_000.0
A = "us-central1-a"
SPEC = JobSpec("llm", TpuMachine("v5litepod-8", "v2-alpha-tpuv5-lite"), (A,), "img", "gs://b/llm")
FULL = {"startup_s": 8.0, "restore_s": 2.0, "productive_s": 3200.0, "checkpoint_s": 20.0, "wasted_s": 0.0,
        "total_s": 3245.0}  # fmt: skip


@pytest.mark.parametrize(
    ("value", "want"),
    [
        (None, None),
        ("fast", None),
        ([1.0, 2.0], None),
        ({}, None),
        ({"productive_s": "12"}, None),
        ({"productive_s": True}, None),
        ({"productive_s": -1.0}, None),
        ({"productive_s": float("nan")}, None),
        ({"productive_s": float("inf")}, None),
        ({"productive_s": 1e12}, None),
        ({"productive_s": 10, "wasted_s": "x", "colour": 3}, {"productive_s": 10.0, "total_s": 10.0}),
        ({"startup_s": 1.23456, "total_s": 0.5}, {"startup_s": 1.235, "total_s": 0.5}),
        (FULL, FULL),
    ],
)
def test_a_split_keeps_what_is_right_and_drops_the_rest(value: Any, want: dict[str, float] | None) -> None:
    assert parse_split(value) == want


def test_garbage_goodput_in_an_entry_still_gives_its_event_without_a_split() -> None:
    entry = json.loads((DATA / "logentry_trainer_stopped.json").read_text())
    for garbage in ("lots", {"productive_s": "1h"}, [], None):
        entry["jsonPayload"]["goodput"] = garbage
        event = log_entry_event(entry)
        assert isinstance(event, CheckpointSaved) and (event.step, event.goodput) == (8812, None)
    del entry["jsonPayload"]["goodput"]
    assert isinstance(log_entry_event(entry), CheckpointSaved)


def test_the_split_covering_more_time_wins_in_either_order() -> None:
    short, long = {"productive_s": 5.0, "total_s": 6.0}, {"productive_s": 5.0, "total_s": 9.0}
    assert later_split(long, short) and not later_split(short, long)
    assert later_split(short, None) and not later_split(short, short)
    tie = {"productive_s": 4.0, "total_s": 6.0}
    assert later_split(short, tie) != later_split(tie, short)  # a tie is broken by content, never by order


# -- the record through decide: any order, any duplicate ------------------------------------------------------------

A1 = {"startup_s": 10.0, "restore_s": 0.0, "productive_s": 1500.0, "checkpoint_s": 5.0, "wasted_s": 0.0,
      "total_s": 1520.0}  # fmt: skip
SUBMIT = JobSubmitted("submit", T, SPEC)
HISTORY: list[JobEvent] = [
    TrainerStarted("s1", T + 100, "llm", 1, 0, 10.0),
    CheckpointSaved("c1", T + 1000, "llm", 1, 100),
    CheckpointSaved("stop1", T + 1600, "llm", 1, 160, A1),  # the `stopped` entry: saved on the notice
    MachinePreempted("p1", T + 1610, "llm", 1, "llm-a1", A, "p"),
    TrainerStarted("s2", T + 1700, "llm", 2, 160, 10.0),
    TrainerFailed("f1", T + 1700, "llm", 1, "the trainer exited with code 137"),  # a late word with no split: stale
    TrainerCompleted("done", T + 5000, "llm", 2, 480, {}, FULL),
]


def play(events: list[JobEvent]) -> Job:
    job, _ = decide(None, SUBMIT, T, Policy())
    for event in events:
        job, _ = decide(job, event, event.time, Policy())
    assert job is not None
    return job


def orders() -> list[list[JobEvent]]:
    """The history in order, with `stopped` arriving after the preemption, after the next attempt started, last;
    and with every entry delivered twice."""
    stop = HISTORY[2]
    rest = [e for e in HISTORY if e is not stop]
    late = [[*rest[:i], stop, *rest[i:]] for i in (3, 4, len(rest))]
    return [HISTORY, *late, [e for e in HISTORY for _ in (1, 2)]]


@pytest.mark.parametrize("events", orders(), ids=["in-order", "after-preempt", "after-next-start", "last", "twice"])
def test_each_attempts_split_is_kept_once_whatever_the_order(events: list[JobEvent]) -> None:
    job = play(events)
    assert job.status is Status.SUCCEEDED and job.counters.preemptions == 1
    assert [a.goodput for a in job.attempts] == [A1, FULL]
    assert job.attempts[0].checkpoint_at in (T + 1000, T + 1600)  # a late `stopped` is not a checkpoint of a1 any more
    assert job_accounting(job, T + 9999) == job_accounting(play(HISTORY), T + 9999)


def test_a_shorter_or_repeated_split_changes_nothing() -> None:
    job = play(HISTORY)
    shorter = CheckpointSaved("other-id", T + 1600, "llm", 1, 160, {**A1, "total_s": 100.0})
    same = CheckpointSaved("third-id", T + 1600, "llm", 1, 160, A1)
    for event in (shorter, same):
        assert decide(job, event, T + 6000, Policy()) == (job, [])
    unknown = CheckpointSaved("x", T + 6000, "llm", 7, 1, A1)  # no attempt 7: nothing to keep it on
    assert decide(job, unknown, T + 6000, Policy()) == (job, [])


# -- what the record says, category by category ---------------------------------------------------------------------


def test_categories_from_the_splits_and_the_record_times_add_up_to_the_wall() -> None:
    books = job_accounting(play(HISTORY), T + 9999)
    sec = books["seconds"]
    # a1: requested at T, its process started at T+90 (started at T+100 after 10 s); a2: requested at T+1610,
    # process at T+1690. Both sent their split.
    assert books["wall_s"] == 5000.0  # the job ended with its last attempt
    assert sec["waiting_s"] == 90.0 + 80.0
    assert sec["productive_s"] == 1500.0 + 3200.0 and sec["startup_s"] == 18.0 and sec["checkpoint_s"] == 25.0
    assert sec["lost_s"] == 0.0
    assert sum(sec.values()) == pytest.approx(books["wall_s"])
    assert books["goodput"] == pytest.approx(4700 / 5000, abs=1e-4)
    # machine time: a1 from T+90 to T+1610, a2 from T+1690 to T+5000; 8 chips of v5e at $0.48 / $1.20
    hours = (1520 + 3310) / 3600
    assert books["machine_hours"] == pytest.approx(hours, abs=1e-5)
    assert books["cost"]["spot_usd"] == pytest.approx(hours * 8 * 0.48, abs=1e-4)
    assert books["cost"]["on_demand_usd"] == pytest.approx(hours * 8 * 1.20, abs=1e-4)
    assert books["tiers"] == [
        {
            "tier": 0,
            "provisioning": "spot",
            "machine_hours": round(hours, 5),
            "cost_usd": round(hours * 8 * 0.48, 4),
            "price_sources": [LIST_SOURCE],
        }
    ]
    # The same job with attempt 2 placed at the Advice API's price of its zone: its hours at that price, and both
    # sources named.
    advised = {"per_h": 3.0, "source": "Advice API price history (2026-11-25)"}
    job = play(HISTORY)
    job = replace(job, attempts=(job.attempts[0], replace(job.attempts[1], price=advised)))
    tier = job_accounting(job, T + 5000)["tiers"][0]
    assert tier["cost_usd"] == pytest.approx(1520 / 3600 * 8 * 0.48 + 3310 / 3600 * 3.0, abs=1e-4)
    assert tier["price_sources"] == [advised["source"], LIST_SOURCE]


def attempt(n: int, requested: float, **kw: Any) -> Attempt:
    return Attempt(n=n, zone=A, machine=f"llm-a{n}", requested_at=requested, **kw)


def test_without_splits_the_record_times_fill_in_lost_waiting_and_idle() -> None:
    job = Job(
        job_id="llm",
        spec=SPEC,
        status=Status.RUNNING,
        submitted_at=T,
        updated_at=T,
        attempts=(
            attempt(1, T, ended_at=T + 60, end_reason="capacity"),  # no machine: all waiting
            # killed with no last word: its checkpoint at T+700 keeps 500 s, the 300 s after it are lost
            attempt(2, T + 60, started_at=T + 200, startup_s=40.0, checkpoint_at=T + 700, ended_at=T + 1000,
                    end_reason="preempted"),
            # a capacity backoff of 100 s with no request out (idle), then a live attempt with no split yet
            attempt(3, T + 1100, started_at=T + 1150, startup_s=20.0),
        ),
    )  # fmt: skip
    sec = job_accounting(job, T + 2000)["seconds"]
    assert sec["waiting_s"] == 60.0 + 100.0 + 30.0
    assert sec["startup_s"] == 40.0 + 20.0
    assert sec["productive_s"] == 500.0 + 850.0  # the live attempt's training counts until it is lost
    assert sec["lost_s"] == 300.0
    assert sec["idle_s"] == 100.0
    assert sum(sec.values()) == pytest.approx(2000.0)
    failed_without_checkpoint = replace(job.attempts[1], checkpoint_at=None, end_reason="failed")
    sec = job_accounting(replace(job, attempts=(failed_without_checkpoint,)), T + 1000)["seconds"]
    assert (sec["productive_s"], sec["lost_s"]) == (0.0, 800.0)


def test_a_job_with_nothing_priced_or_nothing_run() -> None:
    unpriced = replace(SPEC, machine=replace(SPEC.machine, accelerator_type="v99-8"))
    empty = Job("llm", unpriced, Status.PROVISIONING, T, T)
    books = job_accounting(empty, T + 30)
    assert books["cost"] is None and books["tiers"][0]["cost_usd"] is None
    assert books["seconds"] == {**dict.fromkeys(CATEGORIES, 0.0), "idle_s": 30.0} and books["goodput"] == 0.0
    rejected = Job("bad", None, Status.REJECTED, T, T)
    assert job_accounting(rejected, T + 30)["wall_s"] == 0.0


def test_every_order_of_the_whole_history_keeps_the_same_splits() -> None:
    """Beyond the orders above: every permutation of the three last words (stopped, failed, completed)."""
    words = [HISTORY[2], HISTORY[5], HISTORY[6]]
    body = [e for e in HISTORY if e not in words]
    for perm in itertools.permutations(words):
        job = play(body + list(perm))
        assert [a.goodput for a in job.attempts] == [A1, FULL], perm
