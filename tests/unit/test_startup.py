"""The startup script, run for real by bash with fake `docker`/`gcloud`/`nvidia-*` commands on PATH."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from respawn.adapters import startup
from respawn.adapters.startup import GRACE_S, grace_s, machine_labels, machine_metadata, startup_script
from respawn.events import EXIT_CODE, Event, TrainerCompleted, TrainerFailed
from respawn.model import GpuMachine, JobSpec, TpuMachine
from respawn.parsing import log_entry_event

HOSTILE = [
    "'; touch CANARY; echo '",
    '"; touch CANARY; echo "',
    "$(touch CANARY)",
    "`touch CANARY`",
    "a\nb\ttouch CANARY\n",
    "--privileged",
    "*",
    "\\",
    "",
    "ünïcødé ✓ $HOME ${PATH} !! &&|| >x <y",
]

FAKE = """#!{python}
import json, os, pathlib, sys, time
log = os.environ["FAKE_LOG"]
with open(log, "a") as f:
    f.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\\n")
cmd = sys.argv[1] if len(sys.argv) > 1 else ""
if os.path.basename(sys.argv[0]) == "gcloud" and sys.argv[1:4] == ["secrets", "versions", "access"]:
    values = json.loads(os.environ.get("FAKE_SECRETS", "{{}}"))
    if sys.argv[4] not in values:
        sys.exit("ERROR: (gcloud.secrets.versions.access) NOT_FOUND: " + sys.argv[4])
    sys.stdout.write(values[sys.argv[4]])
if os.path.basename(sys.argv[0]) == "docker" and cmd == "run":  # what `-e NAME` (no value) passes on
    names = [a for flag, a in zip(sys.argv, sys.argv[1:]) if flag == "-e" and "=" not in a]
    pathlib.Path(log + ".env").write_text(json.dumps({{n: os.environ.get(n) for n in names}}))
stopped = pathlib.Path(log + ".stopped")
if os.path.basename(sys.argv[0]) == "docker" and cmd == "stop":
    stopped.touch()
if os.path.basename(sys.argv[0]) == "docker" and cmd == "run":
    if os.environ.get("FAKE_BLOCK"):
        pathlib.Path(log + ".running").touch()
        while not stopped.exists():
            time.sleep(0.01)
    sys.exit(int(os.environ.get("FAKE_RUN_RC", "0")))
"""


# The metadata server: the value of FAKE_AGENT_WORKER_NUMBER / FAKE_PREEMPTED / FAKE_ENDPOINTS, else HTTP 404
# (curl -f exits 22).
FAKE_CURL = """#!/bin/sh
for url; do :; done
case "${url##*/}" in
  agent-worker-number) answer=${FAKE_AGENT_WORKER_NUMBER-} ;;
  preempted) answer=${FAKE_PREEMPTED-} ;;
  worker-network-endpoints) answer=${FAKE_ENDPOINTS-} ;;
  *) answer= ;;
