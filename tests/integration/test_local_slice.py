"""A multi-host TPU node of the local cloud is one trainer process per worker; worker chaos and its options.

The node mechanics run the light trainer (`--model=none`: no JAX, each worker on its own), so they show what the
local cloud does to processes, entries and the API, not what JAX does about a lost peer (test_local_slice_run.py).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from conftest import bucket_dir

from localcloud import command as cli
from localcloud.apis.cloudapi import CloudMachine
from localcloud.chaos import (
    HANG_WORKER,
    HOST_ERROR,
    KILL_WORKER,
    PREEMPT,
    Chaos,
    ChaosError,
    StepAction,
    check_workers,
    parse_worker_steps,
    step_actions,
)
from localcloud.machines.nodes import Nodes
from localcloud.machines.slices import HEARTBEAT_TIMEOUT_S, LocalSlice
from localcloud.services.logentries import tpu_worker_name
from localcloud.timeline import Timeline
from respawn import parsing
from respawn.adapters.startup import machine_metadata
from respawn.events import MachinePreempted, TrainerFailed, ZoneWokeUp
from respawn.jobs import JobSpec, TpuMachine
from respawn.machine import GRACE_S
from respawn.topology import tpu_topology
from respawn_ops.joblogs import lifecycle_payload
from respawn_ops.logfilter import LogFilter, load_sink_filter

pytestmark = pytest.mark.waits

REPO = Path(__file__).resolve().parents[2]
HOSTS = 4


# ---- options and schedule (pure) -------------------------------------------------------------------------------------


def test_worker_steps_parse_and_sort() -> None:
    assert parse_worker_steps("450:1, 300:2", "--kill-worker-at-step") == [(300, 2), (450, 1)]
    assert parse_worker_steps("7:0", "--x") == [(7, 0)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("300", "--kill-worker-at-step: '300' is not STEP:WORKER"),
        ("300:x", "--kill-worker-at-step: '300:x' is not STEP:WORKER"),
        ("0:1", "--kill-worker-at-step: '0:1' is not STEP:WORKER"),
        ("-3:1", "--kill-worker-at-step: '-3:1' is not STEP:WORKER"),
        (",", "--kill-worker-at-step: nothing given"),
    ],
)
def test_bad_worker_steps_name_the_option(text: str, message: str) -> None:
    with pytest.raises(ChaosError, match=message) as e:
        parse_worker_steps(text, "--kill-worker-at-step")
    assert "\n" not in str(e.value)


def test_a_worker_must_exist_in_the_slice() -> None:
    check_workers("--hang-worker-at-step", [(10, 3)], LocalSlice(4, 4), "v5litepod-16")
    with pytest.raises(ChaosError, match=r"names worker 4, but v5litepod-16 has 4 hosts; allowed: workers 0\.\.3"):
        check_workers("--hang-worker-at-step", [(10, 1), (20, 4)], LocalSlice(4, 4), "v5litepod-16")
    with pytest.raises(ChaosError, match="v5litepod-8 has 1 host; allowed: worker 0 only"):
        check_workers("--kill-worker-at-step", [(10, 1)], LocalSlice(1, 8), "v5litepod-8")


def test_step_actions_fire_in_step_order_each_on_a_fresh_machine() -> None:
    actions = step_actions(kill_worker=[(90, 2)], hang_worker=[(140, 1)], host_error=[(190, 3)])
    done: list[tuple[str, StepAction]] = []
    ready = [("s-a1", 0.0)]
    steps = {"s-a1": 0}
    chaos = Chaos(
        ready=lambda: ready,
        preempt=lambda name: done.append((name, StepAction(0, PREEMPT))),
        t0=0.0,
        at_steps=[40],
        step_of=steps.get,
        actions=actions,
    )
    steps["s-a1"] = 200  # past every step at once: only the first fires, the rest wait for other machines
    assert chaos.plan(1.0) == [("s-a1", StepAction(40, PREEMPT))]
    assert chaos.plan(2.0) == []
    ready[:] = [("s-a2", 3.0)]
    steps["s-a2"] = 95
    assert chaos.plan(4.0) == [("s-a2", StepAction(90, KILL_WORKER, 2))]
    ready[:] = [("s-a2", 3.0), ("s-a3", 5.0)]  # a2 is still READY (being deleted): a3 gets the next one
    steps["s-a3"] = 139
    assert chaos.plan(6.0) == []
    steps["s-a3"] = 140
    assert chaos.plan(7.0) == [("s-a3", StepAction(140, HANG_WORKER, 1))]
    ready[:] = [("s-a4", 8.0)]
    steps["s-a4"] = 190
    assert chaos.plan(9.0) == [("s-a4", StepAction(190, HOST_ERROR, 3))]
    assert chaos.plan(10.0) == []


def test_actions_at_the_same_step_hit_the_same_machine() -> None:
    ready = [("s-a1", 0.0)]
    chaos = Chaos(
        ready=lambda: ready,
        preempt=lambda name: None,
        t0=0.0,
        step_of=lambda name: 50,
        actions=step_actions(kill_worker=[(50, 1), (50, 2)]),
    )
    assert chaos.plan(1.0) == [("s-a1", StepAction(50, KILL_WORKER, 1)), ("s-a1", StepAction(50, KILL_WORKER, 2))]


def job_file(tmp_path: Path, **changes: Any) -> Path:
    job = yaml.safe_load((REPO / "examples" / "slice.yaml").read_text())
    job.update(changes)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


@pytest.mark.parametrize(
    ("machine", "flag", "value", "message"),
    [
        (None, "--host-error-at-step", "100:4", "--host-error-at-step: '100:4' names worker 4, but v5litepod-16 has 4"),
        (None, "--kill-worker-at-step", "100", "--kill-worker-at-step: '100' is not STEP:WORKER"),
        (
            {"kind": "tpu", "accelerator_type": "v5litepod-8", "runtime_version": "v2-alpha-tpuv5-lite"},
            "--hang-worker-at-step",
            "100:1",
            "v5litepod-8 has 1 host; allowed: worker 0 only",
        ),
    ],
)
def test_the_cli_checks_worker_chaos_against_the_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], machine: Any, flag: str, value: str, message: str
) -> None:
    path = job_file(tmp_path, **({"machine": machine} if machine else {}))
    assert cli.main(["run", str(path), flag, value, "--workdir", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "w").exists()  # nothing was started


def test_job_shapes() -> None:
    assert cli.job_slice({"kind": "tpu", "accelerator_type": "v5litepod-16"}) == LocalSlice(4, 4)
    assert cli.job_slice({"kind": "tpu", "accelerator_type": "v5litepod-8"}) == LocalSlice(1, 8)
    assert cli.job_slice({"kind": "gpu", "machine_type": "g2-standard-8"}) == LocalSlice(1, 1)
    assert cli.job_slice({"kind": "tpu", "accelerator_type": "v9-7"}) == LocalSlice(1, 1)  # a type the table lacks
    assert cli.job_slice({"kind": "tpu", "accelerator_type": "v6e-16", "api": "compute"}) == LocalSlice(4, 4)


# ---- node mechanics (real processes) ---------------------------------------------------------------------------------


# A MIG names its VMs NAME-w-XXXX, XXXX random: the local cloud takes the names from the machine, never from the index.
MIG_SUFFIXES = ("k2x9", "a0b1", "zz41", "m3p7")


def tpu_machine(
    tmp_path: Path, name: str = "slice-a3", accelerator: str = "v5litepod-16", api: str = "tpu"
) -> CloudMachine:
    """A READY TPU machine of the light trainer: a Cloud TPU node (its hidden worker VMs `t1v-n-...-w-I`), or with
    api compute a Compute Engine slice (a MIG of VMs `NAME-w-XXXX`) or single VM (`NAME`)."""
    shape = tpu_topology(accelerator)
    if api == "tpu":
        workers = tuple(tpu_worker_name(name, i) for i in range(shape.hosts))
    else:
        workers = tuple(f"{name}-w-{s}" for s in MIG_SUFFIXES[: shape.hosts]) if shape.hosts > 1 else (name,)
    spec = JobSpec(
        job_id="slice",
        machine=TpuMachine(accelerator, "v2-alpha-tpuv5-lite", api=api),
        zones=("us-central1-a",),
        image="us-docker.pkg.dev/p/r/trainer:1",
        checkpoint_uri=bucket_dir(tmp_path / f"ckpt-{name}"),
        # no saves but the preemption's: the light trainers of a slice's workers share one progress marker
        args=("--model=none", "--steps=100000", "--step-time=0.05", "--log-every=1", "--checkpoint-every=100000"),
        hang_timeout_s=80,  # progress every 20 s
    )
    metadata = machine_metadata(spec, int(name.rsplit("-a", 1)[1]))
    resource = {"acceleratorType": accelerator, "runtimeVersion": "v2-alpha-tpuv5-lite"}
    return CloudMachine(
        "tpu",
        name,
        "us-central1-a",
        "p",
        {},
        metadata,
        "READY",
        time.time(),
        resource,
        api=api,
        workers=workers,
        chips_per_host=shape.chips_per_host,
    )


class Cloud:
    """What Nodes talks to: the router and the API, recorded in order."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []
        self.lock = threading.Lock()
        self.got = threading.Event()
        self.on_route: Callable[[dict[str, Any]], None] = lambda entry: None
        self.timeline = Timeline()

    def route(self, entry: dict[str, Any]) -> None:
        self.on_route(entry)
        with self.lock:
            self.log.append(("route", entry))
        self.got.set()

    def api(self, verb: str) -> Callable[..., str]:
        def call(name: str, *args: str) -> str:
            with self.lock:
                self.log.append((verb, (name, *args)))
            return name

        return call

    def entries(self, event: str | None = None, method: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            routed = [e for verb, e in self.log if verb == "route"]
        if event is not None:
            routed = [e for e in routed if (e.get("jsonPayload") or {}).get("event") == event]
        if method is not None:
            routed = [e for e in routed if (e.get("protoPayload") or {}).get("methodName") == method]
        return routed

    def wait_for(self, count: int, timeout: float = 60, **match: str) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.entries(**match)
            if len(found) >= count:
                return found
            self.got.wait(timeout=0.5)
            self.got.clear()
        raise TimeoutError(f"fewer than {count} entries like {match}: {[e.get('jsonPayload') for e in self.entries()]}")


@contextlib.contextmanager
def a_started_slice(tmp_path: Path, *names: str, api: str = "tpu") -> Iterator[tuple[Nodes, Cloud]]:
    cloud = Cloud()
    nodes = Nodes(
        project="p",
        base_env={**os.environ, "PYTHONPATH": str(REPO)},
        log_dir=tmp_path,
        grace_s=30,  # a loaded machine may need more than a few seconds to stop 4 processes; none waits longer
        route=cloud.route,
        mark_preempted=cloud.api("preempt"),
        set_state=cloud.api("set_state"),
        timeline=cloud.timeline,
    )
    try:
        for name in names or ("slice-a3",):
            nodes.on_ready(tpu_machine(tmp_path, name, api=api))
        # --model=none: every worker is its own trainer and logs `started`
        cloud.wait_for(HOSTS * len(names or "x"), event="started")
        yield nodes, cloud
    finally:
        nodes.stop()


def gone(pids: list[int], timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        live = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not live:
            return True
        time.sleep(0.1)
    return False


def test_a_slice_is_one_process_per_worker_with_a_worker_environment(tmp_path: Path) -> None:
    with a_started_slice(tmp_path, "slice-a3", "slice-a4") as (nodes, cloud):
        ports = set()
        for name in ("slice-a3", "slice-a4"):
            pids = nodes.pids(name)
            assert len(pids) == HOSTS
            envs = [psutil.Process(pid).environ() for pid in pids]
            assert [e["TPU_WORKER_ID"] for e in envs] == ["0", "1", "2", "3"]
            assert {e["TPU_WORKER_HOSTNAMES"] for e in envs} == {"127.0.0.1,127.0.0.1,127.0.0.1,127.0.0.1"}
            assert {e["XLA_FLAGS"] for e in envs} == {"--xla_force_host_platform_device_count=4"}
            assert {e["RESPAWN_HEARTBEAT_TIMEOUT_S"] for e in envs} == {str(HEARTBEAT_TIMEOUT_S)}
            assert {e["JAX_CPU_COLLECTIVES_IMPLEMENTATION"] for e in envs} == {"gloo"}
            assert {e["RESPAWN_PROGRESS_S"] for e in envs} == {"20"}
            assert {e["RESPAWN_GRACE_S"] for e in envs} == {str(GRACE_S["tpu"])}  # a TPU VM's, as in the cloud
            assert {e["RESPAWN_ATTEMPT"] for e in envs} == {name[-1]}
            (address,) = {e["JAX_COORDINATOR_ADDRESS"] for e in envs}
            ports.add(address)
            for i in range(HOSTS):
                assert (tmp_path / f"{name}-w-{i}.log").exists()
        assert len(ports) == 2  # a coordinator per node
        starts = cloud.timeline.events("trainer_start")
        assert sorted((e["machine"], e["worker"]) for e in starts) == [
            (n, i) for n in ("slice-a3", "slice-a4") for i in range(HOSTS)
        ]
        assert not cloud.entries(event="failed")


def test_a_one_host_tpu_is_one_process_without_a_slice_environment(tmp_path: Path) -> None:
    cloud = Cloud()
    nodes = Nodes(
        project="p",
        base_env={**os.environ, "PYTHONPATH": str(REPO)},
        log_dir=tmp_path,
        grace_s=5,
        route=cloud.route,
        mark_preempted=cloud.api("preempt"),
        timeline=cloud.timeline,
    )
    try:
        nodes.on_ready(tpu_machine(tmp_path, "one-a1", accelerator="v5litepod-8"))
        cloud.wait_for(1, event="started")
        (pid,) = nodes.pids("one-a1")
        env = psutil.Process(pid).environ()
        assert not {"JAX_COORDINATOR_ADDRESS", "RESPAWN_HEARTBEAT_TIMEOUT_S"} & set(env)
        # what the startup script reads from a one-host TPU VM's metadata server: worker 0 of one host
        assert (env["TPU_WORKER_ID"], env["TPU_WORKER_HOSTNAMES"]) == ("0", "127.0.0.1")
        assert env["RESPAWN_PROGRESS_S"] == "20"
        assert (tmp_path / "one-a1.log").exists()
        assert "worker" not in cloud.timeline.events("trainer_start")[0]
    finally:
        nodes.stop()


def test_a_killed_worker_is_reported_failed_by_its_startup_script(tmp_path: Path) -> None:
    with a_started_slice(tmp_path) as (nodes, cloud):
        pids = nodes.pids("slice-a3")
        nodes.act("slice-a3", KILL_WORKER, 2)
        (entry,) = cloud.wait_for(1, event="failed")
        time.sleep(0.5)
        assert [psutil.pid_exists(p) for p in pids] == [True, True, False, True]
        assert len(cloud.entries(event="failed")) == 1
    assert entry["jsonPayload"]["worker"] == 2
    event = parsing.log_entry_event(entry)
    assert isinstance(event, TrainerFailed) and (event.job_id, event.attempt) == ("slice", 3)
    assert event.error == "the trainer exited with code 137"  # docker's code for a container killed by SIGKILL
    assert event.worker == 2
    assert LogFilter.parse(load_sink_filter()).matches(entry)
    exits = [e for e in cloud.timeline.events("trainer_exit") if e["code"] == 137]  # the script exits with it
    assert [e["worker"] for e in exits] == [2]
    last = (tmp_path / "slice-a3-w-2.log").read_text().splitlines()[-1]  # where `respawn logs` finds it
    assert lifecycle_payload(last) == entry["jsonPayload"]


def test_a_preempted_slice_stops_every_worker_and_each_worker_vm_logs_the_event(tmp_path: Path) -> None:
    """A Cloud TPU node is preempted whole, whichever worker chaos names: every worker VM gets the notice."""
    with a_started_slice(tmp_path) as (nodes, cloud):
        pids = nodes.pids("slice-a3")
        assert nodes.vms("slice-a3") == 1
        nodes.preempt("slice-a3", 2)
        events = cloud.wait_for(HOSTS, method="compute.instances.preempted")
        assert gone(pids)
        stopped = cloud.entries(event="stopped")
    # Every worker had the notice (its VM's metadata flag or the SIGTERM of the soft off, whichever came first) and
    # stopped on its own, none was killed (--model=none: each worker logs its own entries and saves the same marker
    # file, each through its own temporary file).
    for i in range(HOSTS):
        log = (tmp_path / f"slice-a3-w-{i}.log").read_text()
        assert "preemption notice (SIGTERM)" in log or "preemption notice (metadata instance/preempted)" in log, i
    assert stopped and {e["code"] for e in cloud.timeline.events("trainer_exit")} == {0}
    assert ("preempt", ("slice-a3", None)) in cloud.log
    instances = [e["protoPayload"]["resourceName"].rsplit("/", 1)[1] for e in events]
    assert instances == [tpu_worker_name("slice-a3", i) for i in range(HOSTS)]
    sink = LogFilter.parse(load_sink_filter())
    for entry in events:
        assert sink.matches(entry) and isinstance(parsing.log_entry_event(entry), ZoneWokeUp)
    assert not [e for e in cloud.entries(event="failed") if "exited with code" in e["jsonPayload"]["error"]]
    assert len(cloud.timeline.events("preempted")) == 1 and len(cloud.timeline.events("notice")) == 1


def test_a_hung_worker_stays_alive_and_deleting_the_node_ends_every_worker(tmp_path: Path) -> None:
    with a_started_slice(tmp_path) as (nodes, cloud):
        pids = nodes.pids("slice-a3")
        nodes.act("slice-a3", HANG_WORKER, 1)
        time.sleep(1.0)
        assert psutil.Process(pids[1]).status() == psutil.STATUS_STOPPED
        assert all(psutil.Process(p).status() != psutil.STATUS_STOPPED for p in pids[:1] + pids[2:])
        assert not cloud.entries(event="failed")  # a hang says nothing
        t = time.monotonic()
        nodes.on_deleted("slice-a3")
        assert gone(pids)
        took = time.monotonic() - t
        deadline = time.monotonic() + 10  # the reapers run
        while (nodes.alive() or nodes.processes()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not nodes.alive() and nodes.processes() == 0
    assert took < 20  # the stopped worker is killed at once; the others have 5 s to stop
    assert not cloud.entries(event="failed")  # a deleted node's workers are no failures


def test_a_host_error_terminates_the_node_then_logs_the_event_then_kills_the_worker(tmp_path: Path) -> None:
    with a_started_slice(tmp_path) as (nodes, cloud):
        pids = nodes.pids("slice-a3")
        alive_when_routed: list[bool] = []

        def on_route(entry: dict[str, Any]) -> None:
            if (entry.get("protoPayload") or {}).get("methodName") == "compute.instances.hostError":
                alive_when_routed.append(psutil.Process(pids[3]).status() != psutil.STATUS_ZOMBIE)

        cloud.on_route = on_route
        nodes.act("slice-a3", HOST_ERROR, 3)
        (event,) = cloud.wait_for(1, method="compute.instances.hostError")
        assert gone(pids[3:])
        time.sleep(0.5)
        assert [psutil.pid_exists(p) for p in pids[:3]] == [True, True, True]
        assert "slice-a3" not in [name for name, _ in nodes.ready()]  # TERMINATED: no chaos target
        order = [verb for verb, what in cloud.log if verb == "set_state" or (verb == "route" and what is event)]
    assert order == ["set_state", "route"]
    assert ("set_state", ("slice-a3", "TERMINATED", None)) in cloud.log  # a TPU node: the whole node
    assert alive_when_routed == [True]
    assert event["protoPayload"]["resourceName"].endswith(f"/instances/{tpu_worker_name('slice-a3', 3)}")
    assert LogFilter.parse(load_sink_filter()).matches(event)
    assert isinstance(parsing.log_entry_event(event), ZoneWokeUp)
    assert not cloud.entries(event="failed")  # its VM died: nobody was left to say a word
    (chaos,) = cloud.timeline.events("host_error")
    assert chaos["worker"] == 3


# ---- a Compute Engine slice: a MIG whose every worker is a VM of its own ---------------------------------------------


def routed_instances(entries: list[dict[str, Any]]) -> list[str]:
    return [e["protoPayload"]["resourceName"].rsplit("/", 1)[1] for e in entries]


def test_a_compute_slice_loses_one_vm_to_a_preemption_and_deleting_the_group_ends_the_others(tmp_path: Path) -> None:
    """Worker 2's VM alone gets the notice, is marked TERMINATED in the API and logs the system event under its own
    MIG name; the other workers run on (the light trainer's workers are on their own; the real trainer's hosts
    agree on the notice and stop together) until respawn deletes the group."""
    with a_started_slice(tmp_path, api="compute") as (nodes, cloud):
        pids = nodes.pids("slice-a3")
        assert nodes.vms("slice-a3") == HOSTS
        with pytest.raises(ValueError, match=r"slice-a3 has no worker 4; allowed: workers 0\.\.3"):
            nodes.preempt("slice-a3", 4)
        assert "slice-a3" in [name for name, _ in nodes.ready()]  # still a chaos target
        nodes.preempt("slice-a3", 2)
        (event,) = cloud.wait_for(1, method="compute.instances.preempted")
        assert gone(pids[2:3])
        time.sleep(1.0)
        assert [psutil.pid_exists(p) for p in pids] == [True, True, False, True]
        assert len(cloud.entries(method="compute.instances.preempted")) == 1
        assert "slice-a3" not in [name for name, _ in nodes.ready()]  # no chaos target any more
        nodes.preempt("slice-a3", 1)  # a machine being preempted is not preempted again
        for i in range(HOSTS):
            noticed = "preemption notice (" in (tmp_path / f"slice-a3-w-{i}.log").read_text()
            assert noticed == (i == 2), i
        nodes.on_deleted("slice-a3")
        assert gone(pids)
        time.sleep(0.5)  # the reapers have run
    assert ("preempt", ("slice-a3", 2)) in cloud.log and len([v for v, _ in cloud.log if v == "preempt"]) == 1
    assert routed_instances([event]) == ["slice-a3-w-zz41"]  # the MIG's name of worker 2's VM
    assert LogFilter.parse(load_sink_filter()).matches(event)
    parsed = parsing.log_entry_event(event)  # a MIG VM's name maps back to its job and attempt
    assert isinstance(parsed, MachinePreempted) and (parsed.job_id, parsed.attempt, parsed.cause) == (
        "slice",
        3,
        "preempted",
    )
    (notice,) = cloud.timeline.events("notice")
    assert (notice["worker"], notice["workers"], notice["instance"]) == (2, 1, "slice-a3-w-zz41")
    (preempted,) = cloud.timeline.events("preempted")
    assert (preempted["worker"], preempted["instances"]) == (2, ["slice-a3-w-zz41"])
    # the others were ended by the deletion: no failures, as on a real MIG deleted under them
    assert not [e for e in cloud.entries(event="failed") if "exited with code" in e["jsonPayload"]["error"]]


def test_a_host_error_on_a_compute_slice_terminates_that_vm_alone(tmp_path: Path) -> None:
    with a_started_slice(tmp_path, api="compute") as (nodes, cloud):
        pids = nodes.pids("slice-a3")
        nodes.act("slice-a3", HOST_ERROR, 3)
        (event,) = cloud.wait_for(1, method="compute.instances.hostError")
        assert gone(pids[3:])
        assert [psutil.pid_exists(p) for p in pids[:3]] == [True, True, True]
    assert ("set_state", ("slice-a3", "TERMINATED", 3)) in cloud.log
    assert routed_instances([event]) == ["slice-a3-w-m3p7"]
    parsed = parsing.log_entry_event(event)
    assert isinstance(parsed, MachinePreempted) and (parsed.attempt, parsed.cause) == (3, "hostError")
    assert not cloud.entries(event="failed")


def test_a_single_compute_vm_is_one_process_preempted_whole(tmp_path: Path) -> None:
    """A v6e-8 instance: one trainer process without a slice environment, its VM the machine itself."""
    cloud = Cloud()
    nodes = Nodes(
        project="p",
        base_env={**os.environ, "PYTHONPATH": str(REPO)},
        log_dir=tmp_path,
        grace_s=30,
        route=cloud.route,
        mark_preempted=cloud.api("preempt"),
        set_state=cloud.api("set_state"),
        timeline=cloud.timeline,
    )
    try:
        nodes.on_ready(tpu_machine(tmp_path, "one-a1", accelerator="v6e-8", api="compute"))
        cloud.wait_for(1, event="started")
        (pid,) = nodes.pids("one-a1")
        assert "JAX_COORDINATOR_ADDRESS" not in psutil.Process(pid).environ()
        assert nodes.vms("one-a1") == 1
        nodes.preempt("one-a1", 0)
        (event,) = cloud.wait_for(1, method="compute.instances.preempted")
        assert gone([pid])
    finally:
        nodes.stop()
    assert ("preempt", ("one-a1", None)) in cloud.log
    assert routed_instances([event]) == ["one-a1"]
    parsed = parsing.log_entry_event(event)
    assert isinstance(parsed, MachinePreempted) and (parsed.job_id, parsed.attempt) == ("one", 1)
