"""Shared fixtures: the real local servers (fake-gcs-server, Pub/Sub emulator).

Tests that need one skip with a reason when it is missing, and fail instead
when RESPAWN_REQUIRE_EMULATORS=1 (CI).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from respawn.local.emulators import FakeGcs, PubSubEmulator, patched_env

REQUIRE = os.environ.get("RESPAWN_REQUIRE_EMULATORS") == "1"


def need(problem: str | None) -> None:
    if problem:
        if REQUIRE:
            pytest.fail(f"RESPAWN_REQUIRE_EMULATORS=1 but {problem}")
        pytest.skip(problem)


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
