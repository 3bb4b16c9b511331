"""The live index and the pending observations on fake-gcs-server: what the stores write, list and delete, read back
with the real google-cloud-storage client; and a deployment's records of today's layout (no index) swept and served
after the change."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from fakes import FakeClock, FakeLogReader, FakeProvider
from google.cloud import storage

from respawn.adapters.gcs_store import GcsHistoryStore, GcsJobStore
from respawn.events import CancelRequested, JobSubmitted, SweepTicked, TrainerStarted
from respawn.histories import Histories, current
from respawn.jobs import JobSpec, Status, TpuMachine
from respawn.outlook import History, Key, Observation
from respawn.ports import ConflictError, IndexState
from respawn.service import Service, ServiceSettings
from respawn_cli import main as cli

pytestmark = [pytest.mark.emulator, pytest.mark.waits]

A, B = "us-central1-a", "us-west4-a"
KEY = Key(A, "v5litepod-8", "spot")


def spec(job_id: str) -> JobSpec:
    return JobSpec(job_id, TpuMachine("v5litepod-8", "v2-alpha-tpuv5-lite"), (A, B), "img", f"gs://b/runs/{job_id}")


def test_markers_are_written_listed_and_deleted_at_their_generation(bucket: str) -> None:
    store = GcsJobStore(bucket)
    assert store.markers() == {} and store.load_state() == (None, 0)
    before = time.time()
    store.enter("llm-1")
    store.enter("bert-2")
    first = store.markers()
    assert sorted(first) == ["bert-2", "llm-1"]
    assert abs(first["llm-1"].written_at - before) < 60
    store.enter("llm-1")  # written again: a new generation
    again = store.markers()["llm-1"]
    assert again.generation != first["llm-1"].generation
    store.leave("llm-1", again.generation)
    store.leave("llm-1", again.generation)  # already gone: no error
    assert sorted(store.markers()) == ["bert-2"]
    blob = storage.Client().bucket(bucket).get_blob("respawn/live/bert-2")
    assert blob is not None and json.loads(blob.download_as_text()) == {"job_id": "bert-2"}
    assert store.list_ids() == []  # markers are not records


def test_the_index_state_is_one_object_written_with_compare_and_set(bucket: str) -> None:
    store = GcsJobStore(bucket)
    state = IndexState(100.0, complete=True, zones=frozenset({("tpu", A)}))
    generation = store.save_state(state, 0)
    with pytest.raises(ConflictError):
        store.save_state(IndexState(200.0), 0)
    assert store.load_state() == (state, generation)
    blob = storage.Client().bucket(bucket).get_blob("respawn/live.json")
    written = json.loads(blob.download_as_text()) if blob is not None else None
    assert written == {"since": 100.0, "complete": True, "zones": [["tpu", A]]}
    assert store.markers() == {}  # beside the markers, not among them


def test_observations_are_create_only_objects_listed_with_what_they_say(bucket: str) -> None:
    store = GcsHistoryStore(bucket)
    first = Observation("llm-1/1", KEY, 3600.0, 1, 100.0)
    second = Observation("bert-2/3", KEY, 60.0, 0, 200.0)
    store.add([first, second])
    store.add([Observation("llm-1/1", KEY, 1.0, 0, 300.0)])  # the same id again: left as it was
    assert store.pending() == [second, first]
    names = sorted(b.name for b in storage.Client().list_blobs(bucket, prefix="placement/"))
    assert names == ["placement/observations/bert-2/3", "placement/observations/llm-1/1"]
    assert store.load() == (History(), 0)  # the history object is not written
    store.drop(["llm-1/1", "llm-1/1", "gone/9"])
    assert store.pending() == [second]


def test_the_sweep_folds_the_observations_into_the_history_object(bucket: str) -> None:
    store = GcsHistoryStore(bucket)
    histories = Histories(store)
    histories.record([Observation(f"job-{i}/1", KEY, 600.0, 1, 100.0 + i).to_dict() for i in range(5)], 100.0)
    history, generation, pending = current(store)
    assert (generation, pending) == (0, 5) and len(history.seen) == 5
    assert histories.fold() == 5
    folded, generation = store.load()
    assert generation > 0 and store.pending() == [] and sorted(folded.seen) == [f"job-{i}/1" for i in range(5)]
    assert current(store)[0] == folded


def test_a_deployment_of_todays_layout_is_swept_and_served_after_the_change(
    bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records as the code before the index wrote them (respawn/jobs/ only): the new service's sweep reads them all,
    indexes the live ones and, once settled, reads only those; `respawn status`, `report` and `logs` find the ended
    jobs throughout."""
    store, provider, clock = GcsJobStore(bucket), FakeProvider(creating_reads=0), FakeClock(time.time())
    before = Service(store, {"tpu": provider}, clock)  # today's code: no index
    for i in range(4):
        before.handle(JobSubmitted(f"submit-done-{i}", clock.now(), spec(f"done-{i}")))
        before.handle(CancelRequested(f"cancel-done-{i}", clock.now(), f"done-{i}"))
    before.handle(JobSubmitted("submit-live", clock.now(), spec("live")))
    before.handle(TrainerStarted("started-live", clock.now(), "live", 1))
    names = sorted(b.name for b in storage.Client().list_blobs(bucket))
    assert names == [f"respawn/jobs/{j}.json" for j in ("done-0", "done-1", "done-2", "done-3", "live")]

    reads: list[str] = []
    load = store.load
    monkeypatch.setattr(store, "load", lambda job_id: (reads.append(job_id), load(job_id))[1])
    after = Service(store, {"tpu": provider}, clock, index=store)
    after.handle(SweepTicked("tick-1", clock.now()))
    assert sorted(reads) == ["done-0", "done-1", "done-2", "done-3", "live"]  # every record, as before
    assert sorted(store.markers()) == ["live"] and store.load_state()[0] is not None
    clock.advance(ServiceSettings().index_settle_s + 1)
    reads.clear()
    after.handle(SweepTicked("tick-2", clock.now()))  # the settle time over: every record once more, and complete
    assert len(reads) == 5 and store.load_state()[0].complete  # type: ignore[union-attr]
    reads.clear()
    after.handle(SweepTicked("tick-3", clock.now()))
    assert reads == ["live"]  # the index is trusted: the live job's record only
    after.handle(CancelRequested("cancel-live", clock.now(), "live"))
    after.handle(SweepTicked("tick-4", clock.now()))
    assert store.markers() == {}
    reads.clear()
    after.handle(SweepTicked("tick-5", clock.now()))
    assert reads == []

    monkeypatch.setenv("RESPAWN_STATE_BUCKET", bucket)
    monkeypatch.setenv("RESPAWN_PROJECT", "respawn-local")
    monkeypatch.setattr(cli, "log_reader", lambda s: FakeLogReader())
    for job_id in ("done-2", "live"):
        assert cli.main(["status", job_id, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["status"] == Status.CANCELLED.value
        assert cli.main(["logs", job_id]) == 0
        page = tmp_path / f"{job_id}.html"
        assert cli.main(["report", job_id, "--html", str(page)]) == 0
        assert capsys.readouterr().out.strip() == str(page) and job_id in page.read_text()
    assert cli.main(["list", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 5
