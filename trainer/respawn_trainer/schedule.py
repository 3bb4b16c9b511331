"""When to save: tiny policies behind one decision, `SaveSchedule.should_save(step)`.

Every N steps is `FixedIntervalPolicy`. `auto` is Young/Daly, tau = sqrt(2 * save_cost * MTBI): the attempt's
first step is saved to measure the save cost, the next MEASURE_STEPS steps are timed, and the interval in steps
is tau over the step time; each later save refines the cost (the mean of the attempt's saves). Either way the
attempt's last step (the job's end, or the preemption notice) is saved once the loop ends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Protocol

MEASURE_STEPS = 5


@dataclass(frozen=True)
class SaveDone:
    """A save that became durable: training was blocked blocking_s; it took total_s to commit."""

    step: int
    blocking_s: float
    total_s: float


def young_daly_s(save_cost_s: float, mtbi_s: float) -> float:
    return math.sqrt(2.0 * save_cost_s * mtbi_s)


def interval_steps(tau_s: float, step_s: float) -> int:
    return max(1, round(tau_s / max(step_s, 1e-9)))


@dataclass(frozen=True)
class DecisionContext:
    """What the policies may look at besides the step and this attempt's saved steps."""

    restored_step: int  # where the attempt began (already durable)
    save_costs_s: tuple[float, ...]  # training blocked by each of this attempt's saves
    step_s: float | None  # measured seconds per step; None until measured
    loop_ended: bool  # the loop is over (its steps done, or the notice): the attempt's last chance to save

    @property
    def save_cost_s(self) -> float:
        return sum(self.save_costs_s) / len(self.save_costs_s) if self.save_costs_s else 0.0


class SavePolicy(Protocol):
    def should_save(self, step: int, previous_steps: tuple[int, ...], *, context: DecisionContext) -> bool: ...


@dataclass(frozen=True)
class FixedIntervalPolicy:
    """`--checkpoint-every N`: the multiples of N, whatever step the attempt began at."""

    interval: int

    def should_save(self, step: int, previous_steps: tuple[int, ...], *, context: DecisionContext) -> bool:
        return step % self.interval == 0


@dataclass(frozen=True)
class InitialSavePolicy:
    """The attempt's first step: its save measures the save cost that Young/Daly needs."""

    def should_save(self, step: int, previous_steps: tuple[int, ...], *, context: DecisionContext) -> bool:
        return not previous_steps


@dataclass(frozen=True)
class YoungDalyPolicy:
    """Every tau = sqrt(2 * save_cost * mtbi_s) seconds, in steps of the measured step time."""

    mtbi_s: float

    def tau_s(self, context: DecisionContext) -> float:
        return young_daly_s(context.save_cost_s, self.mtbi_s)

    def interval(self, context: DecisionContext) -> int | None:
        """None until the step time is measured."""
        return None if context.step_s is None else interval_steps(self.tau_s(context), context.step_s)

    def should_save(self, step: int, previous_steps: tuple[int, ...], *, context: DecisionContext) -> bool:
        interval = self.interval(context)
        last = previous_steps[-1] if previous_steps else context.restored_step
        return interval is not None and step - last >= interval


@dataclass(frozen=True)
class LoopEndedPolicy:
    """The loop ended (steps done, or the preemption notice agreed by every host): save what was trained."""

    def should_save(self, step: int, previous_steps: tuple[int, ...], *, context: DecisionContext) -> bool:
        return context.loop_ended


@dataclass(frozen=True)
class AnySavePolicy:
    """Save when any of `policies` would."""

    policies: tuple[SavePolicy, ...]

    def should_save(self, step: int, previous_steps: tuple[int, ...], *, context: DecisionContext) -> bool:
        return any(p.should_save(step, previous_steps, context=context) for p in self.policies)


def save_policy(every: int | None, mtbi_s: float) -> SavePolicy:
    """`every` N steps, or None for Young/Daly from the measured save cost and `mtbi_s`; the loop's end always."""
    if every is not None:
        return AnySavePolicy((FixedIntervalPolicy(every), LoopEndedPolicy()))
    return AnySavePolicy((InitialSavePolicy(), YoungDalyPolicy(mtbi_s), LoopEndedPolicy()))


def young_daly_in(policy: SavePolicy) -> YoungDalyPolicy | None:
    """The Young/Daly part of `policy`: it needs the hosts' agreed save costs and a measured step time."""
    if isinstance(policy, YoungDalyPolicy):
        return policy
    if isinstance(policy, AnySavePolicy):
        return next((found for p in policy.policies if (found := young_daly_in(p)) is not None), None)
    return None


@dataclass(frozen=True)
class SaveSchedule:
    """One attempt's save decisions: the policy and what the attempt has measured so far."""

    policy: SavePolicy
    final_step: int  # the job's last step: saved once the loop ends, never on schedule before
    restored_step: int = 0
    saved_steps: tuple[int, ...] = ()
    save_costs_s: tuple[float, ...] = ()
    step_s: float | None = None

    @property
    def last_saved(self) -> int:
        return self.saved_steps[-1] if self.saved_steps else self.restored_step

    @property
    def young_daly(self) -> YoungDalyPolicy | None:
        return young_daly_in(self.policy)

    def context(self, *, loop_ended: bool = False) -> DecisionContext:
        return DecisionContext(self.restored_step, self.save_costs_s, self.step_s, loop_ended)

    def should_save(self, step: int, *, loop_ended: bool = False) -> bool:
        """The one decision: a step is saved at most once, and the final step only when the loop has ended."""
        if step <= self.last_saved or (step >= self.final_step and not loop_ended):
            return False
        return self.policy.should_save(step, self.saved_steps, context=self.context(loop_ended=loop_ended))

    def saved(self, step: int, blocking_s: float) -> SaveSchedule:
        return replace(self, saved_steps=(*self.saved_steps, step), save_costs_s=(*self.save_costs_s, blocking_s))

    def wants_step_time(self, step: int) -> bool:
        """Young/Daly: MEASURE_STEPS steps timed since the attempt's first save, and no step time yet."""
        return (
            self.young_daly is not None
            and self.step_s is None
            and bool(self.saved_steps)
            and step - self.last_saved >= MEASURE_STEPS
        )

    def measured(self, step_s: float) -> SaveSchedule:
        return replace(self, step_s=step_s)

    def interval(self) -> int | None:
        """Young/Daly's current interval in steps; None before the step time is measured, or with a fixed one."""
        young_daly = self.young_daly
        return None if young_daly is None else young_daly.interval(self.context())
