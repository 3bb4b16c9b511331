"""respawn's one logging mechanism: structured JSON lines through the `respawn.service` logger.

One line per handled event, one per failed action or dropped status message, and the entry points' own (a job
message rejected, an event dropped). Cloud Logging reads each line as a structured entry. A line never includes the
job's env, args or image.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import sys

from respawn.actions import Action, action_to_dict
from respawn.events import Event, JobSubmitted
from respawn.outcome import Outcome, Result

log = logging.getLogger("respawn.service")


def handled(event: Event, outcome: Outcome) -> None:
    _event_line(logging.INFO, event, outcome.result, outcome.job_ids, outcome.actions)


def retrying(event: Event, reason: str) -> None:
    """The event is handed back for redelivery: a store or API hiccup, or another delivery holds the job's lease."""
    _event_line(logging.WARNING, event, Result.RETRY, (), (), reason=reason)


def error(job_id: str, message: str) -> None:
    """An action or a status message that failed for good; the job goes on without it."""
    dropped(message, job_id=job_id)


def dropped(message: str, **fields: object) -> None:
    """An error line: what was dropped or rejected, with the fields that say which (None fields left out)."""
    entry = {"severity": "ERROR", "message": message, **{k: v for k, v in fields.items() if v is not None}}
    log.error(json.dumps(entry, default=str))


def ensure_handler() -> None:
    """Cloud Functions read JSON lines on stderr; add a handler only when nobody configured logging.

    A line is its message alone, so the record need not carry where it was logged from, nor the thread's or the
    process's name: the logging HOWTO's "Optimization" switches, which take a line from about 31 to 20 us."""
    package = logging.getLogger("respawn")
    if not package.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        package.addHandler(handler)
        package.setLevel(logging.INFO)
        logging._srcfile = None  # type: ignore[attr-defined]
        logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False


@functools.cache
def _snake_case(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _event_line(
    level: int, event: Event, result: Result, job_ids: tuple[str, ...], actions: tuple[Action, ...], **extra: str
) -> None:
    job_id = getattr(event, "job_id", None) or (event.spec.job_id if isinstance(event, JobSubmitted) else None)
    kind = _snake_case(type(event).__name__)
    entry = {
        "severity": logging.getLevelName(level),
        "message": f"{kind} {result}",
        "event": kind,
        "event_id": getattr(event, "event_id", None),
        "job_id": job_id,
        "job_ids": list(job_ids),
        "result": result,
        "actions": [action_to_dict(a) for a in actions],
        **extra,
    }
    log.log(level, json.dumps({k: v for k, v in entry.items() if v is not None}))
