"""The job's rules: the shapes of a job message's objects (machine, tier, submit, cancel) and what holds across
fields (tiers against zones and provisioning, the provisioning model against the API, queue timeouts).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from respawn.gpus import MULTI_VM_SERIES, gpu_series
from respawn.jobs import (
    API_COMPUTE,
    API_TPU,
    RESERVED_MODELS,
    SPOT_MODELS,
    GpuMachine,
    JobSpec,
    MachineSpec,
    Provisioning,
    Tier,
    TpuMachine,
)
from respawn.spec import values
from respawn.spec.decoding import decode
from respawn.spec.fields import Field, Reading, Shape, join_path, render
from respawn.spec.values import (
    APIS,
    BOOT_DISK_GB,
    FLEX_START_QUEUE_MAX_S,
    FLEX_START_QUEUE_MIN_S,
    MAX_FAILURES,
    MAX_GPU_VMS,
    MAX_SLICES,
    MAX_TIERS,
    PLACEMENTS,
    PROVISIONING,
    TIER_PROVISIONING,
    ZONAL_MIG_MAX_VMS,
    boolean,
    expect_type,
    fail,
    format_off_or_duration,
    format_optional_ttl,
    format_ttl,
    matching,
    one_of,
    optional,
    parse_ttl,
    show,
    shown_key,
    within,
)
from respawn.topology import COMPUTE_GENERATIONS, COMPUTE_OFFERS, TPU_API_GENERATIONS

QUEUE_TIMEOUT_DEFAULT_S = TpuMachine.queue_timeout_s  # what a machine waits when its message does not say
# The deployment's trainer image of each machine kind, the image of a job without one (respawn.deployment reads it)
IMAGES_VARIABLE = "RESPAWN_TRAINER_IMAGES"


@dataclass(frozen=True)
class CancelRequest:
    job_id: str


def default_api(accelerator_type: str) -> str:
    """The API a TPU goes through when its machine names none: Compute Engine for the generations it offers."""
    return API_COMPUTE if accelerator_type.rpartition("-")[0] in COMPUTE_GENERATIONS else API_TPU


def _tpu_machine(fields: Reading) -> TpuMachine:
    accelerator_type = fields["accelerator_type"]  # first: the API and what it takes depend on it
    if "api" not in fields.message:
        fields.set("api", default_api(accelerator_type))
    if fields["api"] == API_COMPUTE:
        _compute_tpu(fields, accelerator_type)
    else:
        _tpu_api_tpu(fields, accelerator_type)
    return TpuMachine(**fields.model_values())


def _compute_tpu(fields: Reading, accelerator_type: str) -> None:
    """A TPU through Compute Engine: a generation it makes (each of its sizes has a shape, topology.COMPUTE), a boot
    image instead of a runtime version."""
    generation = accelerator_type.rpartition("-")[0]
    if generation not in COMPUTE_GENERATIONS:
        problem = f'"compute" does not offer {generation}'
        fail(join_path(fields.path, "api"), problem, f"tpu (Compute Engine offers {COMPUTE_OFFERS})")
    how = "" if "api" in fields.message else f", the default for {generation}"
    for name, instead in (("runtime_version", "machine.image"), ("request", "a flex-start tier to wait in a queue")):
        if name in fields.message:
            fail(join_path(fields.path, name), f"not used with api compute{how}", f'{instead}, or machine.api "tpu"')


def _tpu_api_tpu(fields: Reading, accelerator_type: str) -> None:
    """A TPU through the Cloud TPU API: a generation it makes, a runtime version, a node or a queued resource."""
    generation = accelerator_type.rpartition("-")[0]
    if generation not in TPU_API_GENERATIONS:
        fail(join_path(fields.path, "api"), f'"tpu" does not offer {generation}', "compute")
    if "image" in fields.message:
        fail(
            join_path(fields.path, "image"),
            "not used with api tpu",
            'machine.runtime_version, or machine.api "compute"',
        )
    if fields["runtime_version"] is None:
        fail(join_path(fields.path, "runtime_version"), "missing", "required for api tpu")
    if fields["request"] != "queued" and "queue_timeout" in fields.message:
        fail(join_path(fields.path, "queue_timeout"), "only a queued request waits in a queue", 'request "queued"')


def _gpu_machine(fields: Reading) -> GpuMachine:
    fields.check("accelerator_count")  # the count before the types
    machine_type = fields["machine_type"]
    series = gpu_series(machine_type)  # what respawn cannot run or network is the series' record (respawn.gpus)
    if series is not None and series.arm64:
        problem = f"{machine_type} is an {series.name} machine type: arm64 VMs, which respawn's x86-64 images "
        problem += "do not run"
        fail(join_path(fields.path, "machine_type"), problem, "a machine type of G2, A2, A3 or A4")
    if series is not None and series.rdma and fields["vms"] > 1:
        problem = (
            f"{fields['vms']} VMs of {machine_type} ({series.name}): its VMs reach each other's GPUs over RDMA NICs, "
            "which respawn does not set up"
        )
        fail(join_path(fields.path, "vms"), problem, f"vms 1 on {series.name}, or several VMs of {MULTI_VM_SERIES}")
    return GpuMachine(**fields.model_values())


def _queue_timeout_shown(machine: MachineSpec) -> bool:
    """A queued resource always says how long it waits; a Compute Engine machine only when it was given (it is
    allowed only with a flex-start tier, which the machine's own message does not show)."""
    if isinstance(machine, TpuMachine) and machine.api == API_TPU:
        return machine.request == "queued"
    return machine.queue_timeout_s != QUEUE_TIMEOUT_DEFAULT_S


# Several slices of the machine in one world, data parallel (docs/design/several-slices.md); below min_slices the job
# recovers whole. Checked against the rest of the job in _slices_fit.
SLICES = (
    Field("slices", within(1, MAX_SLICES), omitted_when_default=True),
    Field("min_slices", within(1, MAX_SLICES), omitted_when_default=True),
)
TPU_MACHINE = Shape(
    TpuMachine,
    (
        Field("accelerator_type", values.tpu_type, required=True),
        # absent: compute for the generations Compute Engine offers, tpu for the others (default_api)
        Field("api", one_of(APIS, "an API")),
        Field(
            "runtime_version",
            optional(
                matching(
                    re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$"),
                    "a TPU runtime version like v2-alpha-tpuv5-lite or tpu-ubuntu2204-base",
                    "a TPU runtime version",
                )
            ),
            shown_if=lambda machine: machine.api == API_TPU,
        ),
        # api compute: the boot image; absent, the generation's default image family (topology.COMPUTE)
        Field("image", optional(values.boot_image), shown_if=lambda m: m.api == API_COMPUTE, omitted_when_default=True),
        Field("request", values.request, shown_if=lambda machine: machine.api == API_TPU),
        # how long one zone may keep the request waiting for capacity before the next zone is tried: a queued
        # resource (api tpu), or a flex-start request (api compute, checked against the tiers in _submit)
        Field(
            "queue_timeout",
            parse_ttl,
            format_ttl,
            attribute="queue_timeout_s",
            shown_if=_queue_timeout_shown,
        ),
        *SLICES,
    ),
    "required for kind tpu",
    tag=("kind", TpuMachine.kind),
)
GPU_MACHINE = Shape(
    GpuMachine,
    (
        Field(
            "machine_type",
            matching(
                re.compile(r"^[a-z][a-z0-9-]{1,62}$"),
                "a Compute Engine machine type like g2-standard-8 or a2-highgpu-1g",
                "a machine type",
            ),
            required=True,
        ),
        Field(
            "accelerator_type",
            matching(
                re.compile(r"^nvidia-[a-z0-9-]+$"),
                "a GPU type like nvidia-l4, nvidia-tesla-a100, nvidia-h100-80gb",
                "a GPU accelerator type",
            ),
            required=True,
        ),
        Field("accelerator_count", values.gpu_count, required=True),
        Field("boot_disk_gb", within(*BOOT_DISK_GB)),
        # a flex-start tier: how long one zone may keep the request waiting (checked against the tiers in _submit)
        Field("queue_timeout", parse_ttl, format_ttl, attribute="queue_timeout_s", shown_if=_queue_timeout_shown),
        # VMs created together, each running the trainer, recovered whole (a slice of GPU VMs)
        Field("vms", within(1, MAX_GPU_VMS), omitted_when_default=True),
        *SLICES,
    ),
    "required for kind gpu",
    tag=("kind", GpuMachine.kind),
)
MACHINES: dict[str, tuple[Shape, Callable[[Reading], MachineSpec]]] = {
    TpuMachine.kind: (TPU_MACHINE, _tpu_machine),
    GpuMachine.kind: (GPU_MACHINE, _gpu_machine),
}
MACHINE_KINDS = " or ".join(f'"{kind}"' for kind in MACHINES)


def _machine(value: Any, path: str) -> MachineSpec:
    expect_type(path, value, dict, "an object")
    kind = value.get("kind")
    for name, (shape, read) in MACHINES.items():
        if kind == name:
            return read(Reading(shape, value, path))
    if "kind" not in value:
        fail(join_path(path, "kind"), "missing", MACHINE_KINDS)
    fail(join_path(path, "kind"), f"{show(kind)} is not a machine kind", MACHINE_KINDS)


def _machine_message(machine: MachineSpec) -> dict[str, Any]:
    return render(MACHINES[machine.kind][0], machine)


# When a tier gives way to the next; each is a Tier attribute, and absent (or null) is never.
MOVE_ON = Shape(
    Tier,
    (
        Field("after_preemptions", optional(within(1, 10_000)), omitted_when_default=True),
        Field("after_stockout", optional(parse_ttl), format_ttl, "after_stockout_s", omitted_when_default=True),
        Field("deadline_within", optional(parse_ttl), format_ttl, "deadline_within_s", omitted_when_default=True),
    ),
)
TIER = Shape(
    Tier,
    (
        Field("provisioning", one_of(TIER_PROVISIONING, "a provisioning model"), required=True),
        Field("zones", values.zones, list, required=True),
        Field(
            "reservation",
            optional(
                matching(
                    re.compile(r"^[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?$"),
                    "a reservation name like tpu-res-1",
                    "a reservation name",
                )
            ),
            omitted_when_default=True,
        ),
        # flex-start: the machine's maximum run duration; absent, the time left to the job's TTL (at most 7d)
        Field(
            "max_run_duration",
            optional(values.max_run_duration),
            format_optional_ttl,
            "max_run_duration_s",
            omitted_when_default=True,
        ),
        # a fallback tier (not Spot): the least time on it before the job may go back to Spot; null: it never does
        Field(
            "back_to_spot_after",
            optional(parse_ttl),
            format_optional_ttl,
            "back_to_spot_after_s",
            shown_if=lambda tier: tier.provisioning not in SPOT_MODELS,
            omitted_when_default=True,
        ),
        # the tier's own machine (another GPU type or count): of the job's machine kind and API; absent, the job's
        Field(
            "machine",
            optional(_machine),
            lambda m: None if m is None else _machine_message(m),
            omitted_when_default=True,
        ),
        Field("move_on", lambda value, path: value),  # read and written as MOVE_ON, whose fields are the tier's
    ),
    "required in every tier",
)


def _tier(value: Any, path: str, *, last: bool) -> Tier:
    fields = Reading(TIER, value, path)
    provisioning = fields["provisioning"]
    named = value.get("reservation") is not None
    if provisioning in RESERVED_MODELS and not named:
        fail(join_path(path, "reservation"), "missing", "the name of a reservation in the tier's zones")
    if provisioning not in RESERVED_MODELS and named:
        problem = "only a reservation or reservation-bound tier names a reservation"
        fail(join_path(path, "reservation"), problem, 'provisioning "reservation" or "reservation-bound"')
    fields.check("reservation")
    _run_duration_only_with_flex_start(fields, provisioning)
    if provisioning in SPOT_MODELS and "back_to_spot_after" in value:
        problem = "a Spot tier has no Spot to go back to"
        allowed = "back_to_spot_after on a standard, reservation or flex-start tier"
        fail(join_path(path, "back_to_spot_after"), problem, allowed)
    fields.check("back_to_spot_after")  # before move_on's fields, and the tier's zones after them
    rules = value.get("move_on", {})
    move_on = Reading(MOVE_ON, rules, join_path(path, "move_on"))
    if rules and last:
        fail(move_on.path, "the last tier has no tier to move on to", "move_on on any tier but the last")
    if not rules and not last:
        fail(move_on.path, "missing: this tier would never move on", ", ".join(MOVE_ON.names))
    return Tier(**fields.model_values(), **move_on.model_values())


def _tiers(value: Any, path: str) -> tuple[Tier, ...]:
    """Ordered ways of getting machines: [{provisioning, zones, reservation?, move_on?}, ...]."""
    expect_type(path, value, list, "a list of tiers")
    if not 1 <= len(value) <= MAX_TIERS:
        fail(path, f"{len(value)} tiers", f"1 to {MAX_TIERS} tiers, in the order to try them")
    return tuple(_tier(tier, f"{path}[{i}]", last=i == len(value) - 1) for i, tier in enumerate(value))


def _tier_message(tier: Tier) -> dict[str, Any]:
    move_on = render(MOVE_ON, tier)
    return {**render(TIER, tier), **({"move_on": move_on} if move_on else {})}


def _untiered(spec: JobSpec) -> bool:
    return not spec.tiers


def _run_duration_only_with_flex_start(fields: Reading, provisioning: str) -> None:
    """max_run_duration (a tier's, or an untiered job's) goes with provisioning flex-start only."""
    if provisioning != Provisioning.FLEX_START and fields.message.get("max_run_duration") is not None:
        path = join_path(fields.path, "max_run_duration")
        fail(path, "only a flex-start machine has a maximum run duration", f'provisioning "{Provisioning.FLEX_START}"')
    fields.check("max_run_duration")


SUBMIT = Shape(
    JobSpec,
    (
        Field("job_id", values.job_id, required=True),
        Field("machine", _machine, _machine_message, required=True),
        Field("zones", values.zones, list, shown_if=_untiered),  # required unless tiers are given
        Field("provisioning", one_of(PROVISIONING, "a provisioning model"), shown_if=_untiered),
        # required unless the deployment names its trainer image of the machine's kind (parse_job_message's
        # default_images); the spec always holds the concrete image
        Field("image", values.image),
        Field("args", values.args, list),
        Field("env", values.env, dict),
        Field("secrets", values.secrets, dict, omitted_when_default=True),
        Field("checkpoint_uri", values.checkpoint_uri, required=True),
        Field("ttl", parse_ttl, format_ttl, "ttl_s"),
        Field("max_preemptions", values.max_preemptions),
        Field("max_failures", within(0, MAX_FAILURES)),
        Field("labels", values.labels, dict),
        Field("hang_timeout", values.hang_timeout, format_off_or_duration, "hang_timeout_s"),
        Field("tiers", _tiers, lambda tiers: [_tier_message(t) for t in tiers], omitted_when_default=True),
        Field(
            "max_run_duration",
            optional(values.max_run_duration),
            format_optional_ttl,
            "max_run_duration_s",
            shown_if=_untiered,
            omitted_when_default=True,
        ),
        Field("placement", one_of(PLACEMENTS, "a placement"), omitted_when_default=True),
        # on a running machine's notice, request the next machine at once (decide's head start)
        Field("head_start", boolean, omitted_when_default=True),
        # a Spot VM's metadata notice before its soft off, asked of Compute Engine (its machines only)
        Field(
            "preemption_notice",
            values.preemption_notice,
            format_off_or_duration,
            "preemption_notice_s",
            omitted_when_default=True,
        ),
    ),
    "required for action submit",
    tag=("action", "submit"),
)
CANCEL = Shape(
    CancelRequest, (Field("job_id", values.job_id, required=True),), "the id of the job to cancel", ("action", "cancel")
)


def parse_job_message(
    data: bytes | str | dict[str, Any], default_images: Mapping[str, str] | None = None
) -> JobSpec | CancelRequest:
    """A job message (JSON bytes/str or a decoded object) -> JobSpec (submit) or CancelRequest (cancel).

    `default_images`: the deployment's trainer image of each machine kind ("gpu", "tpu"; RESPAWN_TRAINER_IMAGES,
    respawn.deployment), the image of a submit without `image`; without one for its kind, `image` is required.
    Raises SpecError (one line: field, problem, what is allowed) on anything invalid, and nothing else.
    """
    message = decode(data)
    if "action" not in message:
        fail("action", "missing", '"submit" or "cancel"')
    action = message["action"]
    if action == "cancel":
        return _cancel(message)
    if action != "submit":
        fail("action", f"{show(action)} is not an action", '"submit" or "cancel"')
    return _submit(message, default_images or {})


def _cancel(message: dict[str, Any]) -> CancelRequest:
    for name in message:
        if name not in CANCEL.names:
            problem = 'not allowed with action "cancel"' if name in SUBMIT.names else "unknown field"
            fail(shown_key(name), problem, ", ".join(CANCEL.names))
    return CancelRequest(**Reading(CANCEL, message, "").model_values())


def _submit(message: dict[str, Any], default_images: Mapping[str, str]) -> JobSpec:
    fields = Reading(SUBMIT, message, "")
    if "image" not in message:  # the deployment's trainer image of the machine's kind
        kind = fields["machine"].kind
        if kind not in default_images:
            allowed = (
                f"required for action submit unless the deployment sets {IMAGES_VARIABLE} with an image for kind {kind}"
            )
            fail("image", "missing", allowed)
        fields.set("image", default_images[kind])
    tiers = fields["tiers"]  # first: whether zones and provisioning may be given depends on it
    for name in ("zones", "provisioning", "max_run_duration"):
        if tiers and name in message:
            fail(name, "not allowed with tiers", f"{name} inside each tier")
    if not tiers and "zones" not in message:
        fail("zones", "missing", "required for action submit (or tiers, each with its zones)")
    if tiers:  # tier 0 is also the job's zones and provisioning (what the first attempt uses)
        fields.set("zones", tiers[0].zones)
        fields.set("provisioning", tiers[0].provisioning)
        fields.set("max_run_duration", tiers[0].max_run_duration_s)
    else:
        _run_duration_only_with_flex_start(fields, fields["provisioning"])
    values = fields.model_values()
    for name in sorted(dict(values["secrets"]).keys() & dict(values["env"]).keys()):
        fail(f"secrets.{name}", "the variable is also set in env", "each variable in env or in secrets, not both")
    spec = JobSpec(**values)
    _tier_machines_fit(spec)
    _slices_fit(spec)
    _provisioning_fits_the_api(spec)
    _queue_timeout_fits(spec, message["machine"])
    return spec


def _tier_machines_fit(spec: JobSpec) -> None:
    """A tier's own machine is of the job's machine kind, through the job's API: the same trainer image runs on it,
    and the same provider makes and lists it."""
    job = spec.machine
    for i, tier in enumerate(spec.tiers):
        m = tier.machine
        if m is None:
            continue
        if m.kind != job.kind:
            problem = f"{show(m.kind)} is not the job's machine kind {show(job.kind)}"
            fail(f"tiers[{i}].machine.kind", problem, f"{show(job.kind)}: a tier's machine is of the job's kind")
        if m.api != job.api:
            problem = f"{show(m.api)} is not the API of the job's machine ({show(job.api)})"
            fail(f"tiers[{i}].machine.api", problem, f"{show(job.api)}: a tier's machine goes through the job's API")


def _slices_fit(spec: JobSpec) -> None:
    """Several slices: at least min_slices of them, each one machine of the job's type (a GPU VM is the unit), with
    the head start (the survivors' re-forming starts from the noticed slice's one-step save)."""
    m = spec.machine
    if m.min_slices > m.slices:
        fail("machine.min_slices", f"{m.min_slices} is more than machine.slices ({m.slices})", f"1 to {m.slices}")
    if m.slices == 1:
        return
    if isinstance(m, GpuMachine) and m.vms > 1:
        fail("machine.slices", f"{m.slices} slices of {m.vms} VMs each", "vms 1 with slices (a VM is a slice)")
    for i, tier in enumerate(spec.tiers):
        if tier.machine is not None and tier.machine.type_name != m.type_name:
            problem = f"{tier.machine.type_name} is not the job's {m.type_name}: a world's slices are of one type"
            fail(f"tiers[{i}].machine", problem, "no machine of its own in a tier of a job of several slices")
    if not spec.head_start:
        fail("head_start", "false with several slices", "true (the survivors re-form from the noticed one's save)")


def _tier_paths(spec: JobSpec) -> list[tuple[str, Tier]]:
    """Each tier with the path of its provisioning in the message."""
    if not spec.tiers:
        return [("provisioning", spec.all_tiers[0])]
    return [(f"tiers[{i}].provisioning", tier) for i, tier in enumerate(spec.tiers)]


def _provisioning_fits_the_api(spec: JobSpec) -> None:
    """Flex-start is Compute Engine's; preemptible TPUs are the Cloud TPU API's (Compute Engine has Spot TPUs)."""
    api = spec.machine.api
    for path, tier in _tier_paths(spec):
        if tier.provisioning == Provisioning.FLEX_START and api != API_COMPUTE:
            problem = "\"flex-start\" is Compute Engine's, not the Cloud TPU API's"
            allowed = f'machine.api "compute" ({COMPUTE_OFFERS}), or request "queued" to wait'
            fail(path, problem, allowed)
        if (
            tier.provisioning == Provisioning.PREEMPTIBLE
            and isinstance(spec.machine, TpuMachine)
            and api == API_COMPUTE
        ):
            fail(path, '"preemptible" is not offered for TPUs on Compute Engine', 'spot, or machine.api "tpu"')
        if tier.provisioning == Provisioning.RESERVATION_BOUND and api != API_COMPUTE:
            problem = (
                '"reservation-bound" is Compute Engine\'s (calendar-mode reservations); the Cloud TPU API has no '
                "such provisioning model"
            )
            fail(path, problem, f'machine.api "compute" ({COMPUTE_OFFERS}), or provisioning "reservation"')
    _fits_a_zonal_mig(spec)
    if spec.preemption_notice_s is not None and api != API_COMPUTE:
        problem = "the Cloud TPU API has no preemption notice to ask for (a Compute Engine Spot VM's)"
        fail("preemption_notice", problem, f'off, or machine.api "compute" ({COMPUTE_OFFERS})')
    if spec.preemption_notice_s is not None and not any(t.provisioning == Provisioning.SPOT for t in spec.all_tiers):
        allowed = 'off, or a tier with provisioning "spot"'
        fail("preemption_notice", "only a Spot VM gets it, and no tier is spot", allowed)


def _queue_timeout_fits(spec: JobSpec, machine: dict[str, Any]) -> None:
    """On Compute Engine only a flex-start request waits for capacity, and an instance waits at most 2 hours."""
    if spec.machine.api != API_COMPUTE:
        return
    flex_start = any(tier.provisioning == Provisioning.FLEX_START for tier in spec.all_tiers)
    if "queue_timeout" in machine and not flex_start:
        allowed = f'a tier with provisioning "{Provisioning.FLEX_START}"'
        fail("machine.queue_timeout", "only a flex-start request waits for capacity on Compute Engine", allowed)
    low, high = FLEX_START_QUEUE_MIN_S, FLEX_START_QUEUE_MAX_S
    if flex_start and not low <= spec.machine.queue_timeout_s <= high:
        longer = spec.machine.queue_timeout_s > high
        problem = (
            f"{show(machine['queue_timeout'])} is {'longer' if longer else 'shorter'} than Compute Engine "
            f"{'waits' if longer else 'lets a request wait'} for flex-start capacity"
        )
        fail("machine.queue_timeout", problem, f"from {format_ttl(low)} to {format_ttl(high)}")


def _fits_a_zonal_mig(spec: JobSpec) -> None:
    """A Compute Engine slice is one zonal MIG, which holds at most 1,000 VMs."""
    machine = spec.machine
    if isinstance(machine, TpuMachine) and machine.api == API_COMPUTE and machine.hosts > ZONAL_MIG_MAX_VMS:
        problem = (
            f"{machine.accelerator_type} is {machine.hosts} VMs on Compute Engine, more than a zonal managed "
            f"instance group holds"
        )
        fail("machine.accelerator_type", problem, f'a slice of at most {ZONAL_MIG_MAX_VMS} VMs, or machine.api "tpu"')


def spec_to_message(spec: JobSpec) -> dict[str, Any]:
    """The submit message for a JobSpec: parse_job_message(spec_to_message(s)) == s."""
    message = render(SUBMIT, spec)
    if spec.tiers:  # a tiered job's tiers stand where an untiered job's zones and provisioning do
        leading = ("action", "job_id", "machine", "tiers")
        return {**{name: message[name] for name in leading}, **message}
    return message
