"""What a decision reads besides the record, the event and the time: decide's knobs (`Policy`), and the outlook.

A leaf of the core: it imports only the outlook's type.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from respawn.outlook import Outlook


@dataclass(frozen=True)
class Policy:
    backoff_base_s: float = 30.0  # wait after the first full walk of the zones without capacity
    backoff_max_s: float = 600.0  # cap of the exponential backoff (before jitter)
    jitter: float = 0.2  # the wait is scaled by a factor in [1 - jitter, 1 + jitter]
    stuck_creating_s: float = 900.0  # a machine CREATING this long is given up for the next zone
    lost_grace_s: float = 60.0  # a machine younger than this may not be listed yet: not lost
    seen_events_max: int = 256  # event ids remembered for de-duplication
    # A head start: a noticed machine is kept this long past its notice window before its replacement's trainer
    # starts (the two machines' clocks may differ by a little)
    drain_margin_s: float = 5.0
    # Seconds of the notice window and margin per real second: 1 in the cloud; a local cloud replaying real timings
    # faster (a real minute in a local second) makes the drain as much shorter
    time_scale: float = 1.0
    restart_cost_s: float = 300.0  # what an interruption costs before training resumes (create, boot, restore)
    # A fallback tier goes back to Spot only when the outlook expects Spot's best zone to run at least this long
    # without an interruption: with the default restart and checkpoint costs, 4 h keeps over 90% of Spot's time.
    spot_min_mtbi_s: float = 4 * 3600.0


@dataclass(frozen=True)
class Context:
    """What a decision reads besides the record, the event and the time: the knobs, and the outlook when the service
    has one (None: zones in list order, no back to Spot, exactly as before placement knew anything)."""

    policy: Policy
    outlook: Outlook | None = None


def backoff_s(job_id: str, capacity_round: int, policy: Policy) -> float:
    """min(base * 2^round, max), scaled by a jitter that is a pure function of (job_id, round)."""
    wait = min(policy.backoff_base_s * float(2 ** min(capacity_round, 40)), policy.backoff_max_s)
    digest = hashlib.sha256(f"{job_id}:{capacity_round}".encode()).digest()
    unit = int.from_bytes(digest[:8], "big") / 2**64  # [0, 1)
    return wait * (1 + policy.jitter * (2 * unit - 1))
