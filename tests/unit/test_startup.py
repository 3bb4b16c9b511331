"""The startup script, run for real by bash with fake `docker`/`gcloud`/`nvidia-*` commands on PATH."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from localcloud.machines.machine_host import MetadataServer
from respawn.adapters import startup
from respawn.adapters.startup import grace_s, machine_labels, machine_metadata, startup_script
from respawn.events import EXIT_CODE, Event, MachineNoticed, TrainerCompleted, TrainerFailed
from respawn.jobs import GpuMachine, JobSpec, TpuMachine
from respawn.machine import (
    GRACE_S,
    OOM_KILLED,
    PERMANENT_RC,
    drain_marker,
    exit_code_entry,
    exit_code_failure,
)
from respawn.parsing import log_entry_event
from respawn.topology import compute_shape

pytestmark = pytest.mark.waits

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

FAKE = """#!{python} -S
import json, os, pathlib, sys, time
log = os.environ["FAKE_LOG"]
with open(log, "a") as f:
    f.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\\n")
cmd = sys.argv[1] if len(sys.argv) > 1 else ""
if os.path.basename(sys.argv[0]) == "gcloud":  # Ubuntu's snap, as it fails during shutdown: never needed
    sys.exit("error: cannot perform operation: TransactionIsDestructive: a system shutdown is in progress")
if os.path.basename(sys.argv[0]) == "docker" and cmd == "run":  # what `-e NAME` (no value) passes on
    names = [a for flag, a in zip(sys.argv, sys.argv[1:]) if flag == "-e" and "=" not in a]
    pathlib.Path(log + ".env").write_text(json.dumps({{n: os.environ.get(n) for n in names}}))
    with open(log + ".envs", "a") as f:  # every run's
        f.write(json.dumps({{n: os.environ.get(n) for n in names}}) + "\\n")
if os.path.basename(sys.argv[0]) == "docker" and cmd == "run":  # the daemon: the log driver first, then the program
    if "--log-driver=gcplogs" in sys.argv and os.environ.get("FAKE_GCPLOGS_DOWN"):
        sys.stderr.write(pathlib.Path(os.environ["FAKE_GCPLOGS_ERROR"]).read_text())
        sys.exit(125)
    if "--entrypoint" in sys.argv:  # a program the image does not have
        sys.exit('docker: Error response from daemon: failed to create task for container: exec: "' +
                 sys.argv[sys.argv.index("--entrypoint") + 1] + '": no such file or directory: unknown.')
if os.path.basename(sys.argv[0]) == "docker" and cmd == "login":  # the password comes on stdin
    pathlib.Path(log + ".login").write_text(sys.stdin.read())
images = pathlib.Path(log + ".images")  # the machine's image store: the images pulled (or baked), one a line
if os.path.basename(sys.argv[0]) == "docker" and cmd == "image":  # image inspect [--format F] NAME
    has = images.exists() and sys.argv[-1] in images.read_text().splitlines()
    if has and "--format" in sys.argv:  # the labels, as `{{{{json .Config.Labels}}}}` prints them
        print(os.environ.get("FAKE_LABELS", "null"))
    sys.exit(0 if has else 1)
if os.path.basename(sys.argv[0]) == "docker" and cmd == "pull":
    if os.environ.get("FAKE_REGISTRY_DOWN"):
        sys.exit("Error response from daemon: Get https://registry/v2/: dial tcp: i/o timeout")
    with images.open("a") as f:
        f.write(sys.argv[2] + "\\n")
if os.path.basename(sys.argv[0]) == "docker" and cmd == "events":  # the daemon's past events: FAKE_OOM's container
    if "event=oom" in sys.argv and os.environ.get("FAKE_OOM"):  # was killed by the kernel's OOM killer
        print(os.environ["FAKE_OOM"])
    sys.exit(0)
stopped = pathlib.Path(log + ".stopped")
if os.path.basename(sys.argv[0]) == "docker" and cmd == "stop":
    stopped.touch()
if os.path.basename(sys.argv[0]) == "docker" and cmd == "run":
    if os.environ.get("FAKE_PEER_NOTICE"):  # a trainer that stops on a slice peer's notice leaves the notice file
        pathlib.Path(os.environ["RESPAWN_NOTICE_FILE"]).touch()
    if os.environ.get("FAKE_BLOCK"):
        pathlib.Path(log + ".running").touch()
        while not stopped.exists():
            time.sleep(0.01)
    rcs = os.environ.get("FAKE_RUN_RCS", "").split()  # one exit code a run, the last for every run after
    runs = len(pathlib.Path(log + ".envs").read_text().splitlines())
    if os.environ.get("FAKE_RAN_WORLD") and runs == 1:  # the first run joined that world in its own process
        copy = pathlib.Path(os.environ["RESPAWN_LOCAL_COPY_DIR"])
        copy.mkdir(parents=True, exist_ok=True)
        (copy / "world").write_text(os.environ["FAKE_RAN_WORLD"] + "\\n")
    sys.exit(int(rcs[min(runs, len(rcs)) - 1] if rcs else os.environ.get("FAKE_RUN_RC", "0")))
"""


def spec(kind: str = "tpu", tpu: str = "v5litepod-8", **kw: object) -> JobSpec:
    machine: TpuMachine | GpuMachine
    if kind == "compute":  # a TPU through Compute Engine: an instance, or a slice MIG
        machine = TpuMachine(tpu, api="compute")
    elif kind == "tpu":
        machine = TpuMachine(tpu, "v2-alpha-tpuv5-lite")
    else:
        machine = GpuMachine("g2-standard-8", "nvidia-l4", 1)
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


# curl as the metadata server and Google's REST APIs answer it (tests/data: the token, a secret's access response),
# recording every REST call as ["curl", METHOD, URL, AUTHORIZATION, BODY]. FAKE_SECRETS maps a secret version to its
# value; a version not there is a 404 (curl -f exits 22), and so is a call without the token. The metadata server
# answers FAKE_AGENT_WORKER_NUMBER / FAKE_PREEMPTED / FAKE_ENDPOINTS / FAKE_START_AFTER, else 404; with
# FAKE_SLICE_LATE=N, worker-network-endpoints answers 404 to its first N reads (a VM booted before its slice's
# metadata is complete).
FAKE_REST_CURL = """#!{python} -S
import base64, json, os, pathlib, sys
data = pathlib.Path(os.environ["FAKE_DATA"])
args, headers, method, body, url = sys.argv[1:], {{}}, "GET", None, ""
i = 0
while i < len(args):
    a = args[i]
    if a in ("-m", "-H", "-X", "--data-binary"):
        v = args[i + 1]
        i += 2
        if a == "-H":
            k, _, val = v.partition(":")
            headers[k.strip().lower()] = val.strip()
        elif a == "-X":
            method = v
        elif a == "--data-binary":
            body = sys.stdin.read() if v == "@-" else v
        continue
    if not a.startswith("-"):
        url = a
    i += 1
md = "http://metadata.google.internal/computeMetadata/v1/"
if url.startswith(md):
    key = url[len(md):]
    answers = {{
        "instance/service-accounts/default/token": (data / "metadata_token.json").read_text(),
        "project/project-id": os.environ.get("FAKE_PROJECT", ""),
        "instance/attributes/agent-worker-number": os.environ.get("FAKE_AGENT_WORKER_NUMBER", ""),
        "instance/attributes/worker-network-endpoints": os.environ.get("FAKE_ENDPOINTS", ""),
        "instance/attributes/respawn-start-after": os.environ.get("FAKE_START_AFTER", ""),
        "instance/preempted": os.environ.get("FAKE_PREEMPTED", ""),
    }}
    if key == "instance/attributes/worker-network-endpoints" and os.environ.get("FAKE_SLICE_LATE"):
        reads = pathlib.Path(os.environ["FAKE_LOG"] + ".md")
        n = int(reads.read_text()) + 1 if reads.exists() else 1
        reads.write_text(str(n))
        if n <= int(os.environ["FAKE_SLICE_LATE"]):
            sys.exit(22)
    if headers.get("metadata-flavor") != "Google" or not answers.get(key):
        sys.exit(22)
    sys.stdout.write(answers[key])
    sys.exit(0)
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps(["curl", method, url, headers.get("authorization"), body]) + "\\n")
token = json.loads((data / "metadata_token.json").read_text())["access_token"]
if headers.get("authorization") != "Bearer " + token:
    sys.exit(22)
if url == "https://logging.googleapis.com/v2/entries:write" and method == "POST":
    sys.stdout.write("{{}}")
    sys.exit(0)
prefix, suffix = "https://secretmanager.googleapis.com/v1/", ":access"
if url.startswith(prefix) and url.endswith(suffix):
    values = json.loads(os.environ.get("FAKE_SECRETS", "{{}}"))
    name = url[len(prefix):-len(suffix)]
    if name not in values:
        sys.exit(22)
    answer = json.loads((data / "secretmanager_access_response.json").read_text())
    answer["name"] = name
    answer["payload"]["data"] = base64.b64encode(values[name].encode()).decode()
    sys.stdout.write(json.dumps(answer, indent=2))
    sys.exit(0)
