"""Settings from the environment, and the per-process Service built from them."""

from __future__ import annotations

import json

import pytest

from respawn.bootstrap import service_from_env
from respawn.deployment import IMAGES, Settings, SettingsError
from respawn.policy import Policy
from respawn.spec.rules import IMAGES_VARIABLE


def test_settings_read_the_environment_with_defaults() -> None:
    s = Settings.from_env({"GOOGLE_CLOUD_PROJECT": "p1", "RESPAWN_STATE_BUCKET": "gs://state-bucket/"})
    assert s == Settings(project="p1", state_bucket="state-bucket")
    assert (s.jobs_topic, s.events_topic) == ("respawn-jobs", "respawn-events")
    s = Settings.from_env(
        {
            "RESPAWN_PROJECT": "p2",
            "GOOGLE_CLOUD_PROJECT": "ignored",
            "RESPAWN_JOBS_TOPIC": "jobs",
            "RESPAWN_MACHINE_SERVICE_ACCOUNT": "m@p2.iam.gserviceaccount.com",
            "RESPAWN_TPU_ENDPOINT": "http://127.0.0.1:9",
            "RESPAWN_COMPUTE_ENDPOINT": " ",
        }
    )
    assert (s.project, s.jobs_topic, s.machine_service_account) == ("p2", "jobs", "m@p2.iam.gserviceaccount.com")
    assert (s.tpu_endpoint, s.compute_endpoint) == ("http://127.0.0.1:9", None)


@pytest.mark.parametrize(
    ("env", "variable"),
    [({}, "RESPAWN_PROJECT"), ({"RESPAWN_PROJECT": "p"}, "RESPAWN_STATE_BUCKET")],
)
def test_a_missing_setting_is_one_line_naming_the_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(SettingsError) as e:
        Settings.from_env(env).require("project", "state_bucket")
    assert str(e.value).startswith(f"{variable} is not set")
    assert "\n" not in str(e.value)


def test_service_is_built_once_per_process_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")  # nothing is called at construction
    for name, value in {
        "RESPAWN_PROJECT": "p",
        "RESPAWN_STATE_BUCKET": "state-a",
        "RESPAWN_TPU_ENDPOINT": "http://127.0.0.1:9",
        "RESPAWN_COMPUTE_ENDPOINT": "http://127.0.0.1:9",
    }.items():
        monkeypatch.setenv(name, value)
    first = service_from_env()
    assert service_from_env() is first
    assert sorted(first.providers) == ["compute", "tpu"]
    assert first.notifier is None  # no status topic, no notices
    monkeypatch.setenv("RESPAWN_STATUS_TOPIC", "respawn-status")
    notifying = service_from_env()
    assert getattr(notifying.notifier, "topic", None) == "projects/p/topics/respawn-status"
    monkeypatch.delenv("RESPAWN_STATUS_TOPIC")
    monkeypatch.setenv("RESPAWN_STATE_BUCKET", "state-b")
    assert service_from_env() is not first
    monkeypatch.delenv("RESPAWN_STATE_BUCKET")
    with pytest.raises(SettingsError):
        service_from_env()


def test_the_time_scale_reaches_decides_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    """RESPAWN_TIME_SCALE (the local cloud's recovery profile): a head start's drain in the profile's time."""
    assert Settings.from_env({}).time_scale == 1.0
    assert Settings.from_env({"RESPAWN_TIME_SCALE": "0.0166667"}).time_scale == pytest.approx(1 / 60, rel=1e-4)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")  # nothing is called at construction
    scaled = {"RESPAWN_PROJECT": "p", "RESPAWN_STATE_BUCKET": "state-scaled", "RESPAWN_TIME_SCALE": "0.5"}
    for name, value in {
        **scaled,
        "RESPAWN_TPU_ENDPOINT": "http://127.0.0.1:9",
        "RESPAWN_COMPUTE_ENDPOINT": "http://127.0.0.1:9",
    }.items():
        monkeypatch.setenv(name, value)
    assert service_from_env()._one_job.policy == Policy(time_scale=0.5)


@pytest.mark.parametrize("text", ["0", "-1", "fast", "nan", "inf"])
def test_a_time_scale_that_is_no_positive_number_is_one_line_naming_the_variable(text: str) -> None:
    with pytest.raises(SettingsError) as e:
        Settings.from_env({"RESPAWN_TIME_SCALE": text})
    assert str(e.value).startswith(f"RESPAWN_TIME_SCALE is {text!r}: it must be a positive number")
    assert "\n" not in str(e.value)


