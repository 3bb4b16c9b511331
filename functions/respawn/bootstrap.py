"""The one wiring point: every store, machine provider, notifier and cloud client respawn's entry points use.

The functions (`service_from_env`), the CLI and the benchmarks build what
they need here from `Settings`, so each client's options are chosen once: the
functions' storage client ignores proxy settings while the CLI's honours them,
and notices go out one per message. Cloud libraries are imported only when a
piece is built, so the CLI starts without them.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from respawn.deployment import Settings

if TYPE_CHECKING:
    from respawn.actions import CreateMachine
    from respawn.adapters.cloud_logging import CloudLoggingReader
    from respawn.adapters.gcs_store import GcsHistoryStore, GcsJobStore
    from respawn.histories import AdviceSource
    from respawn.jobs import JobSpec
    from respawn.ports import Machine, MachineProvider, StatusNotifier
    from respawn.service import Service


def service_from_env() -> Service:
    """The Service for this process's environment; built once and reused (function instances are reused)."""
    return _cached_service(Settings.from_env().require("project", "state_bucket"))


@functools.lru_cache(maxsize=4)
def _cached_service(settings: Settings) -> Service:
    return service(settings)


def service(settings: Settings) -> Service:
    """The Service of the deployed functions: the records, their live index and the preemption history in the state
    bucket, TPUs and GPUs, status messages when a status topic is set; decide's policy with the settings' time scale."""
    from respawn.adapters.clock import SystemClock
    from respawn.policy import Policy
    from respawn.service import Service

    store = job_store(settings, in_functions=True)
    return Service(
        store,
        machine_providers(settings),
        SystemClock(),
        Policy(time_scale=settings.time_scale),
        notifier=status_notifier(settings),
        history=history_store(settings, in_functions=True),
        advice=advice_source(settings),
        index=store,
    )


def advice_source(settings: Settings) -> AdviceSource | None:
    """The Advice API's word on a GPU job's machines, for placement (Google's Advice API covers no TPUs; a TPU job
    places by the history alone, without a note repeated in every placement reason). None without a project."""
    if not settings.project:
        return None
    from respawn.adapters.advice import GcpAdvisor, advice_for
    from respawn.jobs import GpuMachine

    advisor, project = GcpAdvisor(settings.compute_endpoint), settings.project
    return lambda spec: advice_for(advisor, project, spec) if isinstance(spec.machine, GpuMachine) else {}


def job_store(settings: Settings, *, in_functions: bool = False) -> GcsJobStore:
    """The job records in the state bucket. In the functions, through a storage client that reaches GCS directly
    (`function_client`); elsewhere through the default one, which honours HTTPS_PROXY."""
    from respawn.adapters.gcs_store import GcsJobStore, function_client

    if in_functions:
        return GcsJobStore(settings.state_bucket, function_client(settings.project or None))
    from google.cloud import storage

    return GcsJobStore(settings.state_bucket, storage.Client(project=settings.project or None))


def history_store(settings: Settings, *, in_functions: bool = False) -> GcsHistoryStore:
    """The deployment's preemption history, `placement/history.json` in the state bucket (clients as job_store's)."""
    from respawn.adapters.gcs_store import GcsHistoryStore, function_client

    if in_functions:
        return GcsHistoryStore(settings.state_bucket, function_client(settings.project or None))
    from google.cloud import storage

    return GcsHistoryStore(settings.state_bucket, storage.Client(project=settings.project or None))


class FirstUse:
    """A MachineProvider built by `build` at its first call. google.cloud.compute_v1 alone takes about 1.1 s of CPU
    to import, which a function instance would otherwise pay at its cold start whatever API its jobs use."""

    def __init__(self, build: Callable[[], MachineProvider]) -> None:
        self._build = build
        self._built: MachineProvider | None = None
        self._lock = threading.Lock()

    @property
    def provider(self) -> MachineProvider:
        if self._built is None:
            with self._lock:
                if self._built is None:
                    self._built = self._build()
        return self._built

    def create(self, action: CreateMachine, spec: JobSpec) -> None:
        self.provider.create(action, spec)

    def delete(self, name: str, zone: str, spec: JobSpec | None = None) -> None:
        self.provider.delete(name, zone, spec)

    def get(self, name: str, zone: str, spec: JobSpec | None = None) -> Machine | None:
        return self.provider.get(name, zone, spec)

    def set_world(self, name: str, zone: str, spec: JobSpec, world: str) -> None:
        self.provider.set_world(name, zone, spec, world)

    def list(self, zone: str, job_id: str | None = None) -> list[Machine]:
        return self.provider.list(zone, job_id)


def machine_providers(settings: Settings) -> dict[str, MachineProvider]:
    """A provider per API (`spec.machine.api`), at the local cloud's endpoints when they are set: the Cloud TPU
    API's nodes and queued resources, and Compute Engine's instances (GPUs, TPU VMs, and MIGs of TPU slices). Each
    is built at its first call (FirstUse), so an instance whose events need one API never imports the other's client."""
    from respawn.adapters.settings import ProviderSettings

    machines = ProviderSettings(
        service_account=settings.machine_service_account,
        network=settings.network,
        subnetwork=settings.subnetwork,
        external_ips=settings.external_ips,
    )

    def tpu() -> MachineProvider:
        from respawn.adapters.tpu import GcpTpuProvider

        return GcpTpuProvider(settings.project, endpoint=settings.tpu_endpoint, settings=machines)

    def compute() -> MachineProvider:
        from respawn.adapters.compute import GcpComputeProvider

        return GcpComputeProvider(settings.project, endpoint=settings.compute_endpoint, settings=machines)

    return {"tpu": FirstUse(tpu), "compute": FirstUse(compute)}


def status_notifier(settings: Settings) -> StatusNotifier | None:
    """Status messages to the status topic; None (no notices kept or published) without one."""
    from respawn.adapters.pubsub_notifier import PubSubStatusNotifier

    return PubSubStatusNotifier(settings.project, settings.status_topic) if settings.status_topic else None


def log_reader(settings: Settings) -> CloudLoggingReader:
    from respawn.adapters.cloud_logging import CloudLoggingReader

    return CloudLoggingReader(settings.project)


def jobs_publisher() -> Any:
    """A Pub/Sub publisher for job messages (it follows PUBSUB_EMULATOR_HOST, like every Pub/Sub client)."""
    from google.cloud import pubsub_v1

    return pubsub_v1.PublisherClient()
