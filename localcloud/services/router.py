"""The log router: Cloud Logging's sink for the local cloud.

Every LogEntry of the local cloud (trainer lifecycle lines, system events) is
evaluated against the same sink filter Terraform deploys
(`respawn/sink_filter.txt`); matches are published to the events topic as the
sink would publish them (the LogEntry JSON as the message data).
"""

from __future__ import annotations

import json
import threading
from typing import Any

from localcloud.services.bus import Bus
from localcloud.timeline import Timeline
from respawn_ops.logfilter import LogFilter, load_sink_filter


class LogRouter:
    def __init__(self, bus: Bus, topic: str, timeline: Timeline, log_filter: LogFilter | None = None) -> None:
        self.bus = bus
        self.topic = topic
        self.timeline = timeline
        self.filter = log_filter or LogFilter.parse(load_sink_filter())
        self._lock = threading.Lock()
        self.routed = 0
        self.dropped = 0

    def route(self, entry: dict[str, Any]) -> None:
        if not self.filter.matches(entry):
            with self._lock:
                self.dropped += 1
            return
        data = json.dumps(entry, sort_keys=True).encode()
        try:
            self.bus.publish(self.topic, data, {"logging.googleapis.com/timestamp": str(entry.get("timestamp", ""))})
        except Exception as e:  # the bus is closing (teardown): the entry is lost, as a sink's would be
            self.timeline.add("route_error", error=f"{type(e).__name__}: {e}", insert_id=entry.get("insertId"))
            return
        with self._lock:
            self.routed += 1
