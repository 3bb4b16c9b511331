"""Pub/Sub for the local cloud: topics whose messages are pushed over HTTP to an endpoint.

`EmulatorBus` uses the official Pub/Sub emulator with real push subscriptions.
`InProcessBus` is the fallback when the emulator cannot run: the same push body
(`{"message": {...}, "subscription": ...}`) POSTed to the same endpoints, with
the same at-least-once semantics (a non-2xx answer or a connection error is
redelivered later with exponential backoff).

Both deliver every message `copies` times concurrently (`--duplicate-deliveries`):
the emulator through `copies` push subscriptions on each topic, the fallback by
posting each delivery `copies` times at once.
"""

from __future__ import annotations

import base64
import datetime as dt
import heapq
import itertools
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import requests

ACK_DEADLINE_S = 60
MIN_BACKOFF_S = 0.1
MAX_BACKOFF_S = 10.0


@dataclass(frozen=True)
class Delivery:
    """One push of the in-process bus, as its observer sees it (times are seconds since the epoch)."""

    topic: str
    body: Mapping[str, object]  # the push body: {"message": {...}, "subscription": ...}
    due: float  # when it was due: its publication, or the end of its redelivery backoff
    sent: float  # the POST started (a free pusher took it)
    done: float  # the answer arrived, or the connection failed
    status: int  # the HTTP status; 0 for a connection error

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


class Bus(Protocol):
    published: list[tuple[str, str]]  # (topic, message id) of every message published, in order

    def publish(self, topic: str, data: bytes, attributes: Mapping[str, str] | None = None) -> str:
        """Publish one message; returns its message id."""

    def close(self) -> None: ...


def push_endpoint(base_url: str, project: str, topic: str) -> str:
    """Push to /projects/P/topics/T so functions-framework gives the CloudEvent the topic as its source."""
    return f"{base_url}/projects/{project}/topics/{topic}"


@dataclass(frozen=True)
class PushPolicy:
    """A push subscription's ack deadline and redelivery backoff, as Terraform sets them (infra/terraform/functions.tf,
    google_pubsub_subscription.push). No backoff: the emulator redelivers a failed push at once."""

    ack_deadline_s: int = ACK_DEADLINE_S
    backoff_s: tuple[float, float] | None = None  # (minimum, maximum)

    def subscription(self) -> dict[str, object]:
        """The fields of a subscription request."""
        fields: dict[str, object] = {"ack_deadline_seconds": self.ack_deadline_s}
        if self.backoff_s is not None:
            low, high = self.backoff_s
            backoff = {"minimum_backoff": dt.timedelta(seconds=low), "maximum_backoff": dt.timedelta(seconds=high)}
            fields["retry_policy"] = backoff
        return fields


class EmulatorBus:
    """Topics and push subscriptions on the official emulator (PUBSUB_EMULATOR_HOST must be set)."""

    def __init__(
        self, project: str, endpoints: Mapping[str, str], copies: int = 1, policy: PushPolicy | None = None
    ) -> None:
        from google.cloud import pubsub_v1

        self.project = project
        self.published: list[tuple[str, str]] = []
        self.publisher = pubsub_v1.PublisherClient()
        self.subscriber = pubsub_v1.SubscriberClient()
        for topic, endpoint in endpoints.items():
            topic_path = self.publisher.topic_path(project, topic)
            self.publisher.create_topic(name=topic_path)
            for i in range(copies):
                sub = self.subscriber.subscription_path(project, f"{topic}-push-{i}")
                self.subscriber.create_subscription(
                    request={
                        "name": sub,
                        "topic": topic_path,
                        "push_config": {"push_endpoint": endpoint},
                        **(policy or PushPolicy()).subscription(),
                    }
                )

    def publish(self, topic: str, data: bytes, attributes: Mapping[str, str] | None = None) -> str:
        future = self.publisher.publish(self.publisher.topic_path(self.project, topic), data, **dict(attributes or {}))
        message_id = str(future.result(timeout=30))
        self.published.append((topic, message_id))
        return message_id

    def close(self) -> None:
        self.publisher.stop()
        self.subscriber.close()


class InProcessBus:
    """At-least-once push delivery without the emulator: POST, and redeliver with backoff until a 2xx."""

    def __init__(
        self,
        project: str,
        endpoints: Mapping[str, str],
        copies: int = 1,
        workers: int = 32,
        on_delivery: Callable[[Delivery], None] | None = None,
    ) -> None:
        self.project = project
        self.published: list[tuple[str, str]] = []
        self.on_delivery = on_delivery
        self.endpoints = dict(endpoints)
        self.copies = copies
        self._ids = itertools.count(1)
        self._seq = itertools.count()
        self._due: list[tuple[float, int, str, Mapping[str, object], float, float]] = []
        self._cv = threading.Condition()
        self._closed = False
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="push")
        self._scheduler = threading.Thread(target=self._run, name="push-scheduler", daemon=True)
        self._scheduler.start()

    def publish(self, topic: str, data: bytes, attributes: Mapping[str, str] | None = None) -> str:
        if topic not in self.endpoints:
            raise KeyError(f"topic {topic!r} does not exist (known: {', '.join(sorted(self.endpoints))})")
        message_id = str(next(self._ids))
        self.published.append((topic, message_id))
        now = dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z")
        message = {
            "data": base64.b64encode(data).decode(),
            "attributes": dict(attributes or {}),
            "messageId": message_id,
            "message_id": message_id,
            "publishTime": now,
            "publish_time": now,
        }
        for i in range(self.copies):
            body = {"message": message, "subscription": f"projects/{self.project}/subscriptions/{topic}-push-{i}"}
            self._schedule(0.0, topic, body, MIN_BACKOFF_S)
        return message_id

    def _schedule(self, delay: float, topic: str, body: Mapping[str, object], backoff: float) -> None:
        with self._cv:
            due = (time.monotonic() + delay, next(self._seq), topic, body, backoff, time.time() + delay)
            heapq.heappush(self._due, due)
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._closed and (not self._due or self._due[0][0] > time.monotonic()):
                    self._cv.wait(timeout=(self._due[0][0] - time.monotonic()) if self._due else None)
                if self._closed:
                    return
                _, _, topic, body, backoff, due = heapq.heappop(self._due)
            self._pool.submit(self._deliver, topic, body, backoff, due)

    def _deliver(self, topic: str, body: Mapping[str, object], backoff: float, due: float) -> None:
        sent = time.time()
        try:
            status = requests.post(self.endpoints[topic], json=body, timeout=ACK_DEADLINE_S).status_code
        except requests.RequestException:
            status = 0
        ok = 200 <= status < 300
        if self.on_delivery is not None:
            self.on_delivery(Delivery(topic, body, due, sent, time.time(), status))
        if not ok and not self._closed:
            self._schedule(backoff, topic, body, min(backoff * 2, MAX_BACKOFF_S))

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._scheduler.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)
