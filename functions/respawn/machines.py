"""The machine providers as the service uses them: one per machine kind, for acting on a job and for listing.

A transient failure to read or list becomes `Retryable` (Pub/Sub delivers the
event again); a kind without a provider is a permanent error of the job's
actions, not of the service.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from respawn.actions import Action, CreateMachine
from respawn.model import Job, parse_machine_name
from respawn.outcome import Retryable
from respawn.ports import Machine, MachineProvider, PermanentError, TransientError


@dataclass(frozen=True)
class Machines:
    providers: Mapping[str, MachineProvider]  # by machine kind: tpu, gpu

    def provider(self, kind: str) -> MachineProvider:
        provider = self.providers.get(kind)
        if provider is None:
            raise PermanentError(f"no machine provider for machine kind {kind!r}; configured: {sorted(self.providers)}")
        return provider

    def execute(self, job: Job, action: Action) -> None:
        assert job.spec is not None
        provider = self.provider(job.spec.machine.kind)
        if isinstance(action, CreateMachine):
            provider.create(action, job.spec)
        else:
            provider.delete(action.machine, action.zone, job.spec)

    def by_job(self, kind_zones: Iterable[tuple[str, str]]) -> dict[str, list[Machine]]:
        """respawn's machines in these (kind, zone)s, grouped by job id (from the deterministic name)."""
        by_job: dict[str, list[Machine]] = {}
        for kind, zone in sorted(kind_zones):
            provider = self.providers.get(kind)
            for machine in _listed(provider, zone, None) if provider else []:
                parsed = parse_machine_name(machine.name)
                if parsed is not None:
                    by_job.setdefault(parsed[0], []).append(machine)
        return by_job

    def of_job(self, job: Job | None, zones: tuple[str, ...]) -> list[Machine]:
        """One job's machines in these zones, listed afresh."""
        if job is None or job.spec is None:
            return []
        provider = self.provider(job.spec.machine.kind)
        return [m for z in zones for m in _listed(provider, z, job.job_id)]


def _listed(provider: MachineProvider, zone: str, job_id: str | None) -> list[Machine]:
    try:
        return provider.list(zone, job_id)
    except TransientError as e:
        raise Retryable(f"listing machines in {zone}: {e}") from e
