"""The local metadata server's ETags and hanging GET, over real HTTP, as Google's page describes them
(https://cloud.google.com/compute/docs/metadata/querying-metadata#waitforchange): the wait a machine's startup script
learns a new world by (docs/design/several-slices.md, "Telling the machines")."""

from __future__ import annotations

import contextlib
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from localcloud.machines.machine_host import MetadataServer

pytestmark = pytest.mark.waits

KEY = "respawn-world"


@pytest.fixture
def server() -> Iterator[MetadataServer]:
    s = MetadataServer("proj", {KEY: '{"version": 1}', "agent-worker-number": "0"})
    yield s
    s.close()


def get(server: MetadataServer, path: str, timeout: float = 10) -> tuple[int, str, str | None, float]:
    """(status, body, ETag, seconds it took) of a GET of /computeMetadata/v1/`path`."""
    url = f"http://{server.host}/computeMetadata/v1/{path}"
    request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
    start = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read().decode(), answer.headers.get("ETag"), time.monotonic() - start
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), e.headers.get("ETag"), time.monotonic() - start


def in_background(server: MetadataServer, path: str) -> tuple[threading.Thread, list[tuple[int, str, str | None]]]:
    """A hanging GET on its own thread; its answer lands in the list (none when the connection failed)."""
    got: list[tuple[int, str, str | None]] = []

    def ask() -> None:
        with contextlib.suppress(OSError):  # the server closed under it
            got.append(get(server, path)[:3])

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    time.sleep(0.3)  # the request is in, waiting
    return thread, got


def test_every_value_has_an_etag_that_changes_with_the_value(server: MetadataServer) -> None:
    status, body, tag, _ = get(server, f"instance/attributes/{KEY}")
    assert (status, body) == (200, '{"version": 1}')
    assert tag is not None and len(tag) == 16
    assert get(server, f"instance/attributes/{KEY}")[2] == tag  # the same value, the same ETag
    assert get(server, "instance/attributes/agent-worker-number")[2] not in (None, tag)
    assert get(server, "instance/preempted")[2] is not None and get(server, "project/project-id")[2] is not None
    server.set_attributes({KEY: '{"version": 2}'})
    assert get(server, f"instance/attributes/{KEY}")[1:3] != (body, tag)
    assert get(server, "instance/attributes/agent-worker-number")[0] == 404  # the attributes were replaced whole


def test_a_hanging_get_answers_at_the_change_with_the_new_value_and_etag(server: MetadataServer) -> None:
    _, _, tag, _ = get(server, f"instance/attributes/{KEY}")
    thread, got = in_background(server, f"instance/attributes/{KEY}?wait_for_change=true&last_etag={tag}")
    assert got == []  # still waiting
    changed_at = time.monotonic()
    server.set_attributes({KEY: '{"version": 2}'})
    thread.join(timeout=5)
    assert time.monotonic() - changed_at < 2
    status, body, new_tag = got[0]
    assert (status, body) == (200, '{"version": 2}') and new_tag not in (None, tag)
    assert new_tag == get(server, f"instance/attributes/{KEY}")[2]


def test_without_last_etag_it_waits_for_the_next_change(server: MetadataServer) -> None:
    thread, got = in_background(server, f"instance/attributes/{KEY}?wait_for_change=true")
    server.set_attributes({KEY: '{"version": 2}', "other": "x"})
    thread.join(timeout=5)
    assert got and got[0][:2] == (200, '{"version": 2}')


def test_it_times_out_with_the_value_unchanged(server: MetadataServer) -> None:
    _, body, tag, _ = get(server, f"instance/attributes/{KEY}")
    server.set_attributes({KEY: body, "other": "a change to another key"})  # not this value's change
    status, again, same, took = get(server, f"instance/attributes/{KEY}?wait_for_change=true&timeout_sec=1")
    assert (status, again, same) == (200, body, tag)
    assert 0.9 < took < 3


def test_a_stale_last_etag_answers_at_once(server: MetadataServer) -> None:
    _, _, tag, _ = get(server, f"instance/attributes/{KEY}")
    server.set_attributes({KEY: '{"version": 2}'})
    status, body, new_tag, took = get(server, f"instance/attributes/{KEY}?wait_for_change=true&last_etag={tag}")
    assert (status, body) == (200, '{"version": 2}') and new_tag != tag and took < 1


def test_a_missing_key_is_404_and_a_waiter_gets_it_when_it_appears(server: MetadataServer) -> None:
    status, _, missing, _ = get(server, "instance/attributes/later")
    assert status == 404 and missing is not None
    assert get(server, "instance/attributes/later?wait_for_change=true&timeout_sec=1")[:3] == (
        404,
        "not found",
        missing,
    )
    thread, got = in_background(server, f"instance/attributes/later?wait_for_change=true&last_etag={missing}")
    server.set_attributes({KEY: '{"version": 1}', "later": "here"})
    thread.join(timeout=5)
    assert got and got[0][:2] == (200, "here")


def test_preempted_can_be_waited_on(server: MetadataServer) -> None:
    """A VM's own wait on its notice (compute/docs/instances/create-use-preemptible: instance/preempted with
    wait_for_change=true)."""
    thread, got = in_background(server, "instance/preempted?wait_for_change=true")
    server.preempted = True
    thread.join(timeout=5)
    assert got and got[0][:2] == (200, "TRUE")


def test_a_malformed_timeout_is_refused(server: MetadataServer) -> None:
    assert get(server, f"instance/attributes/{KEY}?wait_for_change=true&timeout_sec=soon")[0] == 400


def test_closing_the_server_ends_its_waiters() -> None:
    server = MetadataServer("proj", {KEY: "1"})
    thread, _ = in_background(server, f"instance/attributes/{KEY}?wait_for_change=true")
    server.close()
    thread.join(timeout=5)
    assert not thread.is_alive()
