"""The TPU shape table: every generation's sizes -> chips, hosts and chips per host; unknown types are errors."""

from __future__ import annotations

import pytest

from respawn.spec import SpecError, parse_job_message
from respawn.topology import (
    COMPUTE,
    COMPUTE_GENERATIONS,
    GENERATIONS,
    TPU_API_GENERATIONS,
    Topology,
    UnknownTpuType,
    compute_shape,
    tpu_topology,
)

# (accelerator type, chips, hosts, chips per host), read off the Cloud TPU pages each generation cites.
TABLE = [
    ("v2-8", 4, 1, 4),
    ("v2-32", 16, 4, 4),
    ("v2-512", 256, 64, 4),
    ("v3-8", 4, 1, 4),
    ("v3-32", 16, 4, 4),
    ("v3-2048", 1024, 256, 4),
    ("v4-8", 4, 1, 4),
    ("v4-16", 8, 2, 4),
    ("v4-32", 16, 4, 4),
    ("v4-384", 192, 48, 4),
    ("v4-4096", 2048, 512, 4),
    ("v5litepod-1", 1, 1, 1),
    ("v5litepod-4", 4, 1, 4),
    ("v5litepod-8", 8, 1, 8),
    ("v5litepod-16", 16, 4, 4),
    ("v5litepod-256", 256, 64, 4),
    ("v5p-8", 4, 1, 4),
    ("v5p-16", 8, 2, 4),
    ("v5p-128", 64, 16, 4),
    ("v5p-12288", 6144, 1536, 4),
    ("v6e-1", 1, 1, 1),
    ("v6e-8", 8, 1, 8),
    ("v6e-16", 16, 4, 4),
    ("v6e-256", 256, 64, 4),
]


@pytest.mark.parametrize(("accelerator_type", "chips", "hosts", "per_host"), TABLE)
def test_the_shape_of_each_type(accelerator_type: str, chips: int, hosts: int, per_host: int) -> None:
    assert tpu_topology(accelerator_type) == Topology(accelerator_type, chips, hosts, per_host)
    assert tpu_topology(accelerator_type).multi_host == (hosts > 1)


def test_every_size_of_every_generation_has_whole_hosts() -> None:
    for gen in GENERATIONS.values():
        assert gen.source.startswith("https://cloud.google.com/tpu/docs/")
        for size in gen.sizes:
            t = tpu_topology(f"{gen.name}-{size}")
            assert t.hosts * t.chips_per_host == t.chips, t


@pytest.mark.parametrize(
    ("accelerator_type", "message"),
    [
        ("v5litepod-12", "v5litepod has no size '12'; allowed: v5litepod-1, 4, 8, 16, 32, 64, 128, 256"),
        ("v4-24", "v4 has no size '24'; allowed: v4-8, 16, 32, 64, 128, 256, 384, 512, 1024, 1536, 2048, 4096"),
        ("v7x-8", "'v7x-8' is not a Cloud TPU generation; allowed: v2-8, 32, 128, 256, 512; v3-8,"),
    ],
)
def test_a_type_that_does_not_exist_names_the_sizes_that_do(accelerator_type: str, message: str) -> None:
    with pytest.raises(UnknownTpuType) as err:
        tpu_topology(accelerator_type)
    assert str(err.value).startswith(message)


def test_the_job_message_rejects_a_size_that_does_not_exist() -> None:
    message = {
        "action": "submit",
        "job_id": "llm",
        "machine": {"kind": "tpu", "accelerator_type": "v6e-12", "api": "tpu", "runtime_version": "v2-alpha-tpuv6e"},
        "zones": ["us-east5-b"],
        "image": "us-docker.pkg.dev/p/r/trainer:1",
        "checkpoint_uri": "gs://ckpt-bucket/runs/llm",
    }
    with pytest.raises(SpecError) as err:
        parse_job_message(message)
    assert str(err.value) == (
        "job message: field \"machine.accelerator_type\": v6e has no size '12'; "
        "allowed: v6e-1, 4, 8, 16, 32, 64, 128, 256"
    )
    message["machine"]["accelerator_type"] = "v6e-64"  # type: ignore[index]
    spec = parse_job_message(message)
    assert spec.machine.hosts == 16  # type: ignore[union-attr]


