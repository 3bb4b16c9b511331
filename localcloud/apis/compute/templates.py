"""The local Compute API's instance templates and resource policies: objects it keeps as the body it was given.

  regions/R/resourcePolicies[/N]                          insert, get, list, delete                region op
  global/instanceTemplates[/N]                            insert, get, list, delete                global op

A resource policy is a workload policy (its accelerator topology); neither can be deleted while a MIG uses it.
"""

from __future__ import annotations

import copy
import re
import time
from typing import Any

from google.cloud import compute_v1

from localcloud.apis import offerings
from localcloud.apis.apicore import GPU, TPU, ApiError, invalid, rfc3339
from localcloud.apis.compute.checks import (
    POLICY_FIELDS,
    TEMPLATE_FIELDS,
    check_body,
    check_name,
    check_properties,
    check_workload_policy,
)
from localcloud.apis.compute.common import (
    COMPUTE,
    Request,
    already_exists,
    create_fault,
    in_use,
    kind_of,
    listing,
    not_found,
    region_of,
    url,
)
from localcloud.apis.compute.operations import Operations
from localcloud.apis.compute.state import ComputeState, Kept, ResourcePolicy, Template

TEMPLATE_URL = re.compile(rf"(?:{re.escape(COMPUTE)}/)?(?:projects/([^/]+)/)?global/instanceTemplates/([^/]+)")
_POLICY_URL = re.compile(rf"(?:{re.escape(COMPUTE)}/)?projects/([^/]+)/regions/([^/]+)/resourcePolicies/([^/]+)")