sys.exit(22)
"""

DATA = Path(__file__).parent.parent / "data"


@pytest.fixture
def fakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setattr(startup, "NOTICE_FILE", str(tmp_path / "notice"))  # /run on a machine
    monkeypatch.setattr(startup, "IMAGE_MARK", str(tmp_path / "disk" / "trainer-image"))  # /var/lib on a machine
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("docker", "gcloud", "nvidia-smi", "nvidia-ctk", "curl"):
        path = bin_dir / name
        path.write_text((FAKE_REST_CURL if name == "curl" else FAKE).format(python=sys.executable))
        path.chmod(0o755)
    log = str(tmp_path / "calls.jsonl")
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "FAKE_LOG": log, "HOME": str(tmp_path), "FAKE_DATA": str(DATA)} | {
        "FAKE_PROJECT": "my-project",
        startup.DATA_DIR_ENV: str(tmp_path / "disk" / "data"),  # /var/lib on a machine
    }


def calls(env: dict[str, str]) -> list[list[str]]:
    path = Path(env["FAKE_LOG"])
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


BASH = shutil.which("bash") or "/bin/bash"


def run_script(tmp_path: Path, env: dict[str, str], s: JobSpec, **extra: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "startup.sh"
    script.write_text(startup_script(s, 3))
    return subprocess.run(
        [BASH, str(script)], cwd=tmp_path, env={**env, **extra}, capture_output=True, text=True, timeout=60
    )


def place(env: dict[str, str]) -> dict[str, str]:
    """The slice place `docker run -e NAME` passed on to the trainer (the fake docker's record)."""
    passed = json.loads(Path(env["FAKE_LOG"] + ".env").read_text())
    return {k: v for k, v in passed.items() if k.startswith("TPU_WORKER_")}


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
    assert options[:10] == [
        *("docker", "run", "--rm", "--name", "respawn-trainer", "--net=host"),
        "--stop-timeout=9",  # the daemon's own stop as the VM shuts down: the TPU grace (8 s) and a second to exit
        "--privileged",
        "--ulimit",
        "memlock=-1:-1",  # vfio-pci's pinned memory, for the image's non-root user (docs/compute-engine.md)
    ]
    env_pairs = [options[i + 1] for i, o in enumerate(options) if o == "-e"]
    assert env_pairs == [f"{k}={v}" for k, v in env] + [
        "RESPAWN_JOB_ID=job-1",
        "RESPAWN_ATTEMPT=3",
        f"RESPAWN_CHECKPOINT_URI={uri}",
        "RESPAWN_LOG_SINK=cloud",
        "RESPAWN_GRACE_S=8",  # a TPU VM's notice is about 10 s
        "RESPAWN_ACCELERATOR=tpu",  # the trainer fails at once where JAX finds no TPU
        "RESPAWN_PROGRESS_S=60",  # the default hang_timeout (30m) / 4, at most once a minute
        f"RESPAWN_HANDOVER={uri}.respawn/attempt-3",  # the head start is on by default: where it hands over
        "TPU_WORKER_ID",  # this worker of the slice, exported by the script from the metadata server
        "TPU_WORKER_HOSTNAMES",
        "RESPAWN_NOTICE_FILE",  # the script's notice file, in a directory mounted at the same path
        "RESPAWN_DATA_DIR",  # the machine's data directory, mounted at the same path (the trainer's shard copies)
        "RESPAWN_TAKEOVER",  # set by the script on a head start's machine whose image takes over itself
        "RESPAWN_START_AFTER",
        "RESPAWN_WORLD_VERSION",  # set by the script on a slice of a world of several (the metadata's respawn-world)
        "RESPAWN_SLICE",
        "RESPAWN_LOCAL_COPY_DIR",
    ]
    assert options[options.index("-v") + 1] == "/run/respawn:/run/respawn"
    assert ["docker", "pull", image] in calls(fakes)
    assert not [c for c in calls(fakes) if c[:2] == ["docker", "login"]]  # not an Artifact Registry image


def test_artifact_registry_login_then_pull_then_run(tmp_path: Path, fakes: dict[str, str]) -> None:
    result = run_script(tmp_path, fakes, spec())
    assert result.returncode == 0, result.stderr
    seq = [c[:3] for c in calls(fakes)]
    assert seq == [
        ["docker", "login", "-u"],  # the machine's token as the password
        ["docker", "image", "inspect"],  # not on this machine yet
        ["docker", "pull", "us-docker.pkg.dev/proj/repo/trainer:1"],
        ["docker", "image", "inspect"],  # pulled: noted on the machine's disk
        ["docker", "rm", "-f"],
        ["docker", "run", "--rm"],
        ["curl", "POST", "https://logging.googleapis.com/v2/entries:write"],  # the exit code's `completed`
    ]


IMAGE = "us-docker.pkg.dev/proj/repo/trainer:1"


def pulls(env: dict[str, str]) -> list[list[str]]:
    return [c for c in calls(env) if c[:2] == ["docker", "pull"]]


def trainer_runs(env: dict[str, str]) -> int:
    return len([c for c in calls(env) if c[:2] == ["docker", "run"]])


def test_the_image_is_pulled_once_per_machine_and_reused_when_it_boots_again(
    tmp_path: Path, fakes: dict[str, str]
) -> None:
    """A Spot VM stopped and started again keeps its disk: its next boot runs the image the first one pulled."""
    first = run_script(tmp_path, fakes, spec())
    second = run_script(tmp_path, fakes, spec())
    assert first.returncode == second.returncode == 0, second.stderr
    assert pulls(fakes) == [["docker", "pull", IMAGE]]
    assert "not pulled again" in second.stderr and "not pulled again" not in first.stderr
    assert trainer_runs(fakes) == 2


def test_an_image_baked_under_a_tag_is_refreshed_once_then_reused(tmp_path: Path, fakes: dict[str, str]) -> None:
    """On the boot image under a tag: the first boot fetches what changed since it was baked, later boots nothing."""
    Path(fakes["FAKE_LOG"] + ".images").write_text(IMAGE + "\n")
    for _ in range(2):
        assert run_script(tmp_path, fakes, spec()).returncode == 0
    assert pulls(fakes) == [["docker", "pull", IMAGE]]
    assert trainer_runs(fakes) == 2


def test_a_baked_image_runs_when_its_registry_is_out_of_reach(tmp_path: Path, fakes: dict[str, str]) -> None:
    Path(fakes["FAKE_LOG"] + ".images").write_text(IMAGE + "\n")
    result = run_script(tmp_path, fakes, spec(), FAKE_REGISTRY_DOWN="1")
    assert result.returncode == 0, result.stderr
    assert len(pulls(fakes)) == 1  # one try, no retries: the machine has a copy
    assert "running the copy on this machine" in result.stderr
    assert trainer_runs(fakes) == 1


def test_an_image_pinned_by_digest_that_the_machine_has_is_never_pulled(tmp_path: Path, fakes: dict[str, str]) -> None:
    image = "us-docker.pkg.dev/proj/repo/trainer@sha256:" + "a" * 64
    Path(fakes["FAKE_LOG"] + ".images").write_text(image + "\n")
    result = run_script(tmp_path, fakes, spec(image=image))
    assert result.returncode == 0, result.stderr
    assert pulls(fakes) == [] and trainer_runs(fakes) == 1
    assert "pinned by digest" in result.stderr


def test_a_machine_without_the_image_pulls_it_with_retries(tmp_path: Path, fakes: dict[str, str]) -> None:
    no_sleep(fakes)
    result = run_script(tmp_path, fakes, spec(), FAKE_REGISTRY_DOWN="1")
    assert len(pulls(fakes)) == 5 and result.stderr.count("image pull failed") == 5
    assert not (tmp_path / "disk" / "trainer-image").exists()  # nothing was pulled: nothing noted


def test_gpu_vm_runs_with_all_gpus(tmp_path: Path, fakes: dict[str, str]) -> None:
    result = run_script(tmp_path, fakes, spec("gpu"))
    assert result.returncode == 0, result.stderr
    argv = docker_run(fakes)
    assert argv[6:9] == ["--stop-timeout=26", "--gpus", "all"] and "--privileged" not in argv  # the 25 s grace
    assert ["nvidia-smi"] in calls(fakes)  # waited for the driver


def test_the_containers_output_goes_to_cloud_logging_tagged_with_its_job(tmp_path: Path, fakes: dict[str, str]) -> None:
    from respawn_ops.joblogs import ATTEMPT_ENV, CONTAINER_LOG, JOB_ENV

    run_script(tmp_path, fakes, spec())
    argv = docker_run(fakes)
    assert CONTAINER_LOG == "gcplogs-docker-driver"  # the log docker's gcplogs driver writes to
    assert "--log-driver=gcplogs" in argv and f"--log-opt=env={JOB_ENV},{ATTEMPT_ENV}" in argv
    assert f"{JOB_ENV}=job-1" in argv and f"{ATTEMPT_ENV}=3" in argv  # the values the driver copies


# --- container logs: Cloud Logging out of reach is no failure of the trainer's ---------------------------------------

GCPLOGS_DOWN = Path(__file__).parent.parent / "data" / "docker_gcplogs_unreachable.txt"  # what `docker run` prints


def runs(env: dict[str, str]) -> list[list[str]]:
    return [c for c in calls(env) if c[:2] == ["docker", "run"]]


def notes(env: dict[str, str]) -> list[dict[str, Any]]:
    """The script's notes in log respawn-startup (written in the background: waited for a moment)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = entries(env, "respawn-startup")
        if found:
            return [e["jsonPayload"] for e in found]
        time.sleep(0.05)
    return []


@pytest.mark.parametrize(
    ("error", "says"),
    [
        (GCPLOGS_DOWN, "PermissionDenied"),  # the driver's ping to Cloud Logging failed
        (GCPLOGS_DOWN.with_name("docker_gcplogs_missing.txt"), "no log driver named"),  # a docker built without it
    ],
    ids=["unreachable", "missing"],
)
def test_when_gcplogs_cannot_log_to_cloud_logging_the_trainer_runs_with_local_logs(
    tmp_path: Path, fakes: dict[str, str], error: Path, says: str
) -> None:
    result = run_script(tmp_path, fakes, spec(), FAKE_GCPLOGS_DOWN="1", FAKE_GCPLOGS_ERROR=str(error))

    assert result.returncode == 0, result.stderr
    first, probe, local = runs(fakes)
    assert "--log-driver=gcplogs" in first  # docker exits 125 before the trainer runs
    assert probe[probe.index("--entrypoint") :][:2] == ["--entrypoint", "/respawn-log-driver-probe"]
    assert "--log-driver=gcplogs" in probe and "--gpus" not in probe and "-e" not in probe  # runs nothing of the job's
    assert [a for a in local if a.startswith("--log")] == list(startup.LOCAL_LOGS)
    assert [a for a in local if not a.startswith("--log")] == [a for a in first if not a.startswith("--log")]
    assert [(p["event"], how) for p, how in said(fakes)] == [("completed", "INFO")]  # no failed entry
    assert "docker's gcplogs driver cannot log to Cloud Logging" in result.stderr
    assert says in result.stderr  # docker's own words, for the operator
    ((note,),) = [notes(fakes)]
    assert (note["note"], note["job_id"], note["attempt"], note["worker"]) == ("local-logs", "job-1", 3, 0)
    assert note["detail"].startswith("docker: Error response from daemon: ") and says in note["detail"]


def test_a_trainer_that_itself_exits_125_has_failed(tmp_path: Path, fakes: dict[str, str]) -> None:
    """125 is also any program's exit code: only a probe that fails on the log driver makes it docker's."""
    result = run_script(tmp_path, fakes, spec(), FAKE_RUN_RC="125")

    assert result.returncode == 125
    assert len(runs(fakes)) == 2  # the trainer, then the probe (which fails on its missing program, not on logs)
    ((payload, _),) = said(fakes)
    assert payload["event"] == "failed" and payload["error"] == "the trainer exited with code 125"
    assert not entries(fakes, "respawn-startup")  # no note


def test_when_docker_fails_with_local_logs_too_the_attempt_has_failed(tmp_path: Path, fakes: dict[str, str]) -> None:
    extra = {"FAKE_GCPLOGS_DOWN": "1", "FAKE_GCPLOGS_ERROR": str(GCPLOGS_DOWN), "FAKE_RUN_RC": "125"}
    result = run_script(tmp_path, fakes, spec(), **extra)

    assert result.returncode == 125
    assert len(runs(fakes)) == 3  # gcplogs, the probe, json-file: tried once with local logs, not again
    assert [p["event"] for p, _ in said(fakes)] == ["failed"]


def test_after_the_notice_a_125_is_not_run_again(tmp_path: Path, fakes: dict[str, str]) -> None:
    script = tmp_path / "startup.sh"
    script.write_text(startup_script(spec(), 3).replace('rm -f "$notice"\n', 'rm -f "$notice"\ntouch "$notice"\n'))
    env = {**fakes, "FAKE_GCPLOGS_DOWN": "1", "FAKE_GCPLOGS_ERROR": str(GCPLOGS_DOWN)}
    result = subprocess.run([BASH, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 125 and len(runs(fakes)) == 1  # a machine going away runs nothing more
    assert said(fakes) == []  # the preemption's event speaks for it


# --- Google's APIs through curl and the machine's token, never gcloud --------------------------------------------


@pytest.fixture
def no_gcloud(fakes: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """A boot image without gcloud (a PATH of the fakes and TOOLS only: not this machine's own gcloud)."""
    bin_dir = Path(fakes["PATH"].split(":")[0])
    (bin_dir / "gcloud").unlink()
    return {**fakes, "PATH": f"{bin_dir}:{tools(tmp_path)}"}


def rest(env: dict[str, str], url: str) -> list[list[Any]]:
    return [c for c in calls(env) if c[:1] == ["curl"] and c[2] == url]


WRITE = "https://logging.googleapis.com/v2/entries:write"
TOKEN = json.loads((DATA / "metadata_token.json").read_text())["access_token"]


def test_without_gcloud_lifecycle_entries_go_to_the_logging_api(tmp_path: Path, no_gcloud: dict[str, str]) -> None:
    result = run_script(tmp_path, no_gcloud, spec())

    assert result.returncode == 0, result.stderr
    ((_, method, _, auth, body),) = rest(no_gcloud, WRITE)
    assert (method, auth) == ("POST", f"Bearer {TOKEN}")  # the machine's token, from the metadata server
    assert json.loads(body) == json.loads((DATA / "logging_entries_write_request.json").read_text())
    (entry,) = json.loads(body)["entries"]
    # what the control plane makes of it, as of the entry gcloud would write (resource `global`)
    got = parsed(entry["jsonPayload"])
    assert isinstance(got, TrainerCompleted) and got.source == EXIT_CODE


def test_without_gcloud_docker_logs_in_to_artifact_registry_with_the_token(
    tmp_path: Path, no_gcloud: dict[str, str]
) -> None:
    assert run_script(tmp_path, no_gcloud, spec()).returncode == 0
    login = [c for c in calls(no_gcloud) if c[:2] == ["docker", "login"]]
    assert login == [["docker", "login", "-u", "oauth2accesstoken", "--password-stdin", "https://us-docker.pkg.dev"]]
    assert Path(no_gcloud["FAKE_LOG"] + ".login").read_text().strip() == TOKEN
    docker = [c[:2] for c in calls(no_gcloud) if c[0] == "docker"]
    assert docker[:3] == [["docker", "login"], ["docker", "image"], ["docker", "pull"]]


def test_without_gcloud_secrets_are_read_from_the_secret_manager_api(tmp_path: Path, no_gcloud: dict[str, str]) -> None:
    result = run_script(tmp_path, no_gcloud, spec(secrets=SECRETS), FAKE_SECRETS=json.dumps(VALUES))

    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "CANARY").exists()
    for _, ref in SECRETS:
        ((_, method, _, auth, _),) = rest(no_gcloud, f"https://secretmanager.googleapis.com/v1/{ref}:access")
        assert (method, auth) == ("GET", f"Bearer {TOKEN}")
    passed = json.loads(Path(no_gcloud["FAKE_LOG"] + ".env").read_text())
    assert {name: passed[name] for name, _ in SECRETS} == {name: VALUES[ref] for name, ref in SECRETS}  # byte-exact
    for token in ("TOKEN7f3a", "TOKEN9c1e"):
        assert token not in json.dumps(calls(no_gcloud)) and token not in result.stderr


def test_the_documented_secret_response_decodes_byte_for_byte(tmp_path: Path, no_gcloud: dict[str, str]) -> None:
    """Google's sample response carries "YQo=", "a" and a newline: the newline is kept."""
    documented = json.loads((DATA / "secretmanager_access_response.json").read_text())
    ref = "projects/123/secrets/my_secret/versions/2"
    value = base64.b64decode(documented["payload"]["data"]).decode()
    s = spec(secrets=(("MY_SECRET", ref),))
    assert run_script(tmp_path, no_gcloud, s, FAKE_SECRETS=json.dumps({ref: value})).returncode == 0
    assert json.loads(Path(no_gcloud["FAKE_LOG"] + ".env").read_text())["MY_SECRET"] == "a\n"


def test_without_gcloud_an_unreadable_secret_is_still_a_failed_entry(tmp_path: Path, no_gcloud: dict[str, str]) -> None:
    no_sleep(no_gcloud)
    result = run_script(tmp_path, no_gcloud, spec(secrets=SECRETS), FAKE_SECRETS=json.dumps({SECRETS[0][1]: "hf"}))

    assert result.returncode == 1
    assert len(rest(no_gcloud, f"https://secretmanager.googleapis.com/v1/{SECRETS[1][1]}:access")) == 3
    ((*_, body),) = rest(no_gcloud, WRITE)
    ((entry),) = json.loads(body)["entries"]
    assert (entry["severity"], entry["jsonPayload"]["event"]) == ("ERROR", "failed")
    assert entry["jsonPayload"]["error"] == f"could not read secret WANDB_KEY from {SECRETS[1][1]}"
    assert not [c for c in calls(no_gcloud) if c[:2] == ["docker", "run"]]


def test_job_env_cannot_override_respawn_env(tmp_path: Path, fakes: dict[str, str]) -> None:
    s = spec(env=(("RESPAWN_ATTEMPT", "99"), ("RESPAWN_JOB_ID", "other")))
    run_script(tmp_path, fakes, s)
    argv = docker_run(fakes)
    assert "RESPAWN_ATTEMPT=3" in argv and "RESPAWN_JOB_ID=job-1" in argv
    assert "RESPAWN_ATTEMPT=99" not in argv and "RESPAWN_JOB_ID=other" not in argv


def test_trainer_exit_code_is_the_scripts(tmp_path: Path, fakes: dict[str, str]) -> None:
    assert run_script(tmp_path, fakes, spec(), FAKE_RUN_RC="3").returncode == 3


def entries(env: dict[str, str], log: str) -> list[dict[str, Any]]:
    """Every entry of log `log` the scripts wrote to Cloud Logging's entries:write (Google's or an override's), in
    order; none of them through gcloud."""
    assert not [c for c in calls(env) if c[0] == "gcloud"], "a script ran gcloud"
    writes = [c for c in calls(env) if c[:2] == ["curl", "POST"] and c[2].endswith("/v2/entries:write")]
    found = [e for w in writes for e in json.loads(w[4])["entries"]]
    return [e for e in found if e["logName"] == f"projects/my-project/logs/{log}"]


def said(env: dict[str, str]) -> list[tuple[dict[str, Any], str]]:
    """(jsonPayload, severity) of every entry the script wrote to log respawn-trainer."""
    return [(e["jsonPayload"], e["severity"]) for e in entries(env, "respawn-trainer")]


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
    (137, None, None, "failed", "ERROR"),  # killed without a word (a SIGKILL Docker reports no OOM for)
    (78, "1", None, "failed", "ERROR"),  # PERMANENT_RC: no machine of the job would do better (wrong devices)
    (2, None, None, "failed", "ERROR"),  # a usage error (a bad flag): permanent
    (126, "1", None, "failed", "ERROR"),  # docker could not run the image's command: permanent
    (127, None, None, "failed", "ERROR"),  # no such command in the image: permanent
    (2, None, "TRUE", None, None),  # after the notice no exit code is a failure
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
    contract = exit_code_entry(rc, int(worker or 0), noticed=preempted == "TRUE")  # the one table, respawn/machine.py
    assert contract == (None if event is None else (event, severity))
    assert run_script(tmp_path, fakes, spec(), FAKE_RUN_RC=str(rc), **extra).returncode == rc
    if event is None:
        assert said(fakes) == []
        return
    ((payload, how),) = said(fakes)
    base = {"job_id": "job-1", "attempt": 3, "worker": int(worker or 0), "source": "exit-code", "exit_code": rc}
    text, permanent_rc = exit_code_failure(rc)  # the one table, respawn/machine.py
    assert permanent_rc is (rc in (2, PERMANENT_RC, 126, 127)) and text.startswith(f"the trainer exited with code {rc}")
    assert ("; fix: " in text) is (rc in (2, 126, 127))  # the cause and the fix (78's own entry says why)
    error = {"error": text} if event == "failed" else {}
    permanent = {"permanent": True} if permanent_rc else {}
    assert payload == {"event": event, **base, **error, **permanent} and how == severity
    got = parsed(payload)
    if event == "completed":
        assert got == TrainerCompleted("log:x1", got.time, "job-1", 3, None, {}, source=EXIT_CODE)  # type: ignore[union-attr]
    elif event == "failed":
        assert isinstance(got, TrainerFailed) and (got.error, got.worker) == (error["error"], int(worker or 0))
        assert (got.permanent, got.source) == (permanent_rc, EXIT_CODE)
    else:  # a stopped entry without a step records nothing: the preemption's event recreates the machine
        assert "no step" in getattr(got, "reason", "")


@pytest.mark.parametrize(
    ("oom", "preempted", "permanent"),
    [
        ("respawn-trainer", None, True),  # the kernel's OOM killer: the same program on the same machine type again
        ("", None, False),  # a SIGKILL without Docker's OOM event (a kill of its own): retried as before
        ("another-container", None, False),  # the OOM killer ended another container, not the trainer
        ("respawn-trainer", "TRUE", None),  # after the notice: the preemption's, never a failure
    ],
)
def test_a_trainer_the_oom_killer_ended_fails_for_good_naming_host_memory(
    tmp_path: Path, fakes: dict[str, str], oom: str, preempted: str | None, permanent: bool | None
) -> None:
    extra = {"FAKE_OOM": oom, **({"FAKE_PREEMPTED": preempted} if preempted else {})}
    assert run_script(tmp_path, fakes, spec(), FAKE_RUN_RC="137", **extra).returncode == 137
    asked = [c for c in calls(fakes) if c[:2] == ["docker", "events"]]
    if permanent is None:
        assert said(fakes) == [] and asked == []
        return
    ((payload, how),) = said(fakes)
    assert asked and {"type=container", "event=oom"} <= set(asked[0])
    error = "the trainer exited with code 137" + (f": {OOM_KILLED}" if permanent else "")
    assert (payload["error"], payload.get("permanent", False), how) == (error, permanent, "ERROR")
    assert (error, permanent) == exit_code_failure(137, oom_killed=oom == "respawn-trainer")
    got = parsed(payload)
    assert isinstance(got, TrainerFailed) and got.permanent is permanent
    if permanent:
        assert "host memory" in got.error and "fix: " in got.error


def start_blocked(
    tmp_path: Path, fakes: dict[str, str], rc: int, s: JobSpec | None = None, **extra: str
) -> subprocess.Popen[bytes]:
    """The script (of spec `s`) with its trainer running until `docker stop`, after which the trainer exits `rc`."""
    script = tmp_path / "startup.sh"
    script.write_text(startup_script(s or spec(), 3))
    env = {**fakes, "FAKE_BLOCK": "1", "FAKE_RUN_RC": str(rc), **extra}
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
    # the shutdown script's notice (for respawn's head start), and the startup script's word for the exit code
    assert sorted((p["event"], p.get("source")) for p, _ in said(fakes)) == [("notice", None), ("stopped", "exit-code")]
    assert Path(startup.NOTICE_FILE).exists()


def test_worker_0_whose_trainer_stopped_on_a_peers_notice_says_stopped_not_completed(
    tmp_path: Path, fakes: dict[str, str]
) -> None:
    """On a Compute Engine slice each worker is its own Spot VM: a peer's notice stops every host (the trainers
    agree), and worker 0's own VM, never noticed, sees its trainer exit 0. The notice file the trainer left (its
    directory is mounted into the container) is what tells that exit from a finished job's."""
    s = spec("compute", tpu="tpu7x-16")
    env = {**fakes, "FAKE_AGENT_WORKER_NUMBER": "0", "FAKE_ENDPOINTS": "a,b", "FAKE_PEER_NOTICE": "1"}
    result = run_script(tmp_path, env, s)

    assert result.returncode == 0, result.stderr
    assert json.loads(Path(fakes["FAKE_LOG"] + ".env").read_text())["RESPAWN_NOTICE_FILE"] == startup.NOTICE_FILE
    assert [(p["event"], p.get("source")) for p, _ in said(fakes)] == [("stopped", "exit-code")]


def test_a_longer_metadata_notice_tells_respawn_at_once_and_lets_the_trainer_run_on(
    tmp_path: Path, fakes: dict[str, str]
) -> None:
    """The job's preemption_notice: the metadata says `preempted` before the soft off. The script logs the notice
    (respawn's head start) and marks it, but leaves the trainer running: it trains until its own notice is due or
    the shutdown script stops it at the soft off; then its exit 0 is `stopped`."""
    s = spec("compute", tpu="v6e-8", preemption_notice_s=60)
    proc = start_blocked(tmp_path, fakes, 0, s, FAKE_PREEMPTED="TRUE")
    try:
        deadline = time.monotonic() + 30
        while not said(fakes) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [p["event"] for p, _ in said(fakes)] == ["notice"] and Path(startup.NOTICE_FILE).exists()
        assert proc.poll() is None and not [c for c in calls(fakes) if c[:2] == ["docker", "stop"]]
        assert [a for a in docker_run(fakes) if a.startswith("RESPAWN_NOTICE_LEAD_S")] == ["RESPAWN_NOTICE_LEAD_S=60"]
        Path(fakes["FAKE_LOG"] + ".stopped").touch()  # the soft off's docker stop
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert [(p["event"], p.get("source")) for p, _ in said(fakes)] == [("notice", None), ("stopped", "exit-code")]


def test_without_a_longer_notice_the_startup_script_does_not_watch_for_one(
    tmp_path: Path, fakes: dict[str, str]
) -> None:
    """The metadata flag alone (no preemption_notice) is no notice while the trainer runs: the shutdown script's is."""
    proc = start_blocked(tmp_path, fakes, 0, spec("compute", tpu="v6e-8"), FAKE_PREEMPTED="TRUE")
    try:
        time.sleep(1)  # the watch of the test above says `notice` at its first poll
        assert said(fakes) == [] and not Path(startup.NOTICE_FILE).exists()
        assert not [a for a in docker_run(fakes) if a.startswith("RESPAWN_NOTICE_LEAD_S")]
        Path(fakes["FAKE_LOG"] + ".stopped").touch()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert [(p["event"], p.get("source")) for p, _ in said(fakes)] == [("stopped", "exit-code")]


@pytest.mark.parametrize(("worker", "said_worker"), [("2", 2), ("", 0)])
def test_the_shutdown_script_tells_respawn_of_the_notice_whatever_the_trainer(
    tmp_path: Path, fakes: dict[str, str], worker: str, said_worker: int
) -> None:
    """The `notice` entry comes from the machine, not the trainer: it names the attempt and the worker VM (the
    metadata's agent-worker-number; a single VM is worker 0), and the trainer is stopped with its grace all the same."""
    shutdown = tmp_path / "shutdown.sh"
    shutdown.write_text(machine_metadata(spec(tpu="v5litepod-16"), 4)["shutdown-script"])
    env = {**fakes, "FAKE_AGENT_WORKER_NUMBER": worker}
    subprocess.run([BASH, str(shutdown)], env=env, check=True, timeout=30, capture_output=True)

    assert said(fakes) == [({"event": "notice", "job_id": "job-1", "attempt": 4, "worker": said_worker}, "WARNING")]
    assert parsed(said(fakes)[0][0]) == MachineNoticed("log:x1", 1795255200.0, "job-1", 4, said_worker)
    assert ["docker", "stop", "-t", str(GRACE_S["tpu"]), "respawn-trainer"] in calls(fakes)
    assert Path(startup.NOTICE_FILE).read_text() == ""  # a deletion: no metadata `preempted`


def test_the_shutdown_script_marks_a_preemption_in_the_notice_file(tmp_path: Path, fakes: dict[str, str]) -> None:
    """The metadata server says `preempted`: the trainer may hand over to a head start's (respawn_trainer reads the
    file at SIGTERM); a deletion (a cancel, a hang) leaves the file empty, and the trainer saves at once."""
    shutdown = tmp_path / "shutdown.sh"
    shutdown.write_text(machine_metadata(spec(), 4)["shutdown-script"])
    subprocess.run([BASH, str(shutdown)], env={**fakes, "FAKE_PREEMPTED": "TRUE"}, check=True, timeout=30)
    assert Path(startup.NOTICE_FILE).read_text() == "preempted\n"
    assert ["docker", "stop", "-t", str(GRACE_S["tpu"]), "respawn-trainer"] in calls(fakes)


# sleep, recorded in the calls; with FAKE_SLEEP_REAL it sleeps too (else it returns at once)
FAKE_SLEEP = """#!/bin/sh
printf '["sleep", "%s"]\\n' "$1" >> "$FAKE_LOG"
[ -z "${{FAKE_SLEEP_REAL-}}" ] || exec {sleep} "$1"
"""


def fake_sleep(env: dict[str, str]) -> None:
    path = Path(env["PATH"].split(":")[0]) / "sleep"
    path.write_text(FAKE_SLEEP.format(sleep=shutil.which("sleep") or "/bin/sleep"))
    path.chmod(0o755)


def test_a_head_starts_machine_pulls_its_image_then_waits_until_start_after_to_run_the_trainer(
    tmp_path: Path, fakes: dict[str, str]
) -> None:
    fake_sleep(fakes)
    result = run_script(tmp_path, fakes, spec(), FAKE_START_AFTER=str(int(time.time()) + 40))

    assert result.returncode == 0, result.stderr
    seq = [c[:2] for c in calls(fakes) if c[0] in ("docker", "sleep")]
    waited_at = next(i for i, c in enumerate(seq) if c[0] == "sleep")
    assert ["docker", "pull"] in seq[:waited_at]  # the image first, then the wait, then the trainer
    assert seq[waited_at + 1 :] == [["docker", "rm"], ["docker", "run"]]
    ((waited,),) = [c[1:] for c in calls(fakes) if c[0] == "sleep"]
    assert (
        30 <= int(waited) <= 40 and "until the machine this one replaces is off" in result.stderr
    )  # less what boot took


@pytest.mark.parametrize("start_after", ["", "1000", "soon", "12.5"])
def test_without_a_start_after_to_come_the_trainer_runs_at_once(
    tmp_path: Path, fakes: dict[str, str], start_after: str
) -> None:
    """No respawn-start-after (not a head start), one already past, or one that is not whole epoch seconds."""
    fake_sleep(fakes)
    result = run_script(tmp_path, fakes, spec(), FAKE_START_AFTER=start_after)

    assert result.returncode == 0, result.stderr
    assert not [c for c in calls(fakes) if c[0] == "sleep"] and len(runs(fakes)) == 1


def test_a_machine_shut_down_while_it_waits_to_start_runs_no_trainer(tmp_path: Path, fakes: dict[str, str]) -> None:
    fake_sleep(fakes)
    script = tmp_path / "startup.sh"
    script.write_text(startup_script(spec(), 3))
    env = {**fakes, "FAKE_START_AFTER": str(int(time.time()) + 60), "FAKE_SLEEP_REAL": "1"}
    proc = subprocess.Popen([BASH, str(script)], cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not [c for c in calls(fakes) if c[0] == "sleep"] and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
    assert runs(fakes) == [] and said(fakes) == []  # nothing ran, so nothing to say
    assert proc.stderr is not None and "shut down before the trainer started" in proc.stderr.read()


def test_a_notice_left_by_an_earlier_boot_is_cleared(tmp_path: Path, fakes: dict[str, str]) -> None:
    Path(startup.NOTICE_FILE).touch()  # a Spot VM stopped and started again runs the startup script anew
    run_script(tmp_path, fakes, spec())
    assert [p["event"] for p, _ in said(fakes)] == ["completed"]


class FakeStorage:
    """Cloud Storage's JSON API on loopback, as much as the drain marker uses: a media upload
    (`POST /upload/storage/v1/b/B/o?uploadType=media&name=N`) and objects.get (`GET /storage/v1/b/B/o/N`, 404 for
    an object it lacks). Each upload is a line in FAKE_LOG, in order with the fakes' calls."""

    def __init__(self, log: str) -> None:
        self.objects: dict[str, bytes] = {}  # gs://BUCKET/OBJECT -> its bytes
        self.auth: list[str | None] = []
        self.upload_s = 0.0  # how long an upload takes
        self.uploading = threading.Event()  # set as an upload begins
        storage = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                storage.auth.append(self.headers.get("Authorization"))
                bucket, _, name = self.path.removeprefix("/storage/v1/b/").partition("/o/")
                found = f"gs://{bucket}/{unquote(name)}" in storage.objects
                self._answer(200 if found else 404, {"name": unquote(name)} if found else {"error": {"code": 404}})

            def do_POST(self) -> None:
                if self.path == "/v2/entries:write":  # Cloud Logging, where the machine's override names it
                    body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                    with open(log, "a") as f:
                        call = [
                            "curl",
                            "POST",
                            f"http://{storage.host}{self.path}",
                            self.headers["Authorization"],
                            body,
                        ]
                        f.write(json.dumps(call) + "\n")
                    self._answer(200, {})
                    return
                storage.auth.append(self.headers.get("Authorization"))
                url = urlsplit(self.path)
                bucket = url.path.removeprefix("/upload/storage/v1/b/").removesuffix("/o")
                query = parse_qs(url.query)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                storage.uploading.set()
                time.sleep(storage.upload_s)
                if query.get("uploadType") != ["media"] or "name" not in query:
                    self._answer(400, {"error": {"code": 400}})
                    return
                uri = f"gs://{bucket}/{query['name'][0]}"
                storage.objects[uri] = body
                with open(log, "a") as f:
                    f.write(json.dumps(["gcs", "upload", uri]) + "\n")
                self._answer(200, {"name": query["name"][0]})

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


MARKER_OF_2 = "gs://bucket/runs/job-1.respawn/attempt-2.exited"  # the attempt a head start's attempt 3 replaces
MARKER_OF_3 = "gs://bucket/runs/job-1.respawn/attempt-3.exited"


@pytest.fixture
def storage(fakes: dict[str, str]) -> Iterator[FakeStorage]:
    found = FakeStorage(fakes["FAKE_LOG"])
    yield found
    found.close()


def on_a_machine(
    fakes: dict[str, str], storage: FakeStorage, attributes: dict[str, str], emulator: str
) -> tuple[dict[str, str], MetadataServer]:
    """The fakes with the real curl, a metadata server with `attributes` (its token: "local") and Cloud Storage at
    STORAGE_EMULATOR_HOST=`emulator` (the fake's host:port, with or without a scheme)."""
    bin_dir = Path(fakes["PATH"].split(":")[0])
    (bin_dir / "curl").unlink()
    server = MetadataServer("my-project", attributes)
    env = {**fakes, "GCE_METADATA_HOST": server.host, "STORAGE_EMULATOR_HOST": emulator.format(host=storage.host)}
    env["CLOUDSDK_API_ENDPOINT_OVERRIDES_LOGGING"] = f"http://{storage.host}/"  # its Cloud Logging too
    return env, server


def run_until_done(tmp_path: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    script = tmp_path / "startup.sh"
    script.write_text(startup_script(spec(), 3))
    began = time.monotonic()
    done = subprocess.run([BASH, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    return done, time.monotonic() - began


def test_a_noticed_trainer_that_saved_leaves_its_drain_marker_before_its_stopped_entry(
    tmp_path: Path, fakes: dict[str, str], storage: FakeStorage
) -> None:
    env, server = on_a_machine(fakes, storage, {}, "http://{host}")
    try:
        proc = start_blocked(tmp_path, env, 0)
        proc.send_signal(signal.SIGTERM)  # the notice
        assert proc.wait(timeout=30) == 0
    finally:
        server.close()
    assert list(storage.objects) == [MARKER_OF_3] and storage.auth == ["Bearer local"]  # the machine's token
    assert json.loads(storage.objects[MARKER_OF_3]) == {"job_id": "job-1", "attempt": 3, "exit_code": 0}
    order = [c[:2] for c in calls(env) if c[0] == "gcs" or c[2:3] == [f"http://{storage.host}/v2/entries:write"]]
    assert order == [["gcs", "upload"], ["curl", "POST"]]  # respawn deletes the machine on `stopped`
    assert [p["event"] for p, _ in said(env)] == ["stopped"]


def test_the_drain_marker_is_written_while_the_machine_shuts_down(
    tmp_path: Path, fakes: dict[str, str], storage: FakeStorage
) -> None:
    """respawn deletes the noticed machine as soon as the trainer's own `stopped` entry arrives: the shutdown's SIGTERM
    to every process of the script may come while the marker is on its way, and must not stop it."""
    env, server = on_a_machine(fakes, storage, {}, "http://{host}")
    storage.upload_s = 1.0
    script = tmp_path / "startup.sh"
    script.write_text(startup_script(spec(), 3))
    proc = subprocess.Popen(
        [BASH, str(script)], cwd=tmp_path, env={**env, "FAKE_BLOCK": "1", "FAKE_RUN_RC": "0"}, process_group=0
    )
    try:
        running = Path(env["FAKE_LOG"] + ".running")
        deadline = time.monotonic() + 30
        while not running.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)  # the notice
        assert storage.uploading.wait(timeout=30)
        os.killpg(proc.pid, signal.SIGTERM)  # the deletion, while the marker is written
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        server.close()
    assert list(storage.objects) == [MARKER_OF_3]


@pytest.mark.parametrize(("rc", "notice"), [(143, True), (0, False), (3, False)])
def test_no_drain_marker_without_a_final_save_after_the_notice(
    tmp_path: Path, fakes: dict[str, str], storage: FakeStorage, rc: int, notice: bool
) -> None:
    """Killed at the end of its grace (the save may be unfinished: the replacement waits for start-after), or no
    notice at all (completed, failed)."""
    env, server = on_a_machine(fakes, storage, {}, "http://{host}")
    try:
        if notice:
            proc = start_blocked(tmp_path, env, rc)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == rc
        else:
            done, _ = run_until_done(tmp_path, {**env, "FAKE_RUN_RC": str(rc)})
            assert done.returncode == rc
    finally:
        server.close()
    assert storage.objects == {}


@pytest.mark.parametrize("emulator", ["http://{host}", "{host}"])  # as the client libraries take it
def test_a_head_starts_trainer_starts_at_once_when_the_replaced_machine_has_saved(
    tmp_path: Path, fakes: dict[str, str], storage: FakeStorage, emulator: str
) -> None:
    storage.objects[MARKER_OF_2] = b"{}"
    after = {"respawn-start-after": str(int(time.time()) + 40), "respawn-drain-marker": MARKER_OF_2}
    env, server = on_a_machine(fakes, storage, after, emulator)
    try:
        done, took = run_until_done(tmp_path, env)
    finally:
        server.close()
    assert done.returncode == 0, done.stderr
    assert len(runs(env)) == 1 and took < 10, (took, done.stderr)  # not the 40 s to start-after
    assert f"the machine this one replaces has saved ({MARKER_OF_2})" in done.stderr


def test_a_head_starts_trainer_starts_as_the_marker_appears(
    tmp_path: Path, fakes: dict[str, str], storage: FakeStorage
) -> None:
    """Polled each second: the trainer starts within about a second of the marker, long before start-after."""
    after = {"respawn-start-after": str(int(time.time()) + 40), "respawn-drain-marker": MARKER_OF_2}
    env, server = on_a_machine(fakes, storage, after, "http://{host}")
    threading.Timer(3.0, lambda: storage.objects.__setitem__(MARKER_OF_2, b"{}")).start()
    try:
        done, took = run_until_done(tmp_path, env)
    finally:
        server.close()
    assert done.returncode == 0, done.stderr
    assert len(runs(env)) == 1 and 3.0 <= took < 8.0, (took, done.stderr)


def test_an_image_that_takes_over_itself_starts_its_trainer_at_once_with_the_handover_in_its_environment(
    tmp_path: Path, fakes: dict[str, str], storage: FakeStorage
) -> None:
    """respawn's trainer image (LABEL respawn.takeover="1"): no marker yet, start-after 40 s away, and the trainer
    starts at once; it is told what to wait for (the marker's prefix, and start-after) and waits itself."""
    after = {"respawn-start-after": str(int(time.time()) + 40), "respawn-drain-marker": MARKER_OF_2}
    env, server = on_a_machine(fakes, storage, after, "http://{host}")
    try:
        done, took = run_until_done(tmp_path, {**env, "FAKE_LABELS": '{"respawn.takeover":"1"}'})
    finally:
        server.close()
    assert done.returncode == 0, done.stderr
    assert len(runs(env)) == 1 and took < 10, (took, done.stderr)
    passed = json.loads(Path(fakes["FAKE_LOG"] + ".env").read_text())
    assert passed["RESPAWN_TAKEOVER"] == MARKER_OF_2.removesuffix(".exited")
    assert passed["RESPAWN_START_AFTER"] == after["respawn-start-after"]
    assert "the trainer starts now and takes over once" in done.stderr
    assert storage.objects == {}  # the script polled nothing: the trainer does


@pytest.mark.parametrize("labels", ["null", '{"respawn.takeover":"0"}', '{"other":"1"}'])
def test_an_image_without_the_label_is_held_back_by_the_script(
    tmp_path: Path, fakes: dict[str, str], storage: FakeStorage, labels: str
) -> None:
    """A program of the user's own may know nothing of a takeover: its script holds it back until the marker."""
    after = {"respawn-start-after": str(int(time.time()) + 3), "respawn-drain-marker": MARKER_OF_2}
    env, server = on_a_machine(fakes, storage, after, "http://{host}")
    try:
        done, took = run_until_done(tmp_path, {**env, "FAKE_LABELS": labels})
    finally:
        server.close()
    assert done.returncode == 0, done.stderr
    assert 2.0 <= took < 8.0, (took, done.stderr)
    passed = json.loads(Path(fakes["FAKE_LOG"] + ".env").read_text())
    assert passed["RESPAWN_TAKEOVER"] is None and passed["RESPAWN_START_AFTER"] is None


def test_without_the_marker_a_head_starts_trainer_starts_at_start_after(
    tmp_path: Path, fakes: dict[str, str], storage: FakeStorage
) -> None:
    """The old machine wrote none (killed at its grace, or Cloud Storage out of reach): the bound holds."""
    after = {"respawn-start-after": str(int(time.time()) + 6), "respawn-drain-marker": MARKER_OF_2}
    env, server = on_a_machine(fakes, storage, after, "http://{host}")
    try:
        done, took = run_until_done(tmp_path, env)
    finally:
        server.close()
    assert done.returncode == 0, done.stderr
    assert len(runs(env)) == 1 and 5.0 <= took < 20.0, (took, done.stderr)
    assert "waiting until the machine this one replaces has saved" in done.stderr


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
    reads = [c[2] for c in calls(fakes) if c[:2] == ["curl", "GET"] and c[2].endswith(":access")]
    assert reads == [f"https://secretmanager.googleapis.com/v1/{ref}:access" for _, ref in SECRETS]
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
    assert not [c for c in calls(fakes) if c[:2] in (["docker", "pull"], ["docker", "run"])]  # not without them
    reads = [c[2] for c in calls(fakes) if c[:2] == ["curl", "GET"] and c[2].endswith(":access")]
    prefix = "https://secretmanager.googleapis.com/v1/"
    assert reads == [f"{prefix}{SECRETS[0][1]}:access"] + [f"{prefix}{SECRETS[1][1]}:access"] * 3  # tried 3 times
    ((payload, _),) = said(fakes)
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
    assert f"\n  readonly grace_s={GRACE_S['tpu']}\n" in meta["shutdown-script"]  # its `docker stop -t`
    assert "\n  readonly grace_s=25\n" in machine_metadata(spec("gpu"), 2)["shutdown-script"]
    head_start = machine_metadata(s, 2, start_after=1_700_000_000.2)  # whole seconds, never earlier
    assert head_start["respawn-start-after"] == "1700000001" and head_start.keys() - meta.keys() == {
        "respawn-start-after",
        "respawn-drain-marker",
    }
    # the attempt replaced writes it once its final save is done: beside the checkpoints, not among them
    assert head_start["respawn-drain-marker"] == "gs://bucket/runs/job-1.respawn/attempt-1.exited"
    assert drain_marker("gs://b/ckpt/", 4) == "gs://b/ckpt.respawn/attempt-4.exited"
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
    workers = place(fakes)
    assert workers == {"TPU_WORKER_ID": "1", "TPU_WORKER_HOSTNAMES": hosts}
    (run,) = [c for c in calls(fakes) if c[:2] == ["docker", "run"]]
    assert run[run.index("TPU_WORKER_ID") - 1 :][:4] == ["-e", "TPU_WORKER_ID", "-e", "TPU_WORKER_HOSTNAMES"]


# --- readying the machine: Docker where the boot image has none, the slice's metadata -----------------------------

# apt-get: `install` fails FAKE_APT_FAILS times, then "installs" docker (copies the fake docker onto PATH) and
# records the environment the script gave it.
FAKE_APT = """#!{python}
import json, os, pathlib, shutil, sys
log = os.environ["FAKE_LOG"]
with open(log, "a") as f:
    f.write(json.dumps(["apt-get", *sys.argv[1:]]) + "\\n")
if "install" in sys.argv:
    tries = pathlib.Path(log + ".installs")
    n = int(tries.read_text()) + 1 if tries.exists() else 1
    tries.write_text(str(n))
    if n <= int(os.environ.get("FAKE_APT_FAILS", "0")):
        sys.exit("E: Could not get lock /var/lib/dpkg/lock-frontend")
    here = pathlib.Path(sys.argv[0]).parent
    shutil.copy(here / "docker.package", here / "docker")
    keys = ("DEBIAN_FRONTEND", "NEEDRESTART_MODE")
    pathlib.Path(log + ".apt-env").write_text(json.dumps({{k: os.environ.get(k) for k in keys}}))
"""

# What the script runs besides the fakes. A PATH of only these and the fakes: the machine's own apt-get and
# systemctl can never run.
TOOLS = ("bash", "tr", "grep", "awk", "paste", "rm", "touch", "sleep", "seq", "cat", "sed", "cut", "base64", "date")


def tools(tmp_path: Path) -> Path:
    """A directory of TOOLS only, for a PATH on which none of this machine's other programs is found."""
    path = tmp_path / "tools"
    if not path.exists():
        path.mkdir()
        for tool in TOOLS:
            found = shutil.which(tool)
            if found:
                (path / tool).symlink_to(found)
    return path


@pytest.fixture
def bare(fakes: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """A boot image without Docker (ubuntu-accel-*): the fakes, apt-get and systemctl, and no machine PATH."""
    bin_dir = Path(fakes["PATH"].split(":")[0])
    (bin_dir / "docker").rename(bin_dir / "docker.package")
    (bin_dir / "apt-get").write_text(FAKE_APT.format(python=sys.executable))
    (bin_dir / "systemctl").write_text(FAKE.format(python=sys.executable))
    for name in ("apt-get", "systemctl"):
        (bin_dir / name).chmod(0o755)
    no_sleep({**fakes, "PATH": str(bin_dir)})
    return {**fakes, "PATH": f"{bin_dir}:{tools(tmp_path)}"}


def names(env: dict[str, str]) -> list[str]:
    return [" ".join(c[:2]) for c in calls(env)]


@pytest.mark.parametrize("kind", ["tpu", "gpu"])
def test_a_machine_with_docker_installs_nothing(tmp_path: Path, fakes: dict[str, str], kind: str) -> None:
    """Cloud TPU API runtime images and the GPU image have Docker: the check is one `command -v`."""
    assert run_script(tmp_path, fakes, spec(kind)).returncode == 0
    assert not [c for c in calls(fakes) if c[0] in ("apt-get", "systemctl")]


def test_docker_is_installed_from_the_os_packages_when_missing(tmp_path: Path, bare: dict[str, str]) -> None:
    result = run_script(tmp_path, bare, spec())

    assert result.returncode == 0, result.stderr
    apt = [c for c in calls(bare) if c[0] == "apt-get"]
    assert apt == [
        ["apt-get", "-q", "-o", "DPkg::Lock::Timeout=120", "update"],
        ["apt-get", "-q", "-y", "-o", "DPkg::Lock::Timeout=120", "install", "docker.io"],
    ]
    assert json.loads(Path(bare["FAKE_LOG"] + ".apt-env").read_text()) == {
        "DEBIAN_FRONTEND": "noninteractive",  # no prompt can stall a boot
        "NEEDRESTART_MODE": "l",  # Ubuntu's needrestart lists, and restarts nothing mid-boot
    }
    assert names(bare)[:4] == ["apt-get -q", "apt-get -q", "systemctl enable", "docker login"]
    assert ["systemctl", "enable", "--now", "docker"] in calls(bare)
    assert docker_run(bare)[:3] == ["docker", "run", "--rm"]  # then the trainer runs as on any machine
    assert "installing Docker" in result.stderr


def test_a_failed_docker_install_is_retried(tmp_path: Path, bare: dict[str, str]) -> None:
    result = run_script(tmp_path, bare, spec(), FAKE_APT_FAILS="2")  # e.g. apt's lock held past the timeout
    assert result.returncode == 0, result.stderr
    installs = [c for c in calls(bare) if c[:1] == ["apt-get"] and "install" in c]
    assert len(installs) == 3
    assert result.stderr.count("apt-get install docker.io failed (try") == 2
    assert [(p["event"], how) for p, how in said(bare)] == [("completed", "INFO")]  # the trainer ran and finished


def test_docker_that_cannot_be_installed_is_the_attempts_failure(tmp_path: Path, bare: dict[str, str]) -> None:
    result = run_script(tmp_path, bare, spec(), FAKE_APT_FAILS="99", FAKE_AGENT_WORKER_NUMBER="0")

    assert result.returncode == 1
    assert len([c for c in calls(bare) if c[:1] == ["apt-get"] and "install" in c]) == 4  # bounded
    assert not [c for c in calls(bare) if c[0] in ("docker", "systemctl")]  # no trainer without Docker
    ((payload, severity),) = said(bare)
    lock = "E: Could not get lock /var/lib/dpkg/lock-frontend"  # the cause: apt's last error line
    error = f"could not install docker: apt-get install docker.io failed 4 times ({lock})"
    assert payload == {"event": "failed", "job_id": "job-1", "attempt": 3, "worker": 0, "error": error}
    assert severity == "ERROR"
    assert isinstance(parsed(payload), TrainerFailed)


def test_an_image_without_docker_or_apt_get_fails_with_a_clear_error(tmp_path: Path, bare: dict[str, str]) -> None:
    (Path(bare["PATH"].split(":")[0]) / "apt-get").unlink()
    result = run_script(tmp_path, bare, spec())
    assert result.returncode == 1
    ((payload, _),) = said(bare)
    assert payload["error"] == "could not install docker: the boot image has no apt-get"


SLICE = "v5litepod-16"  # 4 hosts of 4 chips
FOUR_HOSTS = "respawn-a1-w-k2x9,respawn-a1-w-0b7q,respawn-a1-w-m3zz,respawn-a1-w-p1a8"  # a slice MIG's host names


def test_a_slice_vm_waits_for_its_worker_number_and_every_peer(tmp_path: Path, bare: dict[str, str]) -> None:
    """Docker is installed first (it takes the longest), then the script waits for the slice's metadata."""
    metadata = {"FAKE_AGENT_WORKER_NUMBER": "2", "FAKE_ENDPOINTS": FOUR_HOSTS, "FAKE_SLICE_LATE": "3"}
    result = run_script(tmp_path, bare, spec(tpu=SLICE), **metadata)

    assert result.returncode == 0, result.stderr
    assert result.stderr.count("waiting for the slice's metadata") == 2  # the first read and one retry were early
    workers = place(bare)
    assert workers == {"TPU_WORKER_ID": "2", "TPU_WORKER_HOSTNAMES": FOUR_HOSTS}
    assert names(bare).index("apt-get -q") < names(bare).index("docker pull")
    assert said(bare) == []  # worker 2's clean exit: worker 0 speaks for the slice


def test_a_slice_vm_that_never_sees_all_its_peers_fails(
    tmp_path: Path, bare: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(startup, "SLICE_METADATA_TRIES", 3)
    two_of_four = ",".join(FOUR_HOSTS.split(",")[:2])
    result = run_script(tmp_path, bare, spec(tpu=SLICE), FAKE_AGENT_WORKER_NUMBER="1", FAKE_ENDPOINTS=two_of_four)

    assert result.returncode == 1
    assert not [c for c in calls(bare) if c[:2] == ["docker", "run"]]  # a partial slice would hang in JAX's init
    ((payload, _),) = said(bare)
    assert payload["error"] == "the metadata server never named this VM's worker number and 4 peers"
    assert payload["worker"] == 1


def test_a_compute_engine_slice_vm_gets_its_place_from_the_migs_metadata(tmp_path: Path, bare: dict[str, str]) -> None:
    """v6e-16 through Compute Engine: 4 VMs NAME-w-XXXX, worker-network-endpoints as host names (the format JAX
    parses from 0.10.0); the boot image has no Docker."""
    metadata = {"FAKE_AGENT_WORKER_NUMBER": "3", "FAKE_ENDPOINTS": FOUR_HOSTS}
    result = run_script(tmp_path, bare, spec("compute", tpu="v6e-16"), **metadata)

    assert result.returncode == 0, result.stderr
    assert ["apt-get", "-q", "-y", "-o", "DPkg::Lock::Timeout=120", "install", "docker.io"] in calls(bare)
    workers = place(bare)
    assert workers == {"TPU_WORKER_ID": "3", "TPU_WORKER_HOSTNAMES": FOUR_HOSTS}
    assert "--privileged" in docker_run(bare)  # the chips are /dev/accel* (or vfio) devices, as on Cloud TPU VMs


@pytest.mark.parametrize(
    ("tpu", "hosts"), [("v6e-8", 1), ("v6e-16", 4), ("v5p-8", 1), ("v5p-16", 2), ("tpu7x-8", 1), ("tpu7x-16", 2)]
)
def test_the_script_waits_for_as_many_peers_as_the_slice_has_vms(tpu: str, hosts: int) -> None:
    assert compute_shape(tpu).vms == hosts
    assert f"\n  readonly slice_hosts={hosts}\n" in startup_script(spec("compute", tpu=tpu), 1)


def test_a_single_host_tpu_does_not_wait_for_peers(tmp_path: Path, fakes: dict[str, str]) -> None:
    """One host: no peers to wait for (a Compute Engine instance may have no worker metadata at all)."""
    result = run_script(tmp_path, fakes, spec(tpu="v5litepod-8"))
    assert result.returncode == 0, result.stderr
    assert "waiting" not in result.stderr
    workers = place(fakes)
    assert workers == {"TPU_WORKER_ID": "0", "TPU_WORKER_HOSTNAMES": ""}


@pytest.mark.parametrize(
    "s",
    [
        spec(),
        spec("gpu"),
        spec(tpu=SLICE),
        spec("compute", tpu="v6e-8"),
        spec("compute", tpu="tpu7x-16"),
        spec(secrets=SECRETS),
        spec("gpu", image="nvcr.io/nvidia/jax:24.04"),
    ],
    ids=["tpu", "gpu", "slice", "compute", "compute-slice", "secrets", "gpu-no-registry"],
)
def test_every_rendered_script_is_valid_bash(tmp_path: Path, s: JobSpec) -> None:
    script = tmp_path / "startup.sh"
    script.write_text(startup_script(s, 1))
    checked = subprocess.run([BASH, "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr


def world(version: int, members: tuple[int, ...] = (0, 1)) -> str:
    """The control plane's value of the key: the machines find their coordinator themselves."""
    return json.dumps({"version": version, "members": list(members), "step": None})


def test_a_trainer_that_left_its_world_runs_again_in_place_in_the_next_one(
    tmp_path: Path, fakes: dict[str, str], storage: FakeStorage
) -> None:
    """A world of several slices: the trainer runs in the version the metadata key names; its exit 75 (the world
    changed) is no failure: it runs again on this machine once the key names a newer version, learned from the
    metadata server's hanging GET, with no create, boot or pull in between. An older or equal version is no news."""
    env, server = on_a_machine(fakes, storage, {"respawn-world": world(1), "respawn-slice": "1"}, "http://{host}")
    try:
        script, err = tmp_path / "startup.sh", tmp_path / "stderr"
        script.write_text(startup_script(spec(), 3))
        with err.open("w") as out:
            proc = subprocess.Popen([BASH, str(script)], cwd=tmp_path, env={**env, "FAKE_RUN_RCS": "75 0"}, stderr=out)
        deadline = time.monotonic() + 30
        while "waiting for it" not in err.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        server.set_attributes({"respawn-world": world(1), "respawn-slice": "1", "other": "x"})  # not a newer one
        time.sleep(0.5)
        assert proc.poll() is None and len(runs(env)) == 1
        server.set_attributes({"respawn-world": world(2), "respawn-slice": "1"})
        assert proc.wait(timeout=30) == 0
    finally:
        server.close()
    envs = [json.loads(line) for line in Path(env["FAKE_LOG"] + ".envs").read_text().splitlines()]
    world_env = [(e[startup.WORLD_ENV], e[startup.SLICE_ENV], e[startup.LOCAL_COPY_ENV]) for e in envs]
    copy = str(Path(fakes[startup.DATA_DIR_ENV]) / "local-copy")
    assert world_env == [("1", "1", copy), ("2", "1", copy)]
    assert len(pulls(env)) == 1  # one pull for both runs
    assert [(p["event"], p.get("source")) for p, _ in said(env)] == [("completed", "exit-code")]


def test_a_trainer_that_joined_newer_worlds_in_its_process_is_counted_from_the_last_one_it_ran(
    tmp_path: Path, fakes: dict[str, str], storage: FakeStorage
) -> None:
    """Started for world 1, the trainer joined world 3 in place and failed there: the failure names world 3 (the
    control plane ignores an older world's failures), and the trainer runs again only for a world above 3."""
    env, server = on_a_machine(fakes, storage, {"respawn-world": world(3), "respawn-slice": "1"}, "http://{host}")
    env = {**env, "FAKE_RUN_RCS": "1 0", "FAKE_RAN_WORLD": "3"}
    server.set_attributes({"respawn-world": world(1), "respawn-slice": "1"})
    try:
        script, err = tmp_path / "startup.sh", tmp_path / "stderr"
        script.write_text(startup_script(spec(), 3))
        with err.open("w") as out:
            proc = subprocess.Popen([BASH, str(script)], cwd=tmp_path, env=env, stderr=out)
        deadline = time.monotonic() + 30
        while "waiting for a newer one" not in err.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        server.set_attributes({"respawn-world": world(3), "respawn-slice": "1"})  # the one it ran: no news
        time.sleep(0.5)
        assert proc.poll() is None and len(runs(env)) == 1, err.read_text()
        server.set_attributes({"respawn-world": world(4), "respawn-slice": "1"})
        assert proc.wait(timeout=30) == 0
    finally:
        server.close()
    assert world_versions(env) == ["1", "4"]
    failed = [p for p, _ in said(env) if p["event"] == "failed"]
    assert len(failed) == 1 and failed[0]["world"] == 3, said(env)


def test_without_a_world_an_exit_75_is_a_failure_as_any_other(tmp_path: Path, fakes: dict[str, str]) -> None:
    assert run_script(tmp_path, fakes, spec(), FAKE_RUN_RCS="75 0").returncode == 75
    assert len(runs(fakes)) == 1
    assert [p["event"] for p, _ in said(fakes)] == ["failed"]


def world_versions(env: dict[str, str]) -> list[str]:
    """RESPAWN_WORLD_VERSION of every trainer run."""
    path = Path(env["FAKE_LOG"] + ".envs")
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line)[startup.WORLD_ENV] for line in lines]


def test_a_machine_for_a_slice_outside_its_world_runs_its_trainer_at_once_which_says_ready_itself(
    tmp_path: Path, fakes: dict[str, str], storage: FakeStorage
) -> None:
    """A replacement slice's machine, readied (image pulled) while the world trains without it, starts its trainer
    for the key's version at once: the trainer imports, says `ready` when warm and waits to be let in
    (respawn_trainer.world.join); the script says nothing for it."""
    env, server = on_a_machine(fakes, storage, {"respawn-world": world(1, (0,)), "respawn-slice": "1"}, "http://{host}")
    try:
        done, _ = run_until_done(tmp_path, env)
    finally:
        server.close()
    assert done.returncode == 0, done.stderr
    assert world_versions(env) == ["1"] and "not a member of world 1 yet" in done.stderr
    assert [p["event"] for p, _ in said(env)] == ["completed"]


def test_a_machine_of_a_member_slice_says_no_ready_and_runs_its_trainer_at_once(
    tmp_path: Path, fakes: dict[str, str], storage: FakeStorage
) -> None:
    env, server = on_a_machine(
        fakes, storage, {"respawn-world": world(4, (0, 2)), "respawn-slice": "2"}, "http://{host}"
    )
    try:
        done, _ = run_until_done(tmp_path, env)
    finally:
        server.close()
    assert done.returncode == 0, done.stderr
    assert world_versions(env) == ["4"] and "waiting for a world" not in done.stderr
    assert [p["event"] for p, _ in said(env)] == ["completed"]
