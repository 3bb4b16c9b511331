"""When to save: every N steps, or `auto` by Young/Daly, tau = sqrt(2 * save_cost * MTBI).

In auto mode the first step of an attempt is saved to measure the save cost (its blocking time);
the next MEASURE_STEPS steps are timed, and the interval in steps is tau over the step time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class SaveDone:
    """A save that became durable: training was blocked blocking_s; it took total_s to commit."""

    step: int
    blocking_s: float
    total_s: float


MEASURE_STEPS = 5


def young_daly_s(save_cost_s: float, mtbi_s: float) -> float:
    return math.sqrt(2.0 * save_cost_s * mtbi_s)


def interval_steps(tau_s: float, step_s: float) -> int:
    return max(1, round(tau_s / max(step_s, 1e-9)))


@dataclass
class Schedule:
    fixed: int | None  # --checkpoint-every N, or None for auto
    last_saved: int
    save_cost_s: float | None = None  # auto: blocking time of this attempt's first save
    every: int | None = None  # auto: the chosen interval in steps

    def due(self, step: int) -> bool:
        if self.fixed is not None:
            return step % self.fixed == 0
        if self.save_cost_s is None:
            return True  # auto: save the attempt's first step to measure the save cost
        return self.every is not None and step - self.last_saved >= self.every

    def saved(self, step: int, blocking_s: float) -> None:
        self.last_saved = step
        if self.save_cost_s is None:
            self.save_cost_s = blocking_s

    def measuring(self, step: int) -> bool:
        """auto: enough steps since the first save to time them and fix the interval."""
        return (
            self.fixed is None
            and self.every is None
            and self.save_cost_s is not None
            and (step - self.last_saved >= MEASURE_STEPS)
        )

    def measure(self, step_s: float, mtbi_s: float) -> tuple[int, float]:
        """Fix the auto interval; returns (steps, tau seconds)."""
        assert self.save_cost_s is not None
        tau = young_daly_s(self.save_cost_s, mtbi_s)
        self.every = interval_steps(tau, step_s)
        return self.every, tau