class TemplatesAndPolicies:
    """The instance templates and resource policies of the state (`templates`, `policies`)."""

    def __init__(self, state: ComputeState, operations: Operations) -> None:
        self.state, self.core, self.operations = state, state.core, operations

    def leftovers(self) -> list[str]:
        return [t.path for t in self.state.templates.values()] + [p.path for p in self.state.policies.values()]

    # ================================================================= routes
    def policies_route(self, req: Request, project: str, region: str, name: str | None) -> Any:
        if req.method == "POST" and not name:
            return self.insert_policy(project, region, req.body)
        kind = "compute#resourcePolicy"
        if req.method == "GET" and name:
            with self.core.lock:
                return kept_json(self.policy("get", project, region, name), kind)
        if req.method == "GET":
            with self.core.lock:
                self.core.check("list", "", "", region, "resourcePolicies")
                items = [
                    kept_json(p, kind) for k, p in sorted(self.state.policies.items()) if k[:2] == (project, region)
                ]
            path = f"projects/{project}/regions/{region}/resourcePolicies"
            return listing("compute#resourcePolicyList", path, items, req.query)
        if req.method == "DELETE" and name:
            return self.delete_policy(project, region, name)
        return None

    def templates_route(self, req: Request, project: str, name: str | None) -> Any:
        if req.method == "POST" and not name:
            return self.insert_template(project, req.body)
        kind = "compute#instanceTemplate"
        if req.method == "GET" and name:
            with self.core.lock:
                return kept_json(self.template("get", project, name), kind)
        if req.method == "GET":
            with self.core.lock:
                self.core.check("list", "", "", "global", "instanceTemplates")
                items = [kept_json(t, kind) for k, t in sorted(self.state.templates.items()) if k[0] == project]
            path = f"projects/{project}/global/instanceTemplates"
            return listing("compute#instanceTemplateList", path, items, req.query)
        if req.method == "DELETE" and name:
            return self.delete_template(project, name)
        return None

    # ================================================================= resource policies
    def insert_policy(self, project: str, region: str, body: dict[str, Any]) -> dict[str, Any]:
        core = self.core
        with core.lock:
            name = str(body.get("name") or "")
            topology = (body.get("workloadPolicy") or {}).get("acceleratorTopology")
            fault = create_fault(core, TPU if topology else GPU, name, region, "resourcePolicies")
            check_body(compute_v1.ResourcePolicy, body, POLICY_FIELDS)
            check_name(body, "resource.name")
            check_workload_policy(body)
            key = (project, region, name)
            if key in self.state.policies:
                raise already_exists(f"projects/{project}/regions/{region}/resourcePolicies/{name}")
            op = self.operations.new(
                project, f"regions/{region}", f"regions/{region}/resourcePolicies/{name}", "insert"
            )
            if fault:
                return self.operations.finish(op, ApiError.of(fault))
            self.state.policies[key] = Kept(
                project, f"regions/{region}", "resourcePolicies", name, copy.deepcopy(body), core.next_id(), time.time()
            )
            return self.operations.finish(op, None)

    def policy(self, verb: str, project: str, region: str, name: str) -> ResourcePolicy:
        policy = self.state.policies.get((project, region, name))
        self.core.check(verb, TPU if policy and policy.topology else "", name, region, "resourcePolicies")
        if policy is None:
            raise not_found(f"projects/{project}/regions/{region}/resourcePolicies/{name}")
        return policy

    def delete_policy(self, project: str, region: str, name: str) -> dict[str, Any]:
        with self.core.lock:
            policy = self.policy("delete", project, region, name)
            users = self.state.users(policy)
            if users:
                raise in_use("resource_policy", policy.path, users[0])
            del self.state.policies[(project, region, name)]
            target = f"regions/{region}/resourcePolicies/{name}"
            return self.operations.done(project, f"regions/{region}", target, "delete")

    def referenced_policy(self, project: str, zone: str, body: dict[str, Any]) -> ResourcePolicy | None:
        """The workload policy a MIG's body names (None: it names none)."""
        policy_url = (body.get("resourcePolicies") or {}).get("workloadPolicy")
        if not policy_url:
            return None
        region = region_of(zone)
        found = _POLICY_URL.fullmatch(str(policy_url))
        if found is None:  # a bare name: "The URL is malformed." (reported by a user of the real API)
            raise invalid(
                f"Invalid value for field 'resource.resourcePolicies.workloadPolicy': '{policy_url}'. The URL is "
                "malformed."
            )
        if found[2] != region:
            raise invalid(
                f"Invalid value for field 'resource.resourcePolicies.workloadPolicy': '{policy_url}'. The workload "
                f"policy must be in the MIG's region '{region}'."
            )
        policy = self.state.policies.get((found[1], found[2], found[3]))
        if policy is None:
            raise not_found(f"projects/{found[1]}/regions/{found[2]}/resourcePolicies/{found[3]}")
        return policy

    # ================================================================= instance templates
    def insert_template(self, project: str, body: dict[str, Any]) -> dict[str, Any]:
        core = self.core
        with core.lock:
            name = str(body.get("name") or "")
            properties = body.get("properties") or {}
            fault = create_fault(core, kind_of(properties.get("machineType")), name, "global", "instanceTemplates")
            check_body(compute_v1.InstanceTemplate, body, TEMPLATE_FIELDS)
            check_name(body, "resource.name")
            machine_type = str(properties.get("machineType") or "")
            if not re.fullmatch(r"[a-z0-9-]+", machine_type):
                raise invalid(
                    f"Invalid value for field 'resource.properties.machineType': '{machine_type}'. "
                    "An instance template takes the machine type's name, e.g. ct6e-standard-4t."
                )
            offerings.check_offered(core, None, machine_type, "resource.properties.machineType", machine_type)
            check_properties(properties, "resource.properties", machine_type)
            key = (project, name)
            if key in self.state.templates:
                raise already_exists(f"projects/{project}/global/instanceTemplates/{name}")
            op = self.operations.new(project, "global", f"global/instanceTemplates/{name}", "insert")
            if fault:
                return self.operations.finish(op, ApiError.of(fault))
            self.state.templates[key] = Kept(
                project, "global", "instanceTemplates", name, copy.deepcopy(body), core.next_id(), time.time()
            )
            return self.operations.finish(op, None)

    def template(self, verb: str, project: str, name: str) -> Template:
        template = self.state.templates.get((project, name))
        kind = kind_of(template.machine_type) if template else ""
        self.core.check(verb, kind, name, "global", "instanceTemplates")
        if template is None:
            raise not_found(f"projects/{project}/global/instanceTemplates/{name}")
        return template

    def delete_template(self, project: str, name: str) -> dict[str, Any]:
        with self.core.lock:
            template = self.template("delete", project, name)
            users = self.state.users(template)
            if users:
                raise in_use("instance_template", template.path, users[0])
            del self.state.templates[(project, name)]
            return self.operations.done(project, "global", f"global/instanceTemplates/{name}", "delete")

    def referenced_template(self, project: str, template_url: object) -> Template | None:
        """The template a MIG names; None when it names none the API holds (or no template URL at all)."""
        found = TEMPLATE_URL.fullmatch(str(template_url or ""))
        return self.state.templates.get((found[1] or project, found[2])) if found else None


def kept_json(k: Kept, kind: str) -> dict[str, Any]:
    """A template or policy as the API returns it: its body, with what the API adds."""
    body = copy.deepcopy(k.body)
    body.update(kind=kind, id=str(k.id), creationTimestamp=rfc3339(k.created_at), selfLink=url(k.path))
    if k.collection == "resourcePolicies":
        body.update(region=f"{COMPUTE}/projects/{k.project}/{k.scope}", status="READY")
    return body
