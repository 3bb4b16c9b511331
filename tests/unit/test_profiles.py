"""Recovery profiles: real-cloud figures with their sources, scaled into the local cloud's timings."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from localcloud import command as cli
from localcloud.machines.profiles import (
    CLOUD_SCALE,
    LOCAL_TRAINER_START_S,
    PROFILES,
    Figure,
    MachineTimings,
    needs_docker,
    profile,
    real_minutes,
)
from respawn.jobs import GpuMachine, TpuMachine

REPO = Path(__file__).resolve().parents[2]
TPU_API = TpuMachine("v5litepod-8", "v2-alpha-tpuv5-lite")
COMPUTE_TPU = TpuMachine("v6e-16", api="compute")
OWN_IMAGE = TpuMachine("v6e-16", api="compute", image="projects/p/global/images/family/respawn-tpu-docker")
GPU = GpuMachine("g2-standard-8", "nvidia-l4", 1)


def figures() -> list[tuple[str, str, Figure]]:
    found = []
    for p in PROFILES.values():
        for kind in ("tpu", "gpu"):
            machine = getattr(p, kind)
            if machine is not None:
                found += [(p.name, f"{kind}.{f.name}", getattr(machine, f.name)) for f in dataclasses.fields(machine)]
        found.append((p.name, "mtbi", p.mtbi))
    return found


@pytest.mark.parametrize(("name", "step", "figure"), figures(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_figure_names_its_source(name: str, step: str, figure: Figure) -> None:
    assert figure.real_s >= 0
    cited = "https://" in figure.source or "docs/" in figure.source
    assert cited or figure.source.startswith("estimate:") or figure.real_s == 0, (name, step, figure.source)
    for path in (word for word in figure.source.split() if word.startswith("docs/")):
        assert (REPO / path.rstrip(",")).exists(), path


def test_the_local_profile_is_the_local_cloud_as_it_was() -> None:
    for machine in (TPU_API, COMPUTE_TPU, GPU):
        t = profile("local").timings(machine)
        assert (t.creation_delay_s, t.machine, t.scale) == (1.0, MachineTimings(), 1.0)


def test_the_cloud_profile_scales_a_real_minute_to_a_local_second() -> None:
    t = profile("cloud").timings(TPU_API)
    assert t.scale == CLOUD_SCALE == 1 / 60
    assert t.creation_delay_s == pytest.approx(3.0)  # 3 real minutes of creating
    assert t.machine.boot_s == pytest.approx(40 / 60, abs=1e-3)
    assert t.machine.docker_install_s == 0  # a Cloud TPU API runtime has Docker
    assert t.machine.image_pull_s == pytest.approx(4 * 27 / 60, abs=1e-3)  # 4 GB at 27 s/GB
    assert not t.machine.image_on_boot_disk
    # 2 real minutes of trainer start, of which the local trainer's own start stands for LOCAL_TRAINER_START_S
    assert t.machine.trainer_start_s == pytest.approx(2.0 - LOCAL_TRAINER_START_S)


def test_only_a_compute_engine_tpu_on_googles_image_installs_docker() -> None:
    assert [needs_docker(m) for m in (TPU_API, COMPUTE_TPU, OWN_IMAGE, GPU)] == [False, True, False, False]
    assert profile("cloud").timings(COMPUTE_TPU).machine.docker_install_s == pytest.approx(45 / 60, abs=1e-3)
    assert profile("cloud").timings(GPU).machine.docker_install_s == 0


def test_a_baked_boot_image_saves_the_install_and_the_pull() -> None:
    cloud, baked = profile("cloud").timings(COMPUTE_TPU), profile("cloud-baked").timings(COMPUTE_TPU)
    assert baked.machine.image_on_boot_disk and not cloud.machine.image_on_boot_disk
    assert baked.machine.docker_install_s == 0 < cloud.machine.docker_install_s
    assert baked.machine.image_refresh_s < cloud.machine.image_pull_s  # what a machine with the image pulls
    assert (baked.creation_delay_s, baked.machine.boot_s) == (cloud.creation_delay_s, cloud.machine.boot_s)


def test_without_the_compilation_cache_the_trainer_start_is_ten_times_longer() -> None:
    cached, compiling = profile("cloud").timings(GPU), profile("cloud-nocache").timings(GPU)
    assert compiling.machine.trainer_start_s + LOCAL_TRAINER_START_S == pytest.approx(20.0)
    assert compiling.machine.trainer_start_s > 10 * cached.machine.trainer_start_s


def test_an_unknown_profile_names_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match=r"--profile: 'aws' is not a profile; allowed: local, cloud, cloud-baked"):
        profile("aws")


def test_a_local_second_reads_as_a_real_minute() -> None:
    assert real_minutes(9.5, CLOUD_SCALE) == 9.5
    assert real_minutes(30, 1.0) == 0.5


def run_args(*extra: str) -> argparse.Namespace:
    return cli.parser().parse_args(["run", str(REPO / "examples" / "compute-slice.yaml"), *extra])


def message() -> dict[str, Any]:
    return cli.load_message(str(REPO / "examples" / "compute-slice.yaml"), [], own_program=True)


def test_the_cli_takes_the_profile_for_the_jobs_machine() -> None:
    t = cli.timing_options(run_args("--profile", "cloud")).for_job(message())
    assert t.profile == "cloud" and t.machine.docker_install_s > 0  # a v6e-16 slice MIG on Google's image


def test_each_timing_option_replaces_the_profiles_figure() -> None:
    ns = run_args("--profile", "cloud", "--creation-delay", "2s", "--image-pull", "500ms", "--boot-delay", "0")
    t = cli.timing_options(ns).for_job(message())
    base = profile("cloud").timings(COMPUTE_TPU)
    assert (t.creation_delay_s, t.machine.image_pull_s, t.machine.boot_s) == (2.0, 0.5, 0.0)
    assert t.machine.docker_install_s == base.machine.docker_install_s  # the others stay the profile's


def test_a_bad_profile_is_a_usage_error() -> None:
    with pytest.raises(cli.UsageError, match="allowed: local, cloud"):
        cli.timing_options(run_args("--profile", "fast"))


def test_a_bad_timing_option_is_refused_before_the_job_file_is_read(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "no-such-job.yaml", "--image-pull", "soon"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("respawn local: error: --image-pull: 'soon' is not a duration") and "\n" not in err
