"""Shared fixtures: the real local servers (fake-gcs-server, Pub/Sub emulator).

Tests that need one skip with a reason when it is missing, and fail instead
when RESPAWN_REQUIRE_EMULATORS=1 (CI).

Every local run of the session (all pytest-xdist workers) keeps its reference runs in one
directory (RESPAWN_REFERENCE_CACHE), so the uninterrupted run of the same args, env, slice
shape and trainer source is computed once, not once per test's fresh workdir. The files
with the most slow tests (whole local-cloud jobs) are handed out first, with the files that
mostly wait between them, then the files with the most tests, so that a parallel run ends on
short files that keep both cores busy rather than on a long one.
"""

from __future__ import annotations

import os
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from localcloud.services.emulators import FakeGcs, PubSubEmulator, patched_env

if TYPE_CHECKING:
    from google.cloud.pubsub_v1.types import PubsubMessage


REQUIRE = os.environ.get("RESPAWN_REQUIRE_EMULATORS") == "1"


def bucket_dir(path: Path) -> str:
    """A local directory standing for a checkpoint bucket: writable by every machine's trainer whatever its uid (the
    local cloud runs respawn's trainer image as uid 10001, as a VM does)."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o777)
    return str(path)


def need(problem: str | None) -> None:
    if problem:
        if REQUIRE:
            pytest.fail(f"RESPAWN_REQUIRE_EMULATORS=1 but {problem}")
        pytest.skip(problem)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The order the workers take the files in (`--dist loadfile --no-loadscope-reorder`, pyproject.toml): the files
    with slow tests, most first, and after the first two of them, one file that mostly waits (`waits`: scripts'
    sleeps, the local cloud's timers) after each, so that a worker waiting out a clock leaves its core to a file
    that computes; then the files of short tests, most tests first, so that the run ends on short files that keep
    both cores busy. Within a group, a stable sort: otherwise in collection order."""
    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    tests = Counter(item.path for item in items)
    waits = {item.path for item in items if item.get_closest_marker("waits")}
    by_size = sorted(tests, key=lambda path: (-slow[path], -tests[path]))
    computing = [path for path in by_size if slow[path] and path not in waits]
    waiting = [path for path in by_size if path in waits]
    order = computing[:2]
    for path in computing[2:]:
        order += [path, *waiting[:1]]
        waiting = waiting[1:]
    order += waiting + [path for path in by_size if not slow[path] and path not in waits]
    place = {path: n for n, path in enumerate(order)}
    items.sort(key=lambda item: place[item.path])


@pytest.fixture(scope="session", autouse=True)
def shared_reference_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One reference cache and one compilation cache for the local runs of the whole session, under the directory
    the xdist workers' temporary directories share (the session's own without xdist). References are keyed by what
    they compute from and written whole; programs are shared as a job's machines share its gs:// cache."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    cache, programs = root / "reference-cache", root / "compile-cache"
    cache.mkdir(exist_ok=True)
    with patched_env({"RESPAWN_REFERENCE_CACHE": str(cache), "RESPAWN_LOCAL_COMPILE_CACHE": str(programs)}):
        yield cache


@pytest.fixture(scope="session")
def fake_gcs() -> Iterator[FakeGcs]:
    """One fake-gcs-server for the session; STORAGE_EMULATOR_HOST/TENSORSTORE_GCS_HTTP_URL point at it."""
    need(FakeGcs.missing())
    with FakeGcs() as server, patched_env(server.env()):
        yield server


@pytest.fixture
def bucket(fake_gcs: FakeGcs) -> str:
    """A fresh, empty bucket on fake-gcs-server."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    fake_gcs.create_bucket(name)
    return name


@pytest.fixture(scope="session")
def pubsub_emulator() -> Iterator[PubSubEmulator]:
    need(PubSubEmulator.missing())
    with PubSubEmulator() as emulator, patched_env(emulator.env()):
        yield emulator


def topic_with_subscription(project: str, prefix: str) -> tuple[str, str]:
    """A fresh topic on the emulator and a pull subscription on it: (topic id, subscription path)."""
    from google.cloud import pubsub_v1

    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    topic_path = publisher.create_topic(name=publisher.topic_path(project, topic)).name
    sub = subscriber.create_subscription(name=subscriber.subscription_path(project, topic + "-pull"), topic=topic_path)
    return topic, sub.name


def pull(subscription: str) -> list[PubsubMessage]:
    """The messages waiting on a pull subscription (acknowledged)."""
    from google.cloud import pubsub_v1

    subscriber = pubsub_v1.SubscriberClient()
    response = subscriber.pull(subscription=subscription, max_messages=100, timeout=30)
    if response.received_messages:
        subscriber.acknowledge(subscription=subscription, ack_ids=[r.ack_id for r in response.received_messages])
    return [r.message for r in response.received_messages]
