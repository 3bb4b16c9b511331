"""`respawn local run` of a job that reads a dataset: ArrayRecord shards uploaded to the local cloud's fake-gcs-server
(`--upload`), read by the trainer's Grain pipeline (`--data`), preempted twice. The job ends SUCCEEDED with the
parameters of an uninterrupted run on the same data, and the report counts each example of the data stream trained
exactly once, on one host and on a 4-host slice.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import need
from test_local_run import ROOT, run_local

from localcloud.services.emulators import FakeGcs
from trainer import data
from trainer.prepare import prepare

pytestmark = [pytest.mark.emulator, pytest.mark.slow]

DATASET = "gs://respawn-datasets/corpus"
FAST = ["--creation-delay", "0.5s", "--sweep-every", "2s"]
HIDE_PUBSUB = {"RESPAWN_HIDE_PUBSUB_EMULATOR": "1"}  # the in-process bus: test_local_run.py covers both buses


def dataset_job(tmp_path: Path, example: str, steps: int, batch: int) -> tuple[Path, list[str]]:
    """The example job reading DATASET, and the --upload that puts the shards (200 kB of the generated corpus, 3
    shards of 33-token sequences) there."""
    shards = tmp_path / "shards"
    prepare(data.corpus()[:200_000].tobytes(), str(shards), seq_len=32, shards=3)
    job = yaml.safe_load((ROOT / "examples" / example).read_text())
    job["job_id"] = "data-it"
    # Without the head start each notice stops the trainer at its next step: with it, the noticed nano trainer trains
    # on until its successor is ready, and on a loaded machine it may finish the job before the second preemption
    # (test_local_head_start_run.py covers the handover)
    job["head_start"] = False
    job["args"] = [
        "--model=nano",
        f"--steps={steps}",
        f"--batch-size={batch}",
        "--checkpoint-every=10",
        "--log-every=1",
        f"--data={DATASET}",
        f"--data-cache={tmp_path / 'data-cache'}",
    ]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path, ["--upload", f"{shards}={DATASET}"]


def check(report: dict, stderr: str, steps: int, batch: int, hosts: int) -> None:
    detail = f"report: {json.dumps(report, indent=1)[:4000]}\nstderr tail:\n{stderr[-3000:]}"
    assert report["status"] == "SUCCEEDED", detail
    assert report["hosts"] == hosts and report["final_step"] == steps, detail
    assert report["exact"] is True, detail  # the uninterrupted reference read the same shards
    assert report["preemptions_injected"] == 2 and report["preemptions"] >= 2, detail
    assert report["examples"] == {"trained": steps * batch, "once": steps * batch, "repeated": 0, "skipped": 0}, detail
    assert report["goodput_s"]["input_s"] > 0, detail
    assert report["machines_left"] == 0 and report["processes_left"] == 0, detail


def test_a_job_reading_gcs_shards_survives_two_preemptions_training_each_example_once(tmp_path: Path) -> None:
    need(FakeGcs.missing())
    path, upload = dataset_job(tmp_path, "quickstart.yaml", steps=90, batch=8)
    chaos = ["--preempt-at-step", "30,60", *FAST]
    report, stderr = run_local(path, tmp_path, *upload, env=HIDE_PUBSUB, chaos=chaos)
    check(report, stderr, steps=90, batch=8, hosts=1)


def test_a_4_host_slice_reading_gcs_shards_survives_two_preemptions_training_each_example_once(
    tmp_path: Path,
) -> None:
    need(FakeGcs.missing())
    path, upload = dataset_job(tmp_path, "slice.yaml", steps=30, batch=16)
    chaos = ["--preempt-at-step", "10,20", *FAST]
    report, stderr = run_local(path, tmp_path, *upload, env=HIDE_PUBSUB, chaos=chaos, timeout=900)
    check(report, stderr, steps=30, batch=16, hosts=4)
