"""SystemClock: the wall clock (seconds since the epoch)."""

from __future__ import annotations

import time


class SystemClock:
    def now(self) -> float:
        return time.time()
