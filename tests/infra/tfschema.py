"""The arguments and nested blocks Terraform providers accept, read from the Terraform CDK's prebuilt providers.

`terraform validate` needs the provider binary, which cannot be downloaded here. The npm packages
@cdktf/provider-google, @cdktf/provider-archive and @cdktf/provider-time (pinned in infra/tfschema/package.json,
installed by `make setup` into .venv-tfschema) were generated from the providers' schemas: each resource and data
source has a directory `lib/<name>/` whose JavaScript maps every argument and nested block to its Terraform snake_case
name, in a function per block:

    synthesizeHclAttributes() {                     // the resource's own arguments and blocks
        const attrs = {
            ack_deadline_seconds: { value: cdktf.numberToHclTerraform(...), isBlock: false, ... },
            push_config: { value: pubsubSubscriptionPushConfigToHclTerraform(...), isBlock: true, ... },
    function pubsubSubscriptionPushConfigToHclTerraform(struct) {   // one nested block
        const attrs = {
            push_endpoint: { value: cdktf.stringToHclTerraform(struct.pushEndpoint), isBlock: false, ...
            oidc_token: { value: pubsubSubscriptionPushConfigOidcTokenToHclTerraform(struct.oidcToken), isBlock: true,

Only configurable names are there (computed-only attributes such as `writer_identity` are not arguments).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfconfig import REPO

DEFAULT_DIR = REPO / ".venv-tfschema" / "node_modules"
# provider local name -> @cdktf package
PACKAGES = {"google": "provider-google", "archive": "provider-archive", "time": "provider-time"}

# Terraform's own arguments and blocks (language/meta-arguments), allowed in every resource / data block.
META_ARGUMENTS = {
    "resource": {"count", "for_each", "depends_on", "provider", "lifecycle", "provisioner", "connection"},
    "data": {"count", "for_each", "depends_on", "provider", "lifecycle"},
    "provider": {"alias"},
}
DYNAMIC_ARGUMENTS = {"for_each", "iterator", "labels", "content"}
BLOCK_MARK = "__is_block__"  # python-hcl2 marks blocks so with explicit_blocks=True

_ENTRY = re.compile(
    r'^\s*"?(?P<name>\w+)"?: \{\s*value: (?P<value>[^\n]*),\s*isBlock: (?P<block>true|false),', re.MULTILINE
)
_BLOCK_FUNCTION = re.compile(r"(?<!cdktf\.)(?<!\w)([a-z]\w*ToHclTerraform)\b")  # not cdktf.stringToHclTerraform
_RESOURCE_TYPE = re.compile(r'^\w+\.tfResourceType = "(?P<type>[\w-]+)";$', re.MULTILINE)


@dataclass(frozen=True)
class Block:
    """The argument names and nested block schemas of a resource, data source, provider or nested block."""

    attributes: frozenset[str]
    blocks: dict[str, Block] = field(default_factory=dict)

    def allowed(self) -> str:
        attributes = ", ".join(sorted(self.attributes)) or "none"
        blocks = ", ".join(sorted(self.blocks)) or "none"
        return f"arguments: {attributes}; blocks: {blocks}"


def schema_dir() -> Path | None:
    """The node_modules holding the @cdktf provider packages, or None when they are not installed."""
    found = Path(os.environ.get("RESPAWN_TFSCHEMA") or DEFAULT_DIR)
    return found if all((found / "@cdktf" / p / "package.json").is_file() for p in PACKAGES.values()) else None


class Schemas:
    """Block schemas by (kind, type): kind is resource, data or provider; type as written in the .tf file."""

    def __init__(self, node_modules: Path) -> None:
        self.node_modules = node_modules
        self._cache: dict[tuple[str, str], Block | None] = {}

    def package(self, provider: str) -> Path:
        return self.node_modules / "@cdktf" / PACKAGES[provider]

    def provider_of(self, type_: str) -> str | None:
        """The provider of a resource type by Terraform's rule: the type's first word (google_x -> google)."""
        local = type_.split("_", 1)[0]
        return local if local in PACKAGES else None

    def get(self, kind: str, type_: str) -> Block | None:
        """The schema, or None when the provider has no such resource / data source / provider."""
        key = (kind, type_)
        if key not in self._cache:
            self._cache[key] = self._load(kind, type_)
        return self._cache[key]

    def _load(self, kind: str, type_: str) -> Block | None:
        provider = type_ if kind == "provider" else self.provider_of(type_)
        if provider is None:
            return None
        if kind == "provider":
            directory, wanted = "provider", provider
        else:
            # The CDK's naming: google_pubsub_topic -> pubsub-topic, data google_project -> data-google-project.
            short = type_.removeprefix(f"{provider}_")
            directory = ("data-" + type_ if kind == "data" else short).replace("_", "-")
            wanted = type_
        path = self.package(provider) / "lib" / directory
        if not (path / "index.js").is_file():
            return None
        source = "\n".join(p.read_text(encoding="utf-8") for p in sorted(path.rglob("*.js")))
        declared = _RESOURCE_TYPE.search(source)
        if declared is None or declared["type"] != wanted:
            return None
        top = source.index("synthesizeHclAttributes() {")
        return _block(source, source[top : source.index("\n    }\n", top)], set())  # the method's closing brace

    def types(self, kind: str, provider: str) -> list[str]:
        """Every resource (or data source) type the provider has, for suggestions in messages."""
        names = []
        data = f"data-{provider}-"  # a data source's directory holds its whole type (the resource data-catalog-entry)
        for d in (self.package(provider) / "lib").iterdir():
            if d.name == "provider" or not (d / "index.js").is_file() or d.name.startswith(data) != (kind == "data"):
                continue
            name = d.name.replace("-", "_")
            names.append(name.removeprefix("data_") if kind == "data" else f"{provider}_{name}")
        return sorted(names)


def _block(source: str, attrs: str, seen: set[str]) -> Block:
    attributes: set[str] = set()
    blocks: dict[str, Block] = {}
    for m in _ENTRY.finditer(attrs):
        if m["block"] == "false":
            attributes.add(m["name"])
            continue
        called = _BLOCK_FUNCTION.search(m["value"])
        assert called, f"no block function in {m['value']!r}"
        function = called[1]
        assert function not in seen, f"{function} nests itself"
        start = source.index(f"function {function}(struct) {{")
        body = source[start : source.index("\n}\n", start)]  # the function's closing brace
        blocks[m["name"]] = _block(source, body, seen | {function})
    return Block(frozenset(attributes), blocks)


# ------------------------------------------------------------------------------------------------ checking


def check_file(schemas: Schemas, parsed: dict[str, Any], where: str) -> list[str]:
    """Every problem in one parsed .tf file (python-hcl2, explicit_blocks=True): unknown types, arguments, blocks."""
    problems: list[str] = []
    for kind in ("resource", "data"):
        for entry in parsed.get(kind, []):
            for type_, named in entry.items():
                if type_ == BLOCK_MARK:
                    continue
                for name, body in named.items():
                    if name != BLOCK_MARK:
                        problems += check_block(schemas, kind, type_, name, body, where)
    for entry in parsed.get("provider", []):
        for type_, body in entry.items():
            if type_ != BLOCK_MARK:
                problems += check_block(schemas, "provider", type_, "", body, where)
    return problems


def check_block(schemas: Schemas, kind: str, type_: str, name: str, body: dict[str, Any], where: str) -> list[str]:
    """The problems of one resource / data / provider block against its provider's schema."""
    label = {"resource": f"resource {type_}.{name}", "data": f"data.{type_}.{name}", "provider": f"provider {type_}"}
    what = f"{where}: {label[kind]}"
    schema = schemas.get(kind, type_)
    if schema is None:
        provider = type_ if kind == "provider" else schemas.provider_of(type_)
        if provider is None:
            return [f"{what}: no provider package for {type_!r} (known: {', '.join(sorted(PACKAGES))})"]
        if kind == "provider":
            return [f"{what}: the {provider} provider package has no provider schema"]
        near = [t for t in schemas.types(kind, provider) if _near(t, type_)]
        return [
            f"{what}: {provider} has no {kind} type {type_!r}" + (f" (did you mean {', '.join(near)}?)" if near else "")
        ]
    return _check_body(schema, body, what, "", META_ARGUMENTS[kind])


