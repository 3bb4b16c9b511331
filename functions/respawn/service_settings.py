"""The service's own knobs: how it holds records and leases, which `decide` never reads."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServiceSettings:
    lease_s: float = 300.0  # how long persisted intent belongs to the handler that wrote it
    max_conflicts: int = 8  # compare-and-set retries of one handler before it asks for redelivery
    cached_records: int = 4096  # records a service keeps between events (a hint; every write is compare-and-set)
    # how long after the sweep first built the live index it reads every record still (the first sweep after it does
    # once more, and completes the index): longer than a delivery of the code before the index can take (a function's
    # timeout, at most 540 s)
    index_settle_s: float = 900.0
