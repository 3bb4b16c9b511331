"""`respawn local run` end to end: a small job through two preemptions (and a stockout), on the whole local cloud.

Each run is the real command in a subprocess (fake-gcs-server, the local TPU API, functions-framework running
functions/main.py, the Pub/Sub emulator or the in-process bus, trainer processes). Every process it starts
inherits a marker in its environment, so the test can prove that none outlives the command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from conftest import need
from fakes import assert_status_chain

from localcloud.cloud import TRAINER_IMAGES
from localcloud.services.emulators import FakeGcs, PubSubEmulator

pytestmark = [pytest.mark.emulator, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
RESPAWN = [sys.executable, "-m", "respawn_cli.main"]
STEPS = 200
# The machine is preempted at step 60 and its replacement at step 140, on a fast machine or a slow one.
# TPU machines are queued resources (the default): with `--stockout us-central1-a` the first request waits in
# that zone's queue until its queue_timeout (1m here), and the next attempt goes to the second zone.
CHAOS = ["--preempt-at-step", "60,140", "--creation-delay", "0.5s", "--sweep-every", "2s"]
STOCKOUT = ["--stockout", "us-central1-a"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shared by the runs of this module: the compilation cache and the cached reference run."""
    return tmp_path_factory.mktemp("respawn-local")


