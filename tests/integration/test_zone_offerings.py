"""Calendar-mode reservations, flex-start's reservation affinity, BULK only for the models that take it, and zones
that do not offer the job's machine: the real client libraries against the local TPU / Compute APIs.

* A reservation-bound tier's slice: a RESERVATION_BOUND template that names its reservation (SPECIFIC_RESERVATION),
  in a BULK MIG, even where BULK takes only reservation-bound and flex-start templates.
* Flex-start consumes no reservation (NO_RESERVATION), and the local API takes it.
* A Spot slice's MIG is asked for in the default mode, never BULK (which the local API refuses for Spot, as Google's
  bulk-mode page says), and no refusal is read for a mode.
* A zone that does not offer the type: the APIs' type listings say so (OfferingLookup, `respawn submit`), and a create
  there is an UnofferedError (decide skips the zone), never a PermanentError, with nothing left behind.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.api_core import exceptions as gexc
from google.cloud import compute_v1

from localcloud import command as local
from localcloud.apis.cloudapi import CloudApiServer
from respawn.actions import CreateMachine
from respawn.adapters import compute_slices as slices
from respawn.adapters.compute import GcpComputeProvider
from respawn.adapters.settings import ProviderSettings
from respawn.adapters.tpu import GcpTpuProvider
from respawn.deployment import Settings
from respawn.jobs import GpuMachine, JobSpec, MachineState, Tier, TpuMachine
from respawn.ports import Machine, PermanentError, UnofferedError
from respawn.spec import spec_to_message
from respawn_cli import main as cli
from respawn_cli.offering import OfferingLookup

A, B = "us-east5-a", "us-east5-b"  # they offer v6e; v5e, L4, H100 and A100 40GB are offered in C, L4 also in D
C, D = "us-central1-a", "us-central1-b"
ROOT = Path(__file__).resolve().parents[2]
P = "proj"
STRICT = frozenset({"FLEX_START", "RESERVATION_BOUND"})  # BULK as Google's bulk-mode page describes it
SETTINGS = ProviderSettings(service_account="m@proj.iam.gserviceaccount.com", create_wait_s=10, read_retry_s=0)


def spec(machine: Any = None, tiers: tuple[Tier, ...] = (), zones: tuple[str, ...] = (A,)) -> JobSpec:
    tiers = tiers or (Tier("spot", zones),)
    return JobSpec(
        "llm",
        machine or TpuMachine("v6e-16", api="compute"),
        tiers[0].zones,
        "us-docker.pkg.dev/proj/repo/trainer:1",
        "gs://ckpt/llm",
        provisioning=tiers[0].provisioning,
        ttl_s=7200,
        tiers=tiers if len(tiers) > 1 or tiers[0].reservation else (),
    )


def create(zone: str = A, attempt: int = 1) -> CreateMachine:
    return CreateMachine("llm", attempt, f"llm-a{attempt}", zone, None)


def gce(server: CloudApiServer) -> GcpComputeProvider:
    return GcpComputeProvider(P, endpoint=server.url, settings=SETTINGS, clock=time.time)


def wait_ready(read: Callable[[], Machine | None], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while (m := read()) is None or m.state is not MachineState.READY:
        assert time.monotonic() < deadline, m
        time.sleep(0.02)


def sent(server: CloudApiServer, collection: str) -> list[dict[str, Any]]:
    """The bodies of the create requests on `collection`, as sent."""
    return [e.body for e in server.exchanges if e.method == "POST" and e.path.endswith(f"/{collection}")]


# ------------------------------------------------------------------------------------ reservations, flex-start


def test_a_reservation_bound_tier_runs_on_a_bulk_slice_that_names_its_reservation() -> None:
    with CloudApiServer(create_delay_s=0.05, bulk_models=STRICT, record=True) as server:
        s = spec(tiers=(Tier("reservation-bound", (A,), reservation="v6e-calendar-1"),))
        gce(server).create(create(), s)
        wait_ready(lambda: gce(server).get("llm-a1", A, s))
        (template,) = sent(server, "instanceTemplates")
        properties = template["properties"]
        assert properties["scheduling"]["provisioningModel"] == "RESERVATION_BOUND"
        assert "maxRunDuration" not in properties["scheduling"]  # the reservation's end bounds it
        assert properties["reservationAffinity"] == {
            "consumeReservationType": "SPECIFIC_RESERVATION",
            "key": "compute.googleapis.com/reservation-name",
            "values": ["v6e-calendar-1"],
        }
        (mig,) = sent(server, "instanceGroupManagers")
        assert mig["targetSizePolicy"] == {"mode": "BULK"}


def test_the_local_api_refuses_a_reservation_bound_vm_that_names_no_reservation() -> None:
    with CloudApiServer(create_delay_s=0.05) as server:
        s = spec(TpuMachine("v6e-8", api="compute"), tiers=(Tier("reservation-bound", (A,), reservation="r1"),))
        instance = gce(server).instance(create(), s)
        instance.reservation_affinity = None
        with pytest.raises(gexc.BadRequest, match="RESERVATION_BOUND instance consumes a specific reservation"):
            gce(server).client.insert_unary(project=P, zone=A, instance_resource=instance)


@pytest.mark.parametrize("accelerator_type", ["v6e-8", "v6e-16"])
def test_flex_start_consumes_no_reservation_and_the_local_api_takes_it(accelerator_type: str) -> None:
    with CloudApiServer(create_delay_s=0.05, bulk_models=STRICT, record=True) as server:
        s = spec(
            TpuMachine(accelerator_type, api="compute"), tiers=(Tier("flex-start", (A,), max_run_duration_s=3600),)
        )
        gce(server).create(create(), s)
        wait_ready(lambda: gce(server).get("llm-a1", A, s))
        (body,) = sent(server, "instances") or [t["properties"] for t in sent(server, "instanceTemplates")]
        assert body["scheduling"]["provisioningModel"] == "FLEX_START"
        assert body["reservationAffinity"] == {"consumeReservationType": "NO_RESERVATION"}


# --------------------------------------------------------------------------------- BULK only where it is taken


def test_a_spot_slice_is_a_mig_in_the_default_mode_and_the_local_api_refuses_it_bulk() -> None:
    """Bulk mode takes only flex-start and reservation-bound templates: a Spot slice's MIG is asked for once, in the
    default mode, and comes up; the same MIG asked for in BULK mode is refused, as Google's bulk-mode page says."""
    with CloudApiServer(create_delay_s=0.05, record=True) as server:
        s = spec()
        gce(server).create(create(), s)
        wait_ready(lambda: gce(server).get("llm-a1", A, s))
        assert [body.get("targetSizePolicy") for body in sent(server, "instanceGroupManagers")] == [None]
        assert [e for e in server.exchanges if e.status == 400] == []
        bulk = slices.instance_group_manager(gce(server).slice(create(), s))  # its template and policy exist
        bulk.target_size_policy = compute_v1.InstanceGroupManagerTargetSizePolicy(mode="BULK")
        with pytest.raises(gexc.BadRequest, match="Bulk mode supports instance templates with provisioning model"):
            gce(server).slices.migs.insert_unary(project=P, zone=B, instance_group_manager_resource=bulk)


