"""`respawn local run` of a job that reads a dataset: ArrayRecord shards uploaded to the local cloud's fake-gcs-server
(`--upload`), read by the trainer's Grain pipeline (`--data`), preempted twice. The job ends SUCCEEDED with the
parameters of an uninterrupted run on the same data, and the report counts each example of the data stream trained
exactly once, on one host and on a 4-host slice; and a job whose fallback tier has another host count (a MIG of 2
GPU VMs, then one VM) resumes the 2 VMs' data position on 1, each example once, each VM copying only its shards.
"""

from __future__ import annotations

import json
import re
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


def dataset_job(
    tmp_path: Path, example: str, steps: int, batch: int, head_start: bool = False
) -> tuple[Path, list[str]]:
    """The example job reading DATASET, and the --upload that puts the shards (200 kB of the generated corpus, 3
    shards of 33-token sequences) there."""
    shards = tmp_path / "shards"
    prepare(data.corpus()[:200_000].tobytes(), str(shards), seq_len=32, shards=3)
    job = yaml.safe_load((ROOT / "examples" / example).read_text())
    job["job_id"] = "data-it"
    # Without the head start each notice stops the trainer at its next step: with it, the noticed nano trainer trains
    # on until its successor is ready, and on a loaded machine it may finish the job before the second preemption
    # (test_local_head_start_run.py covers the handover)
    job["head_start"] = head_start  # a job of several slices keeps it: its survivors re-form from the noticed save
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


def test_a_data_job_whose_tier_has_another_host_count_resumes_each_example_once(tmp_path: Path) -> None:
    """Tier 0: Spot, 2 VMs of one L4 each (2 trainer processes, one device each), moving on after one preemption;
    tier 1: standard, one VM of the same type. The checkpoint of the 2 processes holds one stream position, which
    the 1 process restores: the job ends SUCCEEDED with each example of the stream trained once. Each VM copies only
    the shards it reads into its machine's data directory (RESPAWN_DATA_DIR): 2 of the 4 on tier 0, all 4 on tier 1.
    Not compared with a reference: another device count sums the gradients in another order (docs/gpu-jobs.md)."""
    need(FakeGcs.missing())
    steps, batch = 30, 8
    shards = tmp_path / "shards"
    prepare(data.corpus()[:200_000].tobytes(), str(shards), seq_len=32, shards=4)
    l4 = {"kind": "gpu", "machine_type": "g2-standard-4", "accelerator_type": "nvidia-l4", "accelerator_count": 1}
    job = yaml.safe_load((ROOT / "examples" / "gpu-tiers.yaml").read_text())
    job.update(
        job_id="data-tiers-it",
        machine={**l4, "vms": 2},
        tiers=[
            {"provisioning": "spot", "zones": ["us-central1-a"], "move_on": {"after_preemptions": 1}},
            {"provisioning": "standard", "zones": ["us-central1-a"], "machine": l4},
        ],
        head_start=False,  # the preempted VM's own system event ends the attempt (test_local_gpu_run.py)
        args=[
            "--model=nano",
            f"--steps={steps}",
            f"--batch-size={batch}",
            "--checkpoint-every=5",
            "--log-every=1",
            f"--data={DATASET}",  # no --data-cache: each machine's data directory
        ],
    )
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    chaos = ["--preempt-at-step", "10", *FAST]
    report, stderr = run_local(
        path, tmp_path, "--upload", f"{shards}={DATASET}", "--no-reference", env=HIDE_PUBSUB, chaos=chaos, timeout=900
    )
    detail = f"report: {json.dumps(report, indent=1)[:4000]}\nstderr tail:\n{stderr[-3000:]}"
    assert report["status"] == "SUCCEEDED" and report["final_step"] == steps, detail
    assert [(z["tier"], z["end"]) for z in report["zones"]] == [(0, "preempted"), (1, "completed")], detail
    assert report["examples"] == {"trained": steps * batch, "once": steps * batch, "repeated": 0, "skipped": 0}, detail
    assert report["machines_left"] == 0 and report["processes_left"] == 0, detail

    machines = Path(report["run_dir"]) / "machines"
    logs = {
        name: (machines / f"{name}.log").read_text(errors="replace")
        for name in ("data-tiers-it-a1-w-0", "data-tiers-it-a1-w-1", "data-tiers-it-a2")
    }
    line = re.compile(r"data: (\d) of 4 shards .* in (\S+) \(([\d.]+) MB read")
    held = {name: line.findall(log) for name, log in logs.items()}
    assert [len(h) for h in held.values()] == [1, 1, 1], held
    (w0,), (w1,), (single,) = held.values()
    assert (w0[0], w1[0], single[0]) == ("2", "2", "4"), held  # half the shards on each VM of the MIG
    assert "var-lib-respawn/data" in w0[1] and "var-lib-respawn/data" in single[1], held  # the machine's directory
    total = sum(p.stat().st_size for p in shards.iterdir())
    megabytes = [float(w0[2]), float(w1[2]), float(single[2])]
    assert megabytes[0] + megabytes[1] == pytest.approx(megabytes[2], abs=0.2), held  # each VM half of the bytes
    assert megabytes[2] == pytest.approx(total / 1e6, abs=0.1), held
    restored = re.findall(r"started at step (\d+) of", logs["data-tiers-it-a2"])
    assert len(restored) == 1 and 5 <= int(restored[0]) < steps, logs["data-tiers-it-a2"][-2000:]  # tier 0's save


def test_a_world_of_two_slices_reading_gcs_shards_trains_each_example_once_through_a_slices_preemption(
    tmp_path: Path,
) -> None:
    """2 slices x 2 hosts, one world (examples/world.yaml) on the dataset: a slice's preemption re-forms the world
    without it, in place, and its replacement joins; the stream position is one for all 4, 2 and 4 processes again,
    so each example of the stream is trained once (docs/several-slices.md)."""
    need(FakeGcs.missing())
    steps, batch = 40, 16
    path, upload = dataset_job(tmp_path, "world.yaml", steps=steps, batch=batch, head_start=True)
    chaos = ["--preempt-at-step", "10", *FAST]
    report, stderr = run_local(path, tmp_path, *upload, env=HIDE_PUBSUB, chaos=chaos, timeout=900)
    detail = f"report: {json.dumps(report, indent=1)[:4000]}\nstderr tail:\n{stderr[-3000:]}"
    assert report["status"] == "SUCCEEDED" and report["final_step"] == steps, detail
    assert report["preemptions"] == 1 and report["machines_left"] == 0 and report["processes_left"] == 0, detail
    trained = [tuple(w["members"]) for w in report["worlds"]]
    assert trained[0] == trained[-1] == (0, 1) and len(trained) >= 2, detail  # K, K-1 (in place), K again
    assert report["examples"] == {"trained": steps * batch, "once": steps * batch, "repeated": 0, "skipped": 0}, detail
    # the same batches in the same order, summed over fewer processes while one slice trained alone
    assert report["exactness"] in ("data-exact", "bitwise"), detail
