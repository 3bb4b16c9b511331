"""How long each step of a recovery takes on the local cloud: a profile of real-cloud figures, scaled down.

A recovery in the cloud is, after the preemption notice: respawn hears of it and asks for a machine (measured
locally, never a delay), the machine is created (or waits in a queue), boots, installs Docker where its boot image
has none, pulls the trainer image, and the trainer starts (container start, TPU runtime, restore, compile from the
persistent cache) until its first step. Locally each step is a delay of the same name (`MachineTimings`, and the API's
creation delay), so that `--profile cloud` replays the real recovery at `scale` speed: at 1/60, a real minute is a
local second, and a local figure divided by the scale is the real one.

`local` keeps the local cloud as it was (a 1 s creation delay, nothing else). The cloud profiles take their figures
from public sources, each named beside its figure (`Figure.source`); where a source gives a range, the middle of it,
and where none gives the figure, the figure says it is an estimate and why. Variants show what each way of starting
fast saves: `cloud-baked` (Docker and the trainer image on the boot image), `cloud-nocache` (no persistent
compilation cache: what the cache saves). docs/operations.md, "Machines that start fast", explains them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from respawn.jobs import GpuMachine, TpuMachine

CLOUD_SCALE = 1 / 60  # local seconds per real second: a real minute is a local second

# The local trainer's own warm start inside a local run (process start -> first step with a warm compilation cache:
# imports, CPU compile from the cache, restore from fake-gcs-server, on 2 cores the local cloud shares): 1.4-1.9 s,
# the `start` of the recovery split (bench/bench_trainer.py's bare warm start, no cloud beside it, is 0.7-1.1 s). A
# profile's trainer start is the real one, so the delay added before the local trainer is the scaled real figure less
# this (the local trainer's own start stands for that much of it).
LOCAL_TRAINER_START_S = 1.5

# Sources (each figure below names the one it comes from).
SKYPILOT_1500 = (
    "https://github.com/skypilot-org/skypilot/pull/1500 (spot TPU VM jobs over 3-4 days: non-running time per "
    "recovery 7.5-14.6 min, one recovery per 8.2-26.6 h of running)"
)
SKYPILOT_1716 = (
    "https://github.com/skypilot-org/skypilot/issues/1716 (a spot TPU VM launch to 'Head node is up' in 4 min 19 s, "
    "a retry in 3 min 30 s: create and boot together)"
)
GCE_BOOT = (
    "https://medium.com/@robaboukhalil/move-fast-and-break-the-cloud-b55b899e3683 (about 5,000 Compute Engine VMs: "
    "request to SSH in 23-25 s up to 32 vCPUs) ; https://medium.com/google-cloud/"
    "understanding-and-profiling-gce-cold-boot-time-32c209fe86ab (41.5 s for a 2-vCPU VM)"
)
UNION_PULL = (
    "https://web.union.ai/blog-post/we-cut-container-cold-boot-from-minutes-to-seconds-heres-how (a standard docker "
    "pull of a 10 GB image on a fresh node takes 4-5 minutes; a cloud VM from zero 1-5 minutes)"
)
VLLM_7533 = (
    "https://github.com/vllm-project/vllm/pull/7533 (XLA compilation on TPU: first run 10-30 min, later runs with "
    "the persistent cache 1-3 min; Llama 3.1 8B 100 s on v5e-8)"
)
DOCKER_INSTALL = (
    "docs/compute-engine.md, The machine: boot image and Docker (apt-get install docker.io measured off a TPU VM: "
    "69.5 MB fetched in under 2 s, unpacked in 5.2 s on 2 cores; configuring and starting dockerd not measured: "
    "'tens of seconds')"
)

PULL_S_PER_GB = 27.0  # 4.5 min for 10 GB (UNION_PULL)
TPU_IMAGE_GB = 4.0  # a JAX TPU training image of "several GB" (issue 24)
GPU_IMAGE_GB = 10.0  # a CUDA training image (UNION_PULL's)


@dataclass(frozen=True)
class Figure:
    """One step's real-cloud duration and where it comes from."""

    real_s: float
    source: str


@dataclass(frozen=True)
class MachineFigures:
    """The real durations of a recovery's steps on one kind of machine, from READY's side: create (the create call
    -> READY, a queue's wait included), boot (READY -> the startup script runs), docker_install (on a boot image
    without Docker), image_pull (an image the machine does not have), image_refresh (a pull of one it has: the
    manifest, and only layers that changed), trainer_start (docker run -> the first step)."""

    create: Figure
    boot: Figure
    docker_install: Figure
    image_pull: Figure
    image_refresh: Figure
    trainer_start: Figure


@dataclass(frozen=True)
class MachineTimings:
    """How long a local machine takes for each step between READY and its trainer's first step, in local seconds.

    `docker_install_s` > 0: the machine boots without Docker and its startup script's `apt-get install docker.io`
    takes that long. `image_on_boot_disk`: the boot image holds the trainer image (and Docker) before the first boot.
    `trainer_start_s` is added before the trainer's process starts (container start, runtime init, and what a real
    compile and restore take beyond the local trainer's own)."""

    boot_s: float = 0.0
    docker_install_s: float = 0.0
    image_pull_s: float = 0.0
    image_refresh_s: float = 0.0
    trainer_start_s: float = 0.0
    image_on_boot_disk: bool = False


@dataclass(frozen=True)
class Timings:
    """A local run's timings: the API's creation delay and every machine's (local seconds), from `profile`."""

    profile: str
    scale: float
    creation_delay_s: float
    machine: MachineTimings