def test_a_flex_start_slice_refused_in_bulk_mode_is_not_asked_for_individually() -> None:
    with CloudApiServer(create_delay_s=0.05, record=True) as server:
        message = "Invalid value for field 'resource.targetSizePolicy.mode': 'BULK'."
        server.fail_next(
            "create", code=400, status="INVALID_ARGUMENT", message=message, collection="instanceGroupManagers"
        )
        s = spec(tiers=(Tier("flex-start", (A,), max_run_duration_s=3600),))
        with pytest.raises(PermanentError, match="targetSizePolicy"):
            gce(server).create(create(), s)
        assert len(sent(server, "instanceGroupManagers")) == 1


# --------------------------------------------------------------------------------------- zones and their types


def test_a_slice_in_a_zone_that_does_not_offer_its_machine_type_is_unoffered_and_leaves_nothing() -> None:
    with CloudApiServer(create_delay_s=0.05, unoffered={A: ("ct6e-standard-4t",)}) as server:
        s = spec(zones=(A, B))
        with pytest.raises(UnofferedError, match="Machine type with name 'ct6e-standard-4t' does not exist in zone"):
            gce(server).create(create(A), s)
        assert server.leftovers() == []
        gce(server).create(create(B, 2), s)
        wait_ready(lambda: gce(server).get("llm-a2", B, s))


