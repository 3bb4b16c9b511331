"""Compute Engine operations: waiting for one within a deadline, and the error that ended it.

Zone, region and global operations are each awaited with our own operations client (`wait`): the library's
`.result()` polls through a client of its own at the default endpoint, which would bypass `endpoint`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import requests
from google.api_core import exceptions as gexc
from google.cloud import compute_v1

_DONE = compute_v1.Operation.Status.DONE


@dataclass(frozen=True)
class Scope:
    """Where an operation lives: a zone, a region, or (neither) global."""

    zone: str | None = None
    region: str | None = None


class Operations:
    """Waits for the zone, region and global operations of one project."""

    def __init__(self, project: str, options: dict[str, Any]) -> None:
        self.project = project
        self.zones = compute_v1.ZoneOperationsClient(**options)
        self.regions = compute_v1.RegionOperationsClient(**options)
        self.globals = compute_v1.GlobalOperationsClient(**options)

    def wait(self, op: compute_v1.Operation, scope: Scope, deadline: float) -> compute_v1.Operation | None:
        """The operation once DONE, or None when `deadline` (time.monotonic) comes first. An error of the wait
        call itself (not of the operation) is raised as the client raised it."""
        while op.status != _DONE:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                op = self._wait(op.name, scope, left)
            except (requests.exceptions.Timeout, gexc.DeadlineExceeded):
                return None
        return op

    def _wait(self, name: str, scope: Scope, timeout: float) -> compute_v1.Operation:
        if scope.zone is not None:
            return self.zones.wait(project=self.project, zone=scope.zone, operation=name, timeout=timeout)
        if scope.region is not None:
            return self.regions.wait(project=self.project, region=scope.region, operation=name, timeout=timeout)
        return self.globals.wait(project=self.project, operation=name, timeout=timeout)


def operation_error(op: compute_v1.Operation) -> gexc.GoogleAPICallError | None:
    """The error a DONE operation ended with, as the exception a request would have raised; None on success."""
    if not op.error.errors:
        return None
    errors = [(e.code, e.message) for e in op.error.errors]
    return api_error(errors, op.http_error_status_code or 500)


def api_error(errors: list[tuple[str, str]], http_status: int = 500) -> gexc.GoogleAPICallError:
    """(code, message) pairs reported inside a resource or operation, as the exception `classify` reads: the codes
    are its reasons (ZONE_RESOURCE_POOL_EXHAUSTED, QUOTA_EXCEEDED ...), the messages its message."""
    message = "; ".join(f"{code}: {text}" for code, text in errors)
    exc: gexc.GoogleAPICallError = gexc.from_http_status(  # type: ignore[no-untyped-call]
        http_status, message, errors=[{"reason": code, "message": text} for code, text in errors]
    )
    return exc