def _check_body(schema: Block, body: dict[str, Any], what: str, path: str, meta: set[str]) -> list[str]:
    problems: list[str] = []
    inside = f" in {path}" if path else ""
    for key, value in body.items():
        if key == BLOCK_MARK or key in meta:
            continue
        if key == "dynamic" and isinstance(value, list):
            problems += _check_dynamic(schema, value, what, path)
            continue
        is_block = _is_blocks(value)
        if key in schema.blocks:
            if not is_block:
                problems.append(f"{what}: {key!r}{inside} is a block, written as an argument ({key} = ...)")
                continue
            for item in value:
                problems += _check_body(schema.blocks[key], item, what, f"{path}.{key}" if path else key, set())
        elif key in schema.attributes:
            if is_block:
                problems.append(f"{what}: {key!r}{inside} is an argument, written as a block ({key} {{ ... }})")
        else:
            kind = "block" if is_block else "argument"
            problems.append(f"{what}: unknown {kind} {key!r}{inside}; allowed {schema.allowed()}")
    return problems


def _check_dynamic(schema: Block, value: list[Any], what: str, path: str) -> list[str]:
    problems: list[str] = []
    for item in value:  # python-hcl2: [{"LABEL": {"for_each": ..., "content": [...]}}, ...]
        for label, dynamic in item.items() if isinstance(item, dict) else []:
            if label == BLOCK_MARK:
                continue
            inside = f" in {path}" if path else ""
            if label not in schema.blocks:
                problems.append(f"{what}: unknown block {label!r} (dynamic){inside}; allowed {schema.allowed()}")
                continue
            unknown = set(dynamic) - DYNAMIC_ARGUMENTS - {BLOCK_MARK}
            if unknown:
                problems.append(f"{what}: dynamic {label!r}{inside} has {sorted(unknown)}; allowed {DYNAMIC_ARGUMENTS}")
            for content in dynamic.get("content", []):
                problems += _check_body(
                    schema.blocks[label], content, what, f"{path}.{label}" if path else label, set()
                )
    return problems


def _is_blocks(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) and v.get(BLOCK_MARK) for v in value)


def _near(candidate: str, wanted: str) -> bool:
    a, b = set(candidate.split("_")), set(wanted.split("_"))
    return len(a & b) >= max(2, len(b) - 1)