@pytest.mark.parametrize("tier", [Tier("flex-start", (A, B), max_run_duration_s=3600), Tier("spot", (A, B))])
def test_a_slice_mig_that_reports_its_type_unoffered_is_unoffered_not_a_wait(tier: Tier) -> None:
    """The MIG is made there and says it cannot make its VMs: for flex-start no queue wait, for Spot (VMs in the
    default mode) and a GPU group alike, an UnofferedError at once, and nothing left."""
    unoffered = {A: ("ct6e-standard-4t", "nvidia-h100-80gb")}
    with CloudApiServer(create_delay_s=0.05, queue_waits={A: 60.0}, unoffered=unoffered, record=True) as server:
        for machine in (TpuMachine("v6e-16", api="compute"), GpuMachine("a3-highgpu-8g", "nvidia-h100-80gb", 8, vms=2)):
            with pytest.raises(UnofferedError, match="does not exist in zone 'us-east5-a'"):
                gce(server).create(create(), spec(machine, tiers=(tier,)))
            assert server.leftovers() == []
        assert len(sent(server, "instanceGroupManagers")) == 2  # created, then deleted


def test_a_gpu_or_cloud_tpu_create_in_a_zone_without_its_type_is_unoffered() -> None:
    with CloudApiServer(create_delay_s=0.05, unoffered={C: ("nvidia-l4", "v5litepod-8")}) as server:
        gpu = spec(GpuMachine("g2-standard-8", "nvidia-l4", 1), zones=(C,))
        with pytest.raises(UnofferedError, match="Accelerator type with name 'nvidia-l4' does not exist in zone"):
            gce(server).create(create(C), gpu)
        tpu = GcpTpuProvider(P, endpoint=server.url, settings=SETTINGS)
        for request in ("node", "queued"):
            s = spec(TpuMachine("v5litepod-8", "v2-alpha-tpuv5-lite", request=request), zones=(C,))
            with pytest.raises(UnofferedError, match="'v5litepod-8' does not exist in zone"):
                tpu.create(create(C), s)
        assert server.leftovers() == []


@pytest.mark.parametrize(
    ("machine", "zones", "unoffered", "missing"),
    [
        (TpuMachine("v6e-16", api="compute"), (A, B), "ct6e-standard-4t", "machine type ct6e-standard-4t"),
        (TpuMachine("v5litepod-8", "v2-alpha-tpuv5-lite"), (C, "us-west4-a"), "v5litepod-8", "TPU type v5litepod-8"),
        (GpuMachine("g2-standard-8", "nvidia-l4", 1), (C, D), "nvidia-l4", "accelerator type nvidia-l4"),
    ],
)
def test_the_type_listings_say_which_zones_offer_the_machine(
    machine: Any, zones: tuple[str, str], unoffered: str, missing: str
) -> None:
    """`--unoffered` withholds a type from a zone that Google's table says offers it."""
    first, second = zones
    with CloudApiServer(unoffered={first: (unoffered,)}) as server:
        lookup = OfferingLookup(P, tpu_endpoint=server.url, compute_endpoint=server.url)
        found = lookup.zones(spec(machine, zones=zones))
        assert [(o.zone, o.offered, o.detail) for o in found] == [
            (first, False, f"{first} does not offer {missing}"),
            (second, True, ""),
        ]


@pytest.mark.parametrize(
    ("machine", "zones", "missing"),
    [
        (TpuMachine("v6e-16", api="compute"), (C, A), "machine type ct6e-standard-4t"),
        (TpuMachine("v5litepod-8", "v2-alpha-tpuv5-lite"), (D, C), "TPU type v5litepod-8"),
        (TpuMachine("tpu7x-8", api="compute"), (C, "us-central1-c"), "machine type tpu7x-standard-4t"),
        (GpuMachine("g2-standard-8", "nvidia-l4", 1), ("us-south1-a", D), "machine type g2-standard-8"),
        (GpuMachine("a3-highgpu-8g", "nvidia-h100-80gb", 8), ("us-west4-b", C), "machine type a3-highgpu-8g"),
    ],
)
def test_without_withholdings_the_listings_follow_the_published_zones(
    machine: Any, zones: tuple[str, str], missing: str
) -> None:
    """No `--unoffered`: the first zone has no such TPU or GPU in Google's table (localcloud/apis/offerings.py),
    the second has."""
    first, second = zones
    with CloudApiServer() as server:
        lookup = OfferingLookup(P, tpu_endpoint=server.url, compute_endpoint=server.url)
        found = lookup.zones(spec(machine, zones=zones))
        assert [(o.zone, o.offered, o.detail) for o in found] == [
            (first, False, f"{first} does not offer {missing}"),
            (second, True, ""),
        ]


