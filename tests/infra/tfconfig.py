"""Read the Terraform configuration offline (python-hcl2) for the infra tests."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hcl2
from hcl2 import SerializationOptions

REPO = Path(__file__).resolve().parents[2]
TF_DIR = REPO / "infra" / "terraform"

_OPTIONS = SerializationOptions(strip_string_quotes=True, explicit_blocks=False, with_comments=False)
_FILE_CALL = re.compile(r'^\$\{file\("(?P<path>[^"]+)"\)\}$')
_LOCAL = re.compile(r"\$\{local\.(?P<name>\w+)\}")
_ROLE_LINES = re.compile(
    r'\$\{\[for line in split\("\\n", file\("(?P<path>[^"]+)"\)\) : trimspace\(line\) '
    r'if trimspace\(line\) != "" && !startswith\(trimspace\(line\), "#"\)\]\}'
)


def parse(path: Path) -> dict[str, Any]:
    with path.open(encoding="utf-8") as f:
        parsed: dict[str, Any] = hcl2.load(f, serialization_options=_OPTIONS)
    return parsed


@dataclass(frozen=True)
class Config:
    """Every block of every .tf file in one directory."""

    directory: Path
    resources: dict[tuple[str, str], dict[str, Any]]
    data: dict[tuple[str, str], dict[str, Any]]
    variables: dict[str, dict[str, Any]]
    locals: dict[str, Any]
    outputs: dict[str, dict[str, Any]]

    @staticmethod
    def load(directory: Path = TF_DIR) -> Config:
        resources: dict[tuple[str, str], dict[str, Any]] = {}
        data: dict[tuple[str, str], dict[str, Any]] = {}
        variables: dict[str, dict[str, Any]] = {}
        local_values: dict[str, Any] = {}
        outputs: dict[str, dict[str, Any]] = {}
        for path in sorted(directory.glob("*.tf")):
            parsed = parse(path)
            for kind, into in (("resource", resources), ("data", data)):
                for block in parsed.get(kind, []):
                    for type_, named in block.items():
                        for name, body in named.items():
                            assert (type_, name) not in into, f"{type_}.{name} is declared twice"
                            into[(type_, name)] = body
            for kind, flat in (("variable", variables), ("locals", local_values), ("output", outputs)):
                for block in parsed.get(kind, []):
                    flat.update(block)
        return Config(directory, resources, data, variables, local_values, outputs)

    def resource(self, type_: str, name: str) -> dict[str, Any]:
        assert (type_, name) in self.resources, f"missing resource {type_}.{name}"
        return self.resources[(type_, name)]

    def of_type(self, type_: str) -> dict[str, dict[str, Any]]:
        return {name: body for (t, name), body in self.resources.items() if t == type_}

    def role_permissions(self, name: str) -> list[str]:
        """The permissions of custom role `name`: its list, or the lines of the file a local reads them from
        (iam.tf's orchestrator_permissions: every line of the file, trimmed, but blank ones and '#' comments)."""
        value = self.resource("google_project_iam_custom_role", name)["permissions"]
        if isinstance(value, list):
            return [str(p) for p in value]
        local = _LOCAL.fullmatch(value)
        assert local, f"role {name}: permissions is neither a list nor a local: {value}"
        expression = self.locals[local["name"]]
        m = _ROLE_LINES.fullmatch(expression)
        assert m, f"local.{local['name']} is not the one-permission-a-line file reading: {expression}"
        path = self.file_target(f'${{file("{m["path"]}")}}')
        lines = (line.strip() for line in path.read_text(encoding="utf-8").split("\n"))
        return [line for line in lines if line and not line.startswith("#")]

    def file_target(self, expression: str) -> Path:
        """The file a `file("${path.module}/...")` expression reads, resolved like Terraform does."""
        m = _FILE_CALL.match(expression)
        assert m, f"not a file(...) call: {expression}"
        return Path(m["path"].replace("${path.module}", str(self.directory))).resolve()


def block(body: dict[str, Any], name: str) -> dict[str, Any]:
    """The single nested block `name` of a resource body."""
    blocks = body.get(name)
    assert isinstance(blocks, list) and len(blocks) == 1, f"expected one {name} block, found {blocks!r}"
    found: dict[str, Any] = blocks[0]
    return found


def strings(value: Any) -> list[str]:
    """Every string anywhere in a parsed value."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [*strings(k), *strings(v)]]
    if isinstance(value, list):
        return [s for item in value for s in strings(item)]
    return []