esac
[ -n "$answer" ] || exit 22
printf %s "$answer"
"""


def spec(kind: str = "tpu", **kw: object) -> JobSpec:
    machine = (
        TpuMachine("v5litepod-8", "v2-alpha-tpuv5-lite")
        if kind == "tpu"
        else GpuMachine("g2-standard-8", "nvidia-l4", 1)
    )
    base: dict[str, object] = dict(
        job_id="job-1",
        machine=machine,
        zones=("us-central1-a",),
        image="us-docker.pkg.dev/proj/repo/trainer:1",
        checkpoint_uri="gs://bucket/runs/job-1",
        args=("--steps=10",),
        env=(("KEY", "value"),),
    )
    return JobSpec(**{**base, **kw})  # type: ignore[arg-type]


@pytest.fixture
def fakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setattr(startup, "NOTICE_FILE", str(tmp_path / "notice"))  # /run on a machine
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("docker", "gcloud", "nvidia-smi", "nvidia-ctk", "curl"):
        path = bin_dir / name
        path.write_text(FAKE_CURL if name == "curl" else FAKE.format(python=sys.executable))
        path.chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "FAKE_LOG": str(tmp_path / "calls.jsonl"), "HOME": str(tmp_path)}


def calls(env: dict[str, str]) -> list[list[str]]:
    path = Path(env["FAKE_LOG"])
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run_script(tmp_path: Path, env: dict[str, str], s: JobSpec, **extra: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "startup.sh"
    script.write_text(startup_script(s, 3))
    return subprocess.run(
        ["bash", str(script)], cwd=tmp_path, env={**env, **extra}, capture_output=True, text=True, timeout=60
    )


def docker_run(env: dict[str, str]) -> list[str]:
    runs = [c for c in calls(env) if c[:2] == ["docker", "run"]]
    assert len(runs) == 1
    return runs[0]


def test_hostile_strings_arrive_byte_exact(tmp_path: Path, fakes: dict[str, str]) -> None:
    env = tuple(sorted((f"K{i}", v) for i, v in enumerate(HOSTILE)))
    image = "registry.example.com/x/$(touch CANARY):`touch CANARY`"
    uri = "gs://bucket/'$(touch CANARY)'"
    s = spec(args=tuple(HOSTILE), env=env, image=image, checkpoint_uri=uri, labels=(("l", "$(touch CANARY)"),))

    result = run_script(tmp_path, fakes, s)

    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "CANARY").exists()
    argv = docker_run(fakes)
    image_at = argv.index(image)
    assert argv[image_at + 1 :] == HOSTILE
    options = argv[:image_at]
    assert options[:7] == ["docker", "run", "--rm", "--name", "respawn-trainer", "--net=host", "--privileged"]
    env_pairs = [options[i + 1] for i, o in enumerate(options) if o == "-e"]
    assert env_pairs == [f"{k}={v}" for k, v in env] + [
        "RESPAWN_JOB_ID=job-1",
        "RESPAWN_ATTEMPT=3",
        f"RESPAWN_CHECKPOINT_URI={uri}",
        "RESPAWN_LOG_SINK=cloud",
        "RESPAWN_GRACE_S=8",  # a TPU VM's notice is about 10 s
        "RESPAWN_PROGRESS_S=60",  # the default hang_timeout (30m) / 4, at most once a minute
        "TPU_WORKER_ID",  # this worker of the slice, exported by the script from the metadata server
        "TPU_WORKER_HOSTNAMES",
    ]
    assert ["docker", "pull", image] in calls(fakes)
    assert not [c for c in calls(fakes) if c[:2] == ["gcloud", "auth"]]  # not an Artifact Registry image


def test_artifact_registry_login_then_pull_then_run(tmp_path: Path, fakes: dict[str, str]) -> None:
    result = run_script(tmp_path, fakes, spec())
    assert result.returncode == 0, result.stderr
    seq = [c[:3] for c in calls(fakes)]
    assert seq == [
        ["gcloud", "auth", "configure-docker"],
        ["docker", "pull", "us-docker.pkg.dev/proj/repo/trainer:1"],
        ["docker", "rm", "-f"],
        ["docker", "run", "--rm"],
        ["gcloud", "logging", "write"],  # the exit code's `completed`
    ]
    assert calls(fakes)[0] == ["gcloud", "auth", "configure-docker", "us-docker.pkg.dev", "--quiet"]


def test_gpu_vm_runs_with_all_gpus(tmp_path: Path, fakes: dict[str, str]) -> None:
    result = run_script(tmp_path, fakes, spec("gpu"))
    assert result.returncode == 0, result.stderr
    argv = docker_run(fakes)
    assert argv[6:8] == ["--gpus", "all"] and "--privileged" not in argv
    assert ["nvidia-smi"] in calls(fakes)  # waited for the driver


def test_the_containers_output_goes_to_cloud_logging_tagged_with_its_job(tmp_path: Path, fakes: dict[str, str]) -> None:
    from respawn.joblogs import ATTEMPT_ENV, CONTAINER_LOG, JOB_ENV

    run_script(tmp_path, fakes, spec())
    argv = docker_run(fakes)
    assert CONTAINER_LOG == "gcplogs-docker-driver"  # the log docker's gcplogs driver writes to
    assert "--log-driver=gcplogs" in argv and f"--log-opt=env={JOB_ENV},{ATTEMPT_ENV}" in argv
    assert f"{JOB_ENV}=job-1" in argv and f"{ATTEMPT_ENV}=3" in argv  # the values the driver copies


def test_job_env_cannot_override_respawn_env(tmp_path: Path, fakes: dict[str, str]) -> None:
    s = spec(env=(("RESPAWN_ATTEMPT", "99"), ("RESPAWN_JOB_ID", "other")))
    run_script(tmp_path, fakes, s)
    argv = docker_run(fakes)
    assert "RESPAWN_ATTEMPT=3" in argv and "RESPAWN_JOB_ID=job-1" in argv
    assert "RESPAWN_ATTEMPT=99" not in argv and "RESPAWN_JOB_ID=other" not in argv


def test_trainer_exit_code_is_the_scripts(tmp_path: Path, fakes: dict[str, str]) -> None:
    assert run_script(tmp_path, fakes, spec(), FAKE_RUN_RC="3").returncode == 3


def said(env: dict[str, str]) -> list[tuple[dict[str, Any], str]]:
    """(jsonPayload, severity) of every entry the script wrote with `gcloud logging write respawn-trainer`."""
    writes = [c for c in calls(env) if c[:3] == ["gcloud", "logging", "write"]]
    assert all(w[3] == "respawn-trainer" and "--payload-type=json" in w for w in writes), writes
    return [(json.loads(w[4]), w[-1].removeprefix("--severity=")) for w in writes]


def parsed(payload: dict[str, Any]) -> Event:
    """What the control plane makes of an entry the script wrote (gcloud gives it resource `global`, no labels)."""
    entry = {"logName": "projects/p/logs/respawn-trainer", "timestamp": "2026-11-21T10:00:00Z", "insertId": "x1"}
    return log_entry_event({**entry, "jsonPayload": payload})


# (exit code, TPU worker, metadata instance/preempted) -> the entry the script writes for the trainer
EXITS = [
    (0, None, None, "completed", "INFO"),  # a program that knows nothing of respawn finished
    (0, "0", "FALSE", "completed", "INFO"),
    (0, "2", None, None, None),  # worker 0 speaks for a slice
    (3, "2", None, "failed", "ERROR"),  # any worker's failure recreates the slice
    (137, None, None, "failed", "ERROR"),  # killed without a word (OOM)
    (0, None, "TRUE", "stopped", "WARNING"),  # the trainer acted on the metadata flag before any signal
    (0, "1", "TRUE", None, None),
    (137, None, "TRUE", None, None),  # killed after the notice: the preemption's system event speaks for it
]


@pytest.mark.parametrize(("rc", "worker", "preempted", "event", "severity"), EXITS)
def test_the_exit_code_speaks_for_the_trainer(
    tmp_path: Path,
    fakes: dict[str, str],
    rc: int,
    worker: str | None,
    preempted: str | None,
    event: str | None,
    severity: str | None,
) -> None:
    metadata = {"FAKE_AGENT_WORKER_NUMBER": worker, "FAKE_PREEMPTED": preempted}
    extra = {k: v for k, v in metadata.items() if v is not None}
    assert run_script(tmp_path, fakes, spec(), FAKE_RUN_RC=str(rc), **extra).returncode == rc
    if event is None:
        assert said(fakes) == []
        return
    ((payload, how),) = said(fakes)
    base = {"job_id": "job-1", "attempt": 3, "worker": int(worker or 0), "source": "exit-code", "exit_code": rc}
    error = {"error": f"the trainer exited with code {rc}"} if event == "failed" else {}
    assert payload == {"event": event, **base, **error} and how == severity
    got = parsed(payload)
    if event == "completed":
        assert got == TrainerCompleted("log:x1", got.time, "job-1", 3, None, {}, source=EXIT_CODE)  # type: ignore[union-attr]
    elif event == "failed":
        assert isinstance(got, TrainerFailed) and (got.error, got.worker) == (error["error"], int(worker or 0))
    else:  # a stopped entry without a step records nothing: the preemption's event recreates the machine
        assert "no step" in getattr(got, "reason", "")


def start_blocked(tmp_path: Path, fakes: dict[str, str], rc: int) -> subprocess.Popen[bytes]:
    """The script with its trainer running until `docker stop`, after which the trainer exits `rc`."""
    script = tmp_path / "startup.sh"
    script.write_text(startup_script(spec(), 3))
    env = {**fakes, "FAKE_BLOCK": "1", "FAKE_RUN_RC": str(rc)}
    proc = subprocess.Popen(
        ["bash", str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    running = Path(fakes["FAKE_LOG"] + ".running")
    deadline = time.monotonic() + 30
    while not running.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.01)
    assert running.exists(), proc.communicate()
    return proc


@pytest.mark.parametrize("rc", [0, 143])
def test_shutdown_signal_stops_the_container_with_the_grace_period(
    tmp_path: Path, fakes: dict[str, str], rc: int
) -> None:
    proc = start_blocked(tmp_path, fakes, rc)
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == rc  # the container's exit code, after docker stop
    finally:
        if proc.poll() is None:
            proc.kill()
    assert ["docker", "stop", "-t", str(GRACE_S["tpu"]), "respawn-trainer"] in calls(fakes)
    # a preemption is no failure; a trainer that saved and exited 0 is `stopped` (it may have said so itself)
    assert [(p["event"], how) for p, how in said(fakes)] == ([("stopped", "WARNING")] if rc == 0 else [])


def test_after_the_shutdown_script_a_clean_exit_is_stopped_not_completed(tmp_path: Path, fakes: dict[str, str]) -> None:
    """The notice runs the metadata shutdown-script, which may stop the container before the startup script hears of
    it: the marker it leaves first is what tells a preempted trainer's exit 0 from a finished one's."""
    proc = start_blocked(tmp_path, fakes, 0)
    try:
        shutdown = tmp_path / "shutdown.sh"
        shutdown.write_text(machine_metadata(spec(), 3)["shutdown-script"])
        subprocess.run(["bash", str(shutdown)], env=fakes, check=True, timeout=30)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert [(p["event"], p["source"]) for p, _ in said(fakes)] == [("stopped", "exit-code")]
    assert Path(startup.NOTICE_FILE).exists()


def test_a_notice_left_by_an_earlier_boot_is_cleared(tmp_path: Path, fakes: dict[str, str]) -> None:
    Path(startup.NOTICE_FILE).touch()  # a Spot VM stopped and started again runs the startup script anew
    run_script(tmp_path, fakes, spec())
    assert [p["event"] for p, _ in said(fakes)] == ["completed"]


SECRETS = (("HF_TOKEN", "projects/proj/secrets/hf/versions/3"), ("WANDB_KEY", "projects/42/secrets/wb/versions/latest"))
VALUES = {
    "projects/proj/secrets/hf/versions/3": "hf_TOKEN7f3a $(touch CANARY)'\"\n",
    "projects/42/secrets/wb/versions/latest": "wb_TOKEN9c1e",
}


def no_sleep(env: dict[str, str]) -> None:
    """The script's pauses between tries, skipped."""
    path = Path(env["PATH"].split(":")[0]) / "sleep"
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)


