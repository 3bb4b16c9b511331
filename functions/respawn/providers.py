"""The machine providers as the service uses them: one per API, for acting on a job and for listing.

A job's machines go through the API its machine names (`spec.machine.api`): "tpu" the Cloud TPU API, "compute"
Compute Engine (every GPU, and TPUs of the generations it offers).

A transient failure to read or list becomes `Retryable` (Pub/Sub delivers the
event again); an API without a provider is a permanent error of the job's
actions, not of the service.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from respawn.actions import Action, CreateMachine, SetWorld
from respawn.jobs import Job, JobSpec, parse_machine_name
from respawn.outcome import Retryable
from respawn.ports import Machine, MachineProvider, PermanentError, TransientError


@dataclass(frozen=True)
class Providers:
    providers: Mapping[str, MachineProvider]  # by API: tpu, compute

    def provider(self, api: str) -> MachineProvider:
        provider = self.providers.get(api)
        if provider is None:
            raise PermanentError(f"no machine provider for api {api!r}; configured: {sorted(self.providers)}")
        return provider

    def of_spec(self, spec: JobSpec) -> MachineProvider:
        """The provider of the API the job's machine goes through."""
        return self.provider(spec.machine.api)

    def execute(self, job: Job, action: Action) -> None:
        assert job.spec is not None
        provider = self.of_spec(job.spec)  # a tier's machine goes through the job's API (respawn.spec)
        if isinstance(action, CreateMachine):
            provider.create(action, job.spec.on_tier(action.tier))
        elif isinstance(action, SetWorld):
            provider.set_world(action.machine, action.zone, job.spec_of(action.machine), action.world)
        else:
            provider.delete(action.machine, action.zone, job.spec_of(action.machine))

    def by_job(self, api_zones: Iterable[tuple[str, str]]) -> dict[str, list[Machine]]:
        """respawn's machines in these (api, zone)s, grouped by job id (from the deterministic name)."""
        by_job: dict[str, list[Machine]] = {}
        for api, zone in sorted(api_zones):
            provider = self.providers.get(api)
            for machine in _listed(provider, zone, None) if provider else []:
                parsed = parse_machine_name(machine.name)
                if parsed is not None:
                    by_job.setdefault(parsed[0], []).append(machine)
        return by_job

    def of_job(self, job: Job | None, zones: tuple[str, ...]) -> list[Machine]:
        """One job's machines in these zones, listed afresh."""
        if job is None or job.spec is None:
            return []
        provider = self.of_spec(job.spec)
        return [m for z in zones for m in _listed(provider, z, job.job_id)]


def _listed(provider: MachineProvider, zone: str, job_id: str | None) -> list[Machine]:
    try:
        return provider.list(zone, job_id)
    except TransientError as e:
        raise Retryable(f"listing machines in {zone}: {e}") from e
