"""The preemption notice: SIGTERM (the 30 s ACPI shutdown on a Spot VM / TPU) or the metadata server's
`instance/preempted` turning TRUE. The watch only records the notice; the main loop acts on it between steps.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import urllib.request
from collections.abc import Callable
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


def leave_notice(path: str | None) -> None:
    """A host that stops on the notice, its own or a peer's (a slice stops whole), leaves the startup script's notice
    file (RESPAWN_NOTICE_FILE): its exit 0 is then `stopped`, not `completed` (docs/trainer-protocol.md)."""
    if path and not Path(path).exists():  # else its own notice: the shutdown script (root) left it already
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).touch()
        except OSError as e:
            log.warning("could not leave the notice file %s (%s)", path, e)


class PreemptionWatch:
    """`lead_s` (RESPAWN_NOTICE_LEAD_S): the metadata flag comes this long before the soft off (a Spot VM that asked
    for a longer notice), so it counts as the notice only that much later. SIGTERM counts at once, or `train_on(watch)`
    seconds later (a head start's handover, which may call notice() sooner)."""

    def __init__(
        self,
        metadata_url: str | None,
        poll_s: float = POLL_S,
        lead_s: float = 0.0,
        train_on: Callable[[PreemptionWatch], float] | None = None,
    ) -> None:
        self.metadata_url = metadata_url
        self.poll_s = poll_s
        self.lead_s = lead_s
        self.train_on = train_on
        self.noticed_at: float | None = None  # time.monotonic() of the notice (with a lead: when it is due)
        self.source: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def noticed(self) -> bool:
        return self.noticed_at is not None and self.noticed_at <= time.monotonic()

    def notice(self, source: str, after_s: float = 0.0) -> None:
        at = time.monotonic() + after_s
        if self.noticed_at is None or at < self.noticed_at:
            self.noticed_at, self.source = at, source
            if after_s:
                log.warning("preemption notice (%s): training on for %.1fs, then saving and exiting", source, after_s)
            else:
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
        self.notice("SIGTERM", self.train_on(self) if self.train_on and self.noticed_at is None else 0.0)

    def _poll(self) -> None:
        url = f"{self.metadata_url}/instance/preempted"
        request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
        warned = False
        while not self._stop.is_set() and self.noticed_at is None:
            try:
                with urllib.request.urlopen(request, timeout=max(self.poll_s, 1.0)) as response:
                    if response.read(64).decode(errors="replace").strip().upper() == "TRUE":
                        self.notice("metadata instance/preempted", self.lead_s)
                        return
            except OSError as e:
                if not warned:
                    log.warning("cannot read %s (%s); still watching for SIGTERM", url, e)
                    warned = True
            self._stop.wait(self.poll_s)