def test_secrets_reach_the_container_by_name_only(tmp_path: Path, fakes: dict[str, str]) -> None:
    s = spec(secrets=SECRETS)
    result = run_script(tmp_path, fakes, s, FAKE_SECRETS=json.dumps(VALUES))

    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "CANARY").exists()
    reads = [c for c in calls(fakes) if c[:4] == ["gcloud", "secrets", "versions", "access"]]
    assert reads == [["gcloud", "secrets", "versions", "access", ref, "--quiet"] for _, ref in SECRETS]
    argv = docker_run(fakes)
    assert [argv[i + 1] for i, o in enumerate(argv) if o == "-e"][-2:] == ["HF_TOKEN", "WANDB_KEY"]
    passed = json.loads(Path(fakes["FAKE_LOG"] + ".env").read_text())
    assert {name: passed[name] for name, _ in SECRETS} == {name: VALUES[ref] for name, ref in SECRETS}  # byte-exact
    meta = machine_metadata(s, 3)
    assert json.loads(meta["respawn-secrets"]) == dict(SECRETS)
    for token in ("TOKEN7f3a", "TOKEN9c1e"):  # nowhere but the container's environment
        assert token not in json.dumps(meta) and token not in json.dumps(calls(fakes)) and token not in result.stderr


def test_an_unreadable_secret_is_a_failed_entry_naming_it(tmp_path: Path, fakes: dict[str, str]) -> None:
    no_sleep(fakes)
    readable = {SECRETS[0][1]: "hf"}
    result = run_script(tmp_path, fakes, spec(secrets=SECRETS), FAKE_SECRETS=json.dumps(readable))

    assert result.returncode == 1
    assert not [c for c in calls(fakes) if c[0] == "docker"]  # no container without its secrets
    reads = [c[4] for c in calls(fakes) if c[:4] == ["gcloud", "secrets", "versions", "access"]]
    assert reads == [SECRETS[0][1]] + [SECRETS[1][1]] * 3  # tried three times
    writes = [c for c in calls(fakes) if c[:3] == ["gcloud", "logging", "write"]]
    assert len(writes) == 1
    payload = json.loads(writes[0][4])
    assert payload == {
        "event": "failed",
        "job_id": "job-1",
        "attempt": 3,
        "worker": 0,
        "error": f"could not read secret WANDB_KEY from {SECRETS[1][1]}",
    }
    entry = {"logName": "projects/p/logs/respawn-trainer", "insertId": "x2", "jsonPayload": payload}
    assert isinstance(log_entry_event({**entry, "timestamp": "2026-11-21T10:00:00Z"}), TrainerFailed)


