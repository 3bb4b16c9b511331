"""Google's published definitions of the Cloud TPU v2 and Compute v1 REST APIs (their discovery documents, as
google-api-python-client ships them), and a check of a request or response against a method's schemas.

A method is found by HTTP verb and path (its `flatPath` template under the API's `servicePath`). A JSON value is
checked against a schema the way Google's JSON mapping reads it: an unknown property, a wrong JSON type
(int64/uint64/fixed64 are decimal strings: the schema says `type: string, format: int64`), an enum value outside
`enum`, a bad google-duration or google-datetime fails; `$ref`, arrays, objects and maps (`additionalProperties`,
e.g. labels) are followed. The result is a list of problems, each naming the field path: empty means it conforms.

Enums as numbers: the generated clients (google-cloud-tpu over REST) ask with `$alt=json;enum-encoding=int`, so a
real server may answer with an enum's proto number, which the discovery document does not list. The local APIs
answer with names, as the document does, and respawn's requests carry no enum as a number; a number where an enum
belongs fails here, so that whoever adds one decides how to check it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import googleapiclient

DOCUMENTS = Path(googleapiclient.__file__).parent / "discovery_cache" / "documents"

_INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "uint32": (0, 2**32 - 1)}
_DECIMAL_STRING = {"int64": r"-?\d+", "uint64": r"\d+", "fixed64": r"\d+", "sfixed64": r"-?\d+"}
_DURATION = re.compile(r"-?\d+(\.\d{1,9})?s")
_DATETIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?(Z|[+-]\d\d:\d\d)")
# Google's system parameters that the generated clients send in the `$`-prefixed form, which the documents' own
# `parameters` list without it (https://cloud.google.com/apis/docs/system-parameters).
_SYSTEM_ALIASES = {"$alt": "alt", "$fields": "fields", "$prettyPrint": "prettyPrint"}
# `$alt=json;enum-encoding=int`: the generated REST clients' form of alt (google-api-core's rest transports).
_ENUM_ENCODING = ";enum-encoding=int"


@dataclass(frozen=True)
class Method:
    """One REST method of an API: its id (e.g. compute.instances.insert) and its request/response schema names."""

    id: str
    verb: str
    template: str
    pattern: re.Pattern[str]
    request: str | None
    response: str | None
    parameters: dict[str, Any] = field(repr=False)


class Api:
    """One discovery document: its methods by verb and path, its schemas by name."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.name: str = document["name"]
        self.schemas: dict[str, Any] = document["schemas"]
        self.system_parameters: dict[str, Any] = document.get("parameters", {})
        prefix = "/" + document.get("servicePath", "")
        self.methods = [_method(prefix, m) for m in _all_methods(document)]

    @classmethod
    def load(cls, name: str) -> Api:
        """The shipped document `name` (e.g. "compute.v1", "tpu.v2")."""
        return cls(json.loads((DOCUMENTS / f"{name}.json").read_text()))

    def method(self, verb: str, path: str) -> Method | None:
        """The method serving `verb path` (path without the query string), None when the API has none; of several
        (`v2/{+name}` and `v2/projects/{p}/policies/{q}:getEffectivePolicy`), the one with the longest template."""
        found = [m for m in self.methods if m.verb == verb and m.pattern.fullmatch(path)]
        return max(found, key=lambda m: len(m.template), default=None)

    def exchange_problems(self, exchange: Any) -> list[str]:
        """What in one request and its reply (an Exchange: method, path, query, body, status, response) the
        definition of its method refuses, each problem prefixed with the method's id."""
        method = self.method(exchange.method, exchange.path)
        if method is None:
            return [f"{exchange.method} {exchange.path}: no such method in {self.name}"]
        found = self.check_query(method, exchange.query)
        if method.request is not None:
            found += self.check(method.request, exchange.body, f"request {method.request}")
        elif exchange.body != {}:
            found.append(f"{method.id} takes no request body, got {exchange.body}")
        if exchange.status < 300 and method.response is not None:  # errors: Google's error format, not the method's
            found += self.check(method.response, exchange.response, f"response {method.response}")
        return [f"{method.id}: {p}" for p in found]

    def check_query(self, method: Method, query: dict[str, str]) -> list[str]:
        """Problems with a request's query parameters: unknown ones, values of the wrong type or enum."""
        problems = []
        for key, value in query.items():
            if key == "$alt" and value.endswith(_ENUM_ENCODING):
                value = value.removesuffix(_ENUM_ENCODING)
            spec = method.parameters.get(key) or self.system_parameters.get(_SYSTEM_ALIASES.get(key, key))
            if spec is None or spec.get("location") != "query":
                problems.append(f"?{key}: not a query parameter of {method.id}")
            elif spec.get("type") == "boolean" and value not in ("true", "false"):
                problems.append(f"?{key}={value}: not a boolean")
            elif spec.get("type") == "integer" and not re.fullmatch(r"-?\d+", value):
                problems.append(f"?{key}={value}: not an integer")
            elif "enum" in spec and value not in spec["enum"]:
                problems.append(f"?{key}={value}: not one of {spec['enum']}")
        return problems

    def check(self, schema: str, value: Any, path: str = "") -> list[str]:
        """Problems with `value` as an instance of schema `schema` (a name in the document's `schemas`)."""
        return self._check({"$ref": schema}, value, path or schema)

    def _check(self, schema: dict[str, Any], value: Any, path: str) -> list[str]:
        if "$ref" in schema:
            name = schema["$ref"]
            return self._check(self.schemas[name], value, path)
        kind = schema.get("type")
        if kind == "any":
            return []
        if kind == "object":
            return self._object(schema, value, path)
        if kind == "array":
            if not isinstance(value, list):
                return [f"{path}: {_show(value)} is not an array"]
            return [p for i, item in enumerate(value) for p in self._check(schema["items"], item, f"{path}[{i}]")]
        if kind == "boolean":
            return [] if isinstance(value, bool) else [f"{path}: {_show(value)} is not a boolean"]
        if kind == "integer":
            return self._integer(schema, value, path)
        if kind == "number":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            special = value in ("NaN", "Infinity", "-Infinity")
            return [] if ok or special else [f"{path}: {_show(value)} is not a number"]
        if kind == "string":
            return self._string(schema, value, path)
        raise ValueError(f"{path}: schema type {kind!r} is not one this checker knows")

    def _object(self, schema: dict[str, Any], value: Any, path: str) -> list[str]:
        if not isinstance(value, dict):
            return [f"{path}: {_show(value)} is not an object"]
        properties: dict[str, Any] = schema.get("properties", {})
        extra: dict[str, Any] | None = schema.get("additionalProperties")
        problems = []
        for key, item in value.items():
            if key in properties:
                problems += self._check(properties[key], item, f"{path}.{key}")
            elif extra is not None:
                problems += self._check(extra, item, f"{path}[{key!r}]")
            elif properties or "additionalProperties" not in schema:
                problems.append(f"{path}.{key}: not a field of {path.split('.')[0]} in {self.name}")
        return problems

    def _integer(self, schema: dict[str, Any], value: Any, path: str) -> list[str]:
        if not isinstance(value, int) or isinstance(value, bool):
            return [f"{path}: {_show(value)} is not an integer"]
        low, high = _INT_RANGES.get(schema.get("format", ""), (None, None))
        if low is not None and high is not None and not low <= value <= high:
            return [f"{path}: {value} is outside {schema['format']}"]
        return []

    def _string(self, schema: dict[str, Any], value: Any, path: str) -> list[str]:
        form = schema.get("format", "")
        enum: list[str] | None = schema.get("enum")
        if not isinstance(value, str):
            what = "a decimal string (64-bit integers are strings)" if form in _DECIMAL_STRING else "a string"
            return [f"{path}: {_show(value)} is not {what}"]
        if enum is not None and value not in enum:
            return [f"{path}: {value!r} is not one of {enum}"]
        if form in _DECIMAL_STRING and not re.fullmatch(_DECIMAL_STRING[form], value):
            return [f"{path}: {value!r} is not a {form}"]
        if form == "google-duration" and not _DURATION.fullmatch(value):
            return [f"{path}: {value!r} is not a duration like '3600s'"]
        if form in ("google-datetime", "date-time") and not _DATETIME.fullmatch(value):
            return [f"{path}: {value!r} is not an RFC 3339 timestamp"]
        return []


def _show(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _all_methods(resource: dict[str, Any]) -> list[dict[str, Any]]:
    found = list(resource.get("methods", {}).values())
    for child in resource.get("resources", {}).values():
        found += _all_methods(child)
    return found


def _method(prefix: str, m: dict[str, Any]) -> Method:
    template = m.get("flatPath") or m["path"]
    # re.escape turns {x} into \{x\}: a {+name} (reserved expansion) takes slashes, a {name} one path segment
    regex = re.sub(r"\\\{(\\\+)?[^}]+\\\}", lambda g: ".+" if g.group(1) else "[^/]+", re.escape(template))
    return Method(
        id=m["id"],
        verb=m["httpMethod"],
        template=template,
        pattern=re.compile(re.escape(prefix) + regex),
        request=(m.get("request") or {}).get("$ref"),
        response=(m.get("response") or {}).get("$ref"),
        parameters=m.get("parameters", {}),
    )
