"""Today's GPU machines (respawn.gpus): every table of a series derives from its one record, every shape has a dated
price, `respawn plan` prints it, docs/gpus.md shows the same table, and the GPU example job parses with the job spec
decoder."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from localcloud.cloud import TRAINER_IMAGES as LOCAL_IMAGES
from respawn import gpus
from respawn.actions import CreateMachine
from respawn.adapters.compute import GcpComputeProvider, boot_disk_type
from respawn.gpus import (
    GPU_SERIES,
    GPU_SHAPES,
    HYPERDISK_BALANCED,
    GpuPrice,
    GpuSeries,
    GpuShape,
    WorkloadPolicy,
    gpu_series,
    gpu_shape,
)
from respawn.jobs import GpuMachine, JobSpec, Provisioning, Tier
from respawn.machine import TRAINER_IMAGES
from respawn.prices import GPU_PRICES, list_source, machine_price
from respawn.spec import parse_job_message
from respawn_cli.main import main
from respawn_ops.jobfile import load_job_file

REPO = Path(__file__).resolve().parents[2]
DATED = re.compile(r"\d{4}-\d{2}(-\d{2})?")


@pytest.fixture(autouse=True)
def no_cloud_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """`respawn plan` offline: no history bucket, no Advice API (the table's prices only)."""
    for name in ("RESPAWN_PROJECT", "GOOGLE_CLOUD_PROJECT", "RESPAWN_STATE_BUCKET", "CLOUDSDK_CORE_PROJECT"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("series", GPU_SERIES, ids=lambda s: s.name)
def test_every_table_of_a_series_is_read_from_its_one_record(series: GpuSeries) -> None:
    """The listed shapes, the price per GPU, and each machine type's series and boot disk: the record's, nowhere
    else. A series without a price is not listed."""
    assert [s for s in GPU_SHAPES if s.series == series.name] == (list(series.shapes) if series.price else [])
    row = GPU_PRICES.get(series.accelerator_type)
    if series.price is None:
        assert row is None
    else:
        assert row is not None and (row.on_demand, row.spot, row.as_of) == (
            series.price.on_demand,
            series.price.spot,
            series.price.as_of,
        )
    for machine_type in series.machine_types:
        assert gpu_series(machine_type) is series and boot_disk_type(machine_type) == series.boot_disk


@pytest.mark.parametrize(
    ("policy", "spot", "flex"),
    [
        (None, False, False),
        (WorkloadPolicy(flex_start=False), True, False),
        (WorkloadPolicy(flex_start=True), True, True),
    ],
)
def test_a_new_series_mig_is_placed_as_its_record_says(
    policy: WorkloadPolicy | None, spot: bool, flex: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new series is one record, and the adapter asks it: a MIG of its VMs is under a workload policy exactly when
    the record says so (no second list to forget), and its VMs boot from the record's disk."""
    new = GpuSeries(
        "Z9", "Z 1TB", "nvidia-z9", {"z9-highgpu-8g": 8}, HYPERDISK_BALANCED, policy, GpuPrice(9, 3, "2030-01")
    )
    monkeypatch.setattr(gpus, "GPU_SERIES", (*GPU_SERIES, new))
    gce = GcpComputeProvider("proj", endpoint="http://127.0.0.1:9")  # never called
    for provisioning, placed in ((Provisioning.SPOT, spot), (Provisioning.FLEX_START, flex)):
        spec = JobSpec(
            "z",
            GpuMachine("z9-highgpu-8g", "nvidia-z9", 8, vms=2),
            ("us-central1-a",),
            "img",
            "gs://b/z",
            tiers=(Tier(provisioning, ("us-central1-a",)),),
        )
        machine = gce.slice(CreateMachine("z", 1, "z-a1", "us-central1-a", 5000.0), spec)
        assert machine.placement is placed, provisioning
    assert boot_disk_type("z9-highgpu-8g") == HYPERDISK_BALANCED


def test_the_table_has_the_series_of_today_each_machine_type_once() -> None:
    series = {s.series for s in GPU_SHAPES}
    assert {"G2", "A2 Standard", "A2 Ultra", "A3 High", "A3 Mega", "A3 Ultra", "A4"} <= series
    types = [s.machine_type for s in GPU_SHAPES]
    assert len(types) == len(set(types))
    for wanted in ("g2-standard-8", "a2-highgpu-1g", "a2-ultragpu-8g", "a3-highgpu-8g", "a3-megagpu-8g",
                   "a3-ultragpu-8g", "a4-highgpu-8g"):  # fmt: skip
        assert gpu_shape(wanted) is not None, wanted
    assert gpu_shape("n1-standard-8") is None
    for s in GPU_SHAPES:
        assert re.fullmatch(r"nvidia-[a-z0-9-]+", s.accelerator_type) and s.gpus in (1, 2, 4, 8, 16)
        assert s.boot_disk in ("pd-balanced", "hyperdisk-balanced")


@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: s.machine_type)
def test_every_shape_has_a_dated_spot_and_on_demand_price(shape: GpuShape) -> None:
    row = GPU_PRICES[shape.accelerator_type]
    assert DATED.fullmatch(row.as_of) and row.unit == "gpu"
    assert 0 < row.spot < row.on_demand  # a Spot price is a discount on the on-demand one
    price = machine_price(dict(GpuMachine(shape.machine_type, shape.accelerator_type, shape.gpus).__dict__))
    assert price is not None and price.source == list_source(row.as_of)
    assert (price.spot_per_h, price.on_demand_per_h) == (shape.gpus * row.spot, shape.gpus * row.on_demand)


def job_file(tmp_path: Path, shape: GpuShape) -> Path:
    path = tmp_path / f"{shape.machine_type}.json"
    path.write_text(
        json.dumps(
            {
                "action": "submit",
                "job_id": "g",
                "machine": {"kind": "gpu", "machine_type": shape.machine_type,
                            "accelerator_type": shape.accelerator_type, "accelerator_count": shape.gpus},
                "tiers": [
                    {"provisioning": "spot", "zones": ["us-central1-a", "us-central1-b"],
                     "move_on": {"after_preemptions": 2}},
                    {"provisioning": "standard", "zones": ["us-central1-a"]},
                ],
                "image": "us-docker.pkg.dev/p/r/trainer-cuda:1",
                "checkpoint_uri": "gs://ckpt-bucket/runs/g",
            }
        )
    )  # fmt: skip
    return path


@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: s.machine_type)
def test_respawn_plan_prints_the_price_of_every_shape(
    shape: GpuShape, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each zone's line: the Spot price on the Spot tier, the on-demand one on the standard tier, and the dated
    row they came from."""
    row = GPU_PRICES[shape.accelerator_type]
    path = job_file(tmp_path, shape)
    assert main(["plan", str(path)]) == 0
    text = capsys.readouterr().out
    spot, standard = text.split("\ntier 1")
    for tier, rate in ((spot, shape.gpus * row.spot), (standard, shape.gpus * row.on_demand)):
        lines = [line for line in tier.splitlines() if "us-central1-" in line and "zones" not in line]
        assert lines and all(f"${rate:.2f}/h" in line and list_source(row.as_of) in line for line in lines), tier
    assert main(["plan", str(path), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    rates = [{z["price_per_hour"] for z in t["zones"]} for t in planned["tiers"]]
    assert rates == [{shape.gpus * row.spot}, {shape.gpus * row.on_demand}]


def test_docs_print_the_same_table() -> None:
    """docs/gpus.md's table of GPU machines: one row per shape, its figures the code's."""
    text = (REPO / "docs" / "gpus.md").read_text(encoding="utf-8")
    rows = {
        cells[0].strip("`"): cells
        for line in text.splitlines()
        if line.startswith("| `") and (cells := [c.strip() for c in line.strip().strip("|").split("|")])
    }
    assert set(rows) == {s.machine_type for s in GPU_SHAPES}
    for s in GPU_SHAPES:
        row = GPU_PRICES[s.accelerator_type]
        _, series, gpu, accelerator, gpus, disk, spot, on_demand, as_of = rows[s.machine_type]
        assert (series, gpu, accelerator, gpus) == (s.series, s.gpu, f"`{s.accelerator_type}`", str(s.gpus))
        assert disk == s.boot_disk
        assert (spot, on_demand, as_of) == (f"${s.gpus * row.spot:.2f}", f"${s.gpus * row.on_demand:.2f}", row.as_of)


def test_the_gpu_example_runs_the_deployments_cuda_image_on_a_priced_shape() -> None:
    """examples/gpu.yaml names no image: it runs the deployment's trainer image of a GPU machine, trainer-cuda (the
    local cloud's in its functions' RESPAWN_TRAINER_IMAGES)."""
    message = load_job_file(REPO / "examples" / "gpu.yaml")
    assert "image" not in message
    spec = parse_job_message(message, LOCAL_IMAGES)
    assert isinstance(spec, JobSpec) and isinstance(spec.machine, GpuMachine)
    shape = gpu_shape(spec.machine.machine_type)
    assert shape is not None
    assert (spec.machine.accelerator_type, spec.machine.accelerator_count) == (shape.accelerator_type, shape.gpus)
    assert spec.provisioning == "spot"
    assert spec.image == "us-docker.pkg.dev/respawn-local/respawn/trainer-cuda:latest"
    assert re.search(rf"/{TRAINER_IMAGES['gpu']}:[^/]+$", spec.image), spec.image


def test_submit_and_plan_take_a_job_without_image_and_submit_publishes_it_without(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The CLI does not know the deployment's images: it checks the rest of the job and publishes it as written, for
    the functions to fill in the image of its machine's kind."""
    gpu = str(REPO / "examples" / "gpu.yaml")
    assert main(["submit", gpu, "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert "image" not in json.loads(out) and err == ""
    assert main(["plan", gpu]) == 0
    assert "g2-standard-8" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("kind", "image", "warning"),
    [
        ("gpu", "us-docker.pkg.dev/p/r/trainer:7", "is respawn's TPU trainer image; a gpu machine runs "
         "us-docker.pkg.dev/p/r/trainer-cuda:7"),
        ("tpu", "us-docker.pkg.dev/p/r/trainer-cuda@sha256:" + "0" * 64, "is respawn's GPU trainer image; a tpu "
         "machine runs us-docker.pkg.dev/p/r/trainer\n"),
        ("gpu", "us-docker.pkg.dev/p/r/trainer-cuda:7", None),
        ("tpu", "us-docker.pkg.dev/p/r/trainer:7", None),
        ("gpu", "us-docker.pkg.dev/p/r/my-trainer:7", None),  # the user's own image: whatever its name
    ],
)  # fmt: skip
def test_submit_warns_when_a_job_names_respawns_image_of_the_other_kind(
    kind: str, image: str, warning: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The image of a kind is TRAINER_IMAGES[kind]: the other kind's would fail at its trainer's start (its JAX
    finds no GPU, or no TPU), so `respawn submit` says so before anything is spent, and still submits."""
    message = load_job_file(REPO / ("examples/gpu.yaml" if kind == "gpu" else "examples/quickstart.yaml"))
    path = tmp_path / "job.json"
    path.write_text(json.dumps({**message, "image": image}))
    assert main(["submit", str(path), "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["image"] == image
    if warning is None:
        assert err == ""
    else:
        assert err.startswith(f"respawn: warning: {path}: image {image} ") and warning in err
