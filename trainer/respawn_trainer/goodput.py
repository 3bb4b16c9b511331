"""Where an attempt's wall time went, in ml-goodput-measurement's categories.

startup (process start to the first step ready: imports, init, compile), restore (reading the checkpoint),
productive (steps whose results are kept by a checkpoint or by completion), checkpoint (time training was
blocked by saves), input (the loop waiting for its data iterator, through `Run.data`), wasted (steps computed after
the last save when the attempt fails). total is wall time.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field


def process_started() -> float:
    """time.monotonic() at which this process started (Linux /proc), else now."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
        return time.monotonic() - max(age, 0.0)
    except (OSError, ValueError, IndexError, AttributeError):
        return time.monotonic()


@dataclass
class Goodput:
    started: float = field(default_factory=time.monotonic)  # process start (monotonic)
    startup_s: float = 0.0
    restore_s: float = 0.0
    checkpoint_s: float = 0.0
    kept_steps_s: float = 0.0
    unsaved_steps_s: float = 0.0
    input_s: float = 0.0
    _input_since_step: float = 0.0

    def waited_for_input(self, seconds: float) -> None:
        self.input_s += seconds
        self._input_since_step += seconds

    def steps(self, seconds: float) -> None:
        """A step's wall time; the part of it spent waiting for input is input_s, not training."""
        self.unsaved_steps_s += max(0.0, seconds - self._input_since_step)
        self._input_since_step = 0.0

    def saved(self, blocking_s: float) -> None:
        """A save of everything trained so far has started: those steps are kept."""
        self.kept_steps_s += self.unsaved_steps_s
        self.unsaved_steps_s = 0.0
        self.checkpoint_s += blocking_s

    def summary(self, lost: bool = False, now: float | None = None) -> dict[str, float]:
        """lost: the attempt ends without saving its last steps (failure), so they count as wasted."""
        productive = self.kept_steps_s + (0.0 if lost else self.unsaved_steps_s)
        return {
            "startup_s": round(self.startup_s, 3),
            "restore_s": round(self.restore_s, 3),
            "productive_s": round(productive, 3),
            "checkpoint_s": round(self.checkpoint_s, 3),
            "input_s": round(self.input_s, 3),
            "wasted_s": round(self.unsaved_steps_s if lost else 0.0, 3),
            "total_s": round((now if now is not None else time.monotonic()) - self.started, 3),
        }
