"""The head start end to end on the local cloud: each preemption's notice requests the next machine at once.

`respawn local run` with the head start on (the default), every message delivered three times, and each preemption
timed at a step that starts a periodic save (`--checkpoint-every=20`, preempted at steps 60 and 140), so the notice
comes while the trainer saves. The machines run the real startup and shutdown scripts: the shutdown script's
`notice` entry reaches the service through the VM's Cloud Logging endpoint (curl and the machine's token), while the
VM's gcloud, a snap as on Ubuntu's images, fails during shutdown; the next machine is created while the noticed one
trains on, its trainer (respawn's image takes over itself) sets itself up, says it is ready, and restores once the
noticed machine's drain marker appears in fake-gcs-server (its final save done), long before `respawn-start-after`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import need
from test_local_run import marked

from localcloud.services.emulators import FakeGcs
from respawn.machine import grace_s

pytestmark = [pytest.mark.emulator, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
RESPAWN = [sys.executable, "-m", "respawn_cli.main"]
STEPS = 200
SAVE_STEPS = (60, 140)  # multiples of --checkpoint-every: the notice comes as a periodic save begins
WINDOW_S = 10  # the local cloud's notice window (--grace)
CHAOS = [
    *("--preempt-at-step", ",".join(map(str, SAVE_STEPS))),
    *("--duplicate-deliveries", "3"),
    *("--creation-delay", "0.5s", "--sweep-every", "2s", "--grace", f"{WINDOW_S}s"),
]


def run_local(job_file: Path, workdir: Path) -> tuple[dict[str, Any], str]:
    """The command in a subprocess; no process it started may outlive it."""
    marker = uuid.uuid4().hex
    argv = [*RESPAWN, "local", "run", str(job_file), *CHAOS, "--json", "--workdir", str(workdir)]
    env = {**os.environ, "LOCAL_RUN_MARKER": marker}
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=500)
    time.sleep(0.5)
    left = marked(marker)
    for p in left:
        p.kill()
    assert not left, f"processes left behind: {[p.cmdline()[:3] for p in left]}"
    assert proc.stdout.strip(), f"no report; stderr:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def timeline(report: dict[str, Any]) -> list[dict[str, Any]]:
    lines = (Path(report["run_dir"]) / "timeline.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def entries(events: list[dict[str, Any]], event: str) -> dict[int, dict[str, Any]]:
    """Attempt -> its first lifecycle entry of kind `event` (the trainer's own, where both it and a script wrote)."""
    found: dict[int, dict[str, Any]] = {}
    for e in sorted(events, key=lambda e: e["t"]):
        if e["kind"] != "entry" or e["payload"].get("event") != event:
            continue
        if e["attempt"] not in found or found[e["attempt"]].get("source") == "exit-code":
            found[e["attempt"]] = {**e["payload"], "t": e["t"]}
    return found


def payloads(events: list[dict[str, Any]], attempt: int) -> list[dict[str, Any]]:
    """The attempt's lifecycle entries, in the order they arrived."""
    return [e["payload"] for e in events if e["kind"] == "entry" and e["attempt"] == attempt]


def test_each_notice_starts_the_next_machine_while_the_noticed_one_saves(tmp_path: Path) -> None:
    need(FakeGcs.missing())
    job = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    job["job_id"] = "head-start"
    job["args"] = ["--model=tiny", f"--steps={STEPS}", "--checkpoint-every=20", "--log-every=1"]
    assert job.get("head_start", True) is True  # on by default
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))

    report, stderr = run_local(path, tmp_path / "work")
    detail = f"report: {json.dumps(report, indent=1)[:3000]}\nstderr tail:\n{stderr[-3000:]}"
    assert report["status"] == "SUCCEEDED" and report["exact"] is True, detail
    assert report["final_step"] == STEPS and report["preemptions_injected"] == 2, detail
    assert report["preemptions"] == 2 and report["attempts"] == 3, detail  # each counted once, duplicates or not
    assert report["max_live_machines"] == 2, detail  # the overlap, and never more
    assert report["machines_left"] == 0 and report["processes_left"] == 0, detail
    a, b = job["zones"]
    assert [z["zone"] for z in report["zones"]] == [a, b, a], detail  # each replacement away from the dying zone

    # the noticed VMs' gcloud failed during their shutdown, as Ubuntu's snap does: the notices came all the same
    machines = Path(report["run_dir"]) / "machines"
    for noticed in (1, 2):
        home = {"HOME": str(machines / f"head-start-a{noticed}" / "w-0")}
        snap = subprocess.run(
            [machines / ".bin" / "gcloud", "logging", "write"], env=home, capture_output=True, text=True
        )
        assert snap.returncode == 1 and "TransactionIsDestructive" in snap.stderr, snap.stderr

    events = timeline(report)
    notices, stopped, started = entries(events, "notice"), entries(events, "stopped"), entries(events, "started")
    creates = {e["machine"]: e["t"] for e in events if e["kind"] == "create_call"}
    holds = {e["attempt"]: e for e in events if e["kind"] == "start_after"}
    off = {e["machine"]: e["t"] for e in sorted(events, key=lambda e: -e["t"]) if e["kind"] in ("deleted", "preempted")}
    assert sorted(notices) == [1, 2] and sorted(holds) == [2, 3], detail
    for noticed in (1, 2):
        old, new = f"head-start-a{noticed}", f"head-start-a{noticed + 1}"
        # the next machine was requested on the notice, before the noticed one was gone: the overlap
        assert notices[noticed]["t"] <= creates[new] < off[old], (noticed, detail)
        # its trainer started only once the noticed machine's final save was done (its marker), and restored that
        # save's step: the marker released it, not start-after (the notice + the TPU's 10 s window + 5 s)
        hold = holds[noticed + 1]
        assert hold["marker"] == f"{job['checkpoint_uri']}.respawn/attempt-{noticed}.exited", detail
        assert started[noticed + 1]["takeover"] == "found", (noticed, detail)
        assert stopped[noticed]["t"] <= started[noticed + 1]["t"], (noticed, detail)
        assert started[noticed + 1]["restored_step"] == stopped[noticed]["step"], (noticed, detail)
        # the handover: the new trainer set itself up at once and waited (respawn's trainer image takes over itself),
        # and the noticed one trained on until it was ready, past the step of its notice
        assert started[noticed + 1]["takeover_wait_s"] > 0, (noticed, detail)
        # it may train on half the shorter of its grace and the window, less two of its longest saves
        # (handover.train_on_s): on a loaded machine slow saves can leave it no time, and then it saves at once
        saves = [p["total_s"] for p in payloads(events, noticed) if p.get("event") == "checkpoint"]
        train_on_s = min(grace_s("tpu"), WINDOW_S) / 2 - 2 * max(saves, default=0.0)
        if train_on_s >= 1.0:
            assert stopped[noticed]["step"] > SAVE_STEPS[noticed - 1], (noticed, train_on_s, detail)
        print(
            f"attempt {noticed + 1}: notice -> old final save {stopped[noticed]['t'] - notices[noticed]['t']:.2f}s, "
            f"final save -> new trainer started {started[noticed + 1]['t'] - stopped[noticed]['t']:.2f}s, "
            f"start-after was notice + {hold['until'] - notices[noticed]['t']:.2f}s, train on {train_on_s:.2f}s"
        )
