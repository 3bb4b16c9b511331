"""When to save: every N steps, or `auto` by Young/Daly, tau = sqrt(2 * save_cost * MTBI).

In auto mode the first step of an attempt is saved to measure the save cost (its blocking time);
the next MEASURE_STEPS steps are timed, and the interval in steps is tau over the step time. Each
later save refines the cost (the mean blocking time of the attempt's saves), and so the interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


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
    mtbi_s: float = 3600.0
    costs: list[float] = field(default_factory=list)  # auto: blocking seconds of this attempt's saves
    step_s: float | None = None  # auto: measured seconds per step
    every: int | None = None  # auto: the chosen interval in steps

    @property
    def save_cost_s(self) -> float:
        return sum(self.costs) / len(self.costs) if self.costs else 0.0

    def due(self, step: int) -> bool:
        if self.fixed is not None:
            return step % self.fixed == 0
        if not self.costs:
            return True  # auto: save the attempt's first step to measure the save cost
        return self.every is not None and step - self.last_saved >= self.every

    def saved(self, step: int, blocking_s: float) -> None:
        """Record a save; in auto mode every save refines the cost and so the interval."""
        self.last_saved = step
        if self.fixed is None:
            self.costs.append(blocking_s)
            if self.step_s is not None:
                self._choose()

    def measuring(self, step: int) -> bool:
        """auto: enough steps since the first save to time them and fix the interval."""
        return (
            self.fixed is None and self.step_s is None and bool(self.costs) and step - self.last_saved >= MEASURE_STEPS
        )

    def measure(self, step_s: float) -> None:
        self.step_s = step_s
        self._choose()

    def tau_s(self) -> float:
        return young_daly_s(self.save_cost_s, self.mtbi_s)

    def _choose(self) -> None:
        assert self.step_s is not None
        self.every = interval_steps(self.tau_s(), self.step_s)