def test_metadata_and_labels() -> None:
    s = spec(args=tuple(HOSTILE), labels=(("team", "nlp"), ("respawn-job", "spoofed")))
    meta = machine_metadata(s, 2)
    assert set(meta) == {
        "startup-script",
        "shutdown-script",
        "respawn-job-id",
        "respawn-attempt",
        "respawn-checkpoint-uri",
        "respawn-image",
        "respawn-args",
        "respawn-env",
        "respawn-progress-s",
    }
    assert json.loads(meta["respawn-args"]) == HOSTILE
    assert json.loads(meta["respawn-env"]) == {"KEY": "value"}
    assert (meta["respawn-job-id"], meta["respawn-attempt"]) == ("job-1", "2")
    assert meta["respawn-image"] == s.image and meta["respawn-checkpoint-uri"] == s.checkpoint_uri
    assert f"docker stop -t {GRACE_S['tpu']} respawn-trainer" in meta["shutdown-script"]
    assert "docker stop -t 25 respawn-trainer" in machine_metadata(spec("gpu"), 2)["shutdown-script"]
    assert (grace_s(s), grace_s(spec("gpu"))) == (8, 25)  # inside the 10 s a TPU gets and the 30 s a Spot VM gets
    assert machine_labels(s, 2) == {
        "team": "nlp",
        "respawn-job": "job-1",
        "respawn-managed": "true",
        "respawn-attempt": "2",
    }


