"""Cloud Scheduler for the local cloud: a sweep tick on the events topic every few seconds."""

from __future__ import annotations

import json
import threading

from localcloud.services.bus import Bus

SWEEP_TICK = json.dumps({"kind": "sweep_tick"}).encode()


class SweepTicker:
    def __init__(self, bus: Bus, topic: str, every_s: float) -> None:
        self.bus = bus
        self.topic = topic
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sweep-ticker", daemon=True)

    def start(self) -> SweepTicker:
        if self.every_s > 0:
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.bus.publish(self.topic, SWEEP_TICK)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