@dataclass(frozen=True)
class Profile:
    """A named set of real figures per kind of machine, and the scale that turns them into local seconds.

    `docker_on_compute_tpu`: whether a Compute Engine TPU machine's default boot image has Docker (Google's
    ubuntu-accel images have not); `baked`: Docker and the trainer image are on the boot image; `mtbi_h`: a
    realistic mean time between interruptions for goodput (hours, with its source)."""

    name: str
    description: str
    scale: float
    tpu: MachineFigures | None
    gpu: MachineFigures | None
    mtbi: Figure
    baked: bool = False
    local_creation_delay_s: float = 1.0  # `local` only: its one delay, already local

    def figures(self, machine: TpuMachine | GpuMachine) -> MachineFigures | None:
        return self.gpu if isinstance(machine, GpuMachine) else self.tpu

    def timings(self, machine: TpuMachine | GpuMachine) -> Timings:
        """The local timings of a run of a job on `machine` (its kind, its API and boot image decide the steps)."""
        figures = self.figures(machine)
        if figures is None:
            return Timings(self.name, self.scale, self.local_creation_delay_s, MachineTimings())
        s = self.scale

        def scaled(figure: Figure) -> float:
            return round(figure.real_s * s, 3)

        installs = needs_docker(machine) and not self.baked
        return Timings(
            self.name,
            s,
            scaled(figures.create),
            MachineTimings(
                boot_s=scaled(figures.boot),
                docker_install_s=scaled(figures.docker_install) if installs else 0.0,
                image_pull_s=scaled(figures.image_pull),
                image_refresh_s=scaled(figures.image_refresh),
                trainer_start_s=round(max(0.0, figures.trainer_start.real_s * s - LOCAL_TRAINER_START_S), 3),
                image_on_boot_disk=self.baked,
            ),
        )


def needs_docker(machine: TpuMachine | GpuMachine) -> bool:
    """Whether the machine's boot image comes without Docker: a Compute Engine TPU machine on Google's default TPU
    image (ubuntu-accel-*). A TPU through the Cloud TPU API has it (its runtime versions), so has the GPU image, and a
    job's own `image` is taken to be one built with it (docs/compute-engine.md builds one)."""
    return isinstance(machine, TpuMachine) and machine.api == "compute" and machine.image is None


def _minutes(m: float, source: str) -> Figure:
    return Figure(round(m * 60, 3), source)


_TPU = MachineFigures(
    # SKYPILOT_1716's 3.5-4.3 min from launch to a reachable TPU VM, split as a CPU VM boots (GCE_BOOT): the rest
    # is creating. No source splits a TPU VM's create from its boot.
    create=_minutes(3.0, f"{SKYPILOT_1716}, less a boot of about 40 s ({GCE_BOOT})"),
    boot=Figure(40.0, f"{GCE_BOOT}: the upper end"),
    docker_install=Figure(45.0, f"estimate: {DOCKER_INSTALL}"),
    image_pull=Figure(round(TPU_IMAGE_GB * PULL_S_PER_GB, 3), f"{TPU_IMAGE_GB:g} GB at {UNION_PULL}"),
    image_refresh=Figure(2.0, "estimate: an unchanged image's pull is its manifest; no source times it"),
    trainer_start=_minutes(2.0, f"{VLLM_7533}: the middle of 1-3 min with the cache"),
)
_GPU = MachineFigures(
    create=Figure(45.0, f"{GCE_BOOT}, and {UNION_PULL}: a GPU VM is not measured apart"),
    boot=Figure(40.0, f"{GCE_BOOT}; a Deep Learning VM's first-boot driver install is not included (no source)"),
    docker_install=Figure(0.0, "the GPU image (Deep Learning VM) has Docker (adapters/startup.py)"),
    image_pull=Figure(round(GPU_IMAGE_GB * PULL_S_PER_GB, 3), f"{GPU_IMAGE_GB:g} GB at {UNION_PULL}"),
    image_refresh=Figure(2.0, "estimate: an unchanged image's pull is its manifest; no source times it"),
    trainer_start=_minutes(2.0, f"{VLLM_7533} (TPU; no GPU figure was found: taken as the same)"),
)
_NO_CACHE = _minutes(20.0, f"{VLLM_7533}: the middle of 10-30 min without the cache")
_MTBI = Figure(8.0 * 3600, f"{SKYPILOT_1500}: its most preempted jobs, 10-11 recoveries in 82-91 h of running")

PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "local",
            "the local cloud as is: machines READY 1 s after their create, no boot, install, pull or start delay",
            1.0,
            None,
            None,
            _MTBI,
        ),
        Profile(
            "cloud",
            "Spot TPU and GPU machines at first boot: create, boot, Docker installed where the image has none, the "
            "whole image pulled, the trainer compiling from the persistent cache",
            CLOUD_SCALE,
            _TPU,
            _GPU,
            _MTBI,
        ),
        Profile(
            "cloud-baked",
            "as cloud, on a boot image that holds Docker and the trainer image: no install, a pull of the manifest "
            "(respawn boots a job's own image on Compute Engine TPUs, machine.image; elsewhere what one would save)",
            CLOUD_SCALE,
            _TPU,
            _GPU,
            _MTBI,
            baked=True,
        ),
        Profile(
            "cloud-nocache",
            "as cloud, without the persistent compilation cache: every trainer start compiles",
            CLOUD_SCALE,
            replace(_TPU, trainer_start=_NO_CACHE),
            replace(_GPU, trainer_start=_NO_CACHE),
            _MTBI,
        ),
    )
}


def profile(name: str) -> Profile:
    """The profile `name`; ValueError naming the allowed ones otherwise."""
    if name not in PROFILES:
        raise ValueError(f"--profile: {name!r} is not a profile; allowed: {', '.join(PROFILES)}")
    return PROFILES[name]


def real_minutes(local_s: float, scale: float) -> float:
    """A local duration as the real-cloud minutes it stands for at `scale`."""
    return round(local_s / scale / 60, 2)