def test_the_machines_network_settings_and_their_defaults() -> None:
    """Unset (or empty, as Terraform passes no subnetwork): the default network with external IPs."""
    unset = Settings.from_env({"RESPAWN_SUBNETWORK": ""})
    assert (unset.network, unset.subnetwork, unset.external_ips) == (None, None, True)
    s = Settings.from_env(
        {
            "RESPAWN_NETWORK": "projects/host-1/global/networks/team-vpc",
            "RESPAWN_SUBNETWORK": "ml-subnet",
            "RESPAWN_EXTERNAL_IP": "false",
        }
    )
    assert (s.network, s.subnetwork, s.external_ips) == ("projects/host-1/global/networks/team-vpc", "ml-subnet", False)
    assert Settings.from_env({"RESPAWN_EXTERNAL_IP": "TRUE"}).external_ips is True


@pytest.mark.parametrize(
    ("variable", "text", "allowed"),
    [
        ("RESPAWN_NETWORK", "team-vpc", "projects/PROJECT/global/networks/NAME"),
        ("RESPAWN_NETWORK", "projects/p1/global/networks/", "projects/PROJECT/global/networks/NAME"),
        ("RESPAWN_NETWORK", "projects/p1/regions/us-central1/subnetworks/s", "projects/PROJECT/global/networks/NAME"),
        ("RESPAWN_SUBNETWORK", "regions/us-central1/subnetworks/s", "a subnetwork name"),
        ("RESPAWN_SUBNETWORK", "ML_Subnet", "a subnetwork name"),
        ("RESPAWN_EXTERNAL_IP", "no", "true or false"),
        ("RESPAWN_EXTERNAL_IP", "1", "true or false"),
    ],
)
def test_a_bad_network_setting_is_one_line_naming_the_variable(variable: str, text: str, allowed: str) -> None:
    with pytest.raises(SettingsError) as e:
        Settings.from_env({variable: text})
    assert str(e.value).startswith(f"{variable} is {text!r}: it must be {allowed}")
    assert "\n" not in str(e.value)


GPU_IMAGE, TPU_IMAGE = "us-docker.pkg.dev/p/respawn/trainer-cuda:abc1234", "us-docker.pkg.dev/p/respawn/trainer:abc1234"


def test_the_deployments_trainer_images_by_machine_kind() -> None:
    """RESPAWN_TRAINER_IMAGES as Terraform writes it (jsonencode of a map of kind to image); unset or empty (Terraform
    without trainer_tag): none, and every job names its image."""
    both = json.dumps({"tpu": TPU_IMAGE, "gpu": GPU_IMAGE})
    assert Settings.from_env({IMAGES: both}).trainer_images == (("gpu", GPU_IMAGE), ("tpu", TPU_IMAGE))
    assert Settings.from_env({IMAGES: json.dumps({"tpu": TPU_IMAGE})}).trainer_images == (("tpu", TPU_IMAGE),)
    assert Settings.from_env({}).trainer_images == Settings.from_env({IMAGES: ""}).trainer_images == ()
    hash(Settings.from_env({IMAGES: both}))  # the functions' Service is cached by its settings


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("trainer:1", "RESPAWN_TRAINER_IMAGES is 'trainer:1': it must be a JSON object of machine kind to image"),
        ('["x"]', "RESPAWN_TRAINER_IMAGES is '[\"x\"]': it must be a JSON object of machine kind to image"),
        ("{}", "RESPAWN_TRAINER_IMAGES is '{}': it must be a JSON object of machine kind to image"),
        ('{"cpu": "trainer:1"}', "RESPAWN_TRAINER_IMAGES: 'cpu' is not a machine kind; allowed: gpu, tpu"),
        (
            '{"gpu": "Trainer Cuda"}',
            'RESPAWN_TRAINER_IMAGES.gpu: "Trainer Cuda" is not a container image reference; allowed: HOST/PATH',
        ),
        ('{"tpu": 7}', "RESPAWN_TRAINER_IMAGES.tpu: expected a string, got an integer; allowed: a string"),
    ],
)
def test_malformed_trainer_images_are_one_line_naming_the_variable(text: str, message: str) -> None:
    """Checked as a job message's `image` is: a bad deployment setting fails every job message loudly (the function
    raises, Pub/Sub redelivers) instead of turning each job into a rejection that blames the job."""
    with pytest.raises(SettingsError) as e:
        Settings.from_env({IMAGES: text})
    assert str(e.value).startswith(message), str(e.value)
    assert "\n" not in str(e.value)


def test_the_job_message_names_the_variable_the_settings_read() -> None:
    assert IMAGES == IMAGES_VARIABLE == "RESPAWN_TRAINER_IMAGES"
