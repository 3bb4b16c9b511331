"""PubSubStatusNotifier against the official Pub/Sub emulator, with google-cloud-pubsub."""

from __future__ import annotations

import json
import uuid

import pytest
from conftest import pull, topic_with_subscription

from localcloud.services.emulators import PubSubEmulator
from respawn.adapters.pubsub_notifier import PubSubStatusNotifier
from respawn.jobs import Attempt, Counters, Job, Status
from respawn.ports import PermanentError
from respawn.status_messages import status_message

pytestmark = pytest.mark.emulator


def test_a_notice_is_one_message_with_attributes_to_filter_on(pubsub_emulator: PubSubEmulator) -> None:
    topic, subscription = topic_with_subscription(pubsub_emulator.project, "respawn-status")
    old = Job("llm", None, Status.RUNNING, 1.0, 1.0)
    attempt = Attempt(2, "us-central1-a", "llm-a2", 5.0)
    new = Job("llm", None, Status.RECOVERING, 1.0, 9.0, "preempted", (attempt,), Counters(preemptions=1))
    notice = status_message(old, new, 1_767_225_600.25)

    PubSubStatusNotifier(pubsub_emulator.project, topic).notify(notice)

    [message] = pull(subscription)
    assert json.loads(message.data) == notice
    assert notice["time"] == "2026-01-01T00:00:00.250Z" and len(message.data) < 600
    assert (notice["old_status"], notice["new_status"], notice["attempt"], notice["zone"]) == (
        "RUNNING",
        "RECOVERING",
        2,
        "us-central1-a",
    )
    assert dict(message.attributes) == {"job_id": "llm", "status": "RECOVERING", "notice_id": notice["id"]}


def test_a_missing_topic_is_a_permanent_error_naming_it(pubsub_emulator: PubSubEmulator) -> None:
    notifier = PubSubStatusNotifier(pubsub_emulator.project, f"missing-{uuid.uuid4().hex[:8]}")
    notice = status_message(None, Job("llm", None, Status.REJECTED, 1.0, 1.0, "bad zones"), 1.0)
    with pytest.raises(PermanentError, match=f"publishing to {notifier.topic}"):
        notifier.notify(notice)
