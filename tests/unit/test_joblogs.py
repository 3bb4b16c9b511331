"""`respawn logs`: the Cloud Logging query, entries as lines, following with a cursor, and a local run's files."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeLogReader

from localcloud.readout import trainer_output as local
from respawn_ops.joblogs import LogLine, entry_line, job_filter, since_filter, stream
from respawn_ops.logfilter import LogFilter

DATA = Path(__file__).resolve().parents[1] / "data"
PROJECT, JOB = "ml-research-4821", "llm-small-001"


def entry(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DATA / name).read_text())
    return loaded


def script_failed(job_id: str = JOB, attempt: int = 3, worker: int = 2) -> dict[str, Any]:
    """The `failed` entry the startup script writes with `gcloud logging write`: resource global, no labels."""
    return {
        "insertId": "s1",
        "jsonPayload": {"event": "failed", "job_id": job_id, "attempt": attempt, "worker": worker,
                        "error": "the trainer exited with code 137"},
        "resource": {"type": "global", "labels": {"project_id": PROJECT}},
        "timestamp": "2025-03-14T09:50:00.000000Z",
        "severity": "ERROR",
        "logName": f"projects/{PROJECT}/logs/respawn-trainer",
    }  # fmt: skip


MINE = ["logentry_trainer_started.json", "logentry_trainer_checkpoint.json", "logentry_trainer_progress.json",
        "logentry_trainer_completed.json", "logentry_container_line.json"]  # fmt: skip
OTHERS = ["logentry_trainer_failed.json", "logentry_trainer_stopped.json", "logentry_gce_preempted.json",
          "logentry_tpu_worker_preempted.json"]  # fmt: skip


def test_the_query_selects_the_jobs_entries_and_container_lines_and_nothing_else() -> None:
    query = LogFilter.parse(job_filter(PROJECT, JOB))
    assert all(query.matches(entry(name)) for name in MINE)
    assert query.matches(script_failed())  # no labels: found by its payload
    assert not any(query.matches(entry(name)) for name in OTHERS)  # other jobs, system events
    elsewhere = entry("logentry_trainer_started.json")
    elsewhere["logName"] = "projects/another-project/logs/respawn-trainer"
    assert not query.matches(elsewhere)
    third, second = LogFilter.parse(job_filter(PROJECT, JOB, 3)), LogFilter.parse(job_filter(PROJECT, JOB, 2))
    assert all(third.matches(entry(name)) for name in MINE) and third.matches(script_failed())
    assert not any(second.matches(entry(name)) for name in MINE) and not second.matches(script_failed())


def test_a_quote_in_a_value_stays_inside_it() -> None:
    text = job_filter(PROJECT, 'x" OR logName:"respawn')
    assert not LogFilter.parse(text).matches(entry("logentry_trainer_started.json"))


def test_every_read_is_bounded_in_time() -> None:
    text = since_filter(job_filter(PROJECT, JOB), 1741944588.771402)
    assert text.endswith('\nAND timestamp>="2025-03-14T09:29:48.771402Z"')  # google-cloud-logging adds no 24 h default
    assert text.startswith("((logName=")


def test_entries_become_lines_prefixed_with_attempt_and_worker() -> None:
    started = entry_line(entry("logentry_trainer_started.json"))
    assert started is not None
    assert started.render(workers=False) == '[a3] started {"restored_step": 1200, "startup_s": 41.7, "step": 1200}'
    assert started.render(workers=True).startswith("[a3 w0] started")  # only process 0 writes lifecycle entries
    line = entry_line(entry("logentry_container_line.json"))
    assert line == LogLine(3, 1, text="09:41:13 trainer INFO step 1401/20000 loss 2.4817 3.1 steps/s")
    assert line.render(workers=True) == "[a3 w1] 09:41:13 trainer INFO step 1401/20000 loss 2.4817 3.1 steps/s"
    failed = entry_line(script_failed())
    assert failed is not None and failed.render(workers=True).startswith('[a3 w2] failed {"error": "the trainer')
    assert failed.to_json()["entry"]["worker"] == 2 and line.to_json() == {"attempt": 3, "worker": 1, "line": line.text}
    assert entry_line(entry("logentry_gce_preempted.json")) is None
    odd = copy.deepcopy(entry("logentry_container_line.json"))
    odd["jsonPayload"]["instance"] = "gone"
    odd["jsonPayload"]["container"]["metadata"] = {"RESPAWN_ATTEMPT": "three"}
    assert entry_line(odd) == LogLine(None, None, text=line.text)


def at(name: str, t: str, insert_id: str) -> dict[str, Any]:
    e = entry(name)
    e["timestamp"], e["insertId"] = t, insert_id
    return e


def test_without_follow_one_read_in_order() -> None:
    later = at("logentry_trainer_checkpoint.json", "2025-03-14T10:00:00Z", "b")
    reader = FakeLogReader([later, at("logentry_trainer_started.json", "2025-03-14T09:30:00Z", "a")])
    got: list[dict[str, Any]] = []
    assert stream(reader, job_filter(PROJECT, JOB), 1741944000.0, got.append, sleep=pytest.fail) == 2
    assert [e["insertId"] for e in got] == ["a", "b"] and len(reader.filters) == 1


def test_follow_prints_each_entry_once_late_ones_too_until_the_job_is_over() -> None:
    reader = FakeLogReader([at("logentry_trainer_started.json", "2025-03-14T09:30:00Z", "a")])
    arrivals = [
        [at("logentry_trainer_checkpoint.json", "2025-03-14T09:31:00Z", "b")],
        [at("logentry_container_line.json", "2025-03-14T09:30:30Z", "late")],  # ingested after "b", older than it
        [at("logentry_trainer_completed.json", "2025-03-14T09:32:00Z", "c")],
        [],
    ]
    polls: list[float] = []

    def sleep(seconds: float) -> None:
        polls.append(seconds)
        reader.stored += arrivals.pop(0)

    got: list[str] = []
    done = iter([False, False, True])
    n = stream(reader, job_filter(PROJECT, JOB), 1741944000.0, lambda e: got.append(e["insertId"]), follow=True,
               finished=lambda: next(done), sleep=sleep, poll_s=2.0, lag_s=60.0)  # fmt: skip
    assert got == ["a", "b", "late", "c"] and n == 4  # every read returns "a" again: printed once
    assert polls == [2.0, 2.0, 2.0]  # the job was over after the third read: one more, then stop
    bounds = [f.rpartition('timestamp>="')[2] for f in reader.filters]
    assert bounds == ['2025-03-14T09:19:00.000000Z"', '2025-03-14T09:29:00.000000Z"', '2025-03-14T09:30:00.000000Z"',
                      '2025-03-14T09:30:00.000000Z"']  # the newest timestamp seen, less the lag # fmt: skip


# -- the local cloud's run directory --------------------------------------------------------------------------------


def make_run(workdir: Path, name: str, jobs: list[str], files: dict[str, str], report: bool = True) -> Path:
    run = workdir / "runs" / name
    (run / "machines").mkdir(parents=True)
    lines = [{"t": 1.0, "kind": "submitted", "job_id": j} for j in jobs]
    lines += [{"t": 2.0, "kind": "create_call", "machine": f"{j}-a1", "zone": "z"} for j in jobs]
    (run / "timeline.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    for file_name, text in files.items():
        (run / "machines" / file_name).write_text(text)
    if report:
        (run / "report.json").write_text("{}")
    return run


STARTED = '{"event":"started","job_id":"qs","attempt":%d,"step":0}\n'


def test_a_runs_lines_attempt_by_attempt_worker_by_worker(tmp_path: Path) -> None:
    make_run(tmp_path, "20260101-000000-1", ["qs"], {"qs-a1.log": "old run\n"})
    run = make_run(tmp_path, "20260102-000000-1", ["qs", "other"], {
        "qs-a10.log": "ten\n",
        "qs-a2.log": STARTED % 2 + "step 1/9 loss 2.0\n",
        "qs-a3-w-1.log": "w1 line\n",
        "qs-a3-w-0.log": "w0 line",  # no newline at the end: still read once the run is over
        "other-a1.log": "not mine\n",
        "qs-x-a1.log": "a job named qs-x\n",
    })  # fmt: skip
    assert local.find_run(tmp_path, "qs") == run and local.find_run(tmp_path, "nope") is None
    got: list[LogLine] = []
    assert local.read(run, "qs", got.append, sleep=pytest.fail) == 5
    assert [line.render(workers=True) for line in got] == [
        '[a2] started {"step": 0}',
        "[a2] step 1/9 loss 2.0",
        "[a3 w0] w0 line",
        "[a3 w1] w1 line",
        "[a10] ten",
    ]
    assert got[0].entry == {"event": "started", "job_id": "qs", "attempt": 2, "step": 0}
    only: list[LogLine] = []
    local.read(run, "qs", only.append, attempt=3, sleep=pytest.fail)
    assert [(x.attempt, x.worker) for x in only] == [(3, 0), (3, 1)]
    assert local.attempts(run, "qs") == [1, 2, 3, 10]  # a1 was created and never ran


def test_follow_reads_the_files_as_they_grow_until_the_run_is_over(tmp_path: Path) -> None:
    run = make_run(tmp_path, "20260101-000000-1", ["qs"], {}, report=False)
    steps = [
        ("qs-a1.log", STARTED % 1),
        ("qs-a1.log", "step 1/2 lo"),  # half a line: printed once it is whole
        ("qs-a1.log", "ss 2.0\n"),
        ("qs-a2.log", STARTED % 2),
    ]
    over = threading.Event()

    def sleep(seconds: float) -> None:
        if steps:
            name, text = steps.pop(0)
            with (run / "machines" / name).open("a") as f:
                f.write(text)
        else:
            over.set()

    got: list[str] = []
    local.read(run, "qs", lambda x: got.append(x.render(True)), follow=True, sleep=sleep, over=lambda r: over.is_set())
    assert got == ['[a1] started {"step": 0}', "[a1] step 1/2 loss 2.0", '[a2] started {"step": 0}']


def test_a_run_is_over_when_its_report_is_written_or_its_process_is_gone(tmp_path: Path) -> None:
    live = make_run(tmp_path, f"20260101-000000-{os.getpid()}", ["qs"], {}, report=False)
    assert not local.run_over(live)
    (live / "report.json").write_text("{}")
    assert local.run_over(live)
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = make_run(tmp_path, f"20260101-000000-{done.stdout.strip()}", ["qs"], {}, report=False)
    assert local.run_over(gone)