def test_submit_warns_about_a_zone_without_the_machine_and_refuses_a_job_none_of_whose_zones_offers_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with CloudApiServer(unoffered={A: ("ct6e-standard-4t",), B: ("ct6e-standard-4t",)}) as server:
        settings = Settings(project=P, tpu_endpoint=server.url, compute_endpoint=server.url)
        cli.check_zones("job.yaml", settings, spec_to_message(spec(zones=(A, "europe-west4-a"))))
        assert capsys.readouterr().err == (
            f"warning: zones: {A} does not offer machine type ct6e-standard-4t; respawn skips it\n"
        )
        with pytest.raises(cli.UserError) as e:
            cli.check_zones("job.yaml", settings, spec_to_message(spec(zones=(A, B))))
        assert str(e.value).startswith(
            f"job.yaml: zones: none of {A}, {B} offers v6e-16 (ct6e-standard-4t VMs); allowed: zones whose machine "
        )


def test_each_tier_is_asked_about_its_own_machine_and_a_job_goes_when_one_tiers_machine_is_offered(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """H100 Spot, then A100 Spot: a zone without H100 that has A100 is a warning for the first tier only."""
    h100, a100 = GpuMachine("a3-highgpu-8g", "nvidia-h100-80gb", 8), GpuMachine("a2-highgpu-1g", "nvidia-tesla-a100", 1)
    tiers = (Tier("spot", (C,), after_stockout_s=600), Tier("spot", (C,), machine=a100))
    with CloudApiServer(unoffered={C: ("a3-highgpu-8g",)}) as server:
        lookup = OfferingLookup(P, tpu_endpoint=server.url, compute_endpoint=server.url)
        found = lookup.zones(spec(h100, tiers=tiers))
        assert [(o.zone, o.offered) for o in found] == [(C, False), (C, True)]
        settings = Settings(project=P, tpu_endpoint=server.url, compute_endpoint=server.url)
        cli.check_zones("job.yaml", settings, spec_to_message(spec(h100, tiers=tiers)))  # not refused
        assert (
            capsys.readouterr().err
            == f"warning: zones: {C} does not offer machine type a3-highgpu-8g; respawn skips it\n"
        )


@pytest.mark.parametrize(
    ("machine", "zones", "words", "here"),
    [
        (
            {"kind": "tpu", "accelerator_type": "v5litepod-8", "runtime_version": "v2-alpha-tpuv5-lite"},
            [D, A],
            "v5litepod-8",
            "asia-southeast1-b, europe-west4-b, us-central1-a, us-south1-a, us-west1-c, us-west4-a offer v5litepod-8",
        ),
        (
            {"kind": "gpu", "machine_type": "a3-ultragpu-8g", "accelerator_type": "nvidia-h200-141gb"},
            [C, "us-west4-a"],
            "a3-ultragpu-8g with 8 nvidia-h200-141gb",
            "asia-south1-b, asia-south2-c, europe-west1-b, europe-west4-a, us-central1-b, us-east4-b, us-east5-a, "
            "us-south1-b, us-west1-c offer a3-ultragpu-8g with 8 nvidia-h200-141gb",
        ),
    ],
)
def test_a_local_run_of_a_job_none_of_whose_zones_offers_its_machine_is_refused_as_submit_refuses_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], machine: dict[str, Any], zones: list[str], words: str, here: str
) -> None:
    """`respawn local run` asks the local APIs what `respawn submit` asks the cloud's, before anything starts: no
    zone of the job offers its machine, so it is refused (exit 2), naming the field, the zones and the machine, and
    the local zones that offer it."""
    job = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    job.update(job_id="nowhere", machine=machine, zones=zones)
    if machine["kind"] == "gpu":
        job["machine"]["accelerator_count"] = 8
        job["image"] = "us-docker.pkg.dev/respawn-local/respawn/trainer-cuda:latest"
    path = tmp_path / "nowhere.yaml"
    path.write_text(yaml.safe_dump(job))
    assert local.main(["run", str(path), "--workdir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert f"respawn local: error: {path}: zones: none of {zones[0]}, {zones[1]} offers {words}; allowed: " in err
    assert err.rstrip().endswith(f"; locally: {here}"), err
    assert not (tmp_path / "runs").exists()  # refused before the local cloud or its reference run started
