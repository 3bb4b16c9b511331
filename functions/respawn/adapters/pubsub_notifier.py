"""PubSubStatusNotifier: status messages published to a Pub/Sub topic (respawn-status) with google-cloud-pubsub.

One message per notice: the notice as compact JSON, with the attributes a
subscription filter can select on (`job_id`, `status`, `notice_id`). Each
publish waits for the server's message id, so a notice counts as sent only
once Pub/Sub has it. The client is made at the first notice (most events change
no status), and follows PUBSUB_EMULATOR_HOST like every Pub/Sub client.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from respawn.adapters.errors import classify
from respawn.ports import CapacityError, TransientError
from respawn.status_messages import message_attributes

PUBLISH_TIMEOUT_S = 20.0


class PubSubStatusNotifier:
    def __init__(self, project: str, topic: str, publisher: Any = None) -> None:
        self.topic = f"projects/{project}/topics/{topic}"
        self._publisher = publisher
        self._lock = threading.Lock()

    def _client(self) -> Any:
        with self._lock:
            if self._publisher is None:
                from google.cloud import pubsub_v1

                # One message per batch: a notice goes out at once, not after the batching delay.
                self._publisher = pubsub_v1.PublisherClient(
                    batch_settings=pubsub_v1.types.BatchSettings(max_messages=1)
                )
            return self._publisher

    def notify(self, notice: dict[str, Any]) -> None:
        data = json.dumps(notice, sort_keys=True, separators=(",", ":")).encode()
        try:
            future = self._client().publish(self.topic, data, timeout=PUBLISH_TIMEOUT_S, **message_attributes(notice))
            future.result(timeout=PUBLISH_TIMEOUT_S + 10)
        except Exception as e:
            error = classify(e, f"publishing to {self.topic}")
            if isinstance(error, CapacityError):  # "quota exceeded" on a topic is a rate, not a verdict
                raise TransientError(str(error)) from e
            raise error from e