def test_image_that_looks_like_an_option_is_refused() -> None:
    with pytest.raises(ValueError, match="image"):
        startup_script(spec(image="--privileged"), 1)


@pytest.mark.parametrize(
    ("endpoints", "hosts"),
    [
        ("unknown:unknown:10.130.0.25,unknown:unknown:10.130.0.26", "10.130.0.25,10.130.0.26"),  # NAME:ID:IP
        ("t1v-n-1-w-0,t1v-n-1-w-1,t1v-n-1-w-2", "t1v-n-1-w-0,t1v-n-1-w-1,t1v-n-1-w-2"),  # host names
    ],
)
def test_each_tpu_worker_tells_its_trainer_which_host_of_the_slice_it_is(
    tmp_path: Path, fakes: dict[str, str], endpoints: str, hosts: str
) -> None:
    """docker passes only the variables it is given: the worker index and the slice's hosts go in explicitly."""
    assert run_script(tmp_path, fakes, spec(), FAKE_AGENT_WORKER_NUMBER="1", FAKE_ENDPOINTS=endpoints).returncode == 0
    workers = json.loads(Path(fakes["FAKE_LOG"] + ".env").read_text())
    assert workers == {"TPU_WORKER_ID": "1", "TPU_WORKER_HOSTNAMES": hosts}
    (run,) = [c for c in calls(fakes) if c[:2] == ["docker", "run"]]
    assert run[run.index("TPU_WORKER_ID") - 1 :][:4] == ["-e", "TPU_WORKER_ID", "-e", "TPU_WORKER_HOSTNAMES"]