@pytest.fixture(scope="module")
def job_file(workdir: Path) -> Path:
    job = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    job["job_id"] = "local-it"
    job["machine"]["queue_timeout"] = "1m"
    job["args"] = ["--model=tiny", f"--steps={STEPS}", "--checkpoint-every=20", "--log-every=1"]
    path = workdir / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def marked(marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("LOCAL_RUN_MARKER") == marker:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def run_local(
    job_file: Path,
    workdir: Path,
    *extra: str,
    env: dict[str, str] | None = None,
    chaos: list[str] = CHAOS,
    timeout: float = 400,
    cwd: Path = ROOT,
) -> tuple[dict[str, Any], str]:
    """The command in a subprocess, run in `cwd` (`job_file` and `workdir` may be relative to it); no process it
    started may outlive it."""
    marker = uuid.uuid4().hex
    argv = [*RESPAWN, "local", "run", str(job_file), *chaos, "--json", "--workdir", str(workdir), *extra]
    run_env = {**os.environ, **(env or {}), "LOCAL_RUN_MARKER": marker}
    proc = subprocess.run(argv, cwd=cwd, env=run_env, capture_output=True, text=True, timeout=timeout)
    time.sleep(0.5)
    left = marked(marker)
    for p in left:  # never leave them behind, even when the assertion below fails
        p.kill()
    assert not left, f"processes left behind: {[p.cmdline()[:3] for p in left]}"
    assert proc.stdout.strip(), f"no report; stderr:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def check(report: dict[str, Any], stderr: str, stockout: bool = False) -> None:
    detail = f"report: {json.dumps(report, indent=1)[:3000]}\nstderr tail:\n{stderr[-3000:]}"
    assert report["status"] == "SUCCEEDED", detail
    assert report["exact"] is True, detail
    assert report["final_step"] == STEPS, detail
    assert report["preemptions"] >= 2 and report["preemptions_injected"] == 2, detail
    if stockout:  # a1 waited in the stocked-out zone's queue until its queue_timeout; a2 went to the next zone
        assert report["capacity_errors"] >= 1 and report["zones"][0]["end"] == "queued", detail
        assert [z["zone"] for z in report["zones"]][:2] == ["us-central1-a", "us-west4-a"], detail
        assert report["zones"][0]["queue_s"] is None  # its node was never provisioned
    else:
        assert report["capacity_errors"] == 0, detail
    split = report["recovery_split_p50_s"]
    assert split["queue_s"] is not None, detail
    if not stockout:  # with one, a head start asks for its next machine in the other zone, the stocked-out one
        assert split["queue_s"] < 1.0, detail  # no queue outside a stockout
    assert split["boot_s"] is not None and split["start_s"] is not None, detail
    assert report["max_live_machines"] <= 2, detail  # a head start overlaps the noticed machine with its successor
    assert report["machines_left"] == 0, detail
    assert report["processes_left"] == 0, detail
    assert len(report["recovery_create_s"]) == 2, detail


def logs(workdir: Path, *extra: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`respawn logs local-it` on the local cloud's runs under `workdir`."""
    argv = [*RESPAWN, "logs", "local-it", "--workdir", str(workdir), *extra]
    env = {k: v for k, v in os.environ.items() if k != "RESPAWN_STATE_BUCKET"}
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def check_logs(text: str, report: dict[str, Any]) -> None:
    """Every attempt that ran, in order, each from its `started`; the preempted ones stopped, the last completed.
    The trainer's own entries are counted: the startup script adds its exit-code entry (`"source": "exit-code"`)
    after every exit, as on a real VM."""
    lines = text.splitlines()
    attempts = [int(line[2 : line.index("]")]) for line in lines]
    assert attempts == sorted(attempts) and lines, text[-2000:]
    ran = [z["attempt"] for z in report["zones"] if z["end"] != "queued"]
    assert sorted(set(attempts)) == ran, (ran, text[-2000:])
    words = [[*line.split(), ""][1] for line in lines]  # `[a2] started {...}`; a trainer line starts with its time
    lifecycle = [
        (n, w)
        for n, w, line in zip(attempts, words, lines, strict=True)
        if w in ("started", "stopped", "completed") and '"exit-code"' not in line
    ]
    assert [n for n, e in lifecycle if e == "started"] == ran, lifecycle
    assert sum(e == "stopped" for _, e in lifecycle) == report["preemptions_injected"], lifecycle
    assert lifecycle[-1] == (ran[-1], "completed"), lifecycle
    assert sum("loss" in line for line in lines) >= STEPS  # the progress lines of every step (--log-every=1)


class FollowedLogs(threading.Thread):
    """`respawn logs local-it -f`, started as soon as a new run (not in `before`) has submitted the job."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(daemon=True)
        self.workdir, self.before = workdir, set(runs(workdir))
        self.result: subprocess.CompletedProcess[str] | None = None

    def run(self) -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            new = [r for r in runs(self.workdir) if r not in self.before and '"local-it"' in timeline(r)]
            if new:
                self.result = logs(self.workdir, "-f", timeout=400)
                return
            time.sleep(0.2)


def runs(workdir: Path) -> list[Path]:
    return sorted((workdir / "runs").glob("*")) if (workdir / "runs").is_dir() else []


def timeline(run: Path) -> str:
    path = run / "timeline.jsonl"
    return path.read_text() if path.exists() else ""


def test_quickstart_survives_preemptions_and_a_stockout(job_file: Path, workdir: Path) -> None:
    need(FakeGcs.missing() or PubSubEmulator.missing())
    report, stderr = run_local(job_file, workdir, *STOCKOUT, "--plot", str(workdir / "timeline.png"))
    check(report, stderr, stockout=True)
    assert report["bus"] == "pubsub-emulator"
    assert (workdir / "timeline.png").stat().st_size > 10_000
    printed = logs(workdir)
    assert printed.returncode == 0 and report["run_dir"] in printed.stderr, printed.stderr
    check_logs(printed.stdout, report)
    queued = logs(workdir, "--attempt", "1")  # waited in the stocked-out queue: created, never ran
    assert (queued.returncode, queued.stdout) == (0, ""), queued.stderr


def test_duplicate_deliveries_change_nothing_and_a_secret_reaches_the_trainers_only(
    job_file: Path, workdir: Path, tmp_path: Path
) -> None:
    """Every message pushed three times: each status change is still one notice; `logs -f` follows the run. The job
    reads a secret, given in a file outside the workdir: every trainer holds it, and no file of the run, no object
    on GCS and no line of `logs` holds it."""
    need(FakeGcs.missing() or PubSubEmulator.missing())
    job = yaml.safe_load(job_file.read_text())
    job["secrets"] = {"HF_TOKEN": "projects/respawn-local/secrets/hf-token/versions/1"}
    secret_job = workdir / "job-with-secret.yaml"
    secret_job.write_text(yaml.safe_dump(job))
    value = f"hf_{uuid.uuid4().hex}"
    (tmp_path / "secrets.env").write_text(f"HF_TOKEN={value}\n")

    follower = FollowedLogs(workdir)  # `logs -f` follows the job while it runs, and ends when the run does
    follower.start()
    report, stderr = run_local(
        secret_job, workdir, "--duplicate-deliveries", "3", "--secrets-file", str(tmp_path / "secrets.env")
    )
    check(report, stderr)
    follower.join(timeout=60)
    followed = follower.result
    assert followed is not None and followed.returncode == 0, followed and followed.stderr
    check_logs(followed.stdout, report)
    assert followed.stdout == logs(workdir).stdout  # followed as it ran: the same lines as read afterwards

    secrets = report["secrets"]
    assert secrets["leaks"] == [] and secrets["delivered"] == secrets["trainers"] >= 3, secrets
    assert [p for p in workdir.rglob("*") if p.is_file() and value.encode() in p.read_bytes()] == []
    assert value not in stderr and value not in followed.stdout
    notices = [json.loads(line) for line in (Path(report["run_dir"]) / "status.jsonl").read_text().splitlines()]
    changes = [(n["old_status"], n["new_status"]) for n in notices]
    assert_status_chain(changes)  # none twice, none missing
    assert changes[0][0] is None and changes[-1][1] == "SUCCEEDED" and len({n["id"] for n in notices}) == len(notices)
    assert report["notifications"] == len(notices) == 1 + 2 * report["attempts"], changes


def test_without_the_emulator_the_in_process_bus_is_used_from_a_fresh_directory_with_a_relative_workdir(
    job_file: Path, tmp_path: Path
) -> None:
    """As a user runs it: from a directory of their own, the job file and the workdir given relative to it (the
    default --workdir, `.respawn`, is relative too). Every path a trainer gets is absolute all the same. The job names
    no image: its record holds the local deployment's trainer image of a TPU machine (RESPAWN_TRAINER_IMAGES)."""
    need(FakeGcs.missing())
    job = yaml.safe_load(job_file.read_text())
    del job["image"]
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    report, stderr = run_local(
        Path("job.yaml"), Path(".respawn"), env={"RESPAWN_HIDE_PUBSUB_EMULATOR": "1"}, cwd=tmp_path
    )
    check(report, stderr)
    assert Path(report["run_dir"]).is_relative_to((tmp_path / ".respawn").resolve()), report["run_dir"]
    assert report["bus"] == "in-process"
    assert report["image"] == TRAINER_IMAGES["tpu"] == "us-docker.pkg.dev/respawn-local/respawn/trainer:latest"
    notices = [line for line in stderr.splitlines() if "RESPAWN_HIDE_PUBSUB_EMULATOR" in line]
    assert len(notices) == 1 and "in-process push bus" in notices[0], stderr[-2000:]


# -- a program that knows nothing of respawn (--entrypoint) -----------------------------------------------------------

PROGRAMS = Path("tests") / "data" / "programs"  # relative to ROOT, where the command runs


def own_program_job(workdir: Path, job_id: str, args: list[str], **changes: Any) -> Path:
    """The quickstart job with another id, the program's args and `changes`; a TPU `node` request starts at once."""
    job = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    job["machine"]["request"] = "node"
    job.update(job_id=job_id, args=args, **changes)
    path = workdir / f"{job_id}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def entries(run_dir: str, event: str) -> list[dict[str, Any]]:
    """The lifecycle entries of one kind the run's machines logged, in order (from its timeline)."""
    lines = (Path(run_dir) / "timeline.jsonl").read_text().splitlines()
    found = [json.loads(line) for line in lines]
    return [e for e in found if e["kind"] == "entry" and e["payload"].get("event") == event]


def test_a_program_that_knows_nothing_of_respawn_is_stopped_recreated_and_completed_by_its_exit_code(
    workdir: Path,
) -> None:
    """It prints odd lines, exits 0 on SIGTERM (`stopped`: the preemption recreates it, and it starts over), and
    exits 0 at the end (`completed`). With no params_sha256 from it, `exact` is unknown, not false."""
    need(FakeGcs.missing())
    job = own_program_job(workdir, "plain-program", ["--steps=10", "--step-time=0.2"])
    entrypoint = f"python {PROGRAMS / 'plain_train.py'}"
    chaos = ["--preempt-at-step", "4", "--creation-delay", "0.2s", "--grace", "10s", "--sweep-every", "2s"]
    report, stderr = run_local(job, workdir, "--entrypoint", entrypoint, chaos=chaos, timeout=180)
    detail = f"report: {json.dumps(report, indent=1)[:3000]}\nstderr tail:\n{stderr[-3000:]}"
    assert report["status"] == "SUCCEEDED" and report["reason"] == "the trainer exited with code 0", detail
    assert (report["attempts"], report["preemptions"], report["failures"]) == (2, 1, 0), detail
    assert report["exact"] is None and "sends no params_sha256" in report["exact_reason"], detail
    assert report["lost_steps"] >= 4, detail  # a2 started over: the program keeps no checkpoint of its own
    assert report["machines_left"] == 0 and report["processes_left"] == 0, detail
    said = [(e["attempt"], e["payload"]) for e in entries(report["run_dir"], "stopped")]
    said += [(e["attempt"], e["payload"]) for e in entries(report["run_dir"], "completed")]
    assert [(n, p["event"], p["source"], p["exit_code"]) for n, p in said] == [
        (1, "stopped", "exit-code", 0),
        (2, "completed", "exit-code", 0),
    ], f"said: {said}\n{detail}"
    log = (Path(report["run_dir"]) / "machines" / "plain-program-a1.log").read_text(errors="replace")
    assert '{"event": "completed", "note"' in log and "SIGTERM after step" in log  # its lines, as plain lines


def test_a_program_that_exits_3_fails_the_job_after_max_failures_with_the_code_in_the_reason(workdir: Path) -> None:
    need(FakeGcs.missing())
    job = own_program_job(workdir, "exit-three", [], max_failures=2)
    chaos = ["--creation-delay", "0.2s", "--sweep-every", "2s"]
    report, stderr = run_local(job, workdir, "--entrypoint", f"python {PROGRAMS / 'exit_3.py'}", chaos=chaos)
    detail = f"report: {json.dumps(report, indent=1)[:3000]}\nstderr tail:\n{stderr[-3000:]}"
    assert report["status"] == "FAILED" and (report["attempts"], report["failures"]) == (2, 2), detail
    assert report["reason"].endswith("the trainer exited with code 3 (failure 2 of 2)"), detail
    assert "the reference run did not complete (exit code 3)" in report["exact_reason"], detail
    assert report["machines_left"] == 0 and report["processes_left"] == 0, detail


def test_a_users_own_loop_on_respawn_trainer_resumes_exactly_through_preemptions(workdir: Path) -> None:
    """examples/byo: the user's script, a few lines changed to use respawn_trainer, run as is (--entrypoint); the
    reference is the same command run uninterrupted. Without the head start: its loop trains 3000 steps in about
    3 s, so a noticed trainer handing over (training on until its successor is ready) would finish the job alone."""
    need(FakeGcs.missing())
    job = workdir / "byo.yaml"
    job.write_text(
        yaml.safe_dump({**yaml.safe_load((ROOT / "examples" / "byo" / "job.yaml").read_text()), "head_start": False})
    )
    chaos = ["--preempt-at-step", "1000,2000", "--creation-delay", "0.2s", "--sweep-every", "2s"]
    report, stderr = run_local(job, workdir, "--entrypoint", "python examples/byo/train.py", chaos=chaos, timeout=300)
    detail = f"report: {json.dumps(report, indent=1)[:3000]}\nstderr tail:\n{stderr[-3000:]}"
    assert report["status"] == "SUCCEEDED" and report["final_step"] == 3000, detail
    assert report["exact"] is True and report["params_sha256"] == report["reference_sha256"], detail
    assert (report["preemptions"], report["lost_steps"], report["failures"]) == (2, 0, 0), detail
    assert [z["restored_step"] > 0 for z in report["zones"]] == [False, True, True], detail
    assert report["machines_left"] == 0 and report["processes_left"] == 0, detail


def test_the_users_script_changes_in_a_few_lines_to_use_respawn_trainer() -> None:
    """examples/byo/train.py is train_plain.py plus at most 10 changed lines of code (docstrings aside)."""
    import ast
    import difflib

    def code(name: str) -> list[str]:
        text = (ROOT / "examples" / "byo" / name).read_text()
        doc = ast.get_docstring(ast.parse(text), clean=False) or ""
        return [line for line in text.replace(doc, "").splitlines() if line.strip()]

    plain, with_library = code("train_plain.py"), code("train.py")
    changed = [d for d in difflib.unified_diff(plain, with_library, lineterm="", n=0) if d[:1] in "+-"]
    added = [d for d in changed if d.startswith("+") and not d.startswith("+++")]
    assert 0 < len(added) <= 10 and "import respawn_trainer" in "\n".join(added), changed


def test_a_trainer_that_finds_only_cpu_devices_for_a_tpu_job_fails_once_naming_the_device(workdir: Path) -> None:
    """A machine whose CPU processes stand in for nothing (--no-stand-in), as an image of the wrong variant: the
    trainer fails before training, its `failed` entry names the device and the fix, and the job is FAILED on its
    first attempt, with max_failures 3 (no retry)."""
    need(FakeGcs.missing())
    job = own_program_job(workdir, "wrong-device", ["--model=tiny", "--steps=50"], max_failures=3)
    chaos = ["--creation-delay", "0.2s", "--sweep-every", "2s", "--no-stand-in", "--no-reference"]
    report, stderr = run_local(job, workdir, chaos=chaos, timeout=180)
    detail = f"report: {json.dumps(report, indent=1)[:3000]}\nstderr tail:\n{stderr[-3000:]}"
    assert report["status"] == "FAILED" and (report["attempts"], report["failures"]) == (1, 1), detail
    assert "has a TPU but JAX found only" in report["reason"] and "VARIANT=tpu" in report["reason"], detail
    assert "not retried" in report["reason"], detail
    assert report["machines_left"] == 0 and report["processes_left"] == 0, detail


@pytest.mark.parametrize(
    ("job_id", "entrypoint", "says"),
    [
        # respawn's trainer (as an entrypoint: `respawn local run` checks its flags before it runs the job itself):
        # its own `failed` entry says permanent, and it exits 2
        ("bad-flag", "python -m trainer", ["rejected its flags (fix: the job's args)", "--bogus is unknown"]),
        # a program that knows nothing of respawn: argparse exits 2, which the startup script reads as a usage error
        ("bad-flag-argparse", "python examples/byo/train_plain.py", ["code 2: a usage error", "fix: the job's args"]),
    ],
)
def test_a_bad_flag_fails_the_job_on_its_first_attempt_naming_the_cause_and_the_fix(
    workdir: Path, job_id: str, entrypoint: str, says: list[str]
) -> None:
    """The same args fail the same way on every machine: one attempt, FAILED, with max_failures 3 (no retry)."""
    need(FakeGcs.missing())
    job = own_program_job(workdir, job_id, ["--steps=5", "--bogus=1"], max_failures=3)
    chaos = ["--creation-delay", "0.2s", "--sweep-every", "2s", "--no-reference"]
    report, stderr = run_local(job, workdir, "--entrypoint", entrypoint, chaos=chaos, timeout=300)
    detail = f"report: {json.dumps(report, indent=1)[:3000]}\nstderr tail:\n{stderr[-3000:]}"
    assert report["status"] == "FAILED" and (report["attempts"], report["failures"]) == (1, 1), detail
    assert all(s in report["reason"] for s in says) and report["reason"].endswith("(permanent: not retried)"), detail
    assert report["machines_left"] == 0 and report["processes_left"] == 0, detail


def test_a_gpu_trainer_has_its_whole_grace_while_the_daemon_stops_containers_in_parallel(workdir: Path) -> None:
    """A preempted VM's docker daemon stops its containers alongside the shutdown script, each with its own stop
    timeout (docker's default 10 s): the container is run with --stop-timeout of the GPU grace (25 s), so a final
    save of 12 s lands and the program exits 0 (`stopped`), where the default would kill it at 10 s (exit 137)."""
    need(FakeGcs.missing())
    gpu = json.loads((ROOT / "tests" / "data" / "job_gpu.json").read_text())
    job = own_program_job(
        workdir,
        "slow-save",
        ["--steps=30", "--step-time=0.2", "--save-time=12"],
        machine=gpu["machine"],
        zones=["europe-west4-b"],
        checkpoint_uri="gs://respawn-local-checkpoints/runs/slow-save",
    )
    entrypoint = f"python {PROGRAMS / 'plain_train.py'}"
    chaos = ["--preempt-at-step", "4", "--creation-delay", "0.2s", "--sweep-every", "2s", "--no-reference"]
    report, stderr = run_local(job, workdir, "--entrypoint", entrypoint, chaos=chaos, timeout=240)
    detail = f"report: {json.dumps(report, indent=1)[:3000]}\nstderr tail:\n{stderr[-3000:]}"
    assert report["status"] == "SUCCEEDED" and (report["attempts"], report["preemptions"]) == (2, 1), detail
    log = (Path(report["run_dir"]) / "machines" / "slow-save-a1.log").read_text(errors="replace")
    assert "final save done after 12s" in log, log[-3000:]
    stopped = [(e["attempt"], e["payload"]["exit_code"]) for e in entries(report["run_dir"], "stopped")]
    assert stopped == [(1, 0)], detail
