"""The save policies one by one, their composition, and the save steps of whole attempts driven as Run drives them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from respawn_trainer.schedule import (
    AnySavePolicy,
    DecisionContext,
    FixedIntervalPolicy,
    InitialSavePolicy,
    LoopEndedPolicy,
    SaveSchedule,
    YoungDalyPolicy,
    save_policy,
    young_daly_in,
)

QUIET = DecisionContext(restored_step=0, save_costs_s=(), step_s=None, loop_ended=False)


def context(**changes: object) -> DecisionContext:
    return replace(QUIET, **changes)


def test_fixed_interval_saves_the_multiples_whatever_was_saved_before() -> None:
    policy = FixedIntervalPolicy(10)
    assert [s for s in range(1, 35) if policy.should_save(s, (), context=QUIET)] == [10, 20, 30]
    assert policy.should_save(20, (20,), context=QUIET)  # saving a step twice is the schedule's rule, not its


def test_initial_save_is_the_first_step_of_an_attempt() -> None:
    policy = InitialSavePolicy()
    assert policy.should_save(41, (), context=context(restored_step=40))
    assert not policy.should_save(42, (41,), context=context(restored_step=40))


def test_young_daly_waits_for_the_step_time_then_saves_every_tau_in_steps() -> None:
    policy = YoungDalyPolicy(mtbi_s=100.0)
    unmeasured = context(save_costs_s=(0.5,))
    assert policy.interval(unmeasured) is None and not policy.should_save(500, (41,), context=unmeasured)
    measured = context(save_costs_s=(0.5,), step_s=0.1)  # tau = sqrt(2 * 0.5 * 100) = 10 s = 100 steps
    assert policy.tau_s(measured) == pytest.approx(10.0) and policy.interval(measured) == 100
    assert not policy.should_save(140, (41,), context=measured) and policy.should_save(141, (41,), context=measured)
    assert policy.should_save(100, (), context=measured)  # no save yet: counted from step 0, where it began
    costlier = context(save_costs_s=(0.5, 1.5), step_s=0.1)  # the mean cost: 1 s, tau sqrt(200) s
    assert policy.interval(costlier) == round(200**0.5 / 0.1)


def test_loop_ended_saves_whatever_the_step() -> None:
    policy = LoopEndedPolicy()
    assert policy.should_save(47, (40,), context=context(loop_ended=True))
    assert not policy.should_save(47, (40,), context=QUIET)


def test_any_saves_when_one_policy_would_and_young_daly_is_found_inside() -> None:
    policy = AnySavePolicy((FixedIntervalPolicy(10), LoopEndedPolicy()))
    assert policy.should_save(20, (), context=QUIET) and policy.should_save(21, (), context=context(loop_ended=True))
    assert not policy.should_save(21, (), context=QUIET)
    assert not AnySavePolicy(()).should_save(10, (), context=context(loop_ended=True))
    assert young_daly_in(policy) is None
    assert young_daly_in(save_policy(None, mtbi_s=60.0)) == YoungDalyPolicy(60.0)
    assert young_daly_in(AnySavePolicy((AnySavePolicy((YoungDalyPolicy(5.0),)),))) == YoungDalyPolicy(5.0)


def drive(schedule: SaveSchedule, stop_at: int, cost_s: float, step_s: float) -> list[int]:
    """The steps an attempt saves, asking the schedule as Run does: after each step, then once the loop ends."""
    saved = []
    for step in range(schedule.restored_step + 1, stop_at + 1):
        if schedule.should_save(step):
            schedule, saved = schedule.saved(step, cost_s), [*saved, step]
        elif schedule.wants_step_time(step):
            schedule = schedule.measured(step_s)
    if schedule.should_save(stop_at, loop_ended=True):
        saved.append(stop_at)
    return saved


@pytest.mark.parametrize(
    ("every", "restored", "stop_at", "expected"),
    [
        (10, 0, 35, [10, 20, 30, 35]),  # the notice at step 35
        (10, 23, 60, [30, 40, 50, 60]),  # the job's end, a multiple: saved once, by finish()
        (10, 30, 30, []),  # restored at the end: nothing new to save
        # Young/Daly, MTBI 100 s, saves of 0.5 s, steps of 0.1 s: the first step, then every 100 steps.
        (None, 40, 300, [41, 141, 241, 300]),
        (None, 0, 4, [1, 4]),  # stopped before the step time was measured
    ],
)
def test_an_attempt_saves_these_steps(every: int | None, restored: int, stop_at: int, expected: list[int]) -> None:
    schedule = SaveSchedule(save_policy(every, mtbi_s=100.0), final_step=60 if every else 1000, restored_step=restored)
    assert drive(schedule, stop_at, cost_s=0.5, step_s=0.1) == expected