# ---------------------------------------------------------------------------- Compute Engine

# (accelerator type, machine type, VMs, workload policy topology), from the pages COMPUTE's rows cite.
COMPUTE_TABLE = [
    ("v6e-1", "ct6e-standard-1t", 1, "1x1"),
    ("v6e-4", "ct6e-standard-4t", 1, "2x2"),
    ("v6e-8", "ct6e-standard-8t", 1, "2x4"),
    ("v6e-16", "ct6e-standard-4t", 4, "4x4"),
    ("v6e-32", "ct6e-standard-4t", 8, "4x8"),
    ("v6e-64", "ct6e-standard-4t", 16, "8x8"),
    ("v6e-128", "ct6e-standard-4t", 32, "8x16"),
    ("v6e-256", "ct6e-standard-4t", 64, "16x16"),
    ("v5p-8", "ct5p-hightpu-4t", 1, "2x2x1"),
    ("v5p-16", "ct5p-hightpu-4t", 2, "2x2x2"),
    ("v5p-128", "ct5p-hightpu-4t", 16, "4x4x4"),
    ("v5p-12288", "ct5p-hightpu-4t", 1536, "16x16x24"),
    ("tpu7x-8", "tpu7x-standard-4t", 1, "2x2x1"),
    ("v5p-32", "ct5p-hightpu-4t", 4, "2x2x4"),
    ("tpu7x-16", "tpu7x-standard-4t", 2, "2x2x2"),
    ("tpu7x-128", "tpu7x-standard-4t", 16, "4x4x4"),
    ("tpu7x-16384", "tpu7x-standard-4t", 2048, "16x16x32"),
]


@pytest.mark.parametrize(("accelerator_type", "machine_type", "vms", "topology"), COMPUTE_TABLE)
def test_the_compute_engine_shape_of_each_type(
    accelerator_type: str, machine_type: str, vms: int, topology: str
) -> None:
    shape = compute_shape(accelerator_type)
    assert (shape.machine_type, shape.vms, shape.topology) == (machine_type, vms, topology)
    assert shape.multi_host == (vms > 1)
    assert shape.vms == tpu_topology(accelerator_type).hosts  # the same worker VMs as through the Cloud TPU API


def test_every_size_of_a_compute_engine_generation_has_a_shape_with_as_many_chips_as_its_topology() -> None:
    assert set(COMPUTE) == COMPUTE_GENERATIONS == {"v5p", "v6e", "tpu7x"}
    for gen in COMPUTE.values():
        assert gen.source.startswith("https://cloud.google.com/tpu/docs/")
        assert gen.image.startswith("projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accel-")
        assert set(gen.topologies) == set(GENERATIONS[gen.name].sizes)
        for size in GENERATIONS[gen.name].sizes:
            accelerator_type = f"{gen.name}-{size}"
            shape, cloud_tpu = compute_shape(accelerator_type), tpu_topology(accelerator_type)
            chips = 1
            for side in shape.topology.split("x"):
                chips *= int(side)
            assert chips == cloud_tpu.chips and shape.vms == cloud_tpu.hosts, accelerator_type
            per_vm = int(shape.machine_type.rpartition("-")[2].rstrip("t"))  # ct6e-standard-4t: 4 chips
            assert per_vm * shape.vms == chips and shape.image == gen.image, accelerator_type


def test_the_cloud_tpu_api_offers_every_generation_but_tpu7x() -> None:
    assert GENERATIONS.keys() - TPU_API_GENERATIONS == {"tpu7x"}


@pytest.mark.parametrize(
    ("accelerator_type", "message"),
    [
        ("v5litepod-8", "Compute Engine does not offer v5litepod; allowed: v5p, v6e, tpu7x"),
        ("v4-8", "Compute Engine does not offer v4; allowed: v5p, v6e, tpu7x"),
        ("v6e-12", "v6e has no size '12'; allowed: v6e-1, 4, 8, 16, 32, 64, 128, 256"),
    ],
)
def test_a_type_compute_engine_does_not_make_says_what_it_does(accelerator_type: str, message: str) -> None:
    with pytest.raises(UnknownTpuType) as err:
        compute_shape(accelerator_type)
    assert str(err.value) == message
