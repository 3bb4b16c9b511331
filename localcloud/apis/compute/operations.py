"""The local Compute API's operations: every insert, delete and resize returns one; get and wait read it.

  zones/Z|regions/R|global /operations/OP[/wait]          get, wait

An operation is RUNNING while it waits for an instance (`waiting`: the instance's key), DONE once finished, with
Compute's `error` and `httpErrorStatusCode` when it failed.
"""

from __future__ import annotations

import copy
import time
from http import HTTPStatus
from typing import Any

from localcloud.apis.apicore import WAIT_MAX_S, ApiError, CloudCore, rfc3339
from localcloud.apis.compute.common import COMPUTE, Key, Request, not_found


class Operations:
    """The operations of every scope, by name: {"scope", "zone", "target", "json", "waiting"}."""

    def __init__(self, core: CloudCore) -> None:
        self.core = core
        self.ops: dict[str, dict[str, Any]] = {}

    def route(self, req: Request, project: str, scope: str, name: str, wait: str | None) -> Any:
        if (req.method, bool(wait)) in (("GET", False), ("POST", True)):
            return self.get(project, scope, name, wait=bool(wait))
        return None

    def get(self, project: str, scope: str, name: str, wait: bool = False) -> dict[str, Any]:
        core = self.core
        with core.lock:
            op = self.ops.get(name)
            if op is None or op["scope"] != (project, scope):
                raise not_found(f"projects/{project}/{scope}/operations/{name}")
            core.record("operation", "", op["target"], op["zone"], "operations")
            if wait:
                core.wait_until(lambda: op["waiting"] is None, WAIT_MAX_S)
            return copy.deepcopy(op["json"])

    def new(self, project: str, scope: str, target: str, verb: str) -> dict[str, Any]:
        """A RUNNING operation on `target` ("zones/Z/instances/N") in `scope` (zones/Z, regions/R or global)."""
        n = self.core.next_id()
        now = time.time()
        name = f"operation-{int(now * 1000)}-{n:08x}"
        base = f"{COMPUTE}/projects/{project}"
        body: dict[str, Any] = {
            "kind": "compute#operation",
            "id": str(n),
            "name": name,
            "operationType": verb,
            "targetLink": f"{base}/{target}",
            "status": "RUNNING",
            "progress": 0,
            "insertTime": rfc3339(now),
            "startTime": rfc3339(now),
            "selfLink": f"{base}/{scope}/operations/{name}",
            "user": "anonymous",
        }
        where, _, location = scope.partition("/")
        if where == "zones":
            body["zone"] = f"{base}/{scope}"
        elif where == "regions":
            body["region"] = f"{base}/{scope}"
        op: dict[str, Any] = {"scope": (project, scope), "zone": location or "global", "json": body, "waiting": None}
        op["target"] = target.rpartition("/")[2]
        self.ops[name] = op
        return op

    def finish(self, op: dict[str, Any], error: ApiError | None) -> dict[str, Any]:
        body = op["json"]
        body.update(status="DONE", progress=100, endTime=rfc3339(time.time()))
        if error:
            code = error.reason or error.status
            body["error"] = {"errors": [{"code": code, "message": error.message}]}
            body["httpErrorStatusCode"] = error.code
            body["httpErrorMessage"] = HTTPStatus(error.code).phrase.upper()
        op["waiting"] = None
        self.core.changed()
        return copy.deepcopy(body)

    def done(self, project: str, scope: str, target: str, verb: str) -> dict[str, Any]:
        """An operation that is over as soon as it starts (a delete, or an insert that succeeds at once)."""
        return self.finish(self.new(project, scope, target, verb), None)

    def finish_waiting(self, key: Key, error: ApiError | None) -> None:
        """Finish the insert operations waiting for instance `key`."""
        for op in self.ops.values():
            if op.get("waiting") == key:
                self.finish(op, error)
