"""The respawn CLI without any cloud: dry runs, parse-event on captured payloads, and error handling."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from respawn_cli.main import main

DATA = Path(__file__).resolve().parents[1] / "data"

JOB_YAML = """\
action: submit
job_id: llm-small-001
machine: {kind: tpu, accelerator_type: v5litepod-8, runtime_version: v2-alpha-tpuv5-lite}
zones: [us-central1-a, us-west4-a]
provisioning: spot
image: us-docker.pkg.dev/proj/repo/trainer:1
args: ["--steps=20000", "--name=it's; rm -rf /"]
env: {KEY: value}
checkpoint_uri: gs://bucket/runs/llm-small-001
ttl: 48h
max_preemptions: null
max_failures: 3
labels: {team: nlp}
"""


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def no_cloud_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RESPAWN_PROJECT", "GOOGLE_CLOUD_PROJECT", "RESPAWN_STATE_BUCKET", "RESPAWN_JOBS_TOPIC"):
        monkeypatch.delenv(name, raising=False)


def test_submit_dry_run_prints_the_message_it_would_publish(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job.yaml"
    ref = "projects/ml-research-4821/secrets/hf-token/versions/3"
    job.write_text(JOB_YAML + f"secrets: {{HF_TOKEN: {ref}}}\n")
    code, out, err = run(capsys, "submit", str(job), "--dry-run")
    assert (code, err) == (0, "")
    message = json.loads(out)
    assert message["job_id"] == "llm-small-001"
    assert message["secrets"] == {"HF_TOKEN": ref}  # the reference: the value never passes through respawn
    assert message["args"] == ["--steps=20000", "--name=it's; rm -rf /"]
    assert message["machine"]["accelerator_type"] == "v5litepod-8"


def test_submit_dry_run_json_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"action": "cancel", "job_id": "llm-small-001"}))
    code, out, _ = run(capsys, "submit", str(job), "--dry-run", "--json")
    assert code == 0
    assert out.count("\n") == 1
    assert json.loads(out) == {"action": "cancel", "job_id": "llm-small-001"}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (("zones: [us-central1-a, us-west4-a]", "zones: [nowhere]"), "zones"),
        (("ttl: 48h", "ttl: forever"), "ttl"),
        (("checkpoint_uri: gs://bucket/runs/llm-small-001", "checkpoint_uri: /tmp/ckpt"), "checkpoint_uri"),
        (("labels: {team: nlp}", "labels: {team: nlp}\ncolour: blue"), "colour"),
        (("job_id: llm-small-001", "job_id: Bad_Id"), "job_id"),
    ],
)
def test_submit_bad_file_prints_one_line_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: tuple[str, str], field: str
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(JOB_YAML.replace(*change))
    code, out, err = run(capsys, "submit", str(job), "--dry-run")
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("respawn: error: ")
    assert field in err
    assert "Traceback" not in err


def test_submit_unreadable_and_unparsable_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "submit", str(tmp_path / "missing.yaml"), "--dry-run")
    assert code == 2
    assert "missing.yaml" in err
    assert err.count("\n") == 1
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    code, _, err = run(capsys, "submit", str(broken), "--dry-run")
    assert code == 2
    assert "broken.json" in err
    assert err.count("\n") == 1


def test_submit_without_a_project_names_the_setting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(JOB_YAML)
    code, _, err = run(capsys, "submit", str(job))
    assert code == 2
    assert "RESPAWN_PROJECT" in err
    assert "--project" in err


def test_status_without_a_bucket_names_the_setting(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "status", "llm-small-001")
    assert code == 2
    assert "RESPAWN_STATE_BUCKET" in err
    assert err.count("\n") == 1


def test_cancel_dry_run_and_bad_job_id(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "cancel", "llm-small-001", "--dry-run", "--json")
    assert code == 0
    assert json.loads(out) == {"action": "cancel", "job_id": "llm-small-001"}
    code, _, err = run(capsys, "cancel", "NOT VALID", "--dry-run")
    assert code == 2
    assert "job_id" in err


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["frobnicate"])
    assert exit_.value.code == 2


def test_parse_event_unreadable_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "parse-event", str(tmp_path / "nope.json"))
    assert code == 2
    assert out == ""
    assert "nope.json" in err


@pytest.mark.parametrize(
    ("name", "kind", "fields"),
    [
        ("logentry_gce_preempted.json", "machine_preempted", {"job_id": "llm-small-001", "attempt": 2}),
        ("cloudevent_logentry_preempted.json", "machine_preempted", {"machine": "llm-small-001-a2"}),
        ("logentry_tpu_worker_preempted.json", "zone_woke_up", {"zone": "us-west4-a"}),
        ("logentry_tpu_node_terminated.json", "machine_preempted", {"job_id": "gemma-tune-2", "attempt": 5}),
        (
            "logentry_gce_preempted_ai_zone.json",
            "machine_preempted",
            {"machine": "llm-small-001-a3", "zone": "us-central1-ai1a"},
        ),
        ("logentry_trainer_checkpoint.json", "checkpoint_saved", {"step": 1400}),
        ("logentry_trainer_completed.json", "trainer_completed", {"attempt": 3}),
        ("sweep_tick.json", "sweep_ticked", {}),
        ("cloudevent_job.json", "job_submitted", {}),
        ("logentry_unrelated_vm.json", "ignored", {}),
    ],
)
def test_parse_event_prints_one_json_object(
    capsys: pytest.CaptureFixture[str], name: str, kind: str, fields: dict[str, object]
) -> None:
    code, out, err = run(capsys, "parse-event", str(DATA / name))
    assert (code, err) == (0, "")
    assert out.count("\n") == 1
    event = json.loads(out)
    assert event["kind"] == kind
    assert fields.items() <= event.items()
    if kind == "ignored":
        assert event["reason"]


def test_status_shows_the_hosts_of_a_slice_and_the_hang_timeout() -> None:
    from respawn.decide import decide
    from respawn.events import JobSubmitted
    from respawn.policy import Policy
    from respawn.spec import parse_job_message
    from respawn_cli.main import describe
    from respawn_ops.jobfile import load_job_file

    message = load_job_file(DATA / "job_tpu.yaml")
    message["machine"]["accelerator_type"] = "v5litepod-16"
    message["hang_timeout"] = "10m"
    job, _ = decide(None, JobSubmitted("m1", 1.0, parse_job_message(message)), 1.0, Policy())  # type: ignore[arg-type]
    assert job is not None
    text = describe(job)
    assert "tpu v5litepod-16 (spot, 4 hosts per slice)" in text and "hang after   600s without progress" in text
    assert job.to_dict()["hosts"] == 4


def test_status_shows_each_attempts_tier_wait_and_what_each_tier_cost() -> None:
    from respawn.decide import decide
    from respawn.events import JobSubmitted, MachinePreempted, TrainerStarted
    from respawn.policy import Policy
    from respawn.spec import parse_job_message
    from respawn_cli.main import describe
    from respawn_ops.jobfile import load_job_file

    T = 1_700_000_000.0
    message = load_job_file(DATA / "job_tpu.yaml")
    zones = message.pop("zones")
    del message["provisioning"]
    message["tiers"] = [
        {"provisioning": "spot", "zones": zones, "move_on": {"after_preemptions": 1}},
        {"provisioning": "standard", "zones": zones[:1]},
    ]
    events = [
        JobSubmitted("m1", T, parse_job_message(message)),  # type: ignore[arg-type]
        TrainerStarted("s1", T + 100, "llm-small-001", 1, None, 10.0),  # waited 90 s, started its process at 90
        MachinePreempted("p1", T + 3690, "llm-small-001", 1, "llm-small-001-a1", zones[0], "p"),
        TrainerStarted("s2", T + 3760, "llm-small-001", 2, 100, 10.0),
    ]
    job = None
    for e in events:
        job, _ = decide(job, e, e.time, Policy())
    assert job is not None
    text = describe(job, now=T + 3750 + 1800)
    assert "tiers        0: spot in us-central1-a, us-west4-a; 1: standard in us-central1-a" in text
    rows = {line.split()[0]: line.split() for line in text.split("attempts")[1].splitlines()[2:4]}
    assert (rows["1"][2], rows["1"][7], rows["1"][-3]) == ("0", "90s", "preempted")  # tier, waited, end
    assert (rows["2"][2], rows["2"][7]) == ("1", "60s")
    assert rows["1"][4] == rows["2"][4] == "v5litepod-8"  # runs on: the job's machine (no tier names its own)
    costs = text.split("machine time by tier")[1]
    assert "spot" in costs and "1.00" in costs and "$3.84" in costs  # 1 h of v5litepod-8 at 8 x $0.48 Spot
    assert "standard" in costs and "0.50" in costs and "$4.80" in costs  # 0.5 h at 8 x $1.20 on-demand


def test_status_names_the_machine_each_attempt_ran_on_where_a_tier_names_its_own() -> None:
    from respawn.jobs import Attempt, Job, JobSpec, Status
    from respawn.spec import parse_job_message
    from respawn_cli.main import describe
    from respawn_ops.jobfile import load_job_file

    spec = parse_job_message(load_job_file(DATA.parent.parent / "examples" / "gpu-tiers.yaml"))
    assert isinstance(spec, JobSpec)
    attempts = tuple(
        Attempt(n, zone, f"gpu-tiers-a{n}", 1_700_000_000.0 + n, tier=tier)
        for n, zone, tier in ((1, "us-central1-a", 0), (2, "us-east5-a", 0), (3, "us-central1-a", 1))
    )
    job = Job("gpu-tiers", spec, Status.RUNNING, 1_700_000_000.0, 1_700_000_010.0, attempts=attempts, tier_index=1)
    text = describe(job, now=1_700_000_100.0)
    assert "1: spot in us-central1-a, us-central1-b on a2-highgpu-4g(4xnvidia-tesla-a100)" in text
    rows = [line.split() for line in text.split("attempts")[1].splitlines()[2:5]]
    assert [row[4] for row in rows] == ["a3-highgpu-8g(8xnvidia-h100-80gb)"] * 2 + [
        "a2-highgpu-4g(4xnvidia-tesla-a100)"
    ]


def test_status_shows_the_placement_and_why_each_attempt_went_where_it_did() -> None:
    from respawn.decide import decide
    from respawn.events import JobSubmitted, MachinePreempted, TrainerStarted
    from respawn.jobs import JobSpec
    from respawn.outlook import Outlook
    from respawn.policy import Policy
    from respawn.spec import parse_job_message
    from respawn_cli.main import describe
    from respawn_ops.jobfile import load_job_file

    T = 1_700_000_000.0
    spec = parse_job_message(load_job_file(DATA / "job_tpu.yaml"))
    assert isinstance(spec, JobSpec)
    events = [
        JobSubmitted("m1", T, spec),
        TrainerStarted("s1", T + 100, spec.job_id, 1, None, 10.0),
        MachinePreempted("p1", T + 200, spec.job_id, 1, f"{spec.job_id}-a1", spec.zones[0], "p"),
    ]
    job = None
    for e in events:
        job, _ = decide(job, e, e.time, Policy(), outlook=Outlook())
    assert job is not None
    text = describe(job, now=T + 300)
    assert "placement    ranked" in text
    why = text.split("\nplacement\n")[1].splitlines()
    assert why[0].startswith(f"  1  {spec.zones[0]}: MTBI 24.0h (history: 0.0 interruptions")
    assert why[1].startswith(f"  2  {spec.zones[1]}: MTBI") and "runner-up" in why[1]


# -- respawn logs -----------------------------------------------------------------------------------------------------


def local_run(workdir: Path, over: bool = True) -> Path:
    """A local run of `qs`: a1 preempted, a2 completed (the files the local cloud writes)."""
    run = workdir / "runs" / "20260101-000000-1"
    (run / "machines").mkdir(parents=True)
    (run / "timeline.jsonl").write_text(json.dumps({"t": 1.0, "kind": "submitted", "job_id": "qs"}) + "\n")
    (run / "machines" / "qs-a1.log").write_text('{"event":"started","job_id":"qs","attempt":1,"step":0}\nstep 1/2\n')
    (run / "machines" / "qs-a2.log").write_text('step 2/2\n{"event":"completed","job_id":"qs","attempt":2}\n')
    if over:
        (run / "report.json").write_text("{}")
    return run


def test_logs_of_a_local_run_print_every_attempt_in_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    made = local_run(tmp_path)
    code, out, err = run(capsys, "logs", "qs", "--workdir", str(tmp_path))
    assert code == 0 and str(made) in err
    assert out.splitlines() == ['[a1] started {"step": 0}', "[a1] step 1/2", "[a2] step 2/2", "[a2] completed {}"]
    code, out, _ = run(capsys, "logs", "qs", "--workdir", str(tmp_path), "--attempt", "2", "--json")
    assert [json.loads(x) for x in out.splitlines()] == [
        {"attempt": 2, "worker": None, "line": "step 2/2"},
        {"attempt": 2, "worker": None, "entry": {"event": "completed", "job_id": "qs", "attempt": 2}},
    ]


def test_logs_follow_ends_at_ctrl_c_with_exit_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    local_run(tmp_path, over=False)  # named after process 1, which never ends: the run looks live

    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(time, "sleep", interrupted)
    code, out, _ = run(capsys, "logs", "qs", "-f", "--workdir", str(tmp_path))
    assert code == 0 and out.count("\n") == 4


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["logs", "nope"], "no local run of job 'nope' in"),
        (["logs", "Not_A_Job"], 'logs: job message: field "job_id"'),
        (["logs", "qs", "--attempt", "0"], "--attempt: 0 is not an attempt; allowed: 1 or more"),
        (["logs", "qs", "--attempt", "3"], "--attempt: job qs has no attempt 3 in"),
    ],
)
def test_logs_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    local_run(tmp_path)
    code, out, err = run(capsys, *argv, "--workdir", str(tmp_path))
    assert (code, out) == (2, "") and err.count("\n") == 1 and says in err


def test_logs_with_a_state_bucket_read_cloud_logging(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fakes import FakeLogReader, InMemoryJobStore

    from respawn.decide import decide
    from respawn.events import JobSubmitted, TrainerCompleted, TrainerStarted
    from respawn.policy import Policy
    from respawn.spec import parse_job_message
    from respawn_cli import main as cli
    from respawn_ops.jobfile import load_job_file

    names = ["logentry_trainer_started.json", "logentry_container_line.json", "logentry_trainer_completed.json",
             "logentry_trainer_failed.json"]  # fmt: skip
    entries = [json.loads((DATA / name).read_text()) for name in names]
    submitted = 1741944000.0  # before the entries
    job = None
    for event in (
        JobSubmitted("m", submitted, parse_job_message(load_job_file(DATA / "job_tpu.yaml"))),  # type: ignore[arg-type]
        TrainerStarted("s", submitted + 1, "llm-small-001", 1),
    ):
        job, _ = decide(job, event, event.time, Policy())
    store, reader = InMemoryJobStore(), FakeLogReader(entries)
    assert job is not None
    store.save(job, 0)
    monkeypatch.setattr(cli, "job_store", lambda s: store)
    monkeypatch.setattr(cli, "log_reader", lambda s: reader)
    monkeypatch.setenv("RESPAWN_STATE_BUCKET", "state")
    monkeypatch.setenv("RESPAWN_PROJECT", "ml-research-4821")

    code, out, err = run(capsys, "logs", "llm-small-001")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert [line.split()[:2] for line in lines] == [["[a3]", "started"], ["[a3]", "09:41:13"], ["[a3]", "completed"]]
    assert 'timestamp>="2025-03-14T09:19:00.000000Z"' in reader.filters[-1]  # from the submit, less the lag

    code, _, err = run(capsys, "logs", "llm-small-001", "--attempt", "2")
    assert code == 2 and "has no attempt 2; it has attempts 1-1" in err
    code, _, err = run(capsys, "logs", "other-job")
    assert code == 2 and "no job 'other-job' in gs://state/respawn/jobs/" in err

    done, _ = decide(job, TrainerCompleted("c", submitted + 2, "llm-small-001", 1, 5), submitted + 2, Policy())
    assert done is not None
    store.save(done, 1)
    monkeypatch.setattr("time.sleep", lambda s: None)
    code, out, _ = run(capsys, "logs", "llm-small-001", "-f")  # the job is over: one more read, then it ends
    assert code == 0 and len(out.splitlines()) == 3 and len(reader.filters) == 1 + 2
    monkeypatch.delenv("RESPAWN_PROJECT")
    code, _, err = run(capsys, "logs", "llm-small-001")
    assert code == 2 and "RESPAWN_PROJECT is not set" in err and "--project" in err


def test_status_says_why_a_zone_was_skipped() -> None:
    from respawn.decide import decide
    from respawn.events import CreateFailed, CreateFailure, JobSubmitted
    from respawn.policy import Policy
    from respawn.spec import parse_job_message
    from respawn_cli.main import describe
    from respawn_ops.jobfile import load_job_file

    spec = parse_job_message(load_job_file(DATA / "job_tpu.yaml"))
    first, second = spec.zones  # type: ignore[union-attr]
    refused = f"Accelerator type with name 'v5litepod-8' does not exist in zone '{first}'."
    job, _ = decide(None, JobSubmitted("m1", 1.0, spec), 1.0, Policy())  # type: ignore[arg-type]
    job, _ = decide(job, CreateFailed("m2", 2.0, spec.job_id, 1, CreateFailure.UNOFFERED, refused), 2.0, Policy())
    assert job is not None
    text = describe(job)
    assert f"skipped zones (they do not offer the machine)\n  {first}  {refused}" in text
    assert f"{first} does not offer the machine: {refused}; trying {second}" in text
