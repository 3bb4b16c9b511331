"""Status messages: one small JSON message per status change of a job, for topic `respawn-status`.

("Notice" is the machine's preemption notice only; the wire format keeps its field and attribute names: `id`,
`notice_id`.) A message is built when a decision changes a job's status and is kept in the job record's outbox,
written by the same compare-and-set as the change itself; the handler holding the record's lease publishes it, then
clears the outbox. So a duplicate delivery of the event publishes nothing (the change is already recorded), and a
crash between the write and the publish leaves the message in the outbox for whichever handler settles the record
after the lease (a redelivery or the sweep). A crash after the publish and before the clear publishes it again:
every message carries a deterministic `id` for that case.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from respawn.jobs import Job

MAX_REASON_CHARS = 500


def status_message(old: Job | None, new: Job, now: float) -> dict[str, Any]:
    """The status message of `old` -> `new` (a change of status) decided at `now`: JSON-ready, a few hundred bytes."""
    old_status = old.status.value if old is not None else None
    at = dt.datetime.fromtimestamp(now, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    current = new.current
    reason = new.reason if len(new.reason) <= MAX_REASON_CHARS else new.reason[: MAX_REASON_CHARS - 3] + "..."
    where = f" (attempt {current.n}, {current.zone})" if current is not None else ""
    return {
        "id": f"{new.job_id}/{round(now * 1000)}/{new.status.value}",
        "job_id": new.job_id,
        "old_status": old_status,
        "new_status": new.status.value,
        "reason": reason,
        "attempt": current.n if current is not None else None,
        "zone": current.zone if current is not None else None,
        "counters": dict(new.counters.__dict__),
        "time": at,
        "text": f"respawn: job {new.job_id} {old_status or 'submitted'} -> {new.status.value}{where}: {reason}",
    }


def message_attributes(message: dict[str, Any]) -> dict[str, str]:
    """Pub/Sub attributes of a status message: what a subscription filter selects on (`attributes.status="FAILED"`)."""
    return {"job_id": str(message["job_id"]), "status": str(message["new_status"]), "notice_id": str(message["id"])}
