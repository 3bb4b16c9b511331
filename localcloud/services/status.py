"""The local cloud's subscriber of topic respawn-status: every status notice into `status.jsonl` of the run.

The functions publish notices to the topic on the Pub/Sub emulator as deployed
(PubSubStatusNotifier); this creates the topic and a pull subscription, as
Terraform and an operator would, and appends each notice received, once per
Pub/Sub message id (a subscription may deliver a message again; a notice that
respawn published twice is two messages and two lines).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

STATUS_TOPIC = "respawn-status"


class StatusRecorder:
    def __init__(self, project: str, path: Path, topic: str = STATUS_TOPIC) -> None:
        from google.cloud import pubsub_v1

        self.path = path
        self._notices: list[dict[str, Any]] = []
        self._seen: set[str] = set()
        self._cv = threading.Condition()
        self._file = path.open("a")
        publisher = pubsub_v1.PublisherClient()
        self._subscriber = pubsub_v1.SubscriberClient()
        topic_path = publisher.create_topic(name=publisher.topic_path(project, topic)).name
        subscription = self._subscriber.subscription_path(project, f"{topic}-local")
        self._subscriber.create_subscription(name=subscription, topic=topic_path)
        self._future = self._subscriber.subscribe(subscription, self._received)

    def _received(self, message: Any) -> None:
        with self._cv:
            if message.message_id not in self._seen:
                self._seen.add(message.message_id)
                notice = {**json.loads(message.data), "message_id": message.message_id}
                self._notices.append(notice)
                self._file.write(json.dumps(notice, sort_keys=True) + "\n")
                self._file.flush()
                self._cv.notify_all()
        message.ack()

    def notices(self) -> list[dict[str, Any]]:
        with self._cv:
            return list(self._notices)

    def wait_for(self, done: Callable[[list[dict[str, Any]]], bool], timeout_s: float) -> bool:
        """Wait until `done(notices)` holds (True) or the timeout (False)."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while not done(self._notices):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
            return True

    def close(self) -> None:
        self._future.cancel()
        with contextlib.suppress(Exception):  # the streaming pull ends with its cancellation
            self._future.result(timeout=5)
        self._subscriber.close()
        with self._cv:
            self._file.close()
