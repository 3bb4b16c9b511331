"""The preemption notice: SIGTERM (the 30 s ACPI shutdown on a Spot VM / TPU) or the metadata server's
`instance/preempted` turning TRUE. The watch only records the notice; the main loop acts on it between steps.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import urllib.request
from pathlib import Path
from types import FrameType

log = logging.getLogger("trainer")
POLL_S = 1.0


def on_gce() -> bool:
    """True on a Compute Engine VM or a TPU VM (the DMI product name says Google)."""
    try:
        return "Google" in Path("/sys/class/dmi/id/product_name").read_text()
    except OSError:
        return False


class PreemptionWatch:
    def __init__(self, metadata_url: str | None, poll_s: float = POLL_S) -> None:
        self.metadata_url = metadata_url
        self.poll_s = poll_s
        self.noticed_at: float | None = None  # time.monotonic() of the first notice
        self.source: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def noticed(self) -> bool:
        return self.noticed_at is not None

    def notice(self, source: str) -> None:
        if self.noticed_at is None:
            self.noticed_at, self.source = time.monotonic(), source
            log.warning("preemption notice (%s): finishing the step, saving, exiting", source)

    def start(self) -> PreemptionWatch:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        if self.metadata_url:
            self._thread = threading.Thread(target=self._poll, name="preemption-watch", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.notice("SIGTERM")

    def _poll(self) -> None:
        url = f"{self.metadata_url}/instance/preempted"
        request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
        warned = False
        while not self._stop.is_set() and not self.noticed:
            try:
                with urllib.request.urlopen(request, timeout=max(self.poll_s, 1.0)) as response:
                    if response.read(64).decode(errors="replace").strip().upper() == "TRUE":
                        self.notice("metadata instance/preempted")
                        return
            except OSError as e:
                if not warned:
                    log.warning("cannot read %s (%s); still watching for SIGTERM", url, e)
                    warned = True
            self._stop.wait(self.poll_s)
