"""Chaos for the local cloud: preemptions at fixed times or steps, or at a seeded mean time between interruptions.

`--preempt-at 40s,80s` counts from the moment the job message is published. At
each time the machine that is READY is preempted (with many jobs, one READY
machine drawn at random, seeded); when none is READY yet (the replacement is
still being created), the preemption waits for the next one that becomes READY.
`--preempt-at-step 250,550` preempts the READY machine whose trainer has reported
that training step (or a later one): the same run on a fast or a slow machine.
`--mtbi 60s` gives every machine a lifetime drawn from a seeded exponential
distribution, counted from the moment it becomes READY.
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Callable

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)?")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


class ChaosError(ValueError):
    """A chaos option that cannot be understood; str() names the option, the problem and what is allowed."""


def parse_duration(text: str, option: str) -> float:
    m = _DURATION.fullmatch(text.strip())
    if not m:
        raise ChaosError(
            f"{option}: {text!r} is not a duration; use a number with an optional unit ms, s, m or h (45s)"
        )
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_times(text: str, option: str = "--preempt-at") -> list[float]:
    times = [parse_duration(part, option) for part in text.split(",") if part.strip()]
    if not times:
        raise ChaosError(f"{option}: no time given; use a comma-separated list of durations (30s,75s)")
    return sorted(times)


def parse_steps(text: str, option: str = "--preempt-at-step") -> list[int]:
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts:
        raise ChaosError(f"{option}: no step given; use a comma-separated list of training steps (250,550)")
    for part in parts:
        if not part.isdigit() or int(part) < 1:
            raise ChaosError(f"{option}: {part!r} is not a step; use whole numbers of 1 or more (250,550)")
    return sorted(int(part) for part in parts)


def parse_stockout(text: str) -> tuple[str, int | None]:
    """`us-central1-a:2` -> the first 2 creates there fail; `us-central1-a` -> every create there fails."""
    zone, _, count = text.partition(":")
    if not re.fullmatch(r"[a-z]+-[a-z]+\d+-[a-z]", zone):
        raise ChaosError(f"--stockout: {zone!r} is not a zone; use ZONE[:COUNT] (us-central1-a:1)")
    if count and not count.isdigit():
        raise ChaosError(f"--stockout: count {count!r} is not a whole number; use ZONE[:COUNT] (us-central1-a:1)")
    return zone, int(count) if count else None


class Chaos:
    """Preempts machines on a schedule. `ready()` lists (machine, became_ready_at) of READY machines; `step_of(machine)`
    is the last training step its trainer reported (None before the first)."""

    def __init__(
        self,
        *,
        ready: Callable[[], list[tuple[str, float]]],
        preempt: Callable[[str], None],
        t0: float,
        at: list[float] | None = None,
        at_steps: list[int] | None = None,
        step_of: Callable[[str], int | None] = lambda name: None,
        mtbi: float | None = None,
        seed: int = 0,
        tick: float = 0.1,
    ) -> None:
        self._ready = ready
        self._preempt = preempt
        self._t0 = t0
        self._at = list(at or [])
        self._at_steps = list(at_steps or [])
        self._step_of = step_of
        self._mtbi = mtbi
        self._rng = random.Random(seed)
        self._pick = random.Random(f"pick-{seed}")  # its own stream: --mtbi draws do not depend on the picks
        self._deadlines: dict[str, float] = {}
        self._tick = tick
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos", daemon=True)

    def start(self) -> Chaos:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def due(self, now: float) -> list[str]:
        """Machines to preempt now (advances the schedule)."""
        live = self._ready()
        chosen: list[str] = []
        if self._at and now - self._t0 >= self._at[0] and live:
            self._at.pop(0)
            chosen.append(live[0][0] if len(live) == 1 else self._pick.choice(live)[0])
        if self._at_steps:
            reached = [name for name, _ in live if (self._step_of(name) or 0) >= self._at_steps[0]]
            if reached:
                self._at_steps.pop(0)
                if reached[0] not in chosen:
                    chosen.append(reached[0])
        if self._mtbi:
            for name, ready_at in live:
                if name not in self._deadlines:
                    self._deadlines[name] = ready_at + self._rng.expovariate(1.0 / self._mtbi)
                if now >= self._deadlines[name] and name not in chosen:
                    chosen.append(name)
        return chosen

    def _run(self) -> None:
        while not self._stop.wait(self._tick):
            for name in self.due(time.time()):
                self._preempt(name)
