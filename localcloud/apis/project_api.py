"""The local APIs `respawn doctor` asks about a project (project_state.py holds it), at the real APIs' paths for the
discovery clients (google-api-python-client) pointed at the local cloud's API server:

* Service Usage v1: services.list (GET /v1/projects/P/services, `filter=state:ENABLED`);
* Policy Troubleshooter v3: iam.troubleshoot (POST /v3/iam:troubleshoot): overallAccessState CAN_ACCESS when the
  project's grants hold the principal's permission on that full resource name, else CANNOT_ACCESS;
* Resource Manager v3: projects.get (the project's number in its name);
* Compute Engine v1: regions.get (quotas), networks.get, subnetworks.get, firewalls.list, routers.list (Cloud
  Routers and their NATs); a Shared VPC host project's network resources are held alongside (what each zone offers:
  offerings.py);
* Artifact Registry v1: packages.tags.get and packages.versions.get;
* Org Policy v2: projects.policies.getEffectivePolicy.

What the project does not hold is a 404 in the API's own error format. An API the project has not enabled answers
403 PERMISSION_DENIED with a google.rpc.ErrorInfo of reason SERVICE_DISABLED, as Google's APIs do. With no project
set nothing is owned.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote

from localcloud.apis.apicore import ApiError, NoMachines, compute_error_json
from localcloud.apis.project_state import LocalProject

_ROUTES: list[tuple[str, re.Pattern[str]]] = [
    (name, re.compile(pattern))
    for name, pattern in (
        ("services", r"^/v1/projects/([^/]+)/services$"),
        ("troubleshoot", r"^/v3/iam:troubleshoot$"),
        ("project", r"^/v3/projects/([^/]+)$"),
        ("region", r"^/compute/v1/projects/([^/]+)/regions/([^/]+)$"),
        ("network", r"^/compute/v1/projects/([^/]+)/global/networks/([^/]+)$"),
        ("subnetwork", r"^/compute/v1/projects/([^/]+)/regions/([^/]+)/subnetworks/([^/]+)$"),
        ("firewalls", r"^/compute/v1/projects/([^/]+)/global/firewalls$"),
        ("routers", r"^/compute/v1/projects/([^/]+)/regions/([^/]+)/routers$"),
        (
            "artifact",
            r"^/v1/(projects/[^/]+/locations/[^/]+/repositories/[^/]+)/packages/([^/]+)/(tags|versions)/"
            r"([^/]+)$",
        ),
        ("policy", r"^/v2/projects/([^/]+)/policies/([^/:]+):getEffectivePolicy$"),
    )
]
_REASONS = {400: "invalid", 403: "forbidden", 404: "notFound"}
# The API each method belongs to (Service Usage's own is always on, as the console needs it to enable the others).
_SERVICES = {
    "troubleshoot": "policytroubleshooter.googleapis.com",
    "project": "cloudresourcemanager.googleapis.com",
    "artifact": "artifactregistry.googleapis.com",
    "policy": "orgpolicy.googleapis.com",
}
# The Compute Engine methods whose resources are a network's: a Shared VPC's are in its host project.
_NETWORK_METHODS = ("network", "subnetwork", "firewalls", "routers")


def missing(what: str) -> ApiError:
    return ApiError(404, "NOT_FOUND", f"The resource '{what}' was not found", "notFound")


class ServiceDisabled(ApiError):
    """A call to an API the project has not enabled: 403 with the ErrorInfo Google's APIs attach
    (google.api.ErrorReason SERVICE_DISABLED: metadata `service` and `consumer`, projects/NUMBER)."""

    def __init__(self, service: str, number: str) -> None:
        super().__init__(
            403,
            "PERMISSION_DENIED",
            f"{service} has not been used in project {number} before or it is disabled. Enable it by visiting "
            f"https://console.developers.google.com/apis/api/{service}/overview?project={number} then retry.",
            "accessNotConfigured",
        )
        self.service, self.number = service, number


class ProjectApi(NoMachines):
    """The ApiPart serving a LocalProject (`project`, which tests may replace or change while the server runs); it
    holds no machines."""

    def __init__(self, project: LocalProject | None = None) -> None:
        self.project = project

    def owns(self, path: str) -> bool:
        return self.project is not None and any(p.match(path) for _, p in _ROUTES)

    def route(self, method: str, path: str, query: dict[str, str], body: dict[str, Any]) -> Any:
        p = self.project
        found = next(((name, m.groups()) for name, pattern in _ROUTES if (m := pattern.match(path))), None)
        if p is None or found is None:
            return None
        name, args = found
        expected = "POST" if name == "troubleshoot" else "GET"
        if method != expected:
            return None
        service = "compute.googleapis.com" if path.startswith("/compute/") else _SERVICES.get(name)
        if service is not None and service not in p.apis:
            raise ServiceDisabled(service, p.number)
        if name in p.refused:
            raise ApiError(403, "PERMISSION_DENIED", f"The caller does not have permission ({name})", "forbidden")
        if name == "troubleshoot":
            return self.troubleshoot(p, body)
        if args[0] != p.project and name not in ("artifact", *_NETWORK_METHODS):
            raise missing(f"projects/{args[0]}")
        handler = getattr(self, f"_{name}")
        reply: dict[str, Any] = handler(p, *args, **({"query": query} if name == "services" else {}))
        return reply

    def error_json(self, e: ApiError) -> dict[str, Any]:
        """Google's JSON error format (code, message, errors[]), as every one of these APIs answers; a disabled API's
        with its status and the ErrorInfo in details[]."""
        reply = compute_error_json(e, _REASONS)
        if isinstance(e, ServiceDisabled):
            info = {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": "SERVICE_DISABLED",
                "domain": "googleapis.com",
                "metadata": {"service": e.service, "consumer": f"projects/{e.number}"},
            }
            reply["error"] |= {"status": e.status, "details": [info]}
        return reply

    # ------------------------------------------------------------------ the methods
    def troubleshoot(self, p: LocalProject, body: dict[str, Any]) -> dict[str, Any]:
        access = body.get("accessTuple") or {}
        principal, resource, permission = (
            str(access.get(k) or "") for k in ("principal", "fullResourceName", "permission")
        )
        if not (principal and resource and permission):
            raise ApiError(400, "INVALID_ARGUMENT", "accessTuple needs principal, fullResourceName and permission")
        granted = p.holds(principal.removeprefix("serviceAccount:"), resource, permission)
        return {"accessTuple": dict(access), "overallAccessState": "CAN_ACCESS" if granted else "CANNOT_ACCESS"}

    def _project(self, p: LocalProject, project: str) -> dict[str, Any]:
        return {"name": f"projects/{p.number}", "projectId": project, "state": "ACTIVE", "displayName": project}

    def _services(self, p: LocalProject, project: str, *, query: dict[str, str]) -> dict[str, Any]:
        wanted = query.get("filter", "")
        if wanted not in ("", "state:ENABLED"):
            raise ApiError(400, "INVALID_ARGUMENT", f"Invalid filter {wanted!r}; the local API takes state:ENABLED")
        services = [
            {
                "name": f"projects/{project}/services/{api}",
                "parent": f"projects/{project}",
                "config": {"name": api},
                "state": "ENABLED",
            }
            for api in sorted(p.apis)
        ]
        return {"services": services}

    def _region(self, p: LocalProject, project: str, region: str) -> dict[str, Any]:
        if region not in p.quotas:
            raise missing(f"projects/{project}/regions/{region}")
        quotas = [{"metric": m, "limit": lu[0], "usage": lu[1]} for m, lu in sorted(p.quotas[region].items())]
        base = f"https://www.googleapis.com/compute/v1/projects/{project}"
        return {
            "kind": "compute#region",
            "name": region,
            "status": "UP",
            "quotas": quotas,
            "selfLink": f"{base}/regions/{region}",
        }

    def _network(self, p: LocalProject, project: str, name: str) -> dict[str, Any]:
        return _held(p.networks, (project, name), f"projects/{project}/global/networks/{name}")

    def _subnetwork(self, p: LocalProject, project: str, region: str, name: str) -> dict[str, Any]:
        return _held(p.subnetworks, (project, region, name), f"projects/{project}/regions/{region}/subnetworks/{name}")

    def _firewalls(self, p: LocalProject, project: str) -> dict[str, Any]:
        items = [dict(f) for (owner, _), f in sorted(p.firewalls.items()) if owner == project]
        return {"kind": "compute#firewallList", "items": items}

    def _routers(self, p: LocalProject, project: str, region: str) -> dict[str, Any]:
        items = [dict(r) for (owner, where, _), r in sorted(p.routers.items()) if (owner, where) == (project, region)]
        base = f"https://www.googleapis.com/compute/v1/projects/{project}/regions/{region}/routers"
        return {"kind": "compute#routerList", "items": items, "selfLink": base}

    def _artifact(self, p: LocalProject, repository: str, package: str, kind: str, ref: str) -> dict[str, Any]:
        image = unquote(package)
        path = f"{repository}/packages/{package}/{kind}/{ref}"
        held = p.repositories.get(repository)
        if held is None or unquote(ref) not in held.packages.get(image, set()):
            raise missing(path)
        return {"name": path}

    def _policy(self, p: LocalProject, project: str, constraint: str) -> dict[str, Any]:
        name = f"projects/{project}/policies/{constraint}"
        spec = p.org_policies.get(constraint)
        return {"name": name} | ({"spec": spec} if spec is not None else {})


def _held(kept: dict[Any, dict[str, Any]], key: Any, path: str) -> dict[str, Any]:
    if key not in kept:
        raise missing(path)
    return dict(kept[key])
