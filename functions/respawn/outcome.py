"""What handling an event came to, and the errors that ask Pub/Sub to deliver it again."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from respawn.actions import Action


class Result(StrEnum):
    """The result of one handled event, as the log line and the tests name it (a `str`: `result == "applied"`)."""

    APPLIED = "applied"  # the record changed, or the machines were acted on
    DUPLICATE = "duplicate"  # the event was recorded before (or a submit of a job that exists)
    STALE = "stale"  # the event names an attempt older than the job's current one
    IGNORED = "ignored"  # nothing to do: the event changes nothing
    REJECTED = "rejected"  # the job message failed validation
    RETRY = "retry"  # a store or API hiccup: Pub/Sub delivers the event again (log lines only)


@dataclass(frozen=True)
class Outcome:
    result: Result
    job_ids: tuple[str, ...] = ()
    actions: tuple[Action, ...] = ()


class Retryable(Exception):
    """Raise to the entry point so Pub/Sub redelivers the message later."""


class InFlight(Retryable):
    """Another delivery holds the job's intent lease."""
