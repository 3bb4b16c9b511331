"""The two Cloud Functions (Pub/Sub CloudEvents). Deploy with `gcloud functions deploy --source=functions`.

Both take the same path: unwrap the message, parse it into an event, let the
service handle it. `Retryable` (and a missing setting) raises so Pub/Sub
redelivers; anything else is logged as one structured error and acknowledged.
"""

from __future__ import annotations

import functions_framework
from cloudevents.http import CloudEvent

from respawn import parsing, service_log
from respawn.bootstrap import service_from_env
from respawn.deployment import Settings, SettingsError
from respawn.events import JobRejected
from respawn.service import Retryable

service_log.ensure_handler()  # the lines of a message dropped before a service is built reach stderr too


@functions_framework.cloud_event
def on_job_message(cloud_event: CloudEvent) -> None:
    """A job message from topic respawn-jobs: submit or cancel; a submit without `image` runs the deployment's trainer
    image of its machine's kind (RESPAWN_TRAINER_IMAGES)."""
    try:
        images = dict(Settings.from_env().trainer_images)
        event = parsing.job_event(parsing.message_from_cloudevent(cloud_event), images)
        if isinstance(event, JobRejected):
            service_log.dropped(f"job message rejected: {event.error}", job_id=event.job_id, message_id=event.event_id)
        service_from_env().handle(event)  # logs one line per handled event
    except (Retryable, SettingsError):
        raise
    except Exception as e:
        service_log.dropped(f"job message dropped: {type(e).__name__}: {e}", cloud_event_id=cloud_event["id"])


@functions_framework.cloud_event
def on_event(cloud_event: CloudEvent) -> None:
    """A LogEntry from the sink or a sweep tick, from topic respawn-events."""
    try:
        service_from_env().handle(parsing.events_event(parsing.message_from_cloudevent(cloud_event)))
    except (Retryable, SettingsError):
        raise
    except Exception as e:
        service_log.dropped(f"event dropped: {type(e).__name__}: {e}", cloud_event_id=cloud_event["id"])
