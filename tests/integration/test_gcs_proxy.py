"""GcsProxy in front of fake-gcs-server: calls classified by object, latency added, one write a second per object."""

from __future__ import annotations

import time

import pytest
import requests
from google.cloud import storage

from localcloud.services.emulators import FakeGcs, patched_env
from localcloud.services.proxy import GcsProxy, classify, upload_name
from respawn import bootstrap
from respawn.deployment import Settings
from respawn.outlook import History
from respawn.ports import ConflictError

pytestmark = pytest.mark.emulator


def test_calls_are_classified_by_object() -> None:
    assert classify("GET", "/storage/v1/b/s/o/respawn%2Fjobs%2Fa.json?alt=media", "", b"") == (
        "read",
        "s",
        "respawn/jobs/a.json",
    )
    assert classify("GET", "/storage/v1/b/s/o?prefix=respawn%2Fjobs%2F", "", b"") == ("list", "s", "")
    assert classify("POST", "/upload/storage/v1/b/s/o?uploadType=media&name=x%2Fy", "", b"") == ("write", "s", "x/y")
    assert classify("DELETE", "/storage/v1/b/s/o/x", "", b"") == ("write", "s", "x")
    assert classify("POST", "/storage/v1/b/s/o/a/rewriteTo/b/t/o/c%2Fd", "", b"") == ("write", "t", "c/d")
    assert classify("GET", "/storage/v1/b/s", "", b"") == ("other", "s", "")
    body = b'--B\r\nContent-Type: application/json\r\n\r\n{"name": "p/h.json"}\r\n--B\r\n\r\n{}\r\n--B--\r\n'
    assert upload_name("multipart/related; boundary=B", body) == "p/h.json"


def test_a_second_write_within_a_second_is_refused(fake_gcs: FakeGcs, bucket: str) -> None:
    with GcsProxy(fake_gcs.url, latency_s=0.02) as proxy, patched_env(proxy.env()):
        upload = f"{proxy.url}/upload/storage/v1/b/{bucket}/o"

        def write(name: str) -> int:
            params = {"uploadType": "media", "name": name}
            return requests.post(upload, params=params, data=b"{}", timeout=10).status_code

        started = time.monotonic()
        assert write("placement/history.json") == 200
        assert time.monotonic() - started >= 0.02  # the latency, added
        assert write("placement/history.json") == 429
        assert write("respawn/jobs/a.json") == 200  # another object: its own second
        time.sleep(1.0)
        history = bootstrap.history_store(Settings(state_bucket=bucket), in_functions=True)
        with pytest.raises(ConflictError):  # a write the server refuses (412) is no write: it takes no turn
            history.save(History(), 0)
        assert write("placement/history.json") == 200
        writes = [(c.name, c.status) for c in proxy.calls() if c.kind == "write"]
        assert [status for _, status in writes] == [200, 429, 200, 412, 200]
        listed = storage.Client().list_blobs(bucket)  # a client through STORAGE_EMULATOR_HOST: counted as a list
        assert len(list(listed)) == 2
        assert any(c.kind == "list" and c.bucket == bucket for c in proxy.calls())
